"""Run-time guards for per-row ``out[i].index_add_(dim, idx[i], src[i])`` loops.

``vectorize.elementwise`` replaces such a loop with one ``scatter_add_`` (or, with ``alpha``, one
``index_add_`` over the flattened rows). What the transform could not prove is checked here, and
any doubt returns ``None`` so the caller runs its original loop, verbatim: plain strided tensors on
one device; ``out`` at least 2-D, ``idx`` 2-D, ``src`` of ``out``'s rank; dtypes the loop accepts and
whose sums do not depend on the kernel (``src`` dtype == ``out`` dtype, float32/float64/integers;
``idx`` int64/int32); every row in range of all three; ``src`` rows shaped like ``out`` rows but
along ``dim``; every index in ``[0, size)`` (one ``aminmax``: the loop would raise part-way, after
changing earlier rows); ``out`` sharing memory with neither ``idx`` nor ``src`` nor itself across
rows; ``out`` not requiring grad under grad mode (the loop raises for a leaf; ``src`` may).

Why the results are bitwise the loop's on CPU: every target element receives the contributions of
its own row only, in index order, each added with one rounding, in the loop and in the single op
alike. ``alpha`` != 1 is fused into the add by ``index_add_`` on some paths, so the ``alpha`` form
keeps the loop's op (``index_add_``) and its slice layout (indexed dim 0 of each row, rows
viewable flat), else declines.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

__all__ = ["scatter_add_rows", "index_add_rows"]

_Tensor = torch.Tensor
_TYPES = (torch.Tensor, torch.nn.Parameter)
_DTYPES = frozenset({torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})
_INDEX_DTYPES = (torch.int64, torch.int32)


def _storage(t: _Tensor) -> Tuple[Any, int]:
    return (t.device, t.untyped_storage().data_ptr())


def _no_internal_overlap(t: _Tensor) -> bool:
    """Sufficient test that no two elements of ``t`` share memory (dims sorted by stride, each
    stride beyond the reach of the smaller ones)."""
    reach = 0
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s > 1):
        if stride <= reach:
            return False
        reach += (size - 1) * stride
    return True


def _operands(rows: Any, out: Any, index: Any, source: Any, dim: Any):
    """``(out_rows, idx_rows, src_rows, d)`` for the rows the loop visits, ``d`` the indexed
    dimension of one row (0 <= d < row rank); None where the loop must run."""
    for t in (out, index, source):
        if type(t) not in _TYPES or t.layout is not torch.strided or t.is_quantized or t.is_meta:
            return None
    if out.dim() < 2 or index.dim() != 2 or source.dim() != out.dim():
        return None
    if type(dim) is not int:
        return None
    rank = out.dim() - 1
    if not -rank <= dim < rank:
        return None
    d = dim % rank
    if out.dtype not in _DTYPES or source.dtype != out.dtype or index.dtype not in _INDEX_DTYPES:
        return None
    if not (out.device == index.device == source.device):
        return None
    if out.requires_grad and torch.is_grad_enabled():
        return None
    if out.is_inference() and not torch.is_inference_mode_enabled():
        return None
    n = min(out.shape[0], index.shape[0], source.shape[0])
    if rows is None:  # for o, j, s in zip(out, idx, src): zip stops at the shortest
        span = slice(0, n)
    else:
        if type(rows) is not range or rows.step <= 0 or rows.start < 0 or len(rows) == 0:
            return None
        if rows[-1] >= n:
            return None  # the loop raises at the first row past the end
        span = slice(rows.start, rows[-1] + 1, rows.step)
    out_b, idx_b, src_b = out[span], index[span], source[span]
    if out_b.shape[0] == 0:
        return None
    k = idx_b.shape[1]
    if k == 0:
        return None  # nothing to add; the loop still checks shapes
    want = list(out_b.shape)
    want[d + 1] = k
    if list(src_b.shape) != want:
        return None
    if out.numel():
        mem = _storage(out)
        if (index.numel() and _storage(index) == mem) or (source.numel() and _storage(source) == mem):
            return None
    if not _no_internal_overlap(out_b):
        return None
    lo, hi = torch.stack(torch.aminmax(idx_b)).tolist()
    if lo < 0 or hi >= out_b.shape[d + 1]:
        return None  # the loop raises at the first bad index, after changing earlier rows
    return out_b, idx_b, src_b, d


def _flat(out_b: _Tensor, idx_b: _Tensor, src_b: _Tensor) -> Optional[Tuple[_Tensor, _Tensor, _Tensor]]:
    """Rows ``[B, M, *rest]`` as one ``[B*M, *rest]`` view (None if they cannot be), sources as
    ``[B*K, *rest]``, and the row indices shifted by ``M`` per row: one ``index_add_`` along dim 0
    then makes exactly the loop's additions, in the same order, through the same kernel (a scalar
    loop for 1-D rows, ``add_`` of slices otherwise; neither depends on the source's layout, so a
    source that cannot be viewed flat is copied)."""
    b, m = out_b.shape[0], out_b.shape[1]
    k = idx_b.shape[1]
    rest = tuple(out_b.shape[2:])
    try:
        target = out_b.view((b * m,) + rest)
    except RuntimeError:
        return None
    source = src_b.reshape((b * k,) + rest)
    offsets = torch.arange(0, b * m, m, device=idx_b.device).unsqueeze(1)
    return target, (idx_b.long() + offsets).reshape(-1), source


def scatter_add_rows(rows: Any, out: Any, index: Any, source: Any, dim: Any) -> Optional[Tuple[_Tensor, int, _Tensor, _Tensor]]:
    """``(target, dim, index, source)`` such that ``target.scatter_add_(dim, index, source)`` does
    what ``for i in rows: out[i].index_add_(dim, index[i], source[i])`` does; None: run the loop.

    ``rows`` is the loop's ``range`` (None for ``zip(out, index, source)``).
    """
    try:
        ops = _operands(rows, out, index, source, dim)
        if ops is None:
            return None
        out_b, idx_b, src_b, d = ops
        idx_b = idx_b.long()
        if out_b.dim() == 2:
            return out_b, 1, idx_b, src_b
        if d == 0:
            flat = _flat(out_b, idx_b, src_b)
            if flat is not None and flat[0].is_contiguous() and flat[2].is_contiguous():
                # the layout index_add_ itself hands to scatter_add_ (a row-sorted CPU kernel)
                target, flat_idx, flat_src = flat
                ones = (1,) * (flat_src.dim() - 1)
                return target, 0, flat_idx.view((-1,) + ones).expand(flat_src.shape), flat_src
        shape = [idx_b.shape[0]] + [1] * (out_b.dim() - 1)
        shape[d + 1] = idx_b.shape[1]
        return out_b, d + 1, idx_b.view(shape).expand(src_b.shape), src_b
    except Exception:  # a guard must never raise where the loop might not
        return None


def index_add_rows(
    rows: Any, out: Any, index: Any, source: Any, dim: Any, alpha: Any
) -> Optional[Tuple[_Tensor, _Tensor, _Tensor, Any]]:
    """``(target, index, source, alpha)`` such that ``target.index_add_(0, index, source,
    alpha=alpha)`` does what ``for i in rows: out[i].index_add_(dim, index[i], source[i],
    alpha=alpha)`` does, bit for bit; None: run the loop. Only where each row is indexed along its
    first dimension and the rows can be viewed flat (the loop's kernel path is kept)."""
    try:
        if type(alpha) not in (int, float):
            return None
        ops = _operands(rows, out, index, source, dim)
        if ops is None:
            return None
        out_b, idx_b, src_b, d = ops
        if d != 0:
            return None
        flat = _flat(out_b, idx_b, src_b)
        if flat is None:
            return None
        return flat + (alpha,)
    except Exception:
        return None
