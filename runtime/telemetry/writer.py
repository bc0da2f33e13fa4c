"""Scalars the script logs through ``SummaryWriter.add_scalar`` / ``add_scalars``, kept as metrics.

The writer classes of ``torch.utils.tensorboard`` and ``tensorboardX`` are patched at class level
once the script imports them (neither package is needed otherwise). The user's call runs first
and unchanged; then its value is recorded under the user's tag (``add_scalars``: ``main/key``; never
in the engine's ``scalebox/`` namespace, see ``metrics.user``) at
the user's ``global_step`` (a per-tag counter when none is given). Tensor values are recorded as
tensors, so nothing is read back from a device here.
"""
from __future__ import annotations

import functools
import numbers
from typing import Any, Optional

from scalebox_cst.runtime import metrics

_MARK = "_scalebox_observed"
#: module -> writer class name in it
MODULES = {"torch.utils.tensorboard.writer": "SummaryWriter", "tensorboardX.writer": "SummaryWriter"}


def _value(v: Any) -> Optional[Any]:
    """A number or a one-element tensor / array, else None (strings, blobs: not recorded)."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, numbers.Real):
        return v
    if hasattr(v, "detach") and hasattr(v, "numel"):
        return v.detach() if v.numel() == 1 else None
    if hasattr(v, "dtype") and getattr(v, "size", 0) == 1 and getattr(v.dtype, "kind", "") in "biuf":
        return v.item() if hasattr(v, "item") else None
    return None


def _step(s: Any) -> Optional[int]:
    if s is None:
        return None
    try:
        return int(s)
    except (TypeError, ValueError, OverflowError):  # global_step=inf: counted, as no step is
        return None


def _arg(args, kwargs, index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


def _wrap_add_scalar(fn):
    @functools.wraps(fn)
    def add_scalar(self, *args, **kwargs):
        result = fn(self, *args, **kwargs)
        try:
            tag, value = _arg(args, kwargs, 0, "tag"), _value(_arg(args, kwargs, 1, "scalar_value"))
            if isinstance(tag, str) and value is not None:
                metrics.record(metrics.user(tag), value, step=_step(_arg(args, kwargs, 2, "global_step")))
        except Exception:  # never the user's problem
            pass
        return result

    setattr(add_scalar, _MARK, True)
    return add_scalar


def _wrap_add_scalars(fn):
    @functools.wraps(fn)
    def add_scalars(self, *args, **kwargs):
        result = fn(self, *args, **kwargs)
        try:
            main, values = _arg(args, kwargs, 0, "main_tag"), _arg(args, kwargs, 1, "tag_scalar_dict")
            step = _step(_arg(args, kwargs, 2, "global_step"))
            if isinstance(main, str) and isinstance(values, dict):
                for key, raw in values.items():
                    value = _value(raw)
                    if value is not None:
                        metrics.record(metrics.user(f"{main}/{key}"), value, step=step)
        except Exception:
            pass
        return result

    setattr(add_scalars, _MARK, True)
    return add_scalars


def patch_writer(cls: type) -> None:
    for name, wrap in (("add_scalar", _wrap_add_scalar), ("add_scalars", _wrap_add_scalars)):
        fn = cls.__dict__.get(name)
        if callable(fn) and not getattr(fn, _MARK, False):
            setattr(cls, name, wrap(fn))


def attach(module: Any) -> None:
    cls = getattr(module, MODULES.get(module.__name__, "SummaryWriter"), None)
    if isinstance(cls, type):
        patch_writer(cls)
