"""Loop-invariant conditions in a backward loop's body, unswitched: ``if not use_gae: ... else: ...``
(DeepRL's A2C/PPO agents, numpy return helpers) becomes one loop per branch, each planned on its own.

The loop evaluates the condition at every step; the rewrite evaluates it once, before the first
step, and only when the loop has a step at all (``steps(T) <= 0`` short-circuits it: a loop with no
steps never evaluates it). That is the same value at every step when nothing the loop does can
change it, which is what :func:`switch_of` checks: the test is built from names, attribute chains,
constants, ``not`` / ``and`` / ``or`` and comparisons (no calls, no subscripts, no ``in``); the
loop binds none of its names; the body stores into no attribute and into no subscript of a name the
test reads, and calls nothing but the dtype casts the recurrence grammar admits (``.float()``,
``.astype(...)``: any other call could flip ``self.use_gae``, and keeps the loop holding it from
being vectorized anyway). Attribute reads are taken as plain reads, as everywhere in this
transform (``self.gamma`` in an update is read once by the vectorized steps too). A test that
raises (an unbound name) raises before the first step instead of at the first ``if``, where
statements before it may have run.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import libcst as cst

from ...analysis.cstclone import parse_expression
from ...base import FileContext
from ...names import dotted
from .syntax import _CAST_METHODS, _bound_names, _code, _head, _names_read, _one_line, Skip, _stmts, _walk
from .headers import Header
from .body import _callee, BodyParser
from .candidates import _loose_candidate
from .views import _time_views, spelled
from .analysis import analyse
from .build import HELPERS_QUALNAME

_COMPARISONS = (cst.Equal, cst.NotEqual, cst.LessThan, cst.LessThanEqual, cst.GreaterThan,
                cst.GreaterThanEqual, cst.Is, cst.IsNot)


def _plain_test(e: cst.BaseExpression) -> bool:
    """Names, attribute chains, constants, not / and / or, comparisons: nothing that calls or indexes."""
    if isinstance(e, (cst.Name, cst.Integer, cst.Float, cst.SimpleString)):
        return True
    if isinstance(e, cst.Attribute):
        return dotted(e) is not None
    if isinstance(e, cst.UnaryOperation):
        return isinstance(e.operator, (cst.Not, cst.Minus)) and _plain_test(e.expression)
    if isinstance(e, cst.BooleanOperation):
        return _plain_test(e.left) and _plain_test(e.right)
    if isinstance(e, cst.Comparison):
        return _plain_test(e.left) and all(
            isinstance(c.operator, _COMPARISONS) and _plain_test(c.comparator) for c in e.comparisons)
    return False


def switch_of(ctx: FileContext, node: cst.For, header: Header) -> Optional[Tuple[int, cst.If]]:
    """(position, statement) of the first ``if`` at the top of the body whose test is loop-invariant
    and side-effect free (see module docstring); None when there is none; Skip when the body could
    change what it reads."""
    if header.kind != "index" or header.named is not None or header.elements or node.orelse is not None:
        return None  # the trip count is known before the loop only for range headers (not enumerate's)
    body = list(_stmts(node.body))
    parser = BodyParser(header)
    # every name the loop binds: its body's, its target's (``for t, r in ...``), its elements'
    bound = _bound_names(node.body) | _names_read(node.target) | {header.index} | {n for n, _ in header.elements}
    found = None
    for i, st in enumerate(body):
        if isinstance(st, cst.If) and _plain_test(st.test) and parser.lsplit(st.test) is None \
                and not (_names_read(st.test) & bound):
            found = (i, st)
            break
    if found is None:
        return None
    test = _one_line(found[1].test)
    why = f"the loop-invariant `if {test}:` is not unswitched: "
    heads = {_head(n) for n in _walk(found[1].test) if isinstance(n, (cst.Name, cst.Attribute))} - {None}
    for n in _walk(node.body):
        if isinstance(n, cst.Call) and not (isinstance(n.func, cst.Attribute) and n.func.attr.value in _CAST_METHODS):
            raise Skip(why + f"the body calls `{_callee(n)}()`, which could change what the test reads")
        if isinstance(n, (cst.NamedExpr, cst.Global, cst.Nonlocal, cst.Del, cst.Yield, cst.Await,
                          cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            raise Skip(why + f"`{_one_line(n).split(chr(10))[0]}` in the loop body")
        targets: List[cst.BaseExpression] = []
        if isinstance(n, (cst.AssignTarget, cst.AugAssign)):
            targets = [n.target]
        for tg in targets:
            for x in _walk(tg):
                if (isinstance(x, cst.Attribute) and x is tg) or (
                        isinstance(x, cst.Subscript) and _head(x.value) in heads):
                    raise Skip(why + f"the body assigns `{_one_line(tg)}`, which could change what the test reads")
    return found


def version(node: cst.For, pos: int, branch) -> cst.For:
    """The loop with the statement at ``pos`` replaced by ``branch``'s statements (a suite, an ``elif``
    statement, or None: removed), without the comments above the loop (the switch keeps those)."""
    body = list(_stmts(node.body))
    inner = list(_stmts(branch)) if isinstance(branch, cst.BaseSuite) else ([branch] if branch is not None else [])
    stmts = body[:pos] + inner + body[pos + 1:] or [cst.SimpleStatementLine(body=[cst.Pass()])]
    block = node.body if isinstance(node.body, cst.IndentedBlock) else cst.IndentedBlock(body=[])
    return node.with_changes(body=block.with_changes(body=stmts), leading_lines=())


def plan_loop(ctx: FileContext, loop: cst.For, header: Header, reassociate: bool,
              build) -> Tuple[cst.CSTNode, bool, str]:
    """One version planned as transform.py plans a loop: (statement, exact, reason), or Skip."""
    if not _loose_candidate(loop, header):
        raise Skip("no value flows from one step to the next")
    viewed = _time_views(ctx, loop, header)
    views = viewed[1] if viewed else []
    try:
        return build(ctx, loop, analyse(ctx, viewed[0] if viewed else loop, header, views), reassociate)
    except Skip as exc:
        raise Skip(spelled(str(exc), views)) from None


#: switches unswitched one inside the other at most (``if a: ... elif b: ... else: ...`` is two)
MAX_DEPTH = 2


def unswitch(ctx: FileContext, node: cst.For, header: Header, reassociate: bool, build, depth: int = 0
             ) -> Optional[Tuple[cst.If, bool, str, Dict[str, object]]]:
    """``if steps(T) <= 0 or (test): <then-version> else: <else-version>``, each version planned on
    its own (rewritten, unswitched again, or kept as written with its reason); None when the body has
    no switch; Skip when no version is rewritten. The last item is each branch's own reason (the
    site's details: the reason names only what became of each)."""
    if depth >= MAX_DEPTH:
        return None
    found = switch_of(ctx, node, header)
    if found is None:
        return None
    pos, st = found
    other: Optional[cst.BaseSuite | cst.If] = None
    if isinstance(st.orelse, cst.Else):
        other = st.orelse.body
    elif isinstance(st.orelse, cst.If):  # elif: the else-version keeps the rest of the chain
        other = st.orelse.with_changes(leading_lines=())
    outcomes = []
    said: List[object] = []  # each branch's reason; an unswitched branch's with its own branches
    for loop in (version(node, pos, st.body), version(node, pos, other)):
        try:
            inner = unswitch(ctx, loop, header, reassociate, build, depth + 1)
            new, exact, reason = inner[:3] if inner is not None else plan_loop(ctx, loop, header, reassociate, build)
        except Skip as exc:
            outcomes.append((loop, None, f"left as written: {exc}"))
            said.append(outcomes[-1][2])
        else:
            outcomes.append((new, exact, reason))
            said.append(reason if inner is None else {"reason": reason, "branches": inner[3]})
    test = _one_line(st.test)
    if all(e is None for _, e, _ in outcomes):
        raise Skip(f"unswitched on the loop-invariant `{test}`, no loop is vectorized: when true, "
                   f"{outcomes[0][2]}; otherwise, {outcomes[1][2]}")
    helpers = ctx.runtime_name(HELPERS_QUALNAME, "_sbx")
    head = f"{helpers}.no_steps({_code(header.T).strip()}) or ({_code(st.test).strip()})"
    new_if = cst.If(
        test=parse_expression(head),
        body=cst.IndentedBlock(body=[outcomes[0][0]]),
        orelse=cst.Else(body=cst.IndentedBlock(body=[outcomes[1][0]])),
        leading_lines=node.leading_lines,
    )
    exact = all(e is not False for _, e, _ in outcomes)
    # when the condition is evaluated and why it may be: the "unswitched" contract (the site's details)
    state = ["vectorized" if e is not None else "left as written" for _, e, _ in outcomes]
    reason = (f"`{test}` unswitched ({'exact' if exact else 'reassociated'}): one loop per branch, when true {state[0]}, otherwise "
              f"{state[1]}; each branch's reason in the details")
    return new_if, exact, reason, {"when true": said[0], "otherwise": said[1]}


__all__ = ["plan_loop", "switch_of", "unswitch", "version"]
