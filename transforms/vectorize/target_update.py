"""Replace per-parameter target-network update loops with one ``torch._foreach_*`` update.

DDPG/TD3/SAC/DQN code updates target networks with a Python loop over parameter pairs (TD3's
author code, CleanRL, spinningup), one small kernel per parameter per op. The rewrite calls
``scalebox_cst.runtime.target_update``, which updates all pairs at once and computes the same
thing op for op (``exact``), or declines at run time (modules of unusual types, mismatched
lists, aliasing, tensor coefficients...) so that the original loop, kept verbatim in the branch
below, runs instead. On CPU the exact forms switch to a compiled one-pass kernel after 1000
calls (about 8x the loop for a 73k-parameter MLP; the foreach sequence alone is about 2x).
``lerp_`` rounds differently: it replaces an exact form only when ``[vectorize.target_update]
allow_lerp = true`` (reported ``reassociated``).
"""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Sequence, Tuple, Union

import libcst as cst

from scalebox_cst.report import EXACT, REASSOCIATED, REWRITTEN, SKIPPED, Site

from ..analysis.cstclone import parse_expression
from ..base import FileContext, Transform
from ..analysis.bodies import flat_body, target_names
from ..analysis.reads import read_elsewhere
from ..analysis.purity import is_pure, is_simple_ref
from ..analysis.scopes import declares_global, rebound_reason
from ..analysis.statements import ast_guarded, ast_is_flat, ast_statements, CstStatements
from ..analysis.rewriting import replace_nodes, ScopedRewriter
from .target_update_examples import EXAMPLES

ID = "vectorize.target_update"
RUNTIME = "scalebox_cst.runtime.target_update"

#: the in-place methods an update's call chain is made of
_UPDATE_OPS = frozenset({"copy_", "mul_", "add_", "lerp_"})
#: methods that make ``_iter_kind`` say params / named / state_dict
_PARAM_METHODS = frozenset({"parameters", "named_parameters", "values"})

FORMS_HELP = (
    "tp.copy_(a * p + b * tp), tp.mul_(b); tp.add_(a * p), tp *= b; tp += a * p, tp.add_(p, alpha=a), "
    "tp.lerp_(p, w), tp.copy_(p)"
)


class _Form:
    """A recognised update: runtime function, coefficient expressions, write kind."""

    def __init__(self, kind: str, coefs: Sequence[Optional[cst.BaseExpression]], data: bool, note: str,
                 replace: bool = False) -> None:
        self.kind = kind  # soft_update | scale_add | scale_add_alpha | lerp_update | hard_update
        self.coefs = list(coefs)
        self.data = data
        self.note = note
        self.replace = replace  # `tp.data = E`: the loop stores a new tensor (the runtime does too)


def _ref(expr: cst.BaseExpression, names: Sequence[str], write: bool = False) -> Optional[Tuple[str, str]]:
    """``x`` / ``x.data`` (and, for reads, ``x.detach()``) of a loop variable: (name, kind)."""
    if isinstance(expr, cst.Name) and expr.value in names:
        return expr.value, "plain"
    if (
        isinstance(expr, cst.Attribute)
        and expr.attr.value == "data"
        and isinstance(expr.value, cst.Name)
        and expr.value.value in names
    ):
        return expr.value.value, "data"
    if (
        not write
        and isinstance(expr, cst.Call)
        and not expr.args
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value == "detach"
        and isinstance(expr.func.value, cst.Name)
        and expr.func.value.value in names
    ):
        return expr.func.value.value, "detach"
    return None


def _chain(call: cst.Call) -> Tuple[cst.BaseExpression, List[Tuple[str, Sequence[cst.Arg]]]]:
    """``w.mul_(b).add_(x)`` → (``w``, [("mul_", args), ("add_", args)])."""
    ops: List[Tuple[str, Sequence[cst.Arg]]] = []
    node: cst.BaseExpression = call
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        if node.func.attr.value in ("copy_", "mul_", "add_", "lerp_"):
            ops.append((node.func.attr.value, node.args))
            node = node.func.value
        else:
            break
    ops.reverse()
    return node, ops


def _plain_args(args: Sequence[cst.Arg], n: int, keywords: Sequence[str] = ()) -> Optional[List[cst.BaseExpression]]:
    """Positional args (exactly ``n``) then optional keywords, in the order of ``keywords``."""
    pos = [a for a in args if a.keyword is None]
    kws = {a.keyword.value: a.value for a in args if a.keyword is not None}
    if any(a.star for a in args) or len(pos) != n or any(k not in keywords for k in kws):
        return None
    return [a.value for a in pos] + [kws.get(k) for k in keywords]


class _Matcher:
    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self.forbidden = set(names)

    def coef(self, expr: Optional[cst.BaseExpression]) -> bool:
        return expr is not None and is_pure(expr, self.forbidden)

    def term(self, expr: cst.BaseExpression) -> Optional[Tuple[str, cst.BaseExpression]]:
        """``c * x`` or ``x * c`` with ``x`` a loop-variable read and ``c`` pure: (name, c)."""
        if not (isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Multiply)):
            return None
        for ref_side, coef_side in ((expr.right, expr.left), (expr.left, expr.right)):
            ref = _ref(ref_side, self.names)
            if ref is not None and self.coef(coef_side):
                return ref[0], coef_side
        return None

    def match(self, stmts: Sequence[cst.BaseSmallStatement]) -> Union[Tuple[str, _Form], str]:
        """(target loop variable, form), or why the body is not a recognised update. Names of
        inlined temporaries (``new = a * p + b * tp; tp.copy_(new)``) are left in ``temps``: the
        caller must check that nothing else reads them, since the rewrite does not bind them."""
        ops: List[Tuple[str, Sequence[cst.Arg]]] = []
        writes: List[Tuple[str, str]] = []
        stmts, self.temps = _inline_temporaries(stmts, self.names)
        if len(stmts) == 1 and isinstance(stmts[0], cst.Assign):
            replaced = self._data_assign(stmts[0])
            if replaced is not None:
                return replaced
        for stmt in stmts:
            if isinstance(stmt, cst.AugAssign):
                # `tp.data *= b; tp.data += a * p.data`: in-place __imul__/__iadd__ are mul_/add_
                # (the .data setter then stores the same tensor back, a no-op)
                op = {cst.MultiplyAssign: "mul_", cst.AddAssign: "add_"}.get(type(stmt.operator))
                ref = _ref(stmt.target, self.names, write=True)
                if op is None or ref is None:
                    return f"body is not a recognised target-network update ({FORMS_HELP})"
                writes.append(ref)
                ops.append((op, [cst.Arg(stmt.value)]))
                continue
            if not isinstance(stmt, cst.Expr) or not isinstance(stmt.value, cst.Call):
                if isinstance(stmt, cst.Assign) and any(
                    _ref(t.target, self.names, write=True) for t in stmt.targets
                ):
                    return "assigns .data (replaces the tensor instead of updating it in place)"
                return f"body is not a recognised target-network update ({FORMS_HELP})"
            base, chain = _chain(stmt.value)
            ref = _ref(base, self.names, write=True)
            if ref is None or not chain:
                return f"body is not a recognised target-network update ({FORMS_HELP})"
            writes.append(ref)
            ops.extend(chain)
        if len({name for name, _ in writes}) != 1:
            return "the body writes more than one loop variable"
        if len({kind for _, kind in writes}) != 1:
            return "the body writes both through .data and directly"
        tgt, kind = writes[0]
        src = next(n for n in self.names if n != tgt)
        data = kind == "data"
        return self._form(ops, tgt, src, data)

    def _data_assign(self, stmt: cst.Assign) -> Union[Tuple[str, _Form], str, None]:
        """``tp.data = a * p.data + b * tp.data`` (spinningup-style polyak written with ``=``):
        the loop stores a new tensor holding what ``copy_`` would write; the runtime computes the
        same new tensors and stores them the same way (``replace=True``). None: not this form."""
        if len(stmt.targets) != 1:
            return None
        ref = _ref(stmt.targets[0].target, self.names, write=True)
        if ref is None or ref[1] != "data":
            return None
        tgt = ref[0]
        src = next(n for n in self.names if n != tgt)
        value = stmt.value
        read = _ref(value, self.names)
        if read is not None and read[0] == src:
            code = cst.Module([]).code_for_node
            # sheeprl ties its player's weights to its agent's this way on purpose ("Tie weights"):
            # advice to write a copy would break what the code means, so none is given
            return (f"`{code(stmt.targets[0].target)} = {code(value)}` makes the target share the source's "
                    "storage (tied weights, no copy): nothing is updated to vectorize")
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add):
            left, right = self.term(value.left), self.term(value.right)
            if left and right and {left[0], right[0]} == {src, tgt}:
                a = left[1] if left[0] == src else right[1]
                b = right[1] if left[0] == src else left[1]
                return tgt, _Form("soft_update", [a, b], True, "tp.data = a*p + b*tp", replace=True)
        return None

    def _form(self, ops, tgt: str, src: str, data: bool) -> Union[Tuple[str, _Form], str]:
        unknown = f"body is not a recognised target-network update ({FORMS_HELP})"
        names = [name for name, _ in ops]
        if names == ["copy_"]:
            args = _plain_args(ops[0][1], 1)
            if args is None:
                return unknown
            value = args[0]
            ref = _ref(value, self.names)
            if ref is not None:
                return (tgt, _Form("hard_update", [], data, "hard copy")) if ref[0] == src else unknown
            if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add):
                left, right = self.term(value.left), self.term(value.right)
                if left and right and {left[0], right[0]} == {src, tgt}:
                    a = left[1] if left[0] == src else right[1]
                    b = right[1] if left[0] == src else left[1]
                    return tgt, _Form("soft_update", [a, b], data, "a*p + b*tp")
            return unknown
        if names == ["mul_", "add_"]:
            mul = _plain_args(ops[0][1], 1)
            if mul is None or not self.coef(mul[0]):
                return unknown
            add = _plain_args(ops[1][1], 1, ("alpha",))
            if add is None:
                return unknown
            value, alpha = add
            if alpha is not None:
                ref = _ref(value, self.names)
                if ref is not None and ref[0] == src and self.coef(alpha):
                    return tgt, _Form("scale_add_alpha", [mul[0], alpha], data, "mul_ then add_ with alpha")
                return unknown
            term = self.term(value)
            if term is not None and term[0] == src:
                return tgt, _Form("scale_add", [mul[0], term[1]], data, "mul_ then add_")
            return unknown
        if names == ["lerp_"]:
            args = _plain_args(ops[0][1], 1, ("weight",))
            if args is None:
                args = _plain_args(ops[0][1], 2)
            if args is None:
                return unknown
            end, weight = args
            ref = _ref(end, self.names)
            if ref is not None and ref[0] == src and self.coef(weight):
                return tgt, _Form("lerp_update", [weight], data, "lerp_")
            return unknown
        return unknown


def _inline_temporaries(stmts: Sequence[cst.BaseSmallStatement], names: Sequence[str]):
    """``new_val = E`` immediately followed by a statement that reads ``new_val`` exactly once, as
    a whole call argument (``tp.data.copy_(new_val)``): the pair becomes that statement with ``E``
    in place of the name (evaluated at the same moment, nothing runs in between). Returns the new
    statement list and the inlined names (empty when nothing was inlined)."""
    out: List[cst.BaseSmallStatement] = []
    temps: List[str] = []
    i = 0
    while i < len(stmts):
        stmt = stmts[i]
        nxt = stmts[i + 1] if i + 1 < len(stmts) else None
        if (
            nxt is not None
            and isinstance(stmt, cst.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0].target, cst.Name)
            and stmt.targets[0].target.value not in names
            and isinstance(nxt, cst.Expr)
            and isinstance(nxt.value, cst.Call)
        ):
            name = stmt.targets[0].target.value
            args = [a for a in nxt.value.args if isinstance(a.value, cst.Name) and a.value.value == name]
            uses = [n for n in _names(nxt) if n == name]
            if len(args) == 1 and len(uses) == 1 and name not in _names(stmt.value):
                call = nxt.value.with_changes(
                    args=[a.with_changes(value=stmt.value) if a is args[0] else a for a in nxt.value.args]
                )
                out.append(nxt.with_changes(value=call))
                temps.append(name)
                i += 2
                continue
        out.append(stmt)
        i += 1
    return out, temps


def _names(node: cst.CSTNode) -> List[str]:
    """Every plain name read under ``node`` (attribute names excluded), with repetitions."""
    names = _Names()
    node.visit(names)
    return names.found


class _Names(cst.CSTVisitor):
    """:func:`_names`' visit (module-level: a class made per call is a cycle that stays alive, with what it holds, until a garbage collection)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: List[str] = []

    def visit_Attribute(self, n: cst.Attribute) -> bool:
        n.value.visit(self)
        return False

    def visit_Name(self, n: cst.Name) -> None:
        self.found.append(n.value)


def _one_minus(expr: cst.BaseExpression, other: cst.BaseExpression) -> bool:
    """Whether ``expr`` is literally ``1 - other`` (or ``1.0 - other``)."""
    return (
        isinstance(expr, cst.BinaryOperation)
        and isinstance(expr.operator, cst.Subtract)
        and isinstance(expr.left, (cst.Integer, cst.Float))
        and float(expr.left.value) == 1.0
        and expr.right.deep_equals(other)
    )


def _ast_candidate(loop: ast.stmt) -> bool:
    """Whether :meth:`_Rewriter.leave_For` may report ``loop`` (a superset: libcst then decides):
    it zips something, and a zipped value calls a parameter-listing method or every statement of
    a flat body is an in-place update call."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    it = loop.iter
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "zip"):
        return False
    for arg in it.args:
        value = arg.value if isinstance(arg, ast.Starred) else arg
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _PARAM_METHODS:
            return True
    return ast_is_flat(loop.body) and all(
        isinstance(st, ast.Expr)
        and isinstance(st.value, ast.Call)
        and (
            (isinstance(st.value.func, ast.Attribute) and st.value.func.attr in _UPDATE_OPS)
            or any(k.arg == "out" for k in st.value.keywords)  # SB3's th.add(tp.data, p.data, alpha=tau, out=tp.data)
        )
        for st in loop.body
    )


def _update_shaped(body) -> bool:
    """Every statement of a flat body is an in-place update call (``tp.data.mul_(...)``) or a call
    writing ``out=`` (SB3's polyak_update): an update loop, reported even where it is not rewritten."""
    if not body:
        return False
    for st in body:
        call = st.value if isinstance(st, cst.Expr) else None
        if not isinstance(call, cst.Call):
            return False
        if not ((isinstance(call.func, cst.Attribute) and call.func.attr.value in _UPDATE_OPS)
                or any(a.keyword is not None and a.keyword.value == "out" for a in call.args)):
            return False
    return True


class _Rewriter(ScopedRewriter):
    """Rewrites update loops (``leave_For``). Run as a transformer over the whole module (the
    fallback) or driven loop by loop by :meth:`VectorizeTargetUpdate.rewrite`, which sets
    ``scopes`` and ``guards`` and gives the loops' lines in ``spans``."""

    transform_id = ID

    def __init__(self, ctx: FileContext, sites: List[Site], spans: Optional[Dict[cst.CSTNode, Tuple[int, int]]] = None) -> None:
        super().__init__(ctx, sites, spans)
        self.allow_lerp = bool(ctx.option(ID, "allow_lerp", False))

    # ---------------------------------------------------------------- scopes
    # ---------------------------------------------------------------- loops
    def _skip(self, node: cst.For, reason: str) -> cst.For:
        self.sites.append(self.make_site(node, SKIPPED, reason))
        return node

    def zip_rebound(self) -> bool:
        return not self.builtin_ok("zip")

    def leave_For(self, original: cst.For, updated: cst.For) -> Union[cst.For, cst.If]:
        if any(self.guards):
            return updated  # original code kept under another rewrite's guard
        it = original.iter
        if not (isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value == "zip"):
            return updated
        sources = [a for a in it.args if a.keyword is None]
        kinds = [_iter_kind(a.value) for a in sources]
        names = target_names(original.target)
        body = flat_body(original.body)
        matched: Union[Tuple[str, _Form], str, None] = None
        temps: List[str] = []
        if names is not None and len(names) == 2 and len(set(names)) == 2 and body is not None:
            matcher = _Matcher(names)
            matched = matcher.match(body)
            temps = matcher.temps
        is_update = isinstance(matched, tuple)
        if not is_update and not any(k[0] in ("params", "state_dict", "named") for k in kinds) \
                and not (body is not None and _update_shaped(body)):
            return updated  # neither iterates over parameters nor looks like an update
        if self.zip_rebound():
            return self._skip(original, rebound_reason(self.builtin_ok, "zip"))
        if any(a.star for a in it.args) or any(a.keyword is not None and a.keyword.value != "strict" for a in it.args):
            return self._skip(original, "zip(...) has unpacked or unknown arguments")
        if len(sources) != 2:
            return self._skip(original, f"zips {len(sources)} iterables, not two parameter lists")
        if any(k[0] == "state_dict" for k in kinds):
            return self._skip(
                original,
                "iterates state_dict() values, which include buffers (integer counters, running "
                "statistics) next to parameters: left alone",
            )
        if any(k[0] == "named" for k in kinds):
            return self._skip(original, "iterates named_parameters() pairs: not a recognised update loop")
        if kinds[0][0] != "params" or kinds[1][0] != "params":
            other = next(self.ctx.module.code_for_node(a.value) for a, k in zip(sources, kinds) if k[0] != "params")
            return self._skip(original, f"iterates `{other}`, not the .parameters() of two modules")
        if not all(is_simple_ref(k[1]) for k in kinds):
            return self._skip(original, "a module expression is not a plain name/attribute (it is evaluated twice)")
        if original.orelse is not None:
            return self._skip(original, "the loop has an else clause")
        if original.asynchronous is not None:
            return self._skip(original, "async for")
        if names is None or len(names) != 2 or len(set(names)) != 2:
            return self._skip(original, "the loop target is not two names")
        if body is None:
            return self._skip(original, f"body is not a recognised target-network update ({FORMS_HELP})")
        if isinstance(matched, str):
            return self._skip(original, matched)
        assert isinstance(matched, tuple)
        tgt_name, form = matched
        live = read_elsewhere(self.scopes[-1], original, names + temps)
        if live:
            return self._skip(original, f"the loop variable(s) {', '.join(sorted(live))} may be read outside the loop")
        declared = declares_global(self.scopes[-1], names + temps)
        if declared:
            return self._skip(original, f"{', '.join(sorted(declared))} declared global/nonlocal: the loop binds it for code elsewhere")
        tgt_index = names.index(tgt_name)
        tgt_expr = kinds[tgt_index][1]
        src_expr = kinds[1 - tgt_index][1]
        return self._emit(original, updated, form, src_expr, tgt_expr)

    def _emit(self, original: cst.For, updated: cst.For, form: _Form, src, tgt) -> cst.If:
        code = self.ctx.module.code_for_node
        kind, coefs, exactness = form.kind, list(form.coefs), EXACT
        note = "one torch._foreach_* update over all parameter pairs; same ops, same order per element"
        if kind in ("soft_update", "scale_add") and self.allow_lerp and not form.replace:
            a, b = (coefs[0], coefs[1]) if kind == "soft_update" else (coefs[1], coefs[0])
            if _one_minus(b, a) or _one_minus(a, b):
                kind, coefs, exactness = "lerp_update", [a], REASSOCIATED
                note = "one torch._foreach_lerp_ (allow_lerp): lerp rounds differently, ≈1e-7 relative"
        elif kind in ("scale_add_alpha", "lerp_update") and self.ctx.backend != "cpu":
            exactness = REASSOCIATED
            note += (
                f"; on {self.ctx.backend} the fused foreach kernel of {'add_(alpha=)' if kind == 'scale_add_alpha' else 'lerp_'} "
                "may round differently from the per-tensor kernel (≤1 ulp)"
            )
        alias = self.ctx.runtime_name(f"{RUNTIME}.{kind}", f"_sb_{kind}")
        args = [code(src), code(tgt)] + [code(c) for c in coefs]
        if not form.data:
            args.append("data=False")
        if form.replace:
            args.append("replace=True")
        test = parse_expression(f"not {alias}({', '.join(args)})")
        self.sites.append(self.make_site(original, REWRITTEN, f"{form.note}: {note}", exactness))
        inner = updated.with_changes(leading_lines=())
        return cst.If(test=test, body=cst.IndentedBlock(body=[inner]), leading_lines=updated.leading_lines)


def _iter_kind(expr: cst.BaseExpression) -> Tuple[str, Optional[cst.BaseExpression]]:
    """("params", module expr) for ``m.parameters()``; "state_dict", "named" or "other"."""
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
        attr = expr.func.attr.value
        if attr == "parameters" and not expr.args:
            return "params", expr.func.value
        if attr == "parameters":
            return "other", None
        if attr == "named_parameters":
            return "named", None
        if (
            attr == "values"
            and isinstance(expr.func.value, cst.Call)
            and isinstance(expr.func.value.func, cst.Attribute)
            and expr.func.value.func.attr.value == "state_dict"
        ):
            return "state_dict", None
    return "other", None


class VectorizeTargetUpdate(Transform):
    id = ID
    version = "5"  # 5: the tied-weights skip gives no advice to copy; 4: `tp.data = a * p.data + b * tp.data` rewritten (replace=True); 3: update-shaped loops over other iterables reported; 2: star imports of known modules resolved
    triggers = ("zip(",)
    description = "per-parameter target-network update loops → one torch._foreach_* update (guarded)"

    EXAMPLES = EXAMPLES

    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        # Candidates are found on the shared ast: zip loops over parameter-like calls or with an
        # update-shaped body, outside the guards of earlier rewrites. None: libcst is never
        # touched. Otherwise the libcst module is parsed once and only the candidates are
        # analysed, in the order a full transformer pass would leave them (runtime aliases are
        # allocated in that order); only the nodes on the way to an edit are rebuilt.
        astmts, parents = ast_statements(ctx.tree.body)
        loops = [i for i, st in enumerate(astmts) if _ast_candidate(st) and not ast_guarded(st, parents, ctx.imports)]
        if not loops:
            return None, []
        module = ctx.module_for([astmts[i] for i in loops])  # only their top-level statements parsed
        sites: List[Site] = []
        statements = CstStatements(module)
        if not statements.matches(astmts):  # the trees do not pair up (never seen): the full pass
            return ctx.whole_module().visit(_Rewriter(ctx, sites)), sites
        spans = {statements.stmts[i]: (astmts[i].lineno, astmts[i].end_lineno or astmts[i].lineno) for i in loops}
        rewriter = _Rewriter(ctx, sites, spans)
        replacements: Dict[cst.CSTNode, cst.CSTNode] = {}
        order = sorted(loops, key=lambda i: (astmts[i].end_lineno, astmts[i].end_col_offset, -astmts[i].lineno, -astmts[i].col_offset))
        for i in order:
            node = statements.stmts[i]
            rewriter.guards = [statements.guarded(node, ctx.imports)]
            rewriter.scopes = [statements.scope(node)]
            new = rewriter.leave_For(node, node)
            if new is not node:
                replacements[node] = new
        if not replacements:
            return None, sites
        return replace_nodes(module, replacements, statements.parent), sites
