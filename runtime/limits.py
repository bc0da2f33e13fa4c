"""In the run's child: the device memory limit (issue 24 part 3; the host side is scalebox_cst.limits).

``scalebox run --device-memory 16g`` (or ``[run] device_memory``) reaches the child as
``SCALEBOX_DEVICE_MEMORY`` (bytes). Before the script runs, :func:`apply` caps PyTorch's caching
allocator at that many bytes with ``set_per_process_memory_fraction`` on CUDA and on Ascend NPUs
(torch_npu), so an allocation past it raises the allocator's out-of-memory error, which the host
reads as ``device memory limit 16g reached``. Under torchrun each rank caps its own device
(``LOCAL_RANK``); a plain run caps every visible device. Only what PyTorch allocates is counted
(not other libraries' own allocations, nor the context itself).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import List, Tuple
from scalebox_cst.digits import ascii_digits

ENV_DEVICE_MEMORY = "SCALEBOX_DEVICE_MEMORY"  # scalebox_cst.limits.ENV_DEVICE_MEMORY


def _devices(module, count: int) -> List[int]:
    rank = os.environ.get("LOCAL_RANK")
    if rank is not None and ascii_digits(rank) and count:
        return [int(rank) % count]
    return list(range(count))


def apply() -> List[Tuple[str, int, float]]:
    """Cap each device's allocator; returns ``(backend, device, fraction)`` for each capped."""
    text = os.environ.get(ENV_DEVICE_MEMORY)
    if not text:
        return []
    limit = int(text)
    import torch

    done = []
    backends = [("cuda", getattr(torch, "cuda", None))]
    if importlib.util.find_spec("torch_npu") is not None:
        import torch_npu  # noqa: F401 - registers torch.npu

        backends.append(("npu", getattr(torch, "npu", None)))
    for name, module in backends:
        if module is None or not module.is_available():
            continue
        for device in _devices(module, module.device_count()):
            total = module.get_device_properties(device).total_memory
            fraction = min(1.0, limit / total)
            module.set_per_process_memory_fraction(fraction, device)
            done.append((name, device, fraction))
    if not done:
        print("scalebox: device memory limit: no CUDA or NPU device here, nothing to cap", file=sys.stderr)
    return done
