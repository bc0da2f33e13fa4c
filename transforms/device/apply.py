"""Making the planned edits: only the edited nodes and their ancestors are rebuilt (one pass
that enters only the paths to the edits, so every other byte is kept); libcst's transformer over
the whole module where that cannot be done."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Dict, Sequence, Tuple

import libcst as cst

from ..base import FileContext
from .edits import Edit, _drop_statements
from .locate import _Locator, _Miss

if TYPE_CHECKING:
    from .analyzer import _Analyzer


def _edited(node, fns: Sequence[Edit]):
    for fn in fns:
        if isinstance(node, cst.RemovalSentinel):
            break
        node = fn(node)
    return node


def _with_children(node: cst.CSTNode, new: Dict[cst.CSTNode, object]) -> cst.CSTNode:
    """``node`` with some of its children replaced (removed from a sequence when RemoveFromParent),
    as libcst's own transformer would rebuild it."""
    changes = {}
    seen = 0
    for field in dataclasses.fields(node):
        value = getattr(node, field.name)
        if isinstance(value, cst.CSTNode):
            if value in new:
                if isinstance(new[value], cst.RemovalSentinel):
                    raise _Miss  # not in a sequence: libcst's transformer decides
                changes[field.name] = new[value]
                seen += 1
        elif isinstance(value, (tuple, list)):
            hits = [v for v in value if isinstance(v, cst.CSTNode) and v in new]
            if hits:
                seen += len(hits)
                changes[field.name] = [
                    new.get(v, v) for v in value if not isinstance(new.get(v, v), cst.RemovalSentinel)
                ]
    if seen != len(new):
        raise _Miss
    return node.with_changes(**changes)


def _rebuild(module: cst.Module, edits, drops, inserts, parent: Dict[cst.CSTNode, cst.CSTNode]) -> cst.Module:
    """The module with the edits made, rebuilding only the edited nodes and their ancestors
    (deepest first), so nothing else is visited."""
    depth: Dict[cst.CSTNode, int] = {module: 0}

    def depth_of(node: cst.CSTNode) -> int:
        chain = []
        while node not in depth:
            chain.append(node)
            node = parent[node]  # KeyError: not linked to the module
        d = depth[node]
        for n in reversed(chain):
            d += 1
            depth[n] = d
        return depth[chain[0]] if chain else d

    nodes = set(parent) | set(edits) | set(drops) | {module}
    pending: Dict[cst.CSTNode, Dict[cst.CSTNode, object]] = {}
    for node in sorted(nodes, key=depth_of, reverse=True):
        new = node
        children = pending.pop(node, None)
        if children:
            new = _with_children(node, children)
        if node in edits:
            new = _edited(new, edits[node])
        if node in drops and not isinstance(new, cst.RemovalSentinel):
            new = _drop_statements(new, drops[node])
        if node is module:
            return _inserted(new, inserts)
        pending.setdefault(parent[node], {})[node] = new
    raise _Miss


def _inserted(module: cst.Module, inserts: Sequence[Tuple[int, str]]) -> cst.Module:
    if not inserts:
        return module
    body = list(module.body)
    for index, text in sorted(inserts, reverse=True):
        body.insert(index, cst.parse_statement(text + "\n"))
    return module.with_changes(body=body)


class _Apply(cst.CSTTransformer):
    """The same edits through libcst's transformer over the whole module (the fallback)."""

    def __init__(self, module: cst.Module, edits, drops, inserts) -> None:
        self.module, self.edits, self.drops, self.inserts = module, edits, drops, inserts

    def on_leave(self, original_node, updated_node):
        fns = self.edits.get(original_node)
        if fns:
            updated_node = _edited(updated_node, fns)
        drops = self.drops.get(original_node)
        if drops:
            updated_node = _drop_statements(updated_node, drops)
        if original_node is self.module:
            updated_node = _inserted(updated_node, self.inserts)
        return updated_node


def _apply(ctx: FileContext, an: _Analyzer) -> cst.Module:
    """The module with ``an``'s edits made: nodes found statement by statement (by positions over
    the whole module only where that cannot place one), then only their ancestors rebuilt."""
    try:
        locator = _Locator(ctx, an.src)
        edits, drops = locator.plan(an)
    except Exception:  # noqa: BLE001 - _Miss, or a libcst whose code generation this search misreads
        locator = _Locator(ctx, an.src, fast=False)
        edits, drops = locator.plan(an)
    module = ctx.module
    try:
        return _rebuild(module, edits, drops, an.module_inserts, locator.parent)
    except (_Miss, KeyError):  # an unusual shape: libcst's transformer over the whole module
        return module.visit(_Apply(module, edits, drops, an.module_inserts))
