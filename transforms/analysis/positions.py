"""Positions of the few statements a transform reports on, without positioning the whole module.

libcst's ``PositionProvider`` positions every node of a module (a codegen of all of it). A
transform that decides a handful of calls in a training script's ``__main__`` block (most of the
file) paid that for a site or two: ~30% of ``hot.fresh_on_device`` on CleanRL's scripts. Here
each statement that holds a call is positioned in a module of its own and moved to its place in
the file: it is printed inside a block of the file's indentation at its first line (a statement
printed alone loses its blocks' indentation), so its lines are the file's, moved by whole lines.
That is the whole module's answer where the printed lines are the file's, which is checked (an
``elif`` printed alone reads ``if``: then nothing is positioned here). :class:`Positions` answers a node outside those statements by positioning the
whole module, as before.
"""
from __future__ import annotations

import ast
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, MetadataWrapper, PositionProvider

from scalebox_cst.textlines import physical_lines

from .statements import CstStatements, Holding, first_line


class Positions(Dict[cst.CSTNode, CodeRange]):
    """Ranges known for some nodes; any other node asked for positions the whole module
    (``whole()``) once, so the answer is always ``PositionProvider``'s."""

    def __init__(self, known: Dict[cst.CSTNode, CodeRange], whole: Callable[[], Mapping[cst.CSTNode, CodeRange]]) -> None:
        super().__init__(known)
        self._whole: Optional[Callable[[], Mapping[cst.CSTNode, CodeRange]]] = whole

    def __missing__(self, node: cst.CSTNode) -> CodeRange:
        if self._whole is None:
            raise KeyError(node)
        found, self._whole = self._whole(), None
        self.update(found)
        return found[node]


#: blank lines, comments, newlines and whitespace: no transform reports on them, and where libcst
#: counts a blank line's indentation differs between a statement alone and in its block
_LAYOUT = (cst.EmptyLine, cst.Comment, cst.Newline, cst.TrailingWhitespace, cst.BaseParenthesizableWhitespace)


def innermost(held: Holding) -> Optional[List[Tuple[cst.BaseStatement, ast.stmt]]]:
    """For each wanted line of ``held`` (:func:`.statements.holding`), the innermost statement that
    holds it: a libcst statement (a simple statement's whole line; a one-line suite's compound
    statement) with the ``ast`` of its first statement there. None where a line lies in no
    statement."""
    walk = held.walk
    best: Dict[int, Tuple[cst.CSTNode, ast.stmt]] = {}
    for a, c, lines in held.pairs:  # pre-order: a statement after those that hold it
        for line in lines:
            kept = best.get(line)
            if kept is None or _unit(walk, kept[0]) is not _unit(walk, c):  # ``a; b``: the line's first
                best[line] = (c, a)
    out: List[Tuple[cst.BaseStatement, ast.stmt]] = []
    seen = set()
    for line in held.lines:
        if line not in best:
            return None
        c, a = best[line]
        unit = _unit(walk, c)
        if unit is None:
            return None
        if id(unit) not in seen:
            seen.add(id(unit))
            out.append((unit, a))
    return out


def _unit(walk: CstStatements, node: cst.CSTNode) -> Optional[cst.BaseStatement]:
    """The statement ``node`` (a walk entry) is printed with: itself, or the line or compound
    statement holding a small statement."""
    up: Optional[cst.CSTNode] = node
    while up is not None and not isinstance(up, cst.BaseStatement):
        up = walk.parent.get(up)
    return up


def alone(module: cst.Module, units: Sequence[Tuple[cst.BaseStatement, ast.stmt]],
          file_lines: Sequence[str]) -> Optional[Dict[cst.CSTNode, CodeRange]]:
    """``PositionProvider``'s ranges, in the file, of every node of each statement of ``units``
    (a statement of ``module`` at any depth, with its ``ast``): each positioned in a module of its
    own, inside a block of the file's indentation there, and moved to its lines; None where the
    printed lines of a statement are not the file's (see the module docstring). ``file_lines``:
    the file's physical lines."""
    out: Dict[cst.CSTNode, CodeRange] = {}
    for statement, a in units:
        if a.lineno > len(file_lines):
            return None
        head = file_lines[a.lineno - 1]
        indent = head[: len(head) - len(head.lstrip(" \t"))]
        if indent:  # printed in a block of that indentation, its lines are the file's
            inner: cst.BaseStatement = cst.If(test=cst.Name("_"), body=cst.IndentedBlock(body=[statement], indent=indent))
        else:
            inner = statement
        single = module.with_changes(body=[inner], header=(), footer=())
        found = MetadataWrapper(single, unsafe_skip_copy=True).resolve(PositionProvider)
        where = found[statement]  # libcst's range of a decorated def starts at ``def``, as ast's lineno
        shift = a.lineno - where.start.line
        top = where.start.line - (a.lineno - first_line(a))  # its decorators' lines too
        printed = physical_lines(single.code)
        if shift < 0 or top < 1 or where.end.line > len(printed) or where.end.line + shift > len(file_lines):
            return None
        if printed[top - 1 : where.end.line] != list(file_lines[top - 1 + shift : where.end.line + shift]):
            return None
        stack: List[cst.CSTNode] = [statement]  # its nodes on its own lines (no layout nodes)
        while stack:
            node = stack.pop()
            stack.extend(node.children)
            r = found.get(node)
            if r is not None and top <= r.start.line and r.end.line <= where.end.line and not isinstance(node, _LAYOUT):
                out[node] = CodeRange(CodePosition(r.start.line + shift, r.start.column),
                                      CodePosition(r.end.line + shift, r.end.column))
    return out
