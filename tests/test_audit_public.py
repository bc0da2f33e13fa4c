"""Audit of public RL code beyond the corpus harness: guards that must fall back (aliasing, mixed
dtypes, half precision) and must not (longer per-step inputs, broadcasting carries), checked on
the rewritten corpus functions themselves, original vs rewritten on the same inputs, with a trace
of whether the vectorized branch ran; and one public function whose rewrite never runs
vectorized on its own inputs (a list output written by index), now left alone with its reason,
kept here rather than in the corpus because the corpus-wide guard fuzz requires every rewritten
file to reach a fast branch.
"""
import os
import random
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import torch

from scalebox_cst.config import Config
from scalebox_cst.report import SKIPPED

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from corpus_harness import RuntimeTrace, compare, corpus  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _exec(code, tag):
    return harness.load(code, None, f"<audit {tag}>", module="audit", cache_lines=True)


def both(name):
    c = corpus(name)
    assert c.error is None, c.error
    return _exec(c.text, name + " original"), _exec(c.output, name + " rewritten")


def run_both(f_orig, f_new, make):
    """The original and the rewrite on equal fresh inputs; the rewrite's result, whether a
    recurrence guard passed."""
    want = f_orig(*make())
    with RuntimeTrace() as trace:
        got = f_new(*make())
    compare(want, got, exact=False)
    return got, trace.accepted("vectorize.recurrence")


# --------------------------------------------------------------------------- MAPPO plain returns


def _mappo_call(ns, alias=None, reward_dtype=np.float32, T=60):
    rng = np.random.default_rng(4)
    args = SimpleNamespace(gamma=0.99, gae_lambda=0.95, use_gae=False, use_popart=False,
                           use_proper_time_limits=False)
    values = rng.standard_normal((T + 1, 2, 3, 1)).astype(np.float32)
    rewards = rng.standard_normal((T, 2, 3, 1)).astype(reward_dtype)
    masks = (rng.random((T + 1, 2, 3, 1)) > 0.05).astype(np.float32)
    buf = ns["SharedReplayBuffer"](args, rewards, values, masks, np.ones_like(masks))
    if alias == "rewards_view_of_returns":  # rewards[t] is returns[t + 1]: the loop reads what it wrote
        buf.rewards = buf.returns[1:]
        buf.returns[:] = rng.standard_normal(buf.returns.shape)
    elif alias == "rewards_are_returns_rows":
        buf.rewards = buf.returns[:-1]
        buf.returns[:] = rng.standard_normal(buf.returns.shape)
    elif alias == "masks_are_returns":
        buf.masks = buf.returns  # returns[t] = 0.99 * returns[t + 1] ** 2 + rewards[t]: small rewards keep it finite
        buf.rewards = buf.rewards * np.float32(0.01)
        buf.returns[:] = 0.5
    next_value = rng.standard_normal((2, 3, 1)).astype(np.float32)
    buf.compute_returns(next_value * np.float32(0.1) if alias == "masks_are_returns" else next_value)
    return buf.returns


def test_mappo_plain_returns_vectorized_on_its_buffers():
    orig, new = both("mappo_compute_returns")
    _, fast = run_both(lambda: _mappo_call(orig), lambda: _mappo_call(new), lambda: ())
    assert fast


@pytest.mark.parametrize("alias", ["rewards_view_of_returns", "rewards_are_returns_rows", "masks_are_returns"])
def test_mappo_plain_returns_aliasing_falls_back(alias):
    orig, new = both("mappo_compute_returns")
    _, fast = run_both(lambda: _mappo_call(orig, alias), lambda: _mappo_call(new, alias), lambda: ())
    assert not fast


def test_mappo_float64_rewards_into_float32_returns_fall_back():
    orig, new = both("mappo_compute_returns")
    _, fast = run_both(lambda: _mappo_call(orig, reward_dtype=np.float64),
                       lambda: _mappo_call(new, reward_dtype=np.float64), lambda: ())
    assert not fast


# --------------------------------------------------------------------------- TorchRL GAE / TD(1)


def _gae_inputs(dtype=torch.float32, batch=(3,), features=1, T=60, grad=False, alias=False,
                transposed=False):
    g = torch.Generator().manual_seed(3)
    shape = (*batch, T, features)
    sv = torch.randn(shape, generator=g, dtype=dtype)
    if transposed:  # a non-contiguous view, time not in the stride order of a fresh tensor
        sv = torch.randn((*batch, features, T), generator=g, dtype=dtype).transpose(-1, -2)
    nsv = sv if alias else torch.randn(shape, generator=g, dtype=dtype)
    r = torch.randn(shape, generator=g, dtype=dtype)
    d = torch.rand(shape, generator=g) < 0.1
    if grad:
        sv.requires_grad_()
    return 0.99, 0.95, sv, nsv, r, d


def _gae_with_grad(f):
    def call(*args):
        adv, target = f(*args)
        if not args[2].requires_grad:
            return adv, target
        return adv, target, torch.autograd.grad((adv * 1.3).sum() + target.sum(), args[2])
    return call


@pytest.mark.parametrize("kw,fast", [
    (dict(dtype=torch.float16), False),
    (dict(dtype=torch.bfloat16), False),
    (dict(dtype=torch.float64, batch=()), True),
    (dict(transposed=True), True),
    (dict(alias=True), True),  # next_state_value is state_value: inputs are only read
    (dict(features=3, batch=(2, 2)), True),
    (dict(grad=True), True),
    (dict(grad=True, alias=True), True),
])
def test_torchrl_gae_guard(kw, fast):
    orig, new = both("torchrl_gae_td1")
    _, took = run_both(_gae_with_grad(orig["generalized_advantage_estimate"]),
                       _gae_with_grad(new["generalized_advantage_estimate"]), lambda: _gae_inputs(**kw))
    assert took == fast


@pytest.mark.parametrize("kw,fast", [
    (dict(dtype=torch.float16), False),
    (dict(transposed=True), True),
    (dict(features=3, batch=(2, 2)), True),
])
def test_torchrl_td1_guard(kw, fast):
    orig, new = both("torchrl_gae_td1")

    def make():
        _, _, _, nsv, r, d = _gae_inputs(**kw)
        return 0.99, nsv, r, d
    _, took = run_both(orig["td1_return_estimate"], new["td1_return_estimate"], make)
    assert took == fast


# --------------------------------------------------------------------------- list returns


def _a2c_inputs(n_masks=60, next_value="tensor", T=60):
    g = torch.Generator().manual_seed(2)
    rewards = [torch.randn(4, 1, generator=g) for _ in range(T)]
    masks = [(torch.rand(4, 1, generator=g) > 0.1).float() for _ in range(n_masks)]
    nv = {"tensor": lambda: torch.randn(4, 1, generator=g),
          "row": lambda: torch.randn(4, generator=g),  # broadcasts the carry to [4, 4]
          "float64": lambda: torch.randn(4, 1, generator=g, dtype=torch.float64),
          "float": lambda: 0.5}[next_value]()
    return nv, rewards, masks


@pytest.mark.parametrize("kw,fast", [
    (dict(n_masks=65), True),  # masks longer than rewards: the loop reads the first T
    (dict(next_value="float"), True),
    (dict(next_value="row"), True),
    (dict(next_value="float64"), True),
])
def test_easy_rl_returns_guard(kw, fast):
    orig, new = both("easy_rl_a2c_compute_returns")
    _, took = run_both(orig["A2C"](0.99).compute_returns, new["A2C"](0.99).compute_returns,
                       lambda: _a2c_inputs(**kw))
    assert took == fast


def test_easy_rl_returns_short_masks_raise_alike():
    orig, new = both("easy_rl_a2c_compute_returns")
    for ns in (orig, new):
        with pytest.raises(IndexError):
            ns["A2C"](0.99).compute_returns(*_a2c_inputs(n_masks=55))


# --------------------------------------------------------------------------- a list output


# dongparoo/enhanced-ppo-mobile-robot-nav, utils.py (compute_gae), verbatim. License: not
# recorded by the index.
DONGPAROO = '''
import torch

def compute_gae(rewards, values, dones, last_value, gamma=0.99, lam=0.95):
    values = values + [last_value]                 # ★ bootstrap
    advantages = [0.0] * len(rewards)
    gae = 0.0
    for i in reversed(range(len(rewards))):
        delta = rewards[i] + gamma * values[i+1] * (1 - dones[i]) - values[i]
        gae   = delta + gamma * lam * (1 - dones[i]) * gae
        advantages[i] = gae
    returns = [adv + v for adv, v in zip(advantages, values[:-1])]
    return torch.tensor(advantages, dtype=torch.float32), \\
           torch.tensor(returns,     dtype=torch.float32)
'''


def _dongparoo():
    result = harness.rewrite_result(DONGPAROO, path="dongparoo.py")
    sites = [s for s in result.report.sites if s.transform == "vectorize.recurrence"]
    return sites, _exec(DONGPAROO, "dongparoo original"), _exec(result.output.decode(), "dongparoo rewritten")


def _dongparoo_inputs(flag, T=300):
    rnd = random.Random(7)
    kinds = {"bool": lambda: rnd.random() < 0.1, "float": lambda: float(rnd.random() < 0.1),
             "int": lambda: int(rnd.random() < 0.1)}
    return ([rnd.gauss(0, 1) for _ in range(T)], [rnd.gauss(0, 1) for _ in range(T)],
            [kinds[flag]() for _ in range(T)], rnd.gauss(0, 1))


def test_list_output_gae_left_alone_with_its_reason():
    """The guard stores only into arrays, so a rewrite would never run vectorized here (and storing
    into the list item by item was measured slower than the loop): the loop is left as written."""
    sites, _, _ = _dongparoo()
    assert [s.action for s in sites] == [SKIPPED]
    assert sites[0].reason.startswith("output is a Python list written by index: `advantages` "
                                      "(`advantages = [0.0] * len(rewards)`)")
    # the loop families leave the file as written (hot.tensor_from_arrays may still guard its
    # final torch.tensor(list) calls: a whole-script rewrite with its own tests)
    loops_only = Config(transforms=[t for t in Config().transforms if not t.startswith("hot.")])
    result = harness.rewrite_result(DONGPAROO, loops_only, path="dongparoo.py")
    assert result.output.decode() == DONGPAROO


@pytest.mark.parametrize("flag", ["bool", "float", "int"])
def test_list_output_gae_same_results(flag):
    _, orig, new = _dongparoo()
    got, fast = run_both(orig["compute_gae"], new["compute_gae"], lambda: _dongparoo_inputs(flag))
    assert got[0].shape == (300,) and not fast


# --------------------------------------------------------------------------- silent misses


# A public helper (an index hit whose repository the index does not name) that walks backward by
# a computed index on a forward range: a recurrence through memory, result[idx] += gamma *
# result[idx + 1]. Verbatim.
COMPUTED_INDEX = '''
import numpy as np

def compute_returns(
    rewards,
    gamma=0.99
):
    result = np.array(rewards)
    for i in range(len(rewards)):
        idx = len(rewards) - 1 - i
        if i > 0:
            result[idx] += gamma * result[idx + 1]
    return result
'''


def test_backward_walk_by_computed_index_gets_a_site():
    result = harness.rewrite_result(COMPUTED_INDEX, path="returns.py")
    loop_line = next(i + 1 for i, l in enumerate(COMPUTED_INDEX.splitlines()) if l.strip().startswith("for i in"))
    sites = [s for s in result.report.sites if s.transform == "vectorize.recurrence" and s.line == loop_line]
    assert [s.action for s in sites] == ["skipped"]
    assert sites[0].reason.startswith("backward walk through a computed index (`idx = len(rewards) - 1 - i`")


def test_backward_walk_by_computed_index_is_left_unchanged():
    result = harness.rewrite_result(COMPUTED_INDEX, path="returns.py")
    assert result.output.decode() == COMPUTED_INDEX
