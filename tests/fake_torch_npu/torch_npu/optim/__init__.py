"""TEST-ONLY: torch_npu.optim.NpuFused* of the stand-in, with the documented limits enforced
(no bf16 parameters, no zero_grad(set_to_none=True)); the arithmetic is torch's for-loop one."""
from __future__ import annotations

import torch


class _NpuFused:
    def _check_params(self):
        from .._kernels import calls

        calls[type(self).__name__] += 1
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype == torch.bfloat16:
                    raise TypeError(f"{type(self).__name__} does not support bfloat16 parameters")

    def zero_grad(self, set_to_none=False):
        if set_to_none:
            raise ValueError(f"{type(self).__name__}.zero_grad: set_to_none=True is not supported")
        super().zero_grad(set_to_none=False)


class NpuFusedAdam(_NpuFused, torch.optim.Adam):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, foreach=False)
        self._check_params()


class NpuFusedAdamW(_NpuFused, torch.optim.AdamW):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, foreach=False)
        self._check_params()


class NpuFusedSGD(_NpuFused, torch.optim.SGD):
    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False):
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov, foreach=False)
        self._check_params()
