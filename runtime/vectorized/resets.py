"""Linear recurrences with resets (``if done: s = value``): one exact ``linear_recurrence`` call
per stretch between resets."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..fused import fused_linear  # noqa: F401  (the one-pass tier of rewritten recurrences)
from ..recurrence import linear_recurrence
from .kinds import _PY_SCALARS


def reset_linear_recurrence(a: Any, b: Any, reset: Any, value: Any, init: Any = 0.0, return_last: bool = False):
    """``x[t] = b[t] + a[t] * (value if reset[t] else x[t+1])`` for t = T-1..0, ``x[T] = init``:
    the loop with ``if done: s = value`` before ``s = b + a * s``. Exact: one
    :func:`linear_recurrence` call per stretch between resets, the stretch below a reset
    starting from ``value`` exactly as the loop does."""
    n = len(b)
    if isinstance(reset, torch.Tensor):
        idx = torch.nonzero(reset).flatten().tolist()
    else:
        idx = np.flatnonzero(reset).tolist()
    a_seq = not isinstance(a, _PY_SCALARS) and np.ndim(a) >= 1
    parts = []
    hi, carry = n, init
    last = init
    for lo in [r + 1 for r in reversed(idx)] + [0]:
        if lo < hi:
            seg_a = a[lo:hi] if a_seq else a
            out, last = linear_recurrence(seg_a, b[lo:hi], init=carry, return_last=True)
            parts.append(out)
        hi, carry = lo, value
    parts.reverse()
    if not parts:
        out = b[0:0]
    elif len(parts) == 1:
        out = parts[0]
    elif isinstance(parts[0], torch.Tensor):
        out = torch.cat(parts)
    else:
        out = np.concatenate(parts)
    if return_last:
        return out, (last if n else init)
    return out


def switch_linear_recurrence(a: Any, b: Any, reset: Any, value: Any, init: Any = 0.0, return_last: bool = False):
    """``x[t] = value if reset[t] else b[t] + a[t] * x[t+1]`` for t = T-1..0, ``x[T] = init``: the
    loop with ``if done: s = value else: s = b + a * s``. Exact: the steps that do not reset are
    :func:`reset_linear_recurrence` with each reset moved to the step below it (which reads
    ``value``, as the loop's does); the reset steps then hold ``value`` itself (a selection)."""
    n = len(b)
    if isinstance(reset, torch.Tensor):
        below = torch.cat([reset[1:], reset.new_zeros(1 if n else 0)])
    else:
        reset = np.asarray(reset, dtype=bool)
        below = np.concatenate([reset[1:], np.zeros(1 if n else 0, dtype=bool)])
    out = reset_linear_recurrence(a, b, below, value, init=init)
    if n:
        mask = reset.reshape((n,) + (1,) * (out.ndim - 1))
        if isinstance(out, torch.Tensor):  # flags from a list are a numpy mask next to tensors
            mask = torch.as_tensor(mask, device=out.device)
            out = torch.where(mask, torch.tensor(value, dtype=out.dtype, device=out.device), out)
        else:
            out = np.where(mask, np.asarray(value, dtype=out.dtype), out)
    if return_last:
        return out, (out[0] if n else init)
    return out
