"""Fresh copies of libcst trees, and generated code parsed once per shape.

A rewritten recurrence loop holds its body several times (first step, kept steps, the original
loop) and code generated for it: each copy must be a tree of its own (identity-keyed maps take
nodes for places), so the body was ``deep_clone``d and the generated text parsed per site. On a
file of thousands of similar loops that was most of the time per site: ``deep_clone`` goes
through ``dataclasses.fields``, ``deepcopy`` and an exception per leaf, and libcst's parser costs
about 0.3 ms per generated line. Here :func:`clone` copies from cached field names, and
:func:`parse_statements` parses text with its identifiers replaced by placeholders once, then
hands out fresh copies with the real names: loops that differ only in names (``adv_1``,
``x_v_2``, in comments and strings too) share one parse. The text a copy prints is the text
parsed: two texts of one shape differ only in the ``value`` of names, comments and plain
strings, and no such token decides how libcst parses (soft keywords, which can, and f-strings,
whose inside is parsed, are left as they are).
"""
from __future__ import annotations

import io
import keyword
import re
import sys
import token
import tokenize
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar, cast

import libcst as cst

from . import cstparse
from .cstwalk import _KINDS, NODE, SEQUENCE, kind

_FIELDS: Dict[type, Tuple[str, ...]] = {}
_Node = TypeVar("_Node", bound=cst.CSTNode)


def _fields(cls: type) -> Tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f for f in cls.__dataclass_fields__ if not f.startswith("_"))  # type: ignore[attr-defined]
    return names


#: the nodes whose ``value`` is one token's text, which :func:`parse_statements` substitutes
_NAMED = (cst.Name, cst.Comment, cst.SimpleString)


def clone(node: _Node, names: Optional[Dict[str, str]] = None) -> _Node:
    """What ``node.deep_clone()`` returns (a new node for every node, sequences as tuples), the
    value of each name, comment and plain string found in ``names`` replaced by its entry."""
    copy = _COPIERS.get(type(node))
    if copy is None:
        copy = _copier(type(node))
    return copy(node, names)


_set = object.__setattr__
#: node type -> its copier (:func:`_copier`)
_COPIERS: Dict[type, Callable[[Any, Optional[Dict[str, str]]], Any]] = {}


def _copier(cls: type) -> Callable[[Any, Optional[Dict[str, str]]], Any]:
    """A function copying a ``cls`` node as :func:`clone` does, its fields read one by one in
    straight-line code: a generic loop over the field names (a dict of keyword arguments, a call
    per field's kind) cost ~1.8x as much, and a file of thousands of rewritten loops copies
    millions of nodes. The fields of a valid node are set directly, so its validation
    (``__post_init__``, all it does) is skipped."""
    lines = ["def copy(node, names):", "    new = new_node(cls)"]
    for field in _fields(cls):
        lines += [
            f"    v = node.{field}",
            "    k = kinds.get(type(v))",
            "    if k is None:",
            "        k = kind(v)",
            "    if k == NODE:",
            "        c = copiers.get(type(v))",
            "        v = (c if c is not None else make(type(v)))(v, names)",
            "    elif k == SEQUENCE and v:",
            "        out = []",
            "        for x in v:",
            "            c = copiers.get(type(x))",
            "            if c is not None:",
            "                x = c(x, names)",
            "            elif kind(x) == NODE:",
            "                x = make(type(x))(x, names)",
            "            out.append(x)",
            "        v = tuple(out)",
            "    elif k == SEQUENCE:",
            "        v = ()",
            f"    set_field(new, {field!r}, v)",
        ]
    if cls in _NAMED:
        lines += ["    if names is not None:", "        v = node.value", "        set_field(new, 'value', names.get(v, v))"]
    lines.append("    return new")
    scope = {"new_node": object.__new__, "cls": cls, "kinds": _KINDS, "kind": kind, "NODE": NODE,
             "SEQUENCE": SEQUENCE, "copiers": _COPIERS, "make": _copier, "set_field": _set}
    exec("\n".join(lines), scope)  # noqa: S102 - field names of a dataclass: identifiers
    copy = _COPIERS[cls] = cast(Callable[[Any, Optional[Dict[str, str]]], Any], scope["copy"])
    return copy


#: a placeholder's prefix; text holding it is parsed as it is
_MARK = "_sbx_shape_"
_SOFT = frozenset(getattr(keyword, "softkwlist", ())) | {"match", "case", "type", "_", "print", "exec"}
#: (how it was parsed, shape text) -> its parse (bounded: cleared when full)
_SHAPES: Dict[Tuple[str, str], Any] = {}
_MAX_SHAPES = 512


def _shape(text: str) -> Optional[Tuple[str, Dict[str, str]]]:
    """``text`` with each identifier, comment and plain string replaced by a placeholder of its
    kind, numbered in order of first appearance, and placeholder -> the token's text; None
    where that is not sure to parse alike."""
    if _MARK in text:
        return None
    spans = _fast_spans(text)
    if spans is None:
        spans = _spans(text)
    if spans is None:
        return None
    ids: Dict[str, str] = {}
    out: List[str] = []
    done = 0
    for form, string, begin, end in spans:
        mark = ids.setdefault(string, form.format(f"{_MARK}{len(ids)}"))
        out.append(text[done:begin])
        out.append(mark)
        done = end
    out.append(text[done:])
    return "".join(out), {mark: name for name, mark in ids.items()}


#: (placeholder form, token text, start offset, end offset), in source order
_Spans = List[Tuple[str, str, int, int]]


def _form(kind: str, string: str) -> Optional[str]:
    """The placeholder form of a token (``kind``: "name", "comment" or "string"); "" for one
    kept as it is, None where the text is not to be shaped at all (a soft keyword)."""
    if kind == "name":
        if keyword.iskeyword(string):
            return ""
        if string in _SOFT or not string.isidentifier():
            return None
        return "{}"
    if kind == "comment":
        return "#{}"
    # a plain string (an f-string's inside is parsed: kept as it is)
    return "" if set(string[: string.index(string[-1])]) & set("fF") else "'{}'"


def _spans(text: str) -> Optional[_Spans]:
    """The spans to replace, from the ``tokenize`` module."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    spans: _Spans = []
    kinds = {tokenize.NAME: "name", tokenize.COMMENT: "comment", tokenize.STRING: "string"}
    for tok in tokens:
        kind = kinds.get(tok.type)
        if kind is None:
            continue
        form = _form(kind, tok.string)
        if form is None:
            return None
        if not form:
            continue
        (row, col), (erow, ecol) = tok.start, tok.end
        begin, end = starts[row - 1] + col, starts[erow - 1] + ecol
        if text[begin:end] != tok.string:
            return None
        spans.append((form, tok.string, begin, end))
    return spans


try:  # CPython's own tokenizer (3.11): ~9x the speed of the tokenize module, which 3.12 builds on it
    from _tokenize import TokenizerIter as _TokenizerIter
except ImportError:  # pragma: no cover - other interpreters
    _TokenizerIter = None
#: token types of the C tokenizer that hold no source text of their own (NEWLINE may carry the
#: comment before it, INDENT/DEDENT none): comments are found between the others
_LAYOUT_TOKENS = frozenset({token.NEWLINE, token.INDENT, token.DEDENT, token.ENDMARKER, token.NL, token.COMMENT})
_FAST_TEXT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # control characters besides tab and newline


def _fast_spans(text: str) -> Optional[_Spans]:
    """:func:`_spans` from the C tokenizer of Python 3.11, for ASCII text with no line break but
    ``\\n`` (its columns are then offsets in the line, and lines are split as here); None where it
    is not used (then :func:`_spans` decides). Between two tokens with text there is only
    blank space, line continuations and comments, so a ``#`` there starts a comment running to
    the end of its line (the tokenize module's COMMENT token: ``#[^\\r\\n]*``)."""
    if _TokenizerIter is None or sys.version_info[:2] != (3, 11) or not text.isascii() or _FAST_TEXT.search(text):
        return None
    try:
        tokens = list(_TokenizerIter(text))
    except (SyntaxError, ValueError):
        return None
    starts = [0]
    for line in text.split("\n"):
        starts.append(starts[-1] + len(line) + 1)
    spans: _Spans = []
    done = 0  # the end of the last token with text
    for string, ttype, row, erow, col, ecol, _line in tokens:
        if ttype in _LAYOUT_TOKENS or not string:
            continue
        begin, end = starts[row - 1] + col, starts[erow - 1] + ecol
        if begin < done or text[begin:end] != string:
            return None
        if not _comments(text, done, begin, spans):
            return None
        form = _form("name", string) if ttype == token.NAME else _form("string", string) if ttype == token.STRING else ""
        if form is None:
            return None
        if form:
            spans.append((form, string, begin, end))
        done = end
    if not _comments(text, done, len(text), spans):
        return None
    return spans


def _comments(text: str, begin: int, end: int, spans: _Spans) -> bool:
    """Add the comments in ``text[begin:end]`` (space between tokens) to ``spans``; False where
    that stretch holds anything but blank space, line continuations and comments."""
    at = begin
    while at < end:
        sharp = text.find("#", at, end)
        gap = text[at:end] if sharp < 0 else text[at:sharp]
        if gap.strip(" \t\n\\"):
            return False
        if sharp < 0:
            return True
        stop = text.find("\n", sharp, end)
        stop = end if stop < 0 else stop
        spans.append(("#{}", text[sharp:stop], sharp, stop))
        at = stop
    return True


def parse_statements(text: str) -> List[cst.BaseStatement]:
    """``cst.parse_module(text).body``, as fresh nodes; text whose shape was parsed before (the
    same code up to its identifiers) is not parsed again."""
    module = _parsed("module", text, cstparse.parse_module)
    return [clone(st, module[1]) for st in module[0].body] if module[1] is not None else list(module[0].body)


def parse_statement(text: str) -> cst.BaseStatement:
    """``cst.parse_statement(text)``, a fresh tree copied from the parse of its shape (the one-line
    statements the vectorize transforms generate per site differ only in names)."""
    node, names = _parsed("statement", text, cstparse.parse_statement)
    return clone(node, names) if names is not None else node


def parse_expression(text: str) -> cst.BaseExpression:
    """``cst.parse_expression(text)``, a fresh tree copied from the parse of its shape."""
    node, names = _parsed("expression", text, cstparse.parse_expression)
    return clone(node, names) if names is not None else node


def _parsed(how: str, text: str, parse: Callable[[str], Any]) -> Tuple[Any, Optional[Dict[str, str]]]:
    """(the parse of ``text``'s shape, placeholder -> name) to copy from; (the parse of ``text``
    itself, None) where it has no shape (it is then used as it is: nothing else holds it)."""
    shaped = _shape(text)
    if shaped is None:
        return parse(text), None
    key, names = shaped
    tree = _SHAPES.get((how, key))
    if tree is None:
        if len(_SHAPES) >= _MAX_SHAPES:
            _SHAPES.clear()
        tree = _SHAPES[(how, key)] = parse(key)
    return tree, names
