"""Structural equality of expressions, layout aside: the key two nodes share exactly when their
libcst trees are equal but for whitespace, comments and the parentheses around the whole node.

Why not the source text with its whitespace removed (what the recurrence family once compared):
that makes ``not x`` equal ``notx``, ``x["a b"]`` equal ``x["ab"]`` and ``f"{a} {b}"`` equal
``f"{a}{b}"``. Why not plain ``deep_equals``: it compares whitespace too, so ``x[t + 1]`` would
differ from ``x[t+1]``; and the family keys dictionaries by expressions, which needs a hashable key.

The key is built from the tree, not from text: libcst's own code generation is run with every
whitespace node (spaces, line continuations, comments, newlines, indentation) and the node's outer
parentheses left out, so what remains is the node's tokens, each emitted by the node that owns it
(a string literal, an f-string's text part, a keyword). Tokens are joined without separators
except where two would fuse (``not`` then ``x``, ``1`` then ``.``), so the key of an expression
written without optional whitespace is its source text (``self.rewards``, ``t+1``, ``-1``): callers
may compare a key with a spelled key such as ``f"{T}-1"``. Equal keys mean equal token
sequences, and Python's grammar gives one tree per token sequence.
"""
from __future__ import annotations

from typing import Any, List, Set

import libcst as cst
from libcst._nodes.internal import CodegenState

#: nodes that are layout only: their tokens never take part in a key
_LAYOUT = (cst.SimpleWhitespace, cst.ParenthesizedWhitespace, cst.TrailingWhitespace, cst.EmptyLine,
           cst.Newline, cst.Comment)


class _KeyState(CodegenState):
    """Code generation that drops the tokens of layout nodes and of the ignored parentheses."""

    def __init__(self, skip: Set[int]) -> None:
        super().__init__(default_indent="    ", default_newline="\n")
        self.skip = skip
        self.quiet = 0

    def add_indent_tokens(self) -> None:  # indentation is layout
        pass

    def add_token(self, value: str) -> None:
        if not self.quiet and value:
            self.tokens.append(value)

    def before_codegen(self, node: Any) -> None:
        layout = _IS_LAYOUT.get(type(node))
        if layout is None:
            layout = _IS_LAYOUT[type(node)] = isinstance(node, _LAYOUT)
        if layout or id(node) in self.skip:
            self.quiet += 1

    def after_codegen(self, node: Any) -> None:
        if _IS_LAYOUT[type(node)] or id(node) in self.skip:  # (set by before_codegen)
            self.quiet -= 1


#: node type -> whether it is one of _LAYOUT (an ``isinstance`` through ``ABCMeta`` per node and
#: hook was a third of a key's cost)
_IS_LAYOUT: dict = {}


def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_" or not ch.isascii()


def _fuse(left: str, right: str) -> bool:
    """Whether ``left`` written right before ``right`` would read as other tokens."""
    a, b = left[-1], right[0]
    return (_word(a) and _word(b)) or (a.isdigit() and b == ".") or (a == "." and b.isdigit())


def structure_key(node: cst.CSTNode) -> str:
    """The node's tokens, layout and its own outer parentheses left out (see the module doc)."""
    if type(node) is cst.Name:  # its one token (most keys asked for are of names: no codegen)
        return node.value
    skip = {id(p) for p in (*getattr(node, "lpar", ()), *getattr(node, "rpar", ()))}
    state = _KeyState(skip)
    node._codegen(state)
    out: List[str] = []
    for tok in state.tokens:
        if out and _fuse(out[-1], tok):
            out.append(" ")
        out.append(tok)
    return "".join(out)


def same_structure(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    """``a`` and ``b`` are the same code, whitespace, comments and outer parentheses aside."""
    return type(a) is type(b) and structure_key(a) == structure_key(b)
