"""``accelerate.fast_categorical``'s examples: Categorical builds it swaps, look-alikes it keeps.

A rewritten example defines ``act(logits_or_probs, actions)`` -> (sample, log_prob, entropy,
gradient) for the differential test (original and rewrite on the same seed: bitwise equal).
The tests set ``[accelerate] level = "reassociated"``.
"""
from __future__ import annotations

from ..base import Example, at_options

_ACT = """

def act(x, actions):
    x = x.detach().requires_grad_()
    d = dist(x)
    sample = d.sample()
    logp = d.log_prob(actions)
    ent = d.entropy()
    (logp.sum() + ent.sum()).backward()
    return sample, logp, ent, x.grad
"""

EXAMPLES = at_options([  # rewritten at [accelerate] level = "reassociated", CPU
    Example("""\
import torch
from torch.distributions.categorical import Categorical


def dist(logits):
    return Categorical(logits=logits)
""" + _ACT, True, note="CleanRL: Categorical(logits=logits) from torch.distributions.categorical"),
    Example("""\
import torch
from torch.distributions import Categorical


def dist(logits):
    return Categorical(logits=logits, validate_args=False)
""" + _ACT, True, note="validate_args=False added by hot.distribution_args (kept)"),
    Example("""\
import torch
import torch.distributions as D


def dist(x):
    return D.Categorical(torch.softmax(x, dim=-1))
""" + _ACT, True, note="probs from a softmax, module alias"),
    Example("""\
import torch
from torch.distributions import Categorical
from scalebox_cst.runtime.hot_distributions import categorical_probs as _sb_categorical_probs


def dist(x):
    return _sb_categorical_probs(Categorical, torch.softmax(x, dim=-1), -1)
""" + _ACT, True, note="minimalRL after hot.distribution_args: the class given to categorical_probs"),
    Example("""\
import torch
from torch.distributions import Categorical


def dist(logits):
    d = Categorical(logits=logits)
    assert type(d) is Categorical
    return d
""", False, "tests exact types", note="an exact type test: the subclass would fail it"),
    Example("""\
import torch
from torch.distributions import Categorical


class Masked(Categorical):
    pass


def dist(logits):
    return Categorical(logits=logits)
""", False, "subclasses Categorical", note="a file subclassing Categorical"),
    Example("""\
import torch
from torch.distributions import Categorical, Normal
from torch.distributions.kl import register_kl


@register_kl(Categorical, Normal)
def _kl(p, q):
    return torch.zeros(())


def dist(logits):
    return Categorical(logits=logits)
""", False, "registers a KL", note="a KL registered by type"),
    Example("""\
import torch
from torch.distributions import Normal, OneHotCategorical


def dist(x):
    return OneHotCategorical(logits=x), Normal(x, 1.0)
""", False, "", note="other distributions: not this transform's (no site)"),
    Example("""\
import torch


class Categorical:
    def __init__(self, logits):
        self.logits = logits


def dist(x):
    return Categorical(logits=x)
""", False, "", note="a class of the file named Categorical: not torch's (no site)"),
], (('level', 'reassociated'),))
