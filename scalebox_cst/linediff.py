"""Line diffs in time about linear in the file: difflib's opcodes, anchored on unique lines.

``difflib.SequenceMatcher`` over two whole files costs up to O(n·m) per change; with a site every
few dozen lines of a 40k-line file, line maps and review diffs took most of a rewrite (issue 9,
item 13). Here small inputs get exactly difflib's answer; larger ones are split first: common
head and tail, then lines that occur once on each side, in the same order (the longest
increasing run of them, as patience diff does), anchor the match, and only the short stretches
between anchors go to difflib. A large stretch with no unique line is one ``replace``.
"""
from __future__ import annotations

import bisect
import difflib
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple

from scalebox_cst.textlines import line_starts, stripped_lines

Opcode = Tuple[str, int, int, int, int]

#: stretches with at most this many line pairs (len(a) * len(b)) go to difflib as they are
SMALL = 250_000


def opcodes(a: Sequence[Hashable], b: Sequence[Hashable]) -> List[Opcode]:
    """``difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()``, bounded in time."""
    if len(a) * len(b) <= SMALL:
        return difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    return _to_opcodes(_blocks(a, b), len(a), len(b))


def grouped(codes: List[Opcode], n: int = 3) -> List[List[Opcode]]:
    """Hunks of ``codes`` with ``n`` lines of context (``SequenceMatcher.get_grouped_opcodes``)."""
    codes = list(codes) or [("equal", 0, 1, 0, 1)]
    if codes[0][0] == "equal":
        tag, i1, i2, j1, j2 = codes[0]
        codes[0] = tag, max(i1, i2 - n), i2, max(j1, j2 - n), j2
    if codes[-1][0] == "equal":
        tag, i1, i2, j1, j2 = codes[-1]
        codes[-1] = tag, i1, min(i2, i1 + n), j1, min(j2, j1 + n)
    groups: List[List[Opcode]] = []
    group: List[Opcode] = []
    for tag, i1, i2, j1, j2 in codes:
        if tag == "equal" and i2 - i1 > 2 * n:
            group.append((tag, i1, min(i2, i1 + n), j1, min(j2, j1 + n)))
            groups.append(group)
            group = []
            i1, j1 = max(i1, i2 - n), max(j1, j2 - n)
        group.append((tag, i1, i2, j1, j2))
    if group and not (len(group) == 1 and group[0][0] == "equal"):
        groups.append(group)
    return groups


def _blocks(a: Sequence[Hashable], b: Sequence[Hashable]) -> List[Tuple[int, int, int]]:
    """Matching blocks ``(i, j, size)`` in increasing order (not necessarily merged)."""
    found: List[Tuple[int, int, int]] = []
    stack = [(0, len(a), 0, len(b))]
    while stack:
        alo, ahi, blo, bhi = stack.pop()
        head = 0
        while alo + head < ahi and blo + head < bhi and a[alo + head] == b[blo + head]:
            head += 1
        if head:
            found.append((alo, blo, head))
            alo, blo = alo + head, blo + head
        tail = 0
        while alo < ahi - tail and blo < bhi - tail and a[ahi - tail - 1] == b[bhi - tail - 1]:
            tail += 1
        if tail:
            found.append((ahi - tail, bhi - tail, tail))
            ahi, bhi = ahi - tail, bhi - tail
        if alo == ahi or blo == bhi:
            continue
        if (ahi - alo) * (bhi - blo) <= SMALL:
            matcher = difflib.SequenceMatcher(None, a[alo:ahi], b[blo:bhi], autojunk=False)
            found.extend((alo + i, blo + j, size) for i, j, size in matcher.get_matching_blocks() if size)
            continue
        anchors = _unique_anchors(a, alo, ahi, b, blo, bhi)
        if not anchors:
            continue  # one replace: nothing ties the two stretches together
        prev_i, prev_j = alo, blo
        for i, j in anchors:
            found.append((i, j, 1))
            stack.append((prev_i, i, prev_j, j))
            prev_i, prev_j = i + 1, j + 1
        stack.append((prev_i, ahi, prev_j, bhi))
    found.sort()
    return found


def _unique_anchors(a, alo: int, ahi: int, b, blo: int, bhi: int) -> List[Tuple[int, int]]:
    """Pairs (i, j) of lines that occur once in a[alo:ahi] and once in b[blo:bhi], the longest
    run of them increasing on both sides."""
    count_a: Dict[Hashable, int] = {}
    where_a: Dict[Hashable, int] = {}
    for i in range(alo, ahi):
        line = a[i]
        count_a[line] = count_a.get(line, 0) + 1
        where_a[line] = i
    count_b: Dict[Hashable, int] = {}
    where_b: Dict[Hashable, int] = {}
    for j in range(blo, bhi):
        line = b[j]
        if count_a.get(line) == 1:
            count_b[line] = count_b.get(line, 0) + 1
            where_b[line] = j
    pairs = sorted((where_a[line], where_b[line]) for line, n in count_b.items() if n == 1)
    # longest increasing subsequence of j (patience sorting), O(k log k)
    tails: List[int] = []  # tails[k]: the smallest j ending an increasing run of length k + 1
    tail_at: List[int] = []  # index into pairs of that run's end
    back: List[int] = [-1] * len(pairs)
    for index, (_, j) in enumerate(pairs):
        k = bisect.bisect_left(tails, j)
        if k == len(tails):
            tails.append(j)
            tail_at.append(index)
        else:
            tails[k] = j
            tail_at[k] = index
        back[index] = tail_at[k - 1] if k else -1
    run: List[Tuple[int, int]] = []
    index = tail_at[-1] if tail_at else -1
    while index >= 0:
        run.append(pairs[index])
        index = back[index]
    run.reverse()
    return run


def _to_opcodes(blocks: List[Tuple[int, int, int]], la: int, lb: int) -> List[Opcode]:
    merged: List[List[int]] = []
    for i, j, size in blocks:
        if merged and merged[-1][0] + merged[-1][2] == i and merged[-1][1] + merged[-1][2] == j:
            merged[-1][2] += size
        else:
            merged.append([i, j, size])
    codes: List[Opcode] = []
    i = j = 0
    for ai, bj, size in [*merged, [la, lb, 0]]:
        tag = ""
        if i < ai and j < bj:
            tag = "replace"
        elif i < ai:
            tag = "delete"
        elif j < bj:
            tag = "insert"
        if tag:
            codes.append((tag, i, ai, j, bj))
        i, j = ai + size, bj + size
        if size:
            codes.append(("equal", ai, i, bj, j))
    return codes


class LineMap:
    """Each line of a new version -> the line of the old one it comes from (inserted lines: the
    next old line), kept as the diff's stretches rather than one entry per line: five versions
    of a 50k-line file were half a million entries, written and split line by line."""

    def __init__(self) -> None:
        self._firsts: List[int] = []  # first new line (0-based) of each stretch
        self._stretches: List[Tuple[bool, int, int, int, int]] = []  # (equal, i1, i2, j1, j2), 0-based

    def add(self, equal: bool, i1: int, i2: int, j1: int, j2: int) -> None:
        """New lines ``j1..j2-1`` from old lines ``i1..i2-1`` (0-based; in order of ``j1``)."""
        if j2 > j1:
            self._firsts.append(j1)
            self._stretches.append((equal, i1, i2, j1, j2))

    def get(self, line: int, default: int) -> int:
        """The old line (1-based) that new ``line`` comes from; ``default`` outside the new version."""
        got = self._find(line)
        return default if got is None else got

    def __getitem__(self, line: int) -> int:
        got = self._find(line)
        if got is None:
            raise KeyError(line)
        return got

    def _find(self, line: int) -> Optional[int]:
        k = bisect.bisect_right(self._firsts, line - 1) - 1
        if k < 0:
            return None
        equal, i1, i2, j1, j2 = self._stretches[k]
        if line - 1 >= j2:
            return None
        if equal:
            return i1 + line - 1 - j1 + 1
        return min(i1 + line - 1 - j1, max(i2 - 1, i1)) + 1


def line_map(old: str, new: str) -> LineMap:
    """The :class:`LineMap` of ``new`` made from ``old`` (a diff of their lines)."""
    mapping = LineMap()
    for tag, i1, i2, j1, j2 in opcodes(stripped_lines(old), stripped_lines(new)):
        mapping.add(tag == "equal", i1, i2, j1, j2)
    return mapping


def spliced_line_map(old: str, new: str, copied: Sequence[Tuple[int, int, int]],
                     starts: Callable[[str], List[int]] = line_starts) -> Optional[LineMap]:
    """:func:`line_map` of a splice: ``new`` is ``old`` with stretches copied as they are
    (``copied``: old start, old end, new start, in order) and text made between them. Copied
    lines map one to one; only the text between copies is diffed, against the old text it
    replaced (so a made line never maps to an unrelated statement far away, as a whole-file diff
    may match it). ``starts``: :func:`line_starts`, perhaps kept. None where a copy does not
    start and end at line starts (the caller diffs the whole files)."""
    old_starts, new_starts = starts(old), starts(new)

    def line_at(at: int, starts: List[int]) -> Optional[int]:  # the line starting at offset ``at``
        k = bisect.bisect_left(starts, at)
        return k if k < len(starts) and starts[k] == at else None

    mapping = LineMap()
    a_at = b_at = 0  # line indices where the text before the next copy starts
    c_at = d_at = 0  # and its offsets
    for o0, o1, n0 in [*copied, (len(old), len(old), len(new))]:
        a0, a1 = line_at(o0, old_starts), line_at(o1, old_starts)
        b0, b1 = line_at(n0, new_starts), line_at(n0 + o1 - o0, new_starts)
        if a0 is None or a1 is None or b0 is None or b1 is None or a0 < a_at or b0 < b_at:
            return None
        if b0 > b_at:  # text made between two copies: diffed against the text it replaced
            a, b = stripped_lines(old[c_at:o0]), stripped_lines(new[d_at:n0])
            if len(a) != a0 - a_at or len(b) != b0 - b_at:
                return None
            for tag, i1, i2, j1, j2 in opcodes(a, b):
                mapping.add(tag == "equal", i1 + a_at, i2 + a_at, j1 + b_at, j2 + b_at)
        mapping.add(True, a0, a1, b0, b1)
        a_at, b_at, c_at, d_at = a1, b1, o1, n0 + o1 - o0
    return mapping if a_at == len(old_starts) - 1 and b_at == len(new_starts) - 1 else None
