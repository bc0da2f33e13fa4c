"""Documented examples of hot.distribution_args (rewritten and left alone), run by tests/transforms/hot/test_hot_patterns.py.

Each rewritten example defines ``f(x, a)`` (x: a float tensor of shape (4, 3), a: actions in
range); the tests run original and rewrite on the same seeded inputs and compare bitwise.
"""
from __future__ import annotations

from ..base import Example, Inputs

#: every rewritten example is called as f(x, a): logits or means of shape (4, 3), in-range actions
_XA = Inputs("f", "torch.randn(4, 3, dtype=torch.float64 if seed % 2 else torch.float32), torch.randint(0, 3, (4,))",
             seeds=(0, 1, 2, 3, 4))

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
]
