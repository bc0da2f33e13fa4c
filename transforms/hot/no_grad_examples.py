"""Documented examples of hot.no_grad (rewritten and left alone), run by the example tests.

Each rewritten example defines ``run(seed)`` returning what the rollout produced; the tests run
the original and the rewrite on the same seed and compare bit for bit.
"""
from __future__ import annotations

from ..base import Example, Inputs

_NET = (
    "import numpy as np\n"
    "import torch\n"
    "import torch.nn as nn\n"
    "from torch.distributions import Categorical\n"
    "class Policy(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.fc = nn.Linear(4, 2)\n"
    "    def forward(self, x):\n"
    "        return torch.softmax(self.fc(x), dim=-1)\n"
)

#: every rewritten example defines run(seed), the rollout it makes from that seed
_RUN = Inputs("run", "seed", seeds=(0, 1, 2))

EXAMPLES = [
    Example(
        code=_NET + (
            "def run(seed):\n"
            "    torch.manual_seed(seed)\n"
            "    policy = Policy()\n"
            "    out = []\n"
            "    obs = np.ones(4, dtype=np.float32)\n"
            "    for t in range(5):\n"
            "        probs = policy(torch.from_numpy(obs).float())\n"
            "        m = Categorical(probs)\n"
            "        a = m.sample().item()\n"
            "        out.append(a)\n"
            "        obs = obs * 0.5 + a\n"
            "    return out\n"
        ),
        rewritten=True,
        note="minimalRL: Categorical(policy(s)).sample().item()",
        expected="minimalrl",
        inputs=_RUN,
    ),
    Example(
        code=_NET + (
            "def run(seed):\n"
            "    torch.manual_seed(seed)\n"
            "    q = Policy()\n"
            "    acts, logs = [], []\n"
            "    for t in range(5):\n"
            "        state = torch.randn(4)\n"
            "        action = q(state).argmax().item()\n"
            "        value = q(state).max().detach().cpu().numpy()\n"
            "        print(f'value {value}')\n"
            "        acts.append(action)\n"
            "        logs.append(float(value))\n"
            "    return acts, logs\n"
        ),
        rewritten=True,
        note="DQN: argmax().item(), .detach().cpu().numpy(), logging",
        expected="dqn",
        inputs=_RUN,
    ),
    Example(
        code=_NET + (
            "class Q(Policy):\n"
            "    def sample_action(self, obs, epsilon):\n"
            "        out = self.forward(obs)\n"
            "        return out.argmax().item()\n"
            "def run(seed):\n"
            "    torch.manual_seed(seed)\n"
            "    q = Q()\n"
            "    return [q.sample_action(torch.randn(4), 0.1) for _ in range(5)]\n"
        ),
        rewritten=True,
        note="minimalRL DQN: a method returning .argmax().item()",
        expected="minimalrl_dqn",
        inputs=_RUN,
    ),
    Example(
        code=_NET + (
            "def run(seed):\n"
            "    torch.manual_seed(seed)\n"
            "    q_network = Policy()\n"
            "    obs, taken = np.ones((3, 4), dtype=np.float32), []\n"
            "    for global_step in range(4):\n"
            "        q_values = q_network(torch.Tensor(obs))\n"
            "        actions = torch.argmax(q_values, dim=1).cpu().numpy()\n"
            "        taken.append(actions)\n"
            "        obs = obs + actions[:, None]\n"
            "    return taken\n"
        ),
        rewritten=True,
        note="CleanRL DQN: torch.argmax(q_network(obs), dim=1).cpu().numpy()",
        expected="cleanrl_dqn",
        inputs=_RUN,
    ),
    Example(
        code=_NET + (
            "def iterate_batches(obs_list, net):\n"
            "    sm = nn.Softmax(dim=0)\n"
            "    for obs in obs_list:\n"
            "        act_probs_v = sm(net(torch.FloatTensor(obs)))\n"
            "        act_probs = act_probs_v.data.numpy()\n"
            "        yield int(np.random.choice(len(act_probs), p=act_probs / act_probs.sum()))\n"
            "def run(seed):\n"
            "    torch.manual_seed(seed)\n"
            "    np.random.seed(seed)\n"
            "    return list(iterate_batches(np.ones((4, 4), dtype=np.float32), Policy()))\n"
        ),
        rewritten=True,
        note="Packt Ch04: the net given as a parameter, checked at run time to be a Policy",
        expected="packt_parameter_net",
        inputs=_RUN,
    ),
    Example(
        code=_NET + (
            "def run(seed):\n"
            "    torch.manual_seed(seed)\n"
            "    policy = Policy()\n"
            "    saved = []\n"
            "    for t in range(3):\n"
            "        probs = policy(torch.randn(4))\n"
            "        m = Categorical(probs)\n"
            "        saved.append(m.log_prob(m.sample()))\n"
            "    return saved\n"
        ),
        rewritten=False,
        reason="without .detach()/.item()",
        note="REINFORCE: log-probs appended for the loss (refused)",
    ),
    Example(
        code=_NET + (
            "def run(seed):\n"
            "    policy = Policy()\n"
            "    for t in range(3):\n"
            "        out = policy(torch.randn(4))\n"
            "        if out.requires_grad:\n"
            "            print('graph')\n"
        ),
        rewritten=False,
        reason="reads .requires_grad",
        note="code reading requires_grad (refused)",
    ),
    Example(
        code=_NET + (
            "def run(seed):\n"
            "    policy = Policy()\n"
            "    opt = torch.optim.SGD(policy.parameters(), lr=0.1)\n"
            "    for t in range(3):\n"
            "        loss = policy(torch.randn(4)).sum()\n"
            "        loss.backward()\n"
            "        opt.step()\n"
        ),
        rewritten=False,
        reason="reads .backward",
        note="a training forward (refused)",
    ),
    Example(
        code=_NET + (
            "POLICY = Policy()\n"
            "def act(obs):\n"
            "    return POLICY(obs)\n"
        ),
        rewritten=False,
        reason="",
        note="a helper returning its forward: no site (the caller is where to act)",
    ),
    Example(
        code=_NET + (
            "class Agent:\n"
            "    def __init__(self):\n"
            "        self.policy = Policy()\n"
            "    def act(self, x):\n"
            "        for t in range(3):\n"
            "            self.last = self.policy(x)\n"
        ),
        rewritten=False,
        reason="stored into `self.last`",
        note="output kept on self (refused)",
    ),
    Example(
        code=_NET + (
            "from mylib import Net\n"
            "def run(seed):\n"
            "    net = Net()\n"
            "    for t in range(3):\n"
            "        a = net(torch.randn(4)).argmax().item()\n"
        ),
        rewritten=False,
        reason="",
        note="a module imported from elsewhere: not recognised as a forward (left alone, no site)",
    ),
    Example(
        code=_NET + (
            "def run(seed):\n"
            "    policy = Policy()\n"
            "    for t in range(3):\n"
            "        out = policy(torch.randn(4))\n"
            "        print(out.cpu().numpy())\n"
        ),
        rewritten=False,
        reason="calls .numpy() before .detach()",
        note=".numpy() without .detach(): it raises in the original, not under no_grad (refused)",
    ),
    Example(
        code=_NET + (
            "policy, last = Policy(), None\n"
            "def act(obs):\n"
            "    global last\n"
            "    last = policy(obs)\n"
            "    return last.argmax().item()\n"
        ),
        rewritten=False,
        reason="is declared global",
        note="output bound to a global another function may differentiate (refused)",
    ),
]
