"""Walking libcst trees fast: child nodes read straight from the dataclass fields.

``node.visit`` rebuilds every node it passes and costs ~50x more on the small expressions loop
analysis asks about; these read the fields instead (same nodes, any order)."""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Iterator, List, Sequence, Tuple, Type, TypeVar, cast

import libcst as cst

from .. import rewrite_caches

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


def push_children(n: cst.CSTNode, out: List[cst.CSTNode]) -> None:
    """``out.extend(children(n))``, by a function per node type reading its fields in
    straight-line code (no generator: walks are ~1.6x faster)."""
    push = _PUSHERS.get(type(n))
    if push is None:
        push = _pusher(type(n))
    push(n, out)


_PUSHERS: Dict[type, Callable[[cst.CSTNode, List[cst.CSTNode]], None]] = {}


def _pusher(cls: type) -> Callable[[cst.CSTNode, List[cst.CSTNode]], None]:
    lines = ["def push(n, out):", "    pass"]
    for name in tuple(f.name for f in dataclasses.fields(cls)):
        lines += [
            f"    v = n.{name}",
            "    k = kinds.get(type(v))",
            "    if k is None:",
            "        k = kind(v)",
            "    if k == NODE:",
            "        out.append(v)",
            "    elif k == SEQUENCE:",
            "        for x in v:",
            "            kx = kinds.get(type(x))",
            "            if (kx if kx is not None else kind(x)) == NODE:",
            "                out.append(x)",
        ]
    scope = {"kinds": _KINDS, "kind": kind, "NODE": NODE, "SEQUENCE": SEQUENCE}
    exec("\n".join(lines), scope)  # noqa: S102 - field names of a dataclass: identifiers
    push = _PUSHERS[cls] = cast(Callable[[cst.CSTNode, List[cst.CSTNode]], None], scope["push"])
    return push


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
    """``node`` and every node below it (depth first, no order promised).

    The nodes under a block or a loop are listed once and kept (the last few, held so their
    ids stay theirs; nodes are immutable): the checks of one rewritten loop walk its body ~5
    times, and a file of thousands of loops spent a tenth of its time walking them again."""
    hit = _WALKED.get(id(node))
    if hit is not None and hit[0] is node:
        return iter(hit[1])
    if type(node) not in _KEPT:
        return _walk(node)
    nodes = list(_walk(node))
    if len(_WALKED) >= _MAX_WALKED:
        del _WALKED[next(iter(_WALKED))]  # the oldest
    _WALKED[id(node)] = (node, nodes)
    return iter(nodes)


def walk_code(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The nodes of :func:`walk` (in its order) but the layout ones, which hold nothing else
    (whitespace, comments, brackets, commas, dots, colons: ~45% of a statement's nodes), and
    without walking below them: for the walks that look for code (names, calls, bindings)."""
    stack = [node]
    layout = _LAYOUT_TYPES
    while stack:
        n = stack.pop()
        t = type(n)
        skip = layout.get(t)
        if skip is None:
            skip = layout[t] = issubclass(t, _LAYOUT)
        if skip:
            continue
        yield n
        push_children(n, stack)


#: the layout node types :func:`walk_code` leaves out: no node below one is of another kind
_LAYOUT = (cst.SimpleWhitespace, cst.ParenthesizedWhitespace, cst.TrailingWhitespace, cst.EmptyLine,
           cst.Newline, cst.Comment, cst.LeftParen, cst.RightParen, cst.LeftSquareBracket,
           cst.RightSquareBracket, cst.LeftCurlyBrace, cst.RightCurlyBrace, cst.Comma, cst.Dot, cst.Colon,
           cst.AssignEqual, cst.Semicolon)
_LAYOUT_TYPES: Dict[type, bool] = {}


def typed(node: cst.CSTNode) -> Dict[type, List[cst.CSTNode]]:
    """The nodes of :func:`walk_code` by exact type, each list in walk order (callers only read
    them).

    Kept per node for the last few nodes asked about (held, so their ids stay theirs): the
    stages of one loop each look for a kind or two of node in the same body or expression
    (subscripts, calls, assignments, conditional expressions), a walk of ~200 nodes and an
    ``isinstance`` through ``ABCMeta`` per node each time. Exact types suit libcst's concrete
    node classes, which have no subclasses."""
    hit = _TYPED.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    index: Dict[type, List[cst.CSTNode]] = {}
    for n in walk_code(node):  # (layout nodes are never asked for)
        found = index.get(type(n))
        if found is None:
            index[type(n)] = [n]
        else:
            found.append(n)
    if len(_TYPED) >= _MAX_TYPED:
        del _TYPED[next(iter(_TYPED))]  # the oldest
    _TYPED[id(node)] = (node, index)
    return index


_MAX_TYPED = 64
_TYPED: Dict[int, Tuple[cst.CSTNode, Dict[type, List[cst.CSTNode]]]] = rewrite_caches.mapping()
_NONE: Tuple[cst.CSTNode, ...] = ()


_N = TypeVar("_N", bound=cst.CSTNode)


def of_type(node: cst.CSTNode, cls: Type[_N]) -> Sequence[_N]:
    """The nodes of exact type ``cls`` under ``node`` (``node`` too), in :func:`walk` order."""
    return cast(Sequence[_N], typed(node).get(cls, _NONE))


def instances(node: cst.CSTNode, classes: Tuple[type, ...]) -> Iterator[cst.CSTNode]:
    """The nodes of :func:`walk` (same order) that are instances of ``classes``; the answer is
    kept per node type (``isinstance`` against libcst's ABC-derived classes goes through
    ``ABCMeta`` on every miss: most of a walk asking about a few kinds of node)."""
    known = _INSTANCES.get(classes)
    if known is None:
        known = _INSTANCES[classes] = {}
    for n in walk(node):
        hit = known.get(type(n))
        if hit is None:
            hit = known[type(n)] = isinstance(n, classes)
        if hit:
            yield n


_INSTANCES: Dict[Tuple[type, ...], Dict[type, bool]] = {}


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        push_children(n, stack)


#: the node types whose walks :func:`walk` keeps, and how many it keeps
_KEPT = frozenset({cst.IndentedBlock, cst.For, cst.While})
_MAX_WALKED = 16
_WALKED: Dict[int, Tuple[cst.CSTNode, List[cst.CSTNode]]] = rewrite_caches.mapping()
