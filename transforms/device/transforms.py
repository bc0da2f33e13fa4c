"""The six device transforms: one id each, whose entries are the table's entries for that id."""
from __future__ import annotations

from typing import List, Optional, Tuple

import libcst as cst

from scalebox_cst.report import Site

from ..base import FileContext, Transform
from . import table as T
from .analyzer import _Analyzer
from .apply import _apply
from .examples import examples


class _DeviceTransform(Transform):
    """One transform id; its entries are the table's entries for that id."""

    options_section = T.SECTION

    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        analyzer = _Analyzer(ctx, self.id, _ENTRIES[self.id])
        if not analyzer.entries:  # nothing in the module can match: no libcst parse at all
            return ctx.__dict__.get("module"), []  # None: unchanged (the pipeline parses lazily)
        analyzer.run()
        if not analyzer.edits and not analyzer.line_drops and not analyzer.module_inserts:
            return ctx.__dict__.get("module"), analyzer.sites
        return _apply(ctx, analyzer), analyzer.sites


_ENTRIES = {t: T.entries_for(t) for t in (T.PLACEMENT, T.AUTOCAST, T.OPTIMIZER, T.FUSED_OP, T.PRECISION, T.UNSUPPORTED)}


def _backends(transform_id: str) -> Tuple[str, ...]:
    found: List[str] = []
    for e in T.entries_for(transform_id):
        for b in e.backends:
            if b not in found:
                found.append(b)
    return tuple(found)


class DevicePlacement(_DeviceTransform):
    """Tensors, modules and device strings to the NPU; torch.cuda twins; cuDNN flags; nccl."""

    id = T.PLACEMENT
    version = "2"
    triggers = ("cuda", "cudnn", "nccl")
    backends = _backends(T.PLACEMENT)
    description = "cuda placement -> npu (torch_npu)"
    EXAMPLES = examples(T.PLACEMENT)


class DeviceAutocast(_DeviceTransform):
    """CUDA autocast and GradScaler to their NPU forms."""

    id = T.AUTOCAST
    version = "1"
    triggers = ("autocast", "GradScaler")
    backends = _backends(T.AUTOCAST)
    description = "cuda autocast / GradScaler -> npu"
    EXAMPLES = examples(T.AUTOCAST)


class DeviceOptimizer(_DeviceTransform):
    """Fused optimizers (cuda, npu), foreach optimizers (cpu), foreach clipping."""

    id = T.OPTIMIZER
    version = "3"  # 3: helpers as _scalebox_npu; 2: SGD is never fused (sparse grads, complex params, GradScaler skips)
    triggers = ("Adam", "SGD", "clip_grad_norm")
    backends = _backends(T.OPTIMIZER)
    description = "fused / foreach optimizer and clipping paths"
    EXAMPLES = examples(T.OPTIMIZER)


class DeviceFusedOp(_DeviceTransform):
    """Guarded fused NPU kernels where the semantics are the user's: gelu, rms_norm, swiglu."""

    id = T.FUSED_OP
    version = "2"  # 2: the helpers module is imported as _scalebox_npu (private to a star import)
    triggers = ("gelu", "GELU", "rms_norm", "RMSNorm", "silu")
    backends = _backends(T.FUSED_OP)
    description = "gelu / rms_norm / swiglu -> torch_npu fused kernels (guarded)"
    EXAMPLES = examples(T.FUSED_OP)


class DevicePrecision(_DeviceTransform):
    """float64 sites on NPU (reported; float32 only on request) and TF32 on request on CUDA."""

    id = T.PRECISION
    version = "1"
    triggers = ("float64", "double", "Double")
    backends = _backends(T.PRECISION)
    description = "float64 on NPU; TF32 on request"
    EXAMPLES = examples(T.PRECISION)

    def applies(self, ctx: FileContext) -> bool:
        if ctx.backend == "cuda":
            return bool(ctx.option(T.SECTION, "allow_tf32", False)) and "torch" in ctx.code
        return super().applies(ctx)


class DeviceUnsupported(_DeviceTransform):
    """What cannot be migrated to NPU, reported with a ``not-migratable:<kind>`` site kind."""

    id = T.UNSUPPORTED
    version = "2"
    triggers = ("cuda", "cupy", "triton", "cpp_extension", "transfer_to_npu")
    backends = _backends(T.UNSUPPORTED)
    description = "report what has no NPU counterpart"
    EXAMPLES = examples(T.UNSUPPORTED)


DEVICE_TRANSFORMS = (DevicePlacement, DeviceAutocast, DeviceOptimizer, DeviceFusedOp, DevicePrecision, DeviceUnsupported)
