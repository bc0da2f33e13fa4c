"""Run-time side of code rewritten for the Ascend NPU: a fail-fast torch_npu import, guarded kernels.

Rewritten code starts with ``from scalebox_cst.runtime.npu import torch_npu``. Where torch_npu is
missing or unusable (``libhccl.so`` not found without the CANN toolkit), that import ends the
program with ONE line naming the backend switch, instead of an ImportError deep inside the run.
It imports torch with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` when torch is not loaded yet, since an
installed but broken torch_npu otherwise breaks ``import torch`` itself through the autoload.

The fused helpers (``gelu``, ``fast_gelu``, ``rms_norm``, ``swiglu``, the ``GELU``/``RMSNorm``
modules) call torch_npu's kernel for tensors that kernel accepts and the original torch call
otherwise, so a CPU tensor in NPU-rewritten code still gets exactly what the user wrote.
``fused_ok(op)`` answers whether the installed torch_npu has torch's fused optimizer kernel.

The test stand-in ``tests/fake_torch_npu`` (never shipped) runs its kernels on CPU tensors and says
so through ``torch_npu._scalebox_kernel_device_type = "cpu"``; the real torch_npu has no such
attribute, and its kernels take ``npu`` tensors.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Optional

from scalebox_cst.oneline import error_line

BACKEND_SWITCH = (
    "rewrite it for another backend with `scalebox rewrite --backend cpu` (or `--backend cuda`), "
    'or set backend = "cpu" in scalebox.toml'
)
AUTOLOAD_ENV = "TORCH_DEVICE_BACKEND_AUTOLOAD"


class NpuUnavailableError(SystemExit):
    """torch_npu cannot be used. A SystemExit, so an uncaught one prints just its one-line message."""


_torch_npu: Any = None
_device_type: Optional[str] = None


def _message(why: str) -> str:
    return f"scalebox: this code was rewritten for the Ascend NPU (backend npu), but {why}; {BACKEND_SWITCH}."


def require_npu() -> Any:
    """The torch_npu module, or :class:`NpuUnavailableError` with one line that says what to do."""
    global _torch_npu
    if _torch_npu is not None:
        return _torch_npu
    set_env = "torch" not in sys.modules and AUTOLOAD_ENV not in os.environ
    if set_env:
        os.environ[AUTOLOAD_ENV] = "0"
    try:
        try:
            import torch  # noqa: F401
        except Exception as exc:  # torch itself broken (e.g. through a backend autoload)
            raise NpuUnavailableError(_message(f"torch cannot be imported ({error_line(exc)})")) from None
        try:
            import torch_npu
        except ModuleNotFoundError as exc:
            why = "torch_npu is not installed" if exc.name == "torch_npu" else f"torch_npu cannot be imported ({error_line(exc)})"
            raise NpuUnavailableError(_message(why)) from None
        except (ImportError, OSError, RuntimeError) as exc:
            text = str(exc)
            hint = ""
            if "hccl" in text or "ascend" in text.lower() or ".so" in text:
                hint = " - the CANN toolkit is missing or its set_env.sh was not sourced"
            raise NpuUnavailableError(_message(f"torch_npu cannot be imported ({error_line(exc)}){hint}")) from None
    finally:
        if set_env:
            os.environ.pop(AUTOLOAD_ENV, None)
    _torch_npu = torch_npu
    return torch_npu


def kernel_device_type() -> str:
    """The device type of the tensors torch_npu's kernels take ("npu"; "cpu" for the test stand-in)."""
    global _device_type
    if _device_type is None:
        _device_type = str(getattr(require_npu(), "_scalebox_kernel_device_type", "npu"))
    return _device_type


def on_npu(t: Any) -> bool:
    import torch

    return isinstance(t, torch.Tensor) and t.device.type == kernel_device_type()


def _floating(t: Any) -> bool:
    import torch

    return t.dtype in (torch.float16, torch.bfloat16, torch.float32)


def gelu(input: Any, approximate: str = "none") -> Any:
    """``F.gelu`` with the exact (erf) result on NPU, where native gelu computes the tanh form."""
    if on_npu(input) and _floating(input) and approximate in ("none", "tanh") and 0 < input.dim() <= 8:
        return require_npu().npu_gelu(input, approximate=approximate)
    import torch.nn.functional as F

    return F.gelu(input, approximate=approximate)


def fast_gelu(input: Any, approximate: str = "none") -> Any:
    """``torch_npu.npu_fast_gelu`` on NPU (x * sigmoid(1.702 x), max abs error about 0.02)."""
    if on_npu(input) and _floating(input):
        return require_npu().npu_fast_gelu(input)
    import torch.nn.functional as F

    return F.gelu(input, approximate=approximate)


def _shape(normalized_shape: Any) -> tuple:
    if isinstance(normalized_shape, int):
        return (normalized_shape,)
    return tuple(int(n) for n in normalized_shape)


def rms_norm(input: Any, normalized_shape: Any, weight: Any = None, eps: Optional[float] = None) -> Any:
    """``F.rms_norm`` through ``torch_npu.npu_rms_norm(x, weight, epsilon=eps)[0]`` on NPU."""
    import torch
    import torch.nn.functional as F

    if weight is not None and on_npu(input) and _floating(input) and weight.dtype == input.dtype:
        shape = _shape(normalized_shape)
        if 0 < len(shape) <= input.dim() <= 8 and tuple(weight.shape) == shape and tuple(input.shape[-len(shape):]) == shape:
            # torch's default eps is that of the op-math type: float32's for half types too
            epsilon = float(eps) if eps is not None else torch.finfo(torch.float32).eps
            return require_npu().npu_rms_norm(input, weight, epsilon=epsilon)[0]
    return F.rms_norm(input, normalized_shape, weight, eps)


def swiglu(x: Any, a: Any, b: Any) -> Any:
    """``F.silu(a) * b`` where ``a, b = x.chunk(2, -1)``: ``torch_npu.npu_swiglu(x, dim=-1)`` on NPU
    when a and b are still exactly x's two halves (an even last dimension, a contiguous x)."""
    if (
        on_npu(x)
        and _floating(x)
        and 0 < x.dim() <= 8
        and x.numel() > 0
        and x.shape[-1] % 2 == 0
        and x.is_contiguous()
        and a.shape == b.shape
        and a.shape[-1] * 2 == x.shape[-1]
        and a.dtype == x.dtype == b.dtype
        and a.stride() == x.stride() == b.stride()
        and a.data_ptr() == x.data_ptr()
        and b.data_ptr() == x.data_ptr() + a.shape[-1] * x.element_size()
    ):
        return require_npu().npu_swiglu(x, dim=-1)
    import torch.nn.functional as F

    return F.silu(a) * b


def fused_ok(op: str) -> Optional[bool]:
    """``fused=`` for torch's optimizer ``op`` ("adam", "adamw", "sgd"): True where the installed
    torch_npu registers the fused kernel, else None (torch's default path)."""
    import torch

    key = "PrivateUse1" if kernel_device_type() == "npu" else kernel_device_type().upper()
    has = getattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", None)
    try:
        return True if has is not None and has(f"aten::_fused_{op}_", key) else None
    except RuntimeError:
        return None


class _PickledAsTorchs:
    """A module class pickled as the torch class it derives from: a model saved whole
    (``torch.save(model)``) after the rewrite loads where scalebox_cst is not installed, as the
    torch module the code wrote (whose forward is the same function, unfused). A copy in this
    process (``copy.deepcopy(actor)`` for a target network) keeps this class."""

    def __reduce_ex__(self, protocol: Any) -> Any:
        import copyreg

        rv = super().__reduce_ex__(protocol)
        torchs = next(c for c in type(self).__mro__ if c.__module__.startswith("torch."))
        # pickle's own rebuilder of protocols 0-1 (``object.__new__(torchs)``, then the state)
        rebuild = vars(copyreg)["_reconstructor"]
        return (rebuild, (torchs, object, None), *rv[2:])

    def __deepcopy__(self, memo: Any) -> Any:
        import copy

        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new


def _make_gelu() -> type:
    import torch.nn as nn

    class GELU(_PickledAsTorchs, nn.GELU):
        """``nn.GELU`` whose forward is :func:`gelu` (same arguments, parameters, state_dict)."""

        def forward(self, input: Any) -> Any:
            return gelu(input, approximate=self.approximate)

    return GELU


def _make_rms_norm() -> type:
    import torch.nn as nn

    class RMSNorm(_PickledAsTorchs, nn.RMSNorm):
        """``nn.RMSNorm`` whose forward is :func:`rms_norm` (same arguments, parameters, state_dict)."""

        def forward(self, x: Any) -> Any:
            return rms_norm(x, self.normalized_shape, self.weight, self.eps)

    return RMSNorm


_LAZY = {"GELU": _make_gelu, "RMSNorm": _make_rms_norm}


def __getattr__(name: str) -> Any:
    # ``from scalebox_cst.runtime.npu import torch_npu`` runs the check; the module classes need
    # torch, which this module does not import at load time (see require_npu)
    if name == "torch_npu":
        return require_npu()
    if name in _LAZY:
        cls = _LAZY[name]()
        cls.__module__ = __name__
        cls.__qualname__ = name
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
