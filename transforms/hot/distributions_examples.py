"""Documented examples of hot.distribution_args (rewritten and left alone), run by tests/transforms/hot/test_hot_patterns.py.

Each rewritten example defines ``f(x, a)`` (x: a float tensor of shape (4, 3), a: actions in
range); the tests run original and rewrite on the same seeded inputs and compare bitwise.
"""
from __future__ import annotations

from ..base import Example, Inputs

#: every rewritten example is called as f(x, a): logits or means of shape (4, 3), in-range actions
_XA = Inputs("f", "torch.randn(4, 3, dtype=torch.float64 if seed % 2 else torch.float32), torch.randint(0, 3, (4,))",
             seeds=(0, 1, 2, 3, 4))

#: an actor network's head, for the examples whose scale comes from its forward
_ACTOR = (
    "import torch\n"
    "import torch.nn as nn\n"
    "from torch.distributions import Normal\n"
    "class Actor(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
)

EXAMPLES = [
    Example(
        code=(
            "import torch\n"
            "from torch.distributions import Categorical\n"
            "def f(x, a):\n"
            "    dist = Categorical(logits=x)\n"
            "    return dist.log_prob(a), dist.entropy(), dist.probs\n"
        ),
        rewritten=True,
        note="CleanRL PPO: Categorical(logits=...)",
        expected="cleanrl_ppo",
        inputs=_XA,
    ),
    Example(
        code=(
            "import torch\n"
            "from torch.distributions.normal import Normal\n"
            "def f(x, a):\n"
            "    action_logstd = torch.zeros_like(x) - 0.5\n"
            "    action_std = torch.exp(action_logstd)\n"
            "    probs = Normal(x, action_std)\n"
            "    return probs.log_prob(x * 0.5).sum(1), probs.entropy().sum(1)\n"
        ),
        rewritten=True,
        note="CleanRL continuous PPO: std bound once to torch.exp",
        expected="cleanrl_continuous_ppo",
        inputs=_XA,
    ),
    Example(
        code=(
            "import torch\n"
            "import torch.nn.functional as F\n"
            "import torch.distributions as D\n"
            "def f(x, a):\n"
            "    d = D.Normal(loc=x.tanh(), scale=F.softplus(x) + 1e-5)\n"
            "    b = D.Bernoulli(logits=x)\n"
            "    return d.log_prob(x), b.log_prob((x > 0).float())\n"
        ),
        rewritten=True,
        note="softplus + eps scale, Bernoulli logits, module alias",
        expected="softplus_eps_scale",
        inputs=_XA,
    ),
    Example(
        code=(
            "import torch\n"
            "def f(x, a):\n"
            "    d = torch.distributions.Normal(x, 0.1)\n"
            "    return d.log_prob(x + 1), d.sample_n if False else d.mean\n"
        ),
        rewritten=True,
        note="positive constant scale",
        expected="positive_constant_scale",
        inputs=_XA,
    ),
    Example(
        code=(
            "import torch\n"
            "from torch.distributions import Categorical\n"
            "def f(x, a):\n"
            "    return Categorical(x.softmax(-1)).log_prob(a)\n"
        ),
        rewritten=True,
        note="minimalRL / pytorch examples: positional probs from a softmax (runtime bound)",
        expected="minimalrl_pytorch_examples",
        inputs=_XA,
    ),
    Example(
        code=(
            "import torch\n"
            "import torch.nn as nn\n"
            "from torch.distributions.categorical import Categorical\n"
            "class Actor(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.actor = nn.Sequential(nn.Tanh(), nn.Softmax(dim=-1))\n"
            "    def forward(self, state):\n"
            "        dist = self.actor(state)\n"
            "        dist = Categorical(dist)\n"
            "        return dist\n"
            "def f(x, a):\n"
            "    dist = Actor()(x)\n"
            "    return dist.log_prob(a), dist.entropy(), dist.probs\n"
        ),
        rewritten=True,
        note="philtabor PPO: an nn.Sequential ending in nn.Softmax(dim=-1), `dist = Categorical(dist)`",
        expected="sequential_softmax",
        inputs=_XA,
    ),
    Example(
        code=(
            "import torch\n"
            "from torch.distributions import Categorical\n"
            "def f(x, a):\n"
            "    p = x.exp()\n"
            "    return Categorical(p / p.sum(-1, keepdim=True)).log_prob(a)\n"
        ),
        rewritten=False,
        reason="not provably an unmodified softmax",
        note="probs normalised by hand",
    ),
    Example(
        code=(
            "import torch\n"
            "from torch.distributions import Normal\n"
            "def f(x, std):\n"
            "    return Normal(x, std).log_prob(x)\n"
        ),
        rewritten=False,
        reason="not provably positive",
        note="scale from a parameter",
    ),
    Example(
        code=(
            "import torch\n"
            "from torch.distributions import Categorical\n"
            "def f(x, a):\n"
            "    return Categorical(logits=x, validate_args=True).log_prob(a)\n"
        ),
        rewritten=False,
        reason="validate_args is given explicitly",
        note="explicit validate_args",
    ),
    Example(
        code=(
            "import torch\n"
            "from torch.distributions import Categorical, Distribution\n"
            "Distribution.set_default_validate_args(True)\n"
            "def f(x, a):\n"
            "    return Categorical(logits=x).log_prob(a)\n"
        ),
        rewritten=False,
        reason="set_default_validate_args",
        note="validation turned on for the whole program",
    ),
    Example(
        code=(
            "import torch\n"
            "from torch.distributions import Normal\n"
            "def f(x, a):\n"
            "    std = x.exp()\n"
            "    std = std - 1\n"
            "    return Normal(x, std).log_prob(x)\n"
        ),
        rewritten=False,
        reason="not provably positive",
        note="scale name rebound (exp(x) - 1 may be 0 or negative)",
    ),
    Example(
        code=(
            "import torch\n"
            "from torch.distributions import MultivariateNormal\n"
            "class Policy:\n"
            "    def __init__(self, dtype):\n"
            "        self.cov_var = torch.full(size=(3,), fill_value=0.5, dtype=dtype)\n"
            "        self.cov_mat = torch.diag(self.cov_var)\n"
            "    def evaluate(self, mean):\n"
            "        dist = MultivariateNormal(mean, self.cov_mat)\n"
            "        return dist.log_prob(mean * 0.9), dist.entropy()\n"
            "def f(x, a):\n"
            "    return Policy(x.dtype).evaluate(x)\n"
        ),
        rewritten=True,
        note="PPO-for-Beginners: self.cov_mat = torch.diag(...) set once in __init__",
        expected="mvn_init_diagonal",
        inputs=_XA,
    ),
    Example(
        code=(
            "import torch\n"
            "from torch.distributions import MultivariateNormal\n"
            "def f(x, a):\n"
            "    var = torch.full((3,), 0.36, dtype=x.dtype)\n"
            "    cov_mat = torch.diag(var).unsqueeze(dim=0)\n"
            "    one = MultivariateNormal(x[:1], cov_mat)\n"
            "    batch = MultivariateNormal(loc=x, covariance_matrix=torch.diag_embed(var.expand_as(x)).to(x.device))\n"
            "    tril = MultivariateNormal(x, scale_tril=torch.diag(torch.exp(x[0])))\n"
            "    return one.log_prob(x), batch.log_prob(x * 2), tril.log_prob(x), batch.entropy()\n"
        ),
        rewritten=True,
        note="PPO-PyTorch (nikhilbarhate99): a local diag, unsqueeze(0), diag_embed(...).to(device); scale_tril of exp",
        expected="mvn_local_diagonal",
        inputs=_XA,
    ),
    Example(
        code=(
            "import torch\n"
            "from torch.distributions import MultivariateNormal\n"
            "def f(x, v):\n"
            "    cov = torch.diag(v)\n"
            "    cov[0, 1] = 0.3\n"
            "    return MultivariateNormal(x, cov).log_prob(x)\n"
        ),
        rewritten=False,
        reason="not provably a diagonal matrix",
        note="the diagonal matrix is changed in place after it is made (no longer symmetric)",
    ),
    Example(
        code=(
            "import torch\n"
            "from torch.distributions import MultivariateNormal\n"
            "class Policy:\n"
            "    def __init__(self):\n"
            "        self.cov_mat = torch.diag(torch.full((3,), 0.5))\n"
            "    def set_cov(self, m):\n"
            "        self.cov_mat = m\n"
            "    def evaluate(self, mean):\n"
            "        return MultivariateNormal(mean, self.cov_mat).log_prob(mean)\n"
        ),
        rewritten=False,
        reason="not provably a diagonal matrix",
        note="self.cov_mat bound again in another method (any matrix)",
    ),
    Example(
        code=(
            "import torch\n"
            "from torch.distributions import MultivariateNormal\n"
            "def f(x, s):\n"
            "    return MultivariateNormal(x, scale_tril=torch.diag(s)).log_prob(x)\n"
        ),
        rewritten=False,
        reason="scale_tril: not provably torch.diag(v) of a positive v",
        note="a scale_tril whose diagonal may be negative or zero (validation reports it; nothing else would)",
    ),
    Example(
        code=(
            "import torch\n"
            "from torch.distributions import Normal\n"
            "def f(x, a):\n"
            "    mean, log_std = x.tanh(), x.clamp(-2, 2)\n"
            "    std = log_std.exp()\n"
            "    z = torch.ones_like(mean) * 0.3\n"
            "    action_0 = torch.tanh(mean + std * z)\n"
            "    log_prob = Normal(mean, std).log_prob(mean + std * z)\n"
            "    return action_0, log_prob\n"
        ),
        rewritten=True,
        note="SAC actor (Popular-RL-Algorithms): the scale also used in arithmetic (mean + std * z), no alias",
        expected="scale_in_arithmetic",
        inputs=_XA,
    ),
    Example(
        code=(
            "import torch\n"
            "from torch.distributions import Normal\n"
            "def f(x, log_std):\n"
            "    std = log_std.exp()\n"
            "    held = [std] + []\n"
            "    held[0].sub_(5)\n"
            "    return Normal(x, std).log_prob(x)\n"
        ),
        rewritten=False,
        reason="not provably positive",
        note="the scale kept in a list by list arithmetic, then changed in place through it",
    ),
    Example(
        code=_ACTOR + (
            "        torch.manual_seed(0)\n"
            "        self.mu = nn.Linear(3, 3)\n"
            "        self.log_std = nn.Parameter(torch.full((3,), -0.5))\n"
            "    def forward(self, x):\n"
            "        std = self.log_std.exp()\n"
            "        return torch.tanh(self.mu(x)), std\n"
            "actor = Actor()\n"
            "def f(x, a):\n"
            "    mean, std = actor(x.float())\n"
            "    pi = Normal(mean, std)\n"
            "    return pi.log_prob(x.float()).sum(1), pi.entropy().sum(1)\n"
        ),
        rewritten=True,
        note="Popular-RL-Algorithms PPO: `mean, std = self.actor(s)`, the forward returning `log_std.exp()`",
        expected="scale_from_forward",
        inputs=_XA,
    ),
    Example(
        code=_ACTOR + (
            "        self.mu = nn.Linear(3, 3)\n"
            "        self.log_std = nn.Parameter(torch.zeros(3))\n"
            "    def forward(self, x):\n"
            "        return self.mu(x), self.log_std\n"
            "actor = Actor()\n"
            "def f(x, a):\n"
            "    mean, std = actor(x)\n"
            "    return Normal(mean, std).log_prob(x)\n"
        ),
        rewritten=False,
        reason="not provably positive",
        note="a forward returning the log-std itself as the scale",
    ),
]
