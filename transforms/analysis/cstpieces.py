"""A long ``def``/``class`` parsed by libcst in pieces of its body, then put together.

libcst's parse costs more per line the longer the source it is given: measured on the
generated GAE loops of ``bench_scaling``'s ``loops`` shape, ~0.52 ms per 9-line loop in pieces of
~150 lines, 0.59 at ~600, 0.80 at ~2,300 and 1.06 in one 20k-line function. A dense file's
rewrite parses each top-level statement holding a site (:mod:`transforms.partial`), and one such
statement can be most of the file (issue 19 item 13: one function of 50k lines).

:func:`parse_chunk` parses such a statement's chunk as its header with the first statements of
its body (a module of its own, as :mod:`~transforms.partial` parses any chunk), then each further
run of body statements under a header of its own (``if 1:``, the lines as they are, so strings,
continuation lines and comments keep their columns), and moves those statements into the first
piece's block. A run starts only at a statement on a line of its own, at the block's four-space
indent, after nothing but empty lines: libcst gives the comment lines after a block to that block
or to the next statement by their indent, and an empty line to the next statement, so every node
and whitespace field is the one a whole parse gives (``deep_equals``: tests/transforms/test_partial.py
compares every ``def``/``class`` of the corpus and of public files split at every point).
Anything else (a body on the header's line, another indent, a piece that does not parse to the
one statement) is parsed whole, as before.
"""
from __future__ import annotations

import ast
from typing import List, Optional, Sequence

import libcst as cst

from . import cstparse

#: a chunk shorter than this many lines is parsed whole (the gain is ~5% at 300 lines)
MIN_LINES = 600
#: about how many lines each piece holds
PIECE_LINES = 150
_HEADER = "if 1:\n"
_BLOCK_INDENT = "    "
_SPLIT = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def parse_chunk(text: str, first_line: int, group: Sequence[ast.stmt],
                min_lines: int = MIN_LINES, piece_lines: int = PIECE_LINES) -> cst.Module:
    """``cstparse.parse_module(text)``, where ``text`` is the chunk starting at line
    ``first_line`` of the file and holding the top-level statements ``group`` (their ``ast``)."""
    lines = text.splitlines(keepends=True)
    cuts = _cuts(lines, first_line, group, min_lines, piece_lines) if len(lines) >= min_lines else []
    if not cuts:
        return cstparse.parse_module(text)
    made = _assembled(lines, cuts)
    return made if made is not None else cstparse.parse_module(text)


def _cuts(lines: List[str], first_line: int, group: Sequence[ast.stmt], min_lines: int, piece_lines: int) -> List[int]:
    """Indices into ``lines`` where a piece starts (after the first), or none."""
    if len(group) != 1 or not isinstance(group[0], _SPLIT) or len(group[0].body) < 2:
        return []
    body = group[0].body
    cuts: List[int] = []
    last = 0
    for prev, st in zip(body, body[1:]):
        begin = min([st.lineno, *(d.lineno for d in getattr(st, "decorator_list", ()))]) - first_line
        after = (prev.end_lineno or prev.lineno) - first_line + 1  # the line after ``prev``
        if begin - last < piece_lines or not after <= begin < len(lines):
            continue
        line = lines[begin]
        if not line.startswith(_BLOCK_INDENT) or line[len(_BLOCK_INDENT)] in " \t\n":
            continue
        if any(lines[i] != "\n" for i in range(after, begin)):  # only empty lines between
            continue
        if st.col_offset != len(_BLOCK_INDENT) and not getattr(st, "decorator_list", None):
            continue
        cuts.append(after)
        last = after
    if cuts and len(lines) - cuts[-1] < piece_lines // 3:
        cuts.pop()  # a short last piece costs a header and a walk for nothing
    return cuts


def _assembled(lines: List[str], cuts: List[int]) -> Optional[cst.Module]:
    """The module of the first piece with every later piece's statements moved into its block,
    or None where some piece is not the shape asked for."""
    first = cstparse.parse_module("".join(lines[: cuts[0]]))
    if len(first.body) != 1 or first.footer or first.default_indent != _BLOCK_INDENT:
        return None
    top = first.body[0]
    if not isinstance(top, (cst.FunctionDef, cst.ClassDef)) or not isinstance(top.body, cst.IndentedBlock) \
            or top.body.footer or top.body.indent is not None:
        return None
    stmts = list(top.body.body)
    footer: Sequence[cst.EmptyLine] = ()
    for k, begin in enumerate(cuts):
        end = cuts[k + 1] if k + 1 < len(cuts) else len(lines)
        piece = cstparse.parse_module(_HEADER + "".join(lines[begin:end]))
        if len(piece.body) != 1 or piece.footer or piece.header or piece.default_indent != _BLOCK_INDENT:
            return None
        wrapper = piece.body[0]
        if not isinstance(wrapper, cst.If) or wrapper.orelse is not None or not isinstance(wrapper.body, cst.IndentedBlock) \
                or wrapper.body.indent is not None or wrapper.leading_lines:
            return None
        if wrapper.body.footer and end != len(lines):
            return None
        stmts.extend(wrapper.body.body)
        footer = wrapper.body.footer
    block = top.body.with_changes(body=stmts, footer=footer)
    return first.with_changes(body=[top.with_changes(body=block)])
