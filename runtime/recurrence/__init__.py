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
directory when that is not writable; only a folder of the user's own that no one else can
write, and the folders of other installs bounded (``runtime/numba_cache.py``).

Parts: ``api`` (the two public calls and their fast paths), ``operands`` (normalisation and
result dtypes), ``autograd``, ``kernels`` (the runners), ``backends`` (lazy loading, ski rental).
Rewritten code imports ``linear_recurrence`` from this package by name.
"""
from __future__ import annotations

from .api import discounted_cumsum, linear_recurrence
from .backends import backend_available, cpu_backend

__all__ = ["linear_recurrence", "discounted_cumsum", "backend_available", "cpu_backend"]
