"""Which backward passes add to the same gradients before they are zeroed (fp16's GradScaler).

``GradScaler`` is right only if every gradient it unscales was scaled by it: ``unscale_(opt)``
divides all of the optimizer's gradients by the loss scale, and a gradient another, unscaled
backward left there (``actor_loss.backward(); critic_loss.backward(); opt.step()``, or the same
backward in a loop that never calls ``zero_grad``) shrinks by 65536. The other direction matters
too: a scaled backward leaves scaled gradients on parameters its optimizer does not hold, and an
unscaled backward's step that reads them before a ``zero_grad`` sees them 65536 times too large.
So ``precision.autocast`` scales a backward only where no other backward can reach the same
gradients, or be reached by them, without a ``zero_grad`` between: :func:`shared_gradients`.

It follows the control flow of one scope (a function's body or the module) through its blocks:
backward from the backward statement to the nearest ``X.zero_grad(...)`` statement every path
passes, and forward from it in the same way, going round each loop that encloses it (the previous
and the next round) and out to the statements around each enclosing block. A ``zero_grad`` under
an ``if`` (or any compound statement) may not run, so only a plain ``X.zero_grad(...)`` line
stops the search; a ``continue`` or ``break`` before it may jump past it, so it stops nothing
then. Any ``.backward(...)`` call met first (also inside a compound statement, a helper such as
``accelerator.backward(loss)``, ``torch.autograd.backward``) is the answer. What runs outside the
scope is not known: in a function with no plain ``zero_grad`` line before or after the backward
(:func:`zeroes_gradients`) gradients accumulate over calls unless a caller clears them, and those
left from an earlier call would be divided by the scale at ``unscale_``, so it is left fp32; a
function that zeroes before or after its backward is taken to start from cleared gradients.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import libcst as cst

from ..analysis.cstwalk import push_children
from ..analysis.reads import _skeleton_path

#: statements a block is made of, and where a loop's body is
_BLOCKS = (cst.IndentedBlock, cst.Module)
_LOOPS = (cst.For, cst.While)
_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


def _backward_call(node: cst.CSTNode) -> Optional[cst.Call]:
    """The first call of a ``backward`` under ``node`` (``x.backward()``, ``autograd.backward(...)``,
    a bare ``backward(...)``), not counting the bodies of functions and classes defined there."""
    stack: List[cst.CSTNode] = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Call):
            func = n.func
            if (isinstance(func, cst.Attribute) and func.attr.value == "backward") or (
                    isinstance(func, cst.Name) and func.value == "backward"):
                return n
        if isinstance(n, _SCOPES) and n is not node:
            continue
        push_children(n, stack)
    return None


def _jumps(stmt: cst.CSTNode) -> bool:
    """Whether ``stmt`` holds a ``continue`` or ``break`` of a loop around it (one inside a loop
    that is itself under ``stmt``, the body of ``stmt`` when it is a loop included, stays there)."""
    stack: List[cst.CSTNode] = [stmt]
    while stack:
        n = stack.pop()
        if isinstance(n, (cst.Continue, cst.Break)):
            return True
        if isinstance(n, _SCOPES):
            continue
        if isinstance(n, _LOOPS):
            if n.orelse is not None:  # a break in a loop's else belongs to the loop around it
                stack.append(n.orelse)
            continue
        push_children(n, stack)
    return False


def _zero_grad(stmt: cst.CSTNode) -> bool:
    """A plain ``X.zero_grad(...)`` statement line (it runs whenever the line does) with no
    backward on the line (which could come after it)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or _backward_call(stmt) is not None:
        return False
    for small in stmt.body:
        if (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)
                and isinstance(small.value.func, cst.Attribute) and small.value.func.attr.value == "zero_grad"):
            return True
    return False


Level = Tuple[Sequence[cst.BaseStatement], int, bool]


def _levels(root: cst.CSTNode, stmt: cst.CSTNode) -> Optional[List[Level]]:
    """From the block holding ``stmt`` out to ``root``: (statements of the block, index of the one
    that is or holds ``stmt``, whether the block is a loop's body), innermost first."""
    path = _skeleton_path(root, stmt)
    if path is None:
        return None
    path = [*path, stmt]
    levels: List[Level] = []
    for at, node in enumerate(path[:-1]):
        if isinstance(node, _BLOCKS):
            body = list(node.body)
            index = next((i for i, s in enumerate(body) if s is path[at + 1]), None)
            if index is None:
                return None
            parent = path[at - 1] if at else None
            levels.append((body, index, isinstance(parent, _LOOPS) and parent.body is node))
    return levels[::-1]


def _previous_rounds(body: Sequence[cst.BaseStatement], index: int) -> Optional[cst.Call]:
    """A backward of the loop body ``body`` whose gradients can reach the top of the next round
    un-zeroed: at ``index`` or after it, with no plain ``zero_grad`` after it that every path to
    the end of the body (``continue`` included) passes."""
    pending = _backward_call(body[index])
    if pending is not None and _jumps(body[index]):
        return pending
    for stmt in body[index + 1:]:
        if _zero_grad(stmt):
            pending = None
            continue
        pending = pending or _backward_call(stmt)
        if pending is not None and _jumps(stmt):
            return pending
    return pending


def _reaching(levels: Sequence[Level]) -> Optional[cst.Call]:
    """A backward whose gradients the statement at the innermost level may meet un-zeroed."""
    for body, index, loop in levels:
        for stmt in reversed(body[:index]):  # every path into body[index] from the block's start
            if _zero_grad(stmt):
                return None
            found = _backward_call(stmt)
            if found is not None:
                return found
        if loop:  # the previous round
            found = _previous_rounds(body, index)
            if found is not None:
                return found
    return None  # the first entry into the scope: what ran before is the caller's


def _reached(levels: Sequence[Level]) -> Optional[cst.Call]:
    """A backward that may add to the gradients the statement at the innermost level leaves,
    before a ``zero_grad`` clears them."""
    for body, index, loop in levels:
        jumped = _jumps(body[index]) if not isinstance(body[index], cst.SimpleStatementLine) else False
        for stmt in body[index + 1:]:
            if _zero_grad(stmt) and not jumped:
                return None
            found = _backward_call(stmt)
            if found is not None:
                return found
            jumped = jumped or _jumps(stmt)
        if loop:  # the next round, up to the statement itself again
            for stmt in body[:index]:
                if _zero_grad(stmt):
                    break
                found = _backward_call(stmt)
                if found is not None:
                    return found
            else:
                return _backward_call(body[index])
    return None  # out of the scope: the caller's


def shared_gradients(root: cst.CSTNode, stmt: cst.CSTNode) -> Optional[cst.Call]:
    """A backward call (``stmt``'s own, for the previous or the next round of a loop) that adds to
    the gradients ``stmt``'s backward adds to with no ``zero_grad`` between, under ``root`` (a
    function's body or the module); None where there is none."""
    levels = _levels(root, stmt)
    if levels is None:
        return None
    return _reaching(levels) or _reached(levels)


def zeroes_gradients(root: cst.CSTNode, stmt: cst.CSTNode) -> bool:
    """Whether the function ``root`` (its body) zeroes the gradients ``stmt``'s backward adds to: a
    plain ``zero_grad`` line before ``stmt`` or after it, in ``stmt``'s block or a block around it.
    A function with none leaves its gradients to be cleared (or accumulated) by code not seen here."""
    levels = _levels(root, stmt)
    return levels is not None and any(_zero_grad(s) for body, index, _ in levels for i, s in enumerate(body) if i != index)
