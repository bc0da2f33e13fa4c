"""Documented examples of hot.target_graph_cut (rewritten and left alone), run by the example tests.

Each rewritten example defines ``run(seed)`` returning the losses and the trained network's
parameters after a few updates; the tests run the original and the rewrite on the same seed and
compare bit for bit.
"""
from __future__ import annotations

from ..base import Example, Inputs

#: each rewritten example defines run(seed); both sides run on seeds 0 and 1 and compare bitwise
_RUN = Inputs("run", "seed", seeds=(0, 1))

_NET = (
    "import copy\n"
    "import torch\n"
    "import torch.nn as nn\n"
    "import torch.nn.functional as F\n"
    "gamma = 0.98\n"
    "class Qnet(nn.Module):\n"
    "    def __init__(self):\n"
    "        super(Qnet, self).__init__()\n"
    "        self.fc1 = nn.Linear(4, 16)\n"
    "        self.fc2 = nn.Linear(16, 2)\n"
    "    def forward(self, x):\n"
    "        return self.fc2(F.relu(self.fc1(x)))\n"
)

_TRAIN = (
    "def train(q, q_target, optimizer, batches):\n"
    "    losses = []\n"
    "    for s, a, r, s2, done in batches:\n"
    "        q_a = q(s).gather(1, a)\n"
    "        max_q_prime = q_target(s2).max(1)[0].unsqueeze(1)\n"
    "        target = r + gamma * max_q_prime * done\n"
    "        loss = F.smooth_l1_loss(q_a, target)\n"
    "        optimizer.zero_grad()\n"
    "        loss.backward()\n"
    "        optimizer.step()\n"
    "        losses.append(loss.item())\n"
    "    return losses\n"
    "def batches(n):\n"
    "    return [(torch.randn(8, 4), torch.randint(0, 2, (8, 1)), torch.randn(8, 1), torch.randn(8, 4),\n"
    "             torch.ones(8, 1)) for _ in range(n)]\n"
)

EXAMPLES = [
    Example(
        code=_NET + _TRAIN + (
            "def run(seed):\n"
            "    torch.manual_seed(seed)\n"
            "    q = Qnet()\n"
            "    q_target = Qnet()\n"
            "    q_target.load_state_dict(q.state_dict())\n"
            "    optimizer = torch.optim.Adam(q.parameters(), lr=1e-2)\n"
            "    losses = train(q, q_target, optimizer, batches(4))\n"
            "    q_target.load_state_dict(q.state_dict())\n"
            "    losses += train(q, q_target, optimizer, batches(3))\n"
            "    return losses, [p.detach() for p in q.parameters()]\n"
        ),
        rewritten=True,
        expected="minimalrl_dqn_target",
        inputs=_RUN,
        note="minimalRL DQN: the target net passed to train() and used for the TD target",
    ),
    Example(
        code=_NET + (
            "def run(seed):\n"
            "    torch.manual_seed(seed)\n"
            "    v = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))\n"
            "    v_old = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))\n"
            "    v_old.load_state_dict(v.state_dict())\n"
            "    opt = torch.optim.SGD(v.parameters(), lr=0.1)\n"
            "    out = []\n"
            "    for t in range(4):\n"
            "        s, s2 = torch.randn(5, 4), torch.randn(5, 4)\n"
            "        loss = ((v(s) - (1.0 + gamma * v_old(s2))) ** 2).mean()\n"
            "        opt.zero_grad()\n"
            "        loss.backward()\n"
            "        opt.step()\n"
            "        out.append(loss.item())\n"
            "    return out, [p.detach() for p in v.parameters()]\n"
        ),
        rewritten=True,
        expected="sequential_target",
        inputs=_RUN,
        note="a local nn.Sequential target value network inside one expression",
    ),
    Example(
        code=_NET + _TRAIN + (
            "def run(seed):\n"
            "    torch.manual_seed(seed)\n"
            "    q = Qnet()\n"
            "    q_target = Qnet()\n"
            "    for p in q_target.parameters():\n"
            "        p.requires_grad = False\n"
            "    optimizer = torch.optim.Adam(q.parameters(), lr=1e-2)\n"
            "    return train(q, q_target, optimizer, batches(3))\n"
        ),
        rewritten=False,
        note="parameters handed out (frozen by hand here; could go to an optimizer): left alone, unreported",
    ),
    Example(
        code=_NET + _TRAIN + (
            "def run(seed):\n"
            "    q = Qnet()\n"
            "    optimizer = torch.optim.Adam(q.parameters(), lr=1e-2)\n"
            "    return train(q, q, optimizer, batches(3))\n"
        ),
        rewritten=False,
        note="the trained network as its own target (residual gradient): its parameters go to the optimizer",
    ),
    Example(
        code=_NET + _TRAIN + (
            "def run(seed):\n"
            "    q = Qnet()\n"
            "    q_target = copy.deepcopy(q)\n"
            "    optimizer = torch.optim.Adam(q.parameters(), lr=1e-2)\n"
            "    return train(q, q_target, optimizer, batches(3))\n"
        ),
        rewritten=False,
        note="a target built by copy.deepcopy: not proven fresh here, left alone",
    ),
    Example(
        code=(
            "import torch\n"
            "import torch.nn as nn\n"
            "ENCODER = nn.Linear(4, 8)\n"
            "class Head(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.out = nn.Linear(8, 1)\n"
            "    def forward(self, x):\n"
            "        return self.out(ENCODER(x))\n"
            "def run(seed):\n"
            "    v = Head()\n"
            "    v_target = Head()\n"
            "    opt = torch.optim.SGD(list(v.parameters()) + list(ENCODER.parameters()), lr=0.1)\n"
            "    for t in range(3):\n"
            "        loss = (v(torch.randn(2, 4)) - v_target(torch.randn(2, 4))).pow(2).mean()\n"
            "        opt.zero_grad()\n"
            "        loss.backward()\n"
            "        opt.step()\n"
        ),
        rewritten=False,
        reason="reads `ENCODER` from outside",
        note="a target whose forward reaches a shared global encoder (its gradient is read)",
    ),
    Example(
        code=(
            "import torch\n"
            "import torch.nn as nn\n"
            "class Head(nn.Module):\n"
            "    shared = nn.Linear(4, 1)\n"
            "    def forward(self, x):\n"
            "        return self.shared(x)\n"
            "def run(seed):\n"
            "    v, v_target = Head(), Head()\n"
            "    t = Head()\n"
            "    opt = torch.optim.SGD(v.parameters(), lr=0.1)\n"
            "    loss = (v(torch.randn(2, 4)) - t(torch.randn(2, 4))).pow(2).mean()\n"
            "    loss.backward()\n"
        ),
        rewritten=False,
        reason="class attributes",
        note="a layer held as a class attribute is shared by every instance",
    ),
    Example(
        code=_NET + (
            "def run(seed):\n"
            "    q, q_target = Qnet(), Qnet()\n"
            "    target_net = Qnet()\n"
            "    opt = torch.optim.SGD(q.parameters(), lr=0.1)\n"
            "    for t in range(3):\n"
            "        y = target_net(torch.randn(2, 4))\n"
            "        y.add_(1.0)\n"
            "        loss = (q(torch.randn(2, 4)) - y).pow(2).mean()\n"
            "        loss.backward()\n"
        ),
        rewritten=False,
        reason="is changed in place",
        note="the target's output changed in place (raises on a leaf that requires grad)",
    ),
    Example(
        code=_NET + (
            "def run(seed):\n"
            "    q = Qnet()\n"
            "    q_target = Qnet()\n"
            "    opt = torch.optim.SGD(q.parameters(), lr=0.1)\n"
            "    for t in range(3):\n"
            "        with torch.no_grad():\n"
            "            y = q_target(torch.randn(2, 4))\n"
            "        loss = (q(torch.randn(2, 4)) - y).pow(2).mean()\n"
            "        loss.backward()\n"
            "    torch.save(q_target, 'target.pt')\n"
        ),
        rewritten=False,
        note="already under no_grad (and saved by torch.save): nothing to do",
    ),
    Example(
        code=_NET + _TRAIN.replace(
            "        max_q_prime = q_target(s2).max(1)[0].unsqueeze(1)\n",
            "        q_next = q_target(s2)\n        q_next *= 0.5\n        max_q_prime = q_next.max(1)[0].unsqueeze(1)\n",
        ) + (
            "def run(seed):\n"
            "    torch.manual_seed(seed)\n"
            "    q = Qnet()\n"
            "    q_target = Qnet()\n"
            "    optimizer = torch.optim.Adam(q.parameters(), lr=1e-2)\n"
            "    return train(q, q_target, optimizer, batches(3))\n"
        ),
        rewritten=False,
        reason="is updated in place",
        note="the target's output changed in place (`q_next *= 0.5`: it raises on the cut leaf)",
    ),
]
