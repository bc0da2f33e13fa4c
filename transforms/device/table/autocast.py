"""Autocast and GradScaler swaps (npu)."""
from __future__ import annotations

from typing import Tuple

from .swap import AUTOCAST, CUDA_LITERAL, Swap, _NPU_LINE


AUTOCAST_SWAPS: Tuple[Swap, ...] = (
    Swap(
        id="autocast.cuda-amp-autocast",
        transform=AUTOCAST,
        kind="call-replace",
        pattern="torch.cuda.amp.autocast",
        also=("torch.cuda.amp.autocast_mode.autocast",),
        replacement="torch.autocast",
        lead=('"npu"',),
        params=("enabled", "dtype", "cache_enabled"),
        accepts=("enabled", "dtype", "cache_enabled"),
        reason='torch.cuda.amp.autocast(...) -> torch.autocast("npu", ...) (positional arguments named)',
        min_torch_npu="2.1.0",
        before="import torch\nwith torch.cuda.amp.autocast(use_amp):\n    y = f(x)\n",
        after=f'{_NPU_LINE}import torch\nwith torch.autocast("npu", enabled=use_amp):\n    y = f(x)\n',
    ),
    Swap(
        id="autocast.device-type",
        transform=AUTOCAST,
        kind="literal-arg",
        pattern="torch.autocast",
        positions=(
            ("torch.autocast", 0, "device_type"),
            ("torch.amp.autocast", 0, "device_type"),
            ("torch.amp.autocast_mode.autocast", 0, "device_type"),
            ("torch.amp.GradScaler", 0, "device"),
            ("torch.GradScaler", 0, "device"),
            ("torch.amp.grad_scaler.GradScaler", 0, "device"),
        ),
        literal=CUDA_LITERAL,
        reason="autocast / GradScaler device type 'cuda' -> 'npu'",
        min_torch_npu="2.1.0",
        before=(
            "import torch\n"
            'with torch.autocast("cuda", enabled=amp):\n    y = f(x)\n'
            'with torch.autocast(device_type="cuda", dtype=torch.bfloat16):\n    y = f(x)\n'
            'scaler = torch.amp.GradScaler("cuda")\n'
        ),
        after=(
            f"{_NPU_LINE}import torch\n"
            'with torch.autocast("npu", enabled=amp):\n    y = f(x)\n'
            'with torch.autocast(device_type="npu", dtype=torch.bfloat16):\n    y = f(x)\n'
            'scaler = torch.amp.GradScaler("npu")\n'
        ),
    ),
    Swap(
        id="autocast.grad-scaler",
        transform=AUTOCAST,
        kind="rename",
        pattern="torch.cuda.amp.GradScaler",
        also=("torch.cuda.amp.grad_scaler.GradScaler",),
        replacement="torch.npu.amp.GradScaler",
        reason="torch.cuda.amp.GradScaler -> torch.npu.amp.GradScaler (same arguments and defaults)",
        min_torch_npu="1.11.0",
        before="from torch.cuda.amp import GradScaler\nscaler = GradScaler(enabled=amp)\n",
        after=f"{_NPU_LINE}import torch\nfrom torch.cuda.amp import GradScaler\nscaler = torch.npu.amp.GradScaler(enabled=amp)\n",
    ),
)
