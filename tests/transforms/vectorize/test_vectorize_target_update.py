"""vectorize.target_update: which loops are rewritten, and that the rewrite computes what the loop does.

Differential tests run the original and the rewritten function on clones of the same networks and
compare every target parameter bitwise where the site says ``exact``. Guard tests feed what the
runtime must decline (mismatched lists, tensor coefficients, aliasing, grad mode) and check that
the original loop then runs; cache tests change the modules between calls.
"""
from conftest import TESTS  # tests/: the corpus, fake_torch_npu and the repository root beside it
import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from scalebox_cst.report import EXACT, REASSOCIATED, REWRITTEN, SKIPPED
from scalebox_cst.runtime import target_update as tu
from scalebox_cst.transforms import REGISTRY
from scalebox_cst.transforms.vectorize.target_update import ID, VectorizeTargetUpdate
import harness

ROOT = os.path.dirname(TESTS)


def rewrite(src, backend="cpu", **options):
    return harness.rewrite(src, ID, backend, options={ID: options})  # the shared harness (tests/harness.py)


def load(code):
    ns = harness.load(code, filename="<rewritten>")
    funcs = [v for k, v in ns.items() if callable(v) and getattr(v, "__module__", None) is None and not k.startswith("_")]
    return ns, funcs


def mlp(sizes, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).to(dtype)


def nets(sizes=(3, 16, 16, 1), dtype=torch.float32, seed=0):
    net = mlp(sizes, dtype, seed)
    target = copy.deepcopy(net)
    with torch.no_grad():
        for p in target.parameters():
            p.add_(torch.randn_like(p))
    return net, target


def params(module):
    return [p.detach().clone() for p in module.parameters()]


def assert_same(a, b, exact):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if exact:
            assert x.dtype == y.dtype and torch.equal(x, y), (x - y).abs().max()
        else:
            torch.testing.assert_close(x, y)


def run_both(original_fn, rewritten_fn, net, target, *args):
    """Call both functions on clones; return the targets' parameters and the sources'."""
    (n1, t1, *_), (n2, t2, *_), _, _ = harness.call_both(original_fn, rewritten_fn, net, target, *args)
    assert_same(params(n1), params(n2), exact=True)  # the source is never written
    return params(t1), params(t2)


def test_registered_before_grad_clip():
    ids = [cls.id for cls in REGISTRY]
    assert ID in ids
    if "grad_clip" in ids:
        assert ids.index(ID) < ids.index("grad_clip")


# ------------------------------------------------------------------ EXAMPLES


@pytest.mark.parametrize("example", [e for e in VectorizeTargetUpdate.EXAMPLES if e.rewritten], ids=lambda e: e.note[:40])
def test_examples_claim_exact_or_reassociated(example):
    """Outputs, reasons and the networks side by side: tests/transforms/test_examples_registry.py."""
    _, sites = rewrite(example.code, backend=example.backend, **dict(example.options))
    done = [s for s in sites if s.action == REWRITTEN]
    assert done and all(s.exactness in (EXACT, REASSOCIATED) for s in done)


# ------------------------------------------------------------------ golden output

TD3 = """\
import torch


class Agent:
    def soft_update(self):
        tau = self.tau
        # critic first
        for param, target_param in zip(self.critic.parameters(), self.critic_target.parameters()):
            target_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)
        for param, target_param in zip(self.actor.parameters(), self.actor_target.parameters()):
            target_param.data.mul_(1 - tau).add_(tau * param.data)
"""


def test_golden_td3():
    out, sites = rewrite(TD3)
    assert out == textwrap.dedent(
        """\
        from scalebox_cst.runtime.target_update import soft_update as _sb_soft_update
        from scalebox_cst.runtime.target_update import scale_add as _sb_scale_add
        import torch


        class Agent:
            def soft_update(self):
                tau = self.tau
                # critic first
                if not _sb_soft_update(self.critic, self.critic_target, tau, (1 - tau)):
                    for param, target_param in zip(self.critic.parameters(), self.critic_target.parameters()):
                        target_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)
                if not _sb_scale_add(self.actor, self.actor_target, 1 - tau, tau):
                    for param, target_param in zip(self.actor.parameters(), self.actor_target.parameters()):
                        target_param.data.mul_(1 - tau).add_(tau * param.data)
        """
    )
    assert [(s.line, s.end_line, s.action, s.exactness) for s in sites] == [
        (8, 9, REWRITTEN, EXACT),
        (10, 11, REWRITTEN, EXACT),
    ]  # lines of the original file


def test_td3_class_differential():
    out, _ = rewrite(TD3)
    ns_o, ns_r = harness.run_pair(TD3, out, {})
    agents = []
    for ns in (ns_o, ns_r):
        agent = ns["Agent"]()
        torch.manual_seed(1)
        agent.critic, agent.critic_target = nets((4, 32, 32, 1), seed=1)
        agent.actor, agent.actor_target = nets((3, 32, 1), seed=2)
        agent.tau = 0.005
        for _ in range(3):
            agent.soft_update()
        agents.append(agent)
    for name in ("critic_target", "actor_target"):
        assert_same(params(getattr(agents[0], name)), params(getattr(agents[1], name)), exact=True)


def test_module_level_loop_cleanrl():
    src = """\
    import torch
    for param, target_param in zip(actor.parameters(), target_actor.parameters()):
        target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)
    """
    out, sites = rewrite(src)
    assert "_sb_soft_update(actor, target_actor, args.tau, (1 - args.tau))" in out
    assert sites[0].action == REWRITTEN


def test_loop_variable_rebound_by_later_loop_is_fine_but_read_is_not():
    ok = """\
    def f(net, target, tau):
        for p, tp in zip(net.parameters(), target.parameters()):
            tp.data.copy_(p.data)
        for p in net.parameters():
            p.requires_grad_(False)
    """
    bad = """\
    def f(net, target, tau):
        for p, tp in zip(net.parameters(), target.parameters()):
            tp.data.copy_(p.data)
        print(p)
    """
    assert rewrite(ok)[1][0].action == REWRITTEN
    out, sites = rewrite(bad)
    assert out == textwrap.dedent(bad) and "read outside the loop" in sites[0].reason


def test_zip_rebound_is_left_alone():
    src = """\
    from itertools import zip_longest as zip
    def f(net, target):
        for p, tp in zip(net.parameters(), target.parameters()):
            tp.data.copy_(p.data)
    """
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src) and "zip is rebound" in sites[0].reason


def test_unrelated_zip_loops_are_not_reported():
    src = """\
    def f(xs, ys):
        for x, y in zip(xs, ys):
            print(x, y)
    """
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src) and sites == []


def test_non_cpu_backend_reports_fused_forms_as_reassociated():
    src = """\
    import torch
    def f(net, target, tau):
        with torch.no_grad():
            for p, tp in zip(net.parameters(), target.parameters()):
                tp.lerp_(p, tau)
    """
    _, sites = rewrite(src, backend="cuda")
    assert sites[0].action == REWRITTEN and sites[0].exactness == REASSOCIATED
    _, sites = rewrite(src, backend="cpu")
    assert sites[0].exactness == EXACT


# ------------------------------------------------------------------ hypothesis: every form, many nets

FORMS = {
    "copy": "tp.data.copy_(tau * p.data + (1 - tau) * tp.data)",
    "copy_swapped": "tp.data.copy_(tp.data * (1.0 - tau) + p.data * tau)",
    "mul_add": "tp.data.mul_(1 - tau)\n        tp.data.add_(tau * p.data)",
    "chain": "tp.data.mul_(1 - tau).add_(tau * p.data)",
    "alpha": "tp.data.mul_(1 - tau).add_(p.data, alpha=tau)",
    "lerp": "tp.data.lerp_(p.data, tau)",
    "hard": "tp.data.copy_(p.data)",
    "direct": "tp.copy_(tau * p + (1 - tau) * tp)",
}


def form_source(body, no_grad):
    head = "import torch\n"
    if no_grad:
        head += "@torch.no_grad()\n"
    return head + f"def f(net, target, tau):\n    for p, tp in zip(net.parameters(), target.parameters()):\n        {body}\n"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    form=st.sampled_from(sorted(FORMS)),
    sizes=st.lists(st.integers(0, 9), min_size=1, max_size=4),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
    tau=st.one_of(st.floats(0, 1), st.sampled_from([0, 1, 0.005, 1e-8])),
    allow_lerp=st.booleans(),
    calls=st.integers(1, 3),
)
def test_forms_differential(form, sizes, dtype, tau, allow_lerp, calls):
    src = form_source(FORMS[form], no_grad=form == "direct")
    out, sites = rewrite(src, allow_lerp=allow_lerp)
    assert sites[0].action == REWRITTEN, sites
    exact = sites[0].exactness == EXACT
    assert exact or (allow_lerp and form in ("copy", "copy_swapped", "mul_add", "chain", "direct"))
    _, (orig,) = load(src)
    _, (new,) = load(out)
    net, target = nets(tuple(sizes) if len(sizes) > 1 else (2, 3), dtype=dtype)
    t1, t2 = copy.deepcopy(target), copy.deepcopy(target)
    for _ in range(calls):
        orig(net, t1, tau)
        new(net, t2, tau)
    a, b = params(t1), params(t2)
    if exact:
        assert_same(a, b, exact=True)
    else:
        tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(dtype, 1e-5)
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=tol, atol=tol)


def test_helper_actually_runs_for_standard_modules():
    net, target = nets()
    assert tu.soft_update(net, target, 0.1, 0.9) is True
    assert tu.soft_update(net, target, 0.1, 0.9, data=False) is False  # grad mode on
    with torch.no_grad():
        assert tu.soft_update(net, target, 0.1, 0.9, data=False) is True


# ------------------------------------------------------------------ guards: the original loop runs

LOOP = """\
def f(net, target, tau):
    for p, tp in zip(net.parameters(), target.parameters()):
        tp.data.copy_(tau * p.data + (1 - tau) * tp.data)
"""


@pytest.fixture(scope="module")
def fns():
    out, sites = rewrite(LOOP)
    assert sites[0].action == REWRITTEN
    return load(LOOP)[1][0], load(out)[1][0]


def test_guard_mismatched_lengths_keeps_zip_truncation(fns):
    orig, new = fns
    net, _ = nets((3, 8, 8, 1))
    target = mlp((3, 8, 8), seed=5)  # 4 parameters against 6: zip truncates
    assert tu.soft_update(net, target, 0.5, 0.5) is False
    a, b = run_both(orig, new, net, target, 0.5)
    assert_same(a, b, exact=True)


def test_guard_shape_mismatch_raises_like_the_loop(fns):
    orig, new = fns
    net = mlp((3, 8, 1))
    target = mlp((3, 9, 1))
    assert tu.soft_update(net, target, 0.5, 0.5) is False
    for fn in (orig, new):
        with pytest.raises(RuntimeError):
            fn(copy.deepcopy(net), copy.deepcopy(target), 0.5)


@pytest.mark.filterwarnings("ignore:Casting complex values")
@pytest.mark.parametrize("tau", [torch.tensor(0.25), True, 0.25 + 0j])
def test_guard_unusual_coefficients(fns, tau):
    orig, new = fns
    net, target = nets()
    assert tu.soft_update(net, target, tau, 1 - tau) is False
    try:
        a, b = run_both(orig, new, net, target, tau)
    except RuntimeError:  # complex coefficients fail in both
        with pytest.raises(RuntimeError):
            new(copy.deepcopy(net), copy.deepcopy(target), tau)
        return
    assert_same(a, b, exact=True)


def test_guard_not_modules(fns):
    orig, new = fns

    class Holder:  # has .parameters(), is not an nn.Module
        def __init__(self, ps):
            self.ps = ps

        def parameters(self):
            return iter(self.ps)

    net, target = nets()
    h1, h2 = Holder(list(net.parameters())), Holder([p.clone() for p in target.parameters()])
    h3 = Holder([p.clone() for p in target.parameters()])
    assert tu.soft_update(h1, h2, 0.5, 0.5) is False
    orig(h1, h2, 0.3)
    new(h1, h3, 0.3)
    assert_same(h2.ps, h3.ps, exact=True)


def test_guard_overridden_parameters(fns):
    orig, new = fns

    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2)
            self.b = nn.Linear(2, 2)

        def parameters(self, recurse=True):  # reversed order: only the loop knows
            return iter(list(super().parameters())[::-1])

    torch.manual_seed(0)
    net, target = Odd(), Odd()
    assert tu.soft_update(net, target, 0.5, 0.5) is False
    a, b = run_both(orig, new, net, target, 0.3)
    assert_same(a, b, exact=True)


def test_guard_cross_index_aliasing(fns):
    orig, new = fns
    shared = nn.Linear(4, 4)
    net = nn.Sequential(nn.Linear(4, 4), shared)
    target = nn.Sequential(shared, nn.Linear(4, 4))  # target[0] is net[1]
    assert tu.soft_update(net, target, 0.5, 0.5) is False
    n1 = copy.deepcopy((net, target))
    n2 = copy.deepcopy((net, target))
    orig(*n1, 0.3)
    new(*n2, 0.3)
    assert_same(params(n1[1]), params(n2[1]), exact=True)


@pytest.mark.parametrize("form", sorted(set(FORMS) - {"direct"}))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_a_layer_shared_at_the_same_index_updates_as_the_loop(monkeypatch, form, dtype):
    """Found by a differential review: ``target[1] = net[1]`` (the pair's p is its tp) gave other
    values once the compiled kernel took over, and always in half precision: the loop reads p
    after scaling tp, the fused paths before. Such a pair takes the loop."""
    monkeypatch.setattr(tu, "NUMBA_AFTER", 0)  # the compiled kernel from the first call
    src = form_source(FORMS[form], no_grad=False)
    out, sites = rewrite(src)
    assert sites[0].action == REWRITTEN
    _, (orig,) = load(src)
    _, (new,) = load(out)
    net, target = nets((3, 5, 2), dtype=dtype)
    target[2] = net[2]  # the last Linear is one module in both
    n1, n2 = copy.deepcopy((net, target)), copy.deepcopy((net, target))
    for _ in range(3):
        orig(*n1, 0.3)
        new(*n2, 0.3)
    assert_same(params(n1[1]), params(n2[1]), exact=True)
    assert_same(params(n1[0]), params(n2[0]), exact=True)


def test_same_module_both_sides(fns):
    orig, new = fns
    net = mlp((3, 5, 2))
    n1, n2 = copy.deepcopy(net), copy.deepcopy(net)
    orig(n1, n1, 0.3)
    new(n2, n2, 0.3)
    assert_same(params(n1), params(n2), exact=True)


def test_direct_form_outside_no_grad_raises_like_the_loop():
    src = form_source(FORMS["direct"], no_grad=False)
    out, _ = rewrite(src)
    new = load(out)[1][0]
    net, target = nets()
    with pytest.raises(RuntimeError, match="leaf Variable"):
        new(net, target, 0.1)


def test_data_form_does_not_bump_version_counters(fns):
    _, new = fns
    net, target = nets()
    before = [p._version for p in target.parameters()]
    new(net, target, 0.1)
    assert [p._version for p in target.parameters()] == before


def test_empty_modules(fns):
    orig, new = fns
    assert tu.soft_update(nn.ReLU(), nn.ReLU(), 0.1, 0.9) is True
    new(nn.ReLU(), nn.ReLU(), 0.1)


# ------------------------------------------------------------------ cache invalidation


def test_cache_follows_module_changes(fns):
    orig, new = fns
    net, target = nets((3, 8, 8, 1))
    n1, t1 = copy.deepcopy(net), copy.deepcopy(target)
    n2, t2 = net, target

    def step(tau=0.2):
        orig(n1, t1, tau)
        new(n2, t2, tau)
        assert_same(params(t1), params(t2), exact=True)

    step()
    step()  # cached plan
    # replace a layer in both (same shapes)
    torch.manual_seed(3)
    fresh = nn.Linear(8, 8)
    n1[2], n2[2] = copy.deepcopy(fresh), copy.deepcopy(fresh)
    step()
    # change dtype (module.to rebinds p.data on the same Parameter objects)
    for m in (n1, t1, n2, t2):
        m.double()
    step()
    # replace .data of one parameter by hand
    with torch.no_grad():
        for m in (t1, t2):
            m[0].weight.data = m[0].weight.data.clone() + 1
    step()
    # register a new parameter
    for m in (n1, n2, t1, t2):
        m[0].extra = nn.Parameter(torch.ones(3, dtype=torch.float64))
    step()
    # delete a submodule from the source only: lengths differ, zip truncates
    del n1[4], n2[4]
    step()


def test_cache_entry_dies_with_modules():
    tu.clear_cache()
    net, target = nets()
    assert tu.soft_update(net, target, 0.1, 0.9)
    assert len(tu._CACHE) == 1
    del net, target
    import gc

    gc.collect()
    assert len(tu._CACHE) == 0


# ------------------------------------------------------------------ the example training script


def test_pendulum_ddpg_rewrite_prints_identical_numbers(tmp_path):
    path = os.path.join(ROOT, "examples", "pendulum_ddpg", "train.py")
    src = open(path, encoding="utf-8").read()
    out, sites = rewrite(src)
    rewritten = [s for s in sites if s.action == REWRITTEN]
    assert len(rewritten) >= 2 and all(s.exactness == EXACT for s in rewritten)
    new_path = tmp_path / "train.py"
    new_path.write_text(out)
    args = ["--total-steps", "700", "--learning-starts", "200", "--batch-size", "32", "--log-interval", "100"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    outputs = []
    # the original; the rewrite (foreach: fewer updates than the numba threshold); the rewrite
    # with the compiled CPU pass from the first update
    for script, numba_after in ((path, "-1"), (str(new_path), "1000"), (str(new_path), "0")):
        env["SCALEBOX_TARGET_UPDATE_NUMBA_AFTER"] = numba_after
        proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        outputs.append([" ".join(w for w in line.split() if not w.startswith("sps=")) for line in proc.stdout.splitlines()])
    assert outputs[0] == outputs[1] == outputs[2]
    assert any("critic_loss=" in line and "nan" not in line for line in outputs[0])


def test_cache_does_not_keep_cyclic_networks_alive():
    import gc
    import weakref

    tu.clear_cache()
    net, target = nets()
    target[0].owner = [target]  # a cycle through a child (not a submodule: a plain attribute)
    assert tu.soft_update(net, target, 0.1, 0.9)
    ref = weakref.ref(target)
    del target
    gc.collect()
    assert ref() is None and len(tu._CACHE) == 0


def test_none_submodule_and_parameter_entries():
    net, target = nets((3, 4, 2))
    for m in (net, target):
        m.add_module("missing", None)
        m[0].register_parameter("unused", None)
    orig, new = load(LOOP)[1][0], load(rewrite(LOOP)[0])[1][0]
    a, b = run_both(orig, new, net, target, 0.25)
    assert_same(a, b, exact=True)
    assert tu.soft_update(net, target, 0.1, 0.9)
    assert tu.soft_update(net, target, 0.1, 0.9)  # the cached plan validates with None entries


# ------------------------------------------------------------------ CUDA (runs where a GPU is present)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_cuda_forms(form, dtype, capsys):
    src = form_source(FORMS[form], no_grad=form == "direct")
    out, sites = rewrite(src, backend="cuda")
    exact = sites[0].exactness == EXACT
    _, (orig,) = load(src)
    _, (new,) = load(out)
    net, target = nets((17, 300, 129, 3), dtype=dtype)
    net, target = net.cuda(), target.cuda()
    t1, t2 = copy.deepcopy(target), copy.deepcopy(target)
    for tau in (0.005, 0.3, 0.995):
        orig(net, t1, tau)
        new(net, t2, tau)
    a, b = params(t1), params(t2)
    bitwise = all(torch.equal(x, y) for x, y in zip(a, b))
    with capsys.disabled():
        print(f"\ncuda {form} {dtype}: claimed {sites[0].exactness}, bitwise equal: {bitwise}")
    if exact:
        assert bitwise
    else:
        tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(dtype, 1e-5)
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=tol, atol=tol)


def test_reads_before_the_loop_and_vars_with_arguments_do_not_block():
    src = """\
    import torch
    def finish(policy, target, args, rewards):
        R = 0
        for r in rewards[::-1]:
            R = r + args.gamma * R
        config = vars(args)
        for p, R in zip(policy.parameters(), target.parameters()):
            R.data.copy_(p.data)
        return config
    """
    out, sites = rewrite(src)
    assert sites[0].action == REWRITTEN, sites


@pytest.mark.parametrize(
    "tail",
    [
        "    print(locals())\n",  # reads every local
        "    def later():\n        return tp\n    return later\n",  # a closure may run after the loop
    ],
)
def test_reads_that_may_see_the_loop_variable_block(tail):
    src = (
        "def f(net, target):\n"
        "    for p, tp in zip(net.parameters(), target.parameters()):\n"
        "        tp.data.copy_(p.data)\n"
    ) + tail
    out, sites = rewrite(src)
    assert out == src and "read outside the loop" in sites[0].reason


def test_read_before_the_loop_inside_an_enclosing_loop_blocks():
    src = (
        "def f(net, target, n):\n"
        "    for step in range(n):\n"
        "        print(tp)\n"
        "        for p, tp in zip(net.parameters(), target.parameters()):\n"
        "            tp.data.copy_(p.data)\n"
    )
    out, sites = rewrite(src)
    assert out == src and "read outside the loop" in sites[0].reason


# ------------------------------------------------------------------ the compiled CPU pass (numba)


@pytest.fixture
def numba_now(monkeypatch):
    pytest.importorskip("numba")
    monkeypatch.setattr(tu, "NUMBA_AFTER", 0)
    tu.clear_cache()
    yield
    tu.clear_cache()


@pytest.mark.parametrize("form", ["copy", "copy_swapped", "mul_add", "chain"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_numba_pass_is_bitwise_the_loop(numba_now, form, dtype):
    src = form_source(FORMS[form], no_grad=False)
    out, sites = rewrite(src)
    assert sites[0].exactness == EXACT
    orig, new = load(src)[1][0], load(out)[1][0]
    net, target = nets((7, 33, 65, 3), dtype=dtype)
    t1, t2 = copy.deepcopy(target), copy.deepcopy(target)
    for tau in (0.005, 0.5, 1, 0, 1e-30, 0.999999):
        orig(net, t1, tau)
        new(net, t2, tau)
    assert tu._plan(net, t2).kernel, "the compiled pass was not used"
    assert_same(params(t1), params(t2), exact=True)


def test_numba_pass_waits_for_enough_calls(monkeypatch):
    pytest.importorskip("numba")
    monkeypatch.setattr(tu, "NUMBA_AFTER", 3)
    tu.clear_cache()
    net, target = nets()
    for _ in range(3):
        tu.soft_update(net, target, 0.1, 0.9)
    assert tu._plan(net, target).kernel is None
    tu.soft_update(net, target, 0.1, 0.9)
    assert tu._plan(net, target).kernel
    tu.clear_cache()


def test_numba_pass_follows_module_changes(numba_now):
    orig, new = load(LOOP)[1][0], load(rewrite(LOOP)[0])[1][0]
    net, target = nets((3, 8, 8, 1))
    t1, t2 = copy.deepcopy(target), target
    orig(net, t1, 0.2)
    new(net, t2, 0.2)
    for m in (net, t1, t2):
        m.double()  # new storage behind the same Parameter objects: the numpy views are stale
    orig(net, t1, 0.2)
    new(net, t2, 0.2)
    assert_same(params(t1), params(t2), exact=True)
    assert tu._plan(net, t2).kernel


def test_numba_pass_skips_half_and_noncontiguous(numba_now):
    net, target = nets(dtype=torch.float16)
    assert tu.soft_update(net, target, 0.1, 0.9)
    assert not tu._plan(net, target).kernel
    net, target = nets()
    with torch.no_grad():
        w = target[0].weight
        w.data = w.data.t().contiguous().t()  # same values, transposed strides
    t1 = copy.deepcopy(target)
    assert tu.soft_update(net, target, 0.1, 0.9)
    assert not tu._plan(net, target).kernel
    for p, tp in zip(net.parameters(), t1.parameters()):
        tp.data.copy_(0.1 * p.data + 0.9 * tp.data)
    assert_same(params(t1), params(target), exact=True)


# ------------------------------------------------------------------ forms found on real code (tests/corpus)


AUG = """\
import torch


def soft_update(net, target, polyak):
    for p, p_targ in zip(net.parameters(), target.parameters()):
        p_targ.data *= polyak
        p_targ.data += (1 - polyak) * p.data


@torch.no_grad()
def soft_update_direct(net, target, polyak):
    for p, p_targ in zip(net.parameters(), target.parameters()):
        p_targ *= polyak
        p_targ += (1 - polyak) * p
"""


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_augmented_assignment_form_is_bitwise_the_loop(dtype):
    """`tp.data *= b; tp.data += a * p.data` is mul_ then add_ (the .data setter stores the same
    tensor back): rewritten as scale_add, bitwise equal, versions bumped only where the loop's are."""
    out, sites = rewrite(AUG)
    assert [(s.action, s.exactness) for s in sites] == [(REWRITTEN, EXACT)] * 2
    ns_old, _ = load(AUG)
    ns_new, _ = load(out)
    for name in ("soft_update", "soft_update_direct"):
        net, target = nets(dtype=dtype)
        t1, t2 = copy.deepcopy(target), copy.deepcopy(target)
        ns_old[name](net, t1, 0.995)
        ns_new[name](net, t2, 0.995)
        assert_same(params(t1), params(t2), exact=True)
        # bumped where the loop bumps them (how often may differ: float16 takes out-of-place steps)
        assert [p._version > 0 for p in t1.parameters()] == [p._version > 0 for p in t2.parameters()]


@pytest.mark.parametrize(
    "body",
    [
        "p_targ.data -= (1 - polyak) * (p_targ.data - p.data)",  # not a recognised form
        "p_targ.data *= polyak\n        p_targ.data += (1 - polyak) * p_targ.data",  # adds the target
        "p_targ.data /= polyak\n        p_targ.data += (1 - polyak) * p.data",
    ],
)
def test_augmented_assignment_look_alikes_are_skipped(body):
    src = (
        "def f(net, target, polyak):\n"
        "    for p, p_targ in zip(net.parameters(), target.parameters()):\n"
        f"        {body}\n"
    )
    out, sites = rewrite(src)
    assert out == src
    assert [s.action for s in sites] == [SKIPPED]


TEMP = """\
def update(source, target, tau):
    for target_p, source_p in zip(target.parameters(), source.parameters()):
        new_val = tau * target_p.data + (1.0 - tau) * source_p.data
        target_p.data.copy_(new_val)
"""


def test_temporary_is_inlined_and_bitwise_the_loop():
    out, sites = rewrite(TEMP)
    assert [(s.action, s.exactness) for s in sites] == [(REWRITTEN, EXACT)]
    assert "new_val" not in out.split("if not")[1].split(":")[0]  # the guard call does not use it
    _, (orig,) = load(TEMP)
    _, (new,) = load(out)
    a, b = run_both(orig, new, *nets(), 0.995)
    assert_same(a, b, exact=True)


@pytest.mark.parametrize(
    "src",
    [
        # the temporary is read after the loop: the rewrite would not bind it
        TEMP + "    return new_val\n",
        # used twice
        TEMP.replace("target_p.data.copy_(new_val)", "target_p.data.copy_(new_val * new_val)"),
        # not adjacent: something runs between the assignment and its use
        TEMP.replace("        target_p.data.copy_", "        print(new_val)\n        target_p.data.copy_"),
        # the loop variable is a global other code reads
        "def update(source, target, tau):\n"
        "    global tp\n"
        "    for tp, p in zip(target.parameters(), source.parameters()):\n"
        "        tp.data.copy_(tau * p.data + (1 - tau) * tp.data)\n",
    ],
)
def test_temporary_and_global_look_alikes_are_skipped(src):
    out, sites = rewrite(src)
    assert out == src
    assert [s.action for s in sites] == [SKIPPED], sites


def test_update_shaped_loops_over_other_iterables_are_reported():
    """SB3's polyak_update (``mul_`` then ``th.add(..., out=...)`` over parameter iterables the
    caller passes, often generators): left alone, with a site saying why, never silently."""
    from scalebox_cst.report import SKIPPED

    src = (
        "import torch as th\n"
        "def polyak_update(params, target_params, tau):\n"
        "    with th.no_grad():\n"
        "        for param, target_param in zip(params, target_params):\n"
        "            target_param.data.mul_(1 - tau)\n"
        "            th.add(target_param.data, param.data, alpha=tau, out=target_param.data)\n"
        "def not_an_update(xs, ys):\n"
        "    for x, y in zip(xs, ys):\n"
        "        print(x, y)\n"
    )
    res = harness.rewrite_result(src, ID, path="u.py")
    assert res.output.decode() == src
    sites = [(s.line, s.action, s.reason) for s in res.report.sites]
    assert sites == [(4, SKIPPED, "iterates `params`, not the .parameters() of two modules")], sites


# ------------------------------------------------------------------ `tp.data = a * p.data + b * tp.data`

DATA_ASSIGN = """\
def update_target(ac, ac_targ, polyak):
    for p, p_targ in zip(ac.parameters(), ac_targ.parameters()):
        p_targ.data = polyak * p_targ.data + (1 - polyak) * p.data


def soft_update(target, source, tau):
    for target_param, param in zip(target.parameters(), source.parameters()):
        target_param.data = target_param.data * (1.0 - tau) + param.data * tau
"""


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 9), min_size=2, max_size=4),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
    tau=st.one_of(st.floats(0, 1), st.sampled_from([0, 1, 0.995, 1e-8])),
    calls=st.integers(1, 3),
)
def test_data_assignment_form_is_bitwise_the_loop(sizes, dtype, tau, calls):
    """The loop stores a new tensor in each target parameter; the rewrite stores the same values
    the same way: same Parameter objects, new storage, views of the old storage untouched."""
    out, sites = rewrite(DATA_ASSIGN)
    assert [(s.action, s.exactness) for s in sites] == [(REWRITTEN, EXACT)] * 2
    assert out.count("replace=True") == 2
    old, _ = load(DATA_ASSIGN)
    new, _ = load(out)
    for name, (first, second) in (("update_target", (0, 1)), ("soft_update", (1, 0))):
        net, target = nets(tuple(sizes), dtype=dtype)
        t1, t2 = copy.deepcopy(target), copy.deepcopy(target)
        objects = [id(p) for p in t2.parameters()]
        views = [(p.data.view(-1), p.detach().clone()) for p in t2.parameters()]
        for _ in range(calls):  # grad mode on: the loop does not need it off
            old[name](*((net, t1) if first == 0 else (t1, net)), tau)
            new[name](*((net, t2) if first == 0 else (t2, net)), tau)
        assert_same(params(t1), params(t2), exact=True)
        assert [id(p) for p in t2.parameters()] == objects
        for view, before in views:  # the old storage keeps the old values, as after the loop
            assert torch.equal(view, before.view(-1))


def test_data_assignment_after_declined_calls_and_same_module():
    """Declined calls run the loop (which replaces the storage the plan cached): the next call
    rebuilds the plan; a module updated from itself computes from the old values of each pair."""
    out, _ = rewrite(DATA_ASSIGN)
    old, _ = load(DATA_ASSIGN)
    new, _ = load(out)
    net, target = nets()
    t1, t2 = copy.deepcopy(target), copy.deepcopy(target)
    for tau in (0.5, torch.tensor(0.25), 0.75):  # the tensor coefficient is declined
        old["update_target"](net, t1, tau)
        new["update_target"](net, t2, tau)
        assert_same(params(t1), params(t2), exact=True)
    n1, n2 = copy.deepcopy(net), copy.deepcopy(net)
    old["update_target"](n1, n1, 0.3)
    new["update_target"](n2, n2, 0.3)
    assert_same(params(n1), params(n2), exact=True)


def test_data_assignment_then_compiled_copy_form_writes_the_new_storage(numba_now):
    """A compiled pass holds numpy views of the plan's tensors: after a `.data =` update replaced
    them, the copy_ form of the same pair must write the parameters' new storage."""
    replace_fn = load(rewrite(DATA_ASSIGN)[0])[0]["update_target"]
    copy_fn = load(rewrite(LOOP)[0])[1][0]
    net, target = nets((5, 17, 3))
    t1 = copy.deepcopy(target)
    copy_fn(net, target, 0.1)
    assert tu._plan(net, target).kernel
    replace_fn(net, target, 0.9)
    copy_fn(net, target, 0.2)
    for p, tp in zip(net.parameters(), t1.parameters()):
        tp.data.copy_(0.1 * p.data + 0.9 * tp.data)
    for p, tp in zip(net.parameters(), t1.parameters()):
        tp.data = 0.9 * tp.data + 0.1 * p.data
    for p, tp in zip(net.parameters(), t1.parameters()):
        tp.data.copy_(0.2 * p.data + 0.8 * tp.data)
    assert_same(params(t1), params(target), exact=True)


def test_tied_weights_are_not_called_a_mistake():
    """sheeprl ties its player's parameters to its agent's (``p.data = agent_p.data`` under "Tie
    weights between the agent and the player", 27 loops over 14 files): the skip told the user to
    write ``p.data.copy_(agent_p.data)`` for a copy, which would untie them (found by the
    unseen-code sweep). It says what the loop does and gives no advice."""
    src = (
        "def tie(agent, player):\n"
        "    for agent_p, p in zip(agent.parameters(), player.parameters()):\n"
        "        p.data = agent_p.data\n"
    )
    out, sites = harness.rewrite(src, "vectorize.target_update", dedent=False)
    [site] = sites
    assert out == src and "tied weights" in site.reason and "copy_" not in site.reason, site.reason


@pytest.mark.parametrize(
    "body, reason",
    [
        ("tp.data = p.data", "share the source's storage"),  # aliasing, not a copy
        ("tp.data = tau * p.data + (1 - tau) * p.data", "assigns .data"),  # no target term
        ("tp.data = tau * p.data.clamp(-1, 1) + (1 - tau) * tp.data", "assigns .data"),
        ("tp.data = tau * p.data - (1 - tau) * tp.data", "assigns .data"),
        ("tp.data = tau * p.data + (1 - tau) * tp.data\n        tp.data.clamp_(-1, 1)", "assigns .data"),
    ],
)
def test_data_assignment_look_alikes_are_skipped(body, reason):
    src = (
        "def f(net, target, tau):\n"
        "    for p, tp in zip(net.parameters(), target.parameters()):\n"
        f"        {body}\n"
    )
    out, sites = rewrite(src)
    assert out == src
    assert [s.action for s in sites] == [SKIPPED] and reason in sites[0].reason, sites
