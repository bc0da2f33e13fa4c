"""Optimizer steps, the losses ``backward()`` is called on and the norms the code's own
``clip_grad_norm_`` returns, all observed without a device sync.

``torch.optim``'s global step post-hook counts optimizer steps (the sampler turns the count into
``optimizer_steps_per_s``). ``Tensor.backward`` is patched at class level to record the scalar it
is called on as ``losses/backward``, detached and still a tensor: it reaches the host with the
other pending points at the next flush, where a non-finite loss is reported (stderr, a
``nonfinite`` event). Non-scalar ``backward(gradient)`` calls are not recorded.

``torch.nn.utils.clip_grad_norm_`` (and its module's name for it, and the deprecated
``clip_grad_norm``) is wrapped to record what it returns, the total norm *before* clipping, as
``grad_norm_preclip`` (the maximum over each window of :data:`CLIP_EVERY` calls, as the guard
records its norm; on a device one ``torch.stack(...).max()`` per window, no sync). A guard after that clip
measures the clipped gradients (``grad_norm_clipped``): this is the norm the code saw. The first
calling line gets ``grad_norm_preclip``, each other line ``grad_norm_preclip/<file>:<line>``
(an actor's and a critic's clip are two series). Calls from torch itself and from the runtime
(the engine's own fixed clip records ``grad_norm``) are not recorded here. All names are in the
engine's namespace (``metrics.engine``).
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Any, Dict, List, Tuple

from scalebox_cst.runtime import metrics

LOSS = "losses/backward"
PRECLIP = "grad_norm_preclip"
#: clip calls per recorded point (their maximum: a NaN/inf in the window shows)
CLIP_EVERY = 8
_MARK = "_scalebox_observed"
_RUNTIME_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_skip_dirs: Tuple[str, ...] = (_RUNTIME_DIR,)
#: (file, line) of a clip call -> [series name, calls so far, norms of the open window]
_clips: Dict[Tuple[str, int], List[Any]] = {}

#: optimizer steps taken so far (all optimizers)
optimizer_steps = 0


def _count_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    global optimizer_steps
    optimizer_steps += 1


def _wrap_backward(fn):
    @functools.wraps(fn)
    def backward(self, *args, **kwargs):
        result = fn(self, *args, **kwargs)
        try:
            if self.numel() == 1:  # shape metadata only: no sync
                metrics.record(metrics.engine(LOSS), self.detach())
        except Exception:
            pass
        return result

    setattr(backward, _MARK, True)
    return backward


def _clip_window(key: Tuple[str, int]) -> List[Any]:
    entry = _clips.get(key)
    if entry is None:
        name = metrics.engine(PRECLIP)
        if _clips:
            name += f"/{os.path.basename(key[0])}:{key[1]}"
        entry = _clips[key] = [name, 0, []]
    return entry


def _record_window(entry: List[Any]) -> None:
    norms, entry[2] = entry[2], []
    if not norms:
        return
    first = norms[0]
    if hasattr(first, "device") and first.device.type != "cpu":
        import torch

        try:  # one stack and one max on the device for the window: no sync
            value = torch.stack(norms).max()
        except (RuntimeError, TypeError):  # mixed dtypes or devices
            value = torch.stack([n.detach().reshape(()).float().to(first.device) for n in norms]).max()
    else:  # CPU tensors (reading one is no sync) or numbers
        floats = [float(n) for n in norms]
        value = next((f for f in floats if f != f), max(floats))  # a NaN wins, as torch's max
    metrics.record(entry[0], value, step=entry[1])


def _wrap_clip(fn):
    @functools.wraps(fn)
    def clip_grad_norm_(*args, **kwargs):
        norm = fn(*args, **kwargs)
        try:
            caller = sys._getframe(1)
            filename = caller.f_code.co_filename
            if not filename.startswith(_skip_dirs):
                entry = _clips.get((filename, caller.f_lineno)) or _clip_window((filename, caller.f_lineno))
                entry[1] += 1
                entry[2].append(norm)
                if len(entry[2]) >= CLIP_EVERY:
                    _record_window(entry)
        except Exception:  # never the user's problem
            pass
        return norm

    setattr(clip_grad_norm_, _MARK, True)
    return clip_grad_norm_


def flush_clips() -> None:
    """Record each clip site's partial window (at exit)."""
    for entry in list(_clips.values()):
        _record_window(entry)


def _patch_clip(torch: Any) -> None:
    global _skip_dirs
    _skip_dirs = (_RUNTIME_DIR, os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)
    utils = sys.modules.get("torch.nn.utils")
    module = sys.modules.get("torch.nn.utils.clip_grad")
    wrapped: Dict[int, Any] = {}  # one wrapper per function (utils re-exports clip_grad's)
    for owner in (module, utils):
        for name in ("clip_grad_norm_", "clip_grad_norm"):
            fn = getattr(owner, name, None) if owner is not None else None
            if callable(fn) and not getattr(fn, _MARK, False):
                if id(fn) not in wrapped:
                    wrapped[id(fn)] = _wrap_clip(fn)
                setattr(owner, name, wrapped[id(fn)])


def attach(torch: Any) -> None:
    try:  # by import: torch 2.13's torch.optim no longer has the ``optimizer`` attribute
        from torch.optim.optimizer import register_optimizer_step_post_hook as register
    except ImportError:
        register = None
    if register is not None:
        register(_count_step)
    fn = torch.Tensor.__dict__.get("backward")
    if fn is not None and not getattr(fn, _MARK, False):
        torch.Tensor.backward = _wrap_backward(fn)
    _patch_clip(torch)


def _forked() -> None:
    """A forked child names its clip series anew, under its worker's names (metrics.engine)."""
    _clips.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
