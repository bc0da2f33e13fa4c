"""The default gradient guard: bitwise the original on healthy steps and on spikes (reported),
a true skip on non-finite ones, a clip to the history's threshold on spikes with ``spike="clip"``,
no host sync on the device path.

Differential: every test trains the same seeded model twice (original step vs guarded step)
and compares parameters and optimizer state with ``torch.equal``. The device path (CUDA/NPU) is
the same tensor code; here it runs on CPU tensors with ``decides_on_host`` patched to False, and a
TorchFunctionMode counts the calls that would synchronise a device.
"""
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.overrides import TorchFunctionMode

from scalebox_cst.report import CHANGES_SEMANTICS, EXACT_UNTIL_INTERVENTION, REWRITTEN, SKIPPED
from scalebox_cst.runtime import metrics, stabilizer
import harness

GUARD_IMPORT = "from scalebox_cst.runtime.stabilizer import stabilize as _scalebox_stabilize\n"


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    stabilizer.reset()
    monkeypatch.delenv(metrics.ENV_FILE, raising=False)
    monkeypatch.delenv(stabilizer.EVENTS_ENV, raising=False)
    yield
    stabilizer.reset()


@pytest.fixture
def device_path(monkeypatch):
    monkeypatch.setattr(stabilizer, "decides_on_host", lambda params: False)


@pytest.fixture
def torch_path(monkeypatch):
    """The CPU guard without the C helper (an install without a compiler): torch measures."""
    monkeypatch.setattr(stabilizer, "_c_sumsq", None)
    monkeypatch.setattr(stabilizer, "_c_step", None)
    monkeypatch.setattr(stabilizer, "_fast", None)


C_BUILT = stabilizer._c is not None
needs_c = pytest.mark.skipif(not C_BUILT, reason="runtime/_gradnorm_c is not built (pip install -e . builds it)")


def use_path(path, request):
    """host-c: the C helper (skipped where it is not built); host-torch: torch measures; device:
    the device code on CPU tensors."""
    if path == "host-c" and not C_BUILT:
        pytest.skip("runtime/_gradnorm_c is not built (pip install -e . builds it)")
    if path == "host-torch":
        request.getfixturevalue("torch_path")
    if path == "device":
        request.getfixturevalue("device_path")


def kinds():
    return [e["kind"] for e in stabilizer.events.memory]


# --------------------------------------------------------------------------- a training harness

OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05),
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-4),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adamw-foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
    "adam-fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
    "sgd-momentum-fused": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, fused=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-3),
}


def train(guard, opt_name="adam", steps=60, poison=(), spike=(), accumulate=1, two_opts=False, spike_mode=None, **kw):
    """A seeded regression run; ``poison``: steps whose loss is NaN; ``spike``: steps whose loss is
    x1e4; ``spike_mode``: the guard's ``spike=`` (None: its default)."""
    if spike_mode is not None:
        kw["spike"] = spike_mode
    torch.manual_seed(0)
    body = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh())
    head = torch.nn.Linear(16, 2)
    make = OPTIMIZERS[opt_name]
    opts = [make(body.parameters()), make(head.parameters())] if two_opts else [make([*body.parameters(), *head.parameters()])]
    norms = []
    for i in range(1, steps + 1):
        for k in range(accumulate):
            x, y = torch.randn(8, 6), torch.randn(8, 2)
            loss = ((head(body(x)) - y) ** 2).mean() / accumulate
            if i in poison:
                loss = loss * float("nan")
            if i in spike:
                loss = loss * 1e4
            loss.backward()
        for o in opts:
            if guard:
                norms.append(stabilizer.stabilize(o, site=f"t.py:{id(o) % 7}", **kw))
            o.step()
        for o in opts:
            o.zero_grad()
    state = [{k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()} for o in opts for s in o.state.values()]
    return [p.detach().clone() for p in [*body.parameters(), *head.parameters()]], state, norms


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def same_state(a, b):
    return len(a) == len(b) and all(x.keys() == y.keys() and all(torch.equal(torch.as_tensor(x[k]), torch.as_tensor(y[k])) for k in x) for x, y in zip(a, b))


# --------------------------------------------------------------------------- exact when healthy


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("path", ["host-c", "host-torch", "device"])
def test_healthy_run_is_bitwise_the_original(opt_name, path, request):
    use_path(path, request)
    ref_params, ref_state, _ = train(False, opt_name)
    params, state, norms = train(True, opt_name)
    assert same(ref_params, params) and same_state(ref_state, state)
    assert kinds() == [] and all(n is not None for n in norms)


@pytest.mark.parametrize("case", [dict(accumulate=3), dict(two_opts=True), dict(two_opts=True, accumulate=2)])
def test_healthy_accumulation_and_several_optimizers_bitwise(case):
    ref, ref_state, _ = train(False, **case)
    got, state, _ = train(True, **case)
    assert same(ref, got) and same_state(ref_state, state) and kinds() == []


def test_norm_is_the_total_norm_and_history_is_not_written_into_grads():
    torch.manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5))]
    for p in params:
        p.grad = torch.randn_like(p) * 3
    before = [p.grad.clone() for p in params]
    norm = stabilizer.stabilize(torch.optim.SGD(params, lr=0.1), site="x")
    expected = torch.nn.utils.get_total_norm([p.grad for p in params]).item()
    assert norm == pytest.approx(expected, rel=1e-6)
    assert same(before, [p.grad for p in params])


def test_amp_guard_after_unscale_is_bitwise_and_leaves_overflow_to_the_scaler():
    def run(guard, poison=()):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
        for i in range(1, 31):
            loss = (model(torch.randn(5, 4)) ** 2).mean()
            if i in poison:
                loss = loss * float("inf")
            opt.zero_grad()
            scaler.scale(loss).backward()
            if guard:
                scaler.unscale_(opt)
                stabilizer.stabilize(opt, site="amp.py:9", scaler=scaler)
            scaler.step(opt)
            scaler.update()
        return [p.detach().clone() for p in model.parameters()], scaler.get_scale()

    (ref, ref_scale), (got, scale) = run(False), run(True)
    assert same(ref, got) and ref_scale == scale
    ref, ref_scale = run(False, poison=(7,))
    got, scale = run(True, poison=(7,))
    assert same(ref, got) and ref_scale == scale  # GradScaler skipped step 7 in both
    assert "step_skipped" not in kinds()  # the scaler's own business, not an instability


# --------------------------------------------------------------------------- interventions


@pytest.mark.parametrize("opt_name", ["sgd-momentum", "adam", "adam-fused", "rmsprop"])
@pytest.mark.parametrize("path", ["host-c", "host-torch"])
def test_nonfinite_step_is_skipped_exactly(opt_name, path, request):
    """Poisoning step 20 with the guard == the same run in which step 20 never happened."""
    use_path(path, request)
    ref, ref_state, _ = train(False, opt_name, steps=19)
    got, state, _ = train(True, opt_name, steps=20, poison=(20,))
    assert same(ref, got) and same_state(ref_state, state)
    assert kinds() == ["nonfinite", "step_skipped"]
    event = stabilizer.events.memory[0]
    assert event["step"] == 20 and "Sequential.0.weight" in event["params"]


@pytest.mark.parametrize("dtype, value, path", [
    # float16 gradients of 3000: a norm of ~3e5, inf in float16
    *((torch.float16, 3000.0, path) for path in ("host-c", "host-torch", "device")),
    # bfloat16 of 1e20: a norm of ~1e22 (the device decision measures it in float32, where it overflows)
    *((torch.bfloat16, 1e20, path) for path in ("host-c", "host-torch")),
])
def test_a_large_norm_of_finite_16_bit_gradients_is_no_skip(dtype, value, path, request):
    """Every gradient is finite, only their norm overflows the gradients' own type: the step runs
    as written (bitwise the unguarded one), and no non-finite gradient is reported."""
    use_path(path, request)

    def run(guarded):
        torch.manual_seed(0)
        model = torch.nn.Linear(100, 100).to(dtype)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
        for p in model.parameters():
            p.grad = torch.full_like(p, value)
        if guarded:
            stabilizer.stabilize(opt, site="big")
        opt.step()
        return [p.detach().clone() for p in model.parameters()], [dict(s) for s in opt.state.values()]

    ref, ref_state = run(False)
    got, state = run(True)
    stabilizer.flush()
    assert same(ref, got) and same_state(ref_state, state)
    assert "nonfinite" not in kinds() and "step_skipped" not in kinds()


def test_skipped_step_gives_the_gradients_back_after_step():
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.Adam(model.parameters())
    (model(torch.randn(2, 3)).sum() * float("nan")).backward()
    stabilizer.stabilize(opt, site="s")
    assert all(p.grad is None for p in model.parameters())
    opt.step()
    assert all(p.grad is not None and torch.isnan(p.grad).all() for p in model.parameters())
    assert opt.state == {} or all(not s for s in opt.state.values())


def test_a_dead_weak_proxy_among_live_objects_does_not_crash_the_nonfinite_report(capsys):
    """Found when the compile tests ran first: torch.compile leaves dead ``weakref.proxy`` objects
    about, and naming the parameters of the first non-finite gradient asked ``isinstance`` of every
    live object: ReferenceError out of the guard, which crashed the run at the step it was to skip."""
    import weakref

    class Owner:
        pass

    owner = Owner()
    dead = [weakref.proxy(owner)]  # noqa: F841 - held: a dead proxy among the live objects
    del owner
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.Adam(model.parameters())
    (model(torch.randn(2, 3)).sum() * float("nan")).backward()
    stabilizer.stabilize(opt, site="s", sync=True)
    assert "first non-finite gradient at s" in capsys.readouterr().err
    assert all(p.grad is None for p in model.parameters())


def test_run_with_nan_losses_finishes_finite_and_keeps_training():
    params, _, _ = train(True, "adam", steps=80, poison=(10, 30, 31))
    assert all(torch.isfinite(p).all() for p in params)
    assert kinds().count("step_skipped") == 3 and kinds().count("nonfinite") == 1
    unguarded, _, _ = train(False, "adam", steps=80, poison=(10,))
    assert not all(torch.isfinite(p).all() for p in unguarded)


@pytest.mark.parametrize("path", ["host-c", "host-torch", "device"])
def test_a_spike_is_reported_and_the_step_runs_as_written_by_default(path, request):
    """The default: a spike is an event (with its threshold on the host), never a change; the run
    is bitwise the unguarded one, parameters and optimizer state, spike included."""
    use_path(path, request)
    ref, ref_state, _ = train(False, "adam", steps=70, spike=(50, 60))
    got, state, norms = train(True, "adam", steps=70, spike=(50, 60))
    stabilizer.flush()
    assert same(ref, got) and same_state(ref_state, state)
    seen = [e for e in stabilizer.events.memory if e["kind"] == "spike_seen"]
    assert [e["step"] for e in seen] == [50, 60] and "spike_clipped" not in kinds()
    assert all(e["value"] > 1000 * float(norms[40]) for e in seen)
    if path != "device":
        assert all(float(norms[40]) < e["threshold"] < e["value"] for e in seen)
    # the second spike (10 steps on) is seen only because the history was fed the threshold: fed
    # the first spike, the mean would have grown ~300x and the second would sit under 100x of it


def test_a_bad_spike_mode_is_one_error_line():
    a = torch.nn.Parameter(torch.randn(3))
    give_grads([a])
    with pytest.raises(ValueError, match="spike='clipp'"):
        stabilizer.stabilize(torch.optim.SGD([a], lr=0.1), site="bad", spike="clipp")


@pytest.mark.parametrize("path", ["host-c", "host-torch", "device"])
def test_spike_is_clipped_to_the_history_threshold(path, request):
    use_path(path, request)
    _, _, norms = train(True, "sgd", steps=60, spike=(50,), spike_mode="clip")
    stabilizer.flush()
    spikes = [e for e in stabilizer.events.memory if e["kind"] == "spike_clipped"]
    assert [e["step"] for e in spikes] == [50]
    value = float(norms[49])
    healthy = [float(n) for n in norms[:49]]
    assert value > 1000 * max(healthy)  # the norm returned is the measured, pre-clip one
    if path != "device":
        assert max(healthy[stabilizer.WARMUP:]) < spikes[0]["threshold"] < (stabilizer.RATIO + stabilizer.Z) * max(healthy)
    # the clipped step moved the weights by a healthy amount, not 1e4 times one
    ref, _, _ = train(False, "sgd", steps=49)
    got, _, _ = train(False, "sgd", steps=50, spike=(50,))
    stabilizer.reset()
    clipped, _, _ = train(True, "sgd", steps=50, spike=(50,), spike_mode=True)  # True: the older spelling of "clip"
    jump = max((a - b).abs().max().item() for a, b in zip(got, ref))
    moved = max((a - b).abs().max().item() for a, b in zip(clipped, ref))
    assert moved < jump * 2 * stabilizer.RATIO / 1e4  # clipped to ~RATIO x the history, not 1e4 x


def test_no_spike_detection_during_warmup_or_with_spike_false():
    train(True, "sgd", steps=30, spike=(5,))
    assert "spike_clipped" not in kinds()
    # spike=False (a site the code clips itself): measure and skip only
    stabilizer.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(40):
        opt.zero_grad()
        (model(torch.randn(4, 3)).sum() * (1e5 if i == 35 else 1.0)).backward()
        before = [p.grad.clone() for p in model.parameters()]
        stabilizer.stabilize(opt, site="own-clip", spike=False)
        assert same(before, [p.grad for p in model.parameters()])
        opt.step()
    assert kinds() == []


def test_fixed_max_norm_is_clip_grad_norm_bitwise_and_skips_nonfinite():
    torch.manual_seed(3)
    a = [torch.nn.Parameter(torch.randn(3, 3)) for _ in range(3)]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    for p, q in zip(a, b):
        p.grad = torch.randn_like(p) * 5
        q.grad = p.grad.clone()
    ref = torch.nn.utils.clip_grad_norm_(b, 0.5)
    norm = stabilizer.stabilize(torch.optim.SGD(a, lr=0.1), site="f", max_norm=0.5, sync=True)
    assert torch.equal(norm, ref) and same([p.grad for p in a], [q.grad for q in b])
    opt = torch.optim.SGD(a, lr=0.1)
    a[0].grad[0, 0] = float("inf")
    before = [p.detach().clone() for p in a]
    stabilizer.stabilize(opt, site="f", max_norm=0.5, sync=True)
    opt.step()
    assert same(before, [p.detach() for p in a]) and "step_skipped" in kinds()


# --------------------------------------------------------------------------- the CPU fast path


def total(params):
    """The norm of the gradients there are, densely, in float64 (the reference)."""
    grads = [p.grad.to_dense().double().reshape(-1) for p in params if p.grad is not None]
    return math.sqrt(math.fsum(float(v) ** 2 for g in grads for v in g)) if grads else None


def give_grads(params, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype) * scale


@needs_c
def test_c_step_history_is_the_python_arithmetic():
    """The C helper's history after healthy steps == stabilizer._update applied to the norms it
    returned, bit for bit; its norm is the float64 norm of the gradients."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(7, 5)), torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(3, 3, dtype=torch.float64))]
    params[2].data = params[2].data.float()
    opt = torch.optim.SGD(params, lr=0.1)
    ref = stabilizer._Guard("ref", 0, "unused")
    values = []
    for i in range(60):
        give_grads(params, seed=i, scale=1.0 + (i % 7))
        value = stabilizer.stabilize(opt, site="c.py:1")
        assert value == pytest.approx(total(params), rel=1e-12)
        values.append(value)
        stabilizer._update(ref, value)
    guard = stabilizer._known[(id(opt), "c.py:1")]
    assert guard.c_dtype is torch.float32 and guard.calls == 60
    assert (guard.count, guard.mean, guard.var) == (ref.count, ref.mean, ref.var)
    assert kinds() == []


@pytest.mark.parametrize("path", ["host-c", "host-torch"])
def test_grad_norm_recorded_as_window_maxima(path, request, tmp_path, monkeypatch):
    use_path(path, request)
    metrics.flush()  # earlier tests' points go nowhere
    monkeypatch.setenv(metrics.ENV_FILE, str(tmp_path / "metrics.jsonl"))
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n = 2 * stabilizer.RECORD_EVERY + 3
    values = []
    for i in range(n):
        give_grads(list(model.parameters()), seed=i, scale=1.0 + i % 5)
        values.append(stabilizer.stabilize(opt, site="w.py:1"))
    stabilizer.flush()
    metrics.flush()
    import json
    points = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    points = [(q["step"], q["value"]) for q in points if q["name"] == "scalebox/" + stabilizer.METRIC]
    k = stabilizer.RECORD_EVERY
    expected = [(min(j + k, n), max(values[j:j + k])) for j in range(0, n, k)]
    assert [s for s, _ in points] == [s for s, _ in expected]
    assert [v for _, v in points] == pytest.approx([v for _, v in expected], rel=1e-12)


@pytest.mark.parametrize("path", ["host-c", "host-torch"])
def test_a_guard_after_the_codes_clip_names_its_norm_clipped(path, request, tmp_path, monkeypatch):
    """Issue 20: after the code's own clip_grad_norm_ (the guard then runs with spike=False) the
    guard measures clipped gradients; recorded as plain ``grad_norm`` that read as the run's
    grad norm while it was only ever the code's max_norm."""
    use_path(path, request)
    stabilizer.reset()
    metrics.flush()
    monkeypatch.setenv(metrics.ENV_FILE, str(tmp_path / "metrics.jsonl"))
    model, other = torch.nn.Linear(4, 2), torch.nn.Linear(3, 1)
    opt, opt2 = torch.optim.SGD(model.parameters(), lr=0.01), torch.optim.SGD(other.parameters(), lr=0.01)
    for i in range(stabilizer.RECORD_EVERY):
        give_grads(list(model.parameters()), seed=i, scale=100.0)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        stabilizer.stabilize(opt, site="c.py:1", spike=False)
        give_grads(list(other.parameters()), seed=i)
        stabilizer.stabilize(opt2, site="c.py:2")
    stabilizer.flush()
    metrics.flush()
    import json
    names = {}
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        q = json.loads(line)
        names.setdefault(q["name"], []).append(q["value"])
    assert sorted(names) == ["scalebox/grad_norm", "scalebox/grad_norm_clipped"]  # each its own first series
    assert names["scalebox/grad_norm_clipped"] == [pytest.approx(0.5, rel=1e-5)]


@pytest.mark.parametrize("path", ["host-c", "host-torch"])
def test_cached_parameters_follow_the_groups(path, request):
    """add_param_group, a group's list replaced or grown, grads set to None: the norm is always
    that of the optimizer's current parameters that have a gradient."""
    use_path(path, request)
    a, b, c, d = (torch.nn.Parameter(torch.randn(4, 3)) for _ in range(4))
    opt = torch.optim.SGD([a, b], lr=0.1)
    site = "cache.py:1"

    def check(expect_params):
        value = stabilizer.stabilize(opt, site=site)
        assert value == pytest.approx(total(expect_params), rel=1e-6)

    give_grads([a, b, c, d])
    check([a, b])
    check([a, b])  # the cached list
    opt.param_groups[0]["params"].append(d)  # one group, grown in place
    check([a, b, d])
    opt.param_groups[0]["params"] = [a, b]  # one group, replaced
    check([a, b])
    opt.add_param_group({"params": [c]})
    check([a, b, c])
    opt.param_groups[0]["params"].append(d)  # grown in place
    check([a, b, c, d])
    opt.param_groups[0]["params"] = [a]  # replaced
    check([a, c])
    b.grad = None
    c.grad = None  # grads set to None: only a left
    check([a])
    opt.zero_grad(set_to_none=True)
    assert stabilizer.stabilize(opt, site=site) is None  # no gradient: nothing measured
    give_grads([a, c], seed=3)
    check([a, c])
    opt.load_state_dict(opt.state_dict())  # new group dicts, the same parameter lists
    check([a, c])
    other = torch.optim.SGD([{"params": [a]}, {"params": [c]}], lr=0.1)  # same site, another optimizer
    assert stabilizer.stabilize(other, site=site) == pytest.approx(total([a, c]), rel=1e-6)
    opt.param_groups[0]["params"] = [b]
    b.grad = torch.ones(4, 3)
    check([b, c])


def test_a_parameter_in_two_groups_counts_once():
    a, b = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(2))
    opt = torch.optim.SGD([a, b], lr=0.1)
    opt.param_groups[0]["params"].append(a)  # torch refuses this in add_param_group; a list can still hold it
    give_grads([a, b])
    for _ in range(3):
        assert stabilizer.stabilize(opt, site="dup") == pytest.approx(total([a, b]), rel=1e-6)


def _run(model_fn, opt_fn, guard, steps=25, seed=0):
    torch.manual_seed(seed)
    model = model_fn()
    opt = opt_fn(model.parameters())
    norms = []
    for i in range(steps):
        opt.zero_grad()
        model.loss(torch.Generator().manual_seed(i)).backward()
        if guard:
            norms.append((stabilizer.stabilize(opt, site="fb.py:1"), total(list(model.parameters()))))
        opt.step()
    return [p.detach().clone() for p in model.parameters()], norms, opt


class Emb(torch.nn.Module):
    """A sparse-gradient embedding and a dense head (SGD takes both)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 4, sparse=True)
        self.head = torch.nn.Linear(4, 1)

    def loss(self, gen):
        idx = torch.randint(0, 20, (6,), generator=gen)
        return (self.head(self.emb(idx)) ** 2).mean()


class Mixed(torch.nn.Module):
    """Parameters of two dtypes (one foreach call cannot take them)."""

    def __init__(self, dtype=torch.float64):
        super().__init__()
        self.a = torch.nn.Linear(3, 4)
        self.b = torch.nn.Linear(4, 1).to(dtype)

    def loss(self, gen):
        x = torch.randn(5, 3, generator=gen)
        return (self.b(torch.tanh(self.a(x)).to(self.b.weight.dtype)) ** 2).mean().float()


class Half(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 2).to(torch.bfloat16)

    def loss(self, gen):
        return (self.a(torch.randn(5, 3, generator=gen).to(torch.bfloat16)) ** 2).mean().float()


@pytest.mark.parametrize("model_fn, rel", [(Emb, 1e-6), (Mixed, 1e-6), (lambda: Mixed(torch.float32), 1e-6), (Half, 1e-2)],
                         ids=["sparse-grads", "float32+float64", "float32", "bfloat16"])
def test_gradients_the_c_helper_does_not_read_take_the_torch_path(model_fn, rel):
    """Sparse gradients, mixed or low-precision dtypes: measured right, training bitwise the original."""
    sgd = lambda p: torch.optim.SGD(p, lr=0.05)  # noqa: E731
    ref, _, _ = _run(model_fn, sgd, False)
    got, norms, opt = _run(model_fn, sgd, True)
    assert same(ref, got) and kinds() == []
    assert all(v == pytest.approx(t, rel=rel) for v, t in norms)
    guard = stabilizer._known[(id(opt), "fb.py:1")]
    assert (guard.c_dtype is not None) == (C_BUILT and model_fn not in (Emb, Mixed, Half))


class MyTensor(torch.Tensor):
    pass


@pytest.mark.parametrize("make", [
    lambda p: torch.randn(p.shape[::-1]).t(),  # strided (not contiguous)
    lambda p: torch.randn(p.shape).as_subclass(MyTensor),  # a subclass: its data may not be its storage
], ids=["transposed", "subclass"])
def test_a_gradient_the_c_helper_refuses_is_measured_by_torch(make):
    p, q = torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(4))
    opt = torch.optim.SGD([p, q], lr=0.1)
    give_grads([p, q])
    first = stabilizer.stabilize(opt, site="r")
    assert first == pytest.approx(total([p, q]), rel=1e-6)
    p.grad = make(p)
    assert stabilizer.stabilize(opt, site="r") == pytest.approx(total([p, q]), rel=1e-6)
    assert stabilizer._known[(id(opt), "r")].c_dtype is None  # torch from then on
    give_grads([p, q], seed=5)
    assert stabilizer.stabilize(opt, site="r") == pytest.approx(total([p, q]), rel=1e-6)


@pytest.mark.skipif(not hasattr(torch.Tensor, "grad_dtype"), reason="torch without Tensor.grad_dtype")
def test_a_gradient_of_another_dtype_than_its_parameter():
    p = torch.nn.Parameter(torch.randn(3, 2))
    opt = torch.optim.SGD([p], lr=0.1)
    p.grad = torch.randn(3, 2)
    stabilizer.stabilize(opt, site="gd")
    p.grad = None
    p.grad_dtype = torch.float64
    p.grad = torch.randn(3, 2, dtype=torch.float64) * 1e-30  # float32 would flush its squares to 0
    assert stabilizer.stabilize(opt, site="gd") == pytest.approx(total([p]), rel=1e-9)


def test_spike_and_nonfinite_on_the_c_path_match_the_torch_path(monkeypatch):
    """The same run through both measurements: the same interventions at the same steps."""
    events = {}
    for path in ("c", "torch"):
        stabilizer.reset()
        with monkeypatch.context() as m:
            if path == "torch":
                m.setattr(stabilizer, "_c_sumsq", None)
                m.setattr(stabilizer, "_c_step", None)
                m.setattr(stabilizer, "_fast", None)
            params, _, _ = train(True, "adam", steps=70, poison=(33,), spike=(50, 51), spike_mode="clip")
        events[path] = [(e["kind"], e["step"]) for e in stabilizer.events.memory]
        assert all(torch.isfinite(p).all() for p in params)
    assert events["c"] == events["torch"]
    assert [k for k, _ in events["c"]] == ["nonfinite", "step_skipped", "spike_clipped"] + ["spike_clipped"] * (len(events["c"]) - 3)


def test_an_optimizer_without_weak_references():
    class Slotted:
        __slots__ = ("param_groups",)

        def __init__(self, params):
            self.param_groups = [{"params": list(params)}]

    a = torch.nn.Parameter(torch.randn(5))
    opt = Slotted([a])
    for i in range(4):
        give_grads([a], seed=i)
        assert stabilizer.stabilize(opt, site="slot") == pytest.approx(total([a]), rel=1e-6)
    assert stabilizer._known[(id(opt), "slot")].calls == 4


def test_a_dead_optimizer_leaves_the_lookup():
    import gc

    a = torch.nn.Parameter(torch.randn(5))
    opt = torch.optim.SGD([a], lr=0.1)
    give_grads([a])
    stabilizer.stabilize(opt, site="gone")
    key = (id(opt), "gone")
    assert key in stabilizer._known
    del opt
    gc.collect()
    assert key not in stabilizer._known


@needs_c
def test_c_helper_reads_only_and_refuses_what_it_cannot_read():
    c = stabilizer._c
    p, q = torch.nn.Parameter(torch.randn(6, 5)), torch.nn.Parameter(torch.randn(0))
    assert c.sumsq([p, q], torch.Tensor, torch.float32, False) == -1.0  # no gradient
    give_grads([p, q])
    before = p.grad.clone()
    assert c.sumsq([p, q], torch.Tensor, torch.float32, False) == pytest.approx(total([p]) ** 2, rel=1e-12)
    assert torch.equal(before, p.grad)
    assert c.sumsq([p], torch.Tensor, torch.float64, True) is None  # another dtype
    p.grad = torch.randn(5, 6).t()
    assert c.sumsq([p], torch.Tensor, torch.float32, False) is None  # not contiguous
    with pytest.raises(TypeError):
        c.sumsq((p,), torch.Tensor, torch.float32, False)


NO_C_SCRIPT = """\
import sys
sys.modules["scalebox_cst.runtime._gradnorm_c"] = None  # an install without a compiler
import torch
from scalebox_cst.runtime import stabilizer
assert stabilizer._c is None and stabilizer._fast is None and stabilizer._Guard.__bases__ == (object,)

def run(guard, poison=(), spike=()):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for i in range(1, 61):
        loss = (model(torch.randn(6, 5)) ** 2).mean() * (float("nan") if i in poison else 1e4 if i in spike else 1.0)
        opt.zero_grad()
        loss.backward()
        if guard:
            stabilizer.stabilize(opt, site="noc.py:1", spike=guard)
        opt.step()
    return [p.detach().clone() for p in model.parameters()]

assert all(torch.equal(a, b) for a, b in zip(run(False), run("clip")))
stabilizer.reset()
assert all(torch.equal(a, b) for a, b in zip(run(False, spike=(45,)), run("report", spike=(45,))))
assert [e["kind"] for e in stabilizer.events.memory] == ["spike_seen"], stabilizer.events.memory
stabilizer.reset()
got = run("clip", poison=(30,), spike=(45,))
assert all(torch.isfinite(p).all() for p in got)
assert [e["kind"] for e in stabilizer.events.memory] == ["nonfinite", "step_skipped", "spike_clipped"], stabilizer.events.memory
print("ok")
"""


def test_without_the_c_helper_the_guard_is_the_same(tmp_path):
    """A process where the C helper cannot be imported: _Guard is a plain class, torch measures,
    and healthy runs are still bitwise the original, NaN steps skipped, spikes reported or clipped."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop(metrics.ENV_FILE, None)
    env.pop(stabilizer.EVENTS_ENV, None)
    done = subprocess.run([sys.executable, "-c", NO_C_SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_c_helper_is_built_where_a_compiler_is():
    """The install builds runtime/_gradnorm_c (setup.py); without it the guard still works but
    costs about 3x more on a small model (benchmarks/bench_stabilizer.py)."""
    import shutil
    import sysconfig

    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}): the torch path is the one that runs")
    assert C_BUILT, "scalebox_cst.runtime._gradnorm_c is not built: pip install -e . (setup.py) builds it"


# --------------------------------------------------------------------------- the device path


class SyncCounter(TorchFunctionMode):
    """Calls that make a CUDA/NPU host wait for the device."""

    SYNCING = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy", "nonzero", "any", "all"}

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in self.SYNCING:
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def test_device_path_makes_no_sync_between_flushes(device_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), fused=True)
    counter = SyncCounter()
    for i in range(stabilizer.FLUSH_EVERY - 1):
        opt.zero_grad()
        loss = (model(torch.randn(8, 6)) ** 2).mean() * (float("nan") if i == 40 else 1.0)
        loss.backward()
        with counter:
            stabilizer.stabilize(opt, site="d.py:3")
            opt.step()
    assert counter.calls == []
    assert all(torch.isfinite(p).all() for p in model.parameters())  # found_inf skipped step 41
    stabilizer.flush()  # the batch crosses to the host here, once
    assert kinds() == ["nonfinite", "step_skipped"] and stabilizer.events.memory[0]["step"] == 41


def test_device_path_non_fused_optimizer_reports_that_it_could_not_skip(device_path):
    """Without found_inf the device path cannot skip without a sync: step 12 writes NaN, every later
    step stays non-finite, and each is reported (what the hot-fix policy acts on: its branch
    decides on the host, sync=True)."""
    params, _, _ = train(True, "adam", steps=20, poison=(12,))
    stabilizer.flush()
    assert kinds() == ["nonfinite"] + ["guard_intervened"] * 9
    assert stabilizer.events.memory[1]["skipped"] is False and stabilizer.events.memory[0]["step"] == 12
    assert not all(torch.isfinite(p).all() for p in params)


def test_device_path_fused_skip_is_exact(device_path):
    ref, ref_state, _ = train(False, "adam-fused", steps=19)
    got, state, _ = train(True, "adam-fused", steps=20, poison=(20,))
    assert same(ref, got) and same_state(ref_state, state)


def test_device_path_fused_sgd_skipped_first_step_leaves_no_unwritten_momentum(device_path):
    """torch's fused SGD with momentum, its first step skipped through found_inf, keeps the
    momentum buffers that step allocated (``torch.empty_like``) and never wrote, and every later
    step reads them (parameters off by ~1e29). The guard drops them after the skip: the run is
    the one whose first step never ran, bit for bit."""
    got, state, _ = train(True, "sgd-momentum-fused", steps=6, poison=(1,))
    torch.manual_seed(0)
    body = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh())
    head = torch.nn.Linear(16, 2)
    opt = OPTIMIZERS["sgd-momentum-fused"]([*body.parameters(), *head.parameters()])
    for i in range(1, 7):
        x, y = torch.randn(8, 6), torch.randn(8, 2)
        if i > 1:  # the skipped step draws its batch and changes nothing
            ((head(body(x)) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
    ref = [p.detach().clone() for p in [*body.parameters(), *head.parameters()]]
    assert same(ref, got) and all(torch.isfinite(p).all() for p in got)
    assert same_state([{k: v.clone() for k, v in s.items()} for s in opt.state.values()], state)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_sync_debug_mode_raises_nothing():
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).cuda()
    opt = torch.optim.Adam(model.parameters(), fused=True)
    x = torch.randn(8, 6, device="cuda")
    for _ in range(3):  # warm-up allocations
        opt.zero_grad(); (model(x) ** 2).mean().backward(); stabilizer.stabilize(opt, site="c"); opt.step()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(stabilizer.FLUSH_EVERY - 5):
            opt.zero_grad()
            (model(x) ** 2).mean().backward()
            stabilizer.stabilize(opt, site="c")
            opt.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)


# --------------------------------------------------------------------------- the transform, guard mode


def rewrite(src, **options):
    return harness.rewrite(src, "grad_clip", options={"grad_clip": options})


def test_guard_is_the_default_and_says_what_it_changes():
    out, sites = rewrite("""\
        loss.backward()
        optimizer.step()
    """)
    assert out == GUARD_IMPORT + "loss.backward()\n_scalebox_stabilize(optimizer, site='t.py:2')\noptimizer.step()\n"
    (site,) = sites
    assert site.action == REWRITTEN and site.exactness == EXACT_UNTIL_INTERVENTION
    assert "stabilize: skips a non-finite step" in site.reason
    said = site.details["contracts"]["stabilize"]
    assert "skips the step if a gradient is non-finite" in said["checks"] and said["otherwise"].startswith("changes nothing")


def test_guard_mode_amp_several_optimizers_accumulation_and_own_clip():
    out, sites = rewrite("""\
        import torch
        scaler = torch.amp.GradScaler()
        def update(self, loss):
            scaler.scale(loss).backward()
            scaler.step(self.pi_opt)
            scaler.update()
        def td3(self, q_loss):
            q_loss.backward()
            torch.nn.utils.clip_grad_norm_(self.critic.parameters(), 10.0)
            self.critic_opt.step()
            self.encoder_opt.step()
        for i, batch in enumerate(loader):
            (model(batch).mean() / k).backward()
            if (i + 1) % k == 0:
                optimizer.step()
                optimizer.zero_grad()
    """)
    assert "    scaler.unscale_(self.pi_opt)\n    _scalebox_stabilize(self.pi_opt, site='t.py:5', scaler=scaler)\n    scaler.step(self.pi_opt)\n" in out
    assert "_scalebox_stabilize(self.critic_opt, site='t.py:10', spike=False)\n    self.critic_opt.step()\n" in out
    assert "_scalebox_stabilize(self.encoder_opt, site='t.py:11', spike=False)\n    self.encoder_opt.step()\n" in out
    assert "        _scalebox_stabilize(optimizer, site='t.py:15')\n        optimizer.step()\n" in out
    rewritten = [s for s in sites if s.action == REWRITTEN]
    assert len(rewritten) == 4 and {s.exactness for s in rewritten} == {EXACT_UNTIL_INTERVENTION}
    again, again_sites = rewrite(out)
    assert again == out and any("already guarded" in s.reason for s in again_sites if s.action == SKIPPED)


def test_guard_options_and_fixed_and_hotfix_modes():
    src = "loss.backward()\nopt.step()\n"
    out, _ = rewrite(src, z=4.0, warmup=50)
    assert "_scalebox_stabilize(opt, site='t.py:2', z=4.0, warmup=50)" in out
    out, sites = rewrite(src, mode="fixed", max_norm=0.5)
    assert "_scalebox_clip_grad_norm(opt, max_norm=0.5)" in out and sites[0].exactness == CHANGES_SEMANTICS
    out, sites = rewrite(src, mode="fixed", max_norm=0.5, skip_nonfinite=True)
    assert "_scalebox_stabilize(opt, site='t.py:2', max_norm=0.5, sync=True)" in out
    assert sites[0].exactness == CHANGES_SEMANTICS and "skip the step" in sites[0].reason
    out, _ = rewrite(src, skip_nonfinite=True)
    assert "_scalebox_stabilize(opt, site='t.py:2', sync=True)" in out


@pytest.mark.parametrize("options, message", [({"mode": "adaptive"}, "grad_clip.mode"), ({"z": -1}, "grad_clip.z"),
                                              ({"warmup": 2.5}, "grad_clip.warmup"), ({"skip_nonfinite": "yes"}, "skip_nonfinite")])
def test_bad_options_are_one_line_errors(options, message):
    src = b"loss.backward()\nopt.step()\n"
    result = harness.rewrite_result(src, "grad_clip", options={"grad_clip": options})
    assert result.output == src and message in result.report.error


def test_rewritten_code_runs_and_equals_the_original():
    src = textwrap.dedent("""\
        import torch
        torch.manual_seed(0)
        actor, critic = torch.nn.Linear(4, 2), torch.nn.Linear(4, 1)
        a_opt = torch.optim.Adam(actor.parameters(), lr=1e-2)
        c_opt = torch.optim.SGD(critic.parameters(), lr=1e-2, momentum=0.9)
        for it in range(50):
            x = torch.randn(16, 4)
            c_loss = (critic(x) ** 2).mean()
            c_opt.zero_grad()
            c_loss.backward()
            torch.nn.utils.clip_grad_norm_(critic.parameters(), 0.5)
            c_opt.step()
            a_loss = actor(x).pow(2).mean()
            a_opt.zero_grad()
            a_loss.backward()
            a_opt.step()
        print(c_loss.item(), a_loss.item())
    """)
    out, sites = rewrite(src)
    assert sum(s.action == REWRITTEN for s in sites) == 2
    spaces = []
    for ns in harness.run_pair(src, out, {}):
        spaces.append([p.detach().clone() for m in (ns["actor"], ns["critic"]) for p in m.parameters()])
    assert same(*spaces)


# --------------------------------------------------------------------------- --locate-nan


LOCATE_SCRIPT = """\
import torch
from scalebox_cst.runtime.stabilizer import stabilize
torch.manual_seed(0)
class Blowup(torch.nn.Module):
    def forward(self, x, step):
        return x.log() if step == 7 else x.abs()
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.bad = Blowup()
        self.out = torch.nn.Linear(3, 1)
    def forward(self, x, step):
        return self.out(self.bad(self.fc(x) - 10.0, step))
net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for step in range(1, 11):
    loss = net(torch.randn(4, 3), step).mean()
    opt.zero_grad()
    loss.backward()
    stabilize(opt, site="loc.py:20")
    opt.step()
print("done")
"""


def test_locate_nan_names_the_module_and_line(tmp_path):
    script = tmp_path / "loc.py"
    script.write_text(LOCATE_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop(metrics.ENV_FILE, None)
    first = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert first.returncode == 0 and "done" in first.stdout
    assert "first non-finite gradient at loc.py:20 step 7" in first.stderr
    env[stabilizer.LOCATE_ENV] = "loc.py:20@7"
    env[stabilizer.EVENTS_ENV] = str(tmp_path / "events.jsonl")
    again = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0 and "done" not in again.stdout, again.stderr
    assert "Net.bad (Blowup) produced the first non-finite output at loc.py:20 step 7" in again.stderr
    assert f"{script}:14" in again.stderr  # the user's line that called the module
    assert '"kind": "nan_located"' in (tmp_path / "events.jsonl").read_text()


@pytest.mark.parametrize("spec", ["fc@", "fc@abc", "fc@1.5", "fc@\u00b2", "fc", "fc@-1"])
def test_a_nan_locator_spec_without_a_step_number_is_its_one_line(spec):
    """`SITE@STEP` with a STEP that is not ASCII digits is the one-line error naming the setting;
    a review of this session's digit checks found `not step.isascii() and step.isdigit()` there,
    which let `fc@abc` and `fc@` through to a bare int() ValueError."""
    from scalebox_cst.runtime.nan_locate import Locator

    with pytest.raises(ValueError, match="SCALEBOX_LOCATE_NAN must be SITE@STEP"):
        Locator.from_spec(spec)
