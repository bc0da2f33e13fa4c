"""Small libcst helpers of the recurrence family: source text of a node, substitution, the
operators and casts the vectorizer admits, and :class:`Skip`, whose message is the reason a
candidate is reported. Names read and bound, and the fast walk, come from the shared
:mod:`scalebox_cst.transforms.analysis` (imported here under the family's short names).
"""
from __future__ import annotations

import re
from typing import Dict, Optional, Sequence, Tuple

import libcst as cst

from ... import rewrite_caches
from ...analysis.cstwalk import of_type as _of_type, walk as _walk  # noqa: F401 - used across the family
from ...analysis.reads import bound_names as _bound_names, names_read as _names_read  # noqa: F401
from ...analysis.shape import structure_key
from ...names import dotted
from scalebox_cst import fastcode


#: methods that are pure elementwise casts on the arrays the guard admits
_CAST_METHODS = frozenset({"astype", "float", "double"})
_BUILTINS = ("reversed", "range", "zip", "list", "tuple", "enumerate", "sorted")  # headers: enumerate, sorted only in their own forms
#: the operators ``grammar.Grammar.check`` admits, as rendered
_OP_TEXT = {cst.Add: "+", cst.Subtract: "-", cst.Multiply: "*", cst.Divide: "/", cst.Minus: "-", cst.Plus: "+"}


class Skip(Exception):
    """A candidate loop that cannot be rewritten; the message is the reported reason."""


# --------------------------------------------------------------------------- small helpers


_EMPTY = cst.Module(body=[])


def _code(node: cst.CSTNode) -> str:
    if type(node) is cst.Name and not node.lpar and not node.rpar:
        return node.value  # what fastcode writes of it (a quarter of the nodes asked about)
    return fastcode.code_for_node(_EMPTY, node)


def _one_line(node: cst.CSTNode) -> str:
    return " ".join(_code(node).replace("\\\n", " ").split())


class _OneLine(cst.CSTTransformer):
    """Every run of layout whitespace (line breaks in brackets, continuations, indentation,
    comments) as one space; tokens, string literals included, as written."""

    def leave_ParenthesizedWhitespace(self, original, updated):
        return cst.SimpleWhitespace(" ")

    def leave_SimpleWhitespace(self, original, updated):
        return updated.with_changes(value=" ") if updated.value else updated


def _code_line(node: cst.CSTNode) -> str:
    """``node``'s code on one line, for code the rewrite emits: the layout between tokens made
    one space (as :func:`_one_line` does for reasons) but string literals kept as written --
    collapsing the text would turn ``x["a  b"]`` into ``x["a b"]``, another key."""
    return _code(node.visit(_OneLine())).strip()


def _norm(node: cst.CSTNode) -> str:
    """The family's key of an expression: structural, layout and outer parentheses aside
    (:func:`~scalebox_cst.transforms.analysis.shape.structure_key`), never whitespace-stripped text.

    Kept per node (nodes are immutable, and held here so their ids stay theirs): the stages of
    one loop ask about the same expressions ~3.5 times each, a codegen each time."""
    hit = _NORMS.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    key = structure_key(node)
    if len(_NORMS) >= _MAX_NORMS:
        _NORMS.clear()
    _NORMS[id(node)] = (node, key)
    return key


#: id(node) -> (node, its key), for :func:`_norm` (bounded: cleared when full)
_NORMS: Dict[int, Tuple[cst.CSTNode, str]] = rewrite_caches.mapping()
_MAX_NORMS = 4096


def _is_call(node: cst.CSTNode, name: str, nargs: Optional[int] = None) -> bool:
    if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == name):
        return False
    if any(a.keyword is not None or a.star for a in node.args):
        return False
    return nargs is None or len(node.args) == nargs


def _is_int(node: cst.CSTNode, value: int) -> bool:
    return _norm(node) == str(value)


def _pure_container(node: cst.CSTNode) -> bool:
    return dotted(node) is not None  # a Name or an attribute chain (self.buffer.rewards)


def _head(node: cst.CSTNode) -> Optional[str]:
    text = dotted(node)
    return text.split(".")[0] if text else None


def _paren(e: cst.BaseExpression) -> cst.BaseExpression:
    return e.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _subst(node: cst.BaseExpression, match, repl: cst.BaseExpression) -> cst.BaseExpression:
    """``node`` with every sub-expression for which ``match(expr)`` holds replaced by ``repl``
    (attribute and keyword names are never touched)."""

    return node.visit(_Subst(match, repl))  # type: ignore[return-value]


class _Subst(cst.CSTTransformer):
    """:func:`_subst`'s pass (at module level: see body._Resolve)."""

    def __init__(self, match, repl: cst.BaseExpression) -> None:
        super().__init__()
        self.match, self.repl = match, repl

    def on_leave(self, original, updated):
        if isinstance(original, cst.BaseExpression) and self.match(original):
            return self.repl
        return updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        if self.match(original):
            return self.repl
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)


def fresh(imports, base: str) -> str:
    """A name free in the module for ``base`` (reserved in ``imports``, so two sites never share
    one); every stage that names an array or a carried value asks here, in the order it emits."""
    base = re.sub(r"\W", "_", base) or "v"
    return imports.unique_name(base)


def _stmts(block: cst.BaseSuite) -> Sequence[cst.BaseStatement]:
    return block.body if isinstance(block, cst.IndentedBlock) else [cst.SimpleStatementLine(body=block.body)]


def _word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_"  # what ``\w`` matches in a str pattern


def spells(text: str, word: str, tail: str = "") -> bool:
    """``re.search(rf"(?<![\\w.]){re.escape(word)}{re.escape(tail)}\\b", text) is not None``: ``word``
    (then ``tail``) spelled in ``text``, not after a word character or ``.``, ending at a word
    boundary. The words are a site's own names (``adv_12``): a pattern per word was compiled anew
    at each search (re's cache holds 512), a tenth of the time per loop of a dense file."""
    full = word + tail
    if not full:
        return re.search(r"(?<![\w.])\b", text) is not None
    ends_in_word = _word_char(full[-1])
    at = text.find(full)
    while at >= 0:
        if at == 0 or not (_word_char(text[at - 1]) or text[at - 1] == "."):
            after = at + len(full)
            if (after < len(text) and _word_char(text[after])) != ends_in_word:
                return True
        at = text.find(full, at + 1)
    return False
