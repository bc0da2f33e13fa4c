"""Names read and bound: the locals of a scope, whether a name a loop binds is read after it (or
elsewhere in its scope), the loops enclosing a statement, the names an expression reads.
"""
from __future__ import annotations

from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple

import libcst as cst

from .. import rewrite_caches
from .bodies import _BLOCK_FIELDS, _code
from .cstwalk import push_children, typed
from .read_index import index_of
from .scope_walk import _DYNAMIC, ScopeWalk, _all_names, _locals_of, _param_names, _store_names  # noqa: F401 - shared names


class _Reads(ScopeWalk):
    """Every read of ``names`` under a scope that is not covered by a rebinding.

    A read is covered when it sits in the body of another ``for`` loop (or comprehension) whose
    target binds the name, or in a nested function that binds the name locally: such a read can
    never see what the skipped loop left behind. So is a read that no execution path reaches from
    the end of ``exclude`` (the loop itself, whose own reads are ignored): one earlier in source
    order and outside every loop that encloses ``exclude`` (nested functions count wherever they
    are: they may run later). ``locals()``/``vars()``/``globals()`` without arguments and
    ``eval``/``exec`` count as reading every name.
    """

    def __init__(self, names: Set[str], exclude: cst.CSTNode, also: Sequence[cst.CSTNode] = ()) -> None:
        super().__init__()
        self.names = names
        self.exclude = exclude
        self.also = {id(n) for n in also}
        self.found: Set[str] = set()
        self.ancestors: Set[int] = set()  # loops (for/while) that enclose ``exclude``
        self._after = False  # past the end of ``exclude`` in source order
        self._loop_depth = 0  # inside loops that enclose ``exclude``

    def _counts(self, name: str) -> bool:
        if not (self._after or self._loop_depth or self._nested):
            return False  # runs before the loop, and never again after it
        return not self._is_covered(name)

    def _read(self, name: str) -> None:
        if name in self.names and self._counts(name):
            self.found.add(name)

    def _reads_all(self) -> None:
        self.found |= {n for n in self.names if self._counts(n)}

    def _loop_entered(self, node: cst.CSTNode) -> None:
        self._loop_depth += id(node) in self.ancestors

    def _loop_left(self, node: cst.CSTNode) -> None:
        self._loop_depth -= id(node) in self.ancestors

    def _stop_at(self, node: cst.For) -> bool:
        if node is self.exclude:
            self._after = True
            return True
        return False

    def on_visit(self, node: cst.CSTNode) -> bool:
        if id(node) in self.also:
            return False
        return super().on_visit(node)


def read_elsewhere(
    scope: cst.CSTNode, loop: cst.CSTNode, names: Iterable[str], also: Sequence[cst.CSTNode] = ()
) -> Set[str]:
    """Which of ``names`` (bound by ``loop``) may be read somewhere in ``scope`` outside the loop.

    Conservative: a read anywhere in the scope counts (before the loop too, since the scope may
    itself run in a loop), unless a rebinding ``for``/comprehension/nested function covers it.
    Reads under the nodes in ``also`` are ignored too (e.g. the one statement that consumes a
    list the loop built).
    """
    wanted = set(names)
    body = scope.body if isinstance(scope, (cst.FunctionDef, cst.ClassDef)) else scope
    if id(body) in _ASKED:  # a second loop of this scope: walk it once for all (read_index)
        found = index_of(body).read_elsewhere(loop, wanted, also)
        if found is not None:
            return found
    else:  # most scopes hold one loop: the field walk and one visit cost less than an index
        _ASKED[id(body)] = body
    if not _may_read(body, wanted | set(_DYNAMIC), {id(loop), *(id(n) for n in also)}):
        return set()  # no name the visit could count is there (a field walk: ~20x cheaper)
    visitor = _Reads(wanted, loop, also)
    visitor.ancestors = _enclosing_loops(body, loop)
    body.visit(visitor)
    return visitor.found


#: id(scope body) -> the body, for the scopes asked about once: the next question builds the index
_ASKED: Dict[int, cst.CSTNode] = rewrite_caches.mapping()


def _may_read(body: cst.CSTNode, words: Set[str], skip: Set[int]) -> bool:
    """Whether some name under ``body``, outside the nodes whose ids are in ``skip``, is one of
    ``words``: :class:`_Reads` counts a read only at such a name (a read of one of its names, a
    ``del`` of one, a call of ``locals``/``eval``...) and never enters those nodes."""
    stack = [body]
    kinds = _READ_KINDS
    while stack:
        n = stack.pop()
        if id(n) in skip:
            continue
        k = kinds.get(type(n))
        if k is None:
            k = _read_kind(type(n))
        if k == 1 and n.value in words:  # type: ignore[attr-defined]
            return True
        if k != 3:
            push_children(n, stack)
    return False


def _skeleton(node: cst.CSTNode) -> Sequence[cst.CSTNode]:
    """The children of ``node`` that can hold statements (statements are their own skeleton:
    loops, ``global`` and ``nonlocal`` sit only there, never inside an expression)."""
    if isinstance(node, (cst.Module, cst.BaseSuite, cst.SimpleStatementLine)):
        return node.body
    if isinstance(node, cst.BaseSmallStatement):
        return ()
    out: List[cst.CSTNode] = []
    for field in _BLOCK_FIELDS:
        block = getattr(node, field, None)
        if isinstance(block, (list, tuple)):
            out.extend(block)
        elif isinstance(block, cst.CSTNode):
            out.append(block)
    return out


def _skeleton_path(root: cst.CSTNode, target: cst.CSTNode) -> Optional[List[cst.CSTNode]]:
    """The skeleton nodes from ``root`` down to ``target`` (excluded), or None if it is not there."""
    parent: Dict[int, Optional[cst.CSTNode]] = {id(root): None}
    todo = [root]
    while todo:
        node = todo.pop()
        if node is target:
            path: List[cst.CSTNode] = []
            up = parent[id(node)]
            while up is not None:
                path.append(up)
                up = parent[id(up)]
            return path[::-1]
        for child in _skeleton(node):
            parent[id(child)] = node
            todo.append(child)
    return None


def _enclosing_loops(root: cst.CSTNode, target: cst.CSTNode) -> Set[int]:
    """ids of the for/while statements under ``root`` that contain ``target``."""
    path = _skeleton_path(root, target)  # a walk of statements only: ~50x cheaper than a visit
    if path is not None:
        return {id(n) for n in path if isinstance(n, (cst.For, cst.While))}
    return _enclosing_loops_visit(root, target)  # ``target`` is not a statement


def _enclosing_loops_visit(root: cst.CSTNode, target: cst.CSTNode) -> Set[int]:
    """:func:`_enclosing_loops` by a full visit (any kind of ``target``)."""
    finder = _EnclosingLoops(target)
    root.visit(finder)
    return finder.found


class _EnclosingLoops(cst.CSTVisitor):
    """:func:`_enclosing_loops_visit`'s visit (module-level: a class made per call is a cycle that
    stays alive, with what it holds, until a garbage collection)."""

    def __init__(self, target: cst.CSTNode) -> None:
        super().__init__()
        self.target = target
        self.stack: List[int] = []
        self.found: Set[int] = set()

    def on_visit(self, node: cst.CSTNode) -> bool:
        if node is self.target:
            self.found.update(self.stack)
            return False
        if isinstance(node, (cst.For, cst.While)):
            self.stack.append(id(node))
        return True

    def on_leave(self, node: cst.CSTNode) -> None:
        if isinstance(node, (cst.For, cst.While)) and self.stack and self.stack[-1] == id(node):
            self.stack.pop()


def names_read(node: cst.CSTNode) -> Set[str]:
    """Every plain name under ``node`` other than attribute names and keyword-argument names
    (read from the node fields: a libcst visit costs ~50x more on small expressions).

    The answer is kept for the last nodes asked about (held, so their ids stay theirs; a copy
    is returned, callers add to it): the stages of one loop ask about the same expressions and
    statements ~1.5 times each."""
    hit = _READ.get(id(node))
    if hit is not None and hit[0] is node:
        return set(hit[1])
    found: Set[str] = set()
    stack = [node]
    kinds = _READ_KINDS
    while stack:
        n = stack.pop()
        k = kinds.get(type(n))
        if k is None:
            k = _read_kind(type(n))
        if k == 1:
            found.add(n.value)  # type: ignore[attr-defined]
        elif k == 2:
            stack.append(n.value)  # type: ignore[attr-defined]
        elif k == 0:
            push_children(n, stack)
    if len(_READ) >= _MAX_READ:
        _READ.clear()
    _READ[id(node)] = (node, frozenset(found))
    return found


_MAX_READ = 256
_READ: Dict[int, Tuple[cst.CSTNode, FrozenSet[str]]] = rewrite_caches.mapping()

#: node type -> what :func:`names_read` does with it: 1 a name, 2 read its ``value`` only (an
#: attribute, an argument), 3 nothing (layout and tokens: no name below; a third of an
#: expression's nodes are its whitespace), 0 its children (``isinstance`` per node went through
#: ``ABCMeta``)
_READ_KINDS: Dict[type, int] = {}
#: the node types :func:`names_read` need not enter
_NO_NAMES = (cst.SimpleWhitespace, cst.ParenthesizedWhitespace, cst.TrailingWhitespace, cst.EmptyLine,
             cst.Newline, cst.Comment, cst.LeftParen, cst.RightParen, cst.LeftSquareBracket,
             cst.RightSquareBracket, cst.LeftCurlyBrace, cst.RightCurlyBrace, cst.Comma, cst.Dot, cst.Colon,
             cst.AssignEqual, cst.Semicolon, cst.BaseBinaryOp, cst.BaseBooleanOp, cst.BaseCompOp,
             cst.BaseUnaryOp, cst.BaseAugOp, cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString)


def _read_kind(t: type) -> int:
    k = _READ_KINDS[t] = 1 if issubclass(t, cst.Name) else 2 if issubclass(t, (cst.Attribute, cst.Arg)) \
        else 3 if issubclass(t, _NO_NAMES) else 0
    return k


#: the node :func:`bound_names` last answered for, and its answer: the checks of one loop each
#: ask about the same body in turn (four walks of it per rewritten loop); the node is held, so
#: its id stays its own
_BOUND_LAST: List[Tuple[Optional[cst.CSTNode], FrozenSet[str]]] = rewrite_caches.held((None, frozenset()))


def bound_names(node: cst.CSTNode) -> Set[str]:
    """Names bound anywhere under ``node`` (assignments, loop targets, defs, imports, walrus)."""
    if _BOUND_LAST[0][0] is not node:
        _BOUND_LAST[0] = (node, frozenset(_bound_names(node)))
    return set(_BOUND_LAST[0][1])


def _bound_names(node: cst.CSTNode) -> Set[str]:
    """(By node type: cstwalk.typed, the walk a loop's other checks of its body share.)"""
    found: Set[str] = set()
    kinds = _BINDING_KINDS
    for t, nodes in typed(node).items():
        k = kinds.get(t)
        if k is None:
            k = kinds[t] = _binding_kind(nodes[0])
        if k == 0:
            continue
        for n in nodes:
            if k == 1:
                _target_names(n.target, found)  # type: ignore[attr-defined]
            elif k == 2:
                _target_names(n.name, found)  # type: ignore[attr-defined]
            elif k == 3:
                found.add(n.name.value)  # type: ignore[attr-defined]
            elif n.asname is None:  # type: ignore[attr-defined]
                found.add(_code(n.name).split(".")[0])  # type: ignore[attr-defined]
    return found


def _target_names(t: cst.CSTNode, found: Set[str]) -> None:
    """Add the names an assignment target binds (a name, or those in a tuple, list or star)."""
    if isinstance(t, cst.Name):
        found.add(t.value)
    elif isinstance(t, (cst.Tuple, cst.List)):
        for el in t.elements:
            _target_names(el.value, found)
    elif isinstance(t, cst.StarredElement):
        _target_names(t.value, found)


#: node type -> which binding :func:`_bound_names` reads of it (:func:`_binding_kind`)
_BINDING_KINDS: Dict[type, int] = {}


def _binding_kind(n: cst.CSTNode) -> int:
    """0 none, 1 its ``target``, 2 an ``as`` name, 3 a def's name, 4 an import alias."""
    if isinstance(n, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor, cst.NamedExpr)):
        return 1
    if isinstance(n, cst.AsName):
        return 2
    if isinstance(n, (cst.FunctionDef, cst.ClassDef)):
        return 3
    return 4 if isinstance(n, cst.ImportAlias) else 0
