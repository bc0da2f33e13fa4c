"""Glue between the user's containers and the arrays the vectorized maths runs on: per-step
sequences as arrays, truth values, rows and columns, results handed back in the types the
loop would have produced."""
from __future__ import annotations

import operator
from typing import Any, Optional, Sequence, Tuple

import numpy as np
import torch

from ..fused import fused_linear  # noqa: F401  (the one-pass tier of rewritten recurrences)
from .kinds import _array, _checked_kind, _ndarray, _shares, _tensor


def seq_of(x: Any) -> Any:
    """A per-step container as one array: tensors and numpy arrays as they are, a list of floats
    (or of ints / bools, which the guard admits next to float64 maths only) as a float64 array
    (Python float arithmetic is float64), a list of numpy scalars as an array of their dtype, a
    list of tensors or of numpy rows stacked (their dtype kept)."""
    if _array(x):
        return x
    if len(x) and type(x[0]) is torch.Tensor:
        return torch.stack(list(x))
    if len(x) and type(x[0]) is np.ndarray:  # rows of one dtype and shape (the guard saw to it)
        return np.concatenate(x).reshape((len(x),) + x[0].shape)  # 3x faster than np.stack
    if len(x) and isinstance(x[0], np.generic):  # numpy scalars of one type (the guard saw to it)
        return np.array(x)
    return np.array(x, dtype=np.float64)


def seqs_of(*xs: Any) -> Tuple[Any, ...]:
    """:func:`seq_of` of each, with singleton dims inserted after the time axis of those whose rows
    have a lower rank than the others': per step, broadcasting aligns rows from the right; with
    time first, the rows must have one rank for the arrays to align the same way. Lists of
    Python or numpy ints / bools next to tensors become tensors of the tensors' dtype and device
    (the guard admits them with float64 tensors only, where they convert exactly)."""
    vs = [seq_of(x) for x in xs]
    ref = next((v for v in vs if isinstance(v, torch.Tensor)), None)
    if ref is not None:
        vs = [v if isinstance(v, torch.Tensor) else torch.from_numpy(np.asarray(v, dtype=np.float64)).to(
            device=ref.device, dtype=ref.dtype) for v in vs]
    rank = max(v.ndim for v in vs)
    return tuple(v if v.ndim == rank else v.reshape(tuple(v.shape[:1]) + (1,) * (rank - v.ndim) + tuple(v.shape[1:]))
                 for v in vs)


_COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
            ">": operator.gt, ">=": operator.ge}
_NEP50 = int(np.__version__.split(".")[0]) >= 2  # a Python number meets a numpy scalar as it meets an array


def truth_of(x: Any, op: Optional[str] = None, number: Any = None) -> Any:
    """Per-element truth values (``bool(x[t])``, or ``bool(x[t] <op> number)``) as a bool array.
    A tensor or, under NumPy 2, a numpy array is compared whole: the per-step comparison meets
    the same Python number with the same promotion; otherwise each element as the loop does."""
    if op is None:
        if isinstance(x, (torch.Tensor, np.ndarray)):
            return x != 0
        return np.fromiter((bool(e) for e in x), dtype=bool, count=len(x))
    compare = _COMPARE[op]
    if isinstance(x, torch.Tensor) or (_NEP50 and isinstance(x, np.ndarray)):
        return compare(x, number)
    return np.fromiter((bool(compare(e, number)) for e in x), dtype=bool, count=len(x))


def arrays_only(x: Any) -> Any:
    """``x`` if it is a tensor or numpy array, else None (which the guard declines): the values a
    reset condition reads through ``.item()``, which Python numbers do not have."""
    return x if isinstance(x, (torch.Tensor, np.ndarray)) else None


def as_row(s: Any, b: Any) -> Any:
    """The carried value with the leading size-1 dims that broadcasting added dropped, so that
    it has (at most) the rank of one step of ``b``."""
    if _array(s) and _array(b):
        rank = b.ndim - 1
        while s.ndim > rank and s.shape[0] == 1:
            s = s[0]
    return s


def restore(last: Any, s: Any) -> Any:
    """The carried value after the vectorized steps, in the form the loop would hold it: the
    shape of ``s`` (the carried value before them), a Python float if ``s`` is one."""
    if type(s) is float:
        return float(last)
    if isinstance(s, torch.Tensor) and isinstance(last, torch.Tensor) and last.shape != s.shape:
        return last.reshape(s.shape)
    if isinstance(s, np.ndarray) and isinstance(last, (np.ndarray, np.generic)) and np.shape(last) != s.shape:
        return np.reshape(last, s.shape)
    return last


def items_of(seq: Any, src: Any, like: Any = None, srcs: Sequence[Any] = ()) -> list:
    """Per-step values of a vectorized result as list items, in index order: Python floats when
    the loop read lists of floats (``src``, or every container of ``srcs`` when given, is a list
    of Python numbers), numpy scalars / rows, row tensors otherwise (shaped like ``like``).
    Rows are copied: like the loop's items, each is a tensor or array of its own, not one of
    several views of one result, which would share its storage (``torch.save`` of one item wrote
    them all: found by a differential review on torchrl) and, with autograd history, one version
    counter (autograd forbids modifying such views in place); a cloned row keeps its own history
    (its gradient flows back through the clone, an identity, and the op)."""
    if isinstance(seq, np.ndarray):
        if all(type(x) in (list, tuple) and _checked_kind(x) in ("float", "flags") for x in (srcs or (src,))):
            return seq.tolist()
        rows = list(seq)
    else:
        rows = list(seq.unbind(0))
    if like is not None and hasattr(like, "shape") and rows and tuple(np.shape(rows[0])) != tuple(like.shape):
        rows = [r.reshape(like.shape) for r in rows]
    if isinstance(seq, torch.Tensor):
        rows = [r.clone() for r in rows]
    elif seq.ndim > 1:
        rows = [r.copy() for r in rows]
    return rows



def to_rank(v: Any, out: Any) -> Any:
    """``v`` (time first, ``[n, *row]``) shaped for ``out[lo:hi] = v`` to store each step's row as
    the loop's ``out[t] = row`` does: broadcasting aligns shapes from the right, so a row of lower
    rank than ``out``'s rows needs its singleton dims between the time axis and the row (not in
    front of the time axis, where the assignment would put them), and size-1 dims a row has in
    excess (which ``out[t] = row`` drops) go."""
    if not isinstance(v, (torch.Tensor, np.ndarray)) or v.ndim < 1:
        return v
    k = out.ndim - v.ndim
    if k > 0:
        return v.reshape(tuple(v.shape[:1]) + (1,) * k + tuple(v.shape[1:]))
    if k < 0 and all(d == 1 for d in v.shape[1:1 - k]):
        return v.reshape(tuple(v.shape[:1]) + tuple(v.shape[1 - k:]))
    return v


def wrapped(items: list) -> list:
    """Each item in a one-element list of its own (the loop appends ``[x]``)."""
    return [[x] for x in items]


def dim1(x: Any) -> Any:
    """The time-major view of an array walked along dimension 1 (``x[:, t]`` is ``dim1(x)[t]``,
    writes through it land in ``x``), or None for anything else (the guard declines)."""
    if _tensor(x) and x.ndim >= 2:
        return x.movedim(1, 0)
    if _ndarray(x) and x.ndim >= 2:
        return np.moveaxis(x, 1, 0)
    return None


def dim_view(x: Any, dim: int, ndim: int, ints: Tuple[int, ...] = ()) -> Any:
    """The time-major view of an array walked along dimension ``dim`` (negative: from the end):
    ``x[..., t, :]`` is ``dim_view(x, -2, 2)[t]``, ``x[:, :, t]`` is ``dim_view(x, 2, 3)[t]``, and
    with integer indices right after the time index ``x[:, t, 0]`` is ``dim_view(x, 1, 3, (0,))[t]``
    (``movedim`` keeps the other dimensions in order, so the dimensions after time keep their
    places; basic indexing keeps a view: writes through it land in ``x``). None (the guard
    declines) for anything but a tensor or ndarray of at least ``ndim`` dimensions, the number the
    loop's subscript needs, or an index out of range (the loop raises as written)."""
    try:
        if not ((_tensor(x) or _ndarray(x)) and type(dim) is int and x.ndim >= max(ndim, 2)
                and -x.ndim <= dim < x.ndim and all(type(i) is int for i in ints)):
            return None
        v = x.movedim(dim, 0) if _tensor(x) else np.moveaxis(x, dim, 0)
        if ints:
            at = dim if dim >= 0 else x.ndim + dim  # the dims after time are at at + 1, ... in v too
            v = v[(slice(None),) * (at + 1) + tuple(ints)]
        return v
    except Exception:
        return None


def written_apart(written: Sequence[Any], others: Sequence[Any]) -> bool:
    """No container the loop writes (lists appended to, arrays written at ``[t]``) is, or shares
    memory with, a container whose loop-invariant elements the guard reads once (``others``:
    ``coef`` of ``coef[0]``): under a second name the loop's writes would change what those reads
    give from one step to the next (``returns.insert(0, r + gamma * R * other[0])`` with ``other is
    returns``), which the rewrite, reading them once, would not see."""
    try:
        for w in written:
            for o in others:
                if w is o:
                    return False
                if _tensor(w) and _tensor(o) and _shares(w, o):
                    return False
                if _ndarray(w) and _ndarray(o) and np.may_share_memory(w, o):
                    return False
        return True
    except Exception:
        return False


def column(x: Any, idx: Tuple[int, ...]) -> Any:
    """``x[:, *idx]``: the per-step values ``x_t[idx]`` of a loop over the rows ``x_t`` of an
    array (``x[t][idx]`` is ``x[:, idx][t]`` for tensors and numpy arrays with integer indices),
    or None for anything else (the guard declines None; an index out of range is left to the
    loop, which raises as written)."""
    try:
        if _array(x) and x.ndim > len(idx) and all(type(i) is int for i in idx):
            return x[(slice(None),) + tuple(idx)]
    except Exception:
        pass
    return None
