"""Which loops walk backward over a sequence, and why one that is no candidate is left alone.

The README promises a site for every backward loop, rewritten or skipped with its reason. The
recurrence pre-filter (:func:`.headers._walks_backward`) and the header parser only see the forms
they can vectorize; this module recognises backward walks more widely (``enumerate``/``zip`` of
them, ``np.flip``, ``arange`` with a negative step, ``while t >= 0: ... t -= 1``) so that those
the planner never sees are reported with what stopped them. Cheap: it looks at loop headers only
(and at ``while`` statements only when the source has the word), never at expressions elsewhere.
"""
from __future__ import annotations

import ast
from typing import Iterator, List, Optional, Sequence

import libcst as cst

from ...analysis.purity import pure_call
from .syntax import _code, _walk

#: calls whose result is their argument walked backward
_FLIPS = frozenset({"reversed", "flip", "flipud", "fliplr"})
#: calls that walk their (first) argument in its own order
_WRAPS = frozenset({"enumerate", "list", "tuple", "iter"})

RECOGNISED = ("reversed(range(T)), reversed(range(0, T)), range(T - k, -1, -1), range(T)[::-1], "
              "sorted(range(T), reverse=True), x[::-1], reversed(x), "
              "zip of reversed or [::-1] sequences, reversed(list(zip(...))), a name bound to such a range")


def _negative(node: Optional[ast.AST]) -> bool:
    """A negative number literal (``-1``, ``-2``)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return isinstance(node.operand, ast.Constant) and type(node.operand.value) in (int, float) \
            and node.operand.value > 0
    return isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value < 0


def walks_backward(it: ast.AST) -> bool:
    """Whether iterating ``it`` walks a sequence from its end: ``reversed(...)``, a range (or
    ``np.arange``/``torch.arange``) with a negative literal step, ``x[a:b:-k]``, a flip, and
    ``zip``/``enumerate``/``list``/``tuple`` of one of those."""
    if isinstance(it, ast.Subscript):
        return isinstance(it.slice, ast.Slice) and _negative(it.slice.step)
    if not isinstance(it, ast.Call):
        return False
    f = it.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    if name in _FLIPS:
        return bool(it.args)  # reversed(x), np.flip(x), x.flip(0): not a user's deck.flip()
    if name in ("range", "arange"):
        step = it.args[2] if len(it.args) == 3 else next((k.value for k in it.keywords if k.arg == "step"), None)
        return _negative(step)
    if name == "zip":
        return any(walks_backward(a) for a in it.args)
    if name in _WRAPS and it.args:
        return walks_backward(it.args[0])
    if name == "sorted" and it.args and isinstance(it.args[0], ast.Call) and isinstance(it.args[0].func, ast.Name) \
            and it.args[0].func.id == "range":  # sorted(range(T), reverse=True): the range walked back
        return any(k.arg == "reverse" and isinstance(k.value, ast.Constant) and k.value.value is True
                   for k in it.keywords)
    return False


def named_walks_backward(node: ast.AST, before) -> bool:
    """``for t in steps`` where the nearest earlier assignment to ``steps`` in the same block
    walks backward (``steps = list(range(T - 1, 0, -1))``)."""
    it = node.iter  # type: ignore[attr-defined]
    if not isinstance(it, ast.Name) or before is None:
        return False
    stmts, i = before
    for st in reversed(stmts[:i]):
        if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == it.id for t in st.targets):
            return len(st.targets) == 1 and walks_backward(st.value)
    return False


# --------------------------------------------------------------------------- while loops


_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def _statements(stmts: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    for st in stmts:
        yield st
        for field in _BLOCKS:
            block = getattr(st, field, None)
            if not block:
                continue
            if field in ("handlers", "cases"):
                for h in block:
                    yield from _statements(h.body)
            else:
                yield from _statements(block)


def _counter(test: ast.expr) -> Optional[str]:
    """``t`` for ``while t >= 0`` / ``t > k`` / ``0 <= t`` / ``while t``."""
    if isinstance(test, ast.Name):
        return test.id
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if isinstance(left, ast.Name) and isinstance(op, (ast.GtE, ast.Gt)):
        return left.id
    if isinstance(right, ast.Name) and isinstance(op, (ast.LtE, ast.Lt)):
        return right.id
    return None


def _counts_down(body: Sequence[ast.stmt], name: str) -> bool:
    """The body's own statements decrement ``name`` by a positive literal."""
    for st in body:
        if isinstance(st, ast.AugAssign) and isinstance(st.op, ast.Sub) and isinstance(st.target, ast.Name) \
                and st.target.id == name and isinstance(st.value, ast.Constant) and type(st.value.value) is int \
                and st.value.value > 0:
            return True
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) \
                and st.targets[0].id == name and isinstance(st.value, ast.BinOp) and isinstance(st.value.op, ast.Sub) \
                and isinstance(st.value.left, ast.Name) and st.value.left.id == name \
                and isinstance(st.value.right, ast.Constant) and type(st.value.right.value) is int \
                and st.value.right.value > 0:
            return True
    return False


def backward_whiles(tree: ast.Module, code: str) -> List[ast.While]:
    """``while`` loops that count a name down (``while t >= 0: ... t -= 1``), in source order."""
    if "while" not in code:
        return []
    out = []
    for st in _statements(tree.body):
        if isinstance(st, ast.While):
            name = _counter(st.test)
            if name is not None and _counts_down(st.body, name):
                out.append(st)
    return out


def while_reason(node: ast.While) -> str:
    name = _counter(node.test)
    return (f"backward while loop (`while {ast.unparse(node.test)}:` counting `{name}` down): not recognised "
            "as a recurrence (only `for` loops over a backward range or a reversed sequence are vectorized)")


# --------------------------------------------------------------------------- reasons


def header_reason(node: cst.For) -> str:
    """A backward loop whose header the recurrence parser does not know."""
    return (f"backward loop over `{' '.join(_code(node.iter).split())}`: header not recognised (vectorized: "
            f"{RECOGNISED})")


def no_carry_reason(node: cst.For, imports) -> str:
    """A backward loop the planner is not given: no name is read before the body assigns it and no
    container is read at another index than it is written. Where the body could still carry state
    another way (an attribute or an augmented subscript it writes, a call that may update
    something), the reason names it rather than claiming nothing is carried."""
    other: Optional[str] = None
    for n in _walk(node.body):
        if isinstance(n, cst.AssignTarget) and isinstance(n.target, cst.Attribute):
            other = f"writes `{_code(n.target).strip()}`"
        elif isinstance(n, cst.AugAssign) and not isinstance(n.target, cst.Name):
            other = f"updates `{_code(n.target).strip()}` in place"
        elif isinstance(n, cst.Call) and not pure_call(n, imports):
            other = f"calls `{' '.join(_code(n.func).split())}()`"
        if other:
            break
    if other is None:
        return "backward loop with no value carried between steps: nothing to vectorize as a recurrence"
    return ("backward loop with no carried value the recurrence vectorizer recognises (a name read before "
            f"the body assigns it, or out[t] read back at another index); it {other}, whose effect from one "
            "step to the next is not analysed")
