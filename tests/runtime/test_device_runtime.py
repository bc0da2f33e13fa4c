"""The NPU runtime helpers, differentially against the torch calls they replace, and the exactness
claims of the device table on this machine's CPU.

The helpers run with the stand-in's kernels loaded from ``tests/fake_torch_npu/torch_npu/_kernels.py``
alone (no import side effects in this process), once declaring CPU tensors as theirs (the kernel
path) and once as the real torch_npu does (``npu`` tensors only: every CPU tensor takes the else
branch, which must be the user's call, bitwise).
"""
from __future__ import annotations

from conftest import TESTS  # tests/: the corpus, fake_torch_npu and the repository root beside it
import harness
import os
import sys
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalebox_cst.runtime import npu as rt

HERE = TESTS
KERNELS = os.path.join(HERE, "fake_torch_npu", "torch_npu", "_kernels.py")


def _load_kernels():
    return harness.load_path(KERNELS, "scalebox_test_fake_npu_kernels")


K = _load_kernels()


@pytest.fixture(params=["cpu", "npu"], ids=["kernel-path", "else-path"])
def npu(request, monkeypatch):
    fake = types.SimpleNamespace(
        npu_gelu=K.npu_gelu,
        npu_fast_gelu=K.npu_fast_gelu,
        npu_rms_norm=K.npu_rms_norm,
        npu_swiglu=K.npu_swiglu,
        _scalebox_kernel_device_type=request.param,
    )
    monkeypatch.setattr(rt, "_torch_npu", fake)
    monkeypatch.setattr(rt, "_device_type", None)
    K.calls.clear()
    return request.param


def kernel_calls(name):
    return K.calls.get(name, 0)


tensors = st.builds(
    lambda shape, seed, scale: torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale,
    st.lists(st.integers(1, 6), min_size=1, max_size=4).map(lambda s: s[:-1] + [2 * s[-1]]),
    st.integers(0, 2**31 - 1),
    st.sampled_from([1e-3, 1.0, 30.0]),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(x=tensors)
def test_gelu_is_the_exact_gelu(npu, x):
    for approximate in ("none", "tanh"):
        assert torch.equal(rt.gelu(x, approximate=approximate), F.gelu(x, approximate=approximate))
    assert kernel_calls("npu_gelu") == (2 if npu == "cpu" else 0)
    K.calls.clear()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(x=tensors)
def test_rms_norm_matches_torch(npu, x):
    d = x.shape[-1]
    w = torch.randn(d, generator=torch.Generator().manual_seed(d))
    got = rt.rms_norm(x, (d,), w, 1e-6)
    want = F.rms_norm(x, (d,), w, 1e-6)
    if npu == "npu":
        assert torch.equal(got, want)  # the else branch is the user's call
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # reassociated, as the table says
    assert kernel_calls("npu_rms_norm") == (1 if npu == "cpu" else 0)
    K.calls.clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rms_norm_default_eps_is_torchs(npu, dtype):
    """eps=None: torch uses float32's eps (the op-math type) even for half inputs; so must we."""
    x = (torch.randn(4, 16) * 1e-4).to(dtype)
    w = torch.ones(16, dtype=dtype)
    torch.testing.assert_close(rt.rms_norm(x, (16,), w), F.rms_norm(x, (16,), w))


def test_rms_norm_falls_back_where_the_kernel_does_not_apply(npu):
    x = torch.randn(3, 8)
    assert torch.equal(rt.rms_norm(x, (8,)), F.rms_norm(x, (8,)))  # no weight
    w2 = torch.randn(2, 8)
    y = torch.randn(5, 2, 8)
    assert torch.equal(rt.rms_norm(y, (2, 8), w2, 1e-5), F.rms_norm(y, (2, 8), w2, 1e-5)) or npu == "cpu"
    assert torch.equal(rt.rms_norm(x.double(), (8,), w2[0].double(), 1e-5), F.rms_norm(x.double(), (8,), w2[0].double(), 1e-5))
    assert kernel_calls("npu_rms_norm") == (1 if npu == "cpu" else 0)  # only the 2-d weight case


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(x=tensors)
def test_swiglu_matches_silu_times_gate(npu, x):
    a, b = x.chunk(2, dim=-1)
    got = rt.swiglu(x, a, b)
    want = F.silu(a) * b
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    if npu == "npu":
        assert torch.equal(got, want)
    assert kernel_calls("npu_swiglu") == (1 if npu == "cpu" else 0)
    K.calls.clear()


def test_swiglu_guard_keeps_the_original_where_the_halves_are_not_xs(npu):
    # odd last dim: chunk gives unequal halves, and silu(a) * b broadcasts
    x = torch.randn(4, 3)
    a, b = x.chunk(2, dim=-1)
    assert torch.equal(rt.swiglu(x, a, b), F.silu(a) * b)
    # not contiguous
    x = torch.randn(8, 4).t()
    a, b = x.chunk(2, dim=-1)
    assert torch.equal(rt.swiglu(x, a, b), F.silu(a) * b)
    # a and b are not x's halves any more
    x = torch.randn(4, 6)
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    assert torch.equal(rt.swiglu(x, a, b), F.silu(a) * b)
    # halves swapped
    a, b = x.chunk(2, dim=-1)
    assert torch.equal(rt.swiglu(x, b, a), F.silu(b) * a)
    assert kernel_calls("npu_swiglu") == 0


def test_swiglu_gradients(npu):
    x1 = torch.randn(5, 8, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    a, b = x1.chunk(2, dim=-1)
    rt.swiglu(x1, a, b).sum().backward()
    a2, b2 = x2.chunk(2, dim=-1)
    (F.silu(a2) * b2).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad)


def test_fast_gelu_error_bound(npu):
    x = torch.linspace(-8, 8, 20001)
    got = rt.fast_gelu(x)
    if npu == "cpu":
        torch.testing.assert_close(got, x * torch.sigmoid(1.702 * x), rtol=1e-5, atol=1e-6)
        err = (got - F.gelu(x)).abs().max().item()
        assert 0.01 < err < 0.021  # "about 0.02", as the table says
    else:
        assert torch.equal(got, F.gelu(x))


def test_gelu_and_rmsnorm_modules_are_drop_in(npu):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.RMSNorm(8, eps=1e-6), nn.Linear(8, 2))
    new = nn.Sequential(nn.Linear(6, 8), rt.GELU(), rt.RMSNorm(8, eps=1e-6), nn.Linear(8, 2))
    new.load_state_dict(ref.state_dict())
    assert list(new.state_dict()) == list(ref.state_dict())
    assert isinstance(new[1], nn.GELU) and isinstance(new[2], nn.RMSNorm)
    assert repr(new) == repr(ref)
    x = torch.randn(5, 6)
    torch.testing.assert_close(new(x), ref(x), rtol=1e-6, atol=1e-7)
    new(x).sum().backward()
    ref(x).sum().backward()
    for p, q in zip(new.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    assert rt.GELU is rt.GELU  # one class, so pickled modules load back


_LOAD_WITHOUT_SCALEBOX = """
import sys
class _Blocked:
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "scalebox_cst":
            raise ImportError("scalebox_cst is not installed here")
sys.meta_path.insert(0, _Blocked())
import torch
m = torch.load(sys.argv[1], weights_only=False)
print(type(m[1]).__module__, type(m[2]).__module__, m[1].approximate, m[2].eps)
"""


def test_a_model_saved_whole_loads_where_scalebox_is_not_installed(npu, tmp_path):
    """Found on unseen code: ``torch.save(model)`` after an NPU rewrite pickled
    ``scalebox_cst.runtime.npu.GELU``, so the checkpoint needed scalebox_cst to load. The modules
    pickle as torch's own classes; a deepcopy in the process keeps the NPU forward."""
    import copy
    import subprocess

    model = nn.Sequential(nn.Linear(6, 8), rt.GELU(approximate="tanh"), rt.RMSNorm(8, eps=1e-6))
    twin = copy.deepcopy(model)
    assert type(twin[1]) is rt.GELU and type(twin[2]) is rt.RMSNorm and twin[1].approximate == "tanh"
    path = tmp_path / "model.pt"
    torch.save(model, path)
    out = subprocess.run([sys.executable, "-c", _LOAD_WITHOUT_SCALEBOX, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["torch.nn.modules.activation", "torch.nn.modules.normalization", "tanh", "1e-06"]
    loaded = torch.load(path, weights_only=False)
    x = torch.randn(3, 6)
    torch.testing.assert_close(loaded(x), model(x), rtol=1e-6, atol=1e-7)


def test_fused_ok_asks_torch_for_the_kernel(npu):
    want = True if npu == "cpu" else None  # CPU has the fused kernels; no PrivateUse1 backend here
    assert [rt.fused_ok(op) for op in ("adam", "adamw", "sgd")] == [want] * 3


# ------------------------------------------------------------------ fail fast


def test_missing_torch_npu_is_one_line_that_names_the_backend_switch(monkeypatch):
    monkeypatch.setattr(rt, "_torch_npu", None)
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "fake_torch_npu" not in p])
    with pytest.raises(rt.NpuUnavailableError) as info:
        from scalebox_cst.runtime.npu import torch_npu  # noqa: F401
    message = str(info.value.code)
    assert "\n" not in message
    assert "torch_npu is not installed" in message and "--backend cpu" in message and "backend = " in message
    assert isinstance(info.value, SystemExit)
    assert rt.AUTOLOAD_ENV not in os.environ or os.environ[rt.AUTOLOAD_ENV] != "0" or "torch" in sys.modules


def test_broken_torch_npu_names_cann(monkeypatch, tmp_path):
    pkg = tmp_path / "torch_npu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")\n')
    monkeypatch.setattr(rt, "_torch_npu", None)
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(rt.NpuUnavailableError) as info:
        rt.require_npu()
    message = str(info.value.code)
    assert "\n" not in message and "libhccl.so" in message and "CANN" in message and "--backend" in message
    sys.modules.pop("torch_npu", None)


# ------------------------------------------------------------------ exactness claims of the table


def _train(cls, kw, dtype=torch.float32, steps=15, seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(7, 32), nn.Tanh(), nn.Linear(32, 3)).to(dtype)
    opt = cls(model.parameters(), **kw)
    g = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        loss = model(torch.randn(16, 7, generator=g, dtype=dtype)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@settings(max_examples=8, deadline=None)
@given(
    cls=st.sampled_from([torch.optim.Adam, torch.optim.AdamW]),
    lr=st.sampled_from([1e-4, 3e-4, 1e-2]),
    eps=st.sampled_from([1e-8, 1e-5]),
    weight_decay=st.sampled_from([0.0, 0.01]),
    amsgrad=st.booleans(),
    maximize=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_cpu_foreach_is_bitwise_the_for_loop(cls, lr, eps, weight_decay, amsgrad, maximize, seed):
    """optimizer.foreach.*.cpu claims EXACT: foreach=True on CPU tensors equals torch's CPU default."""
    kw = dict(lr=lr, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize)
    assert torch.equal(_train(cls, kw, seed=seed), _train(cls, dict(kw, foreach=True), seed=seed))


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD])
def test_fused_optimizers_are_reassociated_within_tolerance(cls):
    kw = dict(lr=1e-2) if cls is not torch.optim.SGD else dict(lr=1e-2, momentum=0.9)
    ref, fused = _train(cls, kw, steps=50), _train(cls, dict(kw, fused=True), steps=50)
    torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-6)


def test_clip_foreach_is_bitwise_the_default():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s)) for s in [(7, 5), (5,), (3, 3, 3)]]
    grads = [torch.randn_like(p) * 10 for p in params]
    outs = []
    for foreach in (None, True):
        for p, g in zip(params, grads):
            p.grad = g.clone()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=foreach)
        outs.append((norm, [p.grad.clone() for p in params]))
    assert torch.equal(outs[0][0], outs[1][0])
    assert all(torch.equal(a, b) for a, b in zip(outs[0][1], outs[1][1]))
