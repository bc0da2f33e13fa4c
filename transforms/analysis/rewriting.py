"""Rebuilding a module with some nodes replaced (only the nodes on the way to what changed) and the
scope-aware transformer the loop rewrites build on.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from scalebox_cst.report import Site

from .scopes import builtin_checker
from .bodies import trailing_lines
from .loops import is_runtime_guard


class _PathReplacer(cst.CSTTransformer):
    def __init__(self, replacements, path: Set[cst.CSTNode]) -> None:
        super().__init__()
        self.replacements = replacements
        self.path = path

    def on_visit(self, node: cst.CSTNode) -> bool:
        return node in self.path

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):
        return self.replacements.get(original, updated)


def replace_nodes(module: cst.Module, replacements: Dict[cst.CSTNode, object], parent: Dict[cst.CSTNode, cst.CSTNode]) -> cst.Module:
    """``module`` with each key of ``replacements`` (original nodes) swapped for its value (a node
    or a ``FlattenSentinel`` of statements). ``parent`` must lead from every key to the module;
    only the nodes on those paths are rebuilt (a full transformer pass costs far more)."""
    path: Set[cst.CSTNode] = set()
    for node in replacements:
        up = parent.get(node)
        while up is not None and up not in path:
            path.add(up)
            up = parent.get(up)
    return module.visit(_PathReplacer(replacements, path))


class ScopedRewriter(cst.CSTTransformer):
    """What every vectorize.* rewriter tracks while it walks: the enclosing scopes (module,
    functions, classes) and whether each enclosing ``if`` is a guard another rewrite emitted
    (loops kept under such a guard are never rewritten again). Run over the whole module (the
    fallback) or driven node by node by the transform, which then sets ``scopes`` and ``guards``
    itself and gives the nodes' lines in ``spans`` (from the ast, so no PositionProvider)."""

    transform_id = ""

    def __init__(self, ctx, sites: List[Site], spans: Optional[Dict[cst.CSTNode, Tuple[int, int]]] = None) -> None:
        super().__init__()
        self.ctx = ctx
        self.sites = sites
        self.spans = spans
        self.scopes: List[cst.CSTNode] = []
        self.guards: List[bool] = []
        self.builtin_ok = builtin_checker(ctx.tree)

    def make_site(self, node: cst.CSTNode, action: str, reason: str, exactness: Optional[str] = None,
                  also: Sequence[cst.CSTNode] = ()) -> Site:
        """The site of ``node`` (with the blank and comment lines ending its blocks); its span
        reaches the statements in ``also`` too (others the rewrite changed, after it in its block)."""
        line, end = self.span_of(node)
        end += trailing_lines(node)
        for other in also:
            end = max(end, self.span_of(other)[1] + trailing_lines(other))
        return Site(self.transform_id, line, end, action, reason, exactness)

    def span_of(self, node: cst.CSTNode) -> Tuple[int, int]:
        """``node``'s first and last line: from ``spans`` (the ``ast``'s, which pairs each small
        statement of a line with a statement of its own), else from libcst's positions."""
        spans = self.spans
        if spans is not None:
            if node in spans:
                return spans[node]
            if isinstance(node, cst.SimpleStatementLine):
                found = [spans[s] for s in node.body if s in spans]
                if found:
                    return min(a for a, _ in found), max(b for _, b in found)
        return self.ctx.span(node)

    def visit_Module(self, node: cst.Module) -> None:
        self.scopes.append(node)

    def visit_If(self, node: cst.If) -> None:
        self.guards.append(is_runtime_guard(node.test, self.ctx.imports))

    def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
        self.guards.pop()
        return updated

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scopes.append(node)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.scopes.append(node)

    def leave_FunctionDef(self, original, updated):
        self.scopes.pop()
        return updated

    def leave_ClassDef(self, original, updated):
        self.scopes.pop()
        return updated


def plain_whitespace(ws: cst.BaseParenthesizableWhitespace) -> bool:
    """Whitespace with no comment in it: moving or dropping it (the newline an argument had
    before ``)``) takes no comment away from its code."""
    if isinstance(ws, cst.SimpleWhitespace):
        return True
    return isinstance(ws, cst.ParenthesizedWhitespace) and ws.first_line.comment is None \
        and all(e.comment is None for e in ws.empty_lines)
