"""The guard of rewritten quadratic sum loops (``out[t] = sum over k >= t``) and the integer
helpers they use."""
from __future__ import annotations

from typing import Any, Sequence, Tuple

import numpy as np
import torch

from ..guard_reasons import no
from ..fused import fused_linear  # noqa: F401  (the one-pass tier of rewritten recurrences)
from .kinds import _PY_SCALARS, _TENSORS, _ndarray, _tensor
from .recurrence_guard import _recurrence_ok

#: Shortest sequence worth vectorizing a quadratic sum loop (``out[t] = sum over k >= t``, T (T + 1) / 2
#: inner steps) instead of running it: the rewrite costs 13-20 us at small T. Measured on a 2-core
#: CPU, one thread: break-even at about 3 steps for tensors, 10-14 for numpy, 22 for lists of floats.
QUAD_MIN_STEPS = {"torch": 3, "tlist": 3, "numpy": 12, "float": 24}


def quadratic_ok(
    T: int,
    seqs: Sequence[Tuple[Any, int]] = (),
    masks: Sequence[Tuple[Any, int]] = (),
    consts: Sequence[Any] = (),
    scalars: Sequence[Any] = (),
    outs: Sequence[Any] = (),
    lists: Sequence[Any] = (),
    *,
    divides: bool = False,
) -> bool:
    """Whether ``out[t] = sum_{k=t}^{T-1} c^(k-t) E(k)``, computed as one backward recurrence, may
    replace the quadratic loop for these values: what :func:`recurrence_ok` checks (``T`` is the
    number of outer steps, equal to the inner loop's end; shorter minimum lengths, the loop being
    quadratic), and also: ``masks``, ``(container, extra)`` pairs the loop reads as
    ``int(x[k])``, are 1-D with every element 0 or 1 (so that the float mask :func:`int_of` builds
    is what ``int`` gives, in any float dtype); ``outs`` have a floating dtype; Python-int
    ``scalars`` are -1, 0 or 1 (larger ones make the loop's powers exact big ints, which may
    overflow where the vectorized floats would not)."""
    try:
        if any(type(c) is int and abs(c) > 1 for c in scalars):
            return no("a Python int coefficient other than -1, 0 or 1 (the loop's powers are exact big ints)")
        devices = _recurrence_ok(T, seqs, masks, consts, scalars, outs, lists, (), False, divides, QUAD_MIN_STEPS)
        if devices is False:
            return False  # (the reason is noted)
        for x, _ in masks:
            if not _zero_one(x):
                return no("a mask the loop reads with int() holds values other than 0 and 1")
        for o in outs:
            if (isinstance(o, torch.Tensor) and not o.is_floating_point()) or (isinstance(o, np.ndarray) and o.dtype.kind != "f"):
                return no("an output of an integer dtype")
        return True
    except Exception as exc:
        return no(f"checking the inputs raised {type(exc).__name__}")


def _zero_one(x: Any) -> bool:
    if _tensor(x):
        return x.dtype == torch.bool or bool(((x == 0) | (x == 1)).all())
    if _ndarray(x):
        return x.dtype == np.bool_ or bool(((x == 0) | (x == 1)).all())
    if type(x) not in (list, tuple):
        return False
    for e in x:
        if type(e) in _PY_SCALARS or isinstance(e, np.generic):
            if not (e == 0 or e == 1):
                return False
        elif not (type(e) in _TENSORS and e.numel() == 1 and bool(e == 0) | bool(e == 1)):
            return False
    return True


def int_of(x: Any, like: Any) -> Any:
    """``int(x[k])`` for every k of a 0/1 mask (see :func:`quadratic_ok`), as an array of the kind,
    dtype and device of ``like``: the loop's Python ints are weak operands (they take the float
    operand's dtype), and this array combines with ``like`` the same way, with the same values."""
    if isinstance(like, torch.Tensor):
        if isinstance(x, torch.Tensor):
            return x.to(device=like.device, dtype=like.dtype)
        return torch.as_tensor(_ints(x, np.float64), device=like.device).to(like.dtype)
    if isinstance(x, np.ndarray):
        return x.astype(like.dtype)
    return _ints(x, like.dtype)


def _ints(x: Any, dtype: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x.astype(dtype)
    return np.fromiter((int(e) for e in x), dtype=dtype, count=len(x))
