"""Tests for scalebox_cst.runtime.recurrence.linear_recurrence.

The reference everywhere is the naive loop ``x = b[t] + a[t] * x``; the numba
CPU path (and impl="loop") must match it bitwise, the reassociated paths
(torch scan, triton) to a tolerance.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalebox_cst.runtime import recurrence as R
from scalebox_cst.runtime.recurrence import backends as RB
from scalebox_cst.runtime.recurrence import discounted_cumsum, linear_recurrence

HAS_NUMBA = R.backend_available("numba")
HAS_C = R.backend_available("c")
HAS_CUDA = torch.cuda.is_available()
needs_numba = pytest.mark.skipif(not HAS_NUMBA, reason="numba not installed")
needs_c = pytest.mark.skipif(not HAS_C, reason="C extension not built (no compiler at install)")
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")

HYP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- references


def _at(a, t):
    if isinstance(a, (torch.Tensor, np.ndarray, list)) and not (hasattr(a, "ndim") and a.ndim == 0):
        return a[0] if len(a) == 1 else a[t]
    return a


def naive(a, b, init=0.0, reverse=True):
    """The loop the transform replaces; returns the list of x[t] and the carry."""
    T = len(b)
    out = [None] * T
    x = init
    for t in reversed(range(T)) if reverse else range(T):
        x = b[t] + _at(a, t) * x
        out[t] = x
    return out, x


def naive_t(a, b, init=0.0, reverse=True):
    out, _ = naive(a, b, init, reverse)
    return torch.stack(out) if out else None


def make_case(seed, T, N, dtype, a_kind, init_kind, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    b = torch.randn(T, N, generator=g, dtype=torch.float64).to(dtype).to(device)
    gamma, lam = 0.99, 0.95
    if a_kind == "scalar":
        a = gamma
    elif a_kind == "full":
        a = (torch.rand(T, N, generator=g, dtype=torch.float64) * 1.2 - 0.1).to(dtype).to(device)
    elif a_kind == "mask":  # GAE: gamma * lambda * (1 - done)
        done = (torch.rand(T, N, generator=g) < 0.1).to(dtype).to(device)
        a = gamma * lam * (1 - done)
    elif a_kind == "time":  # per-step scalar, shape [T]
        a = (torch.rand(T, generator=g, dtype=torch.float64)).to(dtype).to(device)
    elif a_kind == "col":  # [T, 1]
        a = (torch.rand(T, 1, generator=g, dtype=torch.float64)).to(dtype).to(device)
    else:
        raise AssertionError(a_kind)
    if init_kind == "zero":
        init = 0.0
    elif init_kind == "scalar":
        init = 0.37
    else:
        init = torch.randn(N, generator=g, dtype=torch.float64).to(dtype).to(device)
    return a, b, init


A_KINDS = ["scalar", "full", "mask", "time", "col"]
INIT_KINDS = ["zero", "scalar", "tensor"]


# ---------------------------------------------------------------- exactness


@needs_numba
@HYP
@given(
    seed=st.integers(0, 2**31 - 1),
    T=st.integers(0, 300),
    N=st.integers(1, 8),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    a_kind=st.sampled_from(A_KINDS),
    init_kind=st.sampled_from(INIT_KINDS),
    reverse=st.booleans(),
)
def test_numba_bitwise_equals_naive_loop(seed, T, N, dtype, a_kind, init_kind, reverse):
    a, b, init = make_case(seed, T, N, dtype, a_kind, init_kind)
    out, last = linear_recurrence(a, b, init, reverse=reverse, return_last=True)
    assert out.dtype == dtype and out.shape == (T, N)
    if T == 0:
        assert last is init
        return
    ref, ref_last = naive(a, b, init, reverse)
    assert torch.equal(out, torch.stack(ref))
    assert torch.equal(last, ref_last)
    # forced backend gives the same bits
    assert torch.equal(linear_recurrence(a, b, init, reverse=reverse, impl="numba"), out)


@HYP
@given(
    seed=st.integers(0, 2**31 - 1),
    T=st.integers(1, 300),
    N=st.integers(1, 8),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    a_kind=st.sampled_from(A_KINDS),
    init_kind=st.sampled_from(INIT_KINDS),
    reverse=st.booleans(),
)
def test_torch_fallbacks(seed, T, N, dtype, a_kind, init_kind, reverse):
    a, b, init = make_case(seed, T, N, dtype, a_kind, init_kind)
    ref = naive_t(a, b, init, reverse)
    # sequential torch loop: exact
    assert torch.equal(linear_recurrence(a, b, init, reverse=reverse, impl="loop"), ref)
    # log-step scan: reassociated, within the documented bound relative to max |x| (cancellation
    # can leave an element far smaller than the terms it sums)
    scale = max(1.0, float(ref.abs().max())) if ref.numel() else 1.0
    eps = 1e-5 if dtype == torch.float32 else 1e-12
    tol = dict(rtol=eps, atol=eps * scale)
    out = linear_recurrence(a, b, init, reverse=reverse, impl="scan")
    assert out.dtype == dtype
    torch.testing.assert_close(out, ref, **tol)
    out = linear_recurrence(a, b, init, reverse=reverse, impl="torch")
    torch.testing.assert_close(out, ref, **tol)


@needs_numba
@pytest.mark.parametrize("N", [1, 3, 7, 8, 12, 33, 100])
@pytest.mark.parametrize("reverse", [True, False])
def test_numba_column_blocking_and_wide_rows(N, reverse):
    # covers the 8/4/2/1 register blocks and the row-wise kernel (N > 32)
    a, b, init = make_case(N, 257, N, torch.float32, "mask", "tensor")
    assert torch.equal(linear_recurrence(a, b, init, reverse=reverse), naive_t(a, b, init, reverse))
    a, b, init = make_case(N, 257, N, torch.float64, "scalar", "scalar")
    assert torch.equal(linear_recurrence(a, b, init, reverse=reverse), naive_t(a, b, init, reverse))


def test_gae_shapes_trailing_dims_and_dim():
    g = torch.Generator().manual_seed(0)
    b = torch.randn(64, 3, 4, generator=g)
    a = 0.9 * (torch.rand(64, 3, 4, generator=g) > 0.1).float()
    init = torch.randn(3, 4, generator=g)
    assert torch.equal(linear_recurrence(a, b, init), naive_t(a, b, init))
    # time axis last
    bt = b.permute(1, 2, 0).contiguous()
    at = a.permute(1, 2, 0).contiguous()
    out = linear_recurrence(at, bt, init, dim=-1)
    assert out.shape == bt.shape and out.is_contiguous()
    assert torch.equal(out, naive_t(a, b, init).permute(1, 2, 0))
    out2 = linear_recurrence(at, bt, init, dim=2)
    assert torch.equal(out, out2)
    # [T] a against [T, N] b, constant-in-time a [1, N]
    a1 = torch.rand(64, generator=g)
    assert torch.equal(linear_recurrence(a1, b[:, 0]), naive_t(a1, b[:, 0]))
    a2 = torch.rand(1, 3, generator=g)
    assert torch.equal(linear_recurrence(a2, b[:, :, 0]), naive_t(a2, b[:, :, 0]))
    # 1-D b with [T] a
    assert torch.equal(linear_recurrence(a1, b[:, 0, 0], 0.5), naive_t(a1, b[:, 0, 0], 0.5))


def test_discounted_cumsum():
    r = torch.randn(100, 2, dtype=torch.float64)
    assert torch.equal(discounted_cumsum(r, 0.99), naive_t(0.99, r))
    assert torch.equal(discounted_cumsum(r, 0.5, reverse=False), naive_t(0.5, r, reverse=False))


# ---------------------------------------------------------------- dtypes


def test_dtype_promotion_follows_the_naive_loop():
    g = torch.Generator().manual_seed(1)
    b = torch.randn(50, 3, generator=g)
    cases = [
        (torch.rand(50, 3, generator=g, dtype=torch.float64), b, 0.0),  # -> float64
        (torch.rand(50, generator=g, dtype=torch.float64), b, 0.0),  # 0-d slices -> float32
        (0.9, b, torch.tensor(0.7, dtype=torch.float64)),  # 0-d init -> float32
        (0.9, b, torch.randn(3, generator=g, dtype=torch.float64)),  # -> float64
        (0.9, torch.randint(0, 3, (50, 3), generator=g), 0.0),  # int b -> float32
        (torch.tensor(0.9, dtype=torch.float64), b, 0.25),  # 0-d a -> float32
        (0.9, b, 0.25),  # python scalars: the first product is a double
    ]
    for a, bb, init in cases:
        for reverse in (True, False):
            ref = naive_t(a, bb, init, reverse)
            out = linear_recurrence(a, bb, init, reverse=reverse)
            assert out.dtype == ref.dtype, (a, init)
            assert torch.equal(out, ref)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types(dtype):
    g = torch.Generator().manual_seed(2)
    b = torch.randn(20, 4, generator=g).to(dtype)
    a = (torch.rand(20, 4, generator=g) * 0.99).to(dtype)
    # short: the exact torch loop
    assert torch.equal(linear_recurrence(a, b), naive_t(a, b))
    assert torch.equal(linear_recurrence(0.9, b, 0.5), naive_t(0.9, b, 0.5))
    # long: scan accumulated in float32, one rounding at the end
    b = torch.randn(200, 4, generator=g).to(dtype)
    a = (torch.rand(200, 4, generator=g) * 0.9).to(dtype)
    out = linear_recurrence(a, b)
    assert out.dtype == dtype
    ref = naive_t(a.double(), b.double())
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=5e-2)


# ---------------------------------------------------------------- containers


def test_numpy_inputs():
    rng = np.random.default_rng(0)
    for dt in (np.float32, np.float64):
        b = rng.standard_normal((120, 5)).astype(dt)
        a = (rng.random((120, 5)) * 0.99).astype(dt)
        init = rng.standard_normal(5).astype(dt)
        for reverse in (True, False):
            out, last = linear_recurrence(a, b, init, reverse=reverse, return_last=True)
            ref, ref_last = naive(a, b, init, reverse)
            assert isinstance(out, np.ndarray) and out.dtype == dt
            np.testing.assert_array_equal(out, np.stack(ref))
            np.testing.assert_array_equal(last, ref_last)
            np.testing.assert_array_equal(linear_recurrence(0.95, b, 0.3, reverse=reverse),
                                          np.stack(naive(0.95, b, 0.3, reverse)[0]))
    b = rng.standard_normal((40, 2)).astype(np.float32)
    # numpy scalars are strong (NEP 50): float64 gamma promotes
    out = linear_recurrence(np.float64(0.9), b)
    ref = np.stack(naive(np.float64(0.9), b)[0])
    assert out.dtype == ref.dtype == np.float64
    np.testing.assert_array_equal(out, ref)
    # read-only input
    b.flags.writeable = False
    np.testing.assert_array_equal(linear_recurrence(0.9, b), np.stack(naive(0.9, b)[0]))
    e = linear_recurrence(0.9, np.empty((0, 3), np.float32))
    assert e.shape == (0, 3) and e.dtype == np.float32


def test_python_float_lists():
    rng = np.random.default_rng(1)
    b = [float(v) for v in rng.standard_normal(77)]
    a = [float(v) for v in rng.random(77)]
    for reverse in (True, False):
        out, last = linear_recurrence(0.97, b, 1.5, reverse=reverse, return_last=True)
        ref, ref_last = naive(0.97, b, 1.5, reverse)
        assert out == ref and last == ref_last
        assert all(type(v) is float for v in out) and type(last) is float
        assert linear_recurrence(a, b, reverse=reverse) == naive(a, b, 0.0, reverse)[0]
    assert linear_recurrence(0.9, []) == []
    assert linear_recurrence(0.9, [], 2.0, return_last=True) == ([], 2.0)


def test_lists_of_tensors():
    g = torch.Generator().manual_seed(3)
    b1 = list(torch.randn(30, 4, generator=g))
    b0 = list(torch.randn(30, generator=g))
    for b, init in ((b1, torch.zeros(4)), (b0, 0.5)):
        out, last = linear_recurrence(0.9, b, init, return_last=True)
        ref, ref_last = naive(0.9, b, init)
        assert isinstance(out, list) and len(out) == 30
        assert all(torch.equal(o, r) for o, r in zip(out, ref))
        assert torch.equal(last, ref_last)
    masks = [0.9 * (1 - d) for d in (torch.rand(30, 4, generator=g) < 0.2).float()]
    out = linear_recurrence(masks, b1)
    assert all(torch.equal(o, r) for o, r in zip(out, naive(masks, b1)[0]))


def test_empty_tensor_and_return_last():
    b = torch.empty(0, 3)
    out, last = linear_recurrence(0.9, b, 0.0, return_last=True)
    assert out.shape == (0, 3) and out.dtype == torch.float32 and last == 0.0
    init = torch.ones(3)
    assert linear_recurrence(0.9, b, init, return_last=True)[1] is init
    assert linear_recurrence(torch.empty(0, 3, dtype=torch.float64), b).dtype == torch.float64
    b = torch.randn(10, 3)
    out, last = linear_recurrence(0.9, b, init, reverse=False, return_last=True)
    assert torch.equal(last, out[-1])


# ---------------------------------------------------------------- autograd


@pytest.mark.parametrize("impl", ["auto", "scan", "loop"])
@pytest.mark.parametrize("reverse", [True, False])
def test_gradcheck(impl, reverse):
    g = torch.Generator().manual_seed(4)
    dt = torch.float64
    b = torch.randn(7, 3, generator=g, dtype=dt, requires_grad=True)
    a = (torch.rand(7, 3, generator=g, dtype=dt) * 0.9).requires_grad_()
    i = torch.randn(3, generator=g, dtype=dt, requires_grad=True)
    f = lambda a, b, i: linear_recurrence(a, b, i, reverse=reverse, impl=impl)  # noqa: E731
    assert torch.autograd.gradcheck(f, (a, b, i))
    # broadcast a ([T, 1], [T]) and scalar init
    a1 = (torch.rand(7, 1, generator=g, dtype=dt)).requires_grad_()
    a0 = (torch.rand(7, generator=g, dtype=dt)).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: linear_recurrence(a, b, 0.5, reverse=reverse, impl=impl), (a1, b))
    assert torch.autograd.gradcheck(lambda a, i: linear_recurrence(a, b, i, reverse=reverse, impl=impl), (a0, i))
    # scalar a, grads wrt b and init only
    assert torch.autograd.gradcheck(lambda b, i: linear_recurrence(0.8, b, i, reverse=reverse, impl=impl), (b, i))


def test_gradgradcheck():
    g = torch.Generator().manual_seed(5)
    dt = torch.float64
    b = torch.randn(5, 2, generator=g, dtype=dt, requires_grad=True)
    a = (torch.rand(5, 2, generator=g, dtype=dt) * 0.9).requires_grad_()
    i = torch.randn(2, generator=g, dtype=dt, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda a, b, i: linear_recurrence(a, b, i), (a, b, i))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_match_naive_loop(dtype):
    a, b, init = make_case(6, 150, 4, dtype, "mask", "tensor")
    a = (a * 1.0).requires_grad_()
    b = b.clone().requires_grad_()
    init = init.clone().requires_grad_()
    w = torch.randn(150, 4, dtype=dtype)
    out, last = linear_recurrence(a, b, init, return_last=True)
    (out * w).sum().add(last.sum()).backward()
    grads = [t.grad.clone() for t in (a, b, init)]
    for t in (a, b, init):
        t.grad = None
    ref, ref_last = naive(a, b, init)
    (torch.stack(ref) * w).sum().add(ref_last.sum()).backward()
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    for got, t in zip(grads, (a, b, init)):
        torch.testing.assert_close(got, t.grad, **tol)


def test_no_grad_mode_skips_autograd():
    b = torch.randn(10, 2, requires_grad=True)
    with torch.no_grad():
        out = linear_recurrence(0.9, b)
    assert not out.requires_grad


# ---------------------------------------------------------------- plumbing


def test_torch_fallback_when_numba_missing(monkeypatch):
    monkeypatch.setattr(RB, "_numba_mod", False)
    a, b, init = make_case(7, 100, 3, torch.float32, "mask", "tensor")
    torch.testing.assert_close(linear_recurrence(a, b, init), naive_t(a, b, init), rtol=1e-5, atol=1e-5)
    a, b, init = make_case(7, 20, 3, torch.float32, "mask", "tensor")
    assert torch.equal(linear_recurrence(a, b, init), naive_t(a, b, init))  # T <= 32: loop
    with pytest.raises(RuntimeError):
        linear_recurrence(a, b, init, impl="numba")


@needs_numba
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("M", [1, 3, 8])
def test_numpy_loop_is_bitwise_numba(dtype, M):
    """The loop ``"auto"`` rents before numba is loaded computes exactly what the kernel does."""
    rng = np.random.default_rng(M)
    for T in (0, 1, 7, 300):
        for a in (rng.random((T, M)).astype(dtype), dtype(0.97), rng.random((1, M)).astype(dtype)):
            if isinstance(a, np.ndarray) and a.shape[0] == 1:
                a = np.broadcast_to(a, (T, M))  # a 0-stride operand, as _flat passes it
            b = rng.standard_normal((T, M)).astype(dtype)
            init = rng.standard_normal(M).astype(dtype)
            for reverse in (True, False):
                mine, theirs = np.empty((T, M), dtype), np.empty((T, M), dtype)
                RB._numpy_rec(a, b, init, mine, reverse)
                RB._load_numba().rec(a, b, init, theirs, reverse)
                assert mine.tobytes() == theirs.tobytes()


def test_bad_arguments():
    b = torch.randn(10, 2)
    with pytest.raises(ValueError):
        linear_recurrence(0.9, b, impl="nope")
    with pytest.raises(ValueError):
        linear_recurrence(torch.rand(7, 2), b)
    with pytest.raises(ValueError):
        linear_recurrence(0.9, torch.tensor(1.0))


@needs_numba
def test_lazy_numba_import_and_cache_dir(tmp_path):
    code = textwrap.dedent(
        """
        import os, sys
        import scalebox_cst.runtime.recurrence as R
        import scalebox_cst.runtime.recurrence.backends as RB
        assert "numba" not in sys.modules, "numba imported at module import"
        import torch
        out = R.linear_recurrence(0.5, torch.ones(4, 2))
        assert "numba" not in sys.modules, "numba loaded before the numpy loop paid for it"
        assert 0 < RB._rent_spent < RB._RENT_BUDGET_S
        RB._rent_spent = RB._RENT_BUDGET_S  # as after ~0.4 s of calls
        out2 = R.linear_recurrence(0.5, torch.ones(4, 2))
        assert "numba" in sys.modules
        assert torch.equal(out, out2)
        assert RB._numba_mod, "numba backend failed to load"
        print(os.environ["NUMBA_CACHE_DIR"])
        """
    )
    env = dict(os.environ)
    env.pop("NUMBA_CACHE_DIR", None)
    env["SCALEBOX_RECURRENCE_C"] = "0"  # the numpy-then-numba route, as without a compiler
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    cache = tmp_path / "xdg" / "scalebox_cst" / "numba"
    assert res.stdout.strip() == str(cache)
    assert any(p.suffix == ".nbi" for p in cache.rglob("*")), "numba wrote no cache index"
    # a user-set NUMBA_CACHE_DIR is left alone (pointed at the cache just
    # written, so this run loads instead of compiling)
    env["XDG_CACHE_HOME"] = str(tmp_path / "other")
    env["NUMBA_CACHE_DIR"] = str(cache)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(cache)
    assert not (tmp_path / "other").exists()


# ---------------------------------------------------------------- the C extension


def _c_rec():
    return RB._load_c().rec


def _a_variants(rng, T, M, dtype):
    """a as the CPU paths pass it: full, numpy scalar, Python float, 0-stride rows / columns."""
    yield rng.random((T, M)).astype(dtype)
    yield dtype(0.97)
    yield 0.9712345678901234  # rounded to the dtype once, as numpy's dtype(a) does
    yield np.broadcast_to(rng.random((1, M)).astype(dtype), (T, M))
    yield np.broadcast_to(rng.random((T, 1)).astype(dtype), (T, M))


@needs_c
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("M", [1, 2, 3, 5, 8, 9, 17, 64, 70, 130])
def test_c_kernel_bitwise_equals_numpy_loop(dtype, M):
    """Every column block (64 / 8 / 4 / 2 / 1, and the strided path) computes the loop's bits."""
    rng = np.random.default_rng(M)
    rec = _c_rec()
    for T in (0, 1, 2, 7, 300):
        for a in _a_variants(rng, T, M, dtype):
            b = rng.standard_normal((T, M)).astype(dtype)
            init = rng.standard_normal(M).astype(dtype)
            ref_a = dtype(a) if type(a) is float else a
            for reverse in (True, False):
                ref, mine = np.empty((T, M), dtype), np.empty((T, M), dtype)
                RB._numpy_rec(ref_a, b, init, ref, reverse)
                rec(a, b, init, mine, reverse)
                assert mine.tobytes() == ref.tobytes()
                # strided b / init / out (Fortran order, every other element) give the same bits
                bf = np.asfortranarray(b)
                wide = np.repeat(init, 2)[::2]
                of = np.empty((M, T), dtype).T
                rec(a, bf, wide, of, reverse)
                assert np.ascontiguousarray(of).tobytes() == ref.tobytes()


@needs_c
@HYP
@given(
    seed=st.integers(0, 2**31 - 1),
    T=st.integers(1, 64),
    N=st.integers(1, 12),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    a_kind=st.sampled_from(A_KINDS),
    init_kind=st.sampled_from(INIT_KINDS),
    reverse=st.booleans(),
    layout=st.sampled_from(["contiguous", "transposed", "strided"]),
)
def test_c_bitwise_equals_naive_loop(seed, T, N, dtype, a_kind, init_kind, reverse, layout):
    a, b, init = make_case(seed, T, N, dtype, a_kind, init_kind)
    if layout == "transposed":  # non-contiguous [T, N] views of the same values
        b = b.t().contiguous().t()
        a = a.t().contiguous().t() if isinstance(a, torch.Tensor) and a.ndim == 2 else a
    elif layout == "strided":
        b = torch.stack([b, b], -1)[..., 0]
    assert R.cpu_backend() == "c"
    ref, ref_last = naive(a, b, init, reverse)
    for impl in ("auto", "c"):
        out, last = linear_recurrence(a, b, init, reverse=reverse, return_last=True, impl=impl)
        assert out.dtype == ref[0].dtype and torch.equal(out, torch.stack(ref))
        assert torch.equal(last, ref_last)


def _raw_kernel(fused):
    """A ``rec_ptr`` in Python for one step at T = M = 1 (ctypes reads the addresses): the
    product rounded before the add, or not at all (what an FMA does)."""
    import ctypes

    def rec_ptr(kind, T, M, reverse, a, sa0, sa1, a_scalar, b, sb0, sb1, init, si, init_scalar, out, so0, so1):
        ct = ctypes.c_float if kind == "f" else ctypes.c_double
        av, bv, xv = (ct.from_address(p).value for p in (a, b, init))
        if fused:  # exact product and sum in float64, one rounding (exact for the float32 probe)
            r = bv + av * xv if kind == "f" else float(np.longdouble(bv) + np.longdouble(av) * np.longdouble(xv))
        else:
            p = np.float32(av) * np.float32(xv) if kind == "f" else av * xv
            r = np.float32(bv) + p if kind == "f" else bv + p
        ct.from_address(out).value = float(r)

    return rec_ptr


def test_c_fma_probe_rejects_a_fused_kernel():
    """A build that contracts ``b + a * x`` into an FMA is caught at load time, not used."""
    assert RB._fma_free(_raw_kernel(fused=False))
    assert not RB._fma_free(_raw_kernel(fused=True))
    if HAS_C:
        assert RB._fma_free(RB._load_c().rec_ptr)


@needs_c
def test_c_kernel_refuses_what_it_cannot_read():
    rec = _c_rec()
    b = np.zeros((4, 3), np.float32)
    out = np.empty_like(b)
    with pytest.raises(TypeError):
        rec(np.zeros((4, 3), np.float64), b, np.zeros(3, np.float32), out, True)  # mixed dtypes
    with pytest.raises(TypeError):
        rec(0.9, np.zeros((4, 3), np.int32), np.zeros(3, np.int32), np.zeros((4, 3), np.int32), True)
    with pytest.raises(ValueError):
        rec(0.9, b, np.zeros(2, np.float32), out, True)  # init of another width
    with pytest.raises(ValueError):
        rec(0.9, b, np.zeros(3, np.float32), np.empty((4, 2), np.float32), True)
    ro = np.empty_like(b)
    ro.flags.writeable = False
    with pytest.raises((TypeError, ValueError, BufferError)):
        rec(0.9, b, np.zeros(3, np.float32), ro, True)
    raw = np.zeros(4 * 3 * 4 + 1, np.uint8)[1:].view(np.float32).reshape(4, 3)  # misaligned
    with pytest.raises(ValueError):
        rec(0.9, raw, np.zeros(3, np.float32), out, True)


def test_fallback_when_c_extension_missing(monkeypatch):
    """No compiler at install: the import fails, ``"auto"`` takes the numba / numpy loop (same
    bits), ``impl="c"`` says it is unavailable."""
    import scalebox_cst.runtime as pkg

    monkeypatch.setitem(sys.modules, "scalebox_cst.runtime._recurrence_c", None)  # import -> ImportError
    monkeypatch.delattr(pkg, "_recurrence_c", raising=False)
    monkeypatch.setattr(RB, "_c_mod", None)
    assert not R.backend_available("c")
    assert R.cpu_backend() in ("numba", "numpy")
    for dtype in (torch.float32, torch.float64):
        a, b, init = make_case(12, 200, 5, dtype, "mask", "tensor")
        assert torch.equal(linear_recurrence(a, b, init), naive_t(a, b, init))
        assert torch.equal(linear_recurrence(0.9, b), naive_t(0.9, b))
    with pytest.raises(RuntimeError):
        linear_recurrence(a, b, init, impl="c")


def test_stale_or_disabled_c_extension_is_not_used(monkeypatch):
    stale = type(sys)("scalebox_cst.runtime._recurrence_c")
    stale.VERSION = RB._C_VERSION - 1
    stale.rec = RB._numpy_rec
    stale.rec_ptr = _raw_kernel(fused=False)
    import scalebox_cst.runtime as pkg

    monkeypatch.setitem(sys.modules, "scalebox_cst.runtime._recurrence_c", stale)
    monkeypatch.setattr(pkg, "_recurrence_c", stale, raising=False)
    monkeypatch.setattr(RB, "_c_mod", None)
    assert not RB._load_c()
    monkeypatch.undo()
    monkeypatch.setattr(RB, "_c_mod", None)
    monkeypatch.setenv("SCALEBOX_RECURRENCE_C", "0")
    assert not RB._load_c()


def test_a_layout_the_c_kernel_refuses_falls_back_exactly(monkeypatch):
    """Whatever the extension raises on, the call is redone on the numba / numpy loop."""
    calls = []

    def refusing(a, b, init, out, reverse):
        calls.append(b.shape)
        raise ValueError("rec: misaligned or odd strides")

    def refusing_ptr(kind, T, M, *rest):
        calls.append((T, M))
        raise ValueError("rec_ptr: bad sizes or misaligned addresses")

    fake = type(sys)("fake_c")
    fake.rec = refusing
    fake.rec_ptr = refusing_ptr
    monkeypatch.setattr(RB, "_c_mod", fake)
    a, b, init = make_case(13, 90, 3, torch.float32, "full", "tensor")
    for bb in (b, b.t().contiguous().t()):  # the fast path and the general path
        assert torch.equal(linear_recurrence(a, bb, init), naive_t(a, bb, init))
    assert len(calls) >= 2
    for init in (0.0, 0.5, torch.randn(3)):  # the raw-address entry, every scalar / tensor mix
        for a_ in (0.9, a):
            if isinstance(init, float) and init and isinstance(a_, float):
                continue  # the general path: a Python-float product a * init
            assert torch.equal(linear_recurrence(a_, b, init), naive_t(a_, b, init))


@needs_c
def test_fresh_process_uses_c_at_once():
    code = textwrap.dedent(
        """
        import sys
        import torch
        import scalebox_cst.runtime.recurrence as R
        import scalebox_cst.runtime.recurrence.backends as RB
        b = torch.randn(2048, 8); a = torch.rand(2048, 8)
        out = R.linear_recurrence(a, b)
        assert R.cpu_backend() == "c", R.cpu_backend()
        assert "numba" not in sys.modules, "numba loaded although the C kernel is there"
        assert RB._rent_spent == 0.0
        """
    )
    env = dict(os.environ)
    env.pop("SCALEBOX_RECURRENCE_C", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


# ---------------------------------------------------------------- CUDA / triton


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(1, 1), (2048, 8), (1000, 37), (333, 1024), (70, 3, 5)])
@pytest.mark.parametrize("a_kind", ["scalar", "mask", "time", "col"])
@pytest.mark.parametrize("reverse", [True, False])
def test_cuda_matches_reference(dtype, shape, a_kind, reverse):
    T, N = shape[0], int(np.prod(shape[1:]))
    a, b, init = make_case(T * 31 + N, T, N, dtype, a_kind, "tensor")
    b = b.reshape(shape)
    init = init.reshape(shape[1:])
    if isinstance(a, torch.Tensor) and a.ndim == 2 and a.shape[1] == N:
        a = a.reshape(shape)
    ref = naive_t(a, b.double(), init.double(), reverse)
    cuda = lambda x: x.cuda() if isinstance(x, torch.Tensor) else x  # noqa: E731
    for impl in ("auto", "scan"):
        out = linear_recurrence(cuda(a), cuda(b), cuda(init), reverse=reverse, impl=impl)
        assert out.device.type == "cuda" and out.dtype == dtype and out.shape == b.shape
        tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(out.cpu().double(), ref, **tol)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_half(dtype):
    a, b, init = make_case(9, 500, 8, torch.float32, "mask", "zero")
    out = linear_recurrence(a.cuda().to(dtype), b.cuda().to(dtype), 0.0)
    assert out.dtype == dtype
    ref = naive_t(a.to(dtype).double(), b.to(dtype).double())
    torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-2, atol=5e-2)


@needs_cuda
def test_cuda_scalar_init_and_gradients():
    a, b, init = make_case(10, 300, 4, torch.float64, "mask", "scalar")
    a, b = a.cuda().requires_grad_(), b.cuda().requires_grad_()
    out = linear_recurrence(a, b, init)
    ref = naive_t(a.detach().cpu(), b.detach().cpu(), init)
    torch.testing.assert_close(out.detach().cpu(), ref, rtol=1e-10, atol=1e-10)
    out.sum().backward()
    a2, b2 = a.detach().cpu().requires_grad_(), b.detach().cpu().requires_grad_()
    naive_t(a2, b2, init).sum().backward()
    torch.testing.assert_close(a.grad.cpu(), a2.grad, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(b.grad.cpu(), b2.grad, rtol=1e-9, atol=1e-9)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_fast_path_scalars_and_last(dtype):
    a, b, _ = make_case(11, 1500, 8, dtype, "mask", "zero")
    for reverse in (True, False):
        for a_, init in ((0.97, 0.5), (a, 0.0), (a, torch.randn(8, dtype=dtype))):
            ref = naive_t(a_, b.double(), init.double() if isinstance(init, torch.Tensor) else init, reverse)
            cuda = lambda x: x.cuda() if isinstance(x, torch.Tensor) else x  # noqa: E731
            out, last = linear_recurrence(cuda(a_), b.cuda(), cuda(init), reverse=reverse, return_last=True)
            tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(out.cpu().double(), ref, **tol)
            assert torch.equal(last, out[0] if reverse else out[-1])
