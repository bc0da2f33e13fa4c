"""Tuple assignments of per-step values (``discount_t, delta_t = discounts[:, i, :], deltas[:, i, :]``)
read as one assignment per name, for the analysis only.

``a, b = e1, e2`` evaluates ``e1`` then ``e2``, then binds ``a`` and ``b``; ``a = e1`` then
``b = e2`` binds the same values whenever neither expression reads a name the statement binds
(``a, b = b, a`` swaps: left as it is) and no name is bound twice. The peeled steps and the loop
kept in the else branch run the statement as written; only the analysis, which reads one name per
assignment, sees it split. Anything else (starred targets, subscript targets, a right-hand side
that is not a tuple of as many expressions) is left for the body's checks to report.
"""
from __future__ import annotations

from typing import List, Optional

import libcst as cst

from .syntax import _names_read, _of_type


def _split(small: cst.BaseSmallStatement) -> Optional[List[cst.Assign]]:
    if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
        return None
    tgt, value = small.targets[0].target, small.value
    if not (isinstance(tgt, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List))):
        return None
    names = []
    for el in tgt.elements:
        if not (isinstance(el, cst.Element) and isinstance(el.value, cst.Name)):
            return None
        names.append(el.value.value)
    if len(set(names)) != len(names) or len(value.elements) != len(names) \
            or not all(isinstance(el, cst.Element) for el in value.elements):
        return None
    if any(set(names) & _names_read(el.value) for el in value.elements):
        return None
    return [cst.Assign(targets=[cst.AssignTarget(target=cst.Name(n))], value=el.value)
            for n, el in zip(names, value.elements)]


class _Split(cst.CSTTransformer):
    """:func:`split_unpacking`'s pass (at module level: see body._Resolve)."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = False

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine,
                                  updated: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        body: List[cst.BaseSmallStatement] = []
        for small in updated.body:
            parts = _split(small)
            if parts is None:
                body.append(small)
            else:
                body.extend(parts)
                self.changed = True
        if len(body) == len(updated.body):
            return updated
        body = [b.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) for b in body]
        return updated.with_changes(body=body)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:  # a definition is reported as such
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False


def split_unpacking(node: cst.For) -> cst.For:
    """``node`` with each ``a, b = e1, e2`` statement of its body (at any depth of ``if``
    blocks) as ``a = e1; b = e2`` where that binds the same values; ``node`` itself when none is."""

    if not any(isinstance(n.targets[0].target, (cst.Tuple, cst.List))
               for n in _of_type(node.body, cst.Assign)):  # the common case, without a transformer pass
        return node
    tr = _Split()
    body = node.body.visit(tr)
    return node.with_changes(body=body) if tr.changed else node
