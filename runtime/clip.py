"""Gradient clipping by optimizer, for the clip calls the ``grad_clip`` transform inserts.

Rewritten code knows the optimizer it steps, not the model, so the helper reads the parameters
from ``optimizer.param_groups``. It returns the pre-clip total norm as a tensor (no ``.item()``:
no device sync per step) and records it as the ``scalebox/grad_norm`` run metric (the engine's
namespace: a script's own ``grad_norm`` tag stays a series of its own). An object without
``param_groups`` (a custom "optimizer") is left alone with one warning per type, never a crash.
"""
from __future__ import annotations

import warnings
from typing import Any, List, Optional, Set

import torch

from scalebox_cst.runtime import metrics

METRIC = "grad_norm"

_warned_types: Set[type] = set()


def _warn_once(kind: type, why: str) -> None:
    if kind in _warned_types:
        return
    _warned_types.add(kind)
    warnings.warn(
        f"scalebox: {kind.__module__}.{kind.__qualname__} {why}; inserted gradient clipping does nothing for it",
        RuntimeWarning,
        stacklevel=3,
    )


def optimizer_params(optimizer: Any) -> Optional[List[torch.Tensor]]:
    """The distinct parameters of ``optimizer`` that have a gradient, in group order.

    None when the object has no readable ``param_groups``.
    """
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        return None
    params: List[torch.Tensor] = []
    seen: Set[int] = set()
    try:
        for group in groups:
            for p in group["params"]:
                if p.grad is None or id(p) in seen:
                    continue
                seen.add(id(p))
                params.append(p)
    except (TypeError, KeyError, AttributeError):
        return None
    return params


def clip_grad_norm(
    optimizer: Any,
    max_norm: float = 1.0,
    norm_type: float = 2.0,
    foreach: Optional[bool] = None,
) -> Optional[torch.Tensor]:
    """Clip the gradients of ``optimizer``'s parameters to total norm ``max_norm`` in place.

    Returns the total norm before clipping (a 0-d tensor on the parameters' device), as
    ``torch.nn.utils.clip_grad_norm_`` does, and records it as the ``scalebox/grad_norm`` metric.
    Parameters shared by several groups count once; parameters without a gradient are left out.
    No parameter with a gradient: returns ``tensor(0.)`` (what ``clip_grad_norm_([])`` returns)
    and records nothing, since no gradient was measured. No ``param_groups``: returns None.
    """
    params = optimizer_params(optimizer)
    if params is None:
        _warn_once(type(optimizer), "has no readable param_groups")
        return None
    if not params:
        return torch.zeros(())
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, foreach=foreach)
    metrics.record(metrics.engine(METRIC), norm)
    return norm
