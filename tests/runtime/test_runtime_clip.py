"""The runtime clip helper must clip exactly like clip_grad_norm_ over the optimizer's parameters.

Inserted clipping runs inside users' training loops, so it must match torch bit for bit, count
shared parameters once, record the norm without syncing, and never crash on odd "optimizers".
"""
import subprocess
import sys
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scalebox_cst.runtime import clip, metrics


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(clip, "_warned_types", set())


@pytest.fixture
def recorded(monkeypatch):
    calls = []
    monkeypatch.setattr(metrics, "record", lambda name, value: calls.append((name, value)))
    return calls


def _model_with_grads(seed=0, scale=100.0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
    x = torch.randn(16, 5) * scale
    (model(x) ** 2).mean().backward()
    return model


def _clone_grads(params):
    return [p.grad.clone() for p in params]


def test_matches_clip_grad_norm_bitwise_and_returns_pre_clip_norm(recorded):
    model = _model_with_grads()
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    before = _clone_grads(params)
    expected_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in before]))

    reference = [g.clone() for g in before]
    ref_params = [torch.nn.Parameter(torch.zeros_like(g)) for g in before]
    for p, g in zip(ref_params, reference):
        p.grad = g
    ref_norm = torch.nn.utils.clip_grad_norm_(ref_params, 1.0)

    norm = clip.clip_grad_norm(opt, max_norm=1.0)
    assert isinstance(norm, torch.Tensor) and norm.dim() == 0
    assert torch.equal(norm, ref_norm)
    torch.testing.assert_close(norm, expected_norm)
    assert norm.item() > 1.0  # the gradients really were large
    for p, ref in zip(params, ref_params):
        assert torch.equal(p.grad, ref.grad)
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
    assert total.item() == pytest.approx(1.0, rel=1e-5)
    assert recorded == [("scalebox/grad_norm", norm)]


def test_records_into_real_metrics():
    model = _model_with_grads(seed=1)
    opt = torch.optim.Adam(model.parameters())
    before = metrics.summary().get("scalebox/grad_norm", {}).get("count", 0)
    norm = clip.clip_grad_norm(opt, max_norm=0.5)
    stats = metrics.summary()["scalebox/grad_norm"]
    assert stats["count"] == before + 1
    assert stats["last"] == pytest.approx(norm.item())


def test_several_groups_and_params_without_grad(recorded):
    model = _model_with_grads(seed=2)
    first, second = model[0], model[2]
    frozen = torch.nn.Parameter(torch.ones(3))  # never gets a gradient
    opt = torch.optim.SGD(
        [{"params": first.parameters(), "lr": 0.1}, {"params": [*second.parameters(), frozen], "lr": 0.01}], lr=0.1
    )
    params = [*first.parameters(), *second.parameters()]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for r, p in zip(ref, params):
        r.grad = p.grad.clone()
    ref_norm = torch.nn.utils.clip_grad_norm_(ref, 2.0)
    norm = clip.clip_grad_norm(opt, max_norm=2.0)
    assert torch.equal(norm, ref_norm)
    assert frozen.grad is None
    for p, r in zip(params, ref):
        assert torch.equal(p.grad, r.grad)


def test_parameter_shared_by_two_groups_counts_once(recorded):
    class TwoGroups:  # a wrapper listing one tensor twice (torch's own optimizers refuse this)
        def __init__(self, params):
            self.param_groups = [{"params": params}, {"params": params[:1]}]

    model = _model_with_grads(seed=3)
    params = list(model.parameters())
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for r, p in zip(ref, params):
        r.grad = p.grad.clone()
    ref_norm = torch.nn.utils.clip_grad_norm_(ref, 1.0)
    norm = clip.clip_grad_norm(TwoGroups(params), max_norm=1.0)
    assert torch.equal(norm, ref_norm)
    for p, r in zip(params, ref):
        assert torch.equal(p.grad, r.grad)  # the shared one was scaled once, not twice


def test_norm_type_and_foreach_pass_through(recorded):
    model = _model_with_grads(seed=4)
    params = list(model.parameters())
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for r, p in zip(ref, params):
        r.grad = p.grad.clone()
    ref_norm = torch.nn.utils.clip_grad_norm_(ref, 0.3, norm_type=float("inf"), foreach=False)
    norm = clip.clip_grad_norm(torch.optim.SGD(params, lr=1.0), 0.3, norm_type=float("inf"), foreach=False)
    assert torch.equal(norm, ref_norm)
    for p, r in zip(params, ref):
        assert torch.equal(p.grad, r.grad)


def test_no_gradients_returns_zero_and_records_nothing(recorded):
    model = torch.nn.Linear(3, 2)
    norm = clip.clip_grad_norm(torch.optim.SGD(model.parameters(), lr=0.1))
    assert isinstance(norm, torch.Tensor) and norm.item() == 0.0
    assert recorded == []


def test_object_without_param_groups_warns_once_per_type_and_does_not_crash(recorded):
    class Stepper:
        def step(self):
            pass

    class Other:
        pass

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert clip.clip_grad_norm(Stepper()) is None
        assert clip.clip_grad_norm(Stepper(), max_norm=2.0) is None
        assert clip.clip_grad_norm(Other()) is None
        assert clip.clip_grad_norm(Other()) is None
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert "Stepper" in messages[0] and "Other" in messages[1]
    assert all(issubclass(w.category, RuntimeWarning) for w in caught)
    assert recorded == []


def test_malformed_param_groups_warn_instead_of_raising(recorded):
    class Odd:
        param_groups = [object()]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert clip.clip_grad_norm(Odd()) is None
    assert len(caught) == 1


@settings(max_examples=40, deadline=None)
@given(
    shapes=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=4),
    scale=st.floats(1e-3, 1e3),
    max_norm=st.floats(1e-2, 10.0),
    seed=st.integers(0, 2**16),
)
def test_property_same_as_torch_on_random_params(shapes, scale, max_norm, seed):
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(*s, generator=gen)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * scale
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for r, p in zip(ref, params):
        r.grad = p.grad.clone()
    ref_norm = torch.nn.utils.clip_grad_norm_(ref, max_norm)
    opt = torch.optim.SGD(params, lr=0.1)
    old_record = metrics.record
    metrics.record = lambda name, value: None
    try:
        norm = clip.clip_grad_norm(opt, max_norm=max_norm)
    finally:
        metrics.record = old_record
    assert torch.equal(norm, ref_norm)
    for p, r in zip(params, ref):
        assert torch.equal(p.grad, r.grad)


def test_runtime_import_does_not_pull_in_the_rewriter():
    code = (
        "import sys, scalebox_cst.runtime.clip\n"
        "bad = [m for m in ('libcst', 'scalebox_cst.transforms', 'scalebox_cst.pipeline') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
