"""TEST-ONLY: the stand-in's kernels, free of import side effects (tests load this file alone).

Documented reference semantics of torch_npu's npu_gelu, npu_fast_gelu, npu_rms_norm, npu_swiglu,
computed on CPU tensors (the stand-in's npu tensors), with torch_npu's argument limits checked.
"""
from __future__ import annotations

import collections

import torch
import torch.nn.functional as F

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
calls = collections.Counter()


def _check(name, *tensors):
    calls[name] += 1
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a Tensor, got {type(t).__name__}")
        if t.device.type != "cpu":
            raise RuntimeError(f"{name}: expected an npu tensor (the stand-in's npu tensors live on the CPU), got {t.device}")
        if t.dtype not in _KERNEL_DTYPES:
            raise RuntimeError(f"{name}: dtype {t.dtype} is not supported (float16, bfloat16, float32)")
        if not 0 < t.dim() <= 8:
            raise RuntimeError(f"{name}: 1 to 8 dimensions supported, got {t.dim()}")


def npu_gelu(input, *, approximate="none"):
    """GELU: x * Phi(x) ("none", erf form) or the tanh approximation ("tanh")."""
    _check("npu_gelu", input)
    if approximate not in ("none", "tanh"):
        raise RuntimeError(f"npu_gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return F.gelu(input, approximate=approximate)


def npu_fast_gelu(input):
    """FastGelu: x / (1 + exp(-1.702|x|)) * exp(0.851 (x - |x|)), i.e. x * sigmoid(1.702 x)."""
    _check("npu_fast_gelu", input)
    a = input.abs()
    return input / (1 + torch.exp(-1.702 * a)) * torch.exp(0.851 * (input - a))


def npu_rms_norm(input, gamma, epsilon=1e-6):
    """RmsNorm over gamma's trailing dims: (x * rstd * gamma, rstd); rstd float32, reduced dims kept."""
    _check("npu_rms_norm", input, gamma)
    if gamma.dtype != input.dtype:
        raise RuntimeError("npu_rms_norm: gamma must have the dtype of the input")
    k = gamma.dim()
    if tuple(input.shape[input.dim() - k:]) != tuple(gamma.shape):
        raise RuntimeError(f"npu_rms_norm: gamma shape {tuple(gamma.shape)} must match the input's last dims {tuple(input.shape)}")
    dims = tuple(range(input.dim() - k, input.dim()))
    x = input.float()
    rstd = torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + epsilon)
    y = (x * rstd).to(input.dtype) * gamma
    return y, rstd


def npu_swiglu(input, dim=-1):
    """SwiGlu: A and B are input's halves along dim; swish(A) * B = A * sigmoid(A) * B."""
    _check("npu_swiglu", input)
    if input.numel() == 0:
        raise RuntimeError("npu_swiglu: empty tensors are not supported")
    if not input.is_contiguous():
        raise RuntimeError("npu_swiglu: non-contiguous tensors are not supported")
    if input.shape[dim] % 2:
        raise RuntimeError(f"npu_swiglu: dimension {dim} of size {input.shape[dim]} is not divisible by 2")
    a, b = input.chunk(2, dim=dim)
    return F.silu(a) * b
