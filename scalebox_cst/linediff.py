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
from typing import Dict, Hashable, List, Sequence, Tuple

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
