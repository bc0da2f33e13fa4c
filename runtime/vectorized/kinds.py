"""What kind of value a guard is looking at: tensors, numpy arrays, lists of rows or of Python
numbers, step counts and lengths. Every guard family reads values through these, so none
of them accepts "anything with a shape"."""
from __future__ import annotations

import operator
from typing import Any, Optional, Sequence, Tuple

import numpy as np
import torch

from ..memory import may_share as _shares  # noqa: F401  (the guards' aliasing question)

from ..fused import fused_linear  # noqa: F401  (the one-pass tier of rewritten recurrences)

_FLOATS_T = (torch.float32, torch.float64)
_FLOATS_N = (np.dtype(np.float32), np.dtype(np.float64))
_NUMPY2 = int(np.__version__.split(".")[0]) >= 2
_PY_SCALARS = (int, float, bool)
#: Array types the guards accept, by exact type (never "anything with a shape": ``np.matrix``
#: stays 2-D when indexed, ``np.ma`` arrays compute other values, tensor subclasses may override
#: any op). ``nn.Parameter`` is proved safe: indexing and arithmetic on it give plain tensors.
_TENSORS = (torch.Tensor, torch.nn.Parameter)
#: Per-step Python ints / bools (done flags, masks) promote exactly: ints of at most this size
#: keep every product of up to three of them below 2**53, so float64 arithmetic on them is
#: Python's int arithmetic converted once.
_FLAG_MAX = 1 << 16
_DTYPE, _SHAPE = operator.attrgetter("dtype"), operator.attrgetter("shape")
_NDIM, _SIZE = operator.attrgetter("ndim"), operator.attrgetter("size")


def steps(T: Any) -> int:
    """``T`` as an int (anything ``range`` accepts), or -1 when it is not one."""
    try:
        return operator.index(T)
    except Exception:
        return -1


def no_steps(T: Any) -> bool:
    """Whether ``for t in range(T)`` runs no step (``steps(T) <= 0``): an unswitched loop's test
    before its loop-invariant condition, which the loop as written never evaluates then. Not a
    guard: the run's site counts (runtime/telemetry/sites.py) count ``steps`` as the first call of
    a recurrence's guard, and counted here it made the unswitch's ``if`` a site of its own that
    fell back every time."""
    return steps(T) <= 0


def backward_steps(x: Any) -> int:
    """``n`` when ``x`` is a list, tuple or range holding the ints ``n - 1, n - 2, ..., 0`` (what
    ``for t in x`` walks as ``for t in reversed(range(n))`` does), else -1. Never consumes an
    iterator."""
    try:
        if type(x) is range:
            n = len(x)
            return n if n == 0 or (x.start == n - 1 and x.step == -1) else -1
        if type(x) in (list, tuple):
            n = len(x)
            if n and set(map(type, x)) != {int}:
                return -1
            return n if list(x) == list(range(n - 1, -1, -1)) else -1
    except Exception:
        pass
    return -1


def _tensor(x: Any) -> bool:
    return type(x) in _TENSORS


def _ndarray(x: Any) -> bool:
    return type(x) is np.ndarray


def _array(x: Any) -> bool:
    return type(x) in _TENSORS or type(x) is np.ndarray


def length(*xs: Any) -> int:
    """The common length of the sequences a ``zip(reversed(a), reversed(b))`` loop walks, or -1
    (not sequences, lengths differ, or ``reversed`` would not index them)."""
    try:
        n = -1
        for x in xs:
            if not (type(x) in (list, tuple) or _array(x)):
                return -1
            if getattr(x, "ndim", 1) == 0:
                return -1
            k = len(x)
            if n >= 0 and k != n:
                return -1
            n = k
        return n
    except Exception:
        return -1


def _mode_of(x: Any) -> Optional[str]:
    """The kind of a per-step container, by exact types: "torch", "numpy", "float" (a list of
    Python floats, some ints / bools among them allowed), "tlist" / "nlist" (lists of tensors / numpy arrays), "flags" (a list of
    Python ints / bools), "npgen" (a list of numpy scalars of one type), else None."""
    if _tensor(x):
        return "torch"
    if _ndarray(x):
        return "numpy"
    if type(x) in (list, tuple) and len(x):
        types = set(map(type, x))
        if types == {float} or (float in types and types <= {float, int, bool}):
            return "float"
        if types <= {torch.Tensor}:
            return "tlist"
        if types == {np.ndarray}:
            return "nlist"
        if types <= {int, bool}:
            return "flags"
        if len(types) == 1 and issubclass(next(iter(types)), (np.bool_, np.number)):
            return "npgen"
    return None


def _checked_kind(x: Any) -> str:
    """The kind of a container :func:`recurrence_ok` accepted, from its first element (the guard
    saw to the rest; a list of floats with an int first reads as "flags", which gives the same
    float64 maths): O(1) where :func:`_mode_of` is O(T)."""
    if _tensor(x):
        return "torch"
    if _ndarray(x):
        return "numpy"
    e = type(x[0])
    if e is float:
        return "float"
    if e is int or e is bool:
        return "flags"
    if e is torch.Tensor:
        return "tlist"
    if e is np.ndarray:
        return "nlist"
    return "npgen"


_ARRAY_KINDS = ("torch", "numpy", "tlist", "nlist")


def _main_mode(kinds: Sequence[Optional[str]]) -> Optional[str]:
    """The kind the vectorized maths runs in: the one array kind among the containers (two: None);
    else lists of Python floats ("float", ints / bools among or next to them); else numpy scalars."""
    arrays = {k for k in kinds if k in _ARRAY_KINDS}
    if len(arrays) > 1 or None in kinds:
        return None
    if arrays:
        return arrays.pop()
    return "numpy" if "npgen" in kinds and "float" not in kinds and "flags" not in kinds else \
        ("float" if "npgen" not in kinds else None)


def _weak(kind: str, mode: str) -> bool:
    """Per-step values that are Python numbers to the loop (numpy ints / bools to torch) next to
    arrays: they become float64 arrays, exact only with float64 maths (see recurrence_ok)."""
    return (kind == "flags" or (kind == "float" and mode in _ARRAY_KINDS)
            or (kind == "npgen" and mode in ("torch", "tlist")))


def _small(x: Sequence[Any]) -> bool:
    """Every element of a list of ints / bools / numpy int scalars has ``|e| <= _FLAG_MAX``."""
    return max(map(abs, x)) <= _FLAG_MAX


def _same_rows(x: Sequence[np.ndarray], first: np.ndarray) -> bool:
    """Every array in ``x`` has the dtype and shape of ``first`` (C-level passes over the list:
    a Python loop costs about as much as the loop being replaced)."""
    n = len(x)
    if list(map(_DTYPE, x)).count(first.dtype) != n:
        return False
    if first.ndim == 1:  # 1-D of the same size: the same shape, without building T shape tuples
        return list(map(_NDIM, x)).count(1) == n and list(map(_SIZE, x)).count(first.size) == n
    return list(map(_SHAPE, x)).count(first.shape) == n


def _broadcasts_into(shape: Tuple[int, ...], row: Tuple[int, ...]) -> bool:
    if len(shape) > len(row):
        return False
    try:
        return tuple(np.broadcast_shapes(tuple(shape), tuple(row))) == tuple(row)
    except ValueError:
        return False
