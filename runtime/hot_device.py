"""A fresh tensor made where it goes: ``make(data).to(device)`` in one constructor call.

``torch.FloatTensor(state).to(device)`` (sfujim/TD3 every step and five times per replay
sample) and ``torch.Tensor(next_obs).to(device)`` (CleanRL every step) build a tensor and then
move it. ``hot.fresh_on_device`` rewrites them to :func:`tensor_on`, which calls
``torch.tensor(data, dtype=..., device=device)`` when that gives the same tensor, and otherwise
the original ``make(data, **kw).to(device)``. Measured on CPU (CPU time, one thread, per call):
1.36-1.83x (figures in the transform's docstring); the legacy constructor's argument parsing is
the slow part (``.to`` to the device a tensor is on returns it).

When it is the same tensor (``device`` a ``torch.device`` or a ``str``; not a dtype, a tensor
or anything ``.to`` reads otherwise):

* ``torch.FloatTensor`` / ``torch.DoubleTensor`` / ``torch.Tensor`` of a plain ``np.ndarray``
  (not a subclass) of bool, float32/float64 or an integer dtype of at most 4 bytes, with no other
  argument: the legacy constructor reads the array through numpy's buffer (not element by element)
  and casts it to float32 / float64 / the default dtype (``torch.Tensor``, read at call time) as
  ``torch.tensor(data, dtype=...)`` does: bool and integers of at most 4 bytes convert exactly to
  float64 and are rounded once to float32 on both paths; 8-byte integers are left to the original
  (a double rounding through float64 could differ), as are float16 arrays and anything else
  (lists: ``hot.tensor_from_arrays``'s; ints: sizes). 0-d float and bool arrays give a 0-d
  tensor on both paths; a 0-d integer array is a size to the legacy constructor
  (``torch.FloatTensor(np.array(3))`` has 3 uninitialised elements, ``np.array(-1)`` raises), so
  it takes the original call. Negative strides raise the same ValueError on both.
* except an array already of the tensor's dtype made for the CPU: the legacy constructor then
  shares the array's memory (``torch.FloatTensor(a_f32)``: a later ``a[0] = 7`` shows in the
  tensor, and writes to the tensor show in ``a``), and ``.to`` the CPU returns that tensor, where
  ``torch.tensor`` copies. That is the original call (found by trying the engine on sample-factory
  and DI-engine; on an accelerator both paths copy).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from scalebox_cst.runtime.at_caller import call_at_caller

#: array dtypes a legacy float constructor and torch.tensor(..., dtype=) convert alike
_EXACT = frozenset(np.dtype(t) for t in (np.bool_, np.float32, np.float64, np.int8, np.int16, np.int32,
                                         np.uint8, np.uint16, np.uint32))
_LEGACY = {torch.FloatTensor: torch.float32, torch.DoubleTensor: torch.float64}
#: the array dtype a legacy constructor of each tensor dtype reads without a copy (on the CPU)
_NUMPY = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}


def tensor_on(make: Any, data: Any, device: Any, **kwargs: Any) -> torch.Tensor:
    """``make(data, **kwargs).to(device)``, made on ``device`` directly where that is the same tensor."""
    if type(device) is torch.device or type(device) is str:
        if not kwargs and type(data) is np.ndarray and data.dtype in _EXACT and (data.ndim or data.dtype.kind in "fb"):
            dtype = _LEGACY.get(make)
            if dtype is None and make is torch.Tensor:
                dtype = torch.get_default_dtype()
            if dtype is not None and not (data.dtype == _NUMPY.get(dtype) and _on_cpu(device)):
                return torch.tensor(data, dtype=dtype, device=device)
    return call_at_caller(make, (data,), kwargs).to(device)  # its warnings at the user's line


def _on_cpu(device: Any) -> bool:
    """Whether ``device`` (a ``torch.device`` or a ``str``) is the CPU; True where it does not
    parse (the original call then raises what it raises)."""
    try:
        return (device if type(device) is torch.device else torch.device(device)).type == "cpu"
    except (RuntimeError, ValueError, TypeError):
        return True
