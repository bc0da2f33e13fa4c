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

from typing import Iterable, Iterator, List, Optional, Tuple

import libcst as cst

from .syntax import _code, _walk
from . import fold, function_facts


def _makes_list(e: cst.BaseExpression) -> bool:
    """``e`` always evaluates to a new Python list (or raises)."""
    if isinstance(e, (cst.List, cst.ListComp)):
        return True
    if isinstance(e, cst.BinaryOperation):
        # [0] * n; n * [0] only for an int literal or len(...) on the left (an array there
        # would take the list as an operand)
        if isinstance(e.operator, cst.Multiply):
            return _makes_list(e.left) or (_makes_list(e.right) and _int_like(e.left))
        if isinstance(e.operator, cst.Add):  # both lists (ndarray.__radd__ takes `[x] + arr`)
            return _makes_list(e.left) and _makes_list(e.right)
    return False


def _int_like(e: cst.BaseExpression) -> bool:
    return isinstance(e, cst.Integer) or (isinstance(e, cst.Call) and isinstance(e.func, cst.Name)
                                          and e.func.value == "len")


def _bindings(target: cst.BaseExpression, value: Optional[cst.BaseExpression]) -> Iterator[Tuple[str, Optional[cst.BaseExpression]]]:
    """(name, value) for each name ``target = value`` binds (value None: something unknown)."""
    if isinstance(target, cst.Name):
        yield target.value, value
        return
    if isinstance(target, (cst.Tuple, cst.List)):
        vals = list(value.elements) if isinstance(value, (cst.Tuple, cst.List)) else None
        elems = list(target.elements)
        if vals is not None and len(vals) == len(elems) and not any(
                isinstance(x, cst.StarredElement) for x in elems + vals):
            for t, v in zip(elems, vals):
                yield from _bindings(t.value, v.value)
        else:
            for t in elems:
                yield from _bindings(t.value, None)


def _names(node: Optional[cst.CSTNode]) -> List[str]:
    return [] if node is None else [x.value for x in _walk(node) if isinstance(x, cst.Name)]


def _bound_names(n: cst.CSTNode) -> List[str]:
    """The names ``n`` binds other than by an assignment statement (loop or comprehension
    target, ``with ... as``, walrus, ``del``, import, ``except ... as``, match capture)."""
    if isinstance(n, (cst.For, cst.CompFor)):
        return _names(n.target)
    if isinstance(n, cst.WithItem):
        return [] if n.asname is None else _names(n.asname.name)
    if isinstance(n, (cst.NamedExpr, cst.Del)):
        return _names(n.target)
    if isinstance(n, cst.ImportAlias):
        return _names(n.asname.name if n.asname is not None else n.name)
    if isinstance(n, cst.ExceptHandler):
        return [] if n.name is None else _names(n.name.name)
    if isinstance(n, (cst.MatchAs, cst.MatchStar)):
        return [] if n.name is None else [n.name.value]
    return []


def binding_events(n: cst.CSTNode) -> Iterator[Tuple[str, Optional[cst.CSTNode]]]:
    """(name, the statement when it binds a new list to it, else None) for each binding ``n``
    makes; an augmented assignment makes none (``x += [...]`` keeps a list a list)."""
    if isinstance(n, cst.Assign):
        for t in n.targets:
            for name, v in _bindings(t.target, n.value):
                yield name, (n if v is not None and _makes_list(v) else None)
    elif isinstance(n, cst.AnnAssign):
        if isinstance(n.target, cst.Name):
            yield n.target.value, (n if n.value is not None and _makes_list(n.value) else None)
    elif not isinstance(n, cst.AugAssign):
        for name in _bound_names(n):
            yield name, None


def _creation(func: cst.FunctionDef, loop: cst.For, name: str) -> Optional[str]:
    """The statement creating ``name`` as a list, when every binding of it in ``func`` outside
    ``loop`` makes a new list; None otherwise (a parameter, another binding, a nested scope)."""
    params = func.params
    every = list(params.params) + list(params.posonly_params) + list(params.kwonly_params)
    every += [p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]
    if any(p.name.value == name for p in every):
        return None
    facts = function_facts.facts(func)
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
