"""Loop targets and bodies: the names a target binds, a body as flat small statements, and why a
loop may exit early (break, return, raise, yield...). Shared by every loop rewrite.
"""
from __future__ import annotations

from typing import List, Optional

import libcst as cst

from .cstwalk import instances


#: the fields of compound statements (and their clauses) that hold statements, in source order
_BLOCK_FIELDS = ("body", "handlers", "orelse", "finalbody", "cases")


def target_names(target: cst.BaseExpression) -> Optional[List[str]]:
    """Names bound by a ``for`` target made only of names and tuples/lists of names, else None."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        out: List[str] = []
        for el in target.elements:
            if isinstance(el, cst.StarredElement):
                return None
            sub = target_names(el.value)
            if sub is None:
                return None
            out.extend(sub)
        return out
    return None


def flat_body(body: cst.BaseSuite) -> Optional[List[cst.BaseSmallStatement]]:
    """The small statements of a suite made only of simple statement lines, else None."""
    lines = [body] if isinstance(body, cst.SimpleStatementSuite) else list(body.body)
    out: List[cst.BaseSmallStatement] = []
    for line in lines:
        if isinstance(line, cst.SimpleStatementSuite) or isinstance(line, cst.SimpleStatementLine):
            out.extend(line.body)
        else:
            return None
    return out


class _ExitFinder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.reason: Optional[str] = None

    def _set(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def visit_Break(self, node: cst.Break) -> None:
        self._set("the loop body can exit early (break)")

    def visit_Continue(self, node: cst.Continue) -> None:
        self._set("the loop body can skip iterations (continue)")

    def visit_Return(self, node: cst.Return) -> None:
        self._set("the loop body can exit early (return)")

    def visit_Raise(self, node: cst.Raise) -> None:
        self._set("the loop body can raise")

    def visit_Yield(self, node: cst.Yield) -> None:
        self._set("the loop body yields")

    def visit_Await(self, node: cst.Await) -> None:
        self._set("the loop body awaits")

    def visit_Global(self, node: cst.Global) -> None:
        self._set("the loop body declares global names")

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self._set("the loop body declares nonlocal names")

    def visit_Del(self, node: cst.Del) -> None:
        self._set("the loop body deletes names")

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self._set("the loop body defines a function")
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self._set("the loop body defines a class")
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        self._set("the loop body creates a lambda (it may capture the loop variable)")
        return False

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._set("the loop body uses an assignment expression (:=)")


def early_exit_reason(node: cst.CSTNode) -> Optional[str]:
    """Why the statements under ``node`` cannot be run as one vectorized step (None: they can)."""
    if next(instances(node, _EXITS), None) is None:
        return None  # none of the nodes _ExitFinder reports (its visit costs ~20x a field walk)
    finder = _ExitFinder()
    node.visit(finder)
    return finder.reason


#: the nodes :class:`_ExitFinder` has a reason for
_EXITS = (cst.Break, cst.Continue, cst.Return, cst.Raise, cst.Yield, cst.Await, cst.Global, cst.Nonlocal,
          cst.Del, cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.NamedExpr)


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def trailing_lines(stmt: cst.CSTNode) -> int:
    """How many blank and comment lines end ``stmt`` after the last line of its last statement:
    libcst keeps them in the footer of the last block (and of the blocks that block ends with),
    where ``ast`` and libcst's positions end the statement before them. A rewrite that keeps the
    statement as its fallback writes them after it, so a site's span reaches them."""
    total = 0
    node: Optional[cst.CSTNode] = stmt
    while node is not None and not isinstance(node, (cst.Try, cst.TryStar, cst.Match)):
        orelse = getattr(node, "orelse", None)
        while isinstance(orelse, cst.If):  # an elif chain: its last branch
            node, orelse = orelse, orelse.orelse
        block = orelse.body if orelse is not None else getattr(node, "body", None)
        if not isinstance(block, cst.IndentedBlock):
            break
        total += len(block.footer)
        node = block.body[-1] if block.body else None
    return total
