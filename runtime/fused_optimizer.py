"""Adam/AdamW built with ``fused=True`` where torch's fused kernel takes every parameter.

``accelerate.fused_optim`` (opt in, level ``reassociated``) rewrites ``optim.Adam(params, ...)`` to
``fused_optimizer(optim.Adam, params, ...)``; ``device.optimizer`` emits the same call on CUDA.
On CPU the default Adam updates each parameter with a Python loop of small ops (the ``for``-loop implementation: torch picks ``foreach`` only for
CUDA tensors); the fused kernel does the whole step in one call per device and dtype: 4x faster
per step on CleanRL's 64-unit agent (about 470 us -> 120 us, benchmarks/bench_fast_cpu.py). The
update is the same formula with the operations in another order (last-bit differences that
grow like float noise over a run): hence the ``reassociated`` tier.

Torch checks fused's device and dtype only at the first ``step`` (a ``RuntimeError`` mid-run),
so the check is made here, at construction, on what the optimizer will hold: every parameter a
plain tensor (``Tensor``/``Parameter``), floating point, dense, on CPU or CUDA (the devices
measured; NPU and others keep the original call), and torch >= 2.4 (fused CPU kernels). Anything
else (a complex parameter, a group in a form not recognised, a lone tensor, which the original
rejects with its own ``TypeError``) builds the optimizer exactly as written. The parameter
iterable is listed once here, as the optimizer does itself (``list(params)``; a group dict's
``params`` is listed into the dict, as ``add_param_group`` does), so a generator is not consumed
twice.
"""
from __future__ import annotations

import weakref
from typing import Any, Iterable, List, Optional

#: devices whose fused Adam kernels were measured (CPU here; CUDA's is torch's recommended path)
DEVICES = ("cpu", "cuda")


def _tensors(group: Any) -> Optional[List[Any]]:
    """The tensors of one ``params`` entry: a tensor, ``(name, tensor)``, or a group dict (its
    ``params`` listed in place, as ``Optimizer.add_param_group`` does). None: a form not known."""
    import torch

    if isinstance(group, torch.Tensor):
        return [group]
    if isinstance(group, tuple) and len(group) == 2 and isinstance(group[0], str) and isinstance(group[1], torch.Tensor):
        return [group[1]]
    if type(group) is dict and "params" in group:
        inner = group["params"]
        if isinstance(inner, torch.Tensor):
            return [inner]
        if isinstance(inner, (set, str, bytes)):  # the optimizer's own error (set: unordered)
            return None
        group["params"] = list(inner)
        out: List[Any] = []
        for item in group["params"]:
            got = _tensors(item) if not isinstance(item, dict) else None
            if got is None:
                return None
            out.extend(got)
        return out
    return None


def fusable(tensors: Iterable[Any]) -> bool:
    """Whether torch's fused Adam kernel takes every tensor (checked as ``step`` would)."""
    import torch

    for t in tensors:
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or not torch.is_floating_point(t) \
                or t.is_sparse or t.device.type not in DEVICES:
            return False
    return True


_SETTLED: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()  # optimizer -> its size


def unset_momentum(optimizer: Any) -> List[Any]:
    """The parameters of ``optimizer``'s fused SGD groups with momentum that have no momentum
    buffer yet (the first update). A step skipped through ``found_inf`` (a GradScaler's, the
    stabilizer's) allocates their buffers (``torch.empty_like``) and never writes them, and every
    later step reads them: parameters off by about 1e29 after three steps (torch 2.13)."""
    groups = getattr(optimizer, "param_groups", ())
    size = sum(len(group["params"]) for group in groups)
    if _SETTLED.get(optimizer) == size:  # every buffer was there at this size (the guard asks each step)
        return []
    out: List[Any] = []
    for group in groups:
        if group.get("fused") and group.get("momentum"):
            out += [p for p in group["params"] if p.grad is not None and "momentum_buffer" not in optimizer.state.get(p, {})]
    if not out:
        _SETTLED[optimizer] = size
    return out


def forget_unwritten_momentum(optimizer: Any, params: List[Any], found_inf: Any) -> List[Any]:
    """After a step that ``found_inf`` skipped: drop the buffers it allocated for ``params`` (from
    :func:`unset_momentum`), so the next step is the first update, as if none had run (one host
    read of ``found_inf``, on the optimizer's first step only). Returns what is left to watch:
    nothing (the next step asks :func:`unset_momentum` again)."""
    if params and bool(found_inf.item()):
        for p in params:
            optimizer.state.get(p, {}).pop("momentum_buffer", None)
    return []


def _torch_has_cpu_fused() -> bool:
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        return "cpu" in _get_fused_kernels_supported_devices()
    except ImportError:  # torch < 2.4
        return False


def fused_optimizer(cls: Any, *args: Any, **kwargs: Any) -> Any:
    """``cls(*args, **kwargs)`` with ``fused=True`` added where every parameter allows it."""
    import torch

    if args:
        params, rest = args[0], args[1:]
    elif "params" in kwargs:
        params, rest = kwargs.pop("params"), ()
    else:
        return cls(*args, **kwargs)  # the optimizer's own error
    if isinstance(params, (torch.Tensor, set, str, bytes, dict)) or "fused" in kwargs or "foreach" in kwargs:
        return cls(params, *rest, **kwargs)  # as written: the optimizer decides (or raises)
    params = list(params)  # what Optimizer.__init__ does first
    found: List[Any] = []
    for group in params:
        got = _tensors(group)
        if got is None:
            return cls(params, *rest, **kwargs)
        found.extend(got)
    # capturable (given, or in a parameter group) on CPU parameters raises at step() on the
    # for-loop path; the fused one would step: the user's error is kept (a differential review).
    # differentiable (given, or in a group: a group's options override the defaults) excludes
    # fused: the optimizer would raise at construction where the original builds
    chosen = [kwargs] + [g for g in params if isinstance(g, dict)]
    if found and fusable(found) and not any(g.get("capturable") or g.get("differentiable") for g in chosen) \
            and _torch_has_cpu_fused():
        kwargs["fused"] = True
    return cls(params, *rest, **kwargs)
