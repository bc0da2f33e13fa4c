"""The ``ast`` of a module version made from the previous version's, where the codegen spliced it.

After each transform that edits, the pipeline needs the new version's ``ast``; ``ast.parse`` of
the whole file was a quarter of a dense file's rewrite (six versions of 50k lines: ~4 s, issue 19
item 13), though most top-level statements are the previous version's, unchanged. Where the
codegen spliced the new code (``pipeline._Codegen._splice``: the old code with the text of
replaced statements swapped), it says which statements it kept (same text, perhaps on other
lines) and which stretches of text it generated. The kept statements' ``ast`` nodes are moved
into the new tree with their line numbers shifted (columns are unchanged: a top-level statement
moves by whole lines), and only the generated stretches are parsed, at their lines. The
result is what ``ast.parse`` of the new code gives (tests/scalebox_cst/test_astsplice.py compares
``ast.dump(..., include_attributes=True)``); where that cannot be shown cheaply (a ``\\r`` in the
code, a ``__future__`` import, which can change how code parses) the caller parses the whole file.

The kept nodes are the previous version's, moved: that tree is not used after the new one exists.
"""
from __future__ import annotations

import ast
import bisect
import dataclasses
from typing import Callable, Dict, List, Optional, Tuple, cast

from scalebox_cst.textlines import line_starts
from scalebox_cst.transforms.analysis import astwalk


@dataclasses.dataclass
class Plan:
    """What a splice kept and made, in the new module's statement order."""

    #: (old statement index, its text's offset in the old code, in the new code), in order
    kept: List[Tuple[int, int, int]] = dataclasses.field(default_factory=list)
    #: (first new statement index, offset in the new code, generated text), in order
    made: List[Tuple[int, int, str]] = dataclasses.field(default_factory=list)
    #: new statement index of each kept statement (parallel to ``kept``)
    kept_at: List[int] = dataclasses.field(default_factory=list)


class Memo:
    """What one file's splices keep from version to version: each kept statement's nodes that
    carry lines, gathered once (a dense file moves most statements in every one of its versions:
    the walk per move was most of the splice), and the line starts of the last two codes."""

    def __init__(self) -> None:
        #: id of a top-level statement -> (the statement, its nodes with line numbers)
        self.lined: Dict[int, Tuple[ast.stmt, List[ast.AST]]] = {}
        self._starts: List[Tuple[str, List[int]]] = []  # of the last two codes asked about

    def starts(self, code: str) -> List[int]:
        """Where each line of ``code`` starts (kept for the last two codes: a version and the next)."""
        for held, starts in self._starts:
            if held is code:
                return starts
        starts = line_starts(code)
        self._starts = [*self._starts[-1:], (code, starts)]
        return starts

    def shift(self, stmt: ast.stmt, delta: int) -> None:
        """Add ``delta`` to the line numbers of ``stmt`` and every node below it (``ast.increment_lineno``)."""
        held = self.lined.get(id(stmt))
        if held is None or held[0] is not stmt:
            held = self.lined[id(stmt)] = (stmt, _lined(stmt))
        for n in held[1]:
            n.lineno += delta  # type: ignore[attr-defined]
            e = n.end_lineno  # type: ignore[attr-defined]
            if e is not None:
                n.end_lineno = e + delta  # type: ignore[attr-defined]

    def keep_only(self, stmts: List[ast.stmt]) -> None:
        """Forget every statement but ``stmts`` (those of the newest version that were moved)."""
        ids = {id(s) for s in stmts}
        self.lined = {k: v for k, v in self.lined.items() if k in ids}


def parse(new_code: str, old_code: str, old_tree: ast.Module, plan: Plan, filename: str,
          memo: Optional[Memo] = None) -> Optional[ast.Module]:
    """``ast.parse(new_code, filename)`` from ``old_tree`` (of ``old_code``) and ``plan``; None where
    the caller is to parse the whole code. Raises what ``ast.parse`` of the generated stretches
    raises (its line numbers are the new code's). ``memo``: kept from one version of a file to the
    next (:class:`Memo`)."""
    if "\r" in new_code or "\r" in old_code or "__future__" in new_code:
        return None
    memo = memo if memo is not None else Memo()
    old_starts = memo.starts(old_code)
    new_starts = memo.starts(new_code)
    pieces: List[Tuple[int, List[ast.stmt]]] = []  # (first new statement index, its ast statements)
    if plan.made:  # first: nothing of the old tree is moved before this succeeds
        made = _parse_made(new_starts, plan.made, filename)
        if made is None:
            return None
        pieces += made
    for (i, old_at, new_at), j in zip(plan.kept, plan.kept_at):
        delta = bisect.bisect_right(new_starts, new_at) - bisect.bisect_right(old_starts, old_at)
        stmt = old_tree.body[i]
        if delta:
            memo.shift(stmt, delta)
        pieces.append((j, [stmt]))
    memo.keep_only([old_tree.body[i] for i, _, _ in plan.kept])
    pieces.sort(key=lambda p: p[0])
    return ast.Module(body=[s for _, body in pieces for s in body], type_ignores=[])


def _parse_made(new_starts: List[int], made: List[Tuple[int, int, str]], filename: str) -> Optional[List[Tuple[int, List[ast.stmt]]]]:
    """The ``ast`` statements of each generated stretch, at their lines in the new code: one
    ``ast.parse`` of a text holding every stretch at its lines and blank lines between (a parse
    per stretch, then moving its lines, cost twice as much where stretches are many and short).
    A stretch is a run of whole top-level statements, so the text parses as they do apart.
    None where a stretch does not start a line."""
    parts: List[str] = []
    spans: List[Tuple[int, int]] = []  # (first new statement index, last line of the stretch)
    next_line = 1
    for j, new_at, text in made:
        line = bisect.bisect_right(new_starts, new_at)  # 1-based line of the stretch's start
        if new_starts[line - 1] != new_at or line < next_line:
            return None  # a stretch starts inside a line: not a run of whole statements
        parts.append("\n" * (line - next_line))
        parts.append(text)
        count = text.count("\n")
        if not text.endswith("\n"):
            parts.append("\n")
            count += 1
        next_line = line + count
        spans.append((j, next_line - 1))
    body = ast.parse("".join(parts), filename=filename).body
    out: List[Tuple[int, List[ast.stmt]]] = []
    k = 0
    for j, last in spans:
        first = k
        while k < len(body) and body[k].lineno <= last:
            k += 1
        out.append((j, body[first:k]))
    return out


def with_kept(plan: Plan, kept: List[Tuple[int, int]], copied: List[Tuple[int, int, int]],
              offset: Callable[[int], Optional[int]]) -> Optional[Plan]:
    """``plan`` with where each kept statement's text went (it lies in one copied stretch): ``kept``,
    (old, new) statement indices; ``copied``, (old start, old end, new start) of the stretches the
    splice copied; ``offset(i)``, where old statement i's text starts. None where one is not found."""
    starts = [c[0] for c in copied]
    for i, j in kept:
        old_at = offset(i)
        if old_at is None:
            return None
        k = bisect.bisect_right(starts, old_at) - 1
        if k < 0 or not copied[k][0] <= old_at < copied[k][1]:
            return None
        plan.kept.append((i, old_at, copied[k][2] + old_at - copied[k][0]))
        plan.kept_at.append(j)
    return plan


def _lined(node: ast.AST) -> List[ast.AST]:
    """``node`` and the nodes below it that carry line numbers (a step per node type made once,
    which takes the node if it has lines and pushes its children; ``ctx``, ``op`` and ``ops``
    fields hold singletons without lines, not walked)."""
    out: List[ast.AST] = []
    todo = [node]
    steps = _STEPS
    while todo:
        n = todo.pop()
        step = steps.get(type(n))
        if step is None:
            step = _step(type(n))
        step(n, out, todo)
    return out


_Step = Callable[[ast.AST, List[ast.AST], List[ast.AST]], None]
_STEPS: Dict[type, _Step] = {}


def _step(cls: type) -> _Step:
    lines = ["def step(n, out, todo):"]
    if "lineno" in cls._attributes and "end_lineno" in cls._attributes:  # type: ignore[attr-defined]
        lines += ["    out.append(n)"]
    # Load/Store/Del and operators: shared singletons without lines, not walked
    lines += astwalk.push_lines(cls, "n", "todo", skip=("ctx", "op", "ops"))
    lines.append("    return None")
    scope = {"AST": ast.AST}
    exec("\n".join(lines), scope)  # noqa: S102 - field names of an ast class: identifiers
    step = _STEPS[cls] = cast(_Step, scope["step"])
    return step
