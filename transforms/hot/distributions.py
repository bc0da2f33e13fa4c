"""Distributions built every step without argument validation, where the arguments are valid
by construction.

``torch.distributions`` validates by default (``Distribution._validate_args = __debug__``): each
``Categorical(logits=x)`` / ``Normal(mu, std)`` checks every argument against its constraint in
``__init__`` and every value given to ``log_prob`` against the support, each check a reduction
and a host sync. A policy that builds its distribution every step pays this every step: about
2.6x the cost of ``Categorical(logits=x).log_prob(a)`` and 2x that of a small ``Normal`` on CPU
(benchmarks/bench_hot_patterns.py). This transform adds ``validate_args=False`` where the checks
cannot fail on finite arguments:

* ``Categorical(logits=x)``, ``OneHotCategorical(logits=x)``, ``Bernoulli(logits=x)``: the logits
  constraint is ``real`` (not NaN), whatever ``x`` is;
* ``Normal(loc, scale)`` whose scale is a positive literal, ``torch.exp(x)`` / ``x.exp()`` (a
  method of that name is taken to be the tensor's), ``F.softplus(x)`` (with positive literal
  ``beta`` / ``threshold`` if given: negative ones can give negative values), such a value plus a positive literal, or a name bound once in the scope to
  one of these (``action_std = torch.exp(action_logstd)``), or a name unpacked once from a call of
  a forward of this file that returns one of these there (``mean, std = self.actor(s)``;
  :mod:`.forward_returns`): the scale constraint is ``> 0``.

What changes, and only on invalid input: a NaN argument (or an ``exp``/``softplus`` scale that
underflowed to 0) no longer raises ``ValueError`` in ``__init__``, and a ``log_prob`` value outside
the support (an action that is not an integer in range, a NaN) no longer raises ``ValueError``
there (an out-of-range index still raises, from ``gather``; a value of a shape that does not
broadcast raises ``RuntimeError`` from ``broadcast_tensors`` instead of ``ValueError``). Those raises are diagnostics, not
results: on every input where the original returns, the rewrite returns the same tensors,
bitwise, so the sites are ``exact`` and each reason says what would no longer raise. (A run-time
guard was considered and rejected: checking the arguments for NaN is itself a reduction and a host
sync per call, the very cost the rewrite removes.) Measured on whole runs (CPU, one thread, CPU
time of the process, medians of 3, outputs identical): the bundled CleanRL-style CartPole PPO
1.03x, minimalRL's SAC (with its replay batches through hot.tensor_from_arrays) 1.05x. The user's
explicit choices are kept: calls that pass ``validate_args`` themselves, and every call of a file
that calls ``set_default_validate_args`` or sets ``_validate_args`` (validation turned on or off on
purpose), are left alone. Not seen: such a call in *another* file of the program (transforms see
one file; at run time the default set to True cannot be told from the default left at True) --
there, pass ``validate_args=True`` at the call or disable ``hot.distribution_args``.
``Categorical(probs)`` (keyword or positional) is rewritten only where the probs are provably an
unmodified softmax (:mod:`.softmax_probs`: directly, a name whose binding is the nearest statement
before the call that mentions it, or a function/method of this file all of whose returns are
one), to ``categorical_probs(Categorical, p, dim)`` (runtime/hot_distributions.py). The simplex
check (non-negative, rows of ``p / p.sum(-1)`` summing to 1 within 1e-6) then cannot fail on
finite logits where the row length is within a worst-case rounding bound of the dtype and the
softmax is over the last dim; the helper reads shape and dtype (no sync) and otherwise builds the
distribution as written. Same contract as above (contract ``softmax_probs``): NaN/inf logits and
an out-of-support ``log_prob`` value no longer raise; an action from ``.sample()`` of the same
distribution, or a stored one, is always in the support, so for the scripts' own actions nothing
changes. Other probs (normalised by hand, a list, a softmax edited afterwards) are left alone:
a net's output that breaks the constraint is exactly what validation reports.

``MultivariateNormal(loc, covariance_matrix)`` (or ``precision_matrix``) whose matrix is a
diagonal one by construction: ``torch.diag(v)`` / ``torch.diag_embed(v)`` (no offset), ``v.diag()``
/ ``v.diag_embed()``, then ``.to(...)``, ``.float()``, ``.unsqueeze(0)`` and the like, or a name
bound once in the scope to such a value and never changed in place, or ``self.X`` bound once, in
``__init__``, to such a value, where this file uses ``X`` nowhere else but as such a matrix
argument (PPO-for-Beginners' ``self.cov_mat = torch.diag(self.cov_var)``). Validation checks the
matrix is symmetric and positive definite (a second Cholesky factorization and an ``isclose`` of
the whole matrix, a host sync each) on every construction: 2.9x the cost of building the
distribution, sampling and ``log_prob`` for one action on CPU, 6.5x for a batch of 2048. A diagonal
matrix is symmetric; one that is not positive definite still raises, from the factorization
``__init__`` makes anyway (``torch.linalg.LinAlgError`` instead of ``ValueError``); what no longer
raises is what the Normal's contract says (a NaN). ``scale_tril=torch.diag(v)`` is rewritten where
``v`` is provably positive (as a Normal's scale): lower triangular with a positive diagonal.
"""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Tuple

import libcst as cst

from scalebox_cst.report import EXACT, REWRITTEN, SKIPPED, Site

from ..analysis.scope_walk import _param_names
from ..base import FileContext, Transform
from . import forward_returns
from .bindings import ScopedRewriter, only_value, visit_calls
from .callees import Files
from .softmax_probs import changed
from .distributions_examples import EXAMPLES

ID = "hot.distribution_args"
RUNTIME = "scalebox_cst.runtime.hot_distributions.categorical_probs"

#: class name -> the torch.distributions submodule defining it, and its kind
_CLASSES = {
    "Categorical": ("categorical", "logits"),
    "OneHotCategorical": ("one_hot_categorical", "logits"),
    "Bernoulli": ("bernoulli", "logits"),
    "Normal": ("normal", "normal"),
    "MultivariateNormal": ("multivariate_normal", "mvn"),
}
_QUALNAMES: Dict[str, str] = {}
for _cls, (_mod, _) in _CLASSES.items():
    _QUALNAMES[f"torch.distributions.{_cls}"] = _cls
    _QUALNAMES[f"torch.distributions.{_mod}.{_cls}"] = _cls

NO_RAISE = "a NaN argument{extra} or an out-of-support log_prob value no longer raises ValueError"


def _positive_literal(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, (cst.Integer, cst.Float)):
        try:
            return float(expr.evaluated_value) > 0
        except (ValueError, OverflowError):
            return False
    return False


class _Rewriter(ScopedRewriter):
    def __init__(self, ctx: FileContext, sites: List[Site], user_default: bool) -> None:
        super().__init__()
        self.softmax = _softmax_calls(ctx)
        self._asts: Dict[cst.CSTNode, ast.AST] = {}
        self._files: Optional[Files] = None  # the module's classes and bindings, made when first asked
        self.ctx = ctx
        self.sites = sites
        self.user_default = user_default

    def _scope_ast(self) -> ast.AST:
        """The ``ast`` of the scope being visited (the module's, or its function's code parsed)."""
        scope = self.scopes[-1]
        if isinstance(scope, cst.Module):
            return self.ctx.tree
        found = self._asts.get(scope)
        if found is None:
            found = self._asts[scope] = ast.parse(self.ctx.module.code_for_node(scope)).body[0]
        return found

    def positive(self, expr: cst.BaseExpression, depth: int = 0) -> Optional[str]:
        """How ``expr`` is positive (a short text), or None if that is not provable here."""
        if _positive_literal(expr):
            return "a positive constant"
        if isinstance(expr, cst.Call) and not any(a.star for a in expr.args):
            func = expr.func
            if isinstance(func, cst.Attribute) and func.attr.value == "exp" and not expr.args \
                    and self.ctx.imports.qualify(func) is None:
                return "exp(...)"
            name = self.ctx.imports.qualify(func)
            if name in ("torch.exp",) and len(expr.args) == 1:
                return "exp(...)"
            if name in ("torch.nn.functional.softplus",) and expr.args and expr.args[0].keyword is None and all(
                a.keyword is not None and a.keyword.value in ("beta", "threshold") and _positive_literal(a.value)
                for a in expr.args[1:]
            ):  # a negative beta or threshold can give negative values
                return "softplus(...)"
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
            left, right = expr.left, expr.right
            for a, b in ((left, right), (right, left)):
                how = self.positive(a, depth)
                if how is not None and _positive_literal(b):
                    return how + " + a positive constant"
        if isinstance(expr, cst.Name) and depth == 0:
            value = only_value(self._found(), expr.value)
            if value is not None and changed(self._scope_ast(), expr.value, self.ctx.imports):
                value = None  # ``std[mask] = -1``, ``std.sub_(2)``, ``torch.add(std, -5, out=std)``: no longer its value
            if value is not None:
                how = self.positive(value, depth + 1)
                if how is not None:
                    return f"`{expr.value}` = {how}"
            elif len(self._found().get(expr.value, ())) == 1:
                return self._unpacked_positive(expr.value)
        return None

    def not_positive(self, expr: cst.BaseExpression) -> str:
        """Why the scale ``expr`` is left alone, naming what it is: most are a function's
        parameters (tianshou's ``dist_fn(loc, scale)``, pytorch_sac's ``SquashedNormal(loc,
        scale)``), whose value only a run-time check could know, and that check is the validation."""
        known = "a positive constant, exp(...), softplus(...) or a name bound once to one of these"
        if isinstance(expr, cst.Name):
            scope = self.scopes[-1]
            found = self._found().get(expr.value, ())
            if isinstance(scope, cst.FunctionDef) and list(found) == [None] and expr.value in _param_names(scope.params):
                return (f"the scale `{expr.value}` is a parameter of {scope.name.value}(), not provably positive here: "
                        "its value is known only where it is called, and checking it there is what the validation does")
            if len(found) > 1:
                return f"the scale `{expr.value}` is bound {len(found)} times here: not provably positive ({known})"
            unpacked = forward_returns.unpacked_from_call(self._scope_ast(), expr.value) if len(found) == 1 else None
            if unpacked is not None:
                call, index, _ = unpacked
                return (f"the scale `{expr.value}` = {ast.unparse(call.func)}(...)[{index}] is not provably positive: "
                        f"a body that call may run returns another value there, or is not in this file ({known})")
        text = self.ctx.module.code_for_node(expr).strip()
        text = " ".join(text.split())
        text = text if len(text) <= 60 else text[:57] + "..."
        return f"the scale `{text}` is not provably positive here ({known})"

    def _unpacked_positive(self, name: str) -> Optional[str]:
        """How ``name``, bound once by ``mean, name = self.actor(s)``, is positive: what the
        forward returns there (:mod:`.forward_returns`)."""
        scope = self._scope_ast()
        found = forward_returns.unpacked_from_call(scope, name)
        if found is None or changed(scope, name, self.ctx.imports):
            return None
        call, index, length = found
        if self._files is None:
            self._files = Files(self.ctx.tree, self.ctx.imports)
        depth, klass = self._classes[-1] if self._classes else (-1, None)
        cls = klass.name.value if klass is not None and depth == len(self.scopes) - 1 else None
        how = forward_returns.positive_return(self._files, self.ctx.code, call, index, length, cls, scope)
        return f"`{name}` = {ast.unparse(call.func)}(...)[{index}]: {how}" if how is not None else None

    def mvn(self, original: cst.Call, positional: List[cst.BaseExpression], keywords: Dict[str, cst.BaseExpression],
            skip) -> str:
        """How the matrix is valid, or "" having skipped (with the reason)."""
        names = ["loc", "covariance_matrix", "precision_matrix", "scale_tril"]
        given = _bound(names, positional, keywords)
        if given is None:
            skip("arguments other than loc and one matrix")
            return ""
        matrices = [n for n in names[1:] if n in given]
        if "loc" not in given or len(matrices) != 1:
            skip("loc or its one matrix missing")
            return ""
        matrix = matrices[0]
        if matrix == "scale_tril":
            inner = _diagonal_of(given[matrix], self.ctx)
            why = self.positive(inner) if inner is not None else None
            if why is None:
                skip("scale_tril: not provably torch.diag(v) of a positive v here (a positive constant, exp(...), "
                     "softplus(...) or a name bound once to one of these)")
                return ""
            return f"scale_tril diag({why}) (lower triangular, positive diagonal)"
        why = self.symmetric(original, given[matrix])
        if why is None:
            skip(f"{matrix}: not provably a diagonal matrix here (torch.diag(v), torch.diag_embed(v), a name bound "
                 "once to one, or self.X bound once in __init__ to one and used only as such a matrix)")
            return ""
        return f"{matrix} {why} (symmetric; non-PD still raises LinAlgError)"

    def symmetric(self, call: cst.Call, expr: cst.BaseExpression, depth: int = 0) -> Optional[str]:
        """How ``expr`` is a diagonal matrix (batched too), or None if not provable here."""
        if _diagonal_of(expr, self.ctx) is not None:
            return "diagonal"
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and _keeps_matrix(expr):
            return self.symmetric(call, expr.func.value, depth)
        if isinstance(expr, cst.Name) and depth == 0:
            value = only_value(self._found(), expr.value)
            if value is not None and changed(self._scope_ast(), expr.value, self.ctx.imports):
                value = None  # ``cov[0, 1] = x``, ``cov.add_(...)``: no longer what it was bound to
            how = self.symmetric(call, value, depth + 1) if value is not None else None
            return f"`{expr.value}`, {how}" if how is not None else None
        if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self" and depth == 0:
            value = _init_only_attribute(self.ctx, self.ctx.positions[call].start.line, expr.attr.value)
            how = self.symmetric(call, value, depth + 1) if value is not None else None
            return f"`self.{expr.attr.value}`, {how}, set in __init__ only" if how is not None else None
        return None

    def softmax_probs(self, original: cst.Call, updated: cst.Call, probs: cst.BaseExpression) -> cst.BaseExpression:
        """``Categorical(p)`` with ``p`` a softmax (:mod:`.softmax_probs`) -> the run-time helper."""
        pos = self.ctx.positions[original].start
        found = self.softmax.get((pos.line, pos.column))
        if found is None:
            self.sites.append(self.ctx.site(ID, original, SKIPPED, "Categorical(probs): probs not provably an unmodified "
                                            "softmax here (the simplex check is what reports other probs)"))
            return updated
        how, dim = found
        how = how if len(how) <= 80 else how[:77] + "..."
        alias = self.ctx.runtime_name(RUNTIME, "_sb_categorical_probs")
        arg = updated.args[0].with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT,
                                           comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        dim_expr = cst.parse_expression(repr(dim))
        new = cst.Call(func=cst.Name(alias), args=[
            cst.Arg(updated.func, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
            arg, cst.Arg(dim_expr)])
        reason = (f"Categorical(probs): probs: {how} (dim {dim if dim is not None else 'not a literal'}): no validation "
                  f"where a row (the last dim) has at most the dtype's bound of entries (float32: 8), else as written "
                  f"(softmax_probs); NaN/inf logits, an out-of-support log_prob value no longer raise")
        self.sites.append(self.ctx.site(ID, original, REWRITTEN, reason, EXACT))
        return new

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        cls = _QUALNAMES.get(self.ctx.imports.qualify(original.func) or "")
        if cls is None:
            return updated
        kind = _CLASSES[cls][1]

        def skip(reason: str) -> cst.Call:
            self.sites.append(self.ctx.site(ID, original, SKIPPED, f"{cls}(...): {reason}"))
            return updated

        args = original.args
        if any(a.star for a in args):
            return skip("unpacked arguments")
        keywords = {a.keyword.value: a.value for a in args if a.keyword is not None}
        positional = [a.value for a in args if a.keyword is None]
        if "validate_args" in keywords:
            return skip("validate_args is given explicitly: kept")
        if self.user_default:
            return skip("the file calls set_default_validate_args (argument validation chosen on purpose): kept")
        if kind == "logits":
            probs = positional[0] if len(positional) == 1 and not keywords else keywords.get("probs")
            if cls == "Categorical" and probs is not None and len(args) == 1:
                return self.softmax_probs(original, updated, probs)
            if positional or "probs" in keywords or set(keywords) != {"logits"}:
                return skip("probs: the simplex constraint (non-negative, rows summing to 1) is not provable "
                            "from the code, and validation is what reports a net's output that breaks it")
            how = "logits are valid unless NaN"
            extra = ""
        elif kind == "normal":
            names = ["loc", "scale"]
            given = _bound(names, positional, keywords)
            if given is None:
                return skip("arguments other than loc and scale")
            if set(given) != set(names):
                return skip("loc or scale missing")
            why = self.positive(given["scale"])
            if why is None:
                return skip(self.not_positive(given["scale"]))
            how = f"the scale is {why}"
            extra = " (or a scale underflowed to 0)"
        elif kind == "mvn":
            how = self.mvn(original, positional, keywords, skip)
            if not how:
                return updated  # (skipped, with its reason)
            extra = ""
        new_args = list(updated.args)
        trailing = new_args[-1].comma  # a trailing comma (multi-line calls) moves to the new argument
        new_args[-1] = new_args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        empty = cst.SimpleWhitespace("")
        new_args.append(cst.Arg(keyword=cst.Name("validate_args"), value=cst.Name("False"),
                                equal=cst.AssignEqual(empty, empty), comma=trailing))
        checks = "skips its checks (host syncs)" if kind == "mvn" else \
            "skips the checks in __init__ and log_prob (a reduction and a host sync each)"
        reason = f"{cls}(..., validate_args=False): {how}; {checks}; " + NO_RAISE.format(extra=extra)
        self.sites.append(self.ctx.site(ID, original, REWRITTEN, reason, EXACT))
        return updated.with_changes(args=new_args)


def _bound(names: List[str], positional: List[cst.BaseExpression],
           keywords: Dict[str, cst.BaseExpression]) -> Optional[Dict[str, cst.BaseExpression]]:
    """A constructor's arguments by name (the first two may be positional), or None where there
    are more positional ones, a keyword not in ``names``, or one given both ways."""
    given = dict(zip(names, positional))
    if len(positional) > 2 or set(keywords) - set(names) or set(given) & set(keywords):
        return None
    given.update(keywords)
    return given


#: tensor methods that keep a (batched) diagonal matrix one: conversions and copies
_KEEPS = frozenset({"to", "float", "double", "half", "cuda", "cpu", "detach", "clone", "contiguous", "type_as"})


def _keeps_matrix(call: cst.Call) -> bool:
    """``x.to(...)``, ``x.float()``, ``x.unsqueeze(0)`` (a new leading batch dim), ...: a diagonal
    ``x`` stays a diagonal matrix in the last two dims."""
    attr = call.func.attr.value  # type: ignore[attr-defined]
    if attr in _KEEPS:
        return not any(a.star for a in call.args)
    if attr == "unsqueeze" and len(call.args) == 1 and not call.args[0].star:
        arg = call.args[0]
        return (arg.keyword is None or arg.keyword.value == "dim") and isinstance(arg.value, cst.Integer) \
            and arg.value.value == "0"
    return False


def _diagonal_of(expr: cst.BaseExpression, ctx: FileContext) -> Optional[cst.BaseExpression]:
    """``v`` where ``expr`` is ``torch.diag(v)``, ``torch.diag_embed(v)``, ``v.diag()`` or
    ``v.diag_embed()`` with no other argument (an offset puts ``v`` off the diagonal)."""
    if not isinstance(expr, cst.Call) or any(a.star or a.keyword is not None for a in expr.args):
        return None
    func = expr.func
    if ctx.imports.qualify(func) in ("torch.diag", "torch.diag_embed") and len(expr.args) == 1:
        return expr.args[0].value
    if isinstance(func, cst.Attribute) and func.attr.value in ("diag", "diag_embed") and not expr.args \
            and ctx.imports.qualify(func) is None:
        return func.value
    return None


def _init_only_attribute(ctx: FileContext, line: int, attr: str) -> Optional[cst.BaseExpression]:
    """The value of ``self.<attr> = value``, where that is the attribute's one binding in the file,
    made in ``__init__`` of the class holding ``line``, and every other mention of ``.<attr>`` in the
    file is ``self.<attr>`` given as a MultivariateNormal's matrix argument: nothing else can change
    it (other files are not seen, as for the default of validation)."""
    cls = None
    for n in ast.walk(ctx.tree):  # the innermost class holding the line
        if isinstance(n, ast.ClassDef) and n.lineno <= line <= (n.end_lineno or n.lineno):
            if cls is None or n.lineno > cls.lineno:
                cls = n
    if cls is None:
        return None
    matrix_args: set = set()
    for n in ast.walk(ctx.tree):
        if isinstance(n, ast.Call) and _QUALNAMES.get(ctx.imports.qualify(n.func) or "") == "MultivariateNormal":
            matrix_args.update(id(a) for a in n.args[1:2])
            matrix_args.update(id(k.value) for k in n.keywords if k.arg in ("covariance_matrix", "precision_matrix"))
    binding = None
    for node in ast.walk(ctx.tree):
        if not (isinstance(node, ast.Attribute) and node.attr == attr):
            continue
        if isinstance(node.ctx, ast.Load) and id(node) in matrix_args and isinstance(node.value, ast.Name) \
                and node.value.id == "self":
            continue
        if binding is not None or not isinstance(node.ctx, ast.Store):
            return None  # a second binding, or a use that could change it or hand it on
        binding = node
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    if binding is None or init is None or not isinstance(binding.value, ast.Name) or binding.value.id != "self":
        return None
    stmt = next((st for st in init.body if isinstance(st, ast.Assign) and len(st.targets) == 1
                 and st.targets[0] is binding), None)  # in __init__'s own body: not under an if or a loop
    if stmt is None:
        return None
    try:
        return cst.parse_expression(ast.get_source_segment(ctx.code, stmt.value) or "")
    except (cst.ParserSyntaxError, ValueError):
        return None


def _softmax_calls(ctx: FileContext) -> Dict[Tuple[int, int], Tuple[str, Optional[int]]]:
    """(line, column) of each ``Categorical(p)`` call whose ``p`` is provably a softmax -> (how, its dim)."""
    from .callees import Files
    from .softmax_probs import SoftmaxProbs

    files = Files(ctx.tree, ctx.imports)
    probe = SoftmaxProbs(files)
    calls = _CategoricalCalls(ctx.imports, probe, ctx.code.splitlines())
    calls.walk(ctx.tree, None, ctx.tree)
    return calls.out


class _CategoricalCalls:
    """The walk of :func:`_softmax_calls` (a method, not a closure that calls itself: that cycle
    kept the file's tree alive until a garbage collection)."""

    def __init__(self, imports, probe, lines: List[str]) -> None:
        self.imports, self.probe, self.lines = imports, probe, lines
        self.out: Dict[Tuple[int, int], Tuple[str, Optional[int]]] = {}

    def walk(self, node: ast.AST, cls: Optional[str], scope: ast.AST, block=None, stmt=None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                block = next((b for b in (getattr(node, f, None) for f in ("body", "orelse", "finalbody"))
                              if isinstance(b, list) and child in b), None)
                stmt = child
            if isinstance(child, ast.ClassDef):
                self.walk(child, child.name, scope)
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.walk(child, cls if isinstance(node, ast.ClassDef) else None, child)
                continue
            if isinstance(child, ast.Call) and _QUALNAMES.get(self.imports.qualify(child.func) or "") == "Categorical":
                given = child.args[0] if len(child.args) == 1 and not child.keywords else \
                    child.keywords[0].value if not child.args and len(child.keywords) == 1 \
                    and child.keywords[0].arg == "probs" else None
                found = None
                if isinstance(given, ast.Name) and block is not None:
                    found = self.probe.at_site(given.id, block, stmt, cls, scope)
                if found is None and given is not None:
                    found = self.probe.of(given, cls, scope)
                if found is not None:
                    col = len(self.lines[child.lineno - 1].encode()[:child.col_offset].decode(errors="replace"))
                    self.out[(child.lineno, col)] = found
            self.walk(child, cls, scope, block, stmt)


def _sets_default(ctx: FileContext) -> bool:
    import ast

    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.Attribute) and node.attr in ("set_default_validate_args", "_validate_args"):
            return True
        if isinstance(node, ast.Name) and node.id == "set_default_validate_args":
            return True
    return False


class HotDistributionArgs(Transform):
    id = ID
    version = "9"  # 9: the file's modules are read through callees.Files, which now takes `self.fc = init(self.fc)` (a function of the file handing its argument back) as the module of the attribute's other values: a softmax or positive scale behind such a layer can be proven; 8: a scale left alone says what it is (a parameter of f(), bound N times, or its text); 7: a Normal scale unpacked from a forward of this file (`mean, std = self.actor(s)`) whose every return is positive there (forward_returns); 6: Categorical(probs) of a module attribute that is an nn.Sequential ending in nn.Softmax (philtabor's PPO actor), its layers never changed in the file; 5: the softmax-probs reason says a row's length is what the bound limits ("rows are at most the dtype's bound" said nothing), and reads "probs: self.pi(...) returns a softmax", not "probs are ... returns"; 4: a scale also used in arithmetic (mean + std * z) is no alias of it; 3: MultivariateNormal of a diagonal matrix; 2: `t.softmax(x, dim=1)` through a rebound module alias is no tensor method (machin: was rewritten, "dim not a literal")
    triggers = ("Categorical", "Normal", "Bernoulli", "MultivariateNormal")
    description = "distributions whose arguments are valid by construction → validate_args=False (exact on valid input)"

    EXAMPLES = EXAMPLES

    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        import ast

        calls = [n for n in ast.walk(ctx.tree) if isinstance(n, ast.Call) and ctx.imports.qualify(n.func) in _QUALNAMES]
        if not calls:
            return None, []
        sites: List[Site] = []
        new = visit_calls(ctx, calls, _Rewriter(ctx, sites, _sets_default(ctx)))
        return new, sites
