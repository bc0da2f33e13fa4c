"""Purity of expressions and calls: which operators and calls are free of side effects, which
functions and methods are exact (correctly rounded) or inexact elementwise, and simple references.
"""
from __future__ import annotations

from typing import Set

import libcst as cst


_PURE_BINOPS = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Power, cst.Modulo)


def is_pure(expr: cst.BaseExpression, forbidden: Set[str] = frozenset()) -> bool:
    """An expression without calls or side effects: names, attributes, numbers, arithmetic.

    ``forbidden`` names (loop variables) make it impure: the value would change per iteration.
    Attribute reads are taken as pure (properties with side effects are not modelled).
    """
    if isinstance(expr, cst.Name):
        return expr.value not in forbidden and expr.value not in ("print",)
    if isinstance(expr, (cst.Integer, cst.Float, cst.Imaginary)):
        return True
    if isinstance(expr, cst.Attribute):
        return is_pure(expr.value, forbidden)
    if isinstance(expr, cst.UnaryOperation):
        return isinstance(expr.operator, (cst.Minus, cst.Plus)) and is_pure(expr.expression, forbidden)
    if isinstance(expr, cst.BinaryOperation):
        return (
            isinstance(expr.operator, _PURE_BINOPS)
            and is_pure(expr.left, forbidden)
            and is_pure(expr.right, forbidden)
        )
    if isinstance(expr, cst.Subscript):  # cfg["tau"], taus[0], taus[k]
        if len(expr.slice) != 1 or not isinstance(expr.slice[0].slice, cst.Index):
            return False
        index = expr.slice[0].slice.value
        return is_pure(expr.value, forbidden) and (
            isinstance(index, (cst.Integer, cst.SimpleString))
            or (isinstance(index, cst.Name) and index.value not in forbidden)
        )
    return False


def is_simple_ref(expr: cst.BaseExpression) -> bool:
    """``a``, ``a.b.c``, ``a[0]``, ``self.nets[i]``: cheap to evaluate twice, no side effects."""
    if isinstance(expr, cst.Name):
        return True
    if isinstance(expr, cst.Attribute):
        return is_simple_ref(expr.value)
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1:
        el = expr.slice[0].slice
        return (
            is_simple_ref(expr.value)
            and isinstance(el, cst.Index)
            and isinstance(el.value, (cst.Integer, cst.SimpleString, cst.Name))
        )
    return False


#: torch functions (qualified) and tensor methods that act element by element and whose batched
#: result is bitwise the per-element result (correctly rounded IEEE operations, selections)
EXACT_FUNCS = frozenset(
    {
        "torch.abs", "torch.neg", "torch.negative", "torch.relu", "torch.nn.functional.relu",
        "torch.square", "torch.sqrt", "torch.clamp", "torch.clip", "torch.minimum", "torch.maximum",
        "torch.add", "torch.sub", "torch.subtract", "torch.mul", "torch.multiply", "torch.div",
        "torch.divide", "torch.true_divide",
    }
)


#: element by element too, but vectorized kernels (SIMD transcendental approximations) may round
#: differently from the kernels that process one element: ``reassociated`` (≤ a few ulp)
INEXACT_FUNCS = frozenset(
    {
        "torch.exp", "torch.log", "torch.log1p", "torch.expm1", "torch.tanh", "torch.sigmoid",
        "torch.sin", "torch.cos", "torch.pow", "torch.nn.functional.tanh", "torch.nn.functional.sigmoid",
        "torch.nn.functional.silu", "torch.special.expit",
    }
)


EXACT_METHODS = frozenset(
    {"abs", "neg", "negative", "relu", "square", "sqrt", "clamp", "clip", "add", "sub", "mul", "div", "minimum", "maximum"}
)


INEXACT_METHODS = frozenset({"exp", "log", "log1p", "expm1", "tanh", "sigmoid", "sin", "cos", "pow"})


#: keyword arguments allowed on the calls above (others change meaning: alpha=, rounding_mode=, out=)
ALLOWED_KEYWORDS = frozenset({"min", "max", "exponent"})
