"""Whole-module ``ast`` scans done once per top-level statement, not once per module version.

Several analyses fold a walk of the whole tree (imports and rebound names: ``ImportMap``,
``loop_analysis.ast_rebound``). Each transform that edits makes a new version of the module, and
each version is scanned again, though most of its top-level statements are unchanged: on a
50k-line file each scan is about a second (issue 9, item 13). The pipeline registers each
version's tree with its code; a scan then asks :func:`per_statement` for one result per
top-level statement, computed only for statements whose source it has not seen in the previous
version. A statement's key is its exact source (lines, decorators included, and columns), which
determines its ``ast``. Trees not registered (a transform parsing a snippet, tests) get ``None``
and scan as before.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import re
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from scalebox_cst.textlines import physical_lines

_Key = Tuple[str, int, int, int]


class StatementMemo:
    """Results per (scan name, statement source) for one file's versions; keeps the last version's only."""

    def __init__(self) -> None:
        self._results: Dict[str, Dict[_Key, Any]] = {}
        self._trees: Dict[int, Tuple[ast.Module, List[_Key]]] = {}
        self._partial: Dict[str, Dict[_Key, Any]] = {}  # per scan name, for :meth:`mentioning`
        self._versioned: Dict[str, Any] = {}  # per name, for :meth:`per_version` (this version's)
        self._picked: Dict[Tuple[Tuple[str, ...], Any], List[int]] = {}  # for :meth:`mentioning` (this version's)

    def register(self, tree: ast.Module, code: str) -> None:
        """``tree`` (parsed from ``code``) is the current version: the previous one is dropped."""
        keys = _keys(tree, code)
        self._trees = {id(tree): (tree, keys)} if keys is not None else {}
        self._versioned, self._picked = {}, {}
        live = set(keys or ())
        for name, done in self._partial.items():  # drop the results of statements no longer there
            self._partial[name] = {k: v for k, v in done.items() if k in live}

    def per_statement(self, tree: ast.AST, name: str, scan: Callable[[ast.stmt], Any]) -> Optional[List[Any]]:
        entry = self._trees.get(id(tree))
        if entry is None or entry[0] is not tree:
            return None
        keys = entry[1]
        done = self._results.get(name, {})
        now: Dict[_Key, Any] = {}
        out: List[Any] = []
        for stmt, key in zip(tree.body, keys):
            result = done[key] if key in done else scan(stmt)
            now[key] = result
            out.append(result)
        self._results[name] = now
        return out

    def per_version(self, tree: ast.AST, name: str, make: Callable[[], Any]) -> Any:
        """``make()``, once per registered version (``tree`` the version's); made anew for others."""
        entry = self._trees.get(id(tree))
        if entry is None or entry[0] is not tree:
            return make()
        if name not in self._versioned:
            self._versioned[name] = make()
        return self._versioned[name]

    def mentioning(
        self, tree: ast.AST, name: str, scan: Callable[[ast.stmt], Any], words: Sequence[str],
        only: Optional[Callable[[str], bool]] = None,
    ) -> Optional[List[Any]]:
        """``scan(s)`` for the top-level statements whose source holds one of ``words`` (or any
        character that is not ASCII: an identifier spelled with one may normalise to a word),
        and, given ``only``, for which ``only(source)`` holds; reusing results across versions;
        None if ``tree`` is not registered."""
        entry = self._trees.get(id(tree))
        if entry is None or entry[0] is not tree:
            return None
        done = self._partial.setdefault(name, {})
        keys = entry[1]
        # which statements are asked about, kept for the version: the same words are asked about
        # again and again (each builtin, by each transform), and each time every text was searched
        picked = self._picked.get((tuple(words), only))
        if picked is None:
            picked = self._picked[(tuple(words), only)] = [
                i for i, key in enumerate(keys)
                if (not key[0].isascii() or any(w in key[0] for w in words)) and (only is None or only(key[0]))
            ]
        out: List[Any] = []
        body = tree.body
        for i in picked:
            key = keys[i]
            if key not in done:
                done[key] = scan(body[i])
            out.append(done[key])
        return out


_active = threading.local()


class active:
    """``with active(memo):`` makes ``memo`` the one :func:`per_statement` consults in this thread."""

    def __init__(self, memo: StatementMemo) -> None:
        self.memo = memo

    def __enter__(self) -> StatementMemo:
        self.previous = getattr(_active, "memo", None)
        _active.memo = self.memo
        return self.memo

    def __exit__(self, *exc: object) -> None:
        _active.memo = self.previous


def per_file() -> StatementMemo:
    """The memo made active for this thread (a fresh one where none is: nothing is then shared)."""
    return getattr(_active, "memo", None) or StatementMemo()


def per_statement(tree: ast.AST, name: str, scan: Callable[[ast.stmt], Any]) -> Optional[List[Any]]:
    """``[scan(s) for s in tree.body]``, reusing results for unchanged statements; None if ``tree``
    is not a registered module version (then the caller scans the tree itself)."""
    memo: Optional[StatementMemo] = getattr(_active, "memo", None)
    if memo is None or not isinstance(tree, ast.Module):
        return None
    return memo.per_statement(tree, name, scan)


def per_version(tree: ast.AST, name: str, make: Callable[[], Any]) -> Any:
    """:meth:`StatementMemo.per_version` of the active memo (``make()`` where none is active): an
    object built from the whole version, kept while it is the version the memo holds."""
    memo: Optional[StatementMemo] = getattr(_active, "memo", None)
    return make() if memo is None else memo.per_version(tree, name, make)


def mentioning(
    tree: ast.AST, name: str, scan: Callable[[ast.stmt], Any], words: Sequence[str],
    only: Optional[Callable[[str], bool]] = None,
) -> Optional[List[Any]]:
    """:meth:`StatementMemo.mentioning` of the active memo: the scans of only the top-level
    statements whose text can hold one of ``words`` (a name can only be bound where it is
    written); None where ``tree`` is not a registered module version."""
    memo: Optional[StatementMemo] = getattr(_active, "memo", None)
    if memo is None or not isinstance(tree, ast.Module):
        return None
    return memo.mentioning(tree, name, scan, words, only)


def may_bind(names: Sequence[str]) -> Callable[[str], bool]:
    """``only`` for :func:`mentioning`: whether a statement's source can bind one of ``names``.

    A name is bound only where it is spelled as a name: an assignment or ``for``/``with``/
    ``except``/``del`` target, a parameter, an import, a ``def`` or ``class``. A spelling followed
    by ``(`` (a call) that is not a ``def``/``class`` name, or one after ``.`` (an attribute),
    binds nothing; a statement whose every spelling is one of those is not walked (``range(n)``
    in every loop of a file made the builtin checks walk each function that has a loop). Any other
    spelling, in a string or comment too, and any source that is not ASCII, counts as a binding."""
    return MayBind(tuple(names))


@dataclasses.dataclass(frozen=True)
class MayBind:
    """:func:`may_bind`'s filter: equal for the same names, so :meth:`StatementMemo.mentioning`
    keeps the statements it picks for the version."""

    names: Tuple[str, ...]

    def __call__(self, text: str) -> bool:
        if not text.isascii():
            return True
        return any(_binding_spelling(name).search(text) is not None for name in self.names if name in text)


@functools.lru_cache(maxsize=256)
def _binding_spelling(name: str) -> "re.Pattern[str]":
    word = re.escape(name)
    # a spelling not after "." nor followed by "(" / a def or class name (a backslash may continue the line)
    return re.compile(rf"(?<![\w.]){word}(?!\w)(?![ \t]*\()|\b(?:def|class)[\s\\]+{word}(?!\w)")


def _keys(tree: ast.Module, code: str) -> Optional[List[_Key]]:
    lines = physical_lines(code)
    keys: List[_Key] = []
    for stmt in tree.body:
        first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", ()))])
        end = stmt.end_lineno
        if end is None or end > len(lines):
            return None  # line counts disagree: do not trust any key
        text = "".join(lines[first - 1 : end])
        keys.append((text, first - stmt.lineno, stmt.col_offset, stmt.end_col_offset or 0))
    return keys
