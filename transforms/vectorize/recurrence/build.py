"""The rewritten statement: ``if <guard>:`` the first step as written, the middle steps
vectorized, the last step as written (or folded into the vectorized steps where what it leaves
behind is dead: :mod:`.fold`), ``else:`` the original loop verbatim; with its exactness and the
reason reported for the site.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import libcst as cst

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
          cpu: Optional[bool] = None) -> Tuple[cst.If, bool, str]:
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
    op = ctx.runtime_name(OP_QUALNAME, "linear_recurrence")

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
    # one parse for all the generated code: `if <guard>: pass`, then the chunks, `pass` between
    text = f"if {sub(guard)}:\n    pass\n" + "pass\n".join(
        "\n".join(sub(x) for x in chunk) + "\n" for chunk in chunks)
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
    check = p.carry
    if check is not None:
        check = sub(check)
        # the carried values after the first step decide the arithmetic of the others: when
        # they are not what the vectorized steps compute with, the other steps run as written
        i = h.index if h.kind == "index" else fresh(ctx.imports, "i")
        loop_text = f"for {i} in range({T} - 2, -1, -1):\n" + ("" if h.kind == "index" and not h.elements else f"    {bind(i)}\n") + "    pass\n"
        parsed_rest = parse_statements(f"if {check}:\n    pass\nelse:\n" + "".join(
            "    " + ln + "\n" for ln in loop_text.splitlines()))[0]
        inner = parsed_rest.orelse.body.body[0]
        kept = [st for st in inner.body.body if not (isinstance(st, cst.SimpleStatementLine)
                                                     and isinstance(st.body[0], cst.Pass))]
        inner = inner.with_changes(body=inner.body.with_changes(body=kept + [clone(s) for s in body]))
        rest = [parsed_rest.with_changes(
            body=cst.IndentedBlock(body=rest),
            orelse=cst.Else(body=cst.IndentedBlock(body=[inner])))]
    stmts: List[cst.BaseStatement] = first + [clone(s) for s in body] + rest
    test = head_if.test
    loop = node.with_changes(leading_lines=())
    new = cst.If(
        test=test,
        body=cst.IndentedBlock(body=stmts),
        orelse=cst.Else(body=cst.IndentedBlock(body=[loop])),
        leading_lines=node.leading_lines,
    )
    fused = one_pass.site(ctx, node, a, p)
    if fused is not None:  # every step in one call where its kernel takes the values (see one_pass)
        new = _one_pass_first(ctx, a, p, fused, sub, bind, new, body)
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


def _one_pass_first(ctx: FileContext, a: Analysis, p: Plan, fused, sub, bind, new: cst.If,
                    body: List[cst.BaseStatement]) -> cst.If:
    """``new`` with the one-pass tier in front: ``if <head> and ((last := fused_linear(...)) is not
    None or recurrence_ok(...)): if last is not None: <bind> else: <vectorized steps>``. One test
    line holds both deciding helpers, so the run's telemetry counts the site's passes together.
    Where the program stops at t = 1 (``stop=1``), the last step follows as written."""
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
        lines += ["        # step t = 0, as written", f"        {bind('0')}", "        pass"]
    lines += ["    else:", "        pass"]
    top = parse_statements("\n".join(lines) + "\n")[0]
    inner = top.body.body[0]
    if not folded:  # the trailing `pass` is the body of step 0
        kept = list(inner.body.body[:-1])
        inner = inner.with_changes(body=inner.body.with_changes(body=kept + [clone(s) for s in body]))
    inner = inner.with_changes(orelse=inner.orelse.with_changes(body=new.body))
    return top.with_changes(body=top.body.with_changes(body=[inner]), orelse=new.orelse,
                            leading_lines=new.leading_lines)
