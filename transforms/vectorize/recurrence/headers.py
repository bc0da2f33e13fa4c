"""Recognising backward loop headers: ``reversed(range(T))``, ``range(T - 1, -1, -1)``, ``x[::-1]``,
``zip`` of reversed sequences, ``for t in steps`` with ``steps`` a materialised backward range.
"""
from __future__ import annotations

import ast
import dataclasses
from typing import List, Optional, Sequence, Set, Tuple

import libcst as cst

from .syntax import _code, _is_call, _is_int, _norm, _pure_container

#: the builtins every recognised header may call (``enumerate``: its own form only)
_CORE = ("reversed", "range", "zip", "list", "tuple")


@dataclasses.dataclass
class Header:
    kind: str  # "index": for t in reversed(range(T)); "elements": for r in reversed(x)
    index: Optional[str] = None
    T: Optional[cst.BaseExpression] = None
    elements: List[Tuple[str, cst.BaseExpression]] = dataclasses.field(default_factory=list)
    target: Optional[cst.BaseExpression] = None
    sliced: bool = False  # walks x[::-1]
    unpacked: bool = False  # for a, b in x[::-1]: analysed for a reason only, never rewritten
    named: Optional[cst.Name] = None  # for t in steps, steps a materialised backward range
    counter: Optional[str] = None  # for i, x in enumerate(reversed(xs)): i = 0 .. T-1 while x walks back


def _reversed_slice(node: cst.CSTNode) -> Optional[cst.BaseExpression]:
    """``x`` for ``x[::-1]``."""
    if not isinstance(node, cst.Subscript) or len(node.slice) != 1:
        return None
    sl = node.slice[0].slice
    if not isinstance(sl, cst.Slice) or sl.lower is not None or sl.upper is not None or sl.step is None:
        return None
    if _norm(sl.step) != "-1" or not _pure_container(node.value):
        return None
    return node.value


def _backward_header(node: cst.For, shadowed: Set[str]) -> Optional[Header]:
    if any(b in shadowed for b in _CORE):
        return None
    it, tgt = node.iter, node.target
    name_tgt = tgt.value if isinstance(tgt, cst.Name) else None
    tuple_tgt: Optional[List[str]] = None
    if isinstance(tgt, (cst.Tuple, cst.List)) and all(isinstance(e.value, cst.Name) for e in tgt.elements):
        tuple_tgt = [e.value.value for e in tgt.elements]  # type: ignore[union-attr]
    if _is_call(it, "enumerate", 1) and "enumerate" not in shadowed and isinstance(tgt, (cst.Tuple, cst.List)) \
            and len(tgt.elements) == 2 and isinstance(tgt.elements[0].value, cst.Name):
        # for i, (d, m) in enumerate(zip(reversed(ds), reversed(ms))): the elements walk back, the
        # counter i forward (the planner refuses a body that reads it; build binds it)
        inner = _backward_header(node.with_changes(iter=it.args[0].value, target=tgt.elements[1].value), shadowed)
        counter = tgt.elements[0].value.value
        if inner is None or inner.kind != "elements" or counter in {n for n, _ in inner.elements}:
            return None
        return dataclasses.replace(inner, counter=counter, target=tgt)
    if _is_call(it, "reversed", 1):
        inner = it.args[0].value
        if _is_call(inner, "range") and name_tgt:
            args = [a.value for a in inner.args]
            if len(args) == 1:
                return Header("index", index=name_tgt, T=args[0], target=tgt)
            if len(args) == 2 and _is_int(args[0], 0):
                return Header("index", index=name_tgt, T=args[1], target=tgt)
            return None
        if (_is_call(inner, "list", 1) or _is_call(inner, "tuple", 1)) and tuple_tgt:
            z = inner.args[0].value
            if _is_call(z, "zip") and len(z.args) == len(tuple_tgt) and all(_pure_container(a.value) for a in z.args):
                return Header("elements", elements=list(zip(tuple_tgt, [a.value for a in z.args])), target=tgt)
            if _is_call(z, "enumerate", 1) and len(tuple_tgt) == 2 and _pure_container(z.args[0].value) \
                    and tuple_tgt[0] != tuple_tgt[1] and "enumerate" not in shadowed:
                # for t, r in reversed(list(enumerate(x))): t = n-1 .. 0 and r = x[t]; the guard
                # takes n from length(x) (-1, declined, where len(x) would raise)
                x = z.args[0].value
                return Header("index", index=tuple_tgt[0], T=cst.parse_expression(f"__SBX__.length({_code(x).strip()})"),
                              elements=[(tuple_tgt[1], x)], target=tgt)
            return None
        if _pure_container(inner) and name_tgt:
            return Header("elements", elements=[(name_tgt, inner)], target=tgt)
        return None
    if _is_call(it, "range", 3) and name_tgt:
        first, stop, step = (a.value for a in it.args)
        if _norm(stop) == "-1" and _norm(step) == "-1" and isinstance(first, cst.BinaryOperation) \
                and isinstance(first.operator, cst.Subtract) and isinstance(first.right, cst.Integer) \
                and not first.lpar:
            k = int(first.right.evaluated_value)
            if k == 1:
                return Header("index", index=name_tgt, T=first.left, target=tgt)
            if k >= 2:  # range(X - k, -1, -1): T = X - k + 1 steps (pymarl: the last step set before)
                return Header("index", index=name_tgt, T=cst.parse_expression(f"{_code(first.left).strip()} - {k - 1}"),
                              target=tgt)
        return None
    base = _reversed_slice(it)
    if base is not None and name_tgt:
        return Header("elements", elements=[(name_tgt, base)], target=tgt, sliced=True)
    if base is not None and tuple_tgt:
        return Header("elements", elements=[(n, base) for n in tuple_tgt], target=tgt, sliced=True, unpacked=True)
    if _is_call(it, "zip") and tuple_tgt and len(it.args) == len(tuple_tgt):
        conts: List[cst.BaseExpression] = []
        sliced = False
        for a in it.args:
            v = a.value
            if _is_call(v, "reversed", 1) and _pure_container(v.args[0].value):
                conts.append(v.args[0].value)
            elif _reversed_slice(v) is not None:
                conts.append(_reversed_slice(v))  # type: ignore[arg-type]
                sliced = True
            else:
                return None
        return Header("elements", elements=list(zip(tuple_tgt, conts)), target=tgt, sliced=sliced)
    return None


def _named_range_ast(node: ast.AST, before: Optional[Tuple[list, int]]) -> bool:
    """``for t in steps`` where the nearest assignment to ``steps`` earlier in the same block
    materialises a backward range (``steps = list(range(T - 1, -1, -1))``; dreamerv2)."""
    it = node.iter  # type: ignore[attr-defined]
    if not isinstance(it, ast.Name) or before is None or not isinstance(node.target, ast.Name):  # type: ignore[attr-defined]
        return False
    stmts, i = before
    for st in reversed(stmts[:i]):
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) \
                and st.targets[0].id == it.id:
            v = st.value
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in ("list", "tuple") \
                    and len(v.args) == 1:
                v = v.args[0]
            return isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and (
                (v.func.id == "range" and len(v.args) == 3) or v.func.id == "reversed")
    return False


def _named_range_header(node: cst.For, before: Optional[Tuple[Sequence[cst.BaseStatement], int]],
                        shadowed: Set[str]) -> Optional[Header]:
    """The header of ``for t in steps`` with ``steps = list(range(T - 1, -1, -1))`` (or a tuple,
    the bare range, ``list(reversed(range(T)))``) the nearest assignment to ``steps`` before the
    loop in its block. The guard checks the value at run time (``backward_steps``): the
    assignment only makes the loop a candidate, and gives ``T`` for last-step tests."""
    it, tgt = node.iter, node.target
    if not isinstance(it, cst.Name) or not isinstance(tgt, cst.Name) or before is None \
            or any(b in shadowed for b in _CORE):
        return None
    stmts, i = before
    for st in reversed(list(stmts[:i])):
        if not isinstance(st, cst.SimpleStatementLine):
            continue
        for small in st.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1 \
                    and isinstance(small.targets[0].target, cst.Name) and small.targets[0].target.value == it.value:
                v = small.value
                if _is_call(v, "list", 1) or _is_call(v, "tuple", 1):
                    v = v.args[0].value  # type: ignore[attr-defined]
                fake = node.with_changes(iter=v)
                h = _backward_header(fake, shadowed)
                if h is None or h.kind != "index":
                    return None
                return dataclasses.replace(h, named=it)
    return None


def _walks_backward(node: ast.AST) -> bool:
    """The loop header may walk backwards: reversed(...), zip(...), range(a, b, step), x[::k]."""
    it = node.iter  # type: ignore[attr-defined]
    if isinstance(it, ast.Subscript) and isinstance(it.slice, ast.Slice) and it.slice.step is not None:
        return True
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name):
        if it.func.id == "zip":
            return any(_walks_backward(ast.For(iter=a)) for a in it.args)
        if it.func.id == "enumerate" and len(it.args) == 1:
            return _walks_backward(ast.For(iter=it.args[0]))
        return it.func.id == "reversed" or (it.func.id == "range" and len(it.args) == 3)
    return False
