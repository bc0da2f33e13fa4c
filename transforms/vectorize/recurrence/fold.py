"""Folding the peeled last step (t = 0) into the vectorized steps.

The rewritten statement runs the first step and the last step as written and the steps in between
vectorized. The last step is an ordinary step of the recurrence (the body's special case is
always the first step, ``t == T - 1``), so the vectorized steps compute it exactly when they cover
it: what running it as written adds is the values it leaves in the body's temporaries
(``delta``, ``nextvalues``, ...) for code after the loop. Where no code after the loop can read
them -- the loop is in a function, nothing else in that function names them, nor asks for its
locals -- the vectorized steps take t = 0 too and only the loop variable is bound as the loop
leaves it. About half of the peeled work of a GAE loop goes with it (each step is a dozen small
tensor ops, 20-60 us).

The first step stays as written: it takes the body's last-step branch (other per-step values:
``next_value``, ``1 - next_done``) and decides the carried value's kind, dtype and shape
(``lastgaelam = 0`` becomes a float32 tensor of the row shape), which :func:`carry_ok` then
checks against what the vectorized steps compute with. Folding it would need those boundary rows
concatenated to the per-step arrays with checks of their own at least as dear as the step.
"""
from __future__ import annotations

import re
from typing import Iterable, List, Optional, Sequence, Set, Tuple

import libcst as cst

from .syntax import _walk

#: calls that read a function's local variables by name (or hand its frame to a debugger)
_INTROSPECTION = {"locals", "vars", "eval", "exec", "dir", "globals", "breakpoint"}
#: attributes that reach a frame's locals (sys._getframe().f_locals, inspect.currentframe())
_FRAME_ATTRS = {"f_locals", "_getframe", "currentframe", "set_trace"}


def _enclosing(module: cst.Module, node: cst.CSTNode):
    """(innermost function containing ``node``, whether a loop in it encloses ``node``), or None
    when ``node`` is not (by identity) in a function body of ``module``."""
    found = []

    class Find(cst.CSTVisitor):
        def __init__(self) -> None:
            self.stack: List[cst.CSTNode] = []

        def on_visit(self, n: cst.CSTNode) -> bool:
            if found:
                return False
            if n is node:
                funcs = [i for i, s in enumerate(self.stack) if isinstance(s, (cst.FunctionDef, cst.Lambda))]
                if funcs and isinstance(self.stack[funcs[-1]], cst.FunctionDef) and not any(
                        isinstance(s, cst.ClassDef) for s in self.stack[funcs[-1]:]):
                    inner = self.stack[funcs[-1] + 1:]
                    found.append((self.stack[funcs[-1]], any(isinstance(s, (cst.For, cst.While)) for s in inner)))
                else:
                    found.append(None)
                return False
            self.stack.append(n)
            return True

        def on_leave(self, n: cst.CSTNode) -> None:
            if self.stack and self.stack[-1] is n:
                self.stack.pop()

    module.visit(Find())
    return found[0] if found else None


def dead_after(module: cst.Module, node: cst.For, names: Set[str],
               first_step: Sequence[Tuple[Set[str], Optional[str]]]) -> bool:
    """Whether the values the loop ``node`` leaves in ``names`` can never be read: ``node`` is in a
    function that names none of them outside the loop (nested scopes included, ``del`` and
    ``global`` too) and calls nothing that reads locals by name or reaches its frame. Inside another loop, the first
    step (``first_step``: per statement, the names it reads and the one it assigns, in order)
    must not read one before assigning it: the next run of the loop would see what this one left."""
    if not names:
        return True
    where = _enclosing(module, node)
    if where is None:
        return False
    func, nested = where
    inside = {id(n) for n in _walk(node)}
    for n in _walk(func):
        if id(n) in inside:
            continue
        if isinstance(n, cst.Name) and n.value in names:
            return False
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value in _INTROSPECTION:
            return False
        if isinstance(n, cst.Attribute) and n.attr.value in _FRAME_ATTRS:
            return False
    if nested:
        assigned: Set[str] = set()
        for reads, var in first_step:
            if (reads & names) - assigned:
                return False
            if var is not None:
                assigned.add(var)
    return True


def widen(mid: List[str], arrays: Iterable[str]) -> Optional[List[str]]:
    """The vectorized lines over t = T-2 .. 0 instead of T-2 .. 1: every slice of a per-step array
    (``x_v[1 + k:stop]``, read at offset ``k``) starts one row earlier; None when some read has
    a negative offset (its slice would start at -1)."""
    names = sorted(set(arrays), key=len, reverse=True)
    if not names:
        return None
    pat = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, names)) + r")\[(\d+):")
    if any(int(m.group(2)) < 1 for line in mid for m in pat.finditer(line)):
        return None
    return [pat.sub(lambda m: f"{m.group(1)}[{int(m.group(2)) - 1}:", line) for line in mid]
