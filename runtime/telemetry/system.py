"""Host and device resources, read by the sampler thread at a low rate (never on the training path).

- ``host_peak_mem_mb``: the process's peak resident set (``getrusage``), always present.
- ``cpu_time_s`` (:func:`cpu_time_s`, recorded by the sampler itself): CPU time, children included.
- ``device_peak_mem_mb``: ``torch.cuda.max_memory_allocated`` of the current device, or torch_npu's
  ``torch.npu.max_memory_allocated``; read only once the script has initialised the device itself
  (telemetry never creates a device context). Absent on CPU.
- ``device_util_percent``, ``device_mem_util_percent``: NVML through ``nvidia-ml-py`` (the
  ``gpu`` extra; ``torch.cuda.utilization`` / ``memory_usage``, which map CUDA_VISIBLE_DEVICES),
  or ``npu-smi info -t usages`` on Ascend (AI core and HBM bandwidth usage, at most every
  :data:`NPU_SMI_EVERY` seconds). Absent, not faked, where neither tool works.
Each reader that fails once is dropped for the rest of the run.
"""
from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

NPU_SMI_EVERY = 10.0


def host_peak_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0  # bytes vs KiB


def cpu_time_s() -> float:
    """User + system CPU time of this process and of its children that have been waited for
    (multiprocessing workers once joined): a run's CPU time, which other load hardly changes."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _cuda():
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_available() or not cuda.is_initialized():
        return None
    return cuda


def _npu():
    if "torch_npu" not in sys.modules:
        return None
    npu = getattr(sys.modules.get("torch"), "npu", None)
    if npu is None or not npu.is_available():
        return None
    initialized = getattr(npu, "is_initialized", None)
    if initialized is not None and not initialized():
        return None
    return npu


def device_peak_mb() -> Optional[float]:
    for backend in (_cuda(), _npu()):
        if backend is not None:
            return backend.max_memory_allocated(backend.current_device()) / 2**20
    return None


def nvml_util() -> Optional[Dict[str, float]]:
    cuda = _cuda()
    if cuda is None:
        return None
    index = cuda.current_device()
    return {"device_util_percent": float(cuda.utilization(index)), "device_mem_util_percent": float(cuda.memory_usage(index))}


_NPU_FIELDS = {"device_util_percent": re.compile(r"Aicore Usage Rate\(%\)\s*:\s*([\d.]+)"),
               "device_mem_util_percent": re.compile(r"HBM Bandwidth Usage Rate\(%\)\s*:\s*([\d.]+)")}


def parse_npu_smi(text: str) -> Dict[str, float]:
    """The usage fields of ``npu-smi info -t usages -i ID`` output that are present."""
    out = {}
    for name, pattern in _NPU_FIELDS.items():
        found = pattern.search(text)
        if found:
            out[name] = float(found.group(1))
    return out


def _npu_id() -> int:
    """Physical NPU id of the device in use (ASCEND_RT_VISIBLE_DEVICES maps logical ids)."""
    npu = _npu()
    logical = npu.current_device() if npu is not None else 0
    visible = [v for v in os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return int(visible[logical]) if logical < len(visible) else int(logical)


_npu_last = [0.0, None]


def npu_smi_util() -> Optional[Dict[str, float]]:
    if _npu() is None or shutil.which("npu-smi") is None:
        return None
    now = time.monotonic()
    if _npu_last[1] is not None and now - _npu_last[0] < NPU_SMI_EVERY:
        return {}
    out = subprocess.run(["npu-smi", "info", "-t", "usages", "-i", str(_npu_id())], capture_output=True, text=True, timeout=5.0, check=True).stdout
    values = parse_npu_smi(out)
    if not values:
        raise RuntimeError("npu-smi printed no usage fields")
    _npu_last[:] = [now, values]
    return values


class Sampler:
    """One call per tick: the resource points available now (readers that fail are dropped)."""

    def __init__(self) -> None:
        self.readers: List[Callable[[], Optional[Dict[str, float]]]] = [
            lambda: {"host_peak_mem_mb": host_peak_mb()},
            lambda: (lambda v: None if v is None else {"device_peak_mem_mb": v})(device_peak_mb()),
            nvml_util,
            npu_smi_util,
        ]

    def sample(self) -> Dict[str, float]:
        points: Dict[str, float] = {}
        for reader in list(self.readers):
            try:
                found = reader()
            except Exception:
                self.readers.remove(reader)
                continue
            if found:
                points.update(found)
        return points
