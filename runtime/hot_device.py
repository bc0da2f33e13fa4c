"""A fresh tensor made where it goes: ``make(data).to(device)`` without the legacy constructor.

``torch.FloatTensor(state).to(device)`` (sfujim/TD3 every step and five times per replay
sample) and ``torch.Tensor(next_obs).to(device)`` (CleanRL every step) build a tensor and then
move it. ``hot.fresh_on_device`` rewrites them to :func:`tensor_on`. Inside, the legacy
constructor of an array does what ``torch.tensor`` does: ``tensor_from_numpy`` (the array's own
memory), then ``.to(device, dtype)``; what costs is its argument parsing (~4 us a call). Where it is
provably the same tensor, :func:`tensor_on` makes those two steps itself, and otherwise calls the
original ``make(data, **kw).to(device)``. Per call on CPU (CPU time, one thread; figures in the
transform's docstring): a float32 observation 4.5 -> 1.2-1.4 us, a float64 one 5.6 -> 2.2 us.

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
  it takes the original call. Negative strides raise the same ValueError on both. A cast keeps
  the array's strides on both paths (``.to`` preserves the layout).
* an array already of the tensor's dtype, made for the CPU: the legacy constructor shares the
  array's memory (``torch.FloatTensor(a_f32)``: a later ``a[0] = 7`` shows in the tensor, and
  writes to the tensor show in ``a``; found by trying the engine on sample-factory and DI-engine),
  and so does ``torch.from_numpy``, with the same strides and offset: that is the call, then
  ``.to(device)`` as written (an indexed ``"cpu:0"`` copies on both). ``torch.Tensor`` copies instead
  where the default tensor type is a GPU one (``set_default_tensor_type``): there, the original.
* a read-only array takes the call as written: the legacy constructor warns of it (once a
  program), cast or not, and that warning is the user's (``torch.tensor`` never warns: the
  rewrite before this one dropped it). Under an active ``__torch_function__`` mode, which might
  see one call and not the other, likewise.
"""
from __future__ import annotations

from typing import Any, Dict

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
    if (type(device) is torch.device or type(device) is str) and type(data) is np.ndarray \
            and data.flags.writeable and not torch._C._is_torch_function_mode_enabled():
        # what the legacy constructors do inside (tensor_from_numpy, then .to), without their
        # argument parsing; a read-only array warns there, so it takes the call as written
        if not kwargs and data.dtype in _EXACT and (data.ndim or data.dtype.kind in "fb"):
            dtype = _LEGACY.get(make)
            if dtype is None and make is torch.Tensor:
                dtype = torch.get_default_dtype()
            if dtype is not None:
                twin = _NUMPY.get(dtype)  # (numpy reads ``dtype == None`` as float64: never compared to None)
                if twin is None or data.dtype != twin or not _on_cpu(device):
                    return torch.from_numpy(data).to(device=device, dtype=dtype)  # a copy on both
                if make is not torch.Tensor or torch._C._get_default_device() == "cpu":
                    return torch.from_numpy(data).to(device)  # shared on both; "cpu:0" copies on both
    return call_at_caller(make, (data,), kwargs).to(device)  # its warnings at the user's line


#: device -> whether it is the CPU, for the devices seen (a handful per program)
_CPU_DEVICES: Dict[Any, bool] = {}


def _on_cpu(device: Any) -> bool:
    """Whether ``device`` (a ``torch.device`` or a ``str``) is the CPU; True where it does not
    parse (the original call then raises what it raises)."""
    known = _CPU_DEVICES.get(device)
    if known is not None:
        return known
    try:
        known = (device if type(device) is torch.device else torch.device(device)).type == "cpu"
    except (RuntimeError, ValueError, TypeError):
        return True
    if len(_CPU_DEVICES) >= 64:  # a program making device strings per call: stay bounded
        _CPU_DEVICES.clear()
    _CPU_DEVICES[device] = known
    return known
