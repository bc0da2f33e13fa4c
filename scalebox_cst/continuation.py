"""Backslash continuation lines that move with their statement.

libcst keeps the layout inside brackets relative to the statement (``ParenthesizedWhitespace``
writes the block's indentation, then the rest), but a backslash continuation is a
``SimpleWhitespace`` holding ``"\\\\\\n"`` and the next line's spaces as they were in the file: its
absolute column. A transform that puts a user's statement one block deeper (vectorize.recurrence's
copies of a loop body, a guard's ``else``, a ``try``/``with`` wrapped around a loop) left every
such line where it was, the rest of the statement moved::

            R = rewards[t] + \\
        gamma * masks[t] * R

(valid Python, but ``scalebox diff`` showed a broken-looking rewrite).

Every libcst module the rewrite parses goes through :func:`tagged` (``cstparse.parse_module``):
where its text holds a backslash-newline, each ``SimpleWhitespace`` holding one is replaced by a
:class:`Continuation`, the same whitespace with ``home``, the indentation of the statement it is
written in at that parse. Its codegen (libcst's, :mod:`scalebox_cst.fastcode`'s) writes it as it
was where the statement is written at ``home``, and else each continuation line moved by the
statement's move: its new indentation is its old column plus (the statement's indentation now
less ``home``). Both codegens put a statement's indentation only through the state's indent
tokens, so "now" is those tokens, whatever transform moved it; a statement not moved writes the
very bytes parsed. A state with no indent tokens writes it as parsed: a top-level statement (at
its home there), or an expression written alone, whose text a transform puts into code it
generates, mostly where the statement it came from stood (an Emitted node's statement rows are
written under an indent token even at its own depth: ``Emitted.write``). Only whitespace between tokens is touched: a backslash-newline inside a string
literal is part of a ``SimpleString``/``FormattedString`` node, never of a ``SimpleWhitespace``.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, List, Tuple

import libcst as cst
from libcst._add_slots import add_slots
from libcst._nodes.internal import CodegenState

#: the indent token fastcode's generate-once writes a statement under (``fastcode._emitted``)
#: before putting it at each depth (no token of Python source holds a NUL)
MARK = "\0scalebox-indent\0"
#: written instead, under MARK, where a continuation line's new column depends on the real
#: indentation (it is less indented than its statement): the caller writes the row per depth
UNPLACED = "\0scalebox-unplaced\0"

#: a backslash-newline and the spaces or tabs that start the next line
_LINE = re.compile(r"\\(?:\r\n|\r|\n)([ \t]*)")
#: text that may hold a backslash continuation (strings too: then nothing is tagged)
_MAYBE = re.compile(r"\\(?:\r|\n)")


@add_slots
@dataclasses.dataclass(frozen=True)
class Continuation(cst.SimpleWhitespace):
    """A ``SimpleWhitespace`` with a backslash continuation in it, and the indentation of its
    statement where it was parsed. Named ``SimpleWhitespace`` (below): libcst's visitors
    (``leave_SimpleWhitespace``) and matchers find a node by its class's name."""

    home: str = ""

    def _codegen_impl(self, state: CodegenState) -> None:
        write(self, state)


Continuation.__name__ = "SimpleWhitespace"


def moved(spaces: str, home: str, now: str) -> str:
    """A continuation line's indentation ``spaces``, its statement moved from ``home`` to ``now``:
    the same column relative to the statement; a line left of its statement moves by as many
    columns where the indentation is spaces; else (tabs, indentations that do not line up) as
    it was."""
    if spaces.startswith(home):
        return now + spaces[len(home):]
    if "\t" in home or "\t" in now or "\t" in spaces:
        return spaces
    if now.startswith(home):  # deeper, the line left of its statement: shifted right
        return now[len(home):] + spaces
    if home.startswith(now):  # shallower: shifted left, not past column 0
        return spaces[len(home) - len(now):]
    return spaces


def write(node: Continuation, state: CodegenState) -> None:
    """``node``'s tokens into ``state``, moved with its statement (see the module doc)."""
    value, home, indent = node.value, node.home, state.indent_tokens
    if indent and indent[0] is MARK:  # to be placed at several depths: the marker stays a token
        done = 0
        for m in _LINE.finditer(value):
            spaces = m.group(1)
            if not spaces.startswith(home):
                state.add_token(UNPLACED)
                return
            state.add_token(value[done : m.start(1)])
            for token in indent:
                state.add_token(token)
            state.add_token(spaces[len(home):])
            done = m.end(1)
        state.add_token(value[done:])
        return
    now = "".join(indent)
    if now == home or not indent:  # in place, or written alone: an expression, a top-level statement
        state.add_token(value)
    else:
        state.add_token(_moved_lines(value, home, now))


def _moved_lines(value: str, home: str, now: str) -> str:
    """``value`` with the indentation after each backslash-newline :func:`moved`."""
    return _LINE.sub(lambda m: m.group(0)[: m.start(1) - m.start(0)] + moved(m.group(1), home, now), value)


def tagged(module: cst.Module, code: str) -> cst.Module:
    """``module`` (the parse of ``code``) with each whitespace holding a backslash continuation a
    :class:`Continuation` at the indentation of its statement; ``module`` itself where ``code``
    holds no backslash-newline. Call under ``cstparse``'s parse (its nodes are not validated)."""
    if _MAYBE.search(code) is None:
        return module
    walk = _Walk(module.default_indent, code.count("\\"))
    return walk.node(module, "")


def rehomed(node: Any, indent: str, unit: str, code: str) -> Any:
    """``node`` (parsed from ``code`` at the top level) as a parse of it written ``indent`` deep
    in a module indented by ``unit`` gives it: each :class:`Continuation` in it written there, at
    home there."""
    if _MAYBE.search(code) is None:
        return node
    return _Rehome(unit, code.count("\\")).node(node, indent)


#: the nodes whose ``indent`` (None: the module's) indents one of their fields: that field
_DEEPER: Dict[type, str] = {cst.IndentedBlock: "body", cst.Match: "cases"}
#: node type -> its field names (not the private ones)
_FIELDS: Dict[type, Tuple[str, ...]] = {}


class _Walk:
    """Rebuilds the nodes on the way to each continuation whitespace, tracking indentation as the
    codegen does (``IndentedBlock``'s statements, ``Match``'s cases: its ``indent``, or the
    module's for None, under the node's own); stops once as many were found as the text has
    backslashes."""

    def __init__(self, unit: str, left: int) -> None:
        self.unit, self.left = unit, left

    def leaf(self, node: cst.SimpleWhitespace, home: str) -> cst.SimpleWhitespace:
        if isinstance(node, Continuation):
            return node
        return Continuation(value=node.value, home=home)

    def node(self, node: Any, home: str) -> Any:
        if self.left <= 0:
            return node
        if isinstance(node, cst.SimpleWhitespace):
            if "\\" not in node.value:
                return node
            self.left -= node.value.count("\\")
            return self.leaf(node, home)
        names = _FIELDS.get(type(node))
        if names is None:
            names = _FIELDS[type(node)] = tuple(f.name for f in dataclasses.fields(node) if not f.name.startswith("_"))
        inner, deeper = home, _DEEPER.get(type(node))
        if deeper is not None:
            inner = home + (self.unit if node.indent is None else node.indent)
        changes: Dict[str, Any] = {}
        for name in names:
            value = getattr(node, name)
            where = inner if name == deeper else home
            if isinstance(value, cst.CSTNode):
                new = self.node(value, where)
            elif isinstance(value, (list, tuple)) and value and isinstance(value[0], cst.CSTNode):
                items: List[Any] = [self.node(v, where) for v in value]
                new = value if all(a is b for a, b in zip(items, value)) else type(value)(items)
            else:
                continue
            if new is not value:
                changes[name] = new
        return node.with_changes(**changes) if changes else node


class _Rehome(_Walk):
    """Each :class:`Continuation` as written where the walk is (its home there)."""

    def leaf(self, node: cst.SimpleWhitespace, home: str) -> cst.SimpleWhitespace:
        if not isinstance(node, Continuation):
            return node
        return Continuation(value=_moved_lines(node.value, node.home, home), home=home)


__all__ = ["Continuation", "MARK", "UNPLACED", "moved", "rehomed", "tagged", "write"]
