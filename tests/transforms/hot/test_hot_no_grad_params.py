"""hot.no_grad: a forward of a module given as a parameter (transforms/hot/param_forwards.py).

Packt's ``iterate_batches(env, net, batch_size)`` acts with ``sm(net(obs_v))``; what ``net`` runs
is known only at run time, so the statement runs under ``no_grad`` where ``type(net)`` is a class
of the file whose forward was checked, and as written otherwise. Each case runs original and
rewrite on the same inputs: the same values bitwise, and the same autograd state wherever a
module could see it (a module of another class keeps its input with its graph on both sides).
"""
import numpy as np
import pytest
import torch

from scalebox_cst.report import REWRITTEN, SKIPPED
from scalebox_cst.runtime import hot_grad
from scalebox_cst.transforms.hot.no_grad import ID
import harness
from harness import rewriter

rewrite = rewriter(ID)

PACKT = '''
import numpy as np
import torch
import torch.nn as nn
class Net(nn.Module):
    def __init__(self, obs_size, hidden_size, n_actions):
        super(Net, self).__init__()
        self.net = nn.Sequential(nn.Linear(obs_size, hidden_size), nn.ReLU(), nn.Linear(hidden_size, n_actions))
    def forward(self, x):
        return self.net(x)
class Memo(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 2)
        self.last = None
    def forward(self, x):
        self.last = self.l(x)
        return self.last
class Sub(Net):
    def forward(self, x):
        self.kept = self.net(x)
        return self.kept
def iterate_batches(obs_list, net, batch_size):
    batch = []
    sm = nn.Softmax(dim=1)
    for obs in obs_list:
        obs_v = torch.FloatTensor([obs])
        act_probs_v = sm(net(obs_v))
        act_probs = act_probs_v.data.numpy()[0]
        batch.append(act_probs)
        if len(batch) == batch_size:
            yield batch
            batch = []
def run(kind, obs_list):
    torch.manual_seed(0)
    if kind == "net":
        net = Net(4, 16, 2)
    elif kind == "memo":
        net = Memo()
    else:
        net = Sub(4, 16, 2)
    out = [np.stack(b) for b in iterate_batches(obs_list, net, 2)]
    kept = getattr(net, "last", None) if kind == "memo" else getattr(net, "kept", None)
    return out, None if kept is None else (kept.requires_grad, kept.grad_fn is not None)
'''


def _obs(seed):
    return [list(r) for r in np.random.default_rng(seed).standard_normal((6, 4))]


@pytest.mark.parametrize("kind, passes", [("net", True), ("memo", False), ("sub", False)])
def test_a_parameters_forward_runs_under_no_grad_only_for_a_checked_class(monkeypatch, kind, passes):
    spy = harness.GuardSpy(monkeypatch, hot_grad, ["checked_modules"])
    original, new, out, sites = harness.pair(PACKT, "run", ID, dedent=False)
    (site,) = [s for s in sites if s.action == REWRITTEN]
    assert "where `net` is a Net (checked at run time, else as written)" in site.reason, site
    assert "_sb_checked_modules((Net,), net)" in out and "Memo" not in out.split("def iterate_batches")[1].split("def run")[0]
    for seed in range(3):
        (a, kept_a), (b, kept_b) = original(kind, _obs(seed)), new(kind, _obs(seed))
        assert len(a) == len(b) == 3 and all(x.dtype == y.dtype and x.tobytes() == y.tobytes() for x, y in zip(a, b))
        assert kept_a == kept_b  # a module of another class kept its output with its graph on both sides
    assert spy.results and all(r is passes for r in spy.results), spy.results


def test_a_checked_module_runs_without_a_graph(monkeypatch):
    modes = []

    class Recording(torch.nn.Softmax):
        def forward(self, x):
            modes.append(torch.is_grad_enabled())
            return super().forward(x)

    original, new, _, _ = harness.pair(PACKT, "run", ID, dedent=False)
    monkeypatch.setattr(torch.nn, "Softmax", Recording)  # read when iterate_batches runs
    new("net", _obs(0))
    new("memo", _obs(0))
    assert modes == [False] * 6 + [True] * 6, modes
    modes.clear()
    original("net", _obs(0))
    assert modes == [True] * 6


@pytest.mark.parametrize("change", [
    # the parameter bound again in the function: not the caller's module
    ("sm = nn.Softmax(dim=1)", "sm = nn.Softmax(dim=1)\n    net = net.train()"),
    # the class's name bound again in the file, or the class defined after the function
    ("def run(kind, obs_list):", "Net = Net\ndef run(kind, obs_list):"),
    ("def run(kind, obs_list):", "from somewhere import Net\ndef run(kind, obs_list):"),
    ("def iterate_batches(obs_list, net, batch_size):", "def iterate_batches(obs_list, net, batch_size, Net=None):"),
    # no class of the file has a checked forward (Net keeps its output too)
    ("        return self.net(x)\nclass Memo", "        self.out = self.net(x)\n        return self.out\nclass Memo"),
])
def test_look_alikes_stay_as_written(change):
    src = PACKT.replace(*change)
    out, sites = rewrite(src, dedent=False)
    assert "_sb_checked_modules" not in out and [s for s in sites if s.action == REWRITTEN] == [], sites


@pytest.mark.parametrize("after", [True, False])
def test_a_class_defined_after_the_function_is_not_checked_against(after):
    """The check names the class: where the function could run before its definition, that would
    be a NameError."""
    net = ("class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.l = nn.Linear(4, 2)\n"
           "    def forward(self, x):\n        return self.l(x)\n")
    act = "def act(net, x):\n    q = net(x)\n    return q.argmax().item()\n"
    src = "import torch\nimport torch.nn as nn\n" + (act + net if after else net + act) + "act(Net(), torch.zeros(4))\n"
    out, sites = rewrite(src, dedent=False)
    assert ("_sb_checked_modules" in out) is not after, out


def test_a_trained_output_of_a_parameters_forward_is_refused():
    src = ("import torch\nimport torch.nn as nn\n"
           "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.l = nn.Linear(4, 2)\n"
           "    def forward(self, x):\n        return self.l(x)\n"
           "def learn(net, opt, x):\n    loss = net(x).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
           "learn(Net(), None, torch.zeros(4))\n")
    out, sites = rewrite(src, dedent=False)
    assert out == src
    assert [s.action for s in sites] == [SKIPPED] and "reads .backward" in sites[0].reason, sites


def test_statements_with_other_checks_get_their_own_blocks():
    src = ("import torch\nimport torch.nn as nn\n"
           "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.l = nn.Linear(4, 2)\n"
           "    def forward(self, x):\n        return self.l(x)\n"
           "def act(actor, critic, x):\n    a = actor(x).argmax().item()\n    v = critic(x).sum().item()\n    return a, v\n"
           "def run(x):\n    torch.manual_seed(0)\n    return act(Net(), Net(), x)\n")
    original, new, out, sites = harness.pair(src, "run", ID, dedent=False)
    assert out.count("_sb_checked_modules((Net,), actor)") == 1 and out.count("_sb_checked_modules((Net,), critic)") == 1, out
    x = torch.randn(3, 4)
    assert original(x) == new(x)


@pytest.mark.parametrize("call", [
    "",  # no call: a `callback` parameter is rarely a network
    "act(nn.Linear(4, 2), torch.zeros(4))\n",  # a torch module, not a class of the file
    "act(make(), torch.zeros(4))\n",  # what make() returns is not followed
])
def test_a_class_the_file_is_not_seen_passing_is_not_checked_against(call):
    src = ("import torch\nimport torch.nn as nn\n"
           "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.l = nn.Linear(4, 2)\n"
           "    def forward(self, x):\n        return self.l(x)\n"
           "def make():\n    return Net()\n"
           "def act(net, x):\n    q = net(x)\n    return q.argmax().item()\n" + call)
    out, sites = rewrite(src, dedent=False)
    assert out == src and not [s for s in sites if s.action == REWRITTEN], sites


def test_a_keyword_argument_and_a_name_bound_in_the_caller_are_seen():
    src = ("import torch\nimport torch.nn as nn\n"
           "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.l = nn.Linear(4, 2)\n"
           "    def forward(self, x):\n        return self.l(x)\n"
           "def act(x, net=None):\n    q = net(x)\n    return q.argmax().item()\n"
           "def main():\n    policy = Net()\n    return act(torch.zeros(4), net=policy)\n")
    out, sites = rewrite(src, dedent=False)
    assert "_sb_checked_modules((Net,), net)" in out, out


# ericyangyu/PPO-for-Beginners: the network's class is an argument of the agent's __init__; the
# acting forward got no site at all (the profile showed the line hot, nothing said why)
POLICY_CLASS = '''
import torch
from torch.distributions import MultivariateNormal
class PPO:
    def __init__(self, policy_class, obs_dim, act_dim):
        self.actor = policy_class(obs_dim, act_dim)
        self.critic = policy_class(obs_dim, 1)
        self.actor_optim = torch.optim.Adam(self.actor.parameters(), lr=1e-3)
        self.critic_optim = torch.optim.Adam(self.critic.parameters(), lr=1e-3)
        self.cov_mat = torch.diag(torch.full((act_dim,), 0.5))
    def get_action(self, obs):
        mean = self.actor(obs)
        dist = MultivariateNormal(mean, self.cov_mat)
        action = dist.sample()
        log_prob = dist.log_prob(action)
        return action.detach().numpy(), log_prob.detach()
    def evaluate(self, batch_obs):
        return self.critic(batch_obs).squeeze()
    def learn(self, batch_obs, rtgs):
        for _ in range(3):
            V = self.critic(batch_obs).squeeze()
            loss = ((V - rtgs) ** 2).mean()
            self.critic_optim.zero_grad()
            loss.backward()
            self.critic_optim.step()
'''


def test_a_forward_of_a_network_built_by_a_class_parameter_says_why_it_is_left():
    out, sites = rewrite(POLICY_CLASS, dedent=False)
    assert out == POLICY_CLASS
    assert [(s.line, s.action, s.reason) for s in sites] == [
        (12, SKIPPED, "forward of self.actor: `self.actor` is built by `policy_class` (line 6), a parameter of "
                      "`__init__`: what its forward runs is not known here")]


def test_a_self_attribute_never_given_to_an_optimizer_is_no_network():
    src = POLICY_CLASS.replace("self.actor.parameters()", "[]")
    assert rewrite(src, dedent=False)[1] == []


# pranz24/pytorch-soft-actor-critic (sac.py) and dongminlee94/deep_rl (agents/*.py): the network's
# class lives in another file of the project, imported by name or by a star import; the acting
# forward got no site at all while the profile showed it hot
IMPORTED_CLASS = '''
import torch
from torch.optim import Adam
from model import GaussianPolicy, DeterministicPolicy
class SAC:
    def __init__(self, n, space, args):
        self.device = torch.device("cpu")
        if args.policy == "Gaussian":
            self.policy = GaussianPolicy(n, space.shape[0]).to(self.device)
        else:
            self.policy = DeterministicPolicy(n, space.shape[0]).to(self.device)
        self.policy_optim = Adam(self.policy.parameters(), lr=args.lr)
    def select_action(self, state, evaluate=False):
        state = torch.FloatTensor(state).to(self.device).unsqueeze(0)
        if evaluate is False:
            action, _, _ = self.policy.sample(state)
        else:
            _, _, action = self.policy.sample(state)
        return action.detach().cpu().numpy()[0]
    def update(self, batch):
        pi, log_pi, _ = self.policy.sample(batch)
        loss = (log_pi - pi).mean()
        self.policy_optim.zero_grad()
        loss.backward()
        self.policy_optim.step()
    def load(self, ckpt):
        self.policy.load_state_dict(ckpt)
'''

STAR_IMPORT = '''
import torch
import torch.optim as optim
from agents.common.buffers import *
from agents.common.networks import *
class Agent(object):
   def __init__(self, env, obs_dim, act_dim):
      self.env = env
      self.policy = GaussianPolicy(obs_dim, act_dim).to("cpu")
      self.policy_optimizer = optim.Adam(self.policy.parameters(), lr=1e-3)
   def run(self, obs):
      _, _, action, _ = self.policy(torch.Tensor(obs))
      action = action.detach().cpu().numpy()
      return self.env.step(action)
'''


def test_a_forward_of_a_network_built_by_an_imported_class_says_why_it_is_left():
    out, sites = rewrite(IMPORTED_CLASS, dedent=False)
    assert out == IMPORTED_CLASS
    why = ("call of self.policy.sample: `self.policy` is built by `GaussianPolicy` (line 9) or `DeterministicPolicy` "
           "(line 11), imported from `model`: what its `sample` runs is not known in this file")
    # the trained call (line 21) and the module method (load_state_dict) stay silent
    assert [(s.line, s.action, s.reason) for s in sites] == [(16, SKIPPED, why), (18, SKIPPED, why)]


def test_a_forward_of_a_network_built_by_a_class_of_a_star_import_says_why_it_is_left():
    out, sites = rewrite(STAR_IMPORT, dedent=False)
    assert out == STAR_IMPORT
    assert [(s.line, s.action, s.reason) for s in sites] == [
        (12, SKIPPED, "forward of self.policy: `self.policy` is built by `GaussianPolicy` (line 9), bound by a star "
                      "import (`agents.common.buffers` or `agents.common.networks`): what its forward runs is not "
                      "known in this file")]


def test_a_class_this_file_binds_or_a_torch_class_is_not_said_to_be_imported():
    # bound here (an assignment the analysis does not follow): no word of a star import
    src = STAR_IMPORT.replace("class Agent(object):", "GaussianPolicy = make_policy_class()\nclass Agent(object):")
    assert rewrite(src, dedent=False)[1] == []
    # no star import: nothing says where the name comes from
    assert rewrite(STAR_IMPORT.replace("from agents.common.networks import *\n", "").replace(
        "from agents.common.buffers import *\n", ""), dedent=False)[1] == []


def test_an_explicit_forward_call_of_an_imported_class_reads_as_its_forward():
    # vy007vikas/PyTorch-ActorCriticRL: ``import model``, ``self.actor = model.Actor(...)``,
    # ``action = self.actor.forward(state).detach()``
    src = IMPORTED_CLASS.replace("from model import GaussianPolicy, DeterministicPolicy", "import model").replace(
        "GaussianPolicy(", "model.GaussianPolicy(").replace("DeterministicPolicy(", "model.DeterministicPolicy(").replace(
        "action, _, _ = self.policy.sample(state)", "action = self.policy.forward(state)")
    sites = rewrite(src, dedent=False)[1]
    assert sites[0].line == 16 and sites[0].reason.endswith(
        "`model.GaussianPolicy` (line 9) or `model.DeterministicPolicy` (line 11), imported from `model`: what its "
        "forward runs is not known in this file")
