"""One call for a whole backward affine recurrence: the loop body's arithmetic, the loop, the stores.

Why: the vectorized rewrite of a GAE loop runs a dozen small torch ops per call around the exact
recurrence kernel, and on a CPU each costs 5-10 us of dispatch whatever its size, so the rewrite
of a T=2048 loop spent more time in dispatch than in arithmetic. Here the rewritten code hands the
loop body itself, as text, to :func:`fused_linear`, which compiles it once into a small program
for the C extension ``_fused_c`` (built at install, optional) and runs it: block by block over
the rows, then the recurrence, in one call. Where anything is outside what the kernel reproduces
bitwise it returns None without touching a value, and the rewritten code takes its general path.

The program is the body of ``for t in range(T - 1, -1, -1):`` as ``;``-separated statements
(grammar: :mod:`scalebox_cst.fused_program`): tail statements ``X[T] = NAME`` first (at t = T-1 a read
``X[t + 1]`` reads NAME: the body's last-step case), then assignments of temporaries, outputs
``OUT[t]`` and, last, the carried update ``S = B + A * S``.

Torch semantics reproduced (the reference is the torch loop on CPU): a Python number meeting a
tensor is rounded to the tensor's dtype first; constant-only subexpressions (``gamma * lam``) are
Python arithmetic; ``c / x`` is torch's ``x.reciprocal() * c``; the first step's ``A * S`` with a
constant A and a Python-number S is a Python product.
"""
from __future__ import annotations

import functools
import math
import os
import sys
from typing import Any, List, Optional

import torch

from scalebox_cst.fused_program import _PROGRAMS, params_of, program as _program


def _load():
    """The C extension, or None: not built, a stale in-place build, or ``$SCALEBOX_FUSED_C=0``
    (the route of a machine without a compiler, for benchmarks and tests)."""
    if os.environ.get("SCALEBOX_FUSED_C", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:  # optional: built by setup.py where a compiler is present
        from . import _fused_c
    except ImportError:  # pragma: no cover - depends on the build
        return None
    return _fused_c if getattr(_fused_c, "VERSION", 0) == 3 else None


_C = _load()

__all__ = ["fused_linear", "params_of", "available"]

_Tensor = torch.Tensor
_NUMBERS = (int, float, bool)
_KIND = {torch.float32: "f", torch.float64: "d"}
_INT_LIMIT = 2 ** 53  # Python ints exactly representable as doubles (torch rounds int64 once)
_FLOAT32_MAX = 3.4028234663852886e38


def available() -> bool:
    """Whether the C extension is built (without it :func:`fused_linear` always returns None)."""
    return _C is not None



def _number(v: Any) -> Optional[float]:
    if type(v) not in _NUMBERS or (type(v) is int and not -_INT_LIMIT < v < _INT_LIMIT):
        return None
    return float(v)


def _plain(x: Any, dtype: Any, grad: bool) -> bool:
    """A tensor the kernel reads or writes as raw memory: exactly ``torch.Tensor``, of ``dtype``, on
    the CPU, contiguous, no neg bit (its memory would hold the other sign), no grad under grad mode."""
    return type(x) is _Tensor and x.dtype is dtype and x.is_cpu and x.is_contiguous() and not x.is_neg() \
        and not (grad and x.requires_grad)


class _Torch:
    """The values of a loop over tensors: what the kernel may take, and where their memory is."""

    numpy = False

    def __init__(self, dtype: Any) -> None:
        self.dtype = dtype
        self.grad = torch.is_grad_enabled()
        self.inference = torch.is_inference_mode_enabled()
        self.kind = _KIND.get(dtype)

    def plain(self, x: Any) -> bool:
        return _plain(x, self.dtype, self.grad)

    def writable(self, x: Any) -> bool:  # (the loop's `out[t] = ...` raises on an inference tensor outside it)
        return self.plain(x) and (self.inference or not x.is_inference())

    @staticmethod
    def ptr(x: Any) -> int:
        return x.data_ptr()

    def empty(self, shape: tuple) -> Any:
        return torch.empty(shape, dtype=self.dtype)

    @staticmethod
    def number(last: Any) -> Any:  # the carried value computed from numbers per step: 0-d, as in the loop
        return last[0].clone() if last.dim() else last  # (one element per kernel column, or already 0-d)


class _NumPy:
    """The values of a loop over numpy arrays (NumPy 2: a Python number meeting an array is rounded
    to its dtype, as torch does; NumPy 1's value-based casting computes numpy scalars in float64)."""

    numpy = True

    def __init__(self, np: Any, dtype: Any, kinds: dict) -> None:
        self.np = np
        self.dtype = dtype
        self.kind = kinds.get(dtype)

    def plain(self, x: Any) -> bool:
        if type(x) is not self.np.ndarray or x.dtype != self.dtype:
            return False
        f = x.flags
        return f.c_contiguous and f.aligned and x.dtype.isnative

    def writable(self, x: Any) -> bool:
        return self.plain(x) and x.flags.writeable

    @staticmethod
    def ptr(x: Any) -> int:
        return x.__array_interface__["data"][0]

    def empty(self, shape: tuple) -> Any:
        return self.np.empty(shape, dtype=self.dtype)

    @staticmethod
    def number(last: Any) -> Any:  # numbers per step are numpy scalars: the loop's value is one too
        return last[()] if last.ndim == 0 else last[0]


@functools.lru_cache(maxsize=None)
def _numpy_kinds(np: Any) -> Optional[dict]:
    """numpy dtype -> kernel kind under NumPy 2; None under NumPy 1 (once per process, not per call)."""
    if int(np.__version__.split(".")[0]) < 2:
        return None
    return {np.dtype(np.float32): "f", np.dtype(np.float64): "d"}


def _values_of(x0: Any) -> Any:
    """The value family of the first sequence: tensors, numpy arrays (NumPy 2), or None."""
    if type(x0) is _Tensor:
        return _Torch(x0.dtype)
    np = sys.modules.get("numpy")
    if np is not None and type(x0) is np.ndarray:
        kinds = _numpy_kinds(np)
        if kinds is not None:
            return _NumPy(np, x0.dtype, kinds)
    return None


def fused_linear(program: str, T: Any, *values: Any, stop: int = 0) -> Any:
    """Run ``for t in range(T - 1, stop - 1, -1): <program>`` in one call and return the carried
    value's final value (True where the program ends in ``del S``: the caller does not need it);
    or None, having touched nothing, when that is not bitwise what the loop does here (no C
    extension, a program outside the grammar, values of other kinds: see the module docstring).
    The values are the program's parameters in :func:`params_of` order; ``stop`` (0 or 1) leaves
    the steps below it to the caller (the last step run as written). Never raises: a value whose
    metadata cannot be read (a sparse or wrapped tensor) is one the kernel does not take."""
    try:
        return _fused(program, T, values, stop)
    except Exception:  # every check precedes the kernel's first write: nothing was touched
        return None


def _fused(program: str, T: Any, values: tuple, stop: int) -> Any:
    p = _PROGRAMS.get(program)
    if p is None:
        if _C is None or program in _PROGRAMS:
            return None
        p = _program(program)
        if p is None:
            return None
    if type(T) is not int or T < 2 or len(values) != p.nparams or stop not in (0, 1) or (stop and not p.need_last and not p.memo):
        return None
    x0 = values[p.seq_info[0][0]]
    lib = _values_of(x0)  # tensors, or numpy arrays
    if lib is None or lib.kind is None or (lib.numpy and p.recip):  # (numpy's c / x is one division,
        return None  # torch's the reciprocal times c: two roundings)
    kind = lib.kind
    # ---- the arrays (sequences, tails, outputs): exact type, one float dtype, CPU, contiguous;
    # their shapes (one row shape, or a number per step), lengths, addresses
    spec = []
    row = None
    seqs = []  # (start, end) of each input's memory
    wide = None  # the carried value's shape where a tail or its start value has leading ones
    s_row = False  # whether the carried value has the row shape (else it is computed from numbers
    # per step and constants only: 0-d in the loop, one value replicated over the kernel's columns)
    for si, (i, j, k) in enumerate(p.seq_info):
        x = values[i]
        if not lib.plain(x):
            return None
        sh = tuple(x.shape)
        n = len(sh)
        if n == 0:
            return None
        if n > 1:
            s_row = s_row or si in p.feed_seqs
            if row is None:
                row = sh[1:]
            elif sh[1:] != row:
                return None
        if j >= 0:  # tailed: at t = T - 1, X[t + 1] is the tail
            tail = values[j]
            if not lib.plain(tail) or sh[0] < T:
                return None
            ts = tuple(tail.shape)
            if ts != sh[1:]:  # a row with leading ones ([1, N], CleanRL's next_value.reshape(1, -1)) makes
                # the carried value [1, N] from the first step on: the same numbers, that shape
                if n < 2 or len(ts) <= n - 1 or ts[len(ts) - n + 1:] != sh[1:] or math.prod(ts) != math.prod(sh[1:]) \
                        or (si, 1) not in p.feeds:
                    return None
                if wide is None or len(ts) > len(wide):
                    wide = ts
            tp = lib.ptr(tail)
            seqs.append((tp, tp + tail.nbytes))
        else:
            if sh[0] < T + k:
                return None
            tp = 0
        xp = lib.ptr(x)
        seqs.append((xp, xp + x.nbytes))
        spec.append([xp, n, tp])
    if row is None:
        row = ()
        R = 1
    else:
        R = math.prod(row)
        if R < 1:
            return None
    size = 4 if kind == "f" else 8
    for e in spec:  # widths; the rows from ``stop`` on
        e[1] = 1 if e[1] == 1 else R
        e[0] += stop * e[1] * size
    outs = []
    written = []
    for i in p.out_pos:
        o = values[i]
        if not lib.writable(o):
            return None
        sh = tuple(o.shape)
        if len(sh) < 1 or sh[1:] != row or sh[0] < T:
            return None
        op = lib.ptr(o)
        end = op + o.nbytes
        for lo, hi in seqs:  # outputs share no memory with an input or another output
            if lo < end and op < hi:
                return None
        for lo, hi in outs:
            if lo < end and op < hi:
                return None
        outs.append((op, end))
        written.append(o)
    init = values[p.init_pos] if not p.memo else None
    if p.memo:  # the carried value lives in that output: its row T (never written) is the start
        o = values[p.out_pos[0]]
        if o.shape[0] < T + 1:
            return None
        init_arg = (lib.ptr(o) + T * R * size, R, 0.0)
        init_num = None
    elif type(init) is type(x0):
        if not lib.plain(init):
            return None
        ish = tuple(init.shape)
        if ish not in ((), row):  # a row with leading ones: the carried value's shape
            if not row or len(ish) <= len(row) or ish[len(ish) - len(row):] != row or math.prod(ish) != R:
                return None
            if wide is None or len(ish) > len(wide):
                wide = ish
        s_row = s_row or len(ish) > 0
        ip = lib.ptr(init)
        end = ip + init.nbytes
        for lo, hi in outs:
            if lo < end and ip < hi:
                return None
        init_arg = (ip, 1 if not ish else R, 0.0)
        init_num = None
    else:
        init_num = _number(init)
        if init_num is None or p.row_mode:  # (as written, the first step would be Python arithmetic
            return None  # on a number until it meets a tensor: left to the loop)
        init_arg = (0, 1, init_num)
    # ---- the scalars: parameters, literals, then the body's constant-only arithmetic, in Python
    sv: List[Any] = [values[i] for i in p.const_pos]
    for i in p.sub_consts:
        if type(sv[i]) is bool:  # torch refuses `tensor - True`: the loop raises, left to it
            return None
    sv += p.literals
    try:
        for _slot, fn, x, y in p.prelude:
            sv.append(fn(sv[x]) if y < 0 else fn(sv[x], sv[y]))
        cs = tuple(map(_number, sv))
    except (ArithmeticError, TypeError, ValueError):
        return None  # the loop raises it (or another type's arithmetic): left to the loop
    if None in cs:
        return None
    if lib.numpy and kind == "f" and any(math.isfinite(c) and abs(c) > _FLOAT32_MAX for c in cs):
        return None  # numpy warns where it rounds a number past float32's range to inf: left to the loop
    p0 = None
    if init_num is not None and p.a[0] == 0:  # the first step's A * S is a Python product
        try:  # (an int product past 2**53 is refused: torch rounds it to float32 once, not via a double)
            p0 = _number(sv[p.a[1]] * init)
        except (ArithmeticError, TypeError, ValueError):
            return None
        if p0 is None:
            return None
    spec_t = tuple(map(tuple, spec))
    out_t = tuple([o[0] + stop * R * size for o in outs])
    if p.need_last:
        last = lib.empty(wide if wide is not None else row if s_row else () if R == 1 else (R,))
        lp = lib.ptr(last)
    else:
        last = None
        lp = 0
    if p.row_mode:
        _C.run(kind, T - stop, R, p.code_t, p.npre, spec_t, cs, p.a, p.b, init_arg, p0, out_t, p.ns, lp,
               p.row_code, p.nrt)
    else:
        _C.run(kind, T - stop, R, p.code_t, p.npre, spec_t, cs, p.a, p.b, init_arg, p0, out_t, p.ns, lp)
    if last is not None and not s_row and wide is None:
        last = lib.number(last)  # the loop's carried value is 0-d (a numpy scalar for arrays)
    if not lib.numpy:
        # the loop's `out[t] = ...` bumps each output's version: a tensor autograd saved before the
        # loop then fails backward instead of using the new values; so does one written here
        _bump(written)
    return last if last is not None else True


_bump = getattr(torch._C, "_increment_version", None) or torch.autograd.graph.increment_version
