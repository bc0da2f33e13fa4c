"""Outputs the function creates as Python lists (``adv = [0.0] * T``; ``adv[t] = gae``).

The run-time guard stores only into tensors and numpy arrays (``out[lo:hi] = rows``), so a loop
whose output is a Python list would always take the loop: reported rewritten, never run
vectorized. Storing the items into the list instead was measured slower than the loop where such
code runs on lists of Python floats (dongparoo's GAE: 0.7x at T = 300, 0.84x at T = 5000: three
list-to-array conversions and ``tolist`` cost more than 0.2 us of float arithmetic per step), so
such a loop is left as written, with that reason. Only a local name whose every binding in the
function is a list display, a list comprehension, ``[...] * n`` or a sum of lists decides it;
parameters, other bindings and attribute outputs leave the guard to decide at run time.
"""
from __future__ import annotations

from typing import Iterable, Optional

import libcst as cst

from ...analysis.scope_walk import _param_names
from .syntax import _code
from . import fold, function_facts


def _creation(func: cst.FunctionDef, loop: cst.For, name: str) -> Optional[str]:
    """The statement creating ``name`` as a list, when every binding of it in ``func`` outside
    ``loop`` makes a new list; None otherwise (a parameter, another binding, a nested scope)."""
    if name in _param_names(func.params):
        return None
    facts = function_facts.facts(func)
    if all(made is None for _, made in facts.bindings.get(name, ())):
        return None  # no binding of it makes a list (a tensor output): the loop need not be walked
    outside = facts.outside(loop)
    if any(name in text and not outside.contains(n) for n, text in facts.scopes):
        return None  # a nested scope or a declaration naming it: not decided here
    if outside.unknown_bindings(name):
        return None
    made = outside.first_binding(name)
    return _code(made).strip() if made is not None else None


def list_output_reason(module: cst.Module, loop: cst.For, outs: Iterable[cst.BaseExpression]) -> Optional[str]:
    """Why the loop is left alone, when an output it writes by index is a Python list the
    enclosing function creates; None when no output is known to be one."""
    where = fold._enclosing(module, loop)
    if where is None:
        return None
    func = where[0]
    for o in outs:
        if not isinstance(o, cst.Name):
            continue
        made = _creation(func, loop, o.value)
        if made is not None:
            return (f"output is a Python list written by index: `{o.value}` (`{made}`); the vectorized "
                    "branch stores only into tensors and numpy arrays, and storing its values into the "
                    "list item by item was measured slower than the loop on lists of Python floats "
                    "(0.7x at T = 300), so the loop is left as written")
    return None
