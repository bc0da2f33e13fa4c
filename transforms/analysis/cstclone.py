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
import tokenize
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

import libcst as cst

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
            "        v = clone(v, names)",
            "    elif k == SEQUENCE:",
            "        v = tuple([clone(x, names) if kind(x) == NODE else x for x in v])",
            f"    set_field(new, {field!r}, v)",
        ]
    if cls in _NAMED:
        lines += ["    if names is not None:", "        v = node.value", "        set_field(new, 'value', names.get(v, v))"]
    lines.append("    return new")
    scope = {"new_node": object.__new__, "cls": cls, "kinds": _KINDS, "kind": kind, "NODE": NODE,
             "SEQUENCE": SEQUENCE, "clone": clone, "set_field": _set}
    exec("\n".join(lines), scope)  # noqa: S102 - field names of a dataclass: identifiers
    copy = _COPIERS[cls] = scope["copy"]
    return copy


#: a placeholder's prefix; text holding it is parsed as it is
_MARK = "_sbx_shape_"
_SOFT = frozenset(getattr(keyword, "softkwlist", ())) | {"match", "case", "type", "_", "print", "exec"}
#: shape text -> its parsed module (bounded: cleared when full)
_SHAPES: Dict[str, cst.Module] = {}
_MAX_SHAPES = 512


def _shape(text: str) -> Optional[Tuple[str, Dict[str, str]]]:
    """``text`` with each identifier, comment and plain string replaced by a placeholder of its
    kind, numbered in order of first appearance, and placeholder -> the token's text; None
    where that is not sure to parse alike."""
    if _MARK in text:
        return None
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    ids: Dict[str, str] = {}
    out: List[str] = []
    done = 0
    for tok in tokens:
        if tok.type == tokenize.NAME and not keyword.iskeyword(tok.string):
            if tok.string in _SOFT or not tok.string.isidentifier():
                return None
            form = "{}"
        elif tok.type == tokenize.COMMENT:
            form = "#{}"
        elif tok.type == tokenize.STRING and not set(tok.string[: tok.string.index(tok.string[-1])]) & set("fF"):
            form = "'{}'"  # a plain string (an f-string's inside is parsed: kept as it is)
        else:
            continue
        (row, col), (erow, ecol) = tok.start, tok.end
        begin, end = starts[row - 1] + col, starts[erow - 1] + ecol
        if text[begin:end] != tok.string:
            return None
        mark = ids.setdefault(tok.string, form.format(f"{_MARK}{len(ids)}"))
        out.append(text[done:begin])
        out.append(mark)
        done = end
    out.append(text[done:])
    return "".join(out), {mark: name for name, mark in ids.items()}


def parse_statements(text: str) -> List[cst.BaseStatement]:
    """``cst.parse_module(text).body``, as fresh nodes; text whose shape was parsed before (the
    same code up to its identifiers) is not parsed again."""
    shaped = _shape(text)
    if shaped is None:
        return list(cst.parse_module(text).body)
    key, names = shaped
    module = _SHAPES.get(key)
    if module is None:
        if len(_SHAPES) >= _MAX_SHAPES:
            _SHAPES.clear()
        module = _SHAPES[key] = cst.parse_module(key)
    return [clone(st, names) for st in module.body]
