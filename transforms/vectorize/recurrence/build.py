"""The rewritten statement: ``if <guard>:`` the first step as written, the middle steps
vectorized, the last step as written (or folded into the vectorized steps where what it leaves
behind is dead: :mod:`.fold`), ``else:`` the original loop verbatim; with its exactness and the
reason reported for the site.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

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
    guard, mid, exact, notes = p.guard, list(p.lines), p.exact, list(p.notes)
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
    if folded:
        chunks = [
            [f"# step t = {T} - 1, as written", bind(f"{T} - 1")],
            [f"# steps t = {T} - 2 .. 0, vectorized"] + mid,
            ["# the loop variable as the loop leaves it (its other temporaries are dead after it)", bind("0")],
        ]
    else:
        chunks = [
            [f"# step t = {T} - 1, as written", bind(f"{T} - 1")],
            [f"# steps t = {T} - 2 .. 1, vectorized"] + mid,
            ["# step t = 0, as written"] + last_lines + [bind("0")],
        ]
    chunks = [[sub(x) for x in chunk] for chunk in chunks]
    check = p.carry
    carry: Optional[_Carry] = None
    if check is not None:
        # the carried values after the first step decide the arithmetic of the others: when
        # they are not what the vectorized steps compute with, the other steps run as written
        i = h.index if h.kind == "index" else fresh(ctx.imports, "i")
        carry = (sub(check), f"for {i} in range({T} - 2, -1, -1):",
                 None if h.kind == "index" and not h.elements else bind(i))
    fused = one_pass.site(ctx, node, a, p)
    # every step in one call where its kernel takes the values (see one_pass)
    one = None if fused is None else _one_pass_lines(ctx, a, p, fused, sub, bind)
    guard = sub(guard)
    loop = node.with_changes(leading_lines=())
    written = _rows(guard, chunks, body, folded, carry, one, loop)
    if written is not None:  # as text (scalebox_cst.emitted): what the tree below writes
        new: cst.BaseStatement = Emitted(rows=written, leading_lines=node.leading_lines)
        ctx.wrote_text = True
    else:
        new = _tree(guard, chunks, body, folded, carry, loop, node.leading_lines)
        if one is not None:
            new = _one_pass_first(one, new, body)
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


#: (test, loop header, the loop's first line or None) of the steps after the first when a
#: run-time check on the carried values picks them (``if carry_ok(...): ... else: for ...``)
_Carry = Tuple[str, str, Optional[str]]
#: the one-pass tier's lines down to step 0 as written, and whether the last step is folded in
_OnePass = Tuple[List[str], bool]


def _rows(guard: str, chunks: List[List[str]], body: List[cst.BaseStatement], folded: bool,
          carry: Optional[_Carry], one: Optional[_OnePass], loop: cst.For) -> Optional[List[Row]]:
    """The rewritten statement as rows of text and the user's statements (scalebox_cst.emitted),
    written as :func:`_tree` and :func:`_one_pass_first` write it; None where a line of it is not
    sure to be written alike (the tree is built then)."""
    if guard != guard.strip():  # the tree writes the test between `if ` and `:` as it is
        return None
    parts = [emitted.rows(chunk, 1) for chunk in chunks]
    head = emitted.rows([f"if {guard}:"], 0)
    if head is None or parts[0] is None or parts[1] is None or parts[2] is None:
        return None
    def copy(depth: int) -> List[Row]:  # the body as written, at a depth
        return [(depth, s) for s in body]

    rest = parts[1] + parts[2] + ([] if folded else copy(1))
    if carry is not None:
        test, loop_head, first = carry
        check = emitted.rows([f"if {test}:"], 1)
        steps = emitted.rows([loop_head] + ([] if first is None else ["    " + first]), 2)
        if test != test.strip() or check is None or steps is None:
            return None
        rest = check + emitted.shifted(rest, 1) + [(1, "else:")] + steps + copy(3)
    then = parts[0] + copy(1) + rest
    if one is None:
        return head + then + [(0, "else:"), (1, loop)]
    lines, one_folded = one
    top = emitted.rows(lines, 0)
    if top is None:
        return None
    return top + ([] if one_folded else copy(2)) + [(1, "else:")] + emitted.shifted(then, 1) + [(0, "else:"), (1, loop)]


def _tree(guard: str, chunks: List[List[str]], body: List[cst.BaseStatement], folded: bool,
          carry: Optional[_Carry], loop: cst.For, leading: Sequence[cst.EmptyLine]) -> cst.If:
    """The rewritten statement as a libcst tree: the generated lines parsed (one parse for all,
    ``pass`` between the stretches), the body copied for each place it is written."""
    text = f"if {guard}:\n    pass\n" + "pass\n".join("\n".join(chunk) + "\n" for chunk in chunks)
    parsed = parse_statements(text)
    head_if = parsed[0]
    parts: List[List[cst.BaseStatement]] = [[]]
    for st in parsed[1:]:
        if isinstance(st, cst.SimpleStatementLine) and len(st.body) == 1 and isinstance(st.body[0], cst.Pass):
            parts.append([])
            continue
        parts[-1].append(st)
    first, middle, last = parts
    rest: List[cst.BaseStatement] = middle + last + ([] if folded else [clone(s) for s in body])
    if carry is not None:
        test, loop_head, first_line = carry
        loop_text = loop_head + "\n" + ("" if first_line is None else f"    {first_line}\n") + "    pass\n"
        parsed_rest = parse_statements(f"if {test}:\n    pass\nelse:\n" + "".join(
            "    " + ln + "\n" for ln in loop_text.splitlines()))[0]
        inner = parsed_rest.orelse.body.body[0]
        kept = [st for st in inner.body.body if not (isinstance(st, cst.SimpleStatementLine)
                                                     and isinstance(st.body[0], cst.Pass))]
        inner = inner.with_changes(body=inner.body.with_changes(body=kept + [clone(s) for s in body]))
        rest = [parsed_rest.with_changes(
            body=cst.IndentedBlock(body=rest),
            orelse=cst.Else(body=cst.IndentedBlock(body=[inner])))]
    stmts: List[cst.BaseStatement] = first + [clone(s) for s in body] + rest
    return cst.If(
        test=head_if.test,
        body=cst.IndentedBlock(body=stmts),
        orelse=cst.Else(body=cst.IndentedBlock(body=[loop])),
        leading_lines=leading,
    )


def _one_pass_lines(ctx: FileContext, a: Analysis, p: Plan, fused, sub, bind) -> _OnePass:
    """The one-pass tier's lines: ``if <head> and ((last := fused_linear(...)) is not None or
    recurrence_ok(...)): if last is not None: <bind>``, then step 0 as written where the program
    stops at t = 1 (``stop=1``: its body follows). One test line holds both deciding helpers, so
    the run's telemetry counts the site's passes together."""
    program, args, live, folded = fused
    T, S = p.T, a.flow.rec_vars[0]
    last = fresh(ctx.imports, f"{S}_fused")
    call = f"__SBX__.fused_linear({program!r}, {T}, {', '.join(args)}{'' if folded else ', stop=1'})"
    test = f"{p.guard_head} and (({last} := {call}) is not None or {p.guard_ok})"
    lo = "0" if folded else "1"
    lines = [f"if {sub(test)}:", f"    if {last} is not None:",
             f"        # steps t = {T} - 1 .. {lo} in one pass: the loop body as a program for runtime.fused's C kernel"]
    lines += [f"        {S} = {last}"] if live else []
    if folded:
        lines += [f"        {bind('0')}"]
    else:
        lines += ["        # step t = 0, as written", f"        {bind('0')}"]
    return lines, folded


def _one_pass_first(one: _OnePass, new: cst.If, body: List[cst.BaseStatement]) -> cst.If:
    """``new`` (a tree) with the one-pass tier in front: ``<one's lines> else: <new's body>``."""
    lines, folded = one
    lines = lines + ([] if folded else ["        pass"]) + ["    else:", "        pass"]
    top = parse_statements("\n".join(lines) + "\n")[0]
    inner = top.body.body[0]
    if not folded:  # the trailing `pass` is the body of step 0
        kept = list(inner.body.body[:-1])
        inner = inner.with_changes(body=inner.body.with_changes(body=kept + [clone(s) for s in body]))
    inner = inner.with_changes(orelse=inner.orelse.with_changes(body=new.body))
    return top.with_changes(body=top.body.with_changes(body=[inner]), orelse=new.orelse,
                            leading_lines=new.leading_lines)
