"""Recognising what vectorize.reduction rewrites: an accumulation ``acc += term`` (or
``acc = acc + term``), a list of per-element terms that is later reduced (``torch.stack(xs).sum()``,
``sum(xs)``, ``torch.cat(xs).mean()``), the trivial terms left alone, from ast (cheap pre-filter)
and libcst (the rewrite).
"""
from __future__ import annotations

import ast
import re
from typing import Iterator, List, Optional, Sequence, Set, cast

import libcst as cst

from ..analysis.bodies import target_names
from ..analysis.cstwalk import instances
from ..analysis.reads import names_read
from ..analysis.elementwise import ElementwiseExpr


class _Acc:
    """One accumulation statement: ``acc += E`` / ``acc = acc + E`` / ``L.append(E)``."""

    def __init__(self, kind: str, name: str, expr: cst.BaseExpression, stmt: cst.BaseSmallStatement, op: str = "+") -> None:
        self.kind = kind  # "aug" | "assign_left" | "assign_right" | "append"
        self.name = name
        self.expr = expr
        self.stmt = stmt
        self.op = op
        self.analysis: Optional[ElementwiseExpr] = None
        # append only: the consuming call and the statement that holds it
        self.consumer: Optional[cst.Call] = None
        self.consumer_kind = ""
        self.consumer_index = -1
        self.consumer_stmt: Optional[cst.BaseStatement] = None  # as written: the site's span reaches it
        self.keep_list = False  # the list is read besides its reduction: the batched branch fills it


def consumer_statements(accs: Sequence[_Acc]) -> List[cst.BaseStatement]:
    """The statements after the loop whose reductions of the accumulated lists a rewrite changes
    (as written: a site's span reaches them)."""
    return [a.consumer_stmt for a in accs if a.consumer_stmt is not None]


def _accumulation(stmt: cst.BaseSmallStatement) -> Optional[_Acc]:
    if isinstance(stmt, cst.AugAssign) and isinstance(stmt.target, cst.Name):
        if isinstance(stmt.operator, cst.AddAssign):
            return _Acc("aug", stmt.target.value, stmt.value, stmt, "+")
        if isinstance(stmt.operator, cst.SubtractAssign):
            return _Acc("aug", stmt.target.value, stmt.value, stmt, "-")
        return None
    if (
        isinstance(stmt, cst.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0].target, cst.Name)
        and isinstance(stmt.value, cst.BinaryOperation)
        and not stmt.value.lpar
    ):
        name = stmt.targets[0].target.value
        value = stmt.value
        is_acc = lambda e: isinstance(e, cst.Name) and e.value == name and not e.lpar  # noqa: E731
        if isinstance(value.operator, (cst.Add, cst.Subtract)) and is_acc(value.left):
            return _Acc("assign_left", name, value.right, stmt, "+" if isinstance(value.operator, cst.Add) else "-")
        if isinstance(value.operator, cst.Add) and is_acc(value.right):
            return _Acc("assign_right", name, value.left, stmt, "+")
        return None
    if (
        isinstance(stmt, cst.Expr)
        and isinstance(stmt.value, cst.Call)
        and isinstance(stmt.value.func, cst.Attribute)
        and stmt.value.func.attr.value == "append"
        and isinstance(stmt.value.func.value, cst.Name)
        and len(stmt.value.args) == 1
        and stmt.value.args[0].keyword is None
        and not stmt.value.args[0].star
    ):
        return _Acc("append", stmt.value.func.value.value, stmt.value.args[0].value, stmt)
    return None


def _ast_accumulation(stmt: ast.stmt) -> bool:
    """Whether ``stmt`` may be an accumulation :func:`_accumulation` accepts (``ast`` cannot see
    parentheses, so this says yes to a few that libcst then turns down)."""
    if isinstance(stmt, ast.AugAssign):
        return isinstance(stmt.target, ast.Name) and isinstance(stmt.op, (ast.Add, ast.Sub))
    if isinstance(stmt, ast.Assign):
        if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name) or not isinstance(stmt.value, ast.BinOp):
            return False
        name, value = stmt.targets[0].id, stmt.value
        left = isinstance(value.left, ast.Name) and value.left.id == name
        right = isinstance(value.right, ast.Name) and value.right.id == name
        return (isinstance(value.op, (ast.Add, ast.Sub)) and left) or (isinstance(value.op, ast.Add) and right)
    if isinstance(stmt, ast.Expr):
        call = stmt.value
        return (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "append"
            and isinstance(call.func.value, ast.Name)
            and len(call.args) == 1
            and not call.keywords
            and not isinstance(call.args[0], ast.Starred)
        )
    return False


#: calls that reduce a list of per-element values (what the append form can be consumed by)
_JOINERS = frozenset({"torch.stack", "torch.cat", "torch.concat", "torch.concatenate"})
_REDUCERS = frozenset({"torch.sum", "torch.mean"})
_AST_DISPLAYS = (ast.Constant, ast.JoinedStr, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.ListComp, ast.SetComp, ast.DictComp)
_CST_DISPLAYS = (
    cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.ConcatenatedString, cst.FormattedString,
    cst.List, cst.Tuple, cst.Set, cst.Dict, cst.ListComp, cst.SetComp, cst.DictComp,
)


def _ast_term(stmt: ast.stmt) -> Optional[ast.expr]:
    """What an accumulation :func:`_ast_accumulation` accepts adds (None for an append)."""
    if isinstance(stmt, ast.AugAssign):
        return stmt.value
    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.BinOp):
        left = stmt.value.left
        name = stmt.targets[0].id if isinstance(stmt.targets[0], ast.Name) else None
        return stmt.value.right if isinstance(left, ast.Name) and left.id == name else left
    return None


def _ast_trivial(term: ast.expr) -> bool:
    """A term no element-wise reduction is made of: a constant (a counter's ``n += 1``), a string
    being built (``s += f"..."``), a display (``xs += [x]`` extends a list)."""
    if isinstance(term, ast.UnaryOp) and isinstance(term.op, (ast.USub, ast.UAdd)):
        term = term.operand
    return isinstance(term, _AST_DISPLAYS)


def _cst_trivial(term: cst.BaseExpression) -> bool:
    """:func:`_ast_trivial` on libcst nodes."""
    if isinstance(term, cst.UnaryOperation) and isinstance(term.operator, (cst.Minus, cst.Plus)):
        term = term.expression
    return isinstance(term, _CST_DISPLAYS)


def _ast_reduced_lists(scope: ast.AST, imports, builtin_ok) -> Set[str]:
    """Names passed first to a reducing call (``torch.stack(L)``, ``sum(L)``...) anywhere in ``scope``."""
    out: Set[str] = set()
    for node in ast.walk(scope):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name):
            func = node.func
            qual = imports.qualify(func)
            if qual in _JOINERS:  # along dim 0 only: what the rewrite consumes
                dims = [*node.args[1:], *(k.value for k in node.keywords if k.arg == "dim")]
                if len(dims) + sum(k.arg != "dim" for k in node.keywords) > 1 or any(k.arg != "dim" for k in node.keywords):
                    continue
                if dims and not (isinstance(dims[0], ast.Constant) and type(dims[0].value) is int and dims[0].value == 0):
                    continue
                out.add(node.args[0].id)
            elif qual in _REDUCERS or (isinstance(func, ast.Name) and func.id == "sum" and builtin_ok("sum")):
                out.add(node.args[0].id)
    return out


def _cst_reduced_lists(scope: cst.CSTNode, imports, builtin_ok) -> Set[str]:
    """:func:`_ast_reduced_lists` on libcst nodes."""
    out: Set[str] = set()

    for node in cast(Iterator[cst.Call], instances(scope, (cst.Call,))):  # every call (a field walk: ~20x cheaper than a visit)
        args = node.args
        if args and args[0].keyword is None and not args[0].star and isinstance(args[0].value, cst.Name):
            func, rest = node.func, args[1:]
            qual = imports.qualify(func)
            if qual in _JOINERS:  # along dim 0 only: what the rewrite consumes
                if len(rest) > 1 or (rest and (rest[0].star or (rest[0].keyword is not None and rest[0].keyword.value != "dim"))):
                    continue
                if rest and not (isinstance(rest[0].value, cst.Integer) and rest[0].value.value == "0"):
                    continue
                out.add(args[0].value.value)
            elif qual in _REDUCERS or (isinstance(func, cst.Name) and func.value == "sum" and builtin_ok("sum")):
                out.add(args[0].value.value)
    return out


def _carries(stmt: cst.BaseSmallStatement) -> bool:
    """Whether ``stmt`` updates a name from its own previous value (``G = r + gamma * G``,
    ``R *= gamma``): the loop carries a value from one iteration to the next."""
    if isinstance(stmt, cst.AugAssign):
        return isinstance(stmt.target, cst.Name)
    if isinstance(stmt, cst.Assign):
        bound = {n for t in stmt.targets for n in (target_names(t.target) or ())}
        return bool(bound & names_read(stmt.value))
    return False


def _sanitize(key: str) -> str:
    return re.sub(r"\W+", "_", key).strip("_") or "x"
