"""``linear_recurrence`` and ``discounted_cumsum``: container handling, the short fast paths
(contiguous CPU / CUDA tensors) and the general path."""
from __future__ import annotations

import numpy as np
import torch

from . import backends  # _c_mod / _triton_mod read there: the loaders set them
from .backends import (
    _IMPLS,
    _STRIDED,
    _TRITON_DTYPES,
    _debug_once,
    _fallback_rec,
    _load_c,
    _load_triton,
    _Number,
    _Tensor,
)
from .kernels import _NP_SCALAR, _zero_row
from .operands import _normalize, _np_from_torch_view, _numpy_tm, _torch_tm

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
    c = backends._c_mod if backends._c_mod is not None else _load_c()
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
    mod = backends._triton_mod if backends._triton_mod is not None else _load_triton()
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
