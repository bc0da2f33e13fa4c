"""Purity of expressions and calls: which operators and calls are free of side effects, which
functions and methods are exact (correctly rounded) or inexact elementwise, and simple references.

The one table of known-pure calls (:data:`PURE_FUNCS`, :data:`PURE_METHODS`, read through
:func:`pure_call`) is what every transform consults before it calls something "unknown side
effects". Pure only lets an analysis go on: whether a call acts element by element, is exact, or
can be hoisted is each transform's own question (the exact / inexact tables below answer the first).
"""
from __future__ import annotations

from typing import Set

import libcst as cst

from ..names import dotted


_PURE_BINOPS = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Power, cst.Modulo)


def is_pure(expr: cst.BaseExpression, forbidden: Set[str] = frozenset(), imports=None) -> bool:
    """An expression without side effects: names, attributes, numbers, arithmetic, and, given the
    module's ``imports``, calls :func:`pure_call` knows (receiver and arguments pure too; the
    receiver of a method is not type-checked at run time, so ``guarded=False``).

    ``forbidden`` names (loop variables) make it impure: the value would change per iteration.
    Attribute reads are taken as pure (properties with side effects are not modelled).
    """
    if isinstance(expr, cst.Call):
        if imports is None or not pure_call(expr, imports, guarded=False):
            return False
        if isinstance(expr.func, cst.Attribute) and imports.qualify(expr.func) is None \
                and not is_pure(expr.func.value, forbidden, imports):
            return False
        return all(is_pure(a.value, forbidden, imports) for a in expr.args)
    if isinstance(expr, cst.Name):
        return expr.value not in forbidden and expr.value not in ("print",)
    if isinstance(expr, (cst.Integer, cst.Float, cst.Imaginary)):
        return True
    if isinstance(expr, cst.Attribute):
        return is_pure(expr.value, forbidden, imports)
    if isinstance(expr, cst.UnaryOperation):
        return isinstance(expr.operator, (cst.Minus, cst.Plus)) and is_pure(expr.expression, forbidden, imports)
    if isinstance(expr, cst.BinaryOperation):
        return (
            isinstance(expr.operator, _PURE_BINOPS)
            and is_pure(expr.left, forbidden, imports)
            and is_pure(expr.right, forbidden, imports)
        )
    if isinstance(expr, cst.Subscript):  # cfg["tau"], taus[0], taus[k]
        if len(expr.slice) != 1 or not isinstance(expr.slice[0].slice, cst.Index):
            return False
        index = expr.slice[0].slice.value
        return is_pure(expr.value, forbidden, imports) and (
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


# --------------------------------------------------------------------------- the pure-call table
#
# A call is pure when it returns a value and writes nothing the caller can see: no in-place
# update, no I/O, no random state (``torch.rand``, ``np.random.*``, ``F.dropout`` are left out:
# calling them once instead of per step changes what they return). Views (``view``, ``reshape``,
# ``t``, ``detach``, ``expand``) alias their input but write nothing: pure; whether a later
# write through an alias matters is each guard's storage check. Left out on purpose: every name
# ending in ``_`` (``add_``, ``copy_``, ``resize_``, ``clamp_``...), ``backward``, ``append`` /
# ``extend`` / ``insert`` / ``pop`` / ``sort`` (containers, ndarrays), ``numpy()`` (an ndarray
# sharing the tensor's memory, outside the guards' storage checks; it also raises on tensors that
# require grad), ``cuda()`` (may initialise a device), ``empty``/``empty_like`` (uninitialised
# memory).

_TORCH_PURE = (
    "abs absolute neg negative exp exp2 expm1 log log2 log10 log1p sqrt rsqrt square pow float_power "
    "sin cos tan asin acos atan atan2 sinh cosh tanh sigmoid relu clamp clip clamp_min clamp_max "
    "minimum maximum fmin fmax where add sub subtract mul multiply div divide true_divide floor_divide "
    "remainder fmod floor ceil round trunc frac sign sgn reciprocal lerp erf erfc lgamma digamma "
    "nan_to_num sum mean nanmean prod cumsum cumprod max min amax amin argmax argmin std var norm "
    "logsumexp softmax log_softmax gather index_select masked_select masked_fill take take_along_dim "
    "cat concat concatenate stack hstack vstack flatten reshape squeeze unsqueeze transpose permute t "
    "flip roll narrow chunk split unbind movedim matmul mm bmm dot outer einsum isnan isinf isfinite "
    "logical_and logical_or logical_not logical_xor eq ne lt le gt ge equal allclose isclose all any "
    "numel zeros ones full arange linspace eye zeros_like ones_like full_like tensor as_tensor "
    "from_numpy detach clone diff sort argsort topk broadcast_to tile"
)
_FUNCTIONAL_PURE = (
    "relu leaky_relu elu selu gelu silu mish softplus softsign hardtanh sigmoid tanh logsigmoid "
    "softmax log_softmax normalize one_hot pad linear mse_loss l1_loss smooth_l1_loss huber_loss "
    "cross_entropy nll_loss binary_cross_entropy binary_cross_entropy_with_logits kl_div"
)
_NUMPY_PURE = (
    "abs absolute negative exp exp2 expm1 log log2 log10 log1p sqrt square power sin cos tan tanh "
    "clip minimum maximum where add subtract multiply divide true_divide floor ceil round rint trunc "
    "sign reciprocal sum mean nanmean prod cumsum cumprod max min amax amin argmax argmin std var "
    "dot matmul outer concatenate stack hstack vstack reshape squeeze expand_dims transpose flip "
    "asarray array zeros ones full arange linspace zeros_like ones_like full_like isnan isinf "
    "isfinite tile repeat logical_and logical_or logical_not all any diff sort argsort"
)
_MATH_PURE = (
    "exp expm1 log log1p log2 log10 sqrt pow fabs floor ceil trunc tanh sin cos tan atan atan2 erf "
    "erfc lgamma isnan isinf isfinite fsum prod copysign hypot"
)

#: functions, by qualified name after import resolution (``np.`` -> ``numpy.``, ``F.`` ->
#: ``torch.nn.functional.``): a user function of the same name, or a rebound ``torch``, does not
#: qualify to these names, so it stays unknown
PURE_FUNCS = frozenset(
    [f"torch.{n}" for n in _TORCH_PURE.split()]
    + [f"torch.nn.functional.{n}" for n in _FUNCTIONAL_PURE.split()]
    + [f"torch.special.{n}" for n in ("expit", "logit", "erf", "expm1", "log1p", "logsumexp")]
    + [f"numpy.{n}" for n in _NUMPY_PURE.split()]
    + [f"math.{n}" for n in _MATH_PURE.split()]
)

#: methods, by name. The engine cannot type the receiver: it assumes the receiver is a tensor or
#: an ndarray (or a Python number), which is what the transforms' run-time guards check for
#: the values they batch. A user object with a mutating method of one of these names would be
#: misjudged where no guard checks the receiver (``guarded=False`` then narrows the table).
PURE_METHODS = frozenset(
    (
        "abs neg negative exp log log1p expm1 sqrt rsqrt square pow sin cos tanh sigmoid relu clamp "
        "clip clamp_min clamp_max minimum maximum add sub mul div floor ceil round sign reciprocal "
        "sum mean prod std var max min amax amin argmax argmin cumsum cumprod norm logsumexp softmax "
        "log_softmax gather index_select masked_fill where detach clone float double half bfloat16 "
        "long int bool to type cpu astype view view_as reshape reshape_as squeeze unsqueeze flatten "
        "t transpose permute expand expand_as repeat contiguous flip narrow chunk split unbind size "
        "dim numel item tolist mm matmul bmm dot eq ne lt le gt ge all any isnan isfinite nan_to_num "
        "argsort topk copy"
    ).split()
)
# not ``sort``: ``tensor.sort()`` returns a sorted copy, but ``ndarray.sort()`` and ``list.sort()``
# sort in place (``torch.sort`` / ``numpy.sort`` are functions: pure)

#: tensor conversions that are in-place on an ``nn.Module`` (``net.float()`` casts its
#: parameters and returns it): pure only where a guard has checked the receiver is a tensor
MODULE_INPLACE_METHODS = frozenset({"to", "float", "double", "half", "bfloat16", "type", "cpu"})

#: keywords that make a pure function write (``out=``) or update its input (``inplace=True``)
WRITING_KEYWORDS = frozenset({"out", "inplace"})


def pure_call(call: cst.Call, imports, guarded: bool = True) -> bool:
    """Whether the call itself is in the table (its receiver and arguments are the caller's to
    check). ``guarded``: the receiver of a method is checked at run time to be a tensor/array."""
    if any(a.keyword is not None and a.keyword.value in WRITING_KEYWORDS for a in call.args):
        return False
    func = call.func
    qual = imports.qualify(func) if imports is not None else None
    if qual is not None:
        return qual in PURE_FUNCS
    if not isinstance(func, cst.Attribute):
        return False  # a bare name not bound by an import: a user function, a builtin
    name = func.attr.value
    if name.endswith("_") or name not in PURE_METHODS:
        return False
    if isinstance(func.value, cst.Name) and func.value.value in ("self", "cls"):
        return False  # the class's own method (``self.clamp(x)``), whatever its name
    head = (dotted(func.value) or "").partition(".")[0]
    if imports is not None and head in getattr(imports, "imported", ()):
        return False  # a module's function (``mylib.sum``, a rebound ``torch``): not a method
    return guarded or name not in MODULE_INPLACE_METHODS


def callee(call: cst.Call, imports=None) -> str:
    """The called name as written, with what it resolves to when that differs (for reasons)."""
    text = dotted(call.func) or " ".join(cst.Module(body=[]).code_for_node(call.func).split())
    qual = imports.qualify(call.func) if imports is not None else None
    return f"{text} ({qual})" if qual and qual != text else text
