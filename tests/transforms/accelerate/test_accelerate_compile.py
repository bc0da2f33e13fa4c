"""accelerate.compile and runtime/compiled.py: opt-in torch.compile of module methods, guarded.

What is checked: the transform does nothing at the default level; at level "reassociated" its
examples are decorated or left byte for byte with their reason; the rewrite gives the original's
results within float tolerance on the same seed (sampled actions equal: the random stream is
kept); the run-time guard runs a site eager on a compile failure, a graph break and a recompile
storm, each reported as an event; ``[accelerate] level`` is validated; ``scalebox rewrite --fast``
decorates. torch.compile on CPU takes seconds per graph: the compiling tests are few.
"""
import os
import subprocess
import sys

import harness
import pytest
import torch

from scalebox_cst.config import Config, ConfigError
from scalebox_cst.report import REASSOCIATED, REWRITTEN
from scalebox_cst.runtime import compiled as rc
from scalebox_cst.runtime.guard_events import events
from scalebox_cst.transforms import REGISTRY
from scalebox_cst.transforms.accelerate.compile import ID, AccelerateCompile

from conftest import scalebox


def rewrite(code, level="reassociated", backend="cuda"):
    """The rewrite made for CUDA (where the transform compiles); the tests run it on CPU, where
    the run-time wrapper compiles for CPU."""
    return harness.rewrite(code, ID, backend, dedent=False, options={"accelerate": {"level": level}} if level else None)


def load(code):
    return harness.load(code, filename="<code>", module="sbtest")


def test_registered_and_off_at_the_default_level():
    assert ID in [cls.id for cls in REGISTRY]
    assert Config().transform_enabled(ID)
    for example in AccelerateCompile.EXAMPLES:
        for level in (None, "exact"):
            out, sites = rewrite(example.code, level)
            assert out == example.code and not sites


@pytest.mark.parametrize("example", [e for e in AccelerateCompile.EXAMPLES if e.rewritten], ids=lambda e: e.note[:40])
def test_examples_decorate_one_method_per_site(example):
    """Outputs and reasons: tests/transforms/test_examples_registry.py."""
    out, sites = rewrite(example.code)
    done = [s for s in sites if s.action == REWRITTEN]
    assert done and all(s.exactness == REASSOCIATED for s in done)
    assert out.count("@_sbx_compiled(site=") == len(done)
    # only methods of module-level classes (a same-named class nested in a function is another)
    assert all(line.startswith("    @") and not line.startswith("     ") for line in out.splitlines() if "@_sbx_compiled" in line)


@pytest.mark.parametrize("backend", ["cpu", "npu"])
def test_left_eager_off_cuda_with_the_measured_reason(backend):
    example = AccelerateCompile.EXAMPLES[0]
    out, sites = rewrite(example.code, backend=backend)
    assert out == example.code
    skipped = [s for s in sites if "would compile" in s.reason]
    assert len(skipped) == 2 and not [s for s in sites if s.action == REWRITTEN]
    assert ("13.1 s -> 15.2 s CPU" if backend == "cpu" else "NPU") in skipped[0].reason


def _close(a, b):
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("example", [e for e in AccelerateCompile.EXAMPLES if e.rewritten and "def rollout" in e.code],
                         ids=lambda e: e.note[:40])
def test_rewrite_matches_the_original(example):
    """Same seed, same inputs: the rewrite's outputs and gradients are the original's within
    float tolerance, sampled actions included; every call ran compiled."""
    out, _ = rewrite(example.code)
    results = []
    rc._sites.clear()
    for code in (example.code, out):
        ns = load(code)
        torch.manual_seed(0)
        model, inputs = ns["make"]()
        torch.manual_seed(1)
        results.append(ns["rollout"](model, inputs))
    assert _close(results[0], results[1])
    # every call ran compiled, with one graph per (shape, grad mode): a site called from inside
    # another (SAC's get_action calling self(x)) is inlined there and never recompiles its caller
    sites = [row for site, row in rc.stats().items() if site.startswith("t.py:") and row["calls"]]
    assert sites and all(row["fallback"] is None and row["compiled_calls"] == row["calls"] for row in sites), sites
    assert all(row["compiles"] <= 2 for row in sites), sites


def test_guard_runs_eager_when_compile_fails(monkeypatch):
    """A torch.compile that raises (no compiler, a broken backend): the site runs the original
    function, the same values bit for bit, and one compile_fallback event says why."""
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch, "compile", broken)
    net = torch.nn.Linear(3, 2)
    site = rc.Compiled(lambda x: net(x) * 2, "guard.py:1")
    x = torch.randn(4, 3)
    assert torch.equal(site(x), net(x) * 2)
    assert torch.equal(site(x), net(x) * 2)
    assert site.eager and "no C++ compiler found" in site.reason and site.compiled_calls == 0
    assert [e for e in events.memory if e["kind"] == "compile_fallback" and e["site"] == "guard.py:1"]
    rc._summary()  # at exit: what each site did, for the run's record
    summary = [e for e in events.memory if e["kind"] == "compiled_site" and e["site"] == "guard.py:1"]
    assert summary and summary[-1]["calls"] == 2 and summary[-1]["compiled_calls"] == 0 and "eager" in summary[-1]["message"]


def test_guard_runs_eager_on_a_graph_break_and_a_recompile_storm(monkeypatch):
    """Data-dependent control flow the transform could not see (in a called helper): fullgraph raises, the site
    runs eager from then on, the call that broke gives the eager result. Then a site whose shapes
    change every call: past MAX_COMPILES it stops compiling."""
    def helper(x):
        return -x if x.sum() > 0 else x  # data-dependent control flow: not one graph

    site = rc.Compiled(lambda x: helper(x) + 1, "guard.py:2")
    x = torch.randn(3)
    assert torch.equal(site(x), helper(x) + 1)
    assert site.eager and site.reason.startswith("graph break"), site.reason

    monkeypatch.setattr(rc, "MAX_COMPILES", 1)
    storm = rc.Compiled(lambda x: torch.tanh(x) * 3, "guard.py:3")
    outs = [storm(torch.randn(n)) for n in (2, 3, 4, 5)]
    assert storm.eager and storm.reason.startswith("recompile storm"), storm.reason
    assert storm.compiles == 2 and [o.shape[0] for o in outs] == [2, 3, 4, 5]
    kinds = [e["site"] for e in events.memory if e["kind"] == "compile_fallback"]
    assert "guard.py:2" in kinds and "guard.py:3" in kinds


def test_users_errors_are_raised_not_swallowed():
    """A site that compiled raises the user's own error (a shape mismatch) as eager would."""
    site = rc.Compiled(lambda a, b: a @ b, "guard.py:4")
    site(torch.randn(2, 3), torch.randn(3, 2))
    with pytest.raises(RuntimeError):
        site(torch.randn(2, 3), torch.randn(4, 2))


VALIDATION_AFTER_A_SITE = """\
import torch
from scalebox_cst.runtime.compiled import Compiled

site = Compiled(lambda x: torch.tanh(x) * 2, "guard.py:6")
site(torch.ones(3))
print("compiled", site.compiled_calls, "validation", torch.distributions.Distribution._validate_args)
try:
    torch.distributions.Categorical(probs=torch.tensor([0.5, float("nan")]))
    print("nan probs accepted")
except ValueError:
    print("nan probs refused")
"""


def test_a_compiled_site_leaves_distribution_validation_on_for_the_rest_of_the_program(tmp_path):
    """torch's first torch.compile in a process turns distribution validation off program-wide
    (TorchPatcher.patch): after one compiled site, a Categorical elsewhere in the user's code took
    NaN probabilities without a word. The site puts the default back. In a fresh process: the
    patch runs once per process, and the conftest fixture restores the default after each test."""
    proc = subprocess.run([sys.executable, "-c", VALIDATION_AFTER_A_SITE], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["compiled 1 validation True", "nan probs refused"], proc.stdout + proc.stderr


def test_switched_off_by_environment(monkeypatch):
    monkeypatch.setenv("SCALEBOX_COMPILE", "0")
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("compiled"))
    site = rc.Compiled(lambda x: x + 1, "guard.py:5")
    assert torch.equal(site(torch.ones(2)), torch.full((2,), 2.0)) and site.eager


@pytest.mark.parametrize("value", ["fast", True, 1])
def test_level_is_validated(value):
    with pytest.raises(ConfigError) as err:
        Config.from_dict({"accelerate": {"level": value}}, source="scalebox.toml")
    assert "accelerate.level" in str(err.value) and "\n" not in str(err.value)
    assert Config.from_dict({"accelerate": {"level": "reassociated"}}).option("accelerate", "level") == "reassociated"


def test_cli_fast_decorates_and_bad_level_is_one_line(tmp_path):
    (tmp_path / "agent.py").write_text(AccelerateCompile.EXAMPLES[1].code)
    scalebox("init", str(tmp_path))
    plain = scalebox("rewrite", "agent.py", "--out", "plain", cwd=tmp_path)
    assert ID not in plain.stdout and "_sbx_compiled" not in (tmp_path / "plain" / "agent.py").read_text()
    fast = scalebox("rewrite", "agent.py", "--fast", "--backend", "cuda", "--out", "fast", cwd=tmp_path)
    assert f"{ID} rewritten [reassociated]" in fast.stdout
    assert "@_sbx_compiled(site='agent.py:11')" in (tmp_path / "fast" / "agent.py").read_text()
    text = (tmp_path / "scalebox.toml").read_text().replace('level = "exact"', 'level = "fastest"')
    (tmp_path / "scalebox.toml").write_text(text)
    bad = scalebox("rewrite", "agent.py", cwd=tmp_path, check=False)
    assert bad.returncode != 0
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "accelerate.level" in lines[0] and "fastest" in lines[0], bad.stderr


OVERRIDES = '''
import torch
import torch.nn as nn


class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))

    def parameters(self, recurse=True):
        return self.head.parameters()

    def state_dict(self):
        return self.head.state_dict()


agent = Agent()
opt = torch.optim.SGD(agent.parameters(), lr=0.1)
for step in range(3):
    loss = agent(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    saved = agent.state_dict()
    size = sum(p.numel() for p in agent.parameters())
'''


def test_overrides_of_module_methods_called_in_a_loop_stay_eager():
    """epymarl's critics override parameters()/state_dict(): called in a loop, they were compiled;
    the guard's device probe called the compiled parameters() again (a RecursionError 500 calls
    deep, a fallback line printed per level) and a CUDA graph's outputs would be copies of the
    module's own tensors. forward is still compiled."""
    out, sites = rewrite(OVERRIDES)
    done = [s.reason.split(" ")[0] for s in sites if s.action == REWRITTEN]
    assert done == ["Agent.forward"], [s.describe() for s in sites]
    kept = {s.reason.split(" ")[0]: s.reason for s in sites if "overrides nn.Module" in s.reason}
    assert set(kept) == {"Agent.parameters", "Agent.state_dict"}
    assert "overrides nn.Module.parameters (bookkeeping torch and the guard call themselves" in kept["Agent.parameters"]
    assert out.count("@_sbx_compiled(") == 1


def test_module_api_lists_every_public_method_of_nn_module():
    from scalebox_cst.transforms.accelerate.compile import MODULE_API

    torch_api = {n for n in dir(torch.nn.Module) if not n.startswith("_") and callable(getattr(torch.nn.Module, n))}
    assert torch_api - {"forward"} <= MODULE_API and "forward" not in MODULE_API


def test_the_device_probe_does_not_call_a_users_parameters_override():
    calls = []

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)

        def parameters(self, recurse=True):
            calls.append(1)
            return super().parameters(recurse)

    net = Net()
    assert rc._device_type((net,), {}) == "cpu" and calls == []


PUT_DATA = '''
import torch
import torch.nn as nn


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.data = []
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return torch.softmax(self.fc(x), dim=0)

    def put_data(self, item):
        self.data.append(item)

    def heads(self, x):
        outs = []
        outs.append(self.fc(x))
        return outs


pi = Policy()
for step in range(3):
    prob = pi(torch.randn(4))
    pi.put_data((1.0, prob[0]))
    pi.heads(torch.randn(4))
'''


def test_a_method_that_appends_to_its_modules_list_stays_eager():
    """minimalRL's put_data (``self.data.append(item)``, called in the rollout loop) was compiled:
    dynamo guards on the list's length, so every call recompiled a frame without a graph, and at
    dynamo's recompile limit fullgraph raised out of the user's loop. A list made in the method
    (``outs = []``) is no kept state: that method is still compiled."""
    out, sites = rewrite(PUT_DATA)
    done = sorted(s.reason.split(" ")[0] for s in sites if s.action == REWRITTEN)
    assert done == ["Policy.forward", "Policy.heads"], [s.describe() for s in sites]
    kept = [s.reason for s in sites if s.reason.startswith("Policy.put_data")]
    assert kept and "changes self.data (.append: keeps state); left eager" in kept[0], kept
    assert out.count("@_sbx_compiled(") == 2


def test_guard_runs_eager_when_dynamo_hits_its_recompile_limit():
    """A site whose frames hold no graph (it only appends to a list) recompiles every call without
    counting in unique_graphs; at dynamo's recompile limit fullgraph raises FailOnRecompileLimitHit
    (no TorchDynamoException). That is a recompile storm: the call runs eager, once, and so does
    every later one; nothing reaches the user.

    The limit is lowered through the config's own patch(), not monkeypatch: dynamo's config values
    live outside the module's __dict__, so pytest 9's monkeypatch undid the change with delattr,
    which hides the setting (torch/utils/_config_module.py), and every later compile in the
    worker failed with 'torch._dynamo.config.recompile_limit does not exist'."""
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    kept = []
    site = rc.Compiled(lambda item: kept.append(item), "guard.py:6")
    items = [(i, torch.full((1,), float(i))) for i in range(6)]
    with dynamo_config.patch(name, 2):
        for item in items:
            site(item)
    assert hasattr(dynamo_config, name)
    assert [i for i, _ in kept] == list(range(6)) and all(t is items[i][1] for i, t in kept)
    assert site.eager and site.reason.startswith("recompile storm"), site.reason
    assert [e for e in events.memory if e["kind"] == "compile_fallback" and e["site"] == "guard.py:6"]


INIT_LOOP = '''\
import math
import torch
import torch.nn as nn


class Decoder(nn.Module):
    def __init__(self, depth):
        super().__init__()
        layers = []
        for i in range(depth):
            pad, outpad = self.same_pad(4, 2, 1)
            layers.append(nn.ConvTranspose2d(8, 8, 4, 2, padding=pad, output_padding=outpad))
        self.layers = nn.Sequential(*layers)

    def same_pad(self, k, s, d):
        val = d * (k - 1) - s + 1
        pad = math.ceil(val / 2)
        return pad, pad * 2 - val

    def decode(self, x):
        return self.layers(x)

    def forward(self, x):
        return self.decode(x)


net = Decoder(2)
for step in range(3):
    y = net.decode(torch.randn(1, 8, 4, 4))
'''


def test_a_method_called_only_in_a_loop_of_init_is_not_compiled():
    """dreamerv3-torch's ``calc_same_pad`` (integer maths called per layer in ``__init__``'s loop)
    was compiled: a dynamo trace at construction for no tensor work. A method called in the
    training loop (``decode``) still is."""
    out, sites = rewrite(INIT_LOOP)
    done = sorted(s.reason.split(" ")[0] for s in sites if s.action == REWRITTEN)
    assert done == ["Decoder.decode", "Decoder.forward"], [s.describe() for s in sites]
    assert not any(s.reason.startswith("Decoder.same_pad") for s in sites)


NO_VALUE = '''\
import torch
import torch.nn as nn


class Simpler(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(1, n)

    def reset_parameters(self):
        self.lin.reset_parameters()

    def forward(self, x):
        return torch.sigmoid(self.lin(x))


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.actor = nn.Linear(3, 2)

    def forward(self):
        raise NotImplementedError

    def act(self, state):
        return torch.tanh(self.actor(state))

    def scaled(self, x):
        if x is None:
            return None
        return self.actor(x) * 2


net, ac = Simpler(4), ActorCritic()
for epoch in range(3):
    net.reset_parameters()
    y = net(torch.ones(1))
    a = ac.act(torch.randn(3))
    b = ac.scaled(torch.randn(3))
'''


def test_a_method_that_returns_no_value_is_not_compiled():
    """ElegantRL's mcpg ``Simpler.reset_parameters`` (``self.lin.reset_parameters()``, called once
    per epoch) and Popular-RL-Algorithms' ``def forward(self): raise NotImplementedError`` were
    compiled: a graph with no output is a stub or work done for its effects on state (re-initialised
    parameters), a compile for nothing. Methods that return a value (one path may return None) still are."""
    out, sites = rewrite(NO_VALUE)
    done = sorted(s.reason.split(" ")[0] for s in sites if s.action == REWRITTEN)
    assert done == ["ActorCritic.act", "ActorCritic.scaled", "Simpler.forward"], [s.describe() for s in sites]
    kept = sorted(s.reason for s in sites if s.action != REWRITTEN and "returns no value" in s.reason)
    assert [r.split(" ")[0] for r in kept] == ["ActorCritic.forward", "Simpler.reset_parameters"], kept
    assert out.count("@_sbx_compiled(") == 3


KERNELS = '''\
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Normal


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.act = nn.Tanh()
        self.swapped = nn.Linear(4, 2)

    def grow(self):
        self.swapped = nn.Sequential(nn.Linear(4, 2), nn.Tanh())

    def views(self, x):
        return x.view(x.size(0), -1)[:, :2].unsqueeze(0)

    def one_op(self, x):
        return F.gelu(x)

    def one_layer(self, x):
        return self.fc(x)

    def layer_then_op(self, x):
        return torch.tanh(self.fc(x))

    def two_layers(self, x):
        return self.act(self.fc(x))

    def sequential(self, x):
        return self.body(x)

    def set_twice(self, x):
        return self.swapped(x)

    def gathers(self, x, idx):
        return x[idx]

    def negates(self, x):
        return -x

    def parent(self, x):
        return super().forward(x)

    def other_method(self, x):
        return self.views(x)

    def distribution(self, x):
        return Normal(x, 1.0)

    def one_arm_runs(self, x):
        if x.dim() == 2:
            bias = self.fc.bias.t().view(1, -1)
        else:
            bias = self.fc.bias.t().view(1, -1, 1, 1)
        return x + bias

    def arms_differ(self, x, deterministic=False):
        y = self.fc(x)
        return y if deterministic else torch.tanh(y) * 2
'''


@pytest.mark.parametrize("method,most", [
    ("views", 0), ("one_op", 1), ("one_layer", 1), ("negates", 1), ("gathers", 1), ("layer_then_op", 2),
    ("two_layers", 2), ("sequential", None), ("set_twice", None), ("parent", None), ("other_method", None),
    ("distribution", None), ("one_arm_runs", 1), ("arms_differ", 3)])
def test_kernel_count_counts_only_what_the_source_tells(method, most):
    """A method of one kernel at most is left eager (nothing to fuse); what the count cannot see
    into (a Sequential, a submodule set twice, super(), another method, a distribution) is many.
    Of an if/else one arm runs, and a view of a call's result is no kernel: Popular-RL-Algorithms'
    AddBias.forward (a bias viewed per input rank, one add) counted 2 through both arms and the
    chained ``.t().view(...)`` (many), and was compiled once its rank test no longer kept it eager."""
    import ast

    from scalebox_cst.transforms.accelerate import kernel_count
    from scalebox_cst.transforms.names import ImportMap

    tree = ast.parse(KERNELS)
    imports = ImportMap(tree)
    cls = next(st for st in tree.body if isinstance(st, ast.ClassDef))
    fn = next(st for st in cls.body if isinstance(st, ast.FunctionDef) and st.name == method)
    got = kernel_count.kernels(fn, kernel_count.layers(cls, imports), imports)
    assert got == (kernel_count.MANY if most is None else most)


def test_one_kernel_methods_stay_eager_with_their_reason_on_every_backend():
    """ElegantRL's GELU/Flatten modules and one-Linear heads were compiled: a graph per call for
    no fusion. On CPU the one-kernel reason is said, not the CPU figure."""
    code = KERNELS + '''

net = Net()
for step in range(3):
    x = torch.randn(2, 4)
    y = net.views(x), net.one_op(x), net.one_layer(x), net.layer_then_op(x), net.sequential(x)
'''
    for backend in ("cuda", "cpu"):
        out, sites = rewrite(code, backend=backend)
        one = sorted(s.reason.split(" ")[0] for s in sites if "one kernel at most" in s.reason)
        assert one == ["Net.one_layer", "Net.one_op", "Net.views"], [s.describe() for s in sites]
    out, sites = rewrite(code, backend="cuda")
    assert sorted(s.reason.split(" ")[0] for s in sites if s.action == REWRITTEN) == ["Net.layer_then_op", "Net.sequential"]


SOFT_UPDATE_METHOD = '''\
import torch
import torch.nn as nn


class QNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def soft_update(self, net_target, tau):
        for param_target, param in zip(net_target.parameters(), self.parameters()):
            param_target.data.copy_(param_target.data * (1.0 - tau) + param.data * tau)


q, q_target = QNet(), QNet()
for step in range(10):
    q.soft_update(q_target, 0.01)
'''


def test_an_earlier_transforms_guard_is_not_called_the_users_branch():
    """minimalRL's QNet.soft_update (found by the unseen-code sweep): vectorize.target_update
    wraps the loop in ``if not soft_update(...)`` before this transform reads the method, and the
    skip said "branches on a value at line 11 (data-dependent control flow)" of a method holding
    no branch; the reason now names what the user wrote (the loop, kept as the guard's fallback)."""
    out, sites = harness.rewrite(SOFT_UPDATE_METHOD, ["vectorize.target_update", ID], "cuda", dedent=False,
                                 options={"accelerate": {"level": "reassociated"}})
    assert "_sb_soft_update" in out
    [site] = [s for s in sites if s.transform == ID]
    assert "holds a for statement" in site.reason and "branches" not in site.reason, site.reason


NUMPY_CONSTANT = '''\
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.mu = nn.Linear(3, 2)

    def forward(self, obs):
        a = self.mu(obs)
        return (2 * (np.log(2) - a - F.softplus(-2 * a))).sum(axis=1)

    def host(self, obs):
        return np.log(self.mu(obs))


actor = Actor()
for step in range(10):
    actor(torch.randn(4, 3))
    actor.host(torch.randn(4, 3))
'''


def test_numpy_of_literals_is_a_constant_not_a_host_copy():
    """spinningup's SAC actor (tanh correction ``2*(np.log(2) - a - F.softplus(-2*a))``) was left
    eager as "calls np.log (numpy: a host copy)": np.log(2) is a constant dynamo folds (found by
    the unseen-code sweep). numpy of a tensor still is a host copy."""
    out, sites = rewrite(NUMPY_CONSTANT)
    by_line = {s.line: s for s in sites}
    assert by_line[12].action == REWRITTEN, by_line[12].reason
    assert by_line[16].action != REWRITTEN and "numpy: a host copy" in by_line[16].reason


SETTINGS = '''\
import torch
import torch.nn as nn


class Policy(nn.Module):
    def __init__(self, no_tanh: bool = False, use_lstm=False, out_dim=1, scale=None):
        super().__init__()
        self.no_tanh = no_tanh
        self.use_lstm = use_lstm
        self.out_dim = out_dim
        self.scale = scale
        self.warm = False
        self.mu = nn.Linear(3, 2)
        self.core = nn.LSTM(2, 4)

    def forward(self, x):
        y = self.mu(x) * 2
        if not self.no_tanh and self.out_dim > 1:
            y = torch.tanh(y)
        return y + 1

    def scaled(self, x):
        y = self.mu(x) * 2
        if self.scale:
            y = y * self.scale
        return y + 1

    def warmed(self, x):
        y = self.mu(x) * 2
        if self.warm:
            y = y + 1
        return y - 1

    def start(self):
        self.warm = True

    def initial_state(self, batch_size):
        if not self.use_lstm:
            return tuple()
        return tuple(torch.zeros(1, batch_size, 4) for _ in range(2))


policy = Policy()
for step in range(10):
    policy.scaled(torch.randn(4, 3))
    policy.warmed(torch.randn(4, 3))
    policy.initial_state(4)
'''


def test_settings_fixed_at_construction_are_no_data_dependent_branch():
    """CORL's ``if self.no_tanh:``, torchbeast's ``if not self.use_lstm:``, pydreamer's
    ``if self.out_dim > 1:`` test attributes __init__ sets from a flag or literal parameter and
    nothing else changes: dynamo guards on them (one graph per setting); they were "branches on a
    value (data-dependent control flow)". An attribute another method sets stays a branch on a
    value (a parameter's literal default makes a setting: a tensor passed there would break the
    graph and run eager, guarded). A
    method that only makes new tensors (torchbeast's ``initial_state``) fuses nothing and stays
    eager (found by the unseen-code sweep)."""
    out, sites = rewrite(SETTINGS)
    by_name = {s.reason.split(" ", 1)[0]: s for s in sites}
    assert by_name["Policy.forward"].action == REWRITTEN, by_name["Policy.forward"].reason
    assert by_name["Policy.warmed"].action != REWRITTEN and "branches on a value" in by_name["Policy.warmed"].reason
    assert by_name["Policy.initial_state"].action != REWRITTEN
    assert "only makes new tensors (torch.zeros(...))" in by_name["Policy.initial_state"].reason


GLOBALS = '''\
import torch
import torch.nn as nn

DETERMINISTIC = False
DISCRETE = True


class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.mu = nn.Linear(3, 2)

    def forward(self, x):
        y = self.mu(x) * 2
        if DETERMINISTIC and isinstance(x, torch.Tensor):
            y = torch.tanh(y)
        if x.is_cuda:
            y = y + 1
        return y - 1

    def act(self, x):
        y = self.mu(x) * 2
        if DISCRETE:
            y = y.argmax(-1)
        return y - 1


actor = Actor()
if __name__ == "__main__":
    DISCRETE = False
for step in range(10):
    actor.act(torch.randn(4, 3))
'''


def test_module_constants_types_and_devices_are_fixed_per_graph():
    """Popular-RL-Algorithms' ``if DETERMINISTIC:`` (a module constant), ``if state.is_cuda:`` and
    ``isinstance`` tests are guarded by dynamo, not data-dependent branches. A global the module
    binds again (``DISCRETE = False`` under ``__main__``) stays a branch on a value."""
    out, sites = rewrite(GLOBALS)
    by_name = {s.reason.split(" ", 1)[0]: s for s in sites}
    assert by_name["Actor.forward"].action == REWRITTEN, by_name["Actor.forward"].reason
    assert by_name["Actor.act"].action != REWRITTEN and "branches on a value" in by_name["Actor.act"].reason


GRAD_MODE_WITH = '''\
import torch
import torch.nn as nn


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.mu = nn.Linear(3, 2)

    def act(self, obs):
        with torch.no_grad():
            h = self.mu(obs)
            return torch.tanh(h) * 2 + h.exp()

    def logged(self, obs):
        with open("log.txt", "a"):
            h = self.mu(obs)
            return torch.tanh(h) * 2 + h.exp()

    def named(self, obs):
        with torch.no_grad() as g:
            h = self.mu(obs)
            return torch.tanh(h) * 2 + h.exp()


policy = Policy()
for step in range(10):
    policy.act(torch.randn(4, 3))
    policy.logged(torch.randn(4, 3))
    policy.named(torch.randn(4, 3))
'''


def test_a_grad_mode_with_block_is_no_reason_to_stay_eager():
    """A method whose body is ``with torch.no_grad():`` (the user's, or the one hot.no_grad puts
    around an acting forward) was left eager as "holds a with statement" (found by the unseen-code
    sweep: minimalRL's dqn ``sample_action``); dynamo records a graph's grad mode. Other ``with``
    blocks (a file, a named context) stay eager."""
    out, sites = rewrite(GRAD_MODE_WITH)
    by_line = {s.line: s for s in sites}
    assert by_line[10].action == REWRITTEN, by_line[10].reason
    assert by_line[15].action != REWRITTEN and "holds a with statement" in by_line[15].reason
    assert by_line[20].action != REWRITTEN and "holds a with statement" in by_line[20].reason


SHAPE_LOCALS = '''\
import torch
import torch.nn as nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 2)

    def forward(self, obs):
        b, c, h, w = obs.size()
        assert h == w, "square images"
        n = obs.shape[0]
        if n % 2 == 1 or h * w > 64:
            obs = obs[:, :, :4, :4]
        x = torch.relu(self.conv(obs)).mean((2, 3))
        return torch.tanh(self.head(x)) * 2

    def act(self, obs):
        n = obs.shape[0]
        n = obs.sum()
        if n > 0:
            obs = obs * 2
        x = torch.relu(self.conv(obs)).mean((2, 3))
        return torch.tanh(self.head(x)) * 2

    def pick(self, obs, k):
        h = obs.shape[-1]
        if h > k:
            obs = obs[..., :k]
        x = torch.relu(self.conv(obs)).mean((2, 3))
        return torch.tanh(self.head(x)) * 2


enc = Encoder()
for step in range(10):
    enc(torch.randn(4, 3, 4, 4))
    enc.act(torch.randn(4, 3, 4, 4))
    enc.pick(torch.randn(4, 3, 4, 4), 3)
'''


def test_locals_bound_to_shape_ints_are_fixed_per_graph():
    """``b, c, h, w = obs.size()`` then ``assert h == w`` or ``if n % 2 == 1 or h * w > 64:``
    test ints a ``dynamic=False`` graph is specialised on, as ``obs.shape[2] == obs.shape[3]``
    already was; they were "branches on a value (data-dependent control flow)" (found by the
    unseen-code sweep). A name also bound to a tensor (``n = obs.sum()``) and a comparison with a
    parameter of unknown type stay branches on a value."""
    out, sites = rewrite(SHAPE_LOCALS)
    by_name = {s.reason.split(" ", 1)[0]: s for s in sites}
    assert by_name["Encoder.forward"].action == REWRITTEN, by_name["Encoder.forward"].reason
    assert by_name["Encoder.act"].action != REWRITTEN and "branches on a value" in by_name["Encoder.act"].reason
    assert by_name["Encoder.pick"].action != REWRITTEN and "branches on a value" in by_name["Encoder.pick"].reason


SUBMODULE_TRAINING = '''\
import torch
import torch.nn as nn


class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self._mlp = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 2))
        self.scale = torch.ones(2)

    def forward(self, x):
        y = self._mlp(x)
        if self._mlp.training:
            y = torch.tanh(y) * 2
        return y * 3 - 1

    def act(self, x):
        y = self._mlp(x)
        if self.scale.sum():
            y = torch.tanh(y) * 2
        return y * 3 - 1


actor = Actor()
for step in range(10):
    actor(torch.randn(4, 3))
    actor.act(torch.randn(4, 3))
'''


def test_a_submodules_training_flag_is_fixed_per_graph():
    """CORL's AWAC actor tests ``if self._mlp.training:``, a submodule's training flag: a Python
    bool dynamo guards on, as it does ``self.training``; it was "branches on a value" (the sweep's
    list). A test of a tensor attribute stays a branch on a value."""
    out, sites = rewrite(SUBMODULE_TRAINING)
    by_name = {s.reason.split(" ", 1)[0]: s for s in sites}
    assert by_name["Actor.forward"].action == REWRITTEN, by_name["Actor.forward"].reason
    assert by_name["Actor.act"].action != REWRITTEN and "branches on a value" in by_name["Actor.act"].reason
