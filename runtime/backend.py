"""Which accelerator this process can use: NPU, else CUDA, else CPU.

Detection must survive broken installs: without the CANN toolkit ``import torch_npu`` raises
(``libhccl.so``), and with torch_npu installed even ``import torch`` can raise through torch's
device-backend autoload. Each such case becomes one line in ``notes`` and detection carries on.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import List, Optional


@dataclasses.dataclass
class BackendInfo:
    name: str  # "npu", "cuda" or "cpu"
    device_name: Optional[str] = None
    torch_version: Optional[str] = None
    notes: List[str] = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        text = self.name
        if self.device_name:
            text += f" ({self.device_name})"
        if self.torch_version:
            text += f", torch {self.torch_version}"
        return text


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _autoload_breaks_torch() -> Optional[str]:
    """If a device-backend plug-in would break ``import torch``, the first line of the error.

    torch imports every ``torch.backends`` entry point on import. A broken one (torch_npu
    without CANN) makes ``import torch`` raise, and a half-imported torch cannot be imported
    again in the same process, so the probe runs in a subprocess, only when such plug-ins exist.
    """
    if "torch" in sys.modules or os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == "0":
        return None
    from importlib.metadata import entry_points

    if not list(entry_points(group="torch.backends")):
        return None
    probe = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True)
    if probe.returncode == 0:
        return None
    lines = [line for line in probe.stderr.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"exit status {probe.returncode}"


def _import_torch(notes: List[str]):
    broken = _autoload_breaks_torch()
    if broken is not None:
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        notes.append(
            f"import torch fails through device-backend autoload ({broken}); "
            "continuing with TORCH_DEVICE_BACKEND_AUTOLOAD=0"
        )
    try:
        import torch

        return torch
    except Exception as exc:  # noqa: BLE001 - any failure here must become one line
        notes.append(f"torch is not importable ({_first_line(exc)}); backend cpu")
        return None


def detect() -> BackendInfo:
    """Detect the best backend; never raises."""
    notes: List[str] = []
    torch = _import_torch(notes)
    if torch is None:
        return BackendInfo("cpu", notes=notes)
    version = str(torch.__version__)
    try:
        import torch_npu  # noqa: F401

        npu = getattr(torch, "npu", None)
        if npu is not None and npu.is_available():
            name = None
            try:
                name = npu.get_device_name(0)
            except Exception:  # noqa: BLE001
                pass
            return BackendInfo("npu", name, version, notes)
        notes.append("torch_npu is installed but no NPU is available")
    except ImportError as exc:
        if getattr(exc, "name", None) != "torch_npu":
            notes.append(f"torch_npu is installed but cannot load ({_first_line(exc)}); is CANN installed? skipping NPU")
    except Exception as exc:  # noqa: BLE001
        notes.append(f"torch_npu failed to initialise ({_first_line(exc)}); skipping NPU")
    try:
        if torch.cuda.is_available():
            return BackendInfo("cuda", torch.cuda.get_device_name(0), version, notes)
    except Exception as exc:  # noqa: BLE001
        notes.append(f"CUDA check failed ({_first_line(exc)}); using CPU")
    return BackendInfo("cpu", None, version, notes)


def resolve(requested: str) -> BackendInfo:
    """``auto`` → detect(); an explicit backend is taken as the rewrite target without probing."""
    if requested == "auto":
        return detect()
    return BackendInfo(requested)
