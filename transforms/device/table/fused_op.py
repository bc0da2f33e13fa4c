"""Fused NPU kernels behind guarded runtime helpers: gelu, rms_norm, swiglu."""
from __future__ import annotations

from typing import Tuple

from scalebox_cst.report import CHANGES_SEMANTICS, REASSOCIATED

from .swap import FUSED_OP, Swap, _HELPER_LINE, _NPU_LINE


FUSED_OP_SWAPS: Tuple[Swap, ...] = (
    Swap(
        id="fused_op.fast-gelu",
        transform=FUSED_OP,
        kind="helper",
        pattern="torch.nn.functional.gelu",
        replacement="fast_gelu",
        exactness=CHANGES_SEMANTICS,
        option="fast_gelu",
        reason="gelu -> torch_npu.npu_fast_gelu (requested): x * sigmoid(1.702 x), max abs error "
        "about 0.02 against the exact gelu",
        min_torch_npu="1.11.0",
        before="import torch.nn.functional as F\ny = F.gelu(h)\n",
        after=f"{_NPU_LINE}{_HELPER_LINE}import torch.nn.functional as F\ny = _scalebox_npu.fast_gelu(h)\n",
        example_options=(("fast_gelu", True),),
    ),
    Swap(
        id="fused_op.gelu",
        transform=FUSED_OP,
        kind="helper",
        pattern="torch.nn.functional.gelu",
        replacement="gelu",
        conditions=("not-tanh",),
        reason="gelu -> torch_npu.npu_gelu(x, approximate='none') for NPU tensors: a correctness fix, "
        "native F.gelu on NPU computes the tanh approximation whatever approximate says; exact with "
        "respect to the erf gelu the code computes on CPU/CUDA",
        min_torch_npu="2.1.0",
        before="import torch.nn.functional as F\ny = F.gelu(h)\nact = F.gelu\n",
        after=(
            f"{_NPU_LINE}{_HELPER_LINE}import torch.nn.functional as F\n"
            "y = _scalebox_npu.gelu(h)\nact = _scalebox_npu.gelu\n"
        ),
    ),
    Swap(
        id="fused_op.gelu-module",
        transform=FUSED_OP,
        kind="helper",
        pattern="torch.nn.GELU",
        also=("torch.nn.modules.activation.GELU",),
        replacement="GELU",
        conditions=("not-tanh",),
        reason="nn.GELU -> an nn.GELU subclass whose forward uses torch_npu.npu_gelu for NPU tensors "
        "(same parameters, state_dict and isinstance); the exact gelu, not NPU's native tanh one",
        min_torch_npu="2.1.0",
        before="import torch.nn as nn\nnet = nn.Sequential(nn.Linear(4, 4), nn.GELU())\n",
        after=(
            f"{_NPU_LINE}{_HELPER_LINE}import torch.nn as nn\n"
            "net = nn.Sequential(nn.Linear(4, 4), _scalebox_npu.GELU())\n"
        ),
    ),
    Swap(
        id="fused_op.rms-norm",
        transform=FUSED_OP,
        kind="helper",
        pattern="torch.nn.functional.rms_norm",
        replacement="rms_norm",
        exactness=REASSOCIATED,
        conditions=("has-weight",),
        reason="rms_norm -> torch_npu.npu_rms_norm(x, weight, epsilon=eps)[0] for NPU tensors (eps "
        "passed explicitly, torch's default finfo eps when None); fused reduction order, fp32 "
        "tolerance 1e-5 relative",
        min_torch_npu="2.1.0",
        before="import torch.nn.functional as F\ny = F.rms_norm(h, (64,), w, 1e-6)\n",
        after=(
            f"{_NPU_LINE}{_HELPER_LINE}import torch.nn.functional as F\n"
            "y = _scalebox_npu.rms_norm(h, (64,), w, 1e-6)\n"
        ),
    ),
    Swap(
        id="fused_op.rms-norm-module",
        transform=FUSED_OP,
        kind="helper",
        pattern="torch.nn.RMSNorm",
        also=("torch.nn.modules.normalization.RMSNorm",),
        replacement="RMSNorm",
        exactness=REASSOCIATED,
        conditions=("affine",),
        reason="nn.RMSNorm -> an nn.RMSNorm subclass whose forward uses torch_npu.npu_rms_norm for "
        "NPU tensors (same parameters and state_dict); fp32 tolerance 1e-5 relative",
        min_torch_npu="2.1.0",
        before="import torch\nnorm = torch.nn.RMSNorm(64, eps=1e-6)\n",
        after=f"{_NPU_LINE}{_HELPER_LINE}import torch\nnorm = _scalebox_npu.RMSNorm(64, eps=1e-6)\n",
    ),
    Swap(
        id="fused_op.swiglu",
        transform=FUSED_OP,
        kind="swiglu",
        pattern="torch.nn.functional.silu",
        replacement="swiglu",
        exactness=REASSOCIATED,
        reason="a, b = x.chunk(2, -1); silu(a) * b -> torch_npu.npu_swiglu(x, dim=-1) for NPU tensors "
        "when a and b are still x's two even halves (checked at run time); fp32 tolerance 1e-6",
        min_torch_npu="2.1.0",
        before=(
            "import torch.nn.functional as F\n"
            "def ffn(x):\n"
            "    a, b = x.chunk(2, dim=-1)\n"
            "    return F.silu(a) * b\n"
        ),
        after=(
            f"{_NPU_LINE}{_HELPER_LINE}import torch.nn.functional as F\n"
            "def ffn(x):\n"
            "    a, b = x.chunk(2, dim=-1)\n"
            "    return _scalebox_npu.swiglu(x, a, b)\n"
        ),
    ),
)
