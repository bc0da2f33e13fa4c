"""Which exact CPU loop runs a recurrence, loaded lazily: the C extension, numba (paid for
by ski rental: the numpy loop runs until it has cost as much as loading numba), triton on CUDA."""
from __future__ import annotations

import logging
import os
import time

import numpy as np
import torch

from .. import numba_cache

_log = logging.getLogger("scalebox_cst.runtime.recurrence")

_IMPLS = ("auto", "c", "numba", "triton", "torch", "loop", "scan")
_FAST_DTYPES = (torch.float32, torch.float64)
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_LOOP_MAX_T = 32
_Tensor = torch.Tensor
_STRIDED = torch.strided
_Number = (int, float)

# --------------------------------------------------------------------------
# lazy backend loading
# --------------------------------------------------------------------------

_c_mod = None  # None: not tried yet; False: unavailable
_numba_mod = None
_triton_mod = None
_warned: set = set()


def _debug_once(key, msg, *args):
    if key not in _warned:
        _warned.add(key)
        _log.debug(msg, *args)


def _load_numba():
    global _numba_mod
    if _numba_mod is None:
        try:
            numba_cache.directory()  # $NUMBA_CACHE_DIR: the user's own folder (runtime/numba_cache.py)
            from .. import _recurrence_cpu as mod

            _numba_mod = mod
        except Exception as exc:  # numba missing or broken
            _debug_once("numba-import", "linear_recurrence: numba unavailable (%r); using torch", exc)
            _numba_mod = False
    return _numba_mod


#: The contract of ``_recurrence_c.rec`` this module was written for (its ``VERSION``): an
#: editable install keeps an old build next to newer sources until it is rebuilt.
_C_VERSION = 2


def _fma_free(rec_ptr):
    """Whether the kernel ``rec_ptr`` (the extension's raw-address entry) rounds the product
    before the add: with ``a = x = 1 + 2**-12`` and ``b = -(1 + 2**-11)`` (float32) the rounded
    product is ``1 + 2**-11`` (a tie to even) and the step gives 0, a fused multiply-add gives
    ``2**-24``; the float64 analogue likewise. One step each, on ``array`` buffers (no numpy:
    this runs on a process's first call)."""
    from array import array

    for kind, e in (("f", 12), ("d", 27)):
        x = array(kind, [1 + 2.0 ** -e])
        b = array(kind, [-(1 + 2.0 ** (1 - e))])
        out = array(kind, [1.0])
        xp, bp, op = x.buffer_info()[0], b.buffer_info()[0], out.buffer_info()[0]
        rec_ptr(kind, 1, 1, True, xp, 1, 1, 0.0, bp, 1, 1, xp, 1, 0.0, op, 1, 1)
        if out[0] != 0:
            return False
    return True


def _load_c():
    """The C extension built at install (``setup.py``), when present, current and exact."""
    global _c_mod
    if _c_mod is None:
        try:
            if os.environ.get("SCALEBOX_RECURRENCE_C", "1").strip().lower() in ("0", "false", "no", "off"):
                raise ImportError("turned off by $SCALEBOX_RECURRENCE_C")
            from .. import _recurrence_c as mod

            if getattr(mod, "VERSION", None) != _C_VERSION:
                raise ImportError("stale build (VERSION %r, want %r): reinstall" % (
                    getattr(mod, "VERSION", None), _C_VERSION))
            if not _fma_free(mod.rec_ptr):
                raise ImportError("built with FMA contraction: not exact")
            _c_mod = mod
        except Exception as exc:  # not built (no compiler at install), stale or broken
            _debug_once("c-import", "linear_recurrence: C extension unavailable (%r); using numba / numpy", exc)
            _c_mod = False
    return _c_mod


#: Loading numba (import + compiled kernels from its disk cache) costs about 0.4 s per process,
#: more than a short run saves: until that much time has gone into the exact numpy loop below,
#: ``"auto"`` keeps renting that loop, then buys numba (ski rental: never more than twice the
#: better choice's cost). Explicit ``impl="numba"`` and ``backend_available`` load it at once.
_RENT_BUDGET_S = 0.4
_rent_spent = 0.0


def _numpy_rec(a, b, init, out, reverse):
    """The sequential loop in numpy with the kernels' signature: one multiply then one add per
    step in the array dtype, so bitwise identical to numba and to the naive loop."""
    T, M = b.shape
    steps = range(T - 1, -1, -1) if reverse else range(T)
    a_rows = isinstance(a, np.ndarray)
    if M == 1:  # scalar arithmetic: Python floats are float64, numpy scalars keep float32
        f64 = b.dtype == np.float64
        bs = b[:, 0].tolist() if f64 else b[:, 0]
        av = (a[:, 0].tolist() if f64 else a[:, 0]) if a_rows else (float(a) if f64 else a)
        x = float(init[0]) if f64 else init[0]
        o = out[:, 0]
        if a_rows:
            for t in steps:
                x = bs[t] + av[t] * x
                o[t] = x
        else:
            for t in steps:
                x = bs[t] + av * x
                o[t] = x
        return
    x = init
    tmp = np.empty(M, dtype=b.dtype)
    for t in steps:
        np.multiply(a[t] if a_rows else a, x, out=tmp)
        x = out[t]
        np.add(b[t], tmp, out=x)


def _cpu_rec():
    """The CPU kernel ``"auto"`` uses now: the C extension when built; else numba once loaded
    (or once the numpy loop has cost as much as loading it), else the numpy loop, timed against
    the budget."""
    if _c_mod:
        return _c_mod.rec
    if _c_mod is None and _load_c():
        return _c_mod.rec
    return _fallback_rec()


def _fallback_rec():
    """:func:`_cpu_rec` without the C extension (also what a call the extension refuses uses)."""
    if _numba_mod:
        return _numba_mod.rec
    if _numba_mod is None and _rent_spent >= _RENT_BUDGET_S:
        mod = _load_numba()
        if mod:
            return mod.rec
    return _rented


def _rented(a, b, init, out, reverse):
    global _rent_spent
    t0 = time.perf_counter()
    _numpy_rec(a, b, init, out, reverse)
    _rent_spent += time.perf_counter() - t0


def _load_triton():
    global _triton_mod
    if _triton_mod is None:
        try:
            from .. import _recurrence_triton as mod

            _triton_mod = mod
        except Exception as exc:
            _debug_once("triton-import", "linear_recurrence: triton unavailable (%r); using torch", exc)
            _triton_mod = False
    return _triton_mod


def cpu_backend():
    """The kernel ``impl="auto"`` runs float32 / float64 CPU calls on now: ``"c"`` (the
    extension built at install), ``"numba"``, or ``"numpy"`` (the exact loop rented until numba
    has been paid for); all three are bitwise identical to the naive loop."""
    rec = _cpu_rec()
    return "c" if _c_mod and rec is _c_mod.rec else "numba" if rec is not _rented else "numpy"


def backend_available(name):
    """True when backend ``"c"`` / ``"numba"`` / ``"triton"`` can be imported."""
    if name == "c":
        return bool(_load_c())
    if name == "numba":
        return bool(_load_numba())
    if name == "triton":
        return bool(_load_triton())
    if name in ("torch", "loop", "scan"):
        return True
    raise ValueError("unknown backend %r" % (name,))
