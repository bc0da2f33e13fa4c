"""Episode-reset conditions beyond a bare flag: ``if dones[t] == 1:``, ``if dones[t][0].item():``.

A reset ``if <cond>: s = 0`` is vectorized from one truth value per step, computed for all steps
at once by ``vectorized.truth_of``. Understood here, around a per-step read ``x[t]`` (or a column
of it, ``x[t][0]`` as ``x[t, 0]``): the bare value (its truth), ``x[t].item()`` (the same truth:
``bool(v.item())`` is ``bool(v)`` for a one-element array; lists are declined by the guard,
``vectorized.arrays_only``, since their numbers have no ``.item()``), and one comparison with a
number literal, ``x[t] == 1`` (the runtime compares the whole array with the same operator and the
same Python number, which promotes as the per-step comparison does). ``.item()`` under a
comparison is not understood (it would compare Python floats, not the array's dtype).
"""
from __future__ import annotations

from typing import Optional, Tuple

import libcst as cst

from ...analysis.cstclone import parse_expression
from .body import _is_number
from .syntax import _code

_OPS = {cst.Equal: "==", cst.NotEqual: "!=", cst.LessThan: "<", cst.LessThanEqual: "<=",
        cst.GreaterThan: ">", cst.GreaterThanEqual: ">="}
_FLIP = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def split_cond(e: cst.BaseExpression) -> Tuple[cst.BaseExpression, str, str]:
    """(per-step read, test, number) for a reset condition without its ``not``: test "" (the
    value's truth), "item" (``.item()``'s truth) or a comparison operator with the number's code.
    Anything else comes back as (e, "", "") for the caller's per-step check to refuse."""
    if isinstance(e, cst.Comparison) and len(e.comparisons) == 1 and not e.lpar:
        comp = e.comparisons[0]
        op = _OPS.get(type(comp.operator))
        if op is not None and _is_number(comp.comparator) and not _is_number(e.left):
            return _column(e.left), op, _code(comp.comparator).strip()
        if op is not None and _is_number(e.left) and not _is_number(comp.comparator):
            return _column(comp.comparator), _FLIP[op], _code(e.left).strip()
        return e, "", ""
    if isinstance(e, cst.Call) and not e.args and isinstance(e.func, cst.Attribute) and e.func.attr.value == "item":
        return _column(e.func.value), "item", ""
    return _column(e), "", ""


def _column(e: cst.BaseExpression) -> cst.BaseExpression:
    """``x[t][i]`` (integer literal indices) as ``x[t, i]``: the same element of a tensor or numpy
    array (the runtime's column view declines anything else)."""
    if (isinstance(e, cst.Subscript) and isinstance(e.value, cst.Subscript) and len(e.value.slice) == 1
            and not e.lpar and not e.value.lpar
            and all(isinstance(s.slice, cst.Index) and _is_number(s.slice.value) for s in e.slice)):
        return e.value.with_changes(slice=[e.value.slice[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)]
                                    + [s.with_changes(comma=cst.MaybeSentinel.DEFAULT) for s in e.slice])
    return e


def cond_key(test: str, number: str) -> str:
    return f"{test}{number}"


def truth_args(test: str, number: str) -> str:
    """The extra arguments of ``truth_of`` for a test."""
    if test in ("", "item"):
        return ""
    return f", {test!r}, {number}"


def node_for(test: str, cont: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """The container the guard checks: lists declined for ``.item()``."""
    if test == "item":
        return parse_expression(f"__SBX__.arrays_only({_code(cont).strip()})")
    return None
