"""Placing the planned lines in the libcst tree: each step's statement is reached down the
structural path (field, index) the ``ast`` scan recorded, and one transformer pass enters only the
compound statements on the way to a planned line, so every other byte stays as it was and the
pipeline reuses the code generated for every untouched subtree.
"""
from __future__ import annotations

import ast
import bisect
from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from .. import rewrite_caches
from ..analysis.cstclone import parse_expression
from ..partial import elided_width
from .events import Loc


_SMALL_TYPES = {
    ast.Expr: cst.Expr, ast.Assign: cst.Assign, ast.AnnAssign: cst.AnnAssign,
    ast.AugAssign: cst.AugAssign, ast.Return: cst.Return,
}


class StructureMismatch(RuntimeError):
    """The ast and libcst trees of one source disagree (never expected; the file is left alone)."""


def cst_field(node: cst.CSTNode, field: str) -> Sequence[cst.CSTNode]:
    def suite(s: cst.BaseSuite) -> Sequence[cst.CSTNode]:
        return s.body if isinstance(s, cst.IndentedBlock) else [s]

    if isinstance(node, cst.Module):
        return node.body
    if field == "body":
        return suite(node.body)
    if field == "orelse":
        if isinstance(node, cst.If) and isinstance(node.orelse, cst.If):
            return [node.orelse]
        return suite(node.orelse.body) if node.orelse is not None else []
    if field == "finalbody":
        return suite(node.finalbody.body) if node.finalbody is not None else []
    name, _, index = field.partition(".")
    return suite(getattr(node, name)[int(index)].body)


def cst_line(module: cst.Module, loc: Loc, stmt: ast.stmt, path: Optional[Set[int]] = None) -> Tuple[cst.CSTNode, int]:
    """The libcst line (SimpleStatementLine/Suite) and small-statement index of the ast statement at
    ``loc``; the ids of the compound nodes on the way there are added to ``path``."""
    node: cst.CSTNode = module
    for depth, (field, k) in enumerate(loc):
        if path is not None:
            path.add(id(node))
        if depth == 0:  # the module's statements: their running widths, once per module
            elements, ends = _top_ends(module, node, field)
            i = bisect.bisect_right(ends, k)
            if i == len(elements):
                raise StructureMismatch(f"no statement {k} in {field} at depth {depth}")
            element, offset = elements[i], ends[i - 1] if i else 0
            simple = isinstance(element, (cst.SimpleStatementLine, cst.SimpleStatementSuite))
        else:
            offset = 0
            for element in cst_field(node, field):
                simple = isinstance(element, (cst.SimpleStatementLine, cst.SimpleStatementSuite))
                width = len(element.body) if simple else 1
                if k < offset + width:
                    break
                offset += width
            else:
                raise StructureMismatch(f"no statement {k} in {field} at depth {depth}")
        if depth == len(loc) - 1:
            if not simple:
                raise StructureMismatch("expected a simple statement")
            small = element.body[k - offset]
            want = _SMALL_TYPES.get(type(stmt))
            if want is not None and not isinstance(small, want):
                raise StructureMismatch(f"{type(small).__name__} where ast has {type(stmt).__name__}")
            return element, k - offset
        if simple:
            raise StructureMismatch("expected a compound statement")
        node = element
    raise StructureMismatch("empty location")


def _top_ends(module: cst.Module, node: cst.CSTNode, field: str) -> Tuple[Sequence[cst.CSTNode], List[int]]:
    """The top-level elements of ``field`` under ``node`` (the module) and, for each, the number
    of ast statements up to and including it: a statement each, the small statements of a line,
    as many as a partial module's filler stands for (transforms/partial.py). Kept for the last
    module (held): counted per site, a file of thousands of sites was quadratic."""
    last = _TOP[0]
    if last is not None and last[0] is module and last[1] == field:
        return last[2], last[3]
    elements = cst_field(node, field)
    ends: List[int] = []
    offset = 0
    for element in elements:
        simple = isinstance(element, (cst.SimpleStatementLine, cst.SimpleStatementSuite))
        offset += elided_width(element) or (len(element.body) if simple else 1)
        ends.append(offset)
    _TOP[0] = (module, field, elements, ends)
    return elements, ends


#: (module, field, its elements, their running widths) of the last module :func:`cst_line` read
_TOP: List[Optional[Tuple[cst.Module, str, Sequence[cst.CSTNode], List[int]]]] = rewrite_caches.held(None)


class InsertBefore(cst.CSTTransformer):
    """Insert planned statements before the planned small statements of each line.

    Only statement-level nodes are visited: expressions cannot hold a line.
    """

    _DESCEND = (
        cst.Module, cst.IndentedBlock, cst.If, cst.Else, cst.For, cst.While, cst.With, cst.Try,
        cst.TryStar, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally, cst.Match, cst.MatchCase,
        cst.FunctionDef, cst.ClassDef,
    )

    def __init__(self, plans: Dict[cst.CSTNode, Dict[int, List[str]]], path: Optional[Set[int]] = None) -> None:
        self.plans = plans
        self.path = path  # ids of the compound nodes holding a planned line (None: descend into all)
        self._applied = 0  # plans applied so far
        self._marks: List[int] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self._marks.append(self._applied)
        # only into the statements on the way to a planned line (a 50k-line file is otherwise
        # visited whole); blocks and clauses are reached only through such a statement
        if not isinstance(node, self._DESCEND):
            return False
        return self.path is None or id(node) in self.path or not isinstance(node, cst.BaseStatement)

    def on_leave(self, original_node, updated_node):
        # A subtree with no plan applied in it is given back as the very original node (libcst
        # rebuilds every node it visits): the pipeline then reuses the code generated for it,
        # instead of generating the whole module again (issue 9, item 13).
        mark = self._marks.pop()
        result = super().on_leave(original_node, updated_node)
        if result is updated_node and self._applied == mark:
            return original_node
        return result

    @staticmethod
    def _splice(body: Sequence[cst.BaseSmallStatement], plan: Dict[int, List[str]], from_index: int):
        out: List[cst.BaseSmallStatement] = []
        for i, small in enumerate(body):
            if i >= from_index and i in plan:
                prev = body[i - 1].semicolon if i > 0 else None
                semi = prev if isinstance(prev, cst.Semicolon) else cst.Semicolon(
                    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(" ")
                )
                out.extend(cst.Expr(parse_expression(t), semicolon=semi) for t in plan[i])
            out.append(small)
        return out

    def leave_SimpleStatementLine(self, original_node, updated_node):
        plan = self.plans.get(original_node)
        if not plan:
            return updated_node
        self._applied += 1
        updated_node = updated_node.with_changes(body=self._splice(updated_node.body, plan, 1))
        if 0 not in plan:
            return updated_node
        lines = [cst.SimpleStatementLine(body=[cst.Expr(parse_expression(t))]) for t in plan[0]]
        # comments and blank lines above the step stay above the inserted lines
        lines[0] = lines[0].with_changes(leading_lines=updated_node.leading_lines)
        return cst.FlattenSentinel([*lines, updated_node.with_changes(leading_lines=())])

    def leave_SimpleStatementSuite(self, original_node, updated_node):
        plan = self.plans.get(original_node)
        if not plan:
            return updated_node
        self._applied += 1
        return updated_node.with_changes(body=self._splice(updated_node.body, plan, 0))
