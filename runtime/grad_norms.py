"""Total gradient norms, computed as ``clip_grad_norm_`` computes them (``total_norm``, same bits)
or summed on the host for a decision (``host_norm``); sparse gradients read through their stored
values. The guard (``stabilizer``) and its tests use these; they hold no guard state."""
from __future__ import annotations

import math
from typing import List, Optional

import torch


def stored_values(g: torch.Tensor) -> torch.Tensor:
    """A strided tensor with the gradient's norm and finiteness: the gradient itself, or the
    stored values of a sparse one (``nn.Embedding(sparse=True)``; norm ops refuse sparse input)."""
    if g.layout is torch.strided:
        return g
    if g.layout is torch.sparse_coo:
        return g.coalesce().values()  # duplicates summed, as the dense gradient has them
    try:
        return g.values()  # compressed layouts hold no duplicates
    except (RuntimeError, NotImplementedError):
        return g.to_dense()


def _all_strided(grads: List[torch.Tensor]) -> bool:
    return all(g.layout is torch.strided for g in grads)


#: gradient dtypes whose own range a norm of finite values overflows early (float16 from 65504)
_NARROW = (torch.float16, torch.bfloat16)


def total_norm(grads: List[torch.Tensor], uniform: Optional[bool] = None, wide: bool = False) -> torch.Tensor:
    """The 2-norm of all gradients, computed as ``clip_grad_norm_`` computes it (same bits).

    ``wide``: 16-bit gradients are measured in float32 instead, for a decision: in their own type
    the norm of finite float16 gradients is ``inf`` from 65504 on, which would read as a
    non-finite gradient (float32 overflows only for 16-bit values above ~1e19)."""
    if not _all_strided(grads):
        grads, uniform = [stored_values(g) for g in grads], False
    first = grads[0]
    dtype = torch.float32 if wide and any(g.dtype in _NARROW for g in grads) else None
    if len(grads) == 1:
        return torch.linalg.vector_norm(first, 2.0, dtype=dtype)
    if uniform is None:
        uniform = all(g.device == first.device and g.dtype == first.dtype for g in grads)
    if uniform:
        norms = torch._foreach_norm(grads, 2.0, dtype=dtype)
    else:
        norms = [torch.linalg.vector_norm(g, 2.0, dtype=dtype if g.dtype in _NARROW else None) for g in grads]
    if dtype is not None:
        norms = [n.to(dtype) for n in norms]
    return torch.linalg.vector_norm(torch.stack([n.to(first.device) for n in norms]), 2.0)


def host_norm(grads: List[torch.Tensor], uniform: bool) -> float:
    """The total 2-norm as a float, for CPU gradients: per-tensor norms summed in float64 on the
    host (no stack, no second kernel; the decision needs a number, not clip_grad_norm_'s bits)."""
    if uniform and _all_strided(grads):
        norms = torch._foreach_norm(grads, 2.0)
    else:
        norms = [torch.linalg.vector_norm(stored_values(g), 2.0) for g in grads]
    total = 0.0
    for n in norms:
        v = n.item()
        total += v * v
    if total < math.inf:
        return math.sqrt(total)
    return _wide_host_norm(grads)


def _wide_host_norm(grads: List[torch.Tensor]) -> float:
    """``host_norm`` where some tensor's norm was not finite: each measured again in float64, so
    the total is non-finite only where a gradient holds a NaN or an infinity. A 16-bit gradient's
    norm overflows its own type from 65504 (float16) although every value is finite; the guard
    skips a step for a non-finite gradient, never for a large norm of finite ones."""
    total = 0.0
    for g in grads:
        v = torch.linalg.vector_norm(stored_values(g), 2.0, dtype=torch.float64).item()
        total += v * v
    return math.sqrt(total)
