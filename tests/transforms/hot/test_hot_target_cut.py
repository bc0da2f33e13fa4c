"""hot.target_graph_cut: which target-network forwards have their graph cut, and that nothing
anyone reads changes.

Differential tests run the original and the rewrite on the same seed and compare the losses and
the trained network's parameters bit for bit; the rewrite must also have skipped the backward
through the target network (its parameters' ``.grad`` stays None: this fails on code the
transform leaves alone). The run-time half takes the original path for an unmarked network, an
input that requires grad, a global module hook and a non-tensor output.
"""
import pytest
import torch
import torch.nn as nn

from scalebox_cst.config import Config
from scalebox_cst.report import EXACT, REWRITTEN, SKIPPED
from scalebox_cst.runtime import hot_target
from scalebox_cst.runtime.hot_target import grads_unread, target_forward
from scalebox_cst.transforms import REGISTRY
from scalebox_cst.transforms.hot.target_cut import ID, HotTargetGraphCut
from scalebox_cst.transforms.hot.target_cut_examples import _NET, _TRAIN
import harness
from harness import rewriter

rewrite = rewriter(ID)


def load(code):
    return harness.load(code, filename="<rewritten>", module="sbtest")


def same(a, b):
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_registered_and_on_by_default():
    assert ID in [cls.id for cls in REGISTRY]
    assert Config().transform_enabled(ID)


@pytest.mark.parametrize("example", HotTargetGraphCut.EXAMPLES, ids=lambda e: e.note[:40])
def test_examples(example):
    out, sites = rewrite(example.code)
    if not example.rewritten:
        assert out == example.code
        assert not [s for s in sites if s.action == REWRITTEN]
        if example.reason:
            reasons = [s.reason for s in sites if s.action == SKIPPED]
            assert any(example.reason in r for r in reasons), reasons
        return
    done = [s for s in sites if s.action == REWRITTEN]
    assert done and all(s.exactness == EXACT for s in done)
    assert "_sb_target_forward(" in out and "_sb_grads_unread(" in out
    for seed in (0, 1, 2):
        assert same(load(example.code)["run"](seed), load(out)["run"](seed))


DQN = _NET + _TRAIN + '''
def setup(seed):
    torch.manual_seed(seed)
    q = Qnet()
    q_target = Qnet()
    q_target.load_state_dict(q.state_dict())
    optimizer = torch.optim.Adam(q.parameters(), lr=1e-2)
    losses = train(q, q_target, optimizer, batches(5))
    return losses, q, optimizer
'''


def test_dqn_no_backward_through_target_and_same_training(monkeypatch):
    out, _ = rewrite(DQN)
    built = []  # every network the rewrite marks (the target it must not run backward through)
    monkeypatch.setattr(hot_target, "grads_unread", lambda m: built.append(m) or grads_unread(m))
    a, b = load(DQN), load(out)
    originals = []
    monkeypatch.setattr(a["Qnet"], "__init__", _recording(a["Qnet"].__init__, originals))
    la, qa, opt_a = a["setup"](0)
    lb, qb, opt_b = b["setup"](0)
    ta, (tb,) = originals[1], built
    assert la == lb
    assert same([p.detach() for p in qa.parameters()], [p.detach() for p in qb.parameters()])
    assert same([p.grad for p in qa.parameters()], [p.grad for p in qb.parameters()])
    assert same(opt_a.state_dict()["state"][0]["exp_avg"], opt_b.state_dict()["state"][0]["exp_avg"])
    # the saved work: the original accumulates gradients into the target, the rewrite computes none
    assert all(p.grad is not None for p in ta.parameters())
    assert all(p.grad is None for p in tb.parameters())


def test_function_called_with_an_unmarked_network_runs_as_written():
    """Another file calling the rewritten train() with the trained network as its own target (a
    residual gradient) must get the original gradients: the mark, not the call site, decides."""
    out, _ = rewrite(DQN)
    a, b = load(DQN), load(out)
    results = []
    for ns in (a, b):
        torch.manual_seed(3)
        q = ns["Qnet"]()
        opt = torch.optim.SGD(q.parameters(), lr=0.05)
        losses = ns["train"](q, q, opt, ns["batches"](4))
        results.append((losses, [p.detach().clone() for p in q.parameters()]))
    assert same(results[0], results[1])


def _recording(init, into):
    def record(self, *args, **kwargs):
        into.append(self)
        init(self, *args, **kwargs)
    return record


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x)


def test_runtime_cuts_only_a_marked_network_with_grad_free_inputs():
    net = grads_unread(_Net())
    x = torch.randn(4, 3)
    out = target_forward(net, x)
    assert out.is_leaf and out.requires_grad and torch.equal(out, net(x))
    plain = _Net()
    kept = target_forward(plain, x)
    assert kept.grad_fn is not None  # not marked: as written
    xg = torch.randn(4, 3, requires_grad=True)
    through = target_forward(net, xg)
    assert through.grad_fn is not None  # an input that requires grad: its gradient is not cut
    through.sum().backward()
    assert xg.grad is not None


class _FirstOf(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, xs):
        return self.fc(xs[0])


def test_runtime_container_argument_as_written():
    """A list could hold a tensor that requires grad: not looked into, the graph is kept."""
    net = grads_unread(_FirstOf())
    xg = torch.randn(4, 3, requires_grad=True)
    out = target_forward(net, [xg])
    assert out.grad_fn is not None
    out.sum().backward()
    assert xg.grad is not None


def test_runtime_global_hook_takes_the_original_path():
    net = grads_unread(_Net())
    seen = []
    handle = torch.nn.modules.module.register_module_full_backward_hook(lambda m, gi, go: seen.append(m))
    try:
        out = target_forward(net, torch.randn(2, 3))
        assert out.grad_fn is not None
        out.sum().backward()
        assert seen
    finally:
        handle.remove()


def test_runtime_tuple_output_as_written():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            y = self.fc(x)
            return y, y * 2

    net = grads_unread(Two())
    out = target_forward(net, torch.randn(2, 3))
    assert isinstance(out, tuple) and out[0].grad_fn is not None


LOOKALIKES = {
    "shared via __init__ argument": (_NET + '''
class Head(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body
    def forward(self, x):
        return self.body(x)
def run(q, opt, s, s2):
    target = Head(q)
    loss = (q(s) - target(s2)).pow(2).mean()
    loss.backward()
''', "sets self.body to something"),
    "output's grad_fn read": (_NET + '''
def run(q, opt, s, s2):
    q_target = Qnet()
    y = q_target(s2)
    print(y.grad_fn)
    loss = (q(s) - y).pow(2).mean()
    loss.backward()
''', "reads .grad_fn"),
    "attribute of the target read": (_NET + '''
def run(q, opt, s, s2):
    q_target = Qnet()
    w = q_target.fc1.weight
    loss = (q(s) - q_target(s2)).pow(2).mean()
    loss.backward()
''', "`q_target.fc1` is read"),
    "target returned": (_NET + '''
def make():
    q_target = Qnet()
    y = q_target(torch.randn(2, 4))
    return q_target
''', "is passed to a Return"),
    "reachable through locals()": (_NET + '''
def run(q, s2):
    q_target = Qnet()
    loss = (q(s2) - q_target(s2)).pow(2).mean()
    loss.backward()
    return locals()
''', "calls locals()"),
    "bound twice": (_NET + '''
def run(q, s2):
    q_target = Qnet()
    q_target = Qnet()
    loss = (q(s2) - q_target(s2)).pow(2).mean()
    loss.backward()
''', "bound more than once"),
    "method sets self later": (_NET.replace("        return self.fc2(F.relu(self.fc1(x)))\n",
                                            "        self.last = x\n        return self.fc2(F.relu(self.fc1(x)))\n") + '''
def run(q, s2):
    q_target = Qnet()
    loss = (q(s2) - q_target(s2)).pow(2).mean()
    loss.backward()
''', "sets an attribute of self"),
}


@pytest.mark.parametrize("name", sorted(LOOKALIKES))
def test_lookalikes_left_alone(name):
    code, reason = LOOKALIKES[name]
    out, sites = rewrite(code)
    assert out == code
    assert not [s for s in sites if s.action == REWRITTEN]
    reasons = [s.reason for s in sites if s.action == SKIPPED]
    assert any(reason in r for r in reasons), reasons


def test_forward_already_under_no_grad_is_not_a_site():
    code = _NET + '''
def run(q, s, s2):
    q_target = Qnet()
    with torch.no_grad():
        y = q_target(s2)
    loss = (q(s) - y).pow(2).mean()
    loss.backward()
'''
    out, sites = rewrite(code)
    assert out == code and not [s for s in sites if s.transform == ID]


def test_network_whose_parameters_are_read_is_not_reported():
    """A trained or inspected network (its parameters handed out) is no target: no site at all
    (every model of every file would otherwise carry a skip)."""
    code = _NET + '''
def run(x):
    net = Qnet()
    loss = net(x).sum()
    return torch.autograd.grad(loss, list(net.parameters()))
'''
    out, sites = rewrite(code)
    assert out == code and not [s for s in sites if s.transform == ID]


@pytest.mark.parametrize("ctor", ["nn.MSELoss()", "nn.SmoothL1Loss(reduction='none')", "nn.Parameter(torch.zeros(2))",
                                  "nn.Softmax(dim=1)", "nn.ReLU()", "nn.Flatten()", "nn.Dropout(0.1)"])
def test_a_loss_or_a_parameter_is_no_network(ctor):
    """garage's DDPG: `qf_loss = nn.MSELoss()` used as `qf_loss(q, y)` was reported as a network
    that "is not a layer known to take sizes only"; a loss has no graph of its own to cut. Nor has
    a layer without parameters: Hands-On's `sm = nn.Softmax(dim=1)`, `sm(net(obs_v))`, was cut
    at every step through a guard that always fell back (its input requires grad)."""
    code = _NET + f'''
def run(q, s, y):
    crit = {ctor}
    loss = crit(q(s), y).mean()
    loss.backward()
'''
    out, sites = rewrite(code)
    assert out == code and not [s for s in sites if s.transform == ID], sites


def test_moved_to_a_device_as_a_statement_still_proven():
    code = _NET + '''
def run(q, s, s2, device):
    q_target = Qnet()
    q_target.to(device)
    q_target.eval()
    loss = (q(s) - q_target(s2)).pow(2).mean()
    loss.backward()
    return loss.item()
'''
    out, sites = rewrite(code)
    assert "_sb_target_forward(q_target, s2)" in out
    a, b = load(code), load(out)
    torch.manual_seed(0)
    q = a["Qnet"]()
    s, s2 = torch.randn(3, 4), torch.randn(3, 4)
    torch.manual_seed(1)
    la = a["run"](q, s, s2, "cpu")
    ga = [p.grad.clone() for p in q.parameters()]
    q.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    lb = b["run"](q, s, s2, "cpu")
    assert la == lb and same(ga, [p.grad for p in q.parameters()])


# In-place ops on the target's output (or an alias, a view) raise on the leaf the cut returns
# ("a leaf Variable that requires grad is being used in an in-place operation") where the
# original trained; a second backward through the target raises in the original only.
STEP = _NET + '''
def step(seed):
    torch.manual_seed(seed)
    q = Qnet()
    q_target = Qnet()
    q_target.load_state_dict(q.state_dict())
    s, s2, done = torch.randn(5, 4), torch.randn(5, 4), torch.ones(5, 1)
    BODY
    loss = (q(s) - nq).pow(2).mean()
    loss.backward()
    return loss.item(), [p.grad for p in q.parameters()]
'''


@pytest.mark.parametrize("body", [
    "nq = q_target(s2)\n    nq *= done",
    "nq = q_target(s2)\n    nq += 1.0",
    "nq = q_target(s2)\n    torch.relu_(nq)",
    "nq = q_target(s2)\n    torch.clamp_(nq, min=0.0)",
    "nq = F.relu(q_target(s2), inplace=True)",
    "nq = q_target(s2)\n    F.relu(nq, inplace=True)",
    "nq = q_target(s2)\n    F.relu(nq, True)",
    "nq = q_target(s2)\n    nq2 = nq\n    nq2 += 1.0",
    "nq = q_target(s2)\n    row = nq[0]\n    row -= 1.0",
    "nq = q_target(s2)\n    torch.mul(nq, 2, out=nq)",
    "nq = q_target(s2)\n    torch.Tensor.add_(nq, 1)",
    "nq = q_target(s2)\n    nq.__imul__(2)",
    "nq = q_target(s2)\n    (nq.sum() * 0).backward()",
    "nq = q_target(s2)\n    for _ in range(2):\n        (nq.sum() * 0).backward()",
])
def test_in_place_or_second_backward_on_the_output_is_refused(body):
    original, rewritten, out, sites = harness.pair(STEP.replace("BODY", body), "step", ID)
    assert not [s for s in sites if s.action == REWRITTEN], out
    assert any("in place" in s.reason or "written into" in s.reason or "backward" in s.reason
               for s in sites if s.action == SKIPPED), sites
    results = []
    for fn in (original, rewritten):
        try:
            results.append(fn(0))
        except RuntimeError as exc:
            results.append(type(exc))
    assert same(results[0], results[1]), results


@pytest.mark.parametrize("body", [
    "nq = q_target(s2)",
    "nq = F.relu(q_target(s2), inplace=False)",
    "nq = torch.relu(q_target(s2)) * done",
    "nq = q_target(s2).max(1)[0].unsqueeze(1) * done",
    "a = q_target(s2).max(1)[1].numpy()\n    nq = q_target(s2)",
])
def test_out_of_place_uses_stay_cut(body):
    original, rewritten, out, sites = harness.pair(STEP.replace("BODY", body), "step", ID)
    assert "_sb_target_forward(q_target, s2)" in out and not [s for s in sites if s.action == SKIPPED], sites
    for seed in (0, 1):
        assert same(original(seed), rewritten(seed))


def test_a_backward_in_a_loop_the_forward_is_outside_is_refused():
    code = STEP.replace("BODY", "nq = q_target(s2)").replace(
        "    loss = (q(s) - nq).pow(2).mean()\n    loss.backward()\n",
        "    for _ in range(2):\n        loss = (q(s) - nq).pow(2).mean()\n        loss.backward()\n")
    original, rewritten, out, sites = harness.pair(code, "step", ID)
    assert any("in a loop the forward is outside" in s.reason for s in sites if s.action == SKIPPED), sites
    with pytest.raises(RuntimeError):
        original(0)
    with pytest.raises(RuntimeError):
        rewritten(0)


def test_inplace_positions_match_torch():
    import inspect
    import torch.nn.functional as F
    from scalebox_cst.transforms.hot.flow import INPLACE_AT
    found = {}
    for name in dir(F):
        fn = getattr(F, name)
        if name.startswith("_") or not callable(fn):
            continue
        try:
            params = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            continue
        if "inplace" in params:
            found[name] = params.index("inplace")
    assert found == INPLACE_AT


def test_one_backward_reached_along_two_paths_is_one_backward():
    code = STEP.replace("BODY", "nq = q_target(s2)").replace(
        "    loss = (q(s) - nq).pow(2).mean()\n    loss.backward()\n",
        "    loss = ((q(s) - nq) * (q(s) - nq)).mean()\n    ((q(s) - nq) * (q(s) - nq)).mean().backward()\n")
    original, rewritten, out, sites = harness.pair(code, "step", ID)
    assert "_sb_target_forward(q_target, s2)" in out, sites
    for seed in (0, 1):
        assert same(original(seed), rewritten(seed))
