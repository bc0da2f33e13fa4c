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

In the vectorized steps the first step stays as written: it takes the body's last-step branch
(other per-step values: ``next_value``, ``1 - next_done``) and decides the carried value's kind,
dtype and shape (``lastgaelam = 0`` becomes a float32 tensor of the row shape), which
:func:`carry_ok` then checks against what the vectorized steps compute with. Folding it there
would need those boundary rows concatenated to the per-step arrays with checks of their own at
least as dear as the step. The one-pass tier in front of them (:mod:`.one_pass`) does fold it:
its kernel reads the boundary rows in place and its wrapper checks the start value.
"""
from __future__ import annotations

import dataclasses

import re
from typing import Iterable, List, Optional, Sequence, Set, Tuple

import libcst as cst

from ... import rewrite_caches
from . import function_facts

#: the last module :func:`_enclosing` mapped and its map (one file is rewritten at a time; the
#: module is held so that the ids stay its nodes')
_LOOPS_OF: List[object] = rewrite_caches.held(None, {})


def _loop_places(module: cst.Module) -> dict:
    """id(loop) -> (innermost function containing it, whether a loop in that function encloses
    it), or None where that innermost scope is a class body; one walk per module, of its
    statements only (a walk per rewritten loop made files with many sites quadratic)."""
    places: dict = {}
    stack = [(module, None, False, False)]  # node, innermost function, usable, a loop between
    while stack:
        n, func, usable, nested = stack.pop()
        if isinstance(n, (cst.For, cst.While)):
            places[id(n)] = (func, nested) if func is not None and usable else None
        if isinstance(n, cst.FunctionDef):
            inner = (n, True, False)
        elif isinstance(n, cst.ClassDef):
            inner = (func, False, nested)
        elif isinstance(n, (cst.For, cst.While)):
            inner = (func, usable, True)
        else:
            inner = (func, usable, nested)
        stack.extend((c,) + inner for c in _statement_children(n) if isinstance(c, _HOLDS_STATEMENTS))
    return places


#: the fields where a statement (or a block of them) can be; the others hold expressions only
_BLOCK_FIELDS = frozenset(("body", "orelse", "handlers", "finalbody", "cases"))
_FIELDS_OF: dict = {}


def _statement_children(n: cst.CSTNode):
    """The children of ``n`` that ``children`` yields from its block fields, in the same order:
    reading decorators, parameters and tests too was most of the module walk's cost."""
    names = _FIELDS_OF.get(type(n))
    if names is None:
        names = _FIELDS_OF[type(n)] = tuple(f.name for f in dataclasses.fields(n) if f.name in _BLOCK_FIELDS)
    for name in names:
        v = getattr(n, name)
        if isinstance(v, cst.CSTNode):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from v


#: the nodes a ``for``/``while`` statement can be under: only these are walked (expressions and
#: simple statements hold no statement; walking them was most of a module walk's cost)
_HOLDS_STATEMENTS = (cst.BaseCompoundStatement, cst.IndentedBlock, cst.Else, cst.ExceptHandler,
                     cst.ExceptStarHandler, cst.Finally, cst.MatchCase)


def _enclosing(module: cst.Module, node: cst.CSTNode):
    """(innermost function containing ``node``, whether a loop in it encloses ``node``), or None
    when ``node`` is not (by identity) in a function body of ``module``."""
    if _LOOPS_OF[0] is not module:
        _LOOPS_OF[:] = [module, _loop_places(module)]
    return _LOOPS_OF[1].get(id(node))




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
    outside = function_facts.facts(func).outside(node)  # one walk per function, not per loop
    if outside.frame_readers() or any(outside.names(name) for name in names):
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
    names = set(arrays)  # fresh identifiers, one per site: a pattern of their own was compiled per site
    if not names:
        return None
    if any(int(m.group(2)) < 1 for line in mid for m in _SLICE_START.finditer(line) if m.group(1) in names):
        return None
    return [_SLICE_START.sub(lambda m: f"{m.group(1)}[{int(m.group(2)) - 1}:" if m.group(1) in names else m.group(0), line)
            for line in mid]


#: ``word[k:`` where ``word`` is a whole identifier (not after a word character or ``.``)
_SLICE_START = re.compile(r"(?<![\w.])(\w+)\[(\d+):")
