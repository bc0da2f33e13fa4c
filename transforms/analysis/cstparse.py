"""libcst's parse without re-validating the nodes its own parser builds.

Every libcst node checks itself as it is made (``CSTNode.__post_init__`` calls ``_validate``: are
the parentheses balanced, is there whitespace where two tokens would merge...). For a node the
native parser built from source that parses, the check cannot fail: the parser's grammar is
what the checks enforce (libcst's own comment on ``__post_init__`` says as much). It is a fifth
of a parse: 5.0 -> 4.0 CPU s for the 5,051 functions of a 50k-line file, and a dense file's
rewrite parses every function it edits (issue 19 item 13).

:func:`parse_module` and friends set a flag of the calling thread that the patched
``__post_init__`` reads; nodes made anywhere else, or in other threads meanwhile (a user's own
libcst code beside the import hook), are checked as before. Code that does not parse still
raises libcst's ``ParserSyntaxError``: the checks skipped are of nodes, not of the grammar.
"""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

import libcst as cst
from libcst._nodes.base import CSTNode

from scalebox_cst import continuation

_T = TypeVar("_T")
_LOCAL = threading.local()


def _post_init(self: CSTNode) -> None:
    if getattr(_LOCAL, "parsing", False):
        return
    self._validate()  # what libcst's own __post_init__ does


def _unchecked(parse: Callable[[str], _T], code: str) -> _T:
    _install()
    outer = getattr(_LOCAL, "parsing", False)
    _LOCAL.parsing = True
    try:
        return parse(code)
    finally:
        _LOCAL.parsing = outer


def _install() -> None:
    if CSTNode.__dict__.get("__post_init__") is not _post_init:
        CSTNode.__post_init__ = _post_init  # type: ignore[method-assign]


def parse_module(code: str) -> cst.Module:
    """``cst.parse_module(code)``, its nodes not re-validated, each backslash continuation kept
    with its statement's indentation (``continuation.tagged``: it moves with the statement)."""
    return _unchecked(lambda text: continuation.tagged(cst.parse_module(text), text), code)


def parse_statement(code: str) -> cst.BaseStatement:
    """``cst.parse_statement(code)``, its nodes not re-validated."""
    return _unchecked(cst.parse_statement, code)


def parse_expression(code: str) -> cst.BaseExpression:
    """``cst.parse_expression(code)``, its nodes not re-validated."""
    return _unchecked(cst.parse_expression, code)
