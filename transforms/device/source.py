"""The module's text as ``ast`` positions read it, and libcst's view of statement lines.

``ast`` columns are UTF-8 byte offsets, libcst's are characters; literal spellings (quotes,
prefixes) come from the text, not from ``ast`` values."""
from __future__ import annotations

import ast
import re
from typing import List, Optional, Sequence, Tuple

_SIMPLE = (
    ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Delete, ast.Pass, ast.Break,
    ast.Continue, ast.Raise, ast.Assert, ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal,
) + ((ast.TypeAlias,) if hasattr(ast, "TypeAlias") else ())
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_MATCH = (ast.Match,) if hasattr(ast, "Match") else ()


# ---------------------------------------------------------------------------------------- source
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
_NEWLINE = re.compile(r"\r\n?|\n")



class _Source:
    """The module's text by ``ast`` line, for literal spellings and character columns."""

    def __init__(self, code: str) -> None:
        self.lines = _LINE.findall(code)

    def col(self, lineno: int, col: int) -> int:
        """``ast``'s UTF-8 byte column as a character column (libcst's)."""
        line = self.lines[lineno - 1]
        return col if line.isascii() else len(line.encode("utf-8")[:col].decode("utf-8", "replace"))

    def segment(self, node: ast.AST) -> str:
        l1, l2 = node.lineno, node.end_lineno
        c1, c2 = self.col(l1, node.col_offset), self.col(l2, node.end_col_offset)
        if l1 == l2:
            return self.lines[l1 - 1][c1:c2]
        return self.lines[l1 - 1][c1:] + "".join(self.lines[l1:l2 - 1]) + self.lines[l2 - 1][:c2]

    def raw(self, node: ast.AST) -> Optional[str]:
        """What libcst's ``SimpleString.raw_value`` is for a one-literal, non-bytes string, else
        None (an implicit concatenation is a ``ConcatenatedString`` there)."""
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
            return None
        return _raw_literal(self.segment(node))

    def starts_line(self, node: ast.AST) -> bool:
        return not self.lines[node.lineno - 1][: self.col(node.lineno, node.col_offset)].strip()


def _raw_literal(text: str, allow_bytes: bool = False) -> Optional[str]:
    """The text between the quotes when ``text`` is one string literal, else None."""
    i = 0
    while i < len(text) and text[i].isalpha():
        i += 1
    prefix = text[:i].lower()
    if ("b" in prefix and not allow_bytes) or "f" in prefix or text[i:i + 1] not in ("'", '"'):
        return None
    quote = text[i:i + 3] if text[i:i + 3] in ('"""', "'''") else text[i]
    j, n = i + len(quote), len(text)
    while j < n:
        if text[j] == "\\":
            j += 2
        elif text.startswith(quote, j):
            break
        else:
            j += 1
    if j + len(quote) != n:
        return None
    return text[i + len(quote):j]


def _is_suite(body: Sequence[ast.stmt], src: _Source) -> bool:
    """``if x: y`` (a libcst SimpleStatementSuite) rather than an indented block."""
    return bool(body) and not src.starts_line(body[0])


class _Line:
    """One libcst statement line: the small statements of a SimpleStatementLine (or a suite)."""

    __slots__ = ("stmts", "suite")

    def __init__(self, stmts: List[ast.stmt], suite: bool) -> None:
        self.stmts = stmts
        self.suite = suite


def _lines(body: Sequence[ast.stmt]) -> List[object]:
    """A block's statements as libcst sees them: compound statements, and lines of small ones."""
    out: List[object] = []
    last: Optional[_Line] = None
    for s in body:
        if not isinstance(s, _SIMPLE):
            out.append(s)
            last = None
        elif last is not None and s.lineno == last.stmts[-1].end_lineno:
            last.stmts.append(s)
        else:
            last = _Line([s], False)
            out.append(last)
    return out


def _span(node: ast.AST) -> Tuple[int, int]:
    return node.lineno, node.end_lineno
