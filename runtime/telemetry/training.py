"""Optimizer steps and the losses ``backward()`` is called on, counted without a device sync.

``torch.optim``'s global step post-hook counts optimizer steps (the sampler turns the count into
``optimizer_steps_per_s``). ``Tensor.backward`` is patched at class level to record the scalar it
is called on as ``losses/backward``, detached and still a tensor: it reaches the host with the
other pending points at the next flush, where a non-finite loss is reported (stderr, a
``nonfinite`` event). Non-scalar ``backward(gradient)`` calls are not recorded.
"""
from __future__ import annotations

import functools
from typing import Any

from scalebox_cst.runtime import metrics

LOSS = "losses/backward"
_MARK = "_scalebox_observed"

#: optimizer steps taken so far (all optimizers)
optimizer_steps = 0


def _count_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    global optimizer_steps
    optimizer_steps += 1


def _wrap_backward(fn):
    @functools.wraps(fn)
    def backward(self, *args, **kwargs):
        result = fn(self, *args, **kwargs)
        try:
            if self.numel() == 1:  # shape metadata only: no sync
                metrics.record(LOSS, self.detach())
        except Exception:
            pass
        return result

    setattr(backward, _MARK, True)
    return backward


def attach(torch: Any) -> None:
    try:  # by import: torch 2.13's torch.optim no longer has the ``optimizer`` attribute
        from torch.optim.optimizer import register_optimizer_step_post_hook as register
    except ImportError:
        register = None
    if register is not None:
        register(_count_step)
    fn = torch.Tensor.__dict__.get("backward")
    if fn is not None and not getattr(fn, _MARK, False):
        torch.Tensor.backward = _wrap_backward(fn)
