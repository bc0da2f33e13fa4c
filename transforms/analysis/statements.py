"""Matching statements between Python's ``ast`` (the cheap candidate search) and libcst (the
rewrite): both parsers nest statements the same way, so a pre-order walk of statement lists pairs them.
"""
from __future__ import annotations

import ast
import bisect
from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from .bodies import _BLOCK_FIELDS
from .loops import is_runtime_guard
from ..partial import elided_count


# Deciding on Python's ``ast`` (parsed once, shared by all transforms) that a file holds no
# candidate costs well under a millisecond; parsing it with libcst costs tens. The ``vectorize.*``
# transforms therefore look for candidates on ``ast`` first and touch libcst only when there is
# one: statements are matched between the two trees by their position in a pre-order walk of
# statement lists (both parsers nest statements the same way), sites take their lines from
# ``ast`` (the same lines PositionProvider gives: neither counts parentheses, comments or
# trailing blank lines), and edits rebuild only the nodes on the way to what changed.

#: ast statement class → libcst class name where the two differ
_AST_TO_CST = {"AsyncFor": "For", "AsyncFunctionDef": "FunctionDef", "AsyncWith": "With", "Delete": "Del"}


def ast_statements(body: Sequence[ast.stmt]) -> Tuple[List[ast.stmt], Dict[ast.stmt, Optional[ast.stmt]]]:
    """Every statement under ``body`` in pre-order (an ``elif`` is a statement of its own), and
    each one's enclosing statement (None at the top)."""
    out: List[ast.stmt] = []
    parent: Dict[ast.stmt, Optional[ast.stmt]] = {}
    _walk_statements(body, None, out, parent)
    return out, parent


def _walk_statements(stmts: Sequence[ast.stmt], up: Optional[ast.stmt], out: List[ast.stmt],
                     parent: Dict[ast.stmt, Optional[ast.stmt]]) -> None:
    for st in stmts:
        out.append(st)
        parent[st] = up
        for field in _BLOCK_FIELDS:
            block = getattr(st, field, None)
            if not block:
                continue
            if field in ("handlers", "cases"):
                for h in block:
                    _walk_statements(h.body, st, out, parent)
            else:
                _walk_statements(block, st, out, parent)


class CstStatements:
    """The libcst statements of a module in the same pre-order as :func:`ast_statements`.

    Small statements of one line (``a = 1; b = 2``) are separate entries, as in ``ast``.
    ``parent`` maps each node of the statement skeleton (statements, suites, ``else``/``except``/
    ``finally``/``case`` clauses) to the node that holds it, for :func:`replace_nodes`.
    """

    def __init__(self, module: cst.Module, body: Optional[Sequence[cst.BaseStatement]] = None) -> None:
        """``body``: some of the module's top-level statements (those of a partial visit), else all."""
        self.module = module
        self.stmts: List[cst.CSTNode] = []
        self.parent: Dict[cst.CSTNode, cst.CSTNode] = {}
        #: the module and every indented block, inner blocks first (the order a transformer leaves them)
        self.blocks: List[cst.CSTNode] = []
        self._body(module.body if body is None else body, module)

    def _body(self, stmts: Sequence[cst.BaseStatement], up: cst.CSTNode) -> None:
        for st in stmts:
            self.parent[st] = up
            elided = elided_count(st) if up is self.module else None
            if elided is not None:  # a partial module's filler: as many entries as it stands for
                self.stmts.extend([st] * elided)
            elif isinstance(st, cst.SimpleStatementLine):
                for small in st.body:
                    self.parent[small] = st
                    self.stmts.append(small)
            else:
                self.stmts.append(st)
                self._compound(st)
        self.blocks.append(up)

    def _suite(self, suite: cst.BaseSuite, up: cst.CSTNode) -> None:
        self.parent[suite] = up
        if isinstance(suite, cst.IndentedBlock):
            self._body(suite.body, suite)
        else:
            for small in suite.body:
                self.parent[small] = suite
                self.stmts.append(small)

    def _compound(self, st: cst.CSTNode) -> None:
        for field in _BLOCK_FIELDS:
            block = getattr(st, field, None)
            if block is None:
                continue
            if isinstance(block, cst.BaseSuite):
                self._suite(block, st)
            elif isinstance(block, cst.If):  # elif
                self.parent[block] = st
                self.stmts.append(block)
                self._compound(block)
            elif isinstance(block, (cst.Else, cst.Finally)):
                self.parent[block] = st
                self._suite(block.body, block)
            elif isinstance(block, (list, tuple)):  # except handlers, match cases
                for h in block:
                    self.parent[h] = st
                    self._suite(h.body, h)

    def matches(self, ast_stmts: Sequence[ast.stmt]) -> bool:
        """Whether the two walks paired every statement with one of the same kind."""
        if len(ast_stmts) != len(self.stmts):
            return False
        for a, c in zip(ast_stmts, self.stmts):
            if type(c) is cst.SimpleStatementLine:  # a filler's (no other entry is a whole line)
                continue
            name = type(a).__name__
            if _AST_TO_CST.get(name, name) != type(c).__name__:
                return False
        return True

    def ancestors(self, node: cst.CSTNode) -> List[cst.CSTNode]:
        """The skeleton nodes that hold ``node``, innermost first (the module last)."""
        out: List[cst.CSTNode] = []
        up = self.parent.get(node)
        while up is not None:
            out.append(up)
            up = self.parent.get(up)
        return out

    def scope(self, node: cst.CSTNode) -> cst.CSTNode:
        """The innermost function or class that holds ``node``, else the module."""
        for up in self.ancestors(node):
            if isinstance(up, (cst.FunctionDef, cst.ClassDef)):
                return up
        return self.module

    def guarded(self, node: cst.CSTNode, imports) -> bool:
        """Whether an enclosing ``if`` is a guard an earlier rewrite emitted (see
        :func:`is_runtime_guard`)."""
        return any(isinstance(up, cst.If) and is_runtime_guard(up.test, imports) for up in self.ancestors(node))


class Holding:
    """The statements under some top-level statements of a module, paired between ``ast`` and
    libcst (:class:`CstStatements`, in pre-order), each with those of ``lines`` it holds: what a
    visit need not enter (:meth:`not_holding`) and where calls on those lines sit
    (``positions.innermost``), from one walk of each tree."""

    def __init__(self, walk: CstStatements, lines: List[int], pairs: List[Tuple[ast.stmt, cst.CSTNode, List[int]]]) -> None:
        self.walk = walk
        self.lines = lines  # the wanted lines, sorted
        #: (ast statement, its libcst entry, the wanted lines it holds), in pre-order
        self.pairs = pairs

    def not_holding(self) -> Set[int]:
        """Ids of the libcst statements that hold none of the lines: a transformer that acts only on
        nodes starting on them need not enter these (a visit re-creates every node it passes: the
        ``__main__`` block of a training script is most of the file)."""
        return {id(c) for _, c, held in self.pairs if not held}


def holding(module: cst.Module, body: Sequence[cst.BaseStatement], ast_body: Sequence[ast.stmt],
            lines: Sequence[int]) -> Optional[Holding]:
    """:class:`Holding` of the statements under ``body`` (top-level statements of ``module``, whose
    ``ast`` is ``ast_body``) for ``lines``; None where the two walks do not pair."""
    ast_stmts, _ = ast_statements(ast_body)
    walk = CstStatements(module, body)
    if not walk.matches(ast_stmts):
        return None
    wanted = sorted(set(lines))
    pairs: List[Tuple[ast.stmt, cst.CSTNode, List[int]]] = []
    for a, c in zip(ast_stmts, walk.stmts):
        lo = bisect.bisect_left(wanted, first_line(a))
        hi = bisect.bisect_right(wanted, a.end_lineno or a.lineno)
        pairs.append((a, c, wanted[lo:hi]))
    return Holding(walk, wanted, pairs)


def first_line(a: ast.stmt) -> int:
    """A statement's first line, its decorators' included."""
    return min([a.lineno, *(d.lineno for d in getattr(a, "decorator_list", ()))])


def ast_guarded(node: ast.stmt, parent: Dict[ast.stmt, Optional[ast.stmt]], imports) -> bool:
    """``ast`` side of :meth:`CstStatements.guarded`: True only where libcst would say so too
    (a ``_sb_`` name or a ``scalebox_cst.runtime`` call in an enclosing ``if`` test)."""
    up = parent.get(node)
    while up is not None:
        if isinstance(up, ast.If):
            for n in ast.walk(up.test):
                if isinstance(n, ast.Name) and n.id.startswith("_sb_"):
                    return True
                if isinstance(n, ast.Call):
                    qual = imports.qualify(n.func)
                    if qual is not None and qual.startswith("scalebox_cst.runtime."):
                        return True
        up = parent.get(up)
    return False


def ast_is_flat(body: Sequence[ast.stmt]) -> bool:
    """``ast`` side of :func:`flat_body` (not None): no compound statement in the suite."""
    return not any(isinstance(st, _AST_COMPOUND) for st in body)


_AST_COMPOUND = tuple(
    getattr(ast, name)
    for name in (
        "If", "For", "AsyncFor", "While", "With", "AsyncWith", "Try", "TryStar", "FunctionDef",
        "AsyncFunctionDef", "ClassDef", "Match",
    )
    if hasattr(ast, name)
)
