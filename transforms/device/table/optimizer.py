"""Optimizer swaps: fused (cuda, npu), NpuFused* (npu, requested), foreach (cpu), foreach clipping."""
from __future__ import annotations

from typing import Tuple

from scalebox_cst.report import EXACT, REASSOCIATED

from .swap import OPTIMIZER, Swap, _HELPER_LINE, _NPU_LINE


_OPTIMIZERS = (("Adam", "adam"), ("AdamW", "adamw"))

#: Why SGD is never given fused= (checked on CPU with torch 2.13; torch's Python ``_fused_sgd`` is
#: shared by every device): the default accepts what the fused path refuses or corrupts, and where
#: that happens cannot be seen from the optimizer's call (the model and the scaler live elsewhere)
_SGD_LEFT = (
    "SGD left as written: fused SGD raises at step() on sparse gradients (sparse=True embeddings, "
    "in any module) and complex parameters, and with momentum corrupts its buffers when a GradScaler "
    "skips the first step; the default handles all three"
)


#: on CUDA the call is built through this helper, which adds fused=True only where every parameter
#: is a dense float tensor on CPU/CUDA (fused Adam raises at step() on a complex parameter, which the
#: default takes); it is accelerate.fused_optim's helper
FUSED_HELPER = "scalebox_cst.runtime.fused_optimizer.fused_optimizer"
_FUSED_LINE = "from scalebox_cst.runtime.fused_optimizer import fused_optimizer as _sbx_fused_optimizer\n"


def _fused(cls: str, op: str, backend: str) -> Swap:
    if backend == "cuda":
        return _fused_cuda(cls, op)
    value = f'{{npu}}.fused_ok("{op}")'
    emitted = f'_scalebox_npu.fused_ok("{op}")'
    lines = _NPU_LINE + _HELPER_LINE
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
        reason=f"{cls}(fused=...): torch_npu's fused kernel, where fused_ok() finds it in the installed "
        "torch_npu at run time (else None, torch's default); last bits differ (about 1e-7 after 50 steps, "
        "on CPU)",
        min_torch="2.0",
        before=f"import torch\nopt = torch.optim.{cls}(model.parameters(), lr=1e-3)\n",
        after=f"{lines}import torch\nopt = torch.optim.{cls}(model.parameters(), lr=1e-3, fused={emitted})\n",
    )


def _fused_cuda(cls: str, op: str) -> Swap:
    return Swap(
        id=f"optimizer.fused.{op}.cuda",
        transform=OPTIMIZER,
        kind="add-kwarg",
        pattern=f"torch.optim.{cls}",
        also=(f"torch.optim.{op}.{cls}",),
        replacement=FUSED_HELPER,
        backends=("cuda",),
        exactness=REASSOCIATED,
        keyword="fused",
        value="True",
        absent=("fused", "foreach", "differentiable"),
        conditions=("no-star-kwargs",),
        reason=f"{cls}(fused=True) where every parameter is a dense float tensor (checked at construction): "
        "one kernel per step where CUDA's default (foreach) launches several, not timed here; last bits "
        "differ (about 1e-7 after 50 steps, on CPU)",
        # torch 2.1-2.3 refuse fused=True in the constructor while the parameters are still on
        # the CPU (code that builds the optimizer before .cuda(), e.g. the TD3 author's); 2.4 added
        # CPU fused kernels and checks devices at step time (the helper also asks for them).
        min_torch="2.4",
        before=f"import torch\nopt = torch.optim.{cls}(model.parameters(), lr=1e-3)\n",
        after=f"{_FUSED_LINE}import torch\nopt = _sbx_fused_optimizer(torch.optim.{cls}, model.parameters(), lr=1e-3)\n",
    )


def _sgd_left(backend: str) -> Swap:
    return Swap(
        id=f"optimizer.fused.sgd.{backend}",
        transform=OPTIMIZER,
        kind="add-kwarg",
        pattern="torch.optim.SGD",
        also=("torch.optim.sgd.SGD",),
        backends=(backend,),
        exactness=None,
        keyword="fused",
        value="True",
        absent=("fused", "foreach", "differentiable"),
        conditions=("never",),
        reason=_SGD_LEFT,
        before="import torch\nopt = torch.optim.SGD(model.parameters(), lr=1e-3)\n",
        after="import torch\nopt = torch.optim.SGD(model.parameters(), lr=1e-3)\n",
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
        conditions=("no-star-kwargs", "number-lr"),
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


OPTIMIZER_SWAPS: Tuple[Swap, ...] = (
    _npu_fused("Adam", "adam", ("lr", "betas", "eps", "weight_decay", "amsgrad")),
    _npu_fused("AdamW", "adamw", ("lr", "betas", "eps", "weight_decay", "amsgrad")),
    _npu_fused("SGD", "sgd", ("lr", "momentum", "dampening", "weight_decay", "nesterov")),
    *(_fused(cls, op, backend) for backend in ("cuda", "npu") for cls, op in _OPTIMIZERS),
    _sgd_left("cuda"),
    _sgd_left("npu"),
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
)
