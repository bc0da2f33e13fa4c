"""Numba kernels for :func:`scalebox_cst.runtime.recurrence.linear_recurrence`.

This module imports numba at import time, so it is imported lazily by
``recurrence.py`` (after ``NUMBA_CACHE_DIR`` has been set up) and never by
``scalebox_cst.runtime`` itself.

Exactness: every step is computed as ``b[t, j] + a[t, j] * x[j]`` in the array
dtype -- one rounded multiply, then one rounded add.  The kernels are compiled
with numba's default ``fastmath=False``: LLVM then gets no ``contract`` /
``reassoc`` flags and may neither fuse the multiply and the add into an FMA
nor reorder anything, so the result is bitwise identical to the naive Python /
torch loop.  Vectorising the inner loop over the independent columns ``j`` is
allowed (and happens) since it does not change any single column's arithmetic.

Two loop shapes, same arithmetic: for few columns (``M <= 32``) blocks of
8 / 4 / 2 / 1 columns keep their carries in registers and walk the whole time
axis (independent dependency chains interleave; no store-to-load forwarding
on the critical path); for wide inputs a row-wise loop streams whole rows
(vectorised over columns, cache-friendly).

Arrays are ``[T, M]`` (time-major, ``M`` = product of the trailing dims).  Any
strides are accepted (0-strides for broadcast operands included); numba
compiles one specialisation per dtype / layout combination on first use and
caches it on disk (``cache=True``).
"""

from numba import njit, types
from numba.extending import overload

__all__ = ["rec", "CACHING", "SMALL_M"]

SMALL_M = 32


def _aval(a, t, j):  # pragma: no cover - typing stub, see the overload
    raise NotImplementedError


@overload(_aval)
def _aval_impl(a, t, j):
    if isinstance(a, types.Array):
        return lambda a, t, j: a[t, j]
    return lambda a, t, j: a  # scalar ``a`` (numpy scalar of the array dtype)


def _rec_small(a, b, init, out, reverse):  # pragma: no cover - compiled
    T = b.shape[0]
    M = b.shape[1]
    if reverse:
        t0, t1, step = T - 1, -1, -1
    else:
        t0, t1, step = 0, T, 1
    j = 0
    while j + 8 <= M:
        x0 = init[j]
        x1 = init[j + 1]
        x2 = init[j + 2]
        x3 = init[j + 3]
        x4 = init[j + 4]
        x5 = init[j + 5]
        x6 = init[j + 6]
        x7 = init[j + 7]
        for t in range(t0, t1, step):
            x0 = b[t, j] + _aval(a, t, j) * x0
            x1 = b[t, j + 1] + _aval(a, t, j + 1) * x1
            x2 = b[t, j + 2] + _aval(a, t, j + 2) * x2
            x3 = b[t, j + 3] + _aval(a, t, j + 3) * x3
            x4 = b[t, j + 4] + _aval(a, t, j + 4) * x4
            x5 = b[t, j + 5] + _aval(a, t, j + 5) * x5
            x6 = b[t, j + 6] + _aval(a, t, j + 6) * x6
            x7 = b[t, j + 7] + _aval(a, t, j + 7) * x7
            out[t, j] = x0
            out[t, j + 1] = x1
            out[t, j + 2] = x2
            out[t, j + 3] = x3
            out[t, j + 4] = x4
            out[t, j + 5] = x5
            out[t, j + 6] = x6
            out[t, j + 7] = x7
        j += 8
    if j + 4 <= M:
        x0 = init[j]
        x1 = init[j + 1]
        x2 = init[j + 2]
        x3 = init[j + 3]
        for t in range(t0, t1, step):
            x0 = b[t, j] + _aval(a, t, j) * x0
            x1 = b[t, j + 1] + _aval(a, t, j + 1) * x1
            x2 = b[t, j + 2] + _aval(a, t, j + 2) * x2
            x3 = b[t, j + 3] + _aval(a, t, j + 3) * x3
            out[t, j] = x0
            out[t, j + 1] = x1
            out[t, j + 2] = x2
            out[t, j + 3] = x3
        j += 4
    if j + 2 <= M:
        x0 = init[j]
        x1 = init[j + 1]
        for t in range(t0, t1, step):
            x0 = b[t, j] + _aval(a, t, j) * x0
            x1 = b[t, j + 1] + _aval(a, t, j + 1) * x1
            out[t, j] = x0
            out[t, j + 1] = x1
        j += 2
    if j < M:
        x0 = init[j]
        for t in range(t0, t1, step):
            x0 = b[t, j] + _aval(a, t, j) * x0
            out[t, j] = x0


def _rec_wide(a, b, init, out, reverse):  # pragma: no cover - compiled
    T = b.shape[0]
    M = b.shape[1]
    if T == 0:
        return
    t = T - 1 if reverse else 0
    for j in range(M):
        out[t, j] = b[t, j] + _aval(a, t, j) * init[j]
    for k in range(1, T):
        if reverse:
            t = T - 1 - k
            tp = t + 1
        else:
            t = k
            tp = t - 1
        for j in range(M):
            out[t, j] = b[t, j] + _aval(a, t, j) * out[tp, j]


def _rec(a, b, init, out, reverse):  # pragma: no cover - compiled
    """out[t] = b[t] + a[t] * x_next, x_next = previous step (or init)."""
    if b.shape[1] <= SMALL_M:
        rec_small(a, b, init, out, reverse)
    else:
        rec_wide(a, b, init, out, reverse)


try:
    rec_small = njit(cache=True, nogil=True)(_rec_small)
    rec_wide = njit(cache=True, nogil=True)(_rec_wide)
    rec = njit(cache=True, nogil=True)(_rec)
    CACHING = True
except Exception:  # pragma: no cover - no usable cache location at all
    # ``cache=True`` raises when numba finds no usable cache directory;
    # compile without the on-disk cache rather than losing the fast path.
    rec_small = njit(nogil=True)(_rec_small)
    rec_wide = njit(nogil=True)(_rec_wide)
    rec = njit(nogil=True)(_rec)
    CACHING = False
