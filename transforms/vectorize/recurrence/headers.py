"""Recognising backward loop headers: ``reversed(range(T))``, ``range(T - 1, -1, -1)``,
``range(T)[::-1]``, ``sorted(range(T), reverse=True)``, ``x[::-1]``, ``zip`` of reversed sequences
(a pure call chain among zip's arguments bound to a name first: :func:`hoist_zip`), ``for t in
steps`` with ``steps`` a materialised backward range.
"""
from __future__ import annotations

import ast
import dataclasses
from typing import List, Optional, Sequence, Set, Tuple

import libcst as cst

from ...analysis.cstclone import parse_expression, parse_statement
from ...analysis.purity import pure_call
from .syntax import _code, _code_line, _is_call, _is_int, _norm, _pure_container

#: the builtins every recognised header may call (``enumerate``: its own form only)
_CORE = ("reversed", "range", "zip", "list", "tuple")  # and "sorted": its own form only


@dataclasses.dataclass(frozen=True)
class Header:
    kind: str  # "index": for t in reversed(range(T)); "elements": for r in reversed(x)
    index: Optional[str] = None
    T: Optional[cst.BaseExpression] = None
    elements: Sequence[Tuple[str, cst.BaseExpression]] = ()
    target: Optional[cst.BaseExpression] = None
    sliced: bool = False  # walks x[::-1]
    unpacked: bool = False  # for a, b in x[::-1]: analysed for a reason only, never rewritten
    named: Optional[cst.Name] = None  # for t in steps, steps a materialised backward range
    counter: Optional[str] = None  # for i, x in enumerate(reversed(xs)): i = 0 .. T-1 while x walks back

    def __post_init__(self) -> None:  # the first stage's result is frozen: its elements too
        object.__setattr__(self, "elements", tuple(self.elements))


def _minus_one_slice(node: cst.CSTNode) -> Optional[cst.BaseExpression]:
    """``x`` (any expression) for ``x[::-1]``."""
    if not isinstance(node, cst.Subscript) or len(node.slice) != 1:
        return None
    sl = node.slice[0].slice
    if not isinstance(sl, cst.Slice) or sl.lower is not None or sl.upper is not None or sl.step is None:
        return None
    return node.value if _norm(sl.step) == "-1" else None


def _reversed_slice(node: cst.CSTNode) -> Optional[cst.BaseExpression]:
    """``x`` for ``x[::-1]``, ``x`` a name or an attribute chain."""
    base = _minus_one_slice(node)
    return base if base is not None and _pure_container(base) else None


def _range_length(node: cst.CSTNode) -> Optional[cst.BaseExpression]:
    """``T`` for ``range(T)`` / ``range(0, T)`` (keyword-free): the steps 0 .. T - 1."""
    if not _is_call(node, "range") or any(a.keyword is not None or a.star for a in node.args):
        return None
    args = [a.value for a in node.args]
    if len(args) == 1:
        return args[0]
    if len(args) == 2 and _is_int(args[0], 0):
        return args[1]
    return None


def _sorted_reverse(node: cst.CSTNode) -> Optional[cst.BaseExpression]:
    """``x`` for ``sorted(x, reverse=True)`` (the literal ``True``, no ``key``)."""
    if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Name) or node.func.value != "sorted" \
            or len(node.args) != 2:
        return None
    first, kw = node.args
    if first.keyword is not None or first.star or kw.keyword is None or kw.keyword.value != "reverse" \
            or not (isinstance(kw.value, cst.Name) and kw.value.value == "True"):
        return None
    return first.value


def _backward_header(node: cst.For, shadowed: Set[str]) -> Optional[Header]:
    if any(b in shadowed for b in _CORE):
        return None
    it, tgt = node.iter, node.target
    name_tgt = tgt.value if isinstance(tgt, cst.Name) else None
    tuple_tgt: Optional[List[str]] = None
    if isinstance(tgt, (cst.Tuple, cst.List)) and all(isinstance(e.value, cst.Name) for e in tgt.elements):
        tuple_tgt = [e.value.value for e in tgt.elements]
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
                return Header("index", index=tuple_tgt[0], T=parse_expression(f"__SBX__.length({_code(x).strip()})"),
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
                return Header("index", index=name_tgt, T=parse_expression(f"{_code(first.left).strip()} - {k - 1}"),
                              target=tgt)
        return None
    # range(T)[::-1] is range(T - 1, -1, -1); sorted(range(T), reverse=True) is its list: both
    # give t = T - 1 .. 0 for any int T, as reversed(range(T)) does
    walked = _minus_one_slice(it)
    if walked is None and "sorted" not in shadowed:
        walked = _sorted_reverse(it)
    if walked is not None and name_tgt and _range_length(walked) is not None:
        return Header("index", index=name_tgt, T=_range_length(walked), target=tgt)
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
    it = node.iter
    if not isinstance(it, ast.Name) or before is None or not isinstance(node.target, ast.Name):
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
                    v = v.args[0].value
                fake = node.with_changes(iter=v)
                h = _backward_header(fake, shadowed)
                if h is None or h.kind != "index":
                    return None
                return dataclasses.replace(h, named=it)
    return None


def _walks_backward(node: ast.AST) -> bool:
    """The loop header may walk backwards: reversed(...), zip(...), range(a, b, step), x[::k]."""
    it = node.iter
    if isinstance(it, ast.Subscript) and isinstance(it.slice, ast.Slice) and it.slice.step is not None:
        return True
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name):
        if it.func.id == "zip":
            return any(_walks_backward(ast.For(iter=a)) for a in it.args)
        if it.func.id == "enumerate" and len(it.args) == 1:
            return _walks_backward(ast.For(iter=it.args[0]))
        if it.func.id == "sorted" and it.args and isinstance(it.args[0], ast.Call) \
                and isinstance(it.args[0].func, ast.Name) and it.args[0].func.id == "range":  # sorted(range(T), reverse=True)
            return any(k.arg == "reverse" and isinstance(k.value, ast.Constant) and k.value.value is True
                       for k in it.keywords)
        return it.func.id == "reversed" or (it.func.id == "range" and len(it.args) == 3)
    return False


# --------------------------------------------------------------------------- zip arguments hoisted


@dataclasses.dataclass
class Hoist:
    """``for d, m in zip(ds[::-1], x.cpu().numpy()[::-1])``: zip evaluates each argument once,
    before the loop, so the rewrite may evaluate ``x.cpu().numpy()`` once into a fresh name before
    the guard; both branches then read that name (the fallback loop walks the same objects)."""
    node: cst.For  # the loop reading the temporaries
    lines: List[cst.SimpleStatementLine]  # tmp = <argument>, in the arguments' order
    note: str  # for the site's reason

    def wrap(self, new: cst.BaseStatement) -> cst.FlattenSentinel:
        """The assignments, then ``new`` (the comments above the loop stay above the first line)."""
        lines = list(self.lines)
        lines[0] = lines[0].with_changes(leading_lines=new.leading_lines)
        return cst.FlattenSentinel([*lines, new.with_changes(leading_lines=())])


def _plain_operand(e: cst.BaseExpression) -> bool:
    """An argument whose evaluation has no effect: a name, an attribute chain, a number literal."""
    if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Minus):
        e = e.expression
    return _pure_container(e) or isinstance(e, (cst.Integer, cst.Float, cst.SimpleString)) \
        or (isinstance(e, cst.Name) and e.value in ("None", "True", "False"))


#: tensor methods the purity table leaves out that have no effect either (``numpy()``: the
#: array sharing the tensor's memory)
_PURE_TOO = frozenset({"numpy"})


def _pure_chain(e: cst.BaseExpression, imports) -> bool:
    """A chain of pure method calls (the purity table's) and slices on a name or an attribute
    chain, with plain arguments: ``x.cpu().flatten().numpy()``, ``buf.dones.reshape(-1)``,
    ``values[1:]``."""
    while not _pure_container(e):
        if isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute) \
                and (pure_call(e, imports) or (e.func.attr.value in _PURE_TOO and not e.args
                                               and pure_call(e.with_changes(func=e.func.with_changes(
                                                   attr=cst.Name("abs"))), imports))) \
                and all(not a.star and _plain_operand(a.value) for a in e.args):
            e = e.func.value
        elif isinstance(e, cst.Attribute) and isinstance(e.value, cst.Call):  # x.cpu().data
            e = e.value
        elif _plain_slice(e):  # values[:-1], values[1:]: a view (arrays) or a copy (lists)
            e = e.value
        else:
            return False
    return True


def _plain_slice(e: cst.BaseExpression) -> bool:
    """``x[a:b]`` / ``x[a:b:c]`` with plain bounds (names, attribute chains, number literals)."""
    if not isinstance(e, cst.Subscript) or len(e.slice) != 1 or not isinstance(e.slice[0].slice, cst.Slice):
        return False
    sl = e.slice[0].slice
    return all(b is None or _plain_operand(b) for b in (sl.lower, sl.upper, sl.step))


def hoist_zip(node: cst.For, shadowed: Set[str], imports, fresh) -> Optional[Hoist]:
    """``for a, b in zip(<reversed or [::-1] of X>...)`` with some ``X`` a pure call chain rather
    than a name: the loop with each such ``X`` read from a fresh name, bound before it. Only zip's
    own arguments (evaluated once by the original too); every hoisted chain free of side effects,
    so evaluating it before the others' ``[::-1]`` / ``reversed`` is not observable."""
    it = node.iter
    if any(b in shadowed for b in _CORE) or not _is_call(it, "zip") or not isinstance(node.target, (cst.Tuple, cst.List)):
        return None
    args: List[cst.Arg] = []
    lines: List[cst.SimpleStatementLine] = []
    hoisted: List[str] = []
    for a in it.args:
        v = a.value
        if a.star or a.keyword is not None:
            return None
        if _is_call(v, "reversed", 1):
            base = v.args[0].value
        else:
            base = _minus_one_slice(v)
        if base is None:
            return None
        if _pure_container(base):
            args.append(a)
            continue
        if not _pure_chain(base, imports):
            return None
        name = fresh("zipped")
        lines.append(parse_statement(f"{name} = {_code_line(base)}"))  # type: ignore[arg-type]
        hoisted.append(f"`{_code_line(base)}` into `{name}`")
        new_v = v.with_changes(args=[v.args[0].with_changes(value=cst.Name(name))]) if isinstance(v, cst.Call) \
            else v.with_changes(value=cst.Name(name))
        args.append(a.with_changes(value=new_v))
    if not lines:
        return None
    note = f"hoisted {', '.join(hoisted)}"  # when and why: the "hoisted" contract (the site's details)
    return Hoist(node.with_changes(iter=it.with_changes(args=args)), lines, note)
