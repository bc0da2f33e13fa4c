"""hot.distribution_args: a Normal's scale unpacked from a forward of this file
(``mean, std = self.actor(s)``; transforms/hot/forward_returns.py).

The scale is taken as positive only where every body the call may run returns, at that
position, what a scale bound in place would be taken for (exp, softplus, plus a positive
constant). Each rewritten case runs original and rewrite on the same inputs (bitwise); each
look-alike must stay as written.
"""
import pytest
import torch

from scalebox_cst.report import REWRITTEN, SKIPPED
from scalebox_cst.transforms.hot.distributions import ID
import harness
from harness import rewriter

rewrite = rewriter(ID)

ACTOR = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Normal
class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.mu = nn.Linear(3, 3)
        self.log_std = nn.Parameter(torch.full((3,), -0.5))
    def forward(self, x):
        FORWARD
EXTRA
class Agent:
    def __init__(self):
        self.actor = Actor()
    def act(self, x):
        CALLER
        pi = Normal(mean, std)
        return pi.log_prob(x).sum(1), pi.entropy().sum(1), pi.rsample()
def run(x):
    torch.manual_seed(1)
    return Agent().act(x)
'''


def src(forward, caller="mean, std = self.actor(x)", extra=""):
    return ACTOR.replace("FORWARD", forward).replace("CALLER", caller).replace("EXTRA", extra)


@pytest.mark.parametrize("forward", [
    "std = self.log_std.exp()\n        return self.mu(x), std",
    "return self.mu(x), torch.exp(self.log_std)",
    "std = F.softplus(self.log_std) + 1e-5\n        return self.mu(x), std",
    "std = torch.exp(self.log_std)\n        if x.shape[0] > 2:\n            return self.mu(x), std\n        return torch.tanh(self.mu(x)), std",
])
def test_a_scale_a_forward_returns_positive_is_rewritten(forward, caller="mean, std = self.actor(x)"):
    original, new, out, sites = harness.pair(src(forward, caller), "run", ID, dedent=False)
    assert [s.action for s in sites] == [REWRITTEN], sites
    assert "self.actor(...)[1]" in sites[0].reason and "in `forward` (line 12)" in sites[0].reason, sites
    for seed in range(3):
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(seed))
        a, b = original(x), new(x)
        assert all(torch.equal(p, q) for p, q in zip(a, b))


def test_a_longer_tuple_unpacked_at_its_length_is_rewritten():
    test_a_scale_a_forward_returns_positive_is_rewritten(
        "return self.mu(x), self.log_std.exp(), x", "mean, std, _ = self.actor(x)")


@pytest.mark.parametrize("forward, caller, extra", [
    # the log-std itself, or a value no rule makes positive
    ("return self.mu(x), self.log_std", "mean, std = self.actor(x)", ""),
    ("return self.mu(x), self.log_std.exp() * 2", "mean, std = self.actor(x)", ""),
    # one return path that is not positive
    ("if x.shape[0] > 2:\n            return self.mu(x), self.log_std\n        return self.mu(x), self.log_std.exp()",
     "mean, std = self.actor(x)", ""),
    # the scale at another position, or an unpacking of another length
    ("return self.log_std.exp(), self.mu(x)", "mean, std = self.actor(x)", ""),
    # changed in place in forward, or in the caller; rebound in the caller
    ("std = self.log_std.exp()\n        std[0] = -1.0\n        return self.mu(x), std", "mean, std = self.actor(x)", ""),
    ("return self.mu(x), self.log_std.exp()", "mean, std = self.actor(x)\n        std.mul_(-1)", ""),
    ("return self.mu(x), self.log_std.exp()", "mean, std = self.actor(x)\n        std = std - 2", ""),
    # a softplus with a negative beta, a generator, a starred return
    ("return self.mu(x), F.softplus(self.log_std, beta=-1.0)", "mean, std = self.actor(x)", ""),
    ("rest = (self.log_std.exp(),)\n        return (self.mu(x), *rest)", "mean, std = self.actor(x)", ""),
    # a forward hook (it may replace the output), anywhere in the file
    ("return self.mu(x), self.log_std.exp()", "mean, std = self.actor(x)",
     "def flip(m, i, o):\n    return o[0], -o[1]\ndef hooked(actor):\n    actor.register_forward_hook(flip)"),
    # a starred unpacking; a call of a torch module (its own forward returns one tensor... or a tuple)
    ("return self.mu(x), self.log_std.exp()", "mean, *rest = self.actor(x)\n        std = rest[0]", ""),
    ("return self.mu(x), self.log_std.exp()", "mean, std = nn.LSTM(3, 3)(x.unsqueeze(0))", ""),
])
def test_look_alikes_stay_as_written(forward, caller, extra):
    code = src(forward, caller, extra)
    out, sites = rewrite(code, dedent=False)
    assert out == code, sites
    assert [s.action for s in sites] == [SKIPPED], sites
    assert "not provably positive" in sites[0].reason


def test_a_scale_from_a_parameters_call_is_not_followed():
    """`def act(actor, x)`: what the parameter runs is not known here."""
    code = src("return self.mu(x), self.log_std.exp()").replace("def act(self, x):", "def act(self, x, actor=None):") \
        .replace("mean, std = self.actor(x)", "mean, std = actor(x)")
    out, sites = rewrite(code, dedent=False)
    assert out == code and [s.action for s in sites] == [SKIPPED], sites


def test_a_scale_left_alone_says_what_it_is():
    """A refusal names what the scale is: a parameter (most refusals in public code: tianshou's
    ``dist_fn(loc, scale)``), a name bound twice, a forward's output this file cannot read (a
    class of another file), or the expression itself; not one phrase for all."""
    src = (
        "import torch\n"
        "from torch.distributions import Normal\n"
        "from utils import Actor\n"
        "def dist_fn(loc, scale):\n"
        "    return Normal(loc, scale)\n"
        "class Agent:\n"
        "    def act(self, s, x):\n"
        "        mean, std = self.actor(s)\n"
        "        w = x.abs()\n"
        "        if x.sum() > 0:\n"
        "            w = torch.ones_like(x)\n"
        "        return Normal(mean, std), Normal(mean, w), Normal(mean, self.log_std.exp().expand_as(mean))\n"
    )
    out, sites = rewrite(src)
    assert out == src
    reasons = sorted((s.line, s.reason) for s in sites)
    assert [line for line, _ in reasons] == [5, 12, 12, 12]
    assert "the scale `scale` is a parameter of dist_fn()" in reasons[0][1]
    texts = " | ".join(r for _, r in reasons[1:])
    assert "the scale `std` = self.actor(...)[1] is not provably positive: a body that call may run returns" in texts
    assert "the scale `w` is bound 2 times here" in texts
    assert "the scale `self.log_std.exp().expand_as(mean)` is not provably positive here" in texts
