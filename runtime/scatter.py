"""Run-time guards for per-row ``out[i].index_add_(dim, idx[i], src[i])`` loops.

``vectorize.elementwise`` replaces such a loop with one ``scatter_add_`` per ``index_add_`` call
of its body (or, with ``alpha``, one ``index_add_`` over the flattened rows per call). What the
transform could not prove is checked here, for every call, before anything is written; any doubt
returns ``None`` so the caller runs its original loop, verbatim: plain strided tensors on one
device; ``out`` at least 2-D, each ``idx`` 2-D, each ``src`` of ``out``'s rank; dtypes the loop
accepts and whose sums do not depend on the kernel (``src`` dtype == ``out`` dtype,
float32/float64/integers; ``idx`` int64/int32, or any real/bool dtype where the loop casts each
index row with ``.long()``/``.int()``); every row in range of all operands; ``src`` rows shaped
like ``out`` rows but along ``dim``; every index in ``[0, size)`` after the cast (float rows: in
``(-1, size)``, so finite and truncating into range; one ``aminmax`` per call, one transfer: the
loop would raise part-way, after changing earlier rows); ``out`` sharing memory with no index or
source (a later call or row would read what an earlier one wrote) nor with itself across rows;
``out`` not requiring grad under grad mode (the loop raises for a leaf; sources may).

Why the results are bitwise the loop's on CPU: every target element receives the contributions of
its own row only, in index order, each added with one rounding, in the loop and in the single op
alike; with several calls per row (CleanRL C51's projection), call 1's in index order, then call
2's, in the loop and in the batched calls made in the same order. ``alpha`` != 1 is fused into
the add by ``index_add_`` on some paths, so the ``alpha`` form keeps the loop's op
(``index_add_``) and its slice layout (indexed dim 0 of each row, rows viewable flat), else
declines.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch

from .guard_reasons import none
from .memory import may_share  # the guards' aliasing question

__all__ = ["scatter_add_rows", "index_add_rows", "scatter_add_calls", "index_add_calls"]

_Tensor = torch.Tensor
_TYPES = (torch.Tensor, torch.nn.Parameter)
_DTYPES = frozenset({torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})
_INDEX_DTYPES = (torch.int64, torch.int32)
#: casts of an index row the rewrite takes (``.long()``/``.to(torch.long)``, ``.int()``): the
#: integer dtypes index_add_ accepts; from floats (truncation), integers and bool
_CASTS = {"long": torch.int64, "int": torch.int32}
_CAST_FROM = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool})


def _no_internal_overlap(t: _Tensor) -> bool:
    """Sufficient test that no two elements of ``t`` share memory (dims sorted by stride, each
    stride beyond the reach of the smaller ones)."""
    reach = 0
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s > 1):
        if stride <= reach:
            return False
        reach += (size - 1) * stride
    return True


def _span(rows: Any, n: int) -> Optional[slice]:
    """The rows the loop visits, as a slice of ``[0, n)`` (``n``: the rows all operands have);
    None where the loop must run (it raises at the first row past the end)."""
    if rows is None:  # for o, j, s in zip(out, idx, src): zip stops at the shortest
        return slice(0, n)
    if type(rows) is not range or rows.step <= 0 or rows.start < 0 or len(rows) == 0:
        return None
    if rows[-1] >= n:
        return None
    return slice(rows.start, rows[-1] + 1, rows.step)


def _index_ok(index: _Tensor, cast: Any) -> bool:
    if cast is None:
        return index.dtype in _INDEX_DTYPES
    if cast not in _CASTS:
        return False
    return index.dtype.is_floating_point or index.dtype in _CAST_FROM


def _calls_operands(rows: Any, out: Any, dim: Any, calls: Sequence[Tuple[Any, Any, Any]]):
    """``(out_rows, d, [(idx_rows, src_rows), ...])`` for the rows the loop visits, ``d`` the
    indexed dimension of one row (0 <= d < row rank), each ``idx_rows`` int64 (cast as the loop
    casts each row: ``.long()``/``.int()``); None where the loop must run. Every check of every
    call is made here, before anything is written."""
    if not calls:
        return none("no index_add_ call")
    tensors = [out] + [t for index, _, source in calls for t in (index, source)]
    for t in tensors:
        if type(t) not in _TYPES or t.layout is not torch.strided or t.is_quantized or t.is_meta:
            return none("a tensor that is not a plain strided one (a subclass, sparse, quantized or meta)")
    if out.dim() < 2 or any(index.dim() != 2 or source.dim() != out.dim() for index, _, source in calls):
        return none("rows whose ranks do not match (2-D indices, sources of the output's rank)")
    if type(dim) is not int:
        return none("the dim is not a Python int")
    rank = out.dim() - 1
    if not -rank <= dim < rank:
        return none("the dim is outside the rows' rank")
    d = dim % rank
    if out.dtype not in _DTYPES:
        return none("an output of a dtype index_add_ is not batched for (float16, bfloat16, bool, complex)")
    if any(source.dtype != out.dtype or not _index_ok(index, cast) for index, cast, source in calls):
        return none("sources of another dtype than the output, or indices of an unsupported dtype")
    if any(t.device != out.device for t in tensors):
        return none("tensors on different devices")
    if out.requires_grad and torch.is_grad_enabled():
        return none("an output that requires grad, under grad mode")
    if out.is_inference() and not torch.is_inference_mode_enabled():
        return none("an inference tensor written outside inference mode")
    span = _span(rows, min(t.shape[0] for t in tensors))
    if span is None:
        return none("a range that is empty, descending, from a negative start, or past the rows")
    out_b = out[span]
    if out_b.shape[0] == 0:
        return none("no rows to write")
    size = out_b.shape[d + 1]
    if out.numel():
        if any(t.numel() and may_share(t, out) for t in tensors[1:]):  # read back through an index or a source later
            return none("an output that shares memory with an index or a source")
    if not _no_internal_overlap(out_b):
        return none("an output whose elements share memory")
    pairs, bounds, floats = [], [], []
    for index, cast, source in calls:
        idx_b, src_b = index[span], source[span]
        k = idx_b.shape[1]
        if k == 0:
            return none("an index row of no items")  # nothing to add; the loop still checks shapes
        want = list(out_b.shape)
        want[d + 1] = k
        if list(src_b.shape) != want:
            return none("a source whose rows do not match the indices")
        fractional = cast is not None and idx_b.dtype.is_floating_point
        if cast is not None and not fractional:
            idx_b = idx_b.to(_CASTS[cast])  # integers wrap (int32) or widen elementwise, as per row
        pairs.append((idx_b, src_b, fractional, cast))
        bounds.append(torch.stack(torch.aminmax(idx_b)).double())
        floats.append(fractional)
    # one transfer for all calls' bounds; float64 holds every bound exactly near [0, size)
    for (lo, hi), fractional in zip(torch.stack(bounds).tolist(), floats):
        if fractional:
            # a float index row truncates toward zero in .long()/.int(): (-1, size) truncates
            # into [0, size); NaN and infinities fail these comparisons (aminmax propagates
            # NaN), so casts whose result is not defined by the values never reach the op
            if not (lo > -1 and hi < size):
                return none("an index outside the row (the loop raises part-way)")
        elif lo < 0 or hi >= size:
            return none("an index outside the row (the loop raises part-way)")  # the loop raises at the first bad index, after changing earlier rows
    rows_out = []
    for idx_b, src_b, fractional, cast in pairs:
        if fractional:
            idx_b = idx_b.to(_CASTS[cast])
        rows_out.append((idx_b.long(), src_b))
    return out_b, d, rows_out


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


def _scatter_layout(out_b: _Tensor, d: int, pairs: List[Tuple[_Tensor, _Tensor]]) -> Tuple[Any, ...]:
    """``(target, dim, index_1, source_1, ...)`` for ``target.scatter_add_(dim, index_c,
    source_c)``, call after call; one layout for all calls (the same target elements)."""
    if out_b.dim() == 2:
        return (out_b, 1) + tuple(t for pair in pairs for t in pair)
    if d == 0:
        flats = [_flat(out_b, idx_b, src_b) for idx_b, src_b in pairs]
        if all(f is not None and f[0].is_contiguous() and f[2].is_contiguous() for f in flats):
            # the layout index_add_ itself hands to scatter_add_ (a row-sorted CPU kernel)
            got: List[Any] = [flats[0][0], 0]
            for _, flat_idx, flat_src in flats:
                ones = (1,) * (flat_src.dim() - 1)
                got += [flat_idx.view((-1,) + ones).expand(flat_src.shape), flat_src]
            return tuple(got)
    got = [out_b, d + 1]
    for idx_b, src_b in pairs:
        shape = [idx_b.shape[0]] + [1] * (out_b.dim() - 1)
        shape[d + 1] = idx_b.shape[1]
        got += [idx_b.view(shape).expand(src_b.shape), src_b]
    return tuple(got)


def scatter_add_calls(rows: Any, out: Any, dim: Any, *calls: Tuple[Any, Any, Any]) -> Optional[Tuple[Any, ...]]:
    """``(target, dim, index_1, source_1, ..., index_n, source_n)`` such that
    ``target.scatter_add_(dim, index_c, source_c)`` for c = 1..n, in that order, does what ::

        for i in rows:
            out[i].index_add_(dim, index_1[i].long(), source_1[i])  # cast_1 == "long"
            ...
            out[i].index_add_(dim, index_n[i], source_n[i])  # cast_n is None

    does; None: run the loop. Each call is ``(index, cast, source)``, ``cast`` None, ``"long"``
    or ``"int"`` (``.long()``/``.int()`` of each index row: the batched cast of the rows makes the
    same integers). Nothing is written here: every call is checked before the caller writes.

    Why several calls stay bitwise on CPU: rows are disjoint, so a target element receives its
    own row's values only: in the loop call 1's in index order, then call 2's, ...; the batched
    calls run in the same order, each adding its row's values in index order (as for one call).
    """
    try:
        ops = _calls_operands(rows, out, dim, calls)
        if ops is None:
            return None  # (the reason is noted)
        out_b, d, pairs = ops
        return _scatter_layout(out_b, d, pairs)
    except Exception as exc:  # a guard must never raise where the loop might not
        return none(f"checking the inputs raised {type(exc).__name__}")


def index_add_calls(rows: Any, out: Any, dim: Any, *calls: Tuple[Any, Any, Any, Any]) -> Optional[Tuple[Any, ...]]:
    """``(target, index_1, source_1, alpha_1, ..., index_n, source_n, alpha_n)`` such that
    ``target.index_add_(0, index_c, source_c, alpha=alpha_c)`` for c = 1..n, in order, does what
    the loop of ``out[i].index_add_(dim, index_c[i], source_c[i], alpha=alpha_c)`` calls does,
    bit for bit; None: run the loop. Each call is ``(index, cast, source, alpha)`` (``alpha`` 1 for
    a call without one: ``index_add_``'s default). Only where each row is indexed along its first
    dimension and the rows can be viewed flat (the loop's kernel path is kept)."""
    try:
        if any(type(c[3]) not in (int, float) for c in calls):
            return none("an alpha that is not a Python number")
        ops = _calls_operands(rows, out, dim, [c[:3] for c in calls])
        if ops is None:
            return None  # (the reason is noted)
        out_b, d, pairs = ops
        if d != 0:
            return none("rows indexed along a dimension other than their first")
        got: List[Any] = []
        for (idx_b, src_b), call in zip(pairs, calls):
            flat = _flat(out_b, idx_b, src_b)
            if flat is None:
                return none("rows that cannot be viewed as one flat tensor")
            if not got:
                got.append(flat[0])
            got += [flat[1], flat[2], call[3]]
        return tuple(got)
    except Exception as exc:
        return none(f"checking the inputs raised {type(exc).__name__}")


def scatter_add_rows(rows: Any, out: Any, index: Any, source: Any, dim: Any) -> Optional[Tuple[_Tensor, int, _Tensor, _Tensor]]:
    """``(target, dim, index, source)`` such that ``target.scatter_add_(dim, index, source)`` does
    what ``for i in rows: out[i].index_add_(dim, index[i], source[i])`` does; None: run the loop.

    ``rows`` is the loop's ``range`` (None for ``zip(out, index, source)``).
    """
    return scatter_add_calls(rows, out, dim, (index, None, source))


def index_add_rows(
    rows: Any, out: Any, index: Any, source: Any, dim: Any, alpha: Any
) -> Optional[Tuple[_Tensor, _Tensor, _Tensor, Any]]:
    """``(target, index, source, alpha)`` such that ``target.index_add_(0, index, source,
    alpha=alpha)`` does what ``for i in rows: out[i].index_add_(dim, index[i], source[i],
    alpha=alpha)`` does, bit for bit; None: run the loop. Only where each row is indexed along its
    first dimension and the rows can be viewed flat (the loop's kernel path is kept)."""
    return index_add_calls(rows, out, dim, (index, None, source, alpha))
