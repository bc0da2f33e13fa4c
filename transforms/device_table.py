"""The accelerator swap table: every device rewrite is one entry of data, with its golden example.

A new swap is one :class:`Swap` here (plus, when it emits a new torch_npu function, that function
in the test stand-in ``tests/fake_torch_npu``); ``tests/test_device_table.py`` runs each entry's
``before`` through the pipeline and compares with its ``after``. The engine that interprets the
``kind`` of an entry lives in :mod:`scalebox_cst.transforms.device`; this module holds no logic.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

from scalebox_cst.report import CHANGES_SEMANTICS, EXACT, REASSOCIATED, REWRITTEN, WARNING

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
    "add-kwarg": "a call of pattern without any of the `absent` keywords gets keyword=value",
    "helper": "a call or argument reference of pattern -> the guarded runtime helper replacement",
    "swiglu": "`a, b = x.chunk(2, -1)` then `silu(a) * b` -> the guarded swiglu helper",
    "insert": "replacement statement inserted after the module's imports",
    "report-ref": "a reference under the qualified prefix pattern is reported (nothing changed)",
    "report-import": "an import of the module pattern is reported (nothing changed)",
    "report-decorator": "a decorator whose qualified name is pattern is reported (nothing changed)",
}

#: Named conditions an entry may carry; the engine checks each and reports a SKIPPED site when one
#: fails (a rewrite happens only where all of them hold).
CONDITIONS = {
    "no-user-member": "no class in the module defines a method or attribute of that name",
    "no-star-kwargs": "the call has no **kwargs (it could hold the keyword we would add)",
    "not-tanh": "approximate is not the literal 'tanh' (native gelu computes tanh on NPU anyway)",
    "has-weight": "a weight argument is given and is not the literal None",
    "affine": "elementwise_affine is not the literal False (npu_rms_norm needs a weight)",
    "npu-fused-ok": "only NpuFused* keywords, no bf16, no set_to_none/foreign zero_grad in module",
    "imports-torch": "the module imports torch",
    "no-args": "the method is called without arguments (Tensor.double(), not some other double)",
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
_HELPER_LINE = "from scalebox_cst.runtime import npu as scalebox_npu\n"


def _twin(name: str, call: str = "()") -> Swap:
    """``torch.cuda.<name>`` -> ``torch.npu.<name>`` (torch_npu registers the twin namespace)."""
    return Swap(
        id=f"placement.twin.{name}",
        transform=PLACEMENT,
        kind="rename",
        pattern=f"torch.cuda.{name}",
        replacement=f"torch.npu.{name}",
        reason=f"torch.cuda.{name} -> torch.npu.{name} (the NPU twin torch_npu registers)",
        min_torch_npu="1.11.0",
        before=f"import torch\nr = torch.cuda.{name}{call}\n",
        after=f"{_NPU_LINE}import torch\nr = torch.npu.{name}{call}\n",
    )


TWINS = (
    ("is_available", "()"),
    ("device_count", "()"),
    ("set_device", "(0)"),
    ("current_device", "()"),
    ("synchronize", "()"),
    ("manual_seed", "(0)"),
    ("manual_seed_all", "(0)"),
    ("memory_allocated", "()"),
    ("max_memory_allocated", "()"),
    ("reset_peak_memory_stats", "()"),
    ("empty_cache", "()"),
    ("memory_reserved", "()"),
    ("max_memory_reserved", "()"),
    ("get_device_name", "(0)"),
    ("is_bf16_supported", "()"),
    ("get_rng_state", "()"),
    ("set_rng_state", "(state)"),
    ("Stream", "()"),
    ("Event", "(enable_timing=True)"),
    ("current_stream", "()"),
    ("stream", "(s)"),
)

_OPTIMIZERS = (("Adam", "adam"), ("AdamW", "adamw"), ("SGD", "sgd"))


def _fused(cls: str, op: str, backend: str) -> Swap:
    value = "True" if backend == "cuda" else f'{{npu}}.fused_ok("{op}")'
    emitted = "True" if backend == "cuda" else f'scalebox_npu.fused_ok("{op}")'
    lines = "" if backend == "cuda" else _NPU_LINE + _HELPER_LINE
    guard = (
        ""
        if backend == "cuda"
        else "; fused_ok() asks at run time whether the installed torch_npu has the fused kernel "
        "(None, torch's default path, where it does not)"
    )
    return Swap(
        id=f"optimizer.fused.{op}.{backend}",
        transform=OPTIMIZER,
        kind="add-kwarg",
        pattern=f"torch.optim.{cls}",
        also=(f"torch.optim.{op}.{cls}",),
        backends=(backend,),
        exactness=REASSOCIATED,
        keyword="fused",
        value=value,
        absent=("fused", "foreach", "differentiable"),
        conditions=("no-star-kwargs",),
        reason=f"torch.optim.{cls}(fused=True): one fused kernel per step; not bitwise identical to "
        "torch's default path (fp32 tolerance 1e-5 relative; measured on CPU against the for-loop: "
        f"max |diff| about 1e-7 after 50 steps){guard}",
        # torch 2.1-2.3 refuse fused=True in the constructor while the parameters are still on
        # the CPU (code that builds the optimizer before .cuda(), e.g. the TD3 author's); 2.4 added
        # CPU fused kernels and checks devices at step time. The NPU entry asks at run time.
        min_torch="2.4" if backend == "cuda" else ("2.3" if cls == "SGD" else "2.0"),
        before=f"import torch\nopt = torch.optim.{cls}(model.parameters(), lr=1e-3)\n",
        after=f"{lines}import torch\nopt = torch.optim.{cls}(model.parameters(), lr=1e-3, fused={emitted})\n",
    )


def _foreach_cpu(cls: str, op: str) -> Swap:
    return Swap(
        id=f"optimizer.foreach.{op}.cpu",
        transform=OPTIMIZER,
        kind="add-kwarg",
        pattern=f"torch.optim.{cls}",
        also=(f"torch.optim.{op}.{cls}",),
        backends=("cpu",),
        exactness=EXACT,
        keyword="foreach",
        value="True",
        absent=("fused", "foreach", "differentiable"),
        conditions=("no-star-kwargs",),
        reason=f"torch.optim.{cls}(foreach=True): torch defaults to the per-parameter loop for CPU "
        "tensors; the foreach path does the same operations per tensor (bitwise identical, checked "
        "in tests) with fewer Python dispatches (about 7% faster per step on a small MLP)",
        before=f"import torch\nopt = torch.optim.{cls}(model.parameters(), lr=1e-3)\n",
        after=f"import torch\nopt = torch.optim.{cls}(model.parameters(), lr=1e-3, foreach=True)\n",
    )


def _npu_fused(cls: str, op: str, accepts: Tuple[str, ...]) -> Swap:
    return Swap(
        id=f"optimizer.npu-fused.{op}",
        transform=OPTIMIZER,
        kind="call-replace",
        pattern=f"torch.optim.{cls}",
        also=(f"torch.optim.{op}.{cls}",),
        replacement=f"torch_npu.optim.NpuFused{cls}",
        exactness=REASSOCIATED,
        accepts=accepts,
        conditions=("npu-fused-ok",),
        option="npu_fused_optimizer",
        reason=f"torch_npu.optim.NpuFused{cls} (requested): parameters are flattened into one buffer, "
        "so they must not be reallocated afterwards (no model.cpu(), no set_to_none); bf16 is "
        "rejected; update order differs from torch's loop (reassociated, fp32 tolerance 1e-6)",
        min_torch_npu="1.11.0",
        before=f"import torch\nopt = torch.optim.{cls}(model.parameters(), lr=1e-3)\n",
        after=f"{_NPU_LINE}import torch\nopt = torch_npu.optim.NpuFused{cls}(model.parameters(), lr=1e-3)\n",
        example_options=(("npu_fused_optimizer", True),),
    )


TABLE: Tuple[Swap, ...] = (
    # ------------------------------------------------------------------ placement (npu)
    Swap(
        id="placement.cuda-method",
        transform=PLACEMENT,
        kind="method",
        pattern="cuda",
        replacement="npu",
        conditions=("no-user-member",),
        reason=".cuda() -> .npu() (Tensor.npu / Module.npu from torch_npu)",
        min_torch_npu="1.11.0",
        before="import torch\nnet = torch.nn.Linear(2, 2).cuda()\nx = torch.zeros(2).cuda(non_blocking=True)\n",
        after=f"{_NPU_LINE}import torch\nnet = torch.nn.Linear(2, 2).npu()\nx = torch.zeros(2).npu(non_blocking=True)\n",
    ),
    Swap(
        id="placement.is-cuda",
        transform=PLACEMENT,
        kind="attribute",
        pattern="is_cuda",
        replacement="is_npu",
        conditions=("no-user-member",),
        reason="x.is_cuda -> x.is_npu",
        min_torch_npu="1.11.0",
        before="import torch\nif x.is_cuda:\n    pass\n",
        after=f"{_NPU_LINE}import torch\nif x.is_npu:\n    pass\n",
    ),
    Swap(
        id="placement.torch-device",
        transform=PLACEMENT,
        kind="literal-arg",
        pattern="torch.device",
        positions=DEVICE_POSITIONS,
        literal=CUDA_LITERAL,
        reason="device string in a device argument: 'cuda' -> 'npu'",
        min_torch_npu="1.11.0",
        before=(
            "import torch\n"
            'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n'
            'd1 = torch.device("cuda", 1)\n'
            "d2 = torch.device('cuda:0')\n"
            'd3 = torch.device(f"cuda:{rank}")\n'
        ),
        after=(
            f"{_NPU_LINE}import torch\n"
            'device = torch.device("npu" if torch.npu.is_available() else "cpu")\n'
            'd1 = torch.device("npu", 1)\n'
            "d2 = torch.device('npu:0')\n"
            'd3 = torch.device(f"npu:{rank}")\n'
        ),
    ),
    Swap(
        id="placement.device-kwarg",
        transform=PLACEMENT,
        kind="literal-arg",
        pattern="device=",
        positions=DEVICE_POSITIONS,
        literal=CUDA_LITERAL,
        reason="device string in a device argument: 'cuda' -> 'npu'",
        min_torch_npu="1.11.0",
        before='import torch\nx = torch.zeros(3, device="cuda")\ny = torch.randn(2, 2, device="cuda:1")\n',
        after=f'{_NPU_LINE}import torch\nx = torch.zeros(3, device="npu")\ny = torch.randn(2, 2, device="npu:1")\n',
    ),
    Swap(
        id="placement.to",
        transform=PLACEMENT,
        kind="literal-arg",
        pattern=".to",
        positions=DEVICE_POSITIONS,
        literal=CUDA_LITERAL,
        reason="device string in a device argument: 'cuda' -> 'npu'",
        min_torch_npu="1.11.0",
        before='import torch\nmodel.to("cuda")\nx = x.to(device="cuda:0", non_blocking=True)\n',
        after=f'{_NPU_LINE}import torch\nmodel.to("npu")\nx = x.to(device="npu:0", non_blocking=True)\n',
    ),
    Swap(
        id="placement.map-location",
        transform=PLACEMENT,
        kind="literal-arg",
        pattern="torch.load",
        positions=DEVICE_POSITIONS,
        literal=CUDA_LITERAL,
        reason="device string in a device argument: 'cuda' -> 'npu'",
        min_torch_npu="1.11.0",
        before='import torch\nstate = torch.load("ckpt.pt", map_location="cuda")\n',
        after=f'{_NPU_LINE}import torch\nstate = torch.load("ckpt.pt", map_location="npu")\n',
    ),
    Swap(
        id="placement.device-variable",
        transform=PLACEMENT,
        kind="literal-arg",
        pattern="<name flowing into a device argument>",
        positions=DEVICE_POSITIONS,
        literal=CUDA_LITERAL,
        reason="device string in a device argument: 'cuda' -> 'npu'",
        min_torch_npu="1.11.0",
        before=(
            "import torch\n"
            'device = "cuda"\n'
            "x = torch.ones(2, device=device)\n"
            'if device == "cuda":\n'
            "    pass\n"
        ),
        after=(
            f"{_NPU_LINE}import torch\n"
            'device = "npu"\n'
            "x = torch.ones(2, device=device)\n"
            'if device == "npu":\n'
            "    pass\n"
        ),
    ),
    Swap(
        id="placement.argparse-default",
        transform=PLACEMENT,
        kind="literal-arg",
        pattern="<argparse option flowing into a device argument>",
        positions=DEVICE_POSITIONS,
        literal=CUDA_LITERAL,
        reason="device string in a device argument: 'cuda' -> 'npu'",
        min_torch_npu="1.11.0",
        before=(
            "import argparse\nimport torch\n"
            "parser = argparse.ArgumentParser()\n"
            'parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"], help="cuda or cpu")\n'
            "args = parser.parse_args()\n"
            "device = torch.device(args.device)\n"
        ),
        after=(
            f"{_NPU_LINE}import argparse\nimport torch\n"
            "parser = argparse.ArgumentParser()\n"
            'parser.add_argument("--device", default="npu", choices=["cpu", "npu"], help="cuda or cpu")\n'
            "args = parser.parse_args()\n"
            "device = torch.device(args.device)\n"
        ),
    ),
    Swap(
        id="placement.device-type-compare",
        transform=PLACEMENT,
        kind="compare",
        pattern=".type",
        literal=CUDA_LITERAL,
        reason="device type comparison: 'cuda' -> 'npu'",
        min_torch_npu="1.11.0",
        before='import torch\nif x.device.type == "cuda":\n    pass\n',
        after=f'{_NPU_LINE}import torch\nif x.device.type == "npu":\n    pass\n',
    ),
    Swap(
        id="placement.cudnn-flags",
        transform=PLACEMENT,
        kind="drop-assign",
        pattern="torch.backends.cudnn.",
        reason="cuDNN flag dropped: cuDNN is not used on NPU, the setting has no effect there",
        before=(
            "import torch\n"
            "# determinism\n"
            "torch.backends.cudnn.deterministic = True\n"
            "torch.backends.cudnn.benchmark = False\n"
            "x = 1\n"
        ),
        after="import torch\n# determinism\nx = 1\n",
    ),
    Swap(
        id="placement.nccl",
        transform=PLACEMENT,
        kind="literal-arg",
        pattern="torch.distributed.init_process_group",
        positions=(
            ("torch.distributed.init_process_group", 0, "backend"),
            ("torch.distributed.new_group", None, "backend"),
        ),
        literal=(r"^nccl$", "hccl"),
        reason="collective backend 'nccl' -> 'hccl' (Ascend's collective library)",
        min_torch_npu="1.11.0",
        before='import torch.distributed as dist\ndist.init_process_group("nccl")\nprint("nccl")\n',
        after=f'{_NPU_LINE}import torch.distributed as dist\ndist.init_process_group("hccl")\nprint("nccl")\n',
    ),
    *(_twin(name, call) for name, call in TWINS),
    # ------------------------------------------------------------------ autocast (npu)
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
    # ------------------------------------------------------------------ optimizers
    _npu_fused("Adam", "adam", ("lr", "betas", "eps", "weight_decay", "amsgrad")),
    _npu_fused("AdamW", "adamw", ("lr", "betas", "eps", "weight_decay", "amsgrad")),
    _npu_fused("SGD", "sgd", ("lr", "momentum", "dampening", "weight_decay", "nesterov")),
    *(_fused(cls, op, backend) for backend in ("cuda", "npu") for cls, op in _OPTIMIZERS),
    _foreach_cpu("Adam", "adam"),
    _foreach_cpu("AdamW", "adamw"),
    Swap(
        id="optimizer.clip-foreach",
        transform=OPTIMIZER,
        kind="add-kwarg",
        pattern="torch.nn.utils.clip_grad_norm_",
        also=("torch.nn.utils.clip_grad.clip_grad_norm_", "torch.nn.utils.clip_grad_norm"),
        backends=("cuda", "npu"),
        keyword="foreach",
        value="True",
        absent=("foreach",),
        conditions=("no-star-kwargs",),
        reason="clip_grad_norm_(foreach=True): pins the foreach kernels torch >= 2.1 already picks "
        "for these tensors, so the fast path cannot silently fall back to the per-tensor loop",
        min_torch="2.0",
        before="import torch\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)\n",
        after="import torch\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, foreach=True)\n",
        example_backend="cuda",
    ),
    Swap(
        id="optimizer.clip-helper-foreach",
        transform=OPTIMIZER,
        kind="add-kwarg",
        pattern="scalebox_cst.runtime.clip.clip_grad_norm",
        backends=("cuda", "npu"),
        keyword="foreach",
        value="True",
        absent=("foreach",),
        conditions=("no-star-kwargs",),
        reason="inserted clipping helper: foreach=True (see optimizer.clip-foreach)",
        before=(
            "from scalebox_cst.runtime.clip import clip_grad_norm as _scalebox_clip_grad_norm\n"
            "_scalebox_clip_grad_norm(opt, max_norm=1.0)\n"
        ),
        after=(
            "from scalebox_cst.runtime.clip import clip_grad_norm as _scalebox_clip_grad_norm\n"
            "_scalebox_clip_grad_norm(opt, max_norm=1.0, foreach=True)\n"
        ),
        example_backend="cuda",
    ),
    # ------------------------------------------------------------------ fused ops (npu)
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
        after=f"{_NPU_LINE}{_HELPER_LINE}import torch.nn.functional as F\ny = scalebox_npu.fast_gelu(h)\n",
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
            "y = scalebox_npu.gelu(h)\nact = scalebox_npu.gelu\n"
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
            "net = nn.Sequential(nn.Linear(4, 4), scalebox_npu.GELU())\n"
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
            "y = scalebox_npu.rms_norm(h, (64,), w, 1e-6)\n"
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
        after=f"{_NPU_LINE}{_HELPER_LINE}import torch\nnorm = scalebox_npu.RMSNorm(64, eps=1e-6)\n",
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
            "    return scalebox_npu.swiglu(x, a, b)\n"
        ),
    ),
    # ------------------------------------------------------------------ precision
    Swap(
        id="precision.float64",
        transform=PRECISION,
        kind="rename",
        pattern="torch.float64",
        also=("torch.double",),
        replacement="torch.float32",
        exactness=CHANGES_SEMANTICS,
        option="allow_precision_change",
        without_option="warn",
        site_kind="not-migratable:float64",
        reason="float64 -> float32: the NPU has no float64",
        before="import torch\nx = torch.zeros(3, dtype=torch.float64)\n",
        after="import torch\nx = torch.zeros(3, dtype=torch.float32)\n",
        example_options=(("allow_precision_change", True),),
    ),
    Swap(
        id="precision.double-method",
        transform=PRECISION,
        kind="method",
        pattern="double",
        replacement="float",
        exactness=CHANGES_SEMANTICS,
        conditions=("no-user-member", "no-args"),
        option="allow_precision_change",
        without_option="warn",
        site_kind="not-migratable:float64",
        reason=".double() -> .float(): the NPU has no float64",
        before="import torch\ny = x.double()\n",
        after="import torch\ny = x.float()\n",
        example_options=(("allow_precision_change", True),),
    ),
    Swap(
        id="precision.double-tensor",
        transform=PRECISION,
        kind="rename",
        pattern="torch.DoubleTensor",
        replacement="torch.FloatTensor",
        exactness=CHANGES_SEMANTICS,
        option="allow_precision_change",
        without_option="warn",
        site_kind="not-migratable:float64",
        reason="torch.DoubleTensor -> torch.FloatTensor: the NPU has no float64",
        before="import torch\nx = torch.DoubleTensor([1.0])\n",
        after="import torch\nx = torch.FloatTensor([1.0])\n",
        example_options=(("allow_precision_change", True),),
    ),
    Swap(
        id="precision.numpy-float64",
        transform=PRECISION,
        kind="rename",
        pattern="numpy.float64",
        also=("numpy.double",),
        replacement="numpy.float32",
        within=("torch.from_numpy", "torch.tensor", "torch.as_tensor"),
        exactness=CHANGES_SEMANTICS,
        option="allow_precision_change",
        without_option="warn",
        site_kind="not-migratable:float64",
        reason="numpy float64 flowing into a torch tensor -> float32: the NPU has no float64",
        before="import numpy as np\nimport torch\nx = torch.from_numpy(np.zeros(3, dtype=np.float64))\n",
        after="import numpy as np\nimport torch\nx = torch.from_numpy(np.zeros(3, dtype=np.float32))\n",
        example_options=(("allow_precision_change", True),),
    ),
    Swap(
        id="precision.tf32",
        transform=PRECISION,
        kind="insert",
        pattern="torch",
        replacement='{torch}.set_float32_matmul_precision("high")',
        backends=("cuda",),
        exactness=CHANGES_SEMANTICS,
        conditions=("imports-torch",),
        option="allow_tf32",
        reason="TF32 matmuls (requested): about 1e-3 relative error in float32 matmuls",
        before="import torch\nx = 1\n",
        after='import torch\ntorch.set_float32_matmul_precision("high")\nx = 1\n',
        example_options=(("allow_tf32", True),),
    ),
    # ------------------------------------------------------------------ cannot be migrated (npu)
    Swap(
        id="unsupported.nvtx",
        transform=UNSUPPORTED,
        kind="report-ref",
        pattern="torch.cuda.nvtx",
        action=WARNING,
        exactness=None,
        site_kind="not-migratable:nvtx",
        reason="torch.cuda.nvtx ranges have no NPU twin (use torch_npu.npu profiler ranges)",
        before='import torch\ntorch.cuda.nvtx.range_push("step")\n',
        after='import torch\ntorch.cuda.nvtx.range_push("step")\n',
    ),
    Swap(
        id="unsupported.cuda-graphs",
        transform=UNSUPPORTED,
        kind="report-ref",
        pattern="torch.cuda.graph",
        also=("torch.cuda.graphs", "torch.cuda.CUDAGraph", "torch.cuda.make_graphed_callables"),
        action=WARNING,
        exactness=None,
        site_kind="not-migratable:cuda-graphs",
        reason="CUDA graphs have no drop-in NPU twin (torch_npu's NPUGraph differs): not migrated",
        before="import torch\ng = torch.cuda.CUDAGraph()\n",
        after="import torch\ng = torch.cuda.CUDAGraph()\n",
    ),
    Swap(
        id="unsupported.cpp-extension",
        transform=UNSUPPORTED,
        kind="report-ref",
        pattern="torch.utils.cpp_extension.CUDAExtension",
        also=("torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline"),
        action=WARNING,
        exactness=None,
        site_kind="not-migratable:cuda-extension",
        reason="custom C++/CUDA extension: CUDA kernels do not run on NPU (they need an Ascend C port)",
        before='from torch.utils.cpp_extension import load\next = load("k", ["k.cu"])\n',
        after='from torch.utils.cpp_extension import load\next = load("k", ["k.cu"])\n',
    ),
    Swap(
        id="unsupported.backends-cuda",
        transform=UNSUPPORTED,
        kind="report-ref",
        pattern="torch.backends.cuda",
        action=WARNING,
        exactness=None,
        site_kind="not-migratable:torch.backends.cuda",
        reason="torch.backends.cuda settings have no effect on NPU (TF32 there is "
        "torch.npu.matmul.allow_hf32); kept as written",
        before="import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n",
        after="import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n",
    ),
    Swap(
        id="unsupported.torch-cuda",
        transform=UNSUPPORTED,
        kind="report-ref",
        pattern="torch.cuda",
        action=WARNING,
        exactness=None,
        site_kind="not-migratable:torch.cuda",
        reason="torch.cuda API without an NPU twin in the swap table: kept as written",
        before="import torch\ncc = torch.cuda.get_device_capability()\n",
        after="import torch\ncc = torch.cuda.get_device_capability()\n",
    ),
    Swap(
        id="unsupported.numba-cuda",
        transform=UNSUPPORTED,
        kind="report-ref",
        pattern="numba.cuda",
        action=WARNING,
        exactness=None,
        site_kind="not-migratable:numba-cuda",
        reason="numba.cuda kernels run on NVIDIA GPUs only",
        before="from numba import cuda\n@cuda.jit\ndef k(x):\n    pass\n",
        after="from numba import cuda\n@cuda.jit\ndef k(x):\n    pass\n",
    ),
    Swap(
        id="unsupported.cupy",
        transform=UNSUPPORTED,
        kind="report-import",
        pattern="cupy",
        action=WARNING,
        exactness=None,
        site_kind="not-migratable:cupy",
        reason="CuPy arrays live on NVIDIA GPUs only",
        before="import cupy as cp\nx = cp.zeros(3)\n",
        after="import cupy as cp\nx = cp.zeros(3)\n",
    ),
    Swap(
        id="unsupported.pycuda",
        transform=UNSUPPORTED,
        kind="report-import",
        pattern="pycuda",
        action=WARNING,
        exactness=None,
        site_kind="not-migratable:pycuda",
        reason="PyCUDA runs on NVIDIA GPUs only",
        before="import pycuda.autoinit\n",
        after="import pycuda.autoinit\n",
    ),
    Swap(
        id="unsupported.transfer-to-npu",
        transform=UNSUPPORTED,
        kind="report-import",
        pattern="torch_npu.contrib.transfer_to_npu",
        action=WARNING,
        exactness=None,
        site_kind="npu:transfer_to_npu",
        reason="transfer_to_npu makes torch.cuda answer for the NPU, so libraries take their CUDA "
        "paths; the explicit swaps here do not need it",
        before="import torch\nfrom torch_npu.contrib import transfer_to_npu\n",
        after="import torch\nfrom torch_npu.contrib import transfer_to_npu\n",
    ),
    Swap(
        id="unsupported.triton",
        transform=UNSUPPORTED,
        kind="report-decorator",
        pattern="triton.jit",
        also=("triton.autotune", "triton.heuristics"),
        action=WARNING,
        exactness=None,
        site_kind="not-migratable:triton",
        reason="Triton kernel: needs triton-ascend and usually retuning for NPU; not migrated",
        before="import triton\n@triton.jit\ndef kernel(x_ptr):\n    pass\n",
        after="import triton\n@triton.jit\ndef kernel(x_ptr):\n    pass\n",
    ),
)


def entries_for(transform_id: str) -> Tuple[Swap, ...]:
    return tuple(e for e in TABLE if e.transform == transform_id)


def owned_qualnames() -> frozenset:
    """Qualified names some rewriting entry handles (not reported as "cannot be migrated")."""
    kinds = ("rename", "call-replace", "helper")
    return frozenset(q for e in TABLE if e.kind in kinds for q in e.qualnames)
