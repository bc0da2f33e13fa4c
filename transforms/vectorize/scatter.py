"""Per-row ``out[i].index_add_(dim, idx[i], src[i])`` loops → one ``scatter_add_`` (vectorize.elementwise).

Segment sums and message passing per batch element (RL and GNN code) loop over the batch and call
``index_add_`` on each row: one small kernel per row. The rewrite makes the same additions in one
op, under a run-time guard (``scalebox_cst.runtime.scatter``) with the loop kept verbatim in the
else branch. On CPU every target element still adds its own row's values in index order, each
with one rounding, so the result is bitwise the loop's (``exact``; checked by differential tests).
On CUDA both ops accumulate with atomics (``reassociated``). With ``alpha`` (which ``index_add_``
fuses into its add) the rewrite keeps ``index_add_`` over flattened rows instead.

Several calls into the same rows (CleanRL C51's projection: ``target_pmfs[i].index_add_(0,
l[i].long(), d_m_l[i])`` then the same with ``u``) become as many batched calls in the same
order: rows are disjoint, so each target still sees call 1's values in index order, then call
2's (``exact`` on CPU). Index rows cast with ``.long()``/``.int()``/``.to(torch.long)`` are cast
as a batch by the guard, which checks float indices for finiteness and range first.

A module of its own (not elementwise.py, which handles assignment loops): its rewrite is
chained after that transform's by :func:`with_index_add_loops`.
"""
from __future__ import annotations

import ast
import functools
from typing import Dict, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

import libcst as cst

from scalebox_cst.report import EXACT, REASSOCIATED, REWRITTEN, SKIPPED, Site

from ..analysis.cstclone import parse_expression, parse_statement
from ..base import FileContext
from ..analysis.bodies import early_exit_reason, flat_body, target_names
from ..analysis.loops import not_a_name
from ..analysis.reads import names_read, read_elsewhere
from ..analysis.purity import is_pure, is_simple_ref
from ..analysis.scopes import builtin_checker, declares_global, rebound_reason
from ..analysis.statements import ast_guarded, ast_statements, CstStatements
from ..analysis.rewriting import replace_nodes

RUNTIME = "scalebox_cst.runtime.scatter"
METHOD = "index_add_"
_PARAMS = ("dim", "index", "source")
_BOUND_OPS = (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide)
_AST_BLOCKS = ("body", "orelse", "finalbody")


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


# --------------------------------------------------------------------------- candidates (ast)


def _ast_bound(target: ast.AST) -> Set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


#: per-row in-place scatters this module does not batch: a loop of them is reported, not rewritten
OTHER_ROW_METHODS = ("scatter_add_", "scatter_", "scatter_reduce_", "index_copy_", "index_fill_", "index_put_")


def _ast_row_call(stmt: ast.stmt, names: Set[str], methods: Tuple[str, ...] = (METHOD,)) -> bool:
    """``X[..i..].index_add_(...)`` or ``x.index_add_(...)`` (or one of ``methods``) as a statement,
    ``i``/``x`` bound by the loop."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return False
    func = stmt.value.func
    if not (isinstance(func, ast.Attribute) and func.attr in methods):
        return False
    recv = func.value
    if isinstance(recv, ast.Name):
        return recv.id in names
    if isinstance(recv, ast.Subscript):
        return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(recv.slice))
    return False


def _ast_candidate(loop: ast.stmt) -> bool:
    """A ``for`` loop with a per-row ``index_add_`` statement anywhere in its body (not in nested
    defs): a superset of what the rewrite takes; libcst then decides, or says why not."""
    return bool(_ast_row_methods(loop, (METHOD,)))


def _ast_row_methods(loop: ast.stmt, methods: Tuple[str, ...]) -> Set[str]:
    """Which of ``methods`` the ``for`` loop's body calls per row as statements, anywhere in it (not
    in nested defs)."""
    found: Set[str] = set()
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return found
    names = _ast_bound(loop.target)
    todo: List[ast.stmt] = list(loop.body)
    while todo:
        st = todo.pop()
        if _ast_row_call(st, names, methods):
            found.add(st.value.func.attr)
            continue
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in _AST_BLOCKS:
            todo.extend(getattr(st, field, ()) or ())
        for h in getattr(st, "handlers", ()) or ():
            todo.extend(h.body)
        for c in getattr(st, "cases", ()) or ():
            todo.extend(c.body)
    return found


# --------------------------------------------------------------------------- analysis (libcst)


class _Call(NamedTuple):
    index: cst.BaseExpression  # X of the index row X[i] (the rows of all calls are batched)
    cast: Optional[str]  # None, "long" or "int": the cast of each index row
    source: cst.BaseExpression
    alpha: Optional[cst.BaseExpression]  # None: no alpha (or a literal 1)


class _Plan(NamedTuple):
    rows: str  # the loop's range(...) call, or "None" for zip(out, idx, src)
    out: cst.BaseExpression
    calls: List[_Call]  # in the loop's order
    dim: cst.BaseExpression
    row: str  # the per-row call, for the site text


def _bound_ok(expr: cst.BaseExpression, forbidden: Set[str], builtin_ok, imports=None) -> bool:
    """A range bound evaluated twice (guard, then the verbatim loop): pure arithmetic on names,
    attributes, ``len(ref)``, ``ref.shape[k]``, and calls in analysis.purity's table given the
    module's ``imports`` (``ref.size(k)``, ``ref.numel()``)."""
    if isinstance(expr, cst.Call):
        args = expr.args
        if any(a.star or a.keyword is not None for a in args):
            return False
        func = expr.func
        if isinstance(func, cst.Name) and func.value == "len" and builtin_ok("len") and len(args) == 1:
            ref = args[0].value
            return is_simple_ref(ref) and not (names_read(ref) & forbidden)
        return is_pure(expr, forbidden, imports)
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, _BOUND_OPS):
        return _bound_ok(expr.left, forbidden, builtin_ok, imports) and _bound_ok(expr.right, forbidden, builtin_ok, imports)
    return is_pure(expr, forbidden, imports)


def _mentions(node: cst.CSTNode, ref: cst.BaseExpression) -> bool:
    """Whether ``ref`` (a plain reference) is read under ``node`` (attribute and keyword names
    do not count: ``agg`` is not read by ``x.agg``)."""
    if isinstance(ref, cst.Name):
        return ref.value in names_read(node)
    finder = _Mention(ref)
    node.visit(finder)
    return finder.found


class _Mention(cst.CSTVisitor):
    """:func:`_mentions`' visit (module-level: a class made per call is a cycle that stays alive, with what it holds, until a garbage collection)."""

    def __init__(self, ref: cst.BaseExpression) -> None:
        super().__init__()
        self.ref = ref
        self.found = False

    def on_visit(self, n: cst.CSTNode) -> bool:
        if not self.found and type(n) is type(self.ref) and n.deep_equals(self.ref):
            self.found = True
        return not self.found


def _header(node: cst.For, builtin_ok, imports=None) -> Union[str, Tuple[str, List[str]]]:
    if node.asynchronous is not None:
        return "async for"
    if node.orelse is not None:
        return "the loop has an else clause"
    it = node.iter
    if not (isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value in ("range", "zip")):
        return "the loop is neither `for i in range(...)` nor `for o, j, s in zip(out, idx, src)`"
    func = it.func.value
    if not builtin_ok(func):
        return rebound_reason(builtin_ok, func)
    if any(a.star or a.keyword is not None for a in it.args):
        return f"{func}(...) has keyword or unpacked arguments"
    if func == "range":
        if not isinstance(node.target, cst.Name):
            return "a range loop must bind one index"
        if not 1 <= len(it.args) <= 3 or not all(_bound_ok(a.value, {node.target.value}, builtin_ok, imports) for a in it.args):
            return "range bounds are not plain values (they are evaluated by the guard and again by the loop)"
        return "range", [node.target.value]
    names = target_names(node.target)
    if names is None or len(names) != 3 or len(set(names)) != 3 or len(it.args) != 3:
        return "a zip loop that does not unpack (row, index, source) from three sequences"
    bad = next((a.value for a in it.args if not is_simple_ref(a.value)), None)
    if bad is not None:
        return not_a_name(bad, "a zipped sequence")
    return "zip", names


def _arguments(call: cst.Call) -> Union[str, Dict[str, cst.BaseExpression]]:
    got: Dict[str, cst.BaseExpression] = {}
    positional: List[cst.BaseExpression] = []
    for a in call.args:
        if a.star:
            return "index_add_ is called with unpacked arguments"
        if a.keyword is None:
            positional.append(a.value)
            continue
        name = a.keyword.value
        if name not in _PARAMS + ("alpha",) or name in got:
            return f"index_add_ is called with keyword `{name}`"
        got[name] = a.value
    if len(positional) > 3:
        return "index_add_ gets a fourth positional argument (alpha is keyword-only: the loop raises)"
    for name, value in zip(_PARAMS, positional):
        if name in got:
            return f"index_add_ gets `{name}` twice"
        got[name] = value
    if any(p not in got for p in _PARAMS):
        return "index_add_ lacks one of dim, index, source"
    return got


def _row_ref(expr: cst.BaseExpression, i: str, what: str, out: Optional[cst.BaseExpression]) -> Union[str, cst.BaseExpression]:
    """``X`` of ``X[i]`` (X a plain reference), or why ``expr`` is not the current row of one."""
    if out is not None and _mentions(expr, out):
        return f"the {what} `{_code(expr)}` reads `{_code(out)}`, which the loop writes (loop-carried through it)"
    if not (isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index)):
        return f"the {what} `{_code(expr)}` is not a row `X[{i}]` of a plain name/attribute"
    ref, row = expr.value, expr.slice[0].slice.value
    if not (isinstance(row, cst.Name) and row.value == i):
        if i in names_read(row):
            return f"the {what} is `{_code(expr)}`, not the current row `{_code(ref)}[{i}]` (shifted or computed row index)"
        return f"the {what} `{_code(expr)}` is not a row `X[{i}]` of a plain name/attribute"
    if not is_simple_ref(ref) or i in names_read(ref):
        return f"the {what} `{_code(expr)}` is not a row `X[{i}]` of a plain name/attribute"
    return ref


_CAST_METHODS = {"long": "long", "int": "int"}
_CAST_DTYPES = {"torch.long": "long", "torch.int64": "long", "torch.int32": "int", "torch.int": "int"}
_OTHER_CASTS = ("short", "char", "byte", "bool", "half", "float", "double", "bfloat16", "type", "to", "cpu", "cuda")
_ACCEPTED_CASTS = "only `.long()`, `.int()` and `.to(torch.long/int64/int32)` are taken"


def _peel_cast(expr: cst.BaseExpression, imports) -> Union[str, Tuple[cst.BaseExpression, Optional[str]]]:
    """``(X[i], cast)`` for an index ``X[i].long()`` / ``.int()`` / ``.to(torch.long)``, ``(expr,
    None)`` for an index without a call, or why the index's conversion is not taken."""
    if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)):
        return expr, None
    method, inner, args = expr.func.attr.value, expr.func.value, expr.args
    if method in _CAST_METHODS:
        if args:
            return f"the index cast `{_code(expr)}` has arguments; {_ACCEPTED_CASTS}"
        return inner, _CAST_METHODS[method]
    if method == "to" and len(args) == 1 and not args[0].star and (args[0].keyword is None or args[0].keyword.value == "dtype"):
        cast = _CAST_DTYPES.get(imports.qualify(args[0].value) or "")
        if cast is not None:
            return inner, cast
        return f"the index is converted with `{_code(expr)}`, not to int64/int32 (the index dtypes index_add_ takes); {_ACCEPTED_CASTS}"
    if method in _OTHER_CASTS:
        return f"the index is converted with `{_code(expr)}`; {_ACCEPTED_CASTS}"
    return expr, None


def _same_value(a: cst.BaseExpression, b: cst.BaseExpression) -> bool:
    """The same expression up to whitespace, comments and parentheses."""
    try:
        return ast.dump(ast.parse(_code(a).strip(), mode="eval")) == ast.dump(ast.parse(_code(b).strip(), mode="eval"))
    except SyntaxError:
        return False


def _analyse(node: cst.For, scope: cst.CSTNode, builtin_ok, imports) -> Union[str, _Plan]:
    header = _header(node, builtin_ok, imports)
    if isinstance(header, str):
        return header
    mode, names = header
    why = early_exit_reason(node.body)
    if why:
        return why
    stmts = flat_body(node.body)
    if stmts is None:
        return "the loop body holds compound statements (if/for/with/try...), not only index_add_ calls"
    calls = [
        s for s in stmts
        if isinstance(s, cst.Expr) and isinstance(s.value, cst.Call)
        and isinstance(s.value.func, cst.Attribute) and s.value.func.attr.value == METHOD
    ]
    if not calls:
        return "the index_add_ call is not a statement of its own"
    recv = calls[0].value.func.value
    out_ref = recv.value if isinstance(recv, cst.Subscript) else recv
    if len(calls) != len(stmts):
        other = next(s for s in stmts if s not in calls)
        if is_simple_ref(out_ref) and _mentions(other, out_ref):
            return f"the body also runs `{_code(other).strip()}`, which uses `{_code(out_ref)}` (loop-carried through it)"
        return f"the body also runs `{_code(other).strip()}`; only per-row index_add_ calls are rewritten"
    parsed = []
    for c in calls:
        args = _arguments(c.value)
        if isinstance(args, str):
            return args
        parsed.append((c.value.func.value, args))
    it = node.iter
    assert isinstance(it, cst.Call)
    dim = parsed[0][1]["dim"]
    several = len(parsed) > 1
    plan_calls: List[_Call] = []
    if mode == "range":
        i = names[0]
        for recv, args in parsed:
            if not (isinstance(recv, cst.Subscript) and len(recv.slice) == 1 and isinstance(recv.slice[0].slice, cst.Index)):
                return f"index_add_ is applied to `{_code(recv)}`, not to a row `X[{i}]`"
            base, row = recv.value, recv.slice[0].slice.value
            if not (isinstance(row, cst.Name) and row.value == i):
                return f"index_add_ writes `{_code(recv)}`, not the current row `{_code(base)}[{i}]` (shifted or computed row index)"
            if not is_simple_ref(base) or i in names_read(base):
                return f"the output `{_code(base)}` is not a plain name/attribute"
            if not base.deep_equals(out_ref):
                return (
                    f"the index_add_ calls write different outputs (`{_code(out_ref)}` and `{_code(base)}`); "
                    "only calls into the same rows are rewritten"
                )
            if not _same_value(args["dim"], dim):
                return f"the index_add_ calls index different dims (`{_code(dim)}` and `{_code(args['dim'])}`)"
        out = out_ref
        for _, args in parsed:
            if _mentions(args["index"], out):  # before peeling: `out[i].argmax().long()` reads out
                return f"the index `{_code(args['index'])}` reads `{_code(out)}`, which the loop writes (loop-carried through it)"
            peeled = _peel_cast(args["index"], imports)
            if isinstance(peeled, str):
                return peeled
            index = _row_ref(peeled[0], i, "index", out)
            if isinstance(index, str):
                return index
            source = _row_ref(args["source"], i, "source", out)
            if isinstance(source, str):
                return source
            plan_calls.append(_Call(index, peeled[1], source, args.get("alpha")))
        rows = _code(it)
        row_text = f"`{_code(out)}[{i}].index_add_(...)`" + (f" ×{len(parsed)}" if several else "")
    else:
        if several:
            return f"the body makes {len(parsed)} index_add_ calls in a zip loop; several calls are rewritten in `for i in range(...)` loops only"
        (recv, args), = parsed
        bound = dict(zip(names, (a.value for a in it.args)))
        used = [recv, args["index"], args["source"]]
        if not all(isinstance(u, cst.Name) and u.value in bound for u in used) or len({u.value for u in used}) != 3:
            return "the zipped names are not used as (row, index, source) of index_add_"
        out, index, source = (bound[u.value] for u in used)
        for what, ref in (("index", index), ("source", source)):
            if _mentions(ref, out) or _mentions(out, ref):
                return f"the {what} `{_code(ref)}` is `{_code(out)}`, which the loop writes"
        plan_calls.append(_Call(index, None, source, args.get("alpha")))
        rows, row_text = "None", f"`{recv.value}.index_add_(...)` over `{_code(it)}`"
    for k, c in enumerate(plan_calls):
        for what, value in (("dim", dim), ("alpha", c.alpha)):
            if value is not None and not is_pure(value, set(names)):
                return f"{what} `{_code(value)}` is not a plain value (it would be evaluated once, not per row)"
        if c.alpha is not None and isinstance(c.alpha, cst.Integer) and c.alpha.value == "1":
            plan_calls[k] = c._replace(alpha=None)
    live = read_elsewhere(scope, node, names)
    if live:
        return f"the loop variable {', '.join(sorted(live))} may be read outside the loop"
    if declares_global(scope, names):
        return "the loop variable is declared global/nonlocal (code elsewhere may read it)"
    return _Plan(rows, out, plan_calls, dim, row_text)


# --------------------------------------------------------------------------- emission


def _emit(ctx: FileContext, node: cst.For, plan: _Plan) -> cst.FlattenSentinel:
    names = ctx.imports.unique_name
    batch = names("_sb_scatter")
    target = names("_sb_target")
    alpha = any(c.alpha is not None for c in plan.calls)
    if len(plan.calls) == 1 and plan.calls[0].cast is None:
        # one plain call: the (index, source) operands directly
        (c,) = plan.calls
        index, source = names("_sb_index"), names("_sb_source")
        operands = f"{plan.rows}, {_code(plan.out)}, {_code(c.index)}, {_code(c.source)}, {_code(plan.dim)}"
        if not alpha:
            helper = ctx.runtime_name(f"{RUNTIME}.scatter_add_rows", "_sb_scatter_add_rows")
            dim = names("_sb_dim")
            call = f"{helper}({operands})"
            fast = [f"{target}, {dim}, {index}, {source} = {batch}", f"{target}.scatter_add_({dim}, {index}, {source})"]
        else:
            helper = ctx.runtime_name(f"{RUNTIME}.index_add_rows", "_sb_index_add_rows")
            alpha_name = names("_sb_alpha")
            call = f"{helper}({operands}, {_code(c.alpha)})"
            fast = [f"{target}, {index}, {source}, {alpha_name} = {batch}", f"{target}.index_add_(0, {index}, {source}, alpha={alpha_name})"]
    else:
        # several calls and/or cast index rows: (index, cast, source[, alpha]) per call, and the
        # same number of batched calls in the loop's order
        tuples, unpack, ops = [], [], []
        dim = names("_sb_dim")
        for c in plan.calls:
            index, source = names("_sb_index"), names("_sb_source")
            cast = "None" if c.cast is None else f'"{c.cast}"'
            parts = [_code(c.index), cast, _code(c.source)]
            if alpha:
                alpha_name = names("_sb_alpha")
                parts.append("1" if c.alpha is None else _code(c.alpha))
                unpack += [index, source, alpha_name]
                ops.append(f"{target}.index_add_(0, {index}, {source}, alpha={alpha_name})")
            else:
                unpack += [index, source]
                ops.append(f"{target}.scatter_add_({dim}, {index}, {source})")
            tuples.append(f"({', '.join(parts)})")
        if alpha:
            helper = ctx.runtime_name(f"{RUNTIME}.index_add_calls", "_sb_index_add_calls")
            head = [target]
        else:
            helper = ctx.runtime_name(f"{RUNTIME}.scatter_add_calls", "_sb_scatter_add_calls")
            head = [target, dim]
        call = f"{helper}({plan.rows}, {_code(plan.out)}, {_code(plan.dim)}, {', '.join(tuples)})"
        fast = [f"{', '.join(head + unpack)} = {batch}"] + ops
    if_stmt = cst.If(
        test=parse_expression(f"{batch} is not None"),
        body=cst.IndentedBlock(body=[parse_statement(line + "\n") for line in fast]),
        orelse=cst.Else(body=cst.IndentedBlock(body=[node.with_changes(leading_lines=())])),
    )
    assign = parse_statement(f"{batch} = {call}\n").with_changes(leading_lines=node.leading_lines)
    return cst.FlattenSentinel([assign, if_stmt])


def _verdict(ctx: FileContext, plan: _Plan) -> Tuple[str, str]:
    n = len(plan.calls)
    alpha = any(c.alpha is not None for c in plan.calls)
    casts = sorted({c.cast for c in plan.calls if c.cast is not None})
    if not alpha:
        what = f"per-row {plan.row} → {'one' if n == 1 else n} `scatter_add_` over the rows"
    else:
        what = (
            f"per-row {plan.row} with alpha → {'one' if n == 1 else n} `index_add_` over the flattened rows "
            "(rows indexed along their first dim)"
        )
    if n > 1:
        what += ", in the loop's order"
    if casts:
        what += ", index rows cast as a batch (" + ", ".join(f"`.{c}()`" for c in casts) + ")"
    what += "; guarded by the scatter guard"  # what it checks: its contract (transforms/contracts.py)
    if ctx.backend == "cpu":
        order = "in index order, call by call," if n > 1 else "in index order,"
        return f"{what}; on CPU each target adds its own row's values {order} as the loop does", EXACT
    if ctx.backend == "cuda":
        return (
            f"{what}; on CUDA both ops add with atomics: the order per target is unspecified (floats may "
            "differ in the last bits)",
            REASSOCIATED,
        )
    return f"{what}; the order of additions per target on {ctx.backend} is not known to match the loop's", REASSOCIATED


# --------------------------------------------------------------------------- driver


def rewrite_index_add_loops(
    transform_id: str, ctx: FileContext, module: Optional[cst.Module], sites: Sequence[Site]
) -> Tuple[Optional[cst.Module], List[Site]]:
    """Rewrite the per-row ``index_add_`` loops of ``ctx`` into ``module`` (what the elementwise
    rewrite returned: None for ``ctx.module`` unchanged), adding their sites to ``sites``.

    Candidates are found on ``ctx.tree`` and paired with ``ctx.module``; the loops keep their
    identity in ``module`` (the elementwise rewrite rebuilds only the nodes on the way to its own
    edits, and never edits inside these loops), so they are replaced there."""
    sites = list(sites)
    others = [m for m in OTHER_ROW_METHODS if m in ctx.code]
    if METHOD not in ctx.code and not others:
        return module, sites
    astmts, parents = ast_statements(ctx.tree.body)
    taken = {(s.line, s.end_line) for s in sites}

    def skip(span: Tuple[int, int], reason: str) -> None:
        if span not in taken:
            sites.append(Site(transform_id, span[0], span[1], SKIPPED, reason))

    found = [k for k, st in enumerate(astmts) if _ast_candidate(st) and not ast_guarded(st, parents, ctx.imports)]
    for k, st in enumerate(astmts):  # (C51 projections written with m[i].scatter_add_: said, not silent)
        rows = _ast_row_methods(st, tuple(others)) if others and k not in found else set()
        if rows and not ast_guarded(st, parents, ctx.imports):
            row = next(m for m in others if m in rows)
            skip((st.lineno, st.end_lineno or st.lineno),
                 f"per-row `.{row}(...)` calls: not batched (only per-row `index_add_` loops are rewritten)")
    if not found:
        return module, sites

    spans = {k: (astmts[k].lineno, astmts[k].end_lineno or astmts[k].lineno) for k in found}
    statements = CstStatements(ctx.module)
    if not statements.matches(astmts):  # never seen: the two parsers disagree on statements
        for k in found:
            skip(spans[k], "the ast and libcst statements of this file do not pair up")
        return module, sites
    base = module if module is not None else ctx.module
    parent = statements.parent if base is ctx.module else CstStatements(base).parent
    builtin_ok = builtin_checker(ctx.tree)
    replacements: Dict[cst.CSTNode, cst.FlattenSentinel] = {}
    for k in found:
        node = statements.stmts[k]
        assert isinstance(node, cst.For)
        plan = _analyse(node, statements.scope(node), builtin_ok, ctx.imports)
        if isinstance(plan, str):
            skip(spans[k], plan)
            continue
        if node not in parent:
            skip(spans[k], "another rewrite changed this loop")
            continue
        replacements[node] = _emit(ctx, node, plan)
        reason, exactness = _verdict(ctx, plan)
        sites.append(Site(transform_id, spans[k][0], spans[k][1], REWRITTEN, reason, exactness))
    if not replacements:
        return module, sites
    return replace_nodes(base, replacements, parent), sites


def with_index_add_loops(rewrite):
    """Decorates a transform's ``rewrite(self, ctx)``: its result, then the per-row ``index_add_``
    loops rewritten (sites under ``self.id``)."""

    @functools.wraps(rewrite)
    def wrapped(self, ctx: FileContext):
        module, sites = rewrite(self, ctx)
        return rewrite_index_add_loops(self.id, ctx, module, sites)

    return wrapped
