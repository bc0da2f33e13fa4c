"""Which names a statement binds, and whether it binds them to a new Python list.

Shared by the per-function facts (:mod:`.function_facts`, gathered once per function) and the
list-output analysis (:mod:`.list_outputs`); it is pure syntax and imports neither.
"""

from __future__ import annotations

from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import libcst as cst

from .syntax import _walk


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


#: the nodes that can bind a name (the rest make no binding event)
_BINDERS = (cst.Assign, cst.AnnAssign, cst.For, cst.CompFor, cst.WithItem, cst.NamedExpr, cst.Del,
            cst.ImportAlias, cst.ExceptHandler, cst.MatchAs, cst.MatchStar)
#: node type -> whether it is one of _BINDERS (asked of every node of a function: ``isinstance``
#: against libcst's ABC-derived classes is ~10 checks through ``ABCMeta`` per node otherwise)
_BINDS: Dict[type, bool] = {}


def binding_events(n: cst.CSTNode) -> Iterable[Tuple[str, Optional[cst.CSTNode]]]:
    """(name, the statement when it binds a new list to it, else None) for each binding ``n``
    makes; an augmented assignment makes none (``x += [...]`` keeps a list a list)."""
    binds = _BINDS.get(type(n))
    if binds is None:
        binds = _BINDS[type(n)] = isinstance(n, _BINDERS)
    return _events(n) if binds else ()


def _events(n: cst.CSTNode) -> Iterator[Tuple[str, Optional[cst.CSTNode]]]:
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
