"""Per-sample loss loops (``advantage = R - value.item()`` then appends or sums): ``loss_zip`` /
``loss_range`` guard them on top of loop_batch's ``batch_zip`` / ``batch_range``."""
from __future__ import annotations

import operator
from typing import Any, List, Optional, Sequence, Tuple

import torch

from ..fused import fused_linear  # noqa: F401  (the one-pass tier of rewritten recurrences)
from ..loop_batch import batch_range, batch_zip
from .kinds import _FLOATS_T, _PY_SCALARS, _TENSORS

# ---------------------------------------------------------------- per-sample loss loops
# vectorize.reduction's loss loops (``advantage = R - value.item()`` then appends or sums):
# loss_zip / loss_range guard them on top of loop_batch's batch_zip / batch_range.

_EXACT_INT = 1 << 53
#: Fewest samples worth batching: below it the guard and the batched ops cost more than the loop.
#: Measured on a 2-core CPU, one thread, pytorch/examples' actor-critic loss loop (two appends,
#: .item(), smooth_l1_loss): 0.5x at 1 sample, about 0.8x at 2-3 under autograd, 1.3-1.4x at 4,
#: 6-16x at 16-64, 26-37x at 512.
LOSS_MIN_SAMPLES = 4


def _unpacks(item: Any, k: int) -> bool:
    """``a, b = item`` yields ``item``'s ``k`` entries, as ``zip(*seq)`` does: a list, a tuple or a
    tuple subclass (a namedtuple) that keeps tuple's iteration."""
    t = type(item)
    if t is tuple or t is list:
        return len(item) == k
    return isinstance(item, tuple) and t.__iter__ is tuple.__iter__ and t.__len__ is tuple.__len__ and len(item) == k


def _indexes(t: type) -> bool:
    """Items of type ``t`` give ``item[j]`` what unpacking them gives (tuple's own methods)."""
    return t is tuple or t is list or (issubclass(t, tuple) and t.__iter__ is tuple.__iter__
                                         and t.__len__ is tuple.__len__ and t.__getitem__ is tuple.__getitem__)


def _elem_rank(x: Any, first: int = 0) -> int:
    """The rank of one element of a per-sample container (a tensor's rows, or a list's tensors)."""
    return x.dim() - 1 if type(x) in _TENSORS else x[first].dim()


class LossBatch:
    """The samples of a loss loop as batches, with what the batched body needs: ``seqs`` (one
    aligned batch per loop element read), ``dtype`` (of every tensor the body computes), the
    rank each result has per sample (``fit``), and the conversions that stand for ``.item()``,
    Python-scalar arithmetic and ``torch.tensor([x])``."""

    __slots__ = ("seqs", "dtype", "ranks")

    def __init__(self, seqs: Tuple[Any, ...], dtype: Any, ranks: Tuple[int, ...]) -> None:
        self.seqs, self.dtype, self.ranks = seqs, dtype, ranks

    @staticmethod
    def item(x: Any) -> Any:
        """``x.item()`` per sample of a 1-element tensor: the float64 value, no history (a Python
        float holds a float32 or float64 value exactly, and Python float arithmetic is float64)."""
        return x.detach().to(torch.float64)

    def weak(self, x: Any) -> Any:
        """Python floats per sample meeting a tensor: torch casts a Python scalar to the tensor's
        dtype first, then computes in that dtype (float32/float64 on CPU and CUDA)."""
        return x.to(self.dtype)

    @staticmethod
    def new(x: Any) -> Any:
        """``torch.tensor([x])`` per sample of a 0-d tensor ``x``: its value, dtype, no history."""
        return x.detach()

    def fit(self, v: Any, j: int) -> Any:
        """A batched result with the rank one sample's result has (the batches were aligned to
        the highest rank: a 0-d result of 1-element operands drops their size-1 dims)."""
        r, n = self.ranks[j], v.dim() - 1
        return v if r >= n else v.reshape(tuple(v.shape[:1]) + tuple(v.shape[1 + n - r:]))


def _loss_finish(batches, ranks, invariants, *, units=(), zerod=(), numbers=(), unit_invs=(), fits=(), rank=0, cats=(),
                 cpu=False, floats=False, default=False) -> Optional[LossBatch]:
    """The checks a loss loop's batched body needs beyond loop_batch's (see :func:`loss_zip`)."""
    dtype = batches[0].dtype
    if floats and (dtype not in _FLOATS_T or batches[0].device.type not in ("cpu", "cuda")):
        return None  # float16/bfloat16 compute a Python scalar in float opmath; MPS has no float64
    if default and torch.get_default_dtype() != dtype:
        return None
    if cpu and batches[0].device.type != "cpu":
        return None
    for i in numbers:
        v = invariants[i]
        if type(v) not in _PY_SCALARS or (type(v) is int and abs(v) > _EXACT_INT):
            return None
    for k in units:
        if batches[k][0].numel() != 1:
            return None
    if any(type(invariants[i]) in _TENSORS and invariants[i].numel() != 1 for i in unit_invs):
        return None
    if any(ranks[k] != 0 for k in zerod):
        return None
    inv_ranks = [v.dim() if type(v) in _TENSORS else 0 for v in invariants]
    out = tuple(max([c] + [ranks[k] for k in keys] + [inv_ranks[i] for i in invs]) for keys, invs, c in fits)
    if any(out[j] < 1 for j in cats):
        return None  # torch.cat of 0-d results raises: the loop raises
    n0 = batches[0].dim() - 1
    if rank > n0:
        pad = (slice(None),) + (None,) * (rank - n0)
        batches = [b[pad] for b in batches]
    return LossBatch(tuple(batches), dtype, out)


def loss_zip(seqs: Sequence[Any], unpack: Sequence[Any], invariants: Sequence[Any] = (), accs: Sequence[Any] = (),
             **checks: Any) -> Optional[LossBatch]:
    """The samples of ``for a, (b, c) in zip(A, BC)`` as a :class:`LossBatch`, or None (the loop runs).

    ``unpack``: per zipped sequence, whether its element is read (a bool) or, for a tuple target,
    which of its entries are (a tuple of bools; every item must unpack into that many entries).
    What :func:`~scalebox_cst.runtime.loop_batch.batch_zip` checks holds for the entries read
    (tensors or lists of equally shaped tensors of one float dtype and device, invariants Python
    numbers or tensors of that dtype, equal lengths, at least one sample); ``checks``: ``units``
    (elements with one value per sample: ``.item()``, per-sample losses), ``zerod`` (0-d elements:
    ``torch.tensor([x])``), ``numbers`` (invariants that meet Python floats: Python numbers, ints
    below 2**53), ``unit_invs`` (invariants of a per-sample loss: numbers or 1-element tensors), ``floats`` (float32/float64 on CPU or CUDA only, where Python scalars convert as
    described in :meth:`LossBatch.weak` and float64 exists), ``default`` (the default dtype is the batch's: ``torch.tensor([f])``
    of a Python float), ``cpu`` (``torch.tensor`` makes CPU tensors), ``fits`` (per result, the
    elements and invariants its rank is the highest of, and a floor), ``cats`` (results that
    ``torch.cat`` joins: not 0-d), ``rank`` (the least rank the batches are aligned to)."""
    try:
        for seq, u in zip(seqs, unpack):  # O(1) first: lists of Python floats (returns) decline at once
            if type(seq) in (list, tuple) and seq:
                first = seq[0]
                if type(u) is tuple:
                    if not _unpacks(first, len(u)) or any(f and type(e) not in _TENSORS for e, f in zip(first, u)):
                        return None
                elif u and type(first) not in _TENSORS:
                    return None
        used: List[Any] = []
        sizes = set()
        for seq, u in zip(seqs, unpack):
            if type(seq) not in (list, tuple) and type(seq) not in _TENSORS:
                return None
            sizes.add(len(seq))
            if type(u) is tuple:  # checked and split in bulk (a per-item Python check costs as much as the loop)
                types = set(map(type, seq))
                if type(seq) not in (list, tuple) or not all(_unpacks(seq[0], len(u)) and _indexes(t) for t in types) \
                        or set(map(len, seq)) != {len(u)}:
                    return None
                used.extend(list(map(operator.itemgetter(j), seq)) for j, flag in enumerate(u) if flag)
            elif u:
                used.append(seq)
        if len(sizes) != 1 or not used or min(sizes) < LOSS_MIN_SAMPLES:
            return None
        batches = batch_zip(tuple(used), tuple(invariants), tuple(accs))
        if batches is None:
            return None
        return _loss_finish(list(batches), [_elem_rank(s) for s in used], invariants, **checks)
    except Exception:
        return None


def loss_range(r: Any, seqs: Sequence[Any], invariants: Sequence[Any] = (), accs: Sequence[Any] = (),
               **checks: Any) -> Optional[LossBatch]:
    """``X[i]`` for ``i`` in ``range(...)`` as a :class:`LossBatch` (what
    :func:`~scalebox_cst.runtime.loop_batch.batch_range` checks, and the ``checks`` of
    :func:`loss_zip`), or None."""
    try:
        if type(r) is not range or len(r) < LOSS_MIN_SAMPLES:
            return None
        batches = batch_range(r, tuple(seqs), tuple(invariants), tuple(accs))
        if batches is None:
            return None
        return _loss_finish(list(batches), [_elem_rank(s, r.start) for s in seqs], invariants, **checks)
    except Exception:
        return None
