"""Whether tensors may share memory: the aliasing questions of the run-time guards.

A guard that runs a loop's steps at once (vectorized, fused, batched) is right only where what
the loop writes is not what a later step reads. Comparing storage addresses was not enough:
tensors made over the same memory each get a storage of their own (``torch.from_numpy`` of two
overlapping views of one array, ``torch.frombuffer``, DLPack), so their addresses differ while
their bytes overlap. Here two tensors share memory when they are on one device and their
storages start at one address or their byte ranges overlap (:func:`may_share`); parameters
packed in one flat storage are told apart by the bytes each one spans (:func:`any_overlap`).
"""
from __future__ import annotations

from typing import Any, Iterable, List, Tuple

import torch

#: (device, first byte, one past the last byte)
Span = Tuple[Any, int, int]


def storage_span(t: torch.Tensor) -> Span:
    """The bytes of ``t``'s whole storage."""
    s = t.untyped_storage()
    start = s.data_ptr()
    return (t.device, start, start + s.nbytes())


def spans_overlap(a: Span, b: Span) -> bool:
    """Same device, and the same start (empty storages included) or overlapping bytes."""
    return a[0] == b[0] and (a[1] == b[1] or (a[1] < b[2] and b[1] < a[2]))


def may_share(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` may read or write the same memory (by their storages)."""
    return spans_overlap(storage_span(a), storage_span(b))


def element_span(t: torch.Tensor) -> Span:
    """The bytes from ``t``'s first element to its last (torch strides are never negative)."""
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if size > 1)
    start = t.data_ptr()
    return (t.device, start, start + (last + 1) * t.element_size())


def any_overlap(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether any two of ``tensors`` (empty ones left out) span common bytes: one sort by start
    and a sweep, so a per-step guard over a network's parameters stays cheap."""
    spans: List[Tuple[str, int, int]] = sorted(
        (str(t.device), *element_span(t)[1:]) for t in tensors if t.numel()
    )
    for (d0, _, end0), (d1, start1, _) in zip(spans, spans[1:]):
        if d0 == d1 and start1 < end0:
            return True
    return False
