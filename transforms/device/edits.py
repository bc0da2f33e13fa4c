"""What an edit is (a function from the libcst node to its replacement, named by the ``ast``
node it applies to) and the small libcst builders the edits use."""
from __future__ import annotations

import ast
from typing import Callable, List, Optional, Sequence, Set

import libcst as cst

Edit = Callable[[cst.CSTNode], cst.CSTNode]

_SPACE_COMMA = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def _new_arg(keyword: Optional[str], value: cst.BaseExpression) -> cst.Arg:
    if keyword is None:
        return cst.Arg(value=value)
    return cst.Arg(keyword=cst.Name(keyword), value=value, equal=_EQUAL)


def _append_args(call: cst.Call, new: Sequence[cst.Arg]) -> cst.Call:
    """``call`` with ``new`` arguments appended, in the call's own comma style."""
    args, new = list(call.args), list(new)
    if not args:
        return call.with_changes(args=[a.with_changes(comma=_SPACE_COMMA) for a in new[:-1]] + new[-1:])
    last = args[-1]
    if isinstance(last.comma, cst.Comma):  # a trailing comma: keep it last, copy the separator style
        between = args[-2].comma if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma) else _SPACE_COMMA
        args[-1] = last.with_changes(comma=between)
        new = [a.with_changes(comma=between) for a in new[:-1]] + [new[-1].with_changes(comma=last.comma)]
    else:  # what stood before ``)`` (a comment, a newline and the indent of ``)``) stays before it
        args[-1] = last.with_changes(comma=_SPACE_COMMA, whitespace_after_arg=cst.SimpleWhitespace(""))
        new = [a.with_changes(comma=_SPACE_COMMA) for a in new[:-1]] + [new[-1].with_changes(whitespace_after_arg=last.whitespace_after_arg)]
    return call.with_changes(args=args + new)



def _keep_parens(old: cst.BaseExpression, new: cst.BaseExpression) -> cst.BaseExpression:
    if getattr(old, "lpar", None) and hasattr(new, "lpar"):
        return new.with_changes(lpar=old.lpar, rpar=old.rpar)
    return new


def _swap_attr(node: cst.BaseExpression, depth: int, name: str) -> cst.BaseExpression:
    if not isinstance(node, cst.Attribute):
        raise TypeError(f"expected an attribute, found {type(node).__name__}")
    if depth == 0:
        return node.with_changes(attr=cst.Name(name))
    return node.with_changes(value=_swap_attr(node.value, depth - 1, name))


def _drop_statements(block, drops: Set[int]):
    body = list(block.body)
    kept: List[cst.BaseStatement] = []
    carry: List[cst.EmptyLine] = []
    for i, stmt in enumerate(body):
        if i in drops:
            carry.extend(getattr(stmt, "leading_lines", ()))
            continue
        if carry:
            stmt = stmt.with_changes(leading_lines=[*carry, *stmt.leading_lines])
            carry = []
        kept.append(stmt)
    if not kept and isinstance(block, cst.IndentedBlock):
        kept = [cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carry)]
    elif carry:  # the last statement dropped: its leading lines stay where they were, at the end
        block = block.with_changes(footer=[*carry, *block.footer])
    return block.with_changes(body=kept)


class _Target:
    """A node an edit applies to, named by its ``ast`` node. ``expr``: the libcst node of the same
    kind at the same position; ``fpart``: the first text part of that f-string; ``stmt``: that
    small statement."""

    __slots__ = ("node", "kind")

    def __init__(self, node: ast.AST, kind: str = "expr") -> None:
        self.node = node
        self.kind = kind
