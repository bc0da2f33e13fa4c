"""``accelerate.compile``'s examples: methods it compiles and look-alikes it must leave eager.

Each example's code defines ``make()`` -> (module, inputs) for the differential test (original vs
rewrite on the same seed: close, not bitwise) where it is rewritten. Each runs as
rewritten for CUDA at ``[accelerate] level = "reassociated"`` (set on all of them below).
"""
from __future__ import annotations

import dataclasses

from ..base import Example

#: the backend and level every example is rewritten at (it compiles only for CUDA, at "reassociated")
_BACKEND, _OPTIONS = "cuda", (("level", "reassociated"),)

_HEAD = """\
import torch
import torch.nn as nn
from torch.distributions.normal import Normal
from torch.distributions.categorical import Categorical

"""

EXAMPLES = [dataclasses.replace(e, backend=_BACKEND, options=_OPTIONS) for e in [
    Example(_HEAD + """\
class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
        self.actor_mean = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 2))
        self.actor_logstd = nn.Parameter(torch.zeros(1, 2))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        action_mean = self.actor_mean(x)
        action_logstd = self.actor_logstd.expand_as(action_mean)
        action_std = torch.exp(action_logstd)
        probs = Normal(action_mean, action_std, validate_args=False)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x)


def make():
    agent = Agent()
    return agent, [torch.randn(4, 3) for _ in range(3)]


def rollout(agent, inputs):
    out = []
    for x in inputs:
        with torch.no_grad():
            out.append(agent.get_action_and_value(x))
            out.append(agent.get_value(x))
        a, logp, ent, v = agent.get_action_and_value(x, out[0][0])
        (logp.sum() + v.sum()).backward()
    out.append([p.grad for p in agent.parameters()])
    return out
""", True, note="CleanRL PPO continuous: get_action_and_value and get_value, sampling kept", expected="cleanrl_ppo_continuous"),
    Example(_HEAD + """\
class QNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.network = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x):
        return self.network(x)


def make():
    return QNetwork(), [torch.randn(8, 4) for _ in range(3)]


def rollout(q, inputs):
    return [q(x) for x in inputs]
""", True, note="CleanRL DQN: a Q-network's forward", expected="cleanrl_dqn"),
    Example(_HEAD + """\
class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 16)
        self.fc_mean = nn.Linear(16, 2)
        self.fc_logstd = nn.Linear(16, 2)

    def forward(self, x):
        x = torch.relu(self.fc(x))
        return self.fc_mean(x), torch.tanh(self.fc_logstd(x))

    def get_action(self, x):
        mean, log_std = self(x)
        std = log_std.exp()
        normal = torch.distributions.Normal(mean, std, validate_args=False)
        x_t = normal.rsample()
        y_t = torch.tanh(x_t)
        log_prob = normal.log_prob(x_t) - torch.log(1 - y_t.pow(2) + 1e-6)
        return y_t, log_prob.sum(1, keepdim=True), torch.tanh(mean)


def make():
    return Actor(), [torch.randn(5, 3) for _ in range(4)]


def rollout(actor, inputs):
    out = []
    for x in inputs:
        with torch.no_grad():
            out.append(actor.get_action(x))
    a, logp, _ = actor.get_action(inputs[0])
    (a.sum() + logp.sum()).backward()
    return out + [a, logp, [p.grad for p in actor.parameters()]]
""", True, note="CleanRL SAC: get_action calls the compiled forward (inlined, no recompiles)", expected="cleanrl_sac"),
    Example(_HEAD + """\
class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.actor = nn.Linear(4, 2)

    def get_action(self, x):
        logits = self.actor(x)
        return Categorical(logits=logits).sample().item()


agent = Agent()
for step in range(10):
    a = agent.get_action(torch.randn(4))
""", False, reason="calls .item()", note="host sync inside"),
    Example(_HEAD + """\
class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.actor = nn.Linear(4, 2)

    def get_action(self, x):
        logits = self.actor(x)
        if logits.sum() > 0:
            logits = -logits
        return logits


agent = Agent()
for step in range(10):
    a = agent.get_action(torch.randn(4))
""", False, reason="branches on a value", note="data-dependent control flow"),
    Example(_HEAD + """\
class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(3, 16), nn.ReLU())
        self.mu = nn.Linear(16, 2)
        self.log_sigma = nn.Linear(16, 2)

    def forward(self, state, deterministic: bool = False, need_log_prob=False):
        if state.dim() == 1:
            state = state.unsqueeze(0)
        hidden = self.trunk(state)
        mu, log_sigma = self.mu(hidden), torch.clip(self.log_sigma(hidden), -5, 2)
        dist = Normal(mu, torch.exp(log_sigma), validate_args=False)
        action = mu if deterministic else dist.rsample()
        log_prob = None
        if need_log_prob and not deterministic:
            log_prob = dist.log_prob(action).sum(-1)
        return torch.tanh(action), log_prob


def make():
    return Actor(), [torch.randn(3), torch.randn(3)]


def rollout(actor, inputs):
    out = []
    for x in inputs:
        with torch.no_grad():
            out.append(actor(x, deterministic=True))
    a, logp = actor(inputs[0], need_log_prob=True)
    (a.sum() + logp.sum()).backward()
    return out + [a, logp, [p.grad for p in actor.parameters()]]
""", True, note="CORL EDAC/SAC-N actor: branches on flag parameters and on the input's rank, fixed per graph",
            expected="corl_actor_flags"),
    Example(_HEAD + """\
class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.actor = nn.Linear(4, 2)

    def get_action(self, x, greedy):
        logits = self.actor(x)
        if greedy:
            logits = logits * 2
        return logits


agent = Agent()
for step in range(10):
    a = agent.get_action(torch.randn(4), torch.rand(()) > 0.5)
""", False, reason="branches on a value at line 13",
            note="a parameter with no flag default or bool annotation may be a tensor"),
    Example(_HEAD + """\
class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.actor = nn.Linear(4, 2)

    def get_action(self, x, done):
        return self.actor(x[done > 0])


agent = Agent()
for step in range(10):
    a = agent.get_action(torch.randn(5, 4), torch.randn(5))
""", False, reason="indexes with a mask", note="data-dependent shape"),
    Example(_HEAD + """\
class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.actor = nn.Linear(4, 2)

    def get_action(self, x):
        return Categorical(logits=self.actor(x)).sample()


agent = Agent()
for step in range(10):
    a = agent.get_action(torch.randn(4))
""", False, reason="with argument validation", note="a distribution that validates (host sync)"),
    Example(_HEAD + """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.fc(x)


net = Net()
for step in range(10):
    y = net(torch.randn(4))
""", False, reason="keeps state", note="a forward that counts its calls"),
    Example(_HEAD + """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


net = torch.compile(Net())
for step in range(10):
    y = net(torch.randn(4))
""", False, reason="compiles code itself", note="the user's own torch.compile"),
    Example(_HEAD + """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return torch.tanh(self.fc(x))


def make():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            print(x)
            return self.fc(x)

    return Net()


net = Net()
for step in range(10):
    y = net(torch.randn(4)) + make()(torch.randn(4))
""", True, note="a same-named class inside a function is not the module's class", expected="a_same_named_class_inside_a_function_is"),
    Example(_HEAD + """\
import torch.nn.functional as F


class GELU(nn.Module):
    def forward(self, x):
        return F.gelu(x)


class Flatten(nn.Module):
    def forward(self, x):
        return x.view(x.size(0), -1)[:, :4]


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


act, flat, head = GELU(), Flatten(), Head()
for step in range(10):
    y = head(flat(act(torch.randn(2, 2, 2))))
""", False, reason="one kernel at most, nothing to fuse",
            note="a one-op forward, views only, a head of one nn.Linear (ElegantRL, decision-transformer)"),
    Example(_HEAD + """\
class Head(nn.Module):
    def __init__(self, wide):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        if wide:
            self.fc = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))

    def forward(self, x):
        return self.fc(x)


def make():
    return Head(True), [torch.randn(3, 4) for _ in range(3)]


def rollout(head, inputs):
    return [head(x) for x in inputs]
""", True, note="a submodule set twice may be a whole network: compiled", expected="a_submodule_set_twice_may_be_a_whole_net"),
]]
