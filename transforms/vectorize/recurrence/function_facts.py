"""What one function holds, gathered once, for the questions asked once per loop in it.

Several checks ask, for one loop, what its enclosing function does with a name *outside* that
loop: is the name read (:func:`fold.dead_after`, ``one_pass._dead_after``), how is it bound
(:mod:`.list_outputs`). Each walked the whole function per loop, so a function holding many
loops cost (function size x loops): a 22,500-line file with 2,500 backward loops in few
functions gave no result in 240 s. Here a function is walked once -- counts of each name, of
plain-assignment targets and of frame-reading nodes, and the bindings of each name in walk order
-- and a question about one loop subtracts what the loop itself holds (one walk of the loop).
"""
from __future__ import annotations

import collections
from typing import Dict, List, Optional, Tuple

import libcst as cst

from ... import rewrite_caches
from .list_bindings import binding_events
from ...analysis.cstwalk import children, typed, walk_code
from .syntax import _code

#: calls that read a function's local variables by name (or hand its frame to a debugger)
_INTROSPECTION = {"locals", "vars", "eval", "exec", "dir", "globals", "breakpoint"}
#: attributes that reach a frame's locals (sys._getframe().f_locals, inspect.currentframe())
_FRAME_ATTRS = {"f_locals", "_getframe", "currentframe", "set_trace"}


def reads_frame(n: cst.CSTNode) -> bool:
    """Whether ``n`` is a call that reads a function's locals by name or an attribute that reaches
    its frame (what makes a local read where its name does not appear)."""
    if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value in _INTROSPECTION:
        return True
    return isinstance(n, cst.Attribute) and n.attr.value in _FRAME_ATTRS


_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Global, cst.Nonlocal)
_IS_SCOPE: Dict[type, bool] = {}


#: node type -> what :class:`Counts` counts of it: a name, an assignment, a possible frame
#: reader (a call or an attribute), else nothing (``isinstance`` per node went through ``ABCMeta``)
_NAME, _ASSIGN, _MAYBE_FRAME, _NOTHING = 1, 2, 3, 0
_COUNTED: Dict[type, int] = {}


def _counted(t: type) -> int:
    c = _NAME if issubclass(t, cst.Name) else _ASSIGN if issubclass(t, cst.Assign) else \
        _MAYBE_FRAME if issubclass(t, (cst.Call, cst.Attribute)) else _NOTHING
    _COUNTED[t] = c
    return c


class Counts:
    """Counts over one subtree: names, ``name = ...`` targets, frame-reading nodes."""

    def __init__(self, node: Optional[cst.CSTNode] = None) -> None:
        self.names: Dict[str, int] = collections.Counter()
        self.stores: Dict[str, int] = collections.Counter()
        self.frame = 0
        if node is not None:
            for n in walk_code(node):
                self.add(n)

    def add(self, n: cst.CSTNode) -> None:
        """Count ``n`` (not its children)."""
        c = _COUNTED.get(type(n))
        if c is None:
            c = _counted(type(n))
        if c == _NAME:
            self.names[n.value] += 1  # type: ignore[attr-defined]
        elif c == _ASSIGN:
            for t in n.targets:  # type: ignore[attr-defined]
                if isinstance(t.target, cst.Name):
                    self.stores[t.target.value] += 1
        elif c == _MAYBE_FRAME and reads_frame(n):
            self.frame += 1


class FunctionFacts:
    """One function's :class:`Counts` (over the whole ``def``) and bindings (over its body)."""

    def __init__(self, func: cst.FunctionDef) -> None:
        self.func = func
        self.counts = counts = Counts()
        #: name -> [(binding node, the statement when it makes a new list, else None)], walk order
        self.bindings: Dict[str, List[Tuple[cst.CSTNode, Optional[cst.CSTNode]]]] = collections.defaultdict(list)
        #: name -> how many of its bindings are not known to make a new list
        self.unknown: Dict[str, int] = collections.Counter()
        #: nested scopes and ``global``/``nonlocal`` declarations with their code
        self.scopes: List[Tuple[cst.CSTNode, str]] = []
        for n in walk_code(func.body):  # the counts of the body, with its bindings: one walk (no layout)
            counts.add(n)
            scope = _IS_SCOPE.get(type(n))
            if scope is None:
                scope = _IS_SCOPE[type(n)] = isinstance(n, _SCOPES)
            if scope:
                self.scopes.append((n, _code(n)))
            for name, made in binding_events(n):
                self.bindings[name].append((n, made))
                if made is None:
                    self.unknown[name] += 1
        counts.add(func)  # then the rest of the ``def``: its name, parameters, decorators...
        for child in children(func):
            if child is not func.body:
                for n in walk_code(child):
                    counts.add(n)
        self._outside: Optional[Outside] = None

    def outside(self, loop: cst.CSTNode) -> "Outside":
        """The questions about ``loop`` (the last loop asked about is kept: each check of one
        loop asks, and the answers need one walk of it)."""
        last = self._outside
        if last is None or last.loop is not loop:
            last = self._outside = Outside(self.counts, self.unknown, self.bindings, loop)
        return last


class Outside:
    """Questions about a function outside one loop of it (the loop is walked once, when first
    asked about). It holds the function's tables, not its :class:`FunctionFacts`, which holds
    it: that cycle made the whole function's tree garbage only a collection frees (~3 s of
    ``gc`` after a 50k-line file's rewrite)."""

    def __init__(self, counts: Counts, unknown: Dict[str, int],
                 bindings: Dict[str, List[Tuple[cst.CSTNode, Optional[cst.CSTNode]]]], loop: cst.CSTNode) -> None:
        self.counts, self.unknown, self.bindings = counts, unknown, bindings
        self.loop = loop
        self._inner: Optional[Counts] = None
        self._scanned: Optional[Tuple[set, Dict[str, int]]] = None

    def _scan(self) -> Tuple[set, Dict[str, int]]:
        """The ids of the loop's nodes and its bindings not known to make a new list, in one
        walk (asked only where an output may be a list: most loops need the counts alone)."""
        if self._scanned is None:
            ids = set()
            unknown: Dict[str, int] = collections.Counter()
            for n in walk_code(self.loop):  # (the nodes asked about are bindings and scopes)
                ids.add(id(n))
                for bound, made in binding_events(n):
                    if made is None:
                        unknown[bound] += 1
            self._scanned = (ids, unknown)
        return self._scanned

    @property
    def inner(self) -> Counts:
        """The loop's :class:`Counts`: its body's from the nodes of the kinds counted
        (cstwalk.typed: the body's walk by node type, which the loop's other checks made), then
        the rest of the loop (its header, its ``else``) node by node."""
        if self._inner is None:
            inner = self._inner = Counts()
            loop = self.loop
            body = getattr(loop, "body", None)
            if body is not None:
                for t, nodes in typed(body).items():
                    c = _COUNTED.get(t)
                    if c is None:
                        c = _counted(t)
                    if c != _NOTHING:
                        for n in nodes:
                            inner.add(n)
            inner.add(loop)
            for child in children(loop):
                if child is not body:
                    for n in walk_code(child):
                        inner.add(n)
        return self._inner

    def contains(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` is inside the loop (by identity)."""
        return id(node) in self._scan()[0]

    def names(self, name: str) -> int:
        """How many times ``name`` appears outside the loop."""
        return self.counts.names[name] - self.inner.names[name]

    def reads(self, name: str) -> int:
        """Appearances of ``name`` outside the loop, less the targets of ``name = ...``."""
        return self.names(name) - (self.counts.stores[name] - self.inner.stores[name])

    def frame_readers(self) -> int:
        return self.counts.frame - self.inner.frame

    def unknown_bindings(self, name: str) -> int:
        """Bindings of ``name`` outside the loop not known to make a new list."""
        return self.unknown[name] - self._scan()[1][name]

    def first_binding(self, name: str) -> Optional[cst.CSTNode]:
        """The first (in walk order) list-making statement binding ``name`` outside the loop."""
        for n, made in self.bindings.get(name, ()):
            if not self.contains(n):
                return made
        return None


#: the last function :func:`facts` gathered (loops are asked about function by function; the
#: function is held, so its node ids stay its own)
_LAST: List[Optional[FunctionFacts]] = rewrite_caches.held(None)


def facts(func: cst.FunctionDef) -> FunctionFacts:
    last = _LAST[0]
    if last is None or last.func is not func:
        last = _LAST[0] = FunctionFacts(func)
    return last
