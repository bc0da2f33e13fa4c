"""Input normalisation: time-major operands, the result dtype the naive loop would produce, and
the literal first steps that settle it when dtypes are mixed."""
from __future__ import annotations

import numpy as np
import torch

from .autograd import _core
from .backends import _Number, _Tensor

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
