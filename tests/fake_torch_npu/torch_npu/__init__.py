"""TEST-ONLY stand-in for torch_npu: the APIs scalebox's NPU rewrites emit, computed on the CPU.

Never shipped (it lives under tests/). Put ``tests/fake_torch_npu`` on PYTHONPATH to run code
rewritten for backend npu on a machine without an Ascend NPU. What it does:

* renames torch's privateuse1 backend to "npu" (as torch_npu does), so ``torch.device("npu:0")``,
  ``torch.autocast("npu")`` and ``torch.amp.GradScaler("npu")`` parse; registers ``torch.npu``;
* "npu" tensors ARE CPU tensors: a global TorchFunctionMode maps every ``device=`` argument and
  ``Tensor.to(...)`` device that says npu to cpu; ``Tensor.npu()`` / ``Module.npu()`` stay on CPU;
  ``x.is_npu`` and ``x.device.type`` therefore say cpu, like the original code run on a CPU;
* ``torch.npu`` twins of the torch.cuda functions; the "NPU" random generator is separate from the
  CPU one (seeding it does not touch CPU random numbers, as seeding CUDA does not);
* the kernels (npu_gelu, npu_fast_gelu, npu_rms_norm, npu_swiglu) with their documented reference
  semantics and argument checks, and torch_npu.optim.NpuFused* with their documented limits;
* with ``FAKE_TORCH_NPU_TRACE=<file>``, writes how often each kernel ran, as JSON, at exit (tests
  check that the rewritten code really called them);
* ``FALLBACK_OPS``: functions whose operator torch_npu would run on the CPU, with its warning;
* ``_scalebox_kernel_device_type = "cpu"`` tells scalebox's runtime guards that these kernels take
  CPU tensors (the real torch_npu has no such attribute: its kernels take npu tensors).
"""
from __future__ import annotations

import atexit
import collections
import json
import os

import torch
from torch.overrides import TorchFunctionMode

__version__ = "2.13.0+scalebox.fake"
_scalebox_kernel_device_type = "cpu"
FAKE = True

if torch._C._get_privateuse1_backend_name() != "npu":
    torch.utils.rename_privateuse1_backend("npu")

from . import npu  # noqa: E402
from . import optim  # noqa: E402

torch._register_device_module("npu", npu)


def _to_cpu(device):
    if isinstance(device, torch.device) and device.type == "npu":
        npu._check_index(device.index)
        return torch.device("cpu")
    if isinstance(device, str) and device.split(":")[0] == "npu":
        npu._check_index(torch.device(device).index)
        return "cpu"
    return device


#: torch functions the stand-in treats as unsupported on the NPU: their aten operator, warned of
#: once per operator in torch_npu's own words (its npu_cpu_fallback kernel), as the real one does
FALLBACK_OPS = {
    torch.bitwise_left_shift: "aten::bitwise_left_shift.Tensor_out",
    torch.Tensor.bitwise_left_shift: "aten::bitwise_left_shift.Tensor_out",
}
_warned_ops = set()


def _fallback_warning(op):
    if op not in _warned_ops:
        _warned_ops.add(op)
        import warnings

        warnings.warn(f"CAUTION: The operator '{op}' is not currently supported on the NPU backend and will fall "
                      "back to run on the CPU. This may have performance implications.", UserWarning, stacklevel=3)  # the caller of the torch function


class _NpuIsCpu(TorchFunctionMode):
    """Every tensor that would be created on or moved to "npu" is created on / kept on the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in FALLBACK_OPS:  # warned of from inside the call (after dispatch), as torch_npu's kernel does
            result = func(*args, **dict(kwargs or {}))
            _fallback_warning(FALLBACK_OPS[func])
            return result
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _to_cpu(kwargs["device"])
        if func is torch.Tensor.to and len(args) > 1:
            args = (args[0],) + tuple(_to_cpu(a) for a in args[1:])
        return func(*args, **kwargs)


_mode = _NpuIsCpu()
_mode.__enter__()  # for the whole process, as importing torch_npu is


def _tensor_npu(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
    if device is not None:
        _to_cpu(torch.device("npu", device) if isinstance(device, int) else torch.device(device))
    return self.to("cpu", non_blocking=non_blocking, memory_format=memory_format)


def _module_npu(self, device=None):
    return self._apply(lambda t: t.npu(device))


torch.Tensor.npu = _tensor_npu
torch.Tensor.is_npu = property(lambda self: self.device.type == "npu")
torch.nn.Module.npu = _module_npu

from ._kernels import calls, npu_fast_gelu, npu_gelu, npu_rms_norm, npu_swiglu  # noqa: E402,F401


def _write_trace():
    path = os.environ.get("FAKE_TORCH_NPU_TRACE")
    if path:
        with open(path, "w") as fh:
            json.dump(dict(calls), fh, sort_keys=True)


atexit.register(_write_trace)
