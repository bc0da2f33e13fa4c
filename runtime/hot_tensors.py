"""Tensors built from lists of numpy arrays in one copy instead of element by element.

``torch.tensor([a1, a2, ...])`` on a list of ``np.ndarray`` walks the list in Python-level
sequence code, element by element (torch itself warns "Creating a tensor from a list of
numpy.ndarrays is extremely slow"); replay-buffer sampling (``s_lst.append(s)`` then
``torch.tensor(s_lst, dtype=torch.float)``) does it every update. ``hot.tensor_from_arrays``
rewrites such calls to :func:`tensor_from_arrays`, which builds the same tensor from
``np.array(data)`` (what ``np.stack`` gives for such lists, with less fixed cost) when, and
only when, ``data`` is a non-empty list or tuple of at least ``MIN_ELEMENTS`` numbers in all
whose elements are all plain ``np.ndarray`` of one shape and one native-byte-order
bool/int/uint/float32/float64 dtype (float16 sources are left to the list path: it converts NaNs
through float64, which changes their payload bits; so are uint64 items, on which it raises, and
int64 items made float32, which it rounds through float64: twice). Then the dtype torch infers is the arrays'
dtype on both paths (float64 arrays give float64, whatever the default dtype), an explicit
``dtype=`` casts the same values the same way (IEEE round to nearest), and ``torch.FloatTensor``
/ ``torch.DoubleTensor`` become a float32 / float64 CPU tensor as they do on lists. A list of at
least ``MIN_ELEMENTS`` numpy scalars all of one type (``adv.append(delta + gamma * lam * gae)``
on numpy numbers; the same dtypes: bool/int/uint/float32/float64, not float16 or uint64) is one
copy too: ``np.array`` of them has their dtype, the one torch infers from them (2,000 float32
scalars: 404 -> 76 us; with ``dtype=`` torch's list path is faster, so from 256 of them only:
148 -> 85 us). Anything else (small lists, ragged lists, mixed dtypes or scalar types,
Python numbers, nested lists, ndarray subclasses, extra arguments to a legacy constructor) calls
the original constructor with the original arguments, so it behaves (and raises) exactly as
before.
The only observable difference: torch's "extremely slow" UserWarning is not emitted on the fast
path. The fallback calls the constructor from the caller's line (:mod:`.at_caller`), so whatever
it warns is reported at the user's line, as before the rewrite.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional

import numpy as np
import torch

from scalebox_cst.runtime.at_caller import call_at_caller

_KINDS = frozenset("biuf")
_SEQUENCES = (list, tuple)
#: below this many elements in all, the list path is as fast or faster (``torch.tensor([obs])`` of
#: one 4-float observation: ~5 us either way, the array path's fixed cost dominates); measured
#: crossover 16-32 elements on CPU (benchmarks/bench_hot_patterns.py prints both sides)
MIN_ELEMENTS = 32
#: numpy scalars with a ``dtype=`` given (or to a legacy constructor): torch's list path is fast
#: there, 2,000 float32 scalars 148 -> 85 us, 128 of them 11.5 -> 10.7 us, 64 of them 7.1 -> 7.2 us
MIN_SCALARS_CAST = 256
#: keywords of ``torch.tensor`` the fast path passes on unchanged
_KEYWORDS = frozenset({"dtype", "device", "requires_grad", "pin_memory"})
_TORCH_DTYPE = {}  # numpy dtype -> the torch dtype torch.tensor infers from such arrays
#: numpy scalar types a list of which is one copy (the arrays' dtypes: no float16, no uint64)
_SCALARS = frozenset({np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                      np.float32, np.float64})
#: legacy constructors taking one list: the dtype they produce (always on the CPU)
_LEGACY = {torch.FloatTensor: torch.float32, torch.DoubleTensor: torch.float64}
#: set by the run's telemetry (runtime/telemetry/sites.py): ``report(caller_frame, why)`` per call,
#: ``why`` None where the one-copy path was taken, else why the call went to the constructor
report: Optional[Callable[[Any, Optional[str]], None]] = None


def _stackable(data: Any) -> bool:
    """``data`` is a non-empty list/tuple of plain ndarrays of one shape and one plain dtype."""
    if type(data) is not list and type(data) is not tuple or not data:
        return False
    first = data[0]
    if type(first) is not np.ndarray:
        return False
    dtype, shape = first.dtype, first.shape
    if not shape:  # 0-d items: torch 2.13's list path raises TypeError (len() of unsized object)
        return False
    if dtype.kind not in _KINDS or not dtype.isnative or dtype.kind == "f" and dtype.itemsize < 4:
        return False
    if dtype.kind == "u" and dtype.itemsize == 8:  # the list path raises on uint64 items
        return False
    for a in data:
        if type(a) is not np.ndarray or a.shape != shape or a.dtype != dtype:
            return False
    return True


def _same_cast(dtype: np.dtype, kwargs: Any) -> bool:
    """Whether ``torch.tensor(np.array(data), **kwargs)`` casts as the list path does: no
    ``dtype=``, float32/float64 (both paths round each value to nearest once), or the arrays' own
    dtype. Integer/bool targets from other dtypes are not taken (the list path raises on float
    sources, TypeError, or on out-of-range values where a cast of the stack would wrap), nor
    float16/bfloat16 (the list path rounds float32 sources to bfloat16 differently)."""
    if not _KEYWORDS.issuperset(kwargs):
        return False
    target = kwargs.get("dtype")
    if target is None:
        return True
    if not isinstance(target, torch.dtype):
        return False
    if target is torch.float32 or target is torch.float64:
        return True
    own = _TORCH_DTYPE.get(dtype)
    if own is None:
        own = _TORCH_DTYPE[dtype] = torch.from_numpy(np.empty(0, dtype)).dtype
    return target == own


def _scalars_needed(make: Any, kwargs: Any) -> int:
    """How many numpy scalars make the one-copy path pay: with a ``dtype=`` (or a legacy
    constructor) torch's list path converts them fast, and the crossover is 128-256, else 16-32
    (benchmarks/bench_hot_patterns.py)."""
    return MIN_SCALARS_CAST if make is not torch.tensor or kwargs.get("dtype") is not None else MIN_ELEMENTS


def _one_type_scalars(data: Any, needed: int) -> bool:
    """``data``, whose first item is one of :data:`_SCALARS` (the callers test it first), holds at
    least ``needed`` items, all of that type."""
    return len(data) >= needed and len(set(map(type, data))) == 1


def tensor_from_arrays(make: Any, data: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``make(data, *args, **kwargs)``, from one ``np.array`` copy where that gives the same tensor."""
    # the first tests inline: a list of Python numbers/lists (the fallback) pays only these
    if type(data) in _SEQUENCES and data and not args and (
            type(data[0]) is np.ndarray and len(data) * data[0].size >= MIN_ELEMENTS and _stackable(data)
            or type(data[0]) in _SCALARS and _one_type_scalars(data, _scalars_needed(make, kwargs))):
        # int64 items to float32: the list path rounds through float64 (twice), a cast of the
        # stack rounds once (they differ above 2**53 + ...): left to the list path
        wide = data[0].dtype.kind == "i" and data[0].dtype.itemsize == 8
        if make is torch.tensor and _same_cast(data[0].dtype, kwargs) and not (wide and kwargs.get("dtype") is torch.float32):
            if report is not None:
                report(sys._getframe(1), None)
            return torch.tensor(np.array(data), **kwargs)
        dtype = _LEGACY.get(make)
        if dtype is not None and not kwargs and not (wide and dtype is torch.float32):
            if report is not None:
                report(sys._getframe(1), None)
            return torch.tensor(np.array(data), dtype=dtype, device="cpu")
    if report is not None:
        report(sys._getframe(1), _why(data, args, _scalars_needed(make, kwargs)))
    return call_at_caller(make, (data, *args), kwargs)


def _why(data: Any, args: tuple, scalars: int) -> str:
    """Why a call went to the constructor as written (a fixed phrase: runtime/guard_reasons.py)."""
    if type(data) not in _SEQUENCES or not data:
        return "not a non-empty list or tuple"
    if type(data[0]) in _SCALARS:
        if args:
            return "more arguments than the data"
        if len(data) < scalars:
            return f"fewer than {scalars} numpy scalars{' with a dtype given' if scalars > MIN_ELEMENTS else ''} (the list path is as fast)"
        if not _one_type_scalars(data, scalars):
            return "numpy scalars of several types, or mixed with other items"
        return "a dtype or keyword the one-copy path would cast otherwise"
    if type(data[0]) is not np.ndarray:
        return "the items are not numpy arrays or numpy scalars (numbers, tensors or lists)"
    if args:
        return "more arguments than the data"
    if len(data) * data[0].size < MIN_ELEMENTS:
        return f"fewer than {MIN_ELEMENTS} numbers in all (the list path is as fast)"
    if not _stackable(data):
        return "arrays of several shapes or dtypes (or 0-d, float16, uint64 items)"
    return "a dtype or keyword the one-copy path would cast otherwise"
