"""Finding loops and replacing them: statement-list walks shared by ast and libcst, the names a
module binds, loops kept by an earlier rewrite.
"""
from __future__ import annotations

import ast
from typing import Dict, Optional, Sequence, Set

import libcst as cst
import libcst.matchers as m

from ... import statement_memo
from ...analysis.scopes import bound_anywhere

from .syntax import _code, _stmts


_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def _statement_fors(stmts, lib, before: Optional[dict] = None):
    """For statements in source order, walking statement lists only (``lib`` is ``ast`` or
    ``cst``: both parsers nest statements the same way, so the i-th loops correspond).
    ``before``: filled with id(loop) -> (its statement list, its index there)."""
    for i, st in enumerate(stmts):
        if isinstance(st, lib.For) or (lib is ast and isinstance(st, ast.AsyncFor)):
            if before is not None:
                before[id(st)] = (stmts, i)
            yield st
        if lib is cst and not isinstance(st, cst.BaseCompoundStatement):
            continue
        for field in _BLOCKS:
            block = getattr(st, field, None)
            if block is None:
                continue
            if lib is cst:
                if isinstance(block, cst.If):  # elif
                    yield from _statement_fors([block], lib, before)
                    continue
                if isinstance(block, (cst.Else, cst.Finally)):
                    block = block.body
                if isinstance(block, cst.BaseSuite):
                    yield from _statement_fors(_stmts(block), lib, before)
                elif isinstance(block, (list, tuple)):  # handlers, cases
                    for h in block:
                        yield from _statement_fors(_stmts(h.body), lib, before)
            else:
                if field in ("handlers", "cases"):
                    for h in block:
                        yield from _statement_fors(h.body, lib, before)
                else:
                    yield from _statement_fors(block, lib, before)


def _ast_bound_of(tree: ast.Module, names: Sequence[str]) -> Set[str]:
    """Those of ``names`` the module binds anywhere: on a registered module version, only the
    top-level statements that spell one of them are walked (statement_memo.mentioning)."""
    parts = statement_memo.mentioning(tree, "bound", _ast_bound, names, statement_memo.may_bind(names))
    found = set().union(*parts) if parts is not None else _ast_bound(tree)
    return found & set(names)


def _ast_bound(tree: ast.AST) -> Set[str]:
    """Names the module binds anywhere (to tell a shadowed ``reversed`` from the builtin)."""
    return bound_anywhere(tree)


def _replace_statements(node: cst.CSTNode, replace: Dict[cst.For, cst.CSTNode]) -> cst.CSTNode:
    """``node`` with the statements in ``replace`` swapped, rebuilding only the blocks on the way
    to them (a full libcst transformer pass costs far more on a large file)."""
    body, changed = _Replacer(replace).stmts(node.body)  # type: ignore[attr-defined]
    return node.with_changes(body=body) if changed else node


class _Replacer:
    """The walk of :func:`_replace_statements` (methods, not closures that call each other: that
    cycle kept the function's tree alive until a garbage collection)."""

    def __init__(self, replace: Dict[cst.For, cst.CSTNode]) -> None:
        self.replace = replace

    def stmts(self, seq):
        out, changed = [], False
        for st in seq:
            new = self.replace.get(st, st) if isinstance(st, cst.For) else st
            if new is st and isinstance(st, cst.BaseCompoundStatement):
                new = self.compound(st)
            changed = changed or new is not st
            if isinstance(new, cst.FlattenSentinel):  # statements bound before the rewritten loop
                out.extend(new.nodes)
            else:
                out.append(new)
        return (out, True) if changed else (seq, False)

    def suite(self, block):
        if isinstance(block, cst.IndentedBlock):
            body, changed = self.stmts(block.body)
            return block.with_changes(body=body) if changed else block
        return block  # a one-line suite holds no loop

    def compound(self, st):
        changes = {}
        body = getattr(st, "body", None)
        if isinstance(body, cst.BaseSuite):
            new = self.suite(body)
            if new is not body:
                changes["body"] = new
        orelse = getattr(st, "orelse", None)
        if isinstance(orelse, cst.If):
            new = self.compound(orelse)
            if new is not orelse:
                changes["orelse"] = new
        elif isinstance(orelse, cst.Else):
            new = self.suite(orelse.body)
            if new is not orelse.body:
                changes["orelse"] = orelse.with_changes(body=new)
        final = getattr(st, "finalbody", None)
        if isinstance(final, cst.Finally):
            new = self.suite(final.body)
            if new is not final.body:
                changes["finalbody"] = final.with_changes(body=new)
        for field in ("handlers", "cases"):
            items = getattr(st, field, None)
            if items:
                new_items = [h.with_changes(body=self.suite(h.body)) if self.suite(h.body) is not h.body else h for h in items]
                if any(a is not b for a, b in zip(new_items, items)):
                    changes[field] = new_items
        return st.with_changes(**changes) if changes else st


#: ``range(left - 1, -1, -1)``: the loop an earlier rewrite ends its guarded branch with, which
#: runs the steps its ways left to run as written
_STEPS_LEFT = m.Call(func=m.Name("range"), args=[
    m.Arg(m.BinaryOperation(left=m.Name(), operator=m.Subtract(), right=m.Integer("1"))),
    m.Arg(m.UnaryOperation(operator=m.Minus(), expression=m.Integer("1"))),
    m.Arg(m.UnaryOperation(operator=m.Minus(), expression=m.Integer("1")))])

#: the guard calls whose ``if`` keeps the original loops in its else branch
_GUARD_CALLS = (".recurrence_ok(", ".quadratic_ok(", ".carry_ok(")


def _kept_loops(module: cst.Module) -> Set[cst.For]:
    """Loops kept in the else branch of an earlier rewrite (left as they are)."""
    kept: Set[cst.For] = set()
    _gather_kept(module.body, kept)
    return kept


def _gather_kept(stmts, kept: Set[cst.For]) -> None:
    for st in stmts:
        if not isinstance(st, cst.BaseCompoundStatement):
            continue
        if isinstance(st, cst.If) and isinstance(st.orelse, cst.Else) and any(
                g in _code(st.test) for g in _GUARD_CALLS):
            kept.update(x for x in _stmts(st.orelse.body) if isinstance(x, cst.For))
            last = _stmts(st.body)[-1] if _stmts(st.body) else None
            if isinstance(last, cst.For) and m.matches(last.iter, _STEPS_LEFT):
                kept.add(last)  # the loop of the steps left as written (build._layout)
        for field in _BLOCKS:
            block = getattr(st, field, None)
            if isinstance(block, cst.If):
                _gather_kept([block], kept)
            elif isinstance(block, (cst.Else, cst.Finally)):
                _gather_kept(_stmts(block.body), kept)
            elif isinstance(block, cst.BaseSuite):
                _gather_kept(_stmts(block), kept)
            elif isinstance(block, (list, tuple)):
                for h in block:
                    _gather_kept(_stmts(h.body), kept)
