"""TEST-ONLY: ``torch.npu.amp`` of the stand-in (the npu GradScaler works on CPU tensors here)."""
from __future__ import annotations

import torch


class GradScaler(torch.amp.GradScaler):
    """torch_npu's GradScaler signature; scaling runs on the CPU (the stand-in's npu)."""

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, enabled=True, dynamic=True):
        if not dynamic:
            raise NotImplementedError("the stand-in implements dynamic loss scaling only")
        super().__init__(
            "cpu",
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            enabled=enabled,
        )


def autocast(enabled=True, dtype=torch.float16, cache_enabled=True):
    return torch.autocast("npu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)
