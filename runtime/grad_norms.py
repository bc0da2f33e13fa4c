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


def total_norm(grads: List[torch.Tensor], uniform: Optional[bool] = None) -> torch.Tensor:
    """The 2-norm of all gradients, computed as ``clip_grad_norm_`` computes it (same bits)."""
    if not _all_strided(grads):
        grads, uniform = [stored_values(g) for g in grads], False
    if len(grads) == 1:
        return torch.linalg.vector_norm(grads[0], 2.0)
    first = grads[0]
    if uniform is None:
        uniform = all(g.device == first.device and g.dtype == first.dtype for g in grads)
    if uniform:
        norms = torch._foreach_norm(grads, 2.0)
    else:
        norms = [torch.linalg.vector_norm(g, 2.0) for g in grads]
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
    return math.sqrt(total)
