"""Run-time guards for vectorized loops: turn loop operands into batched tensors, or decline.

``vectorize.reduction`` and ``vectorize.elementwise`` replace a loop over elements with one
expression over ``[n, ...]`` tensors. What the transform could not prove statically is checked
here: the loop operands are tensors (or lists/tuples of equally shaped tensors), exactly
``torch.Tensor`` or ``nn.Parameter`` (subclasses may override any op), all of one
floating dtype and one device, the loop has at least one element, loop-invariant operands are
plain numbers or tensors of that dtype and device, accumulators are numbers or tensors, and no
tensor the loop writes shares memory with what it reads (the items of a list operand
included: its batch is a stacked copy, the loop reads the items themselves). Any doubt
returns ``None`` and the caller runs its original loop.

Batched operands are aligned for broadcasting: an element of shape ``S`` becomes a view of shape
``[n, 1, ..., 1, *S]`` with as many ones as needed to give every operand the same number of
element dimensions, so the batched expression broadcasts exactly as each element did.
"""
from __future__ import annotations

import operator
from typing import Any, List, Optional, Sequence, Tuple

import torch

from .guard_reasons import none
from .memory import spans_overlap, storage_span

__all__ = ["batch_zip", "batch_range", "flat_params"]

_Tensor = torch.Tensor
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_HALF = (torch.float16, torch.bfloat16)
_NUMBER = (int, float)
_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})


_DTYPE = operator.attrgetter("dtype")
#: reasons said at more than one refusal (runtime/guard_reasons.py)
_ROWS = "a list of tensors of different dtypes, shapes or devices"
_LAYOUT = "sparse or quantized tensors"
_SHORT = "an operand or output shorter than the range (or 0-d, sparse, quantized)"


def _stack(items: Sequence[Any]) -> Optional[_Tensor]:
    """``torch.stack(items)`` when every item is a plain tensor of one dtype, shape, device and
    the strided layout; else None. Checked in bulk (a per-item Python check cost 0.2 us an item,
    more than the stack itself): types and dtypes by set, shapes, devices and layouts by
    ``torch.stack``, which refuses mismatches (it would promote mixed dtypes, so those are
    checked first). Tensor subclasses other than ``Parameter`` may override stacking: declined."""
    if not items:
        return none("an empty list")
    if not set(map(type, items)) <= _PLAIN:
        return none("a list holding something other than plain tensors")
    if len(set(map(_DTYPE, items))) != 1:
        return none(_ROWS)
    try:
        out = torch.stack(list(items))
    except (RuntimeError, NotImplementedError, TypeError):
        return none(_ROWS)
    return out if out.layout is torch.strided else none(_LAYOUT)


def _as_batch(seq: Any) -> Optional[_Tensor]:
    """``[n, ...]`` tensor whose rows are what ``for x in seq`` yields, or None."""
    if type(seq) in _PLAIN:  # exact types: a subclass may override iteration or any op
        if seq.dim() == 0 or seq.layout is not torch.strided:
            return none("a 0-d, sparse or quantized tensor walked by the loop")
        return seq
    if type(seq) in (list, tuple) and seq:
        return _stack(seq)
    return none("the loop walks something other than a tensor or a non-empty list of tensors")


def _shared(a: Sequence[_Tensor], b: Sequence[_Tensor]) -> bool:
    """Whether a tensor of ``a`` may share memory with one of ``b`` (runtime.memory: storages at
    one address or with overlapping bytes; empty tensors touch none)."""
    spans = [storage_span(t) for t in b if t.numel()]
    return any(spans_overlap(storage_span(t), s) for t in a if t.numel() for s in spans)


def _disjoint(t: _Tensor) -> bool:
    """Whether no two elements of ``t`` share memory (proved from sizes and strides: each
    dimension, by increasing stride, steps past everything the smaller ones span)."""
    span = 1
    for stride, size in sorted((abs(st), sz) for st, sz in zip(t.stride(), t.shape) if sz > 1):
        if stride < span:
            return False
        span += stride * (size - 1)
    return True


def _finish(
    batches: List[_Tensor],
    invariants: Sequence[Any],
    accs: Sequence[Any],
    outs: Sequence[Any],
    min_ndim: int,
    running: bool,
    listed: Sequence[Sequence[_Tensor]] = (),
) -> Optional[Tuple[_Tensor, ...]]:
    """The batches aligned, or None. ``listed``: the tensors of the operands given as lists (their
    batches are stacked copies, so what the loop reads is those tensors: a written accumulator
    or output must share memory with none of them either)."""
    n = batches[0].shape[0]
    if n == 0:
        return none("no items")
    dtype, device = batches[0].dtype, batches[0].device
    if dtype not in _FLOATS:
        return none("values that are not floating point")
    if (accs or running) and dtype in _HALF:
        # the loop's running sum rounds to 8-11 bits at every step (float16 ones stop growing at
        # 2048); one batched sum accumulates in float32: far outside reassociation's bound
        return none("a running sum of 16-bit floats (it rounds at every step)")
    ndim = 0
    for b in batches:
        if b.shape[0] != n or b.dtype != dtype or b.device != device:
            return none("operands of different lengths, dtypes or devices")
        ndim = max(ndim, b.dim() - 1)
    reads = list(batches)
    for v in invariants:
        if type(v) in _PLAIN:
            if v.dtype != dtype or v.device != device or v.layout is not torch.strided:
                return none("a loop-invariant tensor of another dtype or device")
            ndim = max(ndim, v.dim())
            reads.append(v)
        elif type(v) not in _NUMBER and type(v) is not bool:  # numpy scalars, subclasses: declined
            return none("a loop-invariant operand that is not a tensor or a Python number")
    if ndim < min_ndim:  # e.g. torch.cat of 0-d results raises: let the loop raise
        return none("0-d values where the code needs rows (the loop raises)")
    for acc in accs:
        if type(acc) in _PLAIN:
            # of the batch's dtype and device: the loop adds each value into the accumulator's
            # precision, the batched form reduces in the batch's and adds once
            if acc.layout is not torch.strided or acc.dtype != dtype or acc.device != device:
                return none("an accumulator of another dtype or device than the values")
        elif type(acc) not in _NUMBER:  # np.float32 starts, subclasses: declined
            return none("an accumulator that is not a tensor or a Python number")
    written = [acc for acc in accs if isinstance(acc, _Tensor)]
    for out in outs:
        if type(out) not in _PLAIN or out.layout is not torch.strided or out.dim() - 1 < ndim:
            # ``out[i] = v`` drops leading 1-sized dims of ``v``; one batched assignment cannot
            return none("an output that is not a plain tensor with rows of the values' rank")
        if out.dim() - 1 != outs[0].dim() - 1 or not _disjoint(out):
            # rows of several ranks cannot share one alignment; an output whose elements share
            # memory (``expand``) takes each loop write, but not one batched write
            return none("outputs of different ranks, or one whose elements share memory")
        written.append(out)
    if outs:
        # ``out[i] = v`` broadcasts ``v`` into the row ``out[i]``: aligned to the row's rank, the
        # batch's first dimension meets the output's first, not a row dimension
        ndim = outs[0].dim() - 1
    if written:
        read = [*reads, *(t for items in listed for t in items)]
        if _shared(written, read):  # an in-place write could change what a later element reads
            return none("an output or accumulator shares memory with what the loop reads")
        if any(_shared(outs[i:i + 1], outs[:i]) for i in range(1, len(outs))):
            return none("two outputs share memory")  # the loop interleaves their writes
    aligned = []
    for b in batches:
        pad = ndim - (b.dim() - 1)
        aligned.append(b[(slice(None),) + (None,) * pad] if pad else b)
    return tuple(aligned)


def batch_zip(
    seqs: Sequence[Any],
    invariants: Sequence[Any] = (),
    accs: Sequence[Any] = (),
    outs: Sequence[Any] = (),
    min_ndim: int = 0,
    running: bool = False,
) -> Optional[Tuple[_Tensor, ...]]:
    """Operands of ``for a, b in zip(A, B)`` (or ``for a in A``) as aligned batches, or None.

    All sequences must have the same length (``zip`` would truncate; the loop then runs as is).
    ``running``: the code sums the values one by one (builtin ``sum`` of the list), as ``accs``
    do: 16-bit values are declined.
    """
    batches = []
    for seq in seqs:
        b = _as_batch(seq)
        if b is None:
            return None  # (the reason is noted)
        batches.append(b)
    if len({b.shape[0] for b in batches}) != 1:
        return none("zip() over sequences of different lengths")
    listed = [seq for seq in seqs if type(seq) in (list, tuple)]
    return _finish(batches, invariants, accs, outs, min_ndim, running, listed)


def batch_range(
    r: Any,
    seqs: Sequence[Any],
    invariants: Sequence[Any] = (),
    accs: Sequence[Any] = (),
    outs: Sequence[Any] = (),
    min_ndim: int = 0,
    with_slice: bool = False,
    running: bool = False,
) -> Optional[Tuple[Any, ...]]:
    """``X[i]`` for ``i`` in ``r`` (a ``range``) as aligned batches ``X[r.start:r.stop:r.step]``.

    Declines negative or out-of-range indices (the loop would wrap around or raise part-way) and
    outputs shorter than the range. ``with_slice``: the slice of ``r`` comes last (for outputs).
    ``running``: as :func:`batch_zip`'s.
    """
    if type(r) is not range or r.step <= 0 or r.start < 0 or len(r) == 0:
        return none("an empty or descending range, or one from a negative start")
    last = r[-1]
    batches = []
    listed = []  # the items a list operand is read at (see _finish)
    for seq in seqs:
        if type(seq) in _PLAIN:
            if seq.dim() == 0 or last >= seq.shape[0] or seq.layout is not torch.strided:
                return none(_SHORT)
            batches.append(seq[r.start : r.stop : r.step])
        elif type(seq) in (list, tuple):
            if last >= len(seq):
                return none(_SHORT)
            items = seq[r.start : r.stop : r.step]
            b = _stack(items)
            if b is None:
                return None  # (the reason is noted)
            batches.append(b)
            listed.append(items)
        else:
            return none("the loop indexes something other than a tensor or a list of tensors")
    for out in outs:
        if type(out) not in _PLAIN or out.dim() == 0 or last >= out.shape[0]:
            return none(_SHORT)
    done = _finish(batches, invariants, accs, outs, min_ndim, running, listed)
    if done is None or not with_slice:
        return done
    return done + (slice(r.start, r.stop, r.step),)


_FLAT_FLOATS = (torch.float32, torch.float64)


def flat_params(params: Any, acc: Any, invariants: Sequence[Any] = ()) -> Optional[_Tensor]:
    """The parameters a penalty loop sums over (``for p in m.parameters(): acc += p.pow(2).sum()
    * c``), flattened and laid end to end, or None (the caller runs its loop). Declined: an empty
    or non-list ``params``, tensor subclasses, other layouts, mixed dtypes or devices, dtypes
    other than float32/float64 (a half-precision sum regrouped could differ by far more than the
    loop's rounding), an accumulator that is neither a number nor a plain tensor of that dtype and
    device or that shares memory with a parameter (``acc += ...`` in place), and invariants that
    are neither numbers nor plain tensors of that dtype and device."""
    if type(params) is not list or not params or not set(map(type, params)) <= _PLAIN:
        return None
    dtypes = set(map(_DTYPE, params))
    if len(dtypes) != 1:
        return None
    dtype = params[0].dtype
    device = params[0].device
    if dtype not in _FLAT_FLOATS or any(p.layout is not torch.strided or p.device != device for p in params):
        return None
    for v in (acc, *invariants):
        if type(v) in _PLAIN:
            if v.layout is not torch.strided or v.dtype != dtype or v.device != device:
                return None
        elif type(v) not in _NUMBER:
            return None
    if type(acc) in _PLAIN and _shared((acc,), params):
        return None
    return torch.cat([p.reshape(-1) for p in params])
