"""The backends' runners: each takes time-major, dtype-uniform operands and fills the result."""
from __future__ import annotations

import math

import numpy as np
import torch

from . import backends  # _c_mod / _triton_mod read there: the loaders set them
from .backends import (
    _FAST_DTYPES,
    _IMPLS,
    _LOOP_MAX_T,
    _TRITON_DTYPES,
    _cpu_rec,
    _debug_once,
    _fallback_rec,
    _load_c,
    _load_numba,
    _load_triton,
    _Tensor,
)

# --------------------------------------------------------------------------
# backends; all take time-major, dtype-uniform operands:
#   b: tensor [T, *Sb];  a: Python number or tensor [Ta, *Sa] (Ta in {1, T});
#   init: Python number or tensor; S: broadcast slice shape (tuple);
#   a / b have ndim == 1 + len(S) after _normalize.
# --------------------------------------------------------------------------


def _detach(x):
    return x.detach() if x.requires_grad else x


def _flat(a, b, init, S, T, M):
    """[T, M] views (broadcast with 0-strides where possible)."""
    b = _detach(b)
    if b.shape[1:] != S:
        b = b.expand((T,) + S)
    b2 = b.reshape(T, M)
    if isinstance(a, _Tensor):
        a = _detach(a)
        ta = a.shape[0]
        if a.shape[1:] != S:
            a = a.expand((ta,) + S)
        a = a.reshape(ta, M)
        if ta != T:
            a = a.expand(T, M)
    if isinstance(init, _Tensor):
        init = _detach(init)
        if init.shape != S:
            init = init.expand(S)
        init = init.reshape(M)
    return a, b2, init


_NP_SCALAR = {torch.float32: np.float32, torch.float64: np.float64}
_zero_rows: dict = {}


def _zero_row(M, nps):
    """Cached zero carry (the kernels never write ``init``)."""
    z = _zero_rows.get((M, nps))
    if z is None:
        if len(_zero_rows) > 64:
            _zero_rows.clear()
        z = np.zeros(M, dtype=nps)  # writable: keeps the numba signature count low
        _zero_rows[(M, nps)] = z
    return z


def _run_cpu(rec, a, b, init, reverse, S):
    """``rec``: the numba kernel or :func:`_numpy_rec` (same signature, same arithmetic)."""
    T = b.shape[0]
    M = math.prod(S)
    dt = b.dtype
    nps = _NP_SCALAR[dt]
    a, b2, init = _flat(a, b, init, S, T, M)
    if not b2.is_contiguous():  # one C-layout signature for b (fewer compiles)
        b2 = b2.contiguous()
    on = np.empty((T, M), dtype=nps)
    if isinstance(init, _Tensor):
        init_n = init.contiguous().numpy()
    elif init == 0:
        init_n = _zero_row(M, nps)
    else:
        init_n = np.full(M, init, dtype=nps)
    rec(a.numpy() if isinstance(a, _Tensor) else nps(a), b2.numpy(), init_n, on, reverse)
    out = torch.from_numpy(on)
    return out if len(S) == 1 else out.view((T,) + S)


def _run_triton(mod, a, b, init, reverse, S):
    T = b.shape[0]
    M = math.prod(S)
    dt = b.dtype
    a, b2, init = _flat(a, b, init, S, T, M)
    out = torch.empty((T,) + S, dtype=dt, device=b.device)
    if dt == torch.float64:  # Triton passes Python floats as fp32
        if not isinstance(a, _Tensor):
            a = torch.full((1, 1), a, dtype=dt, device=b.device).expand(T, M)
        if not isinstance(init, _Tensor):
            init = torch.full((1,), init, dtype=dt, device=b.device).expand(M)
    mod.launch(a, b2, init, out.view(T, M), reverse)
    return out


def _run_loop(a, b, init, reverse, S):
    """The naive sequential torch loop (exact by definition)."""
    T = b.shape[0]
    out = torch.empty((T,) + S, dtype=b.dtype, device=b.device)
    a_t = isinstance(a, _Tensor)
    a_const = a_t and a.shape[0] == 1
    x = init
    steps = range(T - 1, -1, -1) if reverse else range(T)
    for t in steps:
        at = (a[0] if a_const else a[t]) if a_t else a
        x = b[t] + at * x
        out[t] = x
    return out


def _run_scan(a, b, init, reverse, S):
    """Hillis-Steele scan with the affine-map combine (reassociated)."""
    T = b.shape[0]
    dt = b.dtype
    cdt = torch.float32 if dt in (torch.float16, torch.bfloat16) else dt
    shape = (T,) + S
    B = b.to(cdt).expand(shape).clone()
    if isinstance(a, _Tensor):
        A = a.to(cdt).expand(shape).clone()
    else:
        A = torch.full(shape, a, dtype=cdt, device=b.device)
    d = 1
    while d < T:
        n = T - d
        if reverse:  # x[t] = A[t] * x[t+d] + B[t]
            Bn = torch.addcmul(B[:n], A[:n], B[d:])
            An = A[:n] * A[d:]
            B[:n] = Bn
            A[:n] = An
        else:  # x[t] = A[t] * x[t-d] + B[t]
            Bn = torch.addcmul(B[d:], A[d:], B[:n])
            An = A[d:] * A[:n]
            B[d:] = Bn
            A[d:] = An
        d *= 2
    if isinstance(init, _Tensor):
        B = torch.addcmul(B, A, init.to(cdt))
    elif init != 0:
        B = B.add_(A, alpha=init) if cdt.is_floating_point else B + A * init
    return B if cdt == dt else B.to(dt)


def _backend(a, b, init, reverse, S, impl):
    """Pick and run a backend (no autograd)."""
    dev = b.device.type
    dt = b.dtype
    if impl == "auto":
        if dev == "cpu" and dt in _FAST_DTYPES:
            rec = _cpu_rec()
            try:
                return _run_cpu(rec, a, b, init, reverse, S)
            except Exception as exc:  # the extension refused a layout, or a numba compile failure
                if not (backends._c_mod and rec is backends._c_mod.rec):
                    _debug_once("numba-run", "linear_recurrence: numba failed (%r); using torch", exc)
                else:
                    _debug_once("c-run", "linear_recurrence: C kernel refused (%r); using numba / numpy", exc)
                    try:
                        return _run_cpu(_fallback_rec(), a, b, init, reverse, S)
                    except Exception as exc2:  # pragma: no cover - numba compile failure
                        _debug_once("numba-run", "linear_recurrence: numba failed (%r); using torch", exc2)
        elif dev == "cuda" and dt in _TRITON_DTYPES:
            mod = _load_triton()
            if mod:
                try:
                    return _run_triton(mod, a, b, init, reverse, S)
                except Exception as exc:  # pragma: no cover - needs a GPU
                    _debug_once("triton-run", "linear_recurrence: triton failed (%r); using torch", exc)
        impl = "torch"
    if impl == "torch":
        impl = "loop" if b.shape[0] <= _LOOP_MAX_T else "scan"
    if impl == "loop":
        return _run_loop(a, b, init, reverse, S)
    if impl == "scan":
        return _run_scan(a, b, init, reverse, S)
    if impl == "c":
        mod = _load_c()
        if not mod:
            raise RuntimeError("linear_recurrence: impl='c' requested but the C extension is unavailable")
        if dev != "cpu" or dt not in _FAST_DTYPES:
            raise ValueError("impl='c' needs float32/float64 CPU tensors, got %s on %s" % (dt, dev))
        return _run_cpu(mod.rec, a, b, init, reverse, S)
    if impl == "numba":
        mod = _load_numba()
        if not mod:
            raise RuntimeError("linear_recurrence: impl='numba' requested but numba is unavailable")
        if dev != "cpu" or dt not in _FAST_DTYPES:
            raise ValueError("impl='numba' needs float32/float64 CPU tensors, got %s on %s" % (dt, dev))
        return _run_cpu(mod.rec, a, b, init, reverse, S)
    if impl == "triton":
        mod = _load_triton()
        if not mod:
            raise RuntimeError("linear_recurrence: impl='triton' requested but triton is unavailable")
        if dev != "cuda" or dt not in _TRITON_DTYPES:
            raise ValueError("impl='triton' needs floating CUDA tensors, got %s on %s" % (dt, dev))
        return _run_triton(mod, a, b, init, reverse, S)
    raise ValueError("impl must be one of %s, got %r" % (_IMPLS, impl))
