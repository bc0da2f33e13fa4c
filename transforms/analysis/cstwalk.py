"""Walking libcst trees fast: child nodes read straight from the dataclass fields.

``node.visit`` rebuilds every node it passes and costs ~50x more on the small expressions loop
analysis asks about; these read the fields instead (same nodes, any order)."""
from __future__ import annotations

import dataclasses
from typing import Dict, Iterator, Tuple

import libcst as cst

_FIELDS: Dict[type, Tuple[str, ...]] = {}


def children(n: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The child nodes of ``n`` (every CSTNode held in a field, lists and tuples included)."""
    names = _FIELDS.get(type(n))
    if names is None:
        names = _FIELDS[type(n)] = tuple(f.name for f in dataclasses.fields(n))
    kinds = _KINDS
    for name in names:
        v = getattr(n, name)
        k = kinds.get(type(v))
        if k is None:
            k = kind(v)
        if k == NODE:
            yield v
        elif k == SEQUENCE:
            for x in v:
                kx = kinds.get(type(x))
                if (kx if kx is not None else kind(x)) == NODE:
                    yield x


#: what :func:`kind` says of a value of each type (``isinstance`` against libcst's abstract
#: ``CSTNode`` goes through ``ABCMeta.__instancecheck__``: 3x a dict look-up, on every field)
NODE, SEQUENCE, OTHER = 1, 2, 0
_KINDS: Dict[type, int] = {}


def kind(v: object) -> int:
    """NODE for a CSTNode, SEQUENCE for a list or tuple, else OTHER (cached per type)."""
    k = _KINDS.get(type(v))
    if k is None:
        k = _KINDS[type(v)] = NODE if isinstance(v, cst.CSTNode) else SEQUENCE if isinstance(v, (list, tuple)) else OTHER
    return k


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """``node`` and every node below it (depth first, no order promised)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(children(n))
