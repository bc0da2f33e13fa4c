"""First-order linear recurrences (discounted returns, GAE, ...) as one call.

::

    linear_recurrence(a, b, init=0.0, reverse=True, dim=0, *,
                      return_last=False, impl="auto")

computes, along the time axis ``dim`` of ``b`` (length ``T``)::

    reverse=True :  x[T] = init;  for t = T-1 .. 0:  x[t] = b[t] + a[t] * x[t+1]
    reverse=False:  x[-1] = init; for t = 0 .. T-1:  x[t] = b[t] + a[t] * x[t-1]

and returns ``x[0..T-1]`` (``out``), or ``(out, last)`` with
``return_last=True`` where ``last`` is the final carried value: ``x[0]`` for
``reverse=True``, ``x[T-1]`` for ``reverse=False``, and ``init`` itself
(unchanged, as the naive loop leaves it) when ``T == 0``.

Operands (the semantics are exactly those of the naive loop
``for t in reversed(range(T)): x = b[t] + a[t] * x; out[t] = x``):

* ``b``: the per-step input with a time axis ``dim``.  Its container type
  decides the result type: torch tensor -> tensor (same device), numpy array
  -> numpy array, list of Python numbers -> list of Python floats (computed in
  float64, which is Python float arithmetic), list of 0-d / 1-d tensors ->
  list of tensors.
* ``a``: a Python / numpy scalar, a 0-d tensor (constant in time), or an array
  with a time axis: a 1-D ``a`` is indexed by time (``a[t]``), an N-D ``a`` has
  its time axis at its own axis ``dim`` (negative ``dim`` counts from each
  operand's end).  A time axis of length 1 means constant in time.  The
  per-step slices ``a[t]``, ``b[t]`` and ``x`` broadcast by ordinary
  (right-aligned) rules, so ``a`` may be ``[T]``, ``[T, 1]``, ``[T, N]``, ...
  for a ``[T, N]`` ``b``.
* ``init``: a scalar or an array broadcastable to ``b[t]``'s shape.

Result dtype: what the naive loop produces, i.e. torch's (numpy's for numpy
inputs) type promotion applied step by step, with Python scalars weak: for
``float32`` ``b`` and Python-float ``a`` / ``init`` the result is float32,
a float64 ``[T, N]`` ``a`` makes it float64, a ``[T]`` float64 ``a`` (0-d
slices in torch) does not.  When dtypes are mixed, or both ``a`` and a non-zero
``init`` are Python scalars (the naive loop then multiplies them in double
precision), the first steps are executed literally with torch / numpy ops
until the carried dtype is stable and the rest runs on the fast backend with
every operand cast (exactly) to that dtype.

Backends (``impl``):

* ``"c"`` (CPU, float32 / float64; the ``"auto"`` choice there when it was
  built): ``_recurrence_c``, a small C extension built at install time
  (``setup.py``, optional), the sequential loop computing exactly
  ``b[t] + a[t] * x`` in the input dtype -- one multiply then one add, compiled
  without FMA contraction or fast-math -- so it is **bitwise identical** to the
  naive torch / numpy / Python loop, and fast from a process's first call (it
  loads in well under a millisecond; the GIL is released inside).  A build
  that fails the load-time exactness probe (an FMA) or is stale is not used.
  ``$SCALEBOX_RECURRENCE_C=0`` turns it off.
* ``"numba"`` (CPU, float32 / float64; the ``"auto"`` choice there when the C
  extension is absent): the same loop, compiled by numba, equally exact.
  Loading it costs about 0.4 s per process, so ``"auto"`` first runs the same
  loop in numpy (equally exact, about 0.2 us per step) and loads numba only
  once that loop has cost as much (ski rental): short runs never pay for numba.
  :func:`cpu_backend` says which of the three ``"auto"`` uses now.
* ``"triton"`` (CUDA; the ``"auto"`` choice when ``triton`` imports): one fused
  kernel per call, a chunked ``tl.associative_scan``.  Reassociated: equal to
  the loop up to rounding (float16 / bfloat16 accumulate in float32).
* ``"loop"``: the sequential torch loop itself (exact; any device, dtype).
* ``"scan"``: a log-step (Hillis-Steele) scan with pure torch ops on any
  device, combine ``(a1, b1) o (a2, b2) = (a1*a2, a1*b2 + b1)``.
  Reassociated: relative error grows like ``log2(T) * eps`` times the
  condition of the recurrence (for ``|a| <= 1`` about 1e-6 relative to
  ``max |x|`` in float32 at T = 2048, 1e-14 in float64); float16 / bfloat16
  are scanned in float32 and rounded once at the end.
* ``"torch"``: ``"loop"`` when ``T <= 32``, else ``"scan"``.  ``"auto"`` uses it
  on devices other than CPU / CUDA, for dtypes numba / triton do not cover, and
  whenever numba / triton is missing or fails (logged once at DEBUG level).

Autograd: when grad mode is on and any tensor operand requires grad, the
backend runs inside a ``torch.autograd.Function`` whose backward is itself a
linear recurrence in the opposite direction (``lambda = dL/dx``; grad wrt
``b`` is ``lambda``, wrt ``a[t]`` is ``lambda[t] * x_next[t]``, wrt ``init``
``a[edge] * lambda[edge]``), so it runs on the same fast backend and is
itself differentiable (double backward works).

Overhead: a ``[T, M]`` contiguous CPU float32/float64 ``b`` with a same-shape
same-dtype ``a`` (or a Python-float ``a``) and a float / ``[M]`` ``init`` takes a
short fast path (no normalisation, numpy views, one kernel call; about 3 us of
Python on top of the kernel); CUDA tensors of that form go straight to one
triton launch.  Everything else (broadcasting, ``dim != 0``, mixed dtypes,
containers, autograd) goes through the general path.

numba is imported on first use only (see above).  Its on-disk cache goes to
``$NUMBA_CACHE_DIR`` when the user set it, otherwise to
``$XDG_CACHE_HOME/scalebox_cst/numba`` (``~/.cache/...``), or a per-user temp
directory when that is not writable.
"""

import logging
import math
import os
import sys
import tempfile
import time

import numpy as np
import torch

__all__ = ["linear_recurrence", "discounted_cumsum", "backend_available", "cpu_backend"]

_log = logging.getLogger(__name__)

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
_warned = set()


def _debug_once(key, msg, *args):
    if key not in _warned:
        _warned.add(key)
        _log.debug(msg, *args)


def _numba_cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    candidates = [os.path.join(base, "scalebox_cst", "numba")]
    try:
        uid = str(os.getuid())
    except AttributeError:  # pragma: no cover - windows
        uid = os.environ.get("USERNAME", "user")
    candidates.append(os.path.join(tempfile.gettempdir(), "scalebox_cst-numba-" + uid))
    for d in candidates:
        try:
            os.makedirs(d, exist_ok=True)
            if os.access(d, os.W_OK):
                return d
        except OSError:
            continue
    return None


def _load_numba():
    global _numba_mod
    if _numba_mod is None:
        try:
            if not os.environ.get("NUMBA_CACHE_DIR"):
                d = _numba_cache_dir()
                if d is not None:
                    os.environ["NUMBA_CACHE_DIR"] = d
                    cfg = sys.modules.get("numba.core.config")
                    if cfg is not None:  # numba was imported before us
                        cfg.reload_config()
            from . import _recurrence_cpu as mod

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
            from . import _recurrence_c as mod

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
            from . import _recurrence_triton as mod

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
_zero_rows = {}


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
                if not (_c_mod and rec is _c_mod.rec):
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


# --------------------------------------------------------------------------
# autograd
# --------------------------------------------------------------------------


def _needs_grad(a, b, init):
    if not torch.is_grad_enabled():
        return False
    return (
        b.requires_grad
        or (isinstance(a, _Tensor) and a.requires_grad)
        or (isinstance(init, _Tensor) and init.requires_grad)
    )


class _LinearRecurrenceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, b, a, init, reverse, S, impl):
        out = _backend(a, b, init, reverse, S, impl)
        a_t = a if isinstance(a, _Tensor) else None
        i_t = init if isinstance(init, _Tensor) else None
        ctx.save_for_backward(a_t, i_t, out)
        ctx.a_scalar = None if a_t is not None else a
        ctx.init_scalar = None if i_t is not None else init
        ctx.b_shape = b.shape
        ctx.reverse = reverse
        ctx.S = S
        ctx.impl = impl
        return out

    @staticmethod
    def backward(ctx, g):
        a, init, out = ctx.saved_tensors
        rev = ctx.reverse
        S = ctx.S
        T = out.shape[0]
        need_b, need_a, need_i = ctx.needs_input_grad[:3]
        # lambda[t] = dL/dx[t]; reverse: lambda[t] = g[t] + a[t-1] * lambda[t-1]
        if a is None:
            a_sh = ctx.a_scalar
        elif a.shape[0] == 1 or T == 1:
            a_sh = a
        else:
            z = a.new_zeros((1,) + a.shape[1:])
            a_sh = torch.cat([z, a[:-1]]) if rev else torch.cat([a[1:], z])
        lam = _core(a_sh, g, 0.0, not rev, S, ctx.impl)
        grad_b = grad_a = grad_i = None
        if need_b:
            grad_b = lam.sum_to_size(ctx.b_shape) if lam.shape != ctx.b_shape else lam
        if need_a:
            if init is not None:
                edge = init.expand(S).unsqueeze(0)
            else:
                edge = out.new_full((1,) + S, ctx.init_scalar)
            x_next = torch.cat([out[1:], edge]) if rev else torch.cat([edge, out[:-1]])
            ga = lam * x_next
            grad_a = ga.sum_to_size(a.shape)
        if need_i:
            if a is None:
                ae = ctx.a_scalar
            else:
                ae = a[0] if a.shape[0] == 1 else (a[-1] if rev else a[0])
            gi = ae * (lam[-1] if rev else lam[0])
            grad_i = gi.sum_to_size(init.shape) if gi.shape != init.shape else gi
        return grad_b, grad_a, grad_i, None, None, None


def _core(a, b, init, reverse, S, impl):
    if _needs_grad(a, b, init):
        return _LinearRecurrenceFn.apply(b, a, init, reverse, S, impl)
    return _backend(a, b, init, reverse, S, impl)


# --------------------------------------------------------------------------
# input normalisation
# --------------------------------------------------------------------------


def _time_major(x, dim):
    """Move ``x``'s time axis to the front (a 0-d ``x`` becomes ``[1]``: constant
    in time; a 1-D ``x`` is indexed by time)."""
    if x.ndim == 0:
        return x.reshape(1)
    if x.ndim > 1:
        d = dim if dim >= 0 else dim + x.ndim
        if not 0 <= d < x.ndim:
            raise ValueError("dim %d out of range for an operand of shape %s" % (dim, tuple(x.shape)))
        if d:
            x = x.movedim(d, 0) if isinstance(x, _Tensor) else np.moveaxis(x, d, 0)
    return x


def _pad(x, nd):
    """Insert singleton dims after the time axis so that ``x.ndim == 1 + nd``
    (its per-step slice stays right-aligned, as ``x[t]`` broadcasts)."""
    if isinstance(x, _Number):
        return x
    pad = 1 + nd - x.ndim
    if pad > 0:
        x = x.reshape(tuple(x.shape[:1]) + (1,) * pad + tuple(x.shape[1:]))
    return x


def _normalize(a, b, init, dim):
    """Time-major (unpadded) operands, broadcast slice shape ``S`` and ``T``."""
    if b.ndim == 0:
        raise ValueError("b must have a time axis (got a 0-d value)")
    b = _time_major(b, dim)
    T = b.shape[0]
    shapes = [tuple(b.shape[1:])]
    if not isinstance(a, _Number):
        a = _time_major(a, dim)
        if a.shape[0] not in (1, T):
            raise ValueError(
                "a has %d time steps along its time axis, b has %d" % (a.shape[0], T))
        shapes.append(tuple(a.shape[1:]))
    if not isinstance(init, _Number):
        shapes.append(tuple(init.shape))
    S = tuple(np.broadcast_shapes(*shapes)) if len(shapes) > 1 else shapes[0]
    return a, b, init, S, T


def _dtype_of(x):
    return x.dtype if hasattr(x, "dtype") else None


def _uniform(a, b, init):
    """True when the fast backends reproduce the naive loop as is: every
    array operand has b's dtype (a floating one), Python scalars are weak, and
    no Python-scalar product ``a * init`` is formed in double precision."""
    dt = b.dtype
    if not dt.is_floating_point:
        return False
    if isinstance(a, _Number):
        if isinstance(init, _Number):
            return init == 0 or dt in (torch.float64, np.float64)
    elif a.dtype != dt:
        return False
    if not isinstance(init, _Number) and init.dtype != dt:
        return False
    return True


def _peel(a, b, init, reverse):
    """Execute steps literally (torch or numpy ops) until the carried dtype is
    stable.  Returns (k, steps, x): number of steps done, their values in
    time order of execution, and the carry."""
    T = b.shape[0]
    a_arr = not isinstance(a, _Number)
    ta = a.shape[0] if a_arr else 0
    x = init
    steps = []
    prev = None
    for k in range(T):
        t = T - 1 - k if reverse else k
        at = (a[0] if ta == 1 else a[t]) if a_arr else a
        x = b[t] + at * x
        steps.append(x)
        dt = _dtype_of(x)
        if k >= 1 and dt == prev:
            break
        prev = dt
    return len(steps), steps, x


def _cast(x, dt):
    if isinstance(x, _Number):
        return x
    return x if x.dtype == dt else x.astype(dt) if isinstance(x, np.ndarray) else x.to(dt)


def _torch_tm(a, b, init, reverse, S, T, impl):
    """Time-major torch computation, including the exactness peel."""
    dev = b.device
    if isinstance(a, _Tensor) and a.device != dev:
        a = a.to(dev)
    if isinstance(init, _Tensor) and init.device != dev:
        init = init.to(dev)
    if T == 0:
        dt = _result_dtype_torch(a, b, init)
        return torch.empty((0,) + S, dtype=dt, device=dev)
    nd = len(S)
    if _uniform(a, b, init):
        return _core(_pad(a, nd), _pad(b, nd), init, reverse, S, impl)
    k, steps, x = _peel(a, b, init, reverse)
    dt = x.dtype
    x = x.expand(S) if x.shape != S else x
    if k == T:
        rest = None
    else:
        if reverse:
            ar = a if isinstance(a, _Number) or a.shape[0] == 1 else a[: T - k]
            br = b[: T - k]
        else:
            ar = a if isinstance(a, _Number) or a.shape[0] == 1 else a[k:]
            br = b[k:]
        rest = _core(_pad(_cast(ar, dt), nd), _pad(_cast(br, dt), nd), x, reverse, S, impl)
    peeled = [s.to(dt).expand(S) for s in steps]
    if reverse:
        parts = ([rest] if rest is not None else []) + [torch.stack(peeled[::-1])]
    else:
        parts = [torch.stack(peeled)] + ([rest] if rest is not None else [])
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def _result_dtype_torch(a, b, init):
    """dtype the naive loop would carry (used for T == 0)."""
    z = torch.zeros((1,) * max(b.ndim - 1, 0), dtype=b.dtype)
    at = a if isinstance(a, _Number) else torch.zeros((1,) * max(a.ndim - 1, 0), dtype=a.dtype)
    x = init if isinstance(init, _Number) else torch.zeros((1,) * init.ndim, dtype=init.dtype)
    for _ in range(3):
        x = z + at * x
    return x.dtype if isinstance(x, _Tensor) else b.dtype


def _result_dtype_numpy(a, b, init):
    """dtype the naive numpy loop would carry (used for T == 0)."""

    def proto(x):
        if isinstance(x, _Number):
            return x
        if x.ndim <= 1:
            return np.zeros((), dtype=x.dtype)[()]  # a numpy scalar, like x[t]
        return np.zeros((1,) * (x.ndim - 1), dtype=x.dtype)

    z = proto(b)
    at = proto(a)
    x = init if isinstance(init, _Number) else np.zeros((1,) * init.ndim, dtype=init.dtype)
    for _ in range(3):
        x = z + at * x
    return np.asarray(x).dtype


def _np_from_torch_view(x):
    return torch.from_numpy(x) if x.flags.writeable else torch.from_numpy(x.copy())


def _numpy_tm(a, b, init, reverse, S, T, impl):
    """Time-major numpy computation: numpy semantics for the peel, then the
    torch machinery (numba) on exact casts."""
    if T == 0:
        return np.empty((0,) + S, dtype=_result_dtype_numpy(a, b, init))
    a_n = isinstance(a, _Number)
    i_n = isinstance(init, _Number)
    uniform = (
        (a_n or a.dtype == b.dtype)
        and (i_n or init.dtype == b.dtype)
        and (not (a_n and i_n) or init == 0 or b.dtype == np.float64)
    )
    nd = len(S)
    if uniform and b.dtype.kind == "f":
        at = a if a_n else _pad(_np_from_torch_view(a), nd)
        it = init if i_n else _np_from_torch_view(init)
        return _core(at, _pad(_np_from_torch_view(b), nd), it, reverse, S, impl).numpy()
    k, steps, x = _peel(a, b, init, reverse)
    x = np.asarray(x)
    dt = x.dtype
    x = np.broadcast_to(x, S)
    peeled = np.stack([np.broadcast_to(np.asarray(s, dtype=dt), S) for s in steps])
    if k == T:
        return peeled[::-1].copy() if reverse else peeled
    if reverse:
        ar = a if a_n or a.shape[0] == 1 else a[: T - k]
        br = b[: T - k]
    else:
        ar = a if a_n or a.shape[0] == 1 else a[k:]
        br = b[k:]
    if not a_n:
        ar = _pad(np.array(ar, dtype=dt), nd)
    br = _pad(np.array(br, dtype=dt), nd)
    if dt.kind == "f":
        rest = _core(
            ar if a_n else torch.from_numpy(ar),
            torch.from_numpy(br),
            torch.from_numpy(np.array(x)),
            reverse, S, impl,
        ).numpy()
    else:  # integer / other dtypes: plain numpy loop
        rest = np.empty((br.shape[0],) + S, dtype=dt)
        xx = x
        rng = range(br.shape[0] - 1, -1, -1) if reverse else range(br.shape[0])
        for t in rng:
            at = ar if a_n else (ar[0] if ar.shape[0] == 1 else ar[t])
            xx = br[t] + at * xx
            rest[t] = xx
    return np.concatenate([rest, peeled[::-1]]) if reverse else np.concatenate([peeled, rest])


# --------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------


def _to_tensor_operand(x):
    if isinstance(x, _Tensor) or isinstance(x, _Number):
        return x
    if isinstance(x, np.generic):
        return torch.as_tensor(np.asarray(x))
    if isinstance(x, np.ndarray):
        return _np_from_torch_view(x)
    if isinstance(x, (list, tuple)):
        if len(x) and isinstance(x[0], _Tensor):
            return torch.stack(list(x))
        return torch.tensor(x)
    raise TypeError("unsupported operand type %s" % type(x).__name__)


def _to_numpy_operand(x):
    if isinstance(x, np.generic):  # numpy scalars are strong (NEP 50): 0-d arrays
        return np.asarray(x)
    if isinstance(x, _Number):
        return x
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, _Tensor):
        return x.detach().cpu().numpy()
    if isinstance(x, (list, tuple)):
        return np.asarray(x)
    raise TypeError("unsupported operand type %s" % type(x).__name__)


def _f64_operand(x):
    """Operand of a list-of-floats call: Python float or float64 array."""
    if isinstance(x, _Number):
        return float(x)
    arr = np.asarray(_to_numpy_operand(x), dtype=np.float64)
    return float(arr) if arr.ndim == 0 else arr


def _place_time(out_tm, dim):
    if out_tm.ndim <= 1 or dim == 0:
        return out_tm
    d = dim if dim >= 0 else dim + out_tm.ndim
    if d == 0:
        return out_tm
    if isinstance(out_tm, _Tensor):
        return out_tm.movedim(0, d).contiguous()
    return np.ascontiguousarray(np.moveaxis(out_tm, 0, d))


def _last(out_tm, reverse, init, T):
    if T == 0:
        return init
    return out_tm[0] if reverse else out_tm[-1]


def _fast(a, b, init, reverse):
    """The common call (GAE / returns on CPU) with the least Python overhead;
    ``None`` when it does not apply (the general path then handles it)."""
    dt = b.dtype
    if b.ndim != 2:
        if b.ndim != 1 or not b.is_cpu:
            return None
        # [T] as [T, 1]: same arithmetic, the general path's normalisation skipped
        if type(a) is _Tensor and a.shape == b.shape:
            a = a.view(-1, 1)
        if type(init) is _Tensor and init.ndim == 0:
            init = init.view(1)
        out = _fast(a, b.view(-1, 1), init, reverse)
        return None if out is None else out.view(-1)
    if b.is_cuda:
        return _fast_cuda(a, b, init, reverse)
    if not (dt is torch.float32 or dt is torch.float64) or not b.is_cpu:
        return None
    grad = torch.is_grad_enabled()
    if grad and b.requires_grad:
        return None
    T, M = b.shape
    if type(a) is _Tensor:
        if a.dtype is not dt or a.shape != b.shape or not a.is_cpu or (grad and a.requires_grad) \
                or a.layout is not _STRIDED or a.is_neg():
            return None
    elif type(a) is float:
        if type(init) is float and init != 0.0 and dt is torch.float32:
            return None  # the naive loop forms a * init in double: general path
    else:
        return None
    if type(init) is _Tensor:
        if (init.dtype is not dt or init.shape != b.shape[1:] or not init.is_cpu
                or (grad and init.requires_grad) or init.layout is not _STRIDED or init.is_neg()):
            return None
    elif type(init) is not float:
        return None
    if T == 0 or b.layout is not _STRIDED or not b.is_contiguous() or b.is_neg():
        return None
    c = _c_mod if _c_mod is not None else _load_c()
    if c:  # raw addresses: no numpy bridge (its first use in a process costs ~150 us)
        out = torch.empty((T, M), dtype=dt)
        if type(a) is _Tensor:
            sa0, sa1 = a.stride()
            ap, asc = a.data_ptr(), 0.0
        else:
            ap, sa0, sa1, asc = 0, 0, 0, a
        if type(init) is _Tensor:
            ip, si, isc = init.data_ptr(), init.stride(0), 0.0
        else:
            ip, si, isc = 0, 0, init
        try:
            c.rec_ptr("f" if dt is torch.float32 else "d", T, M, reverse, ap, sa0, sa1, asc,
                      b.data_ptr(), M, 1, ip, si, isc, out.data_ptr(), M, 1)
            return out
        except Exception as exc:  # misaligned memory (a tensor over odd numpy memory): numba / numpy
            _debug_once("c-run", "linear_recurrence: C kernel refused (%r); using numba / numpy", exc)
    nps = _NP_SCALAR[dt]
    a = a.numpy() if type(a) is _Tensor else nps(a)
    if type(init) is float:
        init = _zero_row(M, nps) if init == 0.0 else np.full(M, init, dtype=nps)
    else:
        init = init.contiguous().numpy()
    rec = _fallback_rec()
    out = np.empty((T, M), dtype=nps)
    try:
        rec(a, b.numpy(), init, out, reverse)
    except Exception as exc:  # numba failed to compile: the general path retries on torch
        _debug_once("fast-run", "linear_recurrence: CPU kernel failed (%r); general path", exc)
        return None
    return torch.from_numpy(out)


def _fast_cuda(a, b, init, reverse):
    """CUDA counterpart of :func:`_fast` (one triton launch, nothing else)."""
    dt = b.dtype
    if dt not in _TRITON_DTYPES:
        return None
    grad = torch.is_grad_enabled()
    if grad and b.requires_grad:
        return None
    dev = b.device
    if type(a) is _Tensor:
        if a.dtype is not dt or a.shape != b.shape or a.device != dev or (grad and a.requires_grad):
            return None
    elif type(a) is not float or dt is torch.float64:
        return None
    if type(init) is _Tensor:
        if (init.dtype is not dt or init.shape != b.shape[1:] or init.device != dev
                or (grad and init.requires_grad)):
            return None
    elif type(init) is not float or dt is torch.float64:
        return None
    mod = _triton_mod if _triton_mod is not None else _load_triton()
    if not mod or b.shape[0] == 0:
        return None
    out = torch.empty(b.shape, dtype=dt, device=dev)
    try:
        mod.launch(a, b, init, out, reverse)
    except Exception as exc:  # pragma: no cover - needs a GPU
        _debug_once("triton-run", "linear_recurrence: triton failed (%r); using torch", exc)
        return None
    return out


def linear_recurrence(a, b, init=0.0, reverse=True, dim=0, *, return_last=False, impl="auto"):
    """``x[t] = b[t] + a[t] * x[t+1]`` (``reverse=True``, ``x[T] = init``) or
    ``x[t] = b[t] + a[t] * x[t-1]`` (``reverse=False``, ``x[-1] = init``) along
    axis ``dim``; see the module docstring for operand, dtype, exactness and
    backend rules.  Returns ``out`` (same container type as ``b``), or
    ``(out, last)`` when ``return_last`` (``last`` = ``x[0]`` for reverse,
    ``x[T-1]`` forward, ``init`` itself when ``T == 0``).  ``impl`` is one of
    ``"auto"``, ``"numba"``, ``"triton"``, ``"torch"``, ``"loop"``, ``"scan"``.
    """
    if impl not in _IMPLS:
        raise ValueError("impl must be one of %s, got %r" % (_IMPLS, impl))
    # ---- fast path: [T, M] contiguous CPU float tensors of one dtype (numba)
    if type(b) is _Tensor and dim == 0 and impl == "auto":
        out = _fast(a, b, init, reverse)
        if out is not None:
            if return_last:
                return out, _last(out, reverse, init, b.shape[0])
            return out

    # ---- general path
    if isinstance(b, _Tensor):
        kind = "tensor"
    elif isinstance(b, np.ndarray):
        kind = "numpy"
    elif isinstance(b, (list, tuple)):
        if len(b) and isinstance(b[0], _Tensor):
            kind = "tensor_list"
        else:
            kind = "float_list"
    else:
        raise TypeError("b must be a tensor, numpy array or list, got %s" % type(b).__name__)

    if isinstance(a, bool) or isinstance(a, np.bool_):
        a = int(a)
    if isinstance(init, bool) or isinstance(init, np.bool_):
        init = int(init)

    if kind == "float_list":
        b_n = np.asarray(b, dtype=np.float64)
        a_n = _f64_operand(a)
        i_n = _f64_operand(init)
        a_n, b_n, i_n, S, T = _normalize(a_n, b_n, i_n, dim)
        out_tm = _numpy_tm(a_n, b_n, i_n, reverse, S, T, impl)
        out = _place_time(out_tm, dim).tolist()
        if return_last:
            last = _last(out_tm, reverse, init, T)
            if isinstance(last, (np.ndarray, np.generic)):
                last = last.tolist()
            return out, last
        return out

    if kind == "numpy":
        a_n = _to_numpy_operand(a)
        i_n = _to_numpy_operand(init)
        a_n, b_n, i_n, S, T = _normalize(a_n, b, i_n, dim)
        out_tm = _numpy_tm(a_n, b_n, i_n, reverse, S, T, impl)
        out = _place_time(out_tm, dim)
        if return_last:
            return out, _last(out_tm, reverse, init, T)
        return out

    # tensors
    bt = torch.stack(list(b)) if kind == "tensor_list" else b
    at = _to_tensor_operand(a)
    it = _to_tensor_operand(init)
    at, bt, it, S, T = _normalize(at, bt, it, dim)
    out_tm = _torch_tm(at, bt, it, reverse, S, T, impl)
    last = _last(out_tm, reverse, init, T)
    if kind == "tensor_list":
        out = list(out_tm.unbind(0))
    else:
        out = _place_time(out_tm, dim)
    if return_last:
        return out, last
    return out


def discounted_cumsum(x, gamma, reverse=True, dim=0, *, init=0.0, impl="auto"):
    """``out[t] = x[t] + gamma * out[t+1]`` (reverse) -- discounted returns;
    ``linear_recurrence(gamma, x, init, reverse, dim)``."""
    return linear_recurrence(gamma, x, init, reverse, dim, impl=impl)
