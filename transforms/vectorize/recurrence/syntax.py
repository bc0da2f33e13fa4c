"""Small libcst helpers of the recurrence family: source text of a node, names read and bound,
substitution, the operators and casts the vectorizer admits, and :class:`Skip`, whose message is
the reason a candidate is reported.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Dict, Optional, Sequence, Set, Tuple

import libcst as cst

from ...names import dotted


#: methods that are pure elementwise casts on the arrays the guard admits
_CAST_METHODS = frozenset({"astype", "float", "double"})
_BUILTINS = ("reversed", "range", "zip", "list", "tuple")
#: the operators ``Planner.check`` admits, as rendered
_OP_TEXT = {cst.Add: "+", cst.Subtract: "-", cst.Multiply: "*", cst.Divide: "/", cst.Minus: "-", cst.Plus: "+"}


class Skip(Exception):
    """A candidate loop that cannot be rewritten; the message is the reported reason."""


# --------------------------------------------------------------------------- small helpers


_EMPTY = cst.Module(body=[])


def _code(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


def _one_line(node: cst.CSTNode) -> str:
    return " ".join(_code(node).replace("\\\n", " ").split())


def _norm(node: cst.CSTNode) -> str:
    text = re.sub(r"\s+", "", _code(node))
    while text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        text = text[1:-1]
    return text


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if depth < 0:
            return False
    return depth == 0


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


_FIELDS: Dict[type, Tuple[str, ...]] = {}


def _kids(n: cst.CSTNode):
    """Child nodes, read straight from the dataclass fields (``visit`` rebuilds every node it
    passes and costs ~50x more on the small expressions analysed here)."""
    names = _FIELDS.get(type(n))
    if names is None:
        names = _FIELDS[type(n)] = tuple(f.name for f in dataclasses.fields(n))
    for name in names:
        v = getattr(n, name)
        if isinstance(v, cst.CSTNode):
            yield v
        elif isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, cst.CSTNode):
                    yield x


def _walk(node: cst.CSTNode):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(_kids(n))


def _names_read(node: cst.CSTNode) -> Set[str]:
    """Names read anywhere under ``node`` (attribute names and keyword names excluded)."""
    found: Set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Name):
            found.add(n.value)
        elif isinstance(n, cst.Attribute):
            stack.append(n.value)
        elif isinstance(n, cst.Arg):
            stack.append(n.value)
        else:
            stack.extend(_kids(n))
    return found


def _bound_names(node: cst.CSTNode) -> Set[str]:
    """Names bound anywhere under ``node`` (assignments, loop targets, defs, imports, walrus)."""
    found: Set[str] = set()

    def targets(t: cst.CSTNode) -> None:
        if isinstance(t, cst.Name):
            found.add(t.value)
        elif isinstance(t, (cst.Tuple, cst.List)):
            for el in t.elements:
                targets(el.value)
        elif isinstance(t, cst.StarredElement):
            targets(t.value)

    for n in _walk(node):
        if isinstance(n, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor, cst.NamedExpr)):
            targets(n.target)
        elif isinstance(n, cst.AsName):
            targets(n.name)
        elif isinstance(n, (cst.FunctionDef, cst.ClassDef)):
            found.add(n.name.value)
        elif isinstance(n, cst.ImportAlias) and n.asname is None:
            found.add(_code(n.name).split(".")[0])
    return found


def _paren(e: cst.BaseExpression) -> cst.BaseExpression:
    return e.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _subst(node: cst.BaseExpression, match, repl: cst.BaseExpression) -> cst.BaseExpression:
    """``node`` with every sub-expression for which ``match(expr)`` holds replaced by ``repl``
    (attribute and keyword names are never touched)."""

    class T(cst.CSTTransformer):
        def on_leave(self, original, updated):
            if isinstance(original, cst.BaseExpression) and match(original):
                return repl
            return updated

        def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
            if match(original):
                return repl
            return updated.with_changes(attr=original.attr)

        def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
            return updated.with_changes(keyword=original.keyword)

    return node.visit(T())  # type: ignore[return-value]


def _stmts(block: cst.BaseSuite) -> Sequence[cst.BaseStatement]:
    return block.body if isinstance(block, cst.IndentedBlock) else [cst.SimpleStatementLine(body=block.body)]
