"""Every read in a scope, gathered once, for :func:`reads.read_elsewhere`'s question per loop.

``read_elsewhere(scope, loop, names)`` asks whether a name the loop binds may be read elsewhere
in its scope. Its visitor walked the whole scope for each loop, so a function of n loops that
reuse their names (``for i in range(n)``, the accumulators of each block) cost n walks of the
function: a 1,600-line function of 100 such blocks took 57 CPU s, four times as long for twice
the blocks (found by a scaling check beside issue 19's fault campaign). Here the scope is walked
once, in the visitor's own order and with its own rules (what is a store, what is not a
variable, what a rebinding ``for``, comprehension or nested function covers), and each read is
kept with its place: its rank in that order, the names covering it, whether it sits in a nested
function and the loops around it. A question about one loop then decides, per read of the names
asked about, what the visitor decided at that read: a read inside the loop (or under ``also``)
is not one, a read before the loop counts only inside a loop enclosing it or a nested function,
and a covered read never counts.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from .. import rewrite_caches
from .scope_walk import ScopeWalk

#: (rank, names covering it, in a nested function, ids of the loops around it)
_Read = Tuple[int, Tuple[Set[str], ...], bool, Tuple[int, ...]]


class ReadIndex(ScopeWalk):
    """The reads of one scope's body, with the ranks each node spans in the walk."""

    def __init__(self) -> None:
        super().__init__()
        self.rank = 0
        self.spans: Dict[int, Tuple[int, int]] = {}  # id(node) -> (first rank, last rank)
        self.loop_ids: List[int] = []  # the loops (for/while), in walk order
        self.reads: Dict[str, List[_Read]] = {}
        self.dynamic: List[_Read] = []  # locals()/vars()/globals() without arguments, eval, exec
        self._loops: List[int] = []

    def _here(self) -> _Read:
        return (self.rank, tuple(self._covered), bool(self._nested), tuple(self._loops))

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.rank += 1
        self.spans[id(node)] = (self.rank, self.rank)
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        first = self.spans[id(original_node)][0]
        self.spans[id(original_node)] = (first, self.rank)
        super().on_leave(original_node)

    def _loop_entered(self, node: cst.CSTNode) -> None:
        self._loops.append(id(node))
        self.loop_ids.append(id(node))

    def _loop_left(self, node: cst.CSTNode) -> None:
        self._loops.pop()

    def _read(self, name: str) -> None:
        self.reads.setdefault(name, []).append(self._here())

    def _reads_all(self) -> None:
        self.dynamic.append(self._here())

    # -- the question
    def read_elsewhere(self, loop: cst.CSTNode, names: Set[str], also: Sequence[cst.CSTNode]) -> Optional[Set[str]]:
        """``reads.read_elsewhere``'s answer, or None where ``loop`` (or a node of ``also``) is not
        a node this index walked (the caller then walks as before)."""
        span = self.spans.get(id(loop))
        if span is None or not isinstance(loop, cst.For):
            return None
        first, last = span
        skipped = [span]
        for node in also:
            s = self.spans.get(id(node))
            if s is None:
                return None
            skipped.append(s)
        ancestors = {lid for lid in self.loop_ids if lid != id(loop) and self.spans[lid][0] < first and last <= self.spans[lid][1]}

        def counts(read: _Read, name: Optional[str]) -> bool:
            rank, covered, nested, loops = read
            if any(a <= rank <= b for a, b in skipped):
                return False
            if not (rank > last or nested or (ancestors and not ancestors.isdisjoint(loops))):
                return False  # before the loop, run once: it cannot see what the loop left
            return name is None or not any(name in c for c in covered)

        found = {name for name in names if any(counts(r, name) for r in self.reads.get(name, ()))}
        for read in self.dynamic:
            if counts(read, None):
                found |= {name for name in names if not any(name in c for c in read[1])}
        return found


#: scope body id -> (body, its index): the bodies are held, so their ids stay theirs
_INDEXES: Dict[int, Tuple[cst.CSTNode, ReadIndex]] = rewrite_caches.mapping()


def index_of(body: cst.CSTNode) -> ReadIndex:
    """The reads of ``body``, walked once per rewrite."""
    known = _INDEXES.get(id(body))
    if known is not None and known[0] is body:
        return known[1]
    index = ReadIndex()
    body.visit(index)
    _INDEXES[id(body)] = (body, index)
    return index

