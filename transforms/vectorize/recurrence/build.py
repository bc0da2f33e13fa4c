"""The rewritten statement: ``if <guard>:`` the first step as written, the middle steps
vectorized, the last step as written (or folded into the vectorized steps where what it leaves
behind is dead: :mod:`.fold`), ``else:`` the original loop verbatim; with its exactness and the
reason reported for the site.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple, cast

import libcst as cst

from scalebox_cst import emitted
from scalebox_cst.emitted import Emitted, Row

from ...base import FileContext
from ...analysis.cstclone import clone, parse_statements
from .syntax import Skip, _bound_names, _code, _code_line, _names_read, _stmts, fresh
from .list_outputs import list_output_reason
from .body import _flatten
from .analysis import Analysis
from .lists import _exprs
from .plan import Plan, plan as make_plan
from .views import describe
from . import fold, one_pass


#: the runtime op and helpers module the emitted code calls
OP_QUALNAME = "scalebox_cst.runtime.recurrence.linear_recurrence"
HELPERS_QUALNAME = "scalebox_cst.runtime.vectorized"


def build(ctx: FileContext, node: cst.For, a: Analysis, reassociate: bool = True,
          cpu: Optional[bool] = None) -> Tuple[cst.BaseStatement, bool, str]:
    """The emission stage: the rewritten loop (``node`` as written; ``a`` its analysis) as
    ``if <guard>:`` first step, vectorized middle steps, last step ``else:`` the original loop;
    with its exactness and the reported reason. It asks the plan stage for the guard and the
    lines (``cpu``: the guard keeps tensors on CPU; by default where ``ctx``'s backend is)."""
    outs = [o for it in a.middle for o in it.outs] + list(a.memo.values())
    listed = list_output_reason(ctx.module, node, outs)
    if listed is not None:
        raise Skip(listed)
    fold_last = _foldable(ctx, node, a)
    # names are reserved before the imports are requested, so a Skip leaves no import behind
    p = make_plan(ctx, a, fold_last=fold_last, reassociate=reassociate,
                  cpu=ctx.backend == "cpu" if cpu is None else cpu, helpers="__SBX__", op="__SBX_OP__")
    mid, exact, notes = list(p.lines), p.exact, list(p.notes)
    folded = p.folded
    helpers = ctx.runtime_name(HELPERS_QUALNAME, "_sbx")
    op = ctx.runtime_name(OP_QUALNAME, "_linear_recurrence")

    def sub(text: str) -> str:
        return text.replace("__SBX_OP__", op).replace("__SBX__", helpers)

    h = a.header
    T = p.T
    body = list(_stmts(node.body))

    def bind(index_expr: str) -> str:
        if h.kind == "index":  # (for t, r in reversed(list(enumerate(x))): r = x[t] too, see headers)
            own = [] if index_expr == h.index else [f"{h.index} = {index_expr}"]
            return "; ".join(own + [f"{n} = {_code(c).strip()}[{h.index}]" for n, c in h.elements])
        names = ", ".join(n for n, _ in h.elements)
        vals = ", ".join(f"{_code(c).strip()}[{index_expr}]" for _, c in h.elements)
        if h.counter is not None:  # enumerate's counter: 0 at the step t = T - 1 (see headers)
            count = {f"{T} - 1": "0", "0": f"{T} - 1"}.get(index_expr, f"{T} - 1 - {index_expr}")
            return f"{names} = {vals}; {h.counter} = {count}"
        return f"{names} = {vals}"

    last_lines = []
    if a.flow.shift or a.readbacks:  # values carried into step 0 from step 1 (a middle
        last_lines.append(f"if {T} > 2:")  # step when T > 2), read back from what it stored
        last_lines.append("    " + bind("1"))
        for var, it in a.flow.shift.items():
            last_lines.append(f"    {var} = {_code(it.value).strip()}")
        for it in a.readbacks:
            last_lines.append(f"    {_code_line(it.node)}")
    first = [f"# step t = {T} - 1, as written", bind(f"{T} - 1")]
    if folded:
        middle = [f"# steps t = {T} - 2 .. 0, vectorized"] + mid
        end = ["# the loop variable as the loop leaves it (its other temporaries are dead after it)", bind("0")]
    else:
        middle = [f"# steps t = {T} - 2 .. 1, vectorized"] + mid
        end = ["# step t = 0, as written"] + last_lines + [bind("0")]
    check = p.carry
    i: Optional[str] = None
    if check is not None:
        # the carried values after the first step decide the arithmetic of the others: when
        # they are not what the vectorized steps compute with, the other steps run as written
        i = h.index if h.kind == "index" else fresh(ctx.imports, "i")
    fused = one_pass.site(ctx, node, a, p)
    # every step in one call where its kernel takes the values (see one_pass)
    one = None if fused is None else _one_pass_head(ctx, a, p, fused, bind)
    # the ways that end with steps to run as written: the one-pass tier's (it stops at t = 1), the
    # vectorized steps' (step 0, unless folded in), the carry check's (every step after the first)
    ways = (one is not None and not one[1]) + (not folded) + (check is not None)
    tail: Optional[_Tail] = None
    if ways >= 2:  # one loop after them runs those steps for each (see _layout)
        i = i if i is not None else (h.index if h.kind == "index" else fresh(ctx.imports, "i"))
        left = fresh(ctx.imports, "left")
        tail = (left, f"for {i} in range({left} - 1, -1, -1):")
    elif check is not None:
        tail = ("", f"for {i} in range({T} - 2, -1, -1):")  # (i is set above when check is)
    first_line = None if h.kind == "index" and not h.elements else (bind(i) if i is not None else None)
    layout = _layout(sub(p.guard), [sub(x) for x in first], [sub(x) for x in middle], [sub(x) for x in end],
                     [sub(x) for x in last_lines], folded, None if check is None else sub(check), one and (
                         [sub(x) for x in one[0]], one[1]), tail, first_line, sub(bind("0")), T)
    loop = node.with_changes(leading_lines=())
    written = _rows(layout, body, loop)
    if written is not None:  # as text (scalebox_cst.emitted): what the tree below writes
        new: cst.BaseStatement = Emitted(rows=written, leading_lines=node.leading_lines)
        ctx.wrote_text = True
    else:
        new = _tree(layout, body, loop).with_changes(leading_lines=node.leading_lines)
    kinds = ", ".join(n for n in notes)
    shape = "last step special-cased, " if a.has_split else ""
    if a.flow.resets:
        shape += "episode resets as op stretches, "
    if exact and p.cpu:
        # gradients: see runtime.vectorized.recurrence_ok (the guard cannot see uses outside the
        # loop, so the claim for them is conditional; values are exact whatever requires grad):
        # spelled out in the linear_recurrence contract (transforms/contracts.py)
        exactness = "bitwise exact on CPU"
    elif exact:
        exact = False
        exactness = f"reassociated on {ctx.backend} (a parallel scan)"
    else:
        exactness = "reassociated: equal up to rounding"
    kinds, along = describe(kinds, a.views)  # x_t[i] is x[:, i] in the user's text
    shape += along
    # what recurrence_ok, carry_ok and fused_linear accept: their contracts (the site's details)
    carried = " and carry_ok" if p.carry else ""
    steps = "linear_recurrence after the first step (the last step folded in)" if folded else \
        "linear_recurrence between the first and last step"
    if fused is not None:
        steps = "fused_linear, else " + steps
    reason = f"backward linear recurrence {kinds} ({shape}{exactness}): {steps}; guarded by recurrence_ok{carried}"
    return new, exact, reason


def _foldable(ctx: FileContext, node: cst.For, a: Analysis) -> bool:
    """Whether the last step may be left to the vectorized steps (see :mod:`.fold`): nothing
    carried into it from the step before by name (shifted values, read-backs, forwarded reads, a
    list's last element), and the body's temporaries dead after the loop (the loop variable, its
    elements and the carried values are bound as the loop leaves them)."""
    if a.flow.shift or a.readbacks or a.forwarded or a.lists.carried:
        return False
    if any(r.switch for r in a.flow.resets.values()):  # if done: s = 0 else: ...: a last step that ends
        return False  # an episode leaves the constant itself (an int), not what the op computes
    h = a.header
    kept = {h.index} | {n for n, _ in h.elements} | set(a.flow.rec_vars)
    names = _bound_names(node.body) - kept
    first_step = [(set().union(*(_names_read(e) for e in _exprs(it))), it.var)
                  for it in _flatten(a.items, False)]
    return fold.dead_after(ctx.module, node, names, first_step)


#: the one-pass tier's head lines (down to where its steps end) and whether it does every step
_OnePass = Tuple[List[str], bool]
#: (the name of the count of steps left, or "" for the check's own loop; the loop header)
_Tail = Tuple[str, str]
#: the rewritten statement: (depth, a line of generated code, or BODY / LOOP where the loop body as
#: written / the original loop goes)
_Layout = List[Tuple[int, Any]]
BODY, LOOP = "<body>", "<loop>"  # markers: no generated line is one (each is code or a comment)


def _layout(guard: str, first: List[str], middle: List[str], end: List[str], last_lines: List[str], folded: bool,
            check: Optional[str], one: Optional[_OnePass], tail: Optional[_Tail], first_line: Optional[str], step0: str,
            T: str) -> _Layout:
    """The lines of the rewritten statement.

    ``if <guard>:`` the first step as written, the middle steps vectorized, the last step as written
    (or the loop variable bound, where the vectorized steps did it: ``folded``), ``else:`` the
    original loop. In front, the one-pass tier (``one``), which may stop at t = 1; after the first
    step, a run-time check on the carried values (``check``) may send the other steps back to a loop
    as written. Where two or more of these ways end with steps still to run as written, each says
    how many are left (``left = 1``, ``left = T - 1``, ``left = 0``) and one loop after them runs
    those (``tail``, named by its count): the loop body is written three times (first step, those
    steps, the original loop), not up to five (a rewritten file of backward loops was six times its
    lines; two body copies fewer is a fifth of it, issue 19 item 13). Otherwise each way runs its
    own (``tail`` without a count: the check's loop over t = T - 2 .. 0)."""
    out: _Layout = []

    def put(depth: int, lines: List[str]) -> None:
        out.extend((depth + (len(x) - len(x.lstrip(" "))) // 4, x.lstrip(" ")) for x in lines)

    def loop_of(head: str, depth: int) -> None:
        put(depth, [head] + ([] if first_line is None else ["    " + first_line]))
        out.append((depth + 1, BODY))

    left = tail[0] if tail is not None else ""
    if left:
        rest = middle + (end if folded else last_lines) + [f"{left} = {0 if folded else 1}"]
    else:
        rest = middle + end

    def steps(depth: int) -> None:  # the first step, then the others
        put(depth, first)
        out.append((depth, BODY))
        if check is None:
            put(depth, rest)
        else:
            put(depth, ([f"{left} = {T} - 1"] if left else []) + [f"if {check}:"])
            put(depth + 1, rest)
        if not left and not folded:
            out.append((depth + 1 if check is not None else depth, BODY))
        if not left and check is not None:
            put(depth, ["else:"])
            assert tail is not None
            loop_of(tail[1], depth + 1)

    if one is None:
        put(0, [f"if {guard}:"])
        steps(1)
    else:
        lines, one_folded = one
        if left:
            put(0, lines + [f"        {left} = {0 if one_folded else 1}"])
        else:
            put(0, lines + ([] if one_folded else ["        # step t = 0, as written", "        " + step0]))
            if not one_folded:
                out.append((2, BODY))
        put(1, ["else:"])
        steps(2)
    if left:
        assert tail is not None
        put(1, [f"# steps t = {left} - 1 .. 0, as written"])
        loop_of(tail[1], 1)
    put(0, ["else:"])
    out.append((1, LOOP))
    return out


def _rows(layout: _Layout, body: List[cst.BaseStatement], loop: cst.For) -> Optional[List[Row]]:
    """The rewritten statement as rows of text and the user's statements (scalebox_cst.emitted),
    written as :func:`_tree` writes it; None where a line of it is not sure to be written alike (the
    tree is built then)."""
    out: List[Row] = []
    stretch: List[str] = []

    def flush() -> bool:
        found = emitted.rows(stretch, 0) if stretch else []
        stretch.clear()
        if found is None:
            return False
        out.extend(found)
        return True

    for depth, line in layout:
        if line is BODY or line is LOOP:
            if not flush():
                return None
            if line is BODY:
                out.extend((depth, s) for s in body)
            else:
                out.append((depth, loop))
        else:
            stretch.append("    " * depth + line)
    return out if flush() else None


class _Placed(cst.CSTTransformer):
    """Each marker statement of a parsed layout replaced by what it stands for."""

    def __init__(self, body: List[cst.BaseStatement], loop: cst.For) -> None:
        self.body, self.loop = body, loop

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        stmts: List[cst.BaseStatement] = []
        for st in updated.body:
            mark = _marker(st)
            if mark == BODY:
                copies = [clone(s) for s in self.body]
                if st.leading_lines and copies:  # a comment the parse hung on the marker
                    copies[0] = copies[0].with_changes(leading_lines=[*st.leading_lines, *copies[0].leading_lines])
                stmts.extend(copies)
            elif mark == LOOP:
                stmts.append(self.loop)
            else:
                stmts.append(st)
        return updated.with_changes(body=stmts)


#: the name a marker of a layout is written as in the text :func:`_tree` parses
_MARK_NAMES = {BODY: "__SBX_BODY__", LOOP: "__SBX_LOOP__"}
_MARKS = {name: mark for mark, name in _MARK_NAMES.items()}


def _marker(st: cst.BaseStatement) -> Optional[str]:
    if isinstance(st, cst.SimpleStatementLine) and len(st.body) == 1 and isinstance(st.body[0], cst.Expr):
        value = st.body[0].value
        if isinstance(value, cst.Name):
            return _MARKS.get(value.value)
    return None


def _tree(layout: _Layout, body: List[cst.BaseStatement], loop: cst.For) -> cst.BaseStatement:
    """The rewritten statement as a libcst tree: the layout's lines parsed (one parse for all, a
    marker name standing for each body and the loop), then the body copied for each place."""
    text = "".join("    " * depth + str(_MARK_NAMES.get(line, line)) + "\n" for depth, line in layout)
    (parsed,) = parse_statements(text)
    return cast(cst.BaseStatement, parsed.visit(_Placed(body, loop)))


def _one_pass_head(ctx: FileContext, a: Analysis, p: Plan, fused, bind) -> _OnePass:
    """The one-pass tier's lines: ``if <head> and ((last := fused_linear(...)) is not None or
    recurrence_ok(...)): if last is not None: <bind>``, down to the loop variable bound where the
    program does every step (``folded``; else it stops at t = 1, ``stop=1``, and step 0 follows as
    written). One test line holds both deciding helpers, so the run's telemetry counts the site's
    passes together."""
    program, args, live, folded = fused
    T, S = p.T, a.flow.rec_vars[0]
    last = fresh(ctx.imports, f"{S}_fused")
    call = f"__SBX__.fused_linear({program!r}, {T}, {', '.join(args)}{'' if folded else ', stop=1'})"
    test = f"{p.guard_head} and (({last} := {call}) is not None or {p.guard_ok})"
    lo = "0" if folded else "1"
    lines = [f"if {test}:", f"    if {last} is not None:",
             f"        # steps t = {T} - 1 .. {lo} in one pass: the loop body as a program for runtime.fused's C kernel"]
    lines += [f"        {S} = {last}"] if live else []
    if folded:
        lines += [f"        {bind('0')}"]
    return lines, folded
