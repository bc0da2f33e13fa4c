"""The affine decomposition of the carried update ``s = b_t + a_t * s`` (exact where the grouping
allows, regrouped only with ``reassociate``) and the :class:`Recurrence` it yields. Part of the
plan stage: functions of the stage's :class:`~.render.Renderer` (the coefficients are rendered
arrays, and their invariants go to its tables) and of the frozen :class:`~.analysis.Analysis`.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from .syntax import _code, _names_read, _one_line, Skip
from .body import AnyItem
from .render import Renderer
from .analysis import Analysis


@dataclasses.dataclass(frozen=True)
class Recurrence:
    var: str
    item: AnyItem
    exact: bool
    a: str
    b: str
    reset: Optional[AnyItem] = None
    pattern: str = ""


def affine_exact(r: Renderer, value: cst.BaseExpression, s: str, env: Dict[str, str]):
    """(a, b, a_node) when ``value`` is ``B + P * s`` (or an equivalent exact spelling)."""
    if not isinstance(value, cst.BinaryOperation) or not isinstance(value.operator, (cst.Add, cst.Subtract)):
        return None
    left_s, right_s = s in _names_read(value.left), s in _names_read(value.right)
    if left_s == right_s:
        return None
    m, other = (value.right, value.left) if right_s else (value.left, value.right)
    coef: Optional[cst.BaseExpression]
    if isinstance(m, cst.Name) and m.value == s:
        coef = None
    elif isinstance(m, cst.BinaryOperation) and isinstance(m.operator, cst.Multiply):
        if isinstance(m.right, cst.Name) and m.right.value == s and s not in _names_read(m.left):
            coef = m.left
        elif isinstance(m.left, cst.Name) and m.left.value == s and s not in _names_read(m.right):
            coef = m.right
        else:
            return None
    else:
        return None
    a = "1" if coef is None else r.render(coef, env)
    b = r.render(other, env)
    if isinstance(value.operator, cst.Subtract):
        if right_s:  # B - P*s == B + (-P)*s exactly
            a = "-1" if coef is None else f"-({a})"
        else:  # P*s - B == (-B) + P*s exactly
            b = f"-({b})"
    return a, b, coef

def affine(r: Renderer, e: cst.BaseExpression, s: str, env: Dict[str, str]) -> Tuple[Optional[str], Optional[str]]:
    """(A, B) with e == A*s + B algebraically (None: zero); Skip when s appears non-affinely."""
    if s not in _names_read(e):
        return None, r.render(e, env)
    par = lambda x: f"({x})"  # noqa: E731
    if isinstance(e, cst.Name) and e.value == s:
        return "1", None
    if isinstance(e, cst.BinaryOperation):
        op = e.operator
        if isinstance(op, (cst.Add, cst.Subtract)):
            a1, b1 = affine(r, e.left, s, env)
            a2, b2 = affine(r, e.right, s, env)
            sign = " + " if isinstance(op, cst.Add) else " - "

            def comb(x, y):
                if x is None and y is None:
                    return None
                if y is None:
                    return x
                if x is None:
                    return y if sign == " + " else f"-{par(y)}"
                return f"{par(x)}{sign}{par(y)}"

            return comb(a1, a2), comb(b1, b2)
        if isinstance(op, (cst.Multiply, cst.Divide)):
            ls, rs = s in _names_read(e.left), s in _names_read(e.right)
            if ls and rs:
                raise Skip(f"the carried value `{s}` appears non-affinely in `{_code(e).strip()}`")
            if isinstance(op, cst.Divide):
                if rs:
                    raise Skip(f"the carried value `{s}` appears non-affinely in `{_code(e).strip()}`")
                r.divides = True
                a1, b1 = affine(r, e.left, s, env)
                rt = r.render(e.right, env)
                return (None if a1 is None else f"{par(a1)} / {par(rt)}",
                        None if b1 is None else f"{par(b1)} / {par(rt)}")
            if ls:
                a1, b1 = affine(r, e.left, s, env)
                rt = r.render(e.right, env)
                return (None if a1 is None else (rt if a1 == "1" else f"{par(a1)} * {par(rt)}"),
                        None if b1 is None else f"{par(b1)} * {par(rt)}")
            a1, b1 = affine(r, e.right, s, env)
            lft = r.render(e.left, env)
            return (None if a1 is None else (lft if a1 == "1" else f"{par(lft)} * {par(a1)}"),
                    None if b1 is None else f"{par(lft)} * {par(b1)}")
    if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Minus):
        a1, b1 = affine(r, e.expression, s, env)
        return (None if a1 is None else f"-{par(a1)}", None if b1 is None else f"-{par(b1)}")
    if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Plus):
        return affine(r, e.expression, s, env)
    raise Skip(f"the carried value `{s}` appears non-affinely in `{_code(e).strip()}`")

def recurrence(r: Renderer, a_: Analysis, it: AnyItem, env: Dict[str, str], reassociate: bool) -> Recurrence:
    """The carried update ``it`` as ``s = b + a * s`` over the middle steps (exact, or regrouped
    when ``reassociate``), with the site's pattern text; Skip where it is not affine in ``s``."""
    s = it.var
    assert s is not None and it.value is not None
    shown = it.shown if it.shown is not None else it.value  # as written (a last-step conditional kept)
    memo_src = a_.memo_src
    ex = affine_exact(r, it.value, s, env)
    if ex is not None:
        a, b, coef = ex
        exact = True
        pattern = f"`{memo_src[s]}`, carried through memory," if s in memo_src else \
            f"`{s} = {_one_line(shown)}`"
    else:
        a1, b1 = affine(r, it.value, s, env)
        if a1 is None:  # pragma: no cover - s is read in its update
            raise Skip(f"`{s}` does not depend on itself")
        if b1 is None:
            raise Skip(f"`{s}` is a pure product (no per-step input to add)")
        if not reassociate:
            raise Skip(f"`{s} = {_code(it.value).strip()}` needs its coefficients regrouped "
                       "(reassociation is off: [vectorize.recurrence] reassociate = false)")
        a, b, coef = a1, b1, None
        exact = False
        pattern = f"`{memo_src[s]}`, carried through memory," if s in memo_src else \
            f"`{s} = {_one_line(shown)}`"
        pattern += " (coefficients regrouped)"
    if not r.has_step(b):
        raise Skip(f"the update of `{s}` adds no per-step input")
    a_per_step = r.has_step(a)
    if not a_per_step:
        # the coefficient is loop-invariant: the guard wants Python numbers / 0-d arrays
        inv = coef if exact else it.value
        for name in (_invariants_in(a_, inv, s) if inv is not None else []):
            r.scalars[name] = None
    return Recurrence(s, it, exact, a, b, a_.flow.resets.get(s), pattern)


def _invariants_in(a_: Analysis, e: cst.BaseExpression, s: str) -> List[str]:
    out: List[str] = []
    _gather_invariants(a_, e, s, out, set())
    return out


def _gather_invariants(a_: Analysis, x: cst.BaseExpression, s: str, out: List[str], seen: Set[str]) -> None:
    assign_of, reads = a_.flow.assign_of, a_.reads
    if isinstance(x, cst.Name):
        if x.value in assign_of and x.value != s and x.value not in seen:
            seen.add(x.value)
            _gather_invariants(a_, assign_of[x.value].value, s, out, seen)  # type: ignore[arg-type]
        elif x.value != s and x.value not in a_.body_assigned and x.value not in reads.elements:
            out.append(x.value)
    elif isinstance(x, (cst.Attribute, cst.Subscript)) and reads.per_step(x) is None \
            and not reads.reads_written(x):
        out.append(_code(x).strip())
    elif isinstance(x, cst.BinaryOperation):
        _gather_invariants(a_, x.left, s, out, seen)
        _gather_invariants(a_, x.right, s, out, seen)
    elif isinstance(x, cst.UnaryOperation):
        _gather_invariants(a_, x.expression, s, out, seen)
