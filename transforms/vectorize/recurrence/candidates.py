"""Which backward loops are worth planning (a value flows from one step to the next), and forward
look-alikes reported with their reason.
"""
from __future__ import annotations

import ast
from typing import List, Optional, Sequence, Set, Tuple, cast

import libcst as cst

from ...analysis.cstwalk import of_type
from .syntax import _bound_names, _names_read, _norm, _pure_container, _stmts
from .headers import Header
from .lists import list_readback_candidate


def _coefficient(e: ast.AST, i: str) -> Optional[int]:
    """The coefficient of ``i`` in ``e`` where ``e`` is affine in ``i`` (sums, differences,
    negation, integer multiples; every other part free of ``i``), else None."""
    if isinstance(e, ast.Name) and e.id == i:
        return 1
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)):
        a, b = _coefficient(e.left, i), _coefficient(e.right, i)
        if a is None or b is None:
            return None
        return a + b if isinstance(e.op, ast.Add) else a - b
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
        a = _coefficient(e.operand, i)
        return None if a is None else (-a if isinstance(e.op, ast.USub) else a)
    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
        for k, x in ((e.left, e.right), (e.right, e.left)):
            lit = k.operand if isinstance(k, ast.UnaryOp) and isinstance(k.op, (ast.USub, ast.UAdd)) else k
            if isinstance(lit, ast.Constant) and type(lit.value) is int:
                a = _coefficient(x, i)
                sign = -1 if isinstance(k, ast.UnaryOp) and isinstance(k.op, ast.USub) else 1
                return None if a is None else a * sign * lit.value
    return 0 if not any(isinstance(n, ast.Name) and n.id == i for n in ast.walk(e)) else None


def _computed_backward(node: ast.AST, i: str) -> Optional[str]:
    """``for i in range(...)`` whose body's own statements set ``idx = n - 1 - i`` (affine in
    ``i`` with coefficient -1) and subscript by ``idx``, or write ``out[n - 1 - i]``: the loop
    walks backward by that index."""
    body = node.body  # type: ignore[attr-defined]
    for st in body:
        if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)
                and st.targets[0].id != i and _coefficient(st.value, i) == -1):
            continue
        idx = st.targets[0].id
        if not any(isinstance(n, ast.Subscript) and any(isinstance(m, ast.Name) and m.id == idx
                                                        for m in ast.walk(n.slice)) for b in body for n in ast.walk(b)):
            continue
        return (f"backward walk through a computed index (`{idx} = {ast.unparse(st.value)}` on the forward "
                f"`for {i} in {ast.unparse(node.iter)}`): not vectorized (only loops whose header walks "  # type: ignore[attr-defined]
                "backward are)")
    for b in body:  # written in place: out[n - 1 - i] = ...
        for n in ast.walk(b):
            parts = n.slice.elts if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Tuple) else \
                [n.slice] if isinstance(n, ast.Subscript) else []
            coefs = [_coefficient(p, i) if not isinstance(p, ast.Slice) else 0 for p in parts]  # None: not affine
            if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store) and None not in coefs \
                    and coefs.count(-1) == 1 and coefs.count(0) == len(coefs) - 1:
                return (f"backward walk through a computed index (`{ast.unparse(n)}` written on the forward "
                        f"`for {i} in {ast.unparse(node.iter)}`): not vectorized (only loops whose header walks "  # type: ignore[attr-defined]
                        "backward are)")
    return None


def _forward_memory(node: ast.AST) -> Optional[str]:
    """Why a forward ``for i in range(...)`` loop is reported: it walks backward through a computed
    index (``idx = n - 1 - i``), or it reads what it wrote the step before (out[i] = f(out[i-1]))."""
    it, tgt = node.iter, node.target  # type: ignore[attr-defined]
    if not (isinstance(tgt, ast.Name) and isinstance(it, ast.Call) and isinstance(it.func, ast.Name)
            and it.func.id == "range"):
        return None
    i = tgt.id
    computed = _computed_backward(node, i)
    if computed is not None:
        return computed
    written: Set[str] = set()
    reads: List[Tuple[str, str]] = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Subscript) and isinstance(sub.value, (ast.Name, ast.Attribute)):
            base = ast.unparse(sub.value)
            idx = sub.slice
            if isinstance(sub.ctx, ast.Store) and isinstance(idx, ast.Name) and idx.id == i:
                written.add(base)
            elif isinstance(sub.ctx, ast.Load) and isinstance(idx, ast.BinOp) and isinstance(idx.op, ast.Sub) \
                    and isinstance(idx.left, ast.Name) and idx.left.id == i and isinstance(idx.right, ast.Constant):
                reads.append((base, ast.unparse(sub)))
    for base, text in reads:
        if base in written:
            return (f"forward recurrence through memory: reads `{text}`, which the loop wrote the step "
                    "before (only backward carried-value recurrences are vectorized)")
    return None


def _loose_candidate(node: cst.For, header: Header) -> bool:
    """A backward loop is a candidate when some value flows from one step to the next: a name read
    before it is assigned in the body, or a container read at another index than it is written."""
    # recurrence through memory: out[t] written and out[t + 1] read
    written: Set[str] = set()
    read: Set[str] = set()
    stores: Set[int] = set()
    # the body's nodes by exact type (cstwalk.typed, shared with the loop's other checks); an
    # assignment target comes before its subscript in a walk, so taking the targets first is alike
    for a in of_type(node.body, cst.AssignTarget):
        target = a.target
        if type(target) is cst.Subscript and _pure_container(cast(cst.Subscript, target).value):
            written.add(_norm(cast(cst.Subscript, target).value))
            stores.add(id(target))
    for n in of_type(node.body, cst.Subscript):
        if id(n) not in stores and _pure_container(n.value):
            read.add(_norm(n.value))
    if written & read or list_readback_candidate(node):  # lists.py: adv.append(f(adv[-1]))
        return True
    assigned = _bound_names(node.body) - ({header.index} if header.index else set()) \
        - {n for n, _ in header.elements}
    if not assigned:
        return False
    hit, _ = _read_before_bound(_stmts(node.body), set(), assigned)
    return hit


def _read_before_bound(stmts: Sequence[cst.BaseStatement], defined: Set[str], assigned: Set[str]) -> Tuple[bool, Set[str]]:
    """Whether a statement reads a name of ``assigned`` before the body binds it on every path (a
    value carried from the step before), and the names bound on every path so far."""
    for st in stmts:
        if isinstance(st, cst.SimpleStatementLine):
            for small in st.body:
                if isinstance(small, cst.Assign):
                    reads = _names_read(small.value)
                    for tg in small.targets:
                        if not isinstance(tg.target, cst.Name):
                            reads |= _names_read(tg.target)
                else:
                    reads = _names_read(small)
                    if isinstance(small, cst.AugAssign):
                        reads |= _names_read(small.target)
                if (reads & assigned) - defined:
                    return True, defined
                if isinstance(small, cst.Assign):
                    for tg in small.targets:
                        if isinstance(tg.target, cst.Name):
                            defined = defined | {tg.target.value}
        elif isinstance(st, cst.If):
            if (_names_read(st.test) & assigned) - defined:
                return True, defined
            hit1, d1 = _read_before_bound(_stmts(st.body), set(defined), assigned)
            if hit1:
                return True, defined
            if st.orelse is not None:
                other = [st.orelse] if isinstance(st.orelse, cst.If) else _stmts(st.orelse.body)
                hit2, d2 = _read_before_bound(other, set(defined), assigned)
                if hit2:
                    return True, defined
                defined = d1 & d2
        else:
            if (_names_read(st) & assigned) - defined:
                return True, defined
    return False, defined
