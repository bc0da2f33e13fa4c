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

from .list_bindings import binding_events
from .syntax import _code, _walk

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


class Counts:
    """Counts over one subtree: names, ``name = ...`` targets, frame-reading nodes."""

    def __init__(self, node: cst.CSTNode) -> None:
        self.names: Dict[str, int] = collections.Counter()
        self.stores: Dict[str, int] = collections.Counter()
        self.frame = 0
        for n in _walk(node):
            if isinstance(n, cst.Name):
                self.names[n.value] += 1
            elif isinstance(n, cst.Assign):
                for t in n.targets:
                    if isinstance(t.target, cst.Name):
                        self.stores[t.target.value] += 1
            elif reads_frame(n):
                self.frame += 1


class FunctionFacts:
    """One function's :class:`Counts` (over the whole ``def``) and bindings (over its body)."""

    def __init__(self, func: cst.FunctionDef) -> None:
        self.func = func
        self.counts = Counts(func)
        #: name -> [(binding node, the statement when it makes a new list, else None)], walk order
        self.bindings: Dict[str, List[Tuple[cst.CSTNode, Optional[cst.CSTNode]]]] = collections.defaultdict(list)
        #: name -> how many of its bindings are not known to make a new list
        self.unknown: Dict[str, int] = collections.Counter()
        #: nested scopes and ``global``/``nonlocal`` declarations with their code
        self.scopes: List[Tuple[cst.CSTNode, str]] = []
        for n in _walk(func.body):
            if isinstance(n, _SCOPES):
                self.scopes.append((n, _code(n)))
            for name, made in binding_events(n):
                self.bindings[name].append((n, made))
                if made is None:
                    self.unknown[name] += 1

    def outside(self, loop: cst.CSTNode) -> "Outside":
        return Outside(self, loop)


class Outside:
    """Questions about a function outside one loop of it (each walks the loop once, at most)."""

    def __init__(self, facts: FunctionFacts, loop: cst.CSTNode) -> None:
        self.facts = facts
        self.loop = loop
        self._inner: Optional[Counts] = None
        self._ids: Optional[set] = None
        self._unknown: Optional[Dict[str, int]] = None

    @property
    def inner(self) -> Counts:
        if self._inner is None:
            self._inner = Counts(self.loop)
        return self._inner

    def contains(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` is inside the loop (by identity)."""
        if self._ids is None:
            self._ids = {id(n) for n in _walk(self.loop)}
        return id(node) in self._ids

    def names(self, name: str) -> int:
        """How many times ``name`` appears outside the loop."""
        return self.facts.counts.names[name] - self.inner.names[name]

    def reads(self, name: str) -> int:
        """Appearances of ``name`` outside the loop, less the targets of ``name = ...``."""
        return self.names(name) - (self.facts.counts.stores[name] - self.inner.stores[name])

    def frame_readers(self) -> int:
        return self.facts.counts.frame - self.inner.frame

    def unknown_bindings(self, name: str) -> int:
        """Bindings of ``name`` outside the loop not known to make a new list."""
        if self._unknown is None:
                self._unknown = collections.Counter(
                bound for n in _walk(self.loop) for bound, made in binding_events(n) if made is None)
        return self.facts.unknown[name] - self._unknown[name]

    def first_binding(self, name: str) -> Optional[cst.CSTNode]:
        """The first (in walk order) list-making statement binding ``name`` outside the loop."""
        for n, made in self.facts.bindings.get(name, ()):
            if not self.contains(n):
                return made
        return None


#: the last function :func:`facts` gathered (loops are asked about function by function; the
#: function is held, so its node ids stay its own)
_LAST: List[Optional[FunctionFacts]] = [None]


def facts(func: cst.FunctionDef) -> FunctionFacts:
    last = _LAST[0]
    if last is None or last.func is not func:
        last = _LAST[0] = FunctionFacts(func)
    return last
