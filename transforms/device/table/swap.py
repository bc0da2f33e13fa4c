"""What a swap is (:class:`Swap`), the kinds and conditions the engine implements, and the
constants every family's entries share (transform ids, device argument positions, emitted imports)."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

from scalebox_cst.report import EXACT, REWRITTEN

PLACEMENT = "device.placement"
AUTOCAST = "device.autocast"
OPTIMIZER = "device.optimizer"
FUSED_OP = "device.fused_op"
PRECISION = "device.precision"
UNSUPPORTED = "device.unsupported"

#: config section of the device options (``config.set_option("device", key, value)``)
SECTION = "device"

#: what rewritten npu code imports first: fails at once, with one line, where torch_npu is unusable
NPU_IMPORT = "scalebox_cst.runtime.npu.torch_npu"
#: guarded helpers (fused NPU kernel for NPU tensors, the original call otherwise)
NPU_HELPERS = "scalebox_cst.runtime.npu"

#: How an entry's ``pattern`` is matched (the engine implements one handler per kind):
KINDS = {
    "rename": "a reference (called or not) whose qualified name is pattern/also -> replacement",
    "method": "a method call .pattern(...) on a non-module receiver -> .replacement(...)",
    "attribute": "an attribute read .pattern on a non-module receiver -> .replacement",
    "literal-arg": "a string literal (or a value flowing from one) in one of positions -> literal",
    "compare": "`<x>.type == <literal>` / a device-flowing name compared with a literal -> literal",
    "drop-assign": "an assignment to an attribute under the qualified prefix pattern is dropped",
    "call-replace": "a call of pattern -> a call of replacement, lead args first, positionals named",
    "add-kwarg": "a call of pattern without any of the `absent` keywords gets keyword=value (or, where "
    "replacement names a runtime helper, becomes replacement(<callee>, <args>): the helper adds it where it holds)",
    "helper": "a call or argument reference of pattern -> the guarded runtime helper replacement",
    "swiglu": "`a, b = x.chunk(2, -1)` then `silu(a) * b` -> the guarded swiglu helper",
    "insert": "replacement statement inserted after the module's imports",
    "legacy-tensor": "torch.cuda.<T>Tensor (called, in .type(), or as an alias only called) -> a tensor of dtype "
    "replacement on the npu (value: the CPU legacy type); any other use is reported",
    "report-ref": "a reference under the qualified prefix pattern is reported (nothing changed)",
    "report-import": "an import of the module pattern is reported (nothing changed)",
    "report-decorator": "a decorator whose qualified name is pattern is reported (nothing changed)",
}

#: Named conditions an entry may carry; the engine checks each and reports a SKIPPED site when one
#: fails (a rewrite happens only where all of them hold).
CONDITIONS = {
    "no-user-member": "no class in the module defines a method or attribute of that name",
    "no-star-kwargs": "the call has no **kwargs (it could hold the keyword we would add)",
    "never": "never holds: the call is reported with the entry's reason and left as written",
    "number-lr": "the learning rate is absent, a number, or names no statement binds to a call (a tensor lr refuses foreach=True)",
    "not-tanh": "approximate is not the literal 'tanh' (native gelu computes tanh on NPU anyway)",
    "has-weight": "a weight argument is given and is not the literal None",
    "affine": "elementwise_affine is not the literal False (npu_rms_norm needs a weight)",
    "npu-fused-ok": "only NpuFused* keywords, no bf16, no set_to_none/foreign zero_grad in module",
    "imports-torch": "the module imports torch",
    "no-args": "the method is called without arguments (Tensor.double(), not some other double)",
    "precision-allowed": "float64 data: migrated (as float32) only with [device] allow_precision_change",
}

#: device argument positions: (callee, positional index, keyword); callee is a qualified name,
#: ".name" for a method of that name, or "*" for any call (keyword only)
DEVICE_POSITIONS = (
    ("torch.device", 0, "type"),
    ("*", None, "device"),
    (".to", 0, "device"),
    ("torch.load", 1, "map_location"),
    ("torch.Generator", 0, "device"),
    ("torch.set_default_device", 0, "device"),
)

CUDA_LITERAL = (r"^cuda(?=$|:)", "npu")


@dataclasses.dataclass(frozen=True)
class Swap:
    """One swap: what is matched, what replaces it, when, how exact, and its golden example."""

    id: str
    transform: str
    kind: str
    pattern: str
    replacement: str = ""
    backends: Tuple[str, ...] = ("npu",)
    exactness: Optional[str] = EXACT
    reason: str = ""
    action: str = REWRITTEN
    also: Tuple[str, ...] = ()  # further qualified names matched like pattern
    conditions: Tuple[str, ...] = ()
    positions: Tuple[Tuple[str, Optional[int], Optional[str]], ...] = ()
    literal: Tuple[str, str] = ()  # (regex on the literal's text, replacement of the match)
    keyword: str = ""  # add-kwarg: the keyword added
    value: str = ""  # add-kwarg: its value ({npu} stands for the runtime helper module alias)
    absent: Tuple[str, ...] = ()  # add-kwarg: keywords whose presence means "the user chose"
    lead: Tuple[str, ...] = ()  # call-replace: arguments put first
    params: Tuple[str, ...] = ()  # call-replace: positional parameters turned into keywords
    accepts: Tuple[str, ...] = ()  # call-replace: the keywords the replacement takes (others: skip)
    within: Tuple[str, ...] = ()  # rename: only inside the arguments of these calls
    option: Optional[str] = None  # applies only when [device] option is true ...
    without_option: str = "ignore"  # ... else "ignore" it or "warn" (report, change nothing)
    min_torch_npu: Optional[str] = None  # first torch_npu release documenting what is emitted
    min_torch: Optional[str] = None
    site_kind: Optional[str] = None  # Site.kind, e.g. "not-migratable:cupy"
    before: str = ""
    after: str = ""  # golden rewrite of before (equal to before: must be left alone)
    example_backend: str = ""  # backend of the golden example (default: first of backends)
    example_options: Tuple[Tuple[str, Any], ...] = ()

    @property
    def qualnames(self) -> Tuple[str, ...]:
        return (self.pattern,) + self.also

    @property
    def golden_backend(self) -> str:
        return self.example_backend or self.backends[0]


_NPU_LINE = "from scalebox_cst.runtime.npu import torch_npu\n"
_HELPER_LINE = "from scalebox_cst.runtime import npu as _scalebox_npu\n"
