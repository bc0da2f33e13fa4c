"""A statement written as rows of generated text: code the rewrite emits and nobody walks again.

vectorize.recurrence writes each rewritten loop as about six times its lines (the first step,
the vectorized steps, the last step, the original loop as the fallback, each body as written).
It built them as libcst trees: the generated text parsed (from a cached parse of its shape) and
the loop body copied node by node for each place, then the pipeline turned the trees back into
text. On a file of thousands of loops that round trip was a fifth of the rewrite (issue 19
item 13). An :class:`Emitted` node keeps the generated lines as text and the user's statements
as the nodes they are; its code is what the round trip wrote, byte for byte:

* a text row is one logical line of code or one comment, written at the row's depth below the
  statement's own indentation with the module's indent unit (what a parsed block of generated
  four-space text gets: ``IndentedBlock.indent`` None);
* a node row is written by its own codegen, that many indent units deeper.

:func:`rows` turns generated lines into text rows and refuses what the parse would have written
otherwise (a line spanning lines, a blank line, a comment no statement follows in its stretch):
the caller then builds the tree as before.

Nothing analyses an ``Emitted`` node: before a later transform reads a statement holding one, the
pipeline replaces each by the tree of its code (:func:`realized`; ``partial.build`` for a partial
module, where only the statements a transform asks for are realized).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, FrozenSet, List, Optional, Sequence, Tuple, Union, cast

import libcst as cst
from libcst._add_slots import add_slots
from libcst._nodes.internal import CodegenState, visit_sequence
from libcst._visitors import CSTVisitorT

#: (depth, one line of generated code or comment) or (depth, a statement written by codegen)
Row = Tuple[int, Union[str, cst.BaseStatement]]


@add_slots
@dataclasses.dataclass(frozen=True)
class Emitted(cst.BaseStatement):
    """One statement (perhaps compound) written from :data:`Row` s."""

    rows: Sequence[Row]
    leading_lines: Sequence[cst.EmptyLine] = ()

    def _visit_and_replace_children(self, visitor: CSTVisitorT) -> "Emitted":
        out: List[Row] = []
        for depth, row in self.rows:
            if not isinstance(row, str):
                new = row.visit(visitor)
                if not isinstance(new, cst.BaseStatement):  # removed or flattened: not one row
                    raise TypeError("a statement of an Emitted node must stay one statement")
                row = new
            out.append((depth, row))
        return Emitted(rows=tuple(out), leading_lines=visit_sequence(self, "leading_lines", self.leading_lines, visitor))

    def _codegen_impl(self, state: CodegenState) -> None:
        self.write(state, lambda node, st: node._codegen(st))

    def write(self, state: CodegenState, gen: Callable[[cst.CSTNode, CodegenState], None]) -> None:
        """The rows into ``state``, each node (leading line or statement row) written by ``gen``:
        libcst's own codegen here, ``scalebox_cst.fastcode``'s where it writes the statement."""
        for line in self.leading_lines:
            gen(line, state)
        unit = state.default_indent
        for depth, row in self.rows:  # (through the state's methods: a position-tracking state counts)
            if isinstance(row, str):
                state.add_indent_tokens()
                state.add_token(unit * depth + row)
                state.add_token(state.default_newline)
            else:  # (under one more, empty, indent token: a statement placed, even at depth 0,
                # whose backslash continuations move with it: scalebox_cst.continuation)
                state.increase_indent("")
                for _ in range(depth):
                    state.increase_indent(unit)
                gen(row, state)
                for _ in range(depth + 1):
                    state.decrease_indent()


def realized(stmt: cst.BaseStatement, indent: str = "", unit: str = "    ") -> cst.BaseStatement:
    """``stmt`` with each :class:`Emitted` statement in it (at any depth of its blocks) replaced by
    the libcst tree of its code, for a transform that reads the statement: its code is the same
    (the rows parse back to what they write: the round trip of :func:`rows`), its nodes are real.
    ``indent``: where ``stmt`` stands, ``unit``: the module's indent (for the backslash
    continuations in it, which know the indentation of their statement: scalebox_cst.continuation)."""
    if isinstance(stmt, Emitted):
        return _tree_of(stmt, indent, unit)
    inner = indent
    if isinstance(stmt, (cst.IndentedBlock, cst.Match)):  # (its statements, its cases: one level in)
        inner += unit if stmt.indent is None else stmt.indent
    changes = {}
    for field in _BLOCKS:
        value = getattr(stmt, field, None)
        if value is None:
            continue
        new = _in_block(value, inner if field in ("body", "cases") else indent, unit)
        if new is not value:
            changes[field] = new
    return stmt.with_changes(**changes) if changes else stmt


def realized_module(module: cst.Module, ids: FrozenSet[int]) -> cst.Module:
    """``module`` with its top-level statements whose ids are in ``ids`` :func:`realized`."""
    body = [realized(s, "", module.default_indent) if id(s) in ids else s for s in module.body]
    return module.with_changes(body=body) if any(a is not b for a, b in zip(body, module.body)) else module


#: the fields of compound statements (and of their clauses) that hold statements
_BLOCKS = ("body", "orelse", "handlers", "finalbody", "cases")


def _in_block(value: object, indent: str, unit: str) -> object:
    """A block field's value (a block, a clause, an ``elif``, a list of them) with the Emitted
    statements in it realized, rebuilt only on the way to them."""
    if isinstance(value, (list, tuple)):
        out = [_in_block(v, indent, unit) for v in value]
        return value if all(a is b for a, b in zip(out, value)) else type(value)(out)
    return realized(value, indent, unit) if isinstance(value, cst.CSTNode) else value  # type: ignore[arg-type]


def _tree_of(node: Emitted, indent: str, unit: str) -> cst.BaseStatement:
    from scalebox_cst import continuation
    from scalebox_cst.transforms.analysis.cstclone import parse_statements  # (imports libcst's parser)

    code = cst.Module(body=[cast(Any, node.with_changes(leading_lines=()))]).code  # four spaces a level
    parsed = parse_statements(code)
    if len(parsed) != 1:  # pragma: no cover - rows write one statement
        raise ValueError("an Emitted node wrote more than one statement")
    # its continuation lines as a parse of the code where it stands gives them
    tree = continuation.rehomed(parsed[0], indent, unit, code)
    return tree.with_changes(leading_lines=node.leading_lines)


def rows(lines: Sequence[str], depth: int) -> Optional[List[Row]]:
    """Text rows of ``lines`` (generated code indented by four spaces per level) at ``depth``; None
    where a parse of them, as one stretch, would not give back each line at its level: a line
    holding a line break, blank, indented by other than whole levels, ending in a backslash, or a
    comment that no statement follows within the stretch (the parse hangs it on what comes next)."""
    out: List[Row] = []
    pending_comment = False
    for line in lines:
        text = line.lstrip(" ")
        indent = len(line) - len(text)
        if not text or indent % 4 or "\n" in line or "\r" in line or "\t" in line or "\f" in line \
                or text != text.rstrip() or text.endswith("\\"):
            return None
        pending_comment = text.startswith("#")
        out.append((depth + indent // 4, text))
    return None if pending_comment else out


def shifted(found: Sequence[Row], by: int) -> List[Row]:
    """``found`` ``by`` levels deeper."""
    return [(depth + by, row) for depth, row in found]


__all__ = ["Emitted", "Row", "realized", "realized_module", "rows", "shifted"]
