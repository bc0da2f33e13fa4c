"""vectorize.recurrence: differential tests (original vs rewritten code on the same inputs, bitwise
where the site says exact), the guard's fallback, and look-alike loops that must stay as written."""
from __future__ import annotations

from conftest import TESTS  # tests/: the corpus, fake_torch_npu and the repository root beside it
import os
import re
import subprocess
import sys
import textwrap
import types
from collections import deque
from typing import Optional

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from scalebox_cst.report import EXACT, REASSOCIATED, REWRITTEN, SKIPPED
from scalebox_cst.runtime import vectorized as vectorized_mod
from scalebox_cst.runtime.vectorized import recurrence_guard
import harness
from differential import HYP, clone, dtypes, lengths, same, same_namespaces, tensor
from recurrence_harness import ID, SB3, rewrite, rewritten, run_both

ROOT = os.path.dirname(TESTS)


# ------------------------------------------------------------------ harness

_MIN_STEPS = dict(vectorized_mod.MIN_STEPS)


def setup_module(module):
    # vectorize from 2 steps on, so that short random sequences exercise the vectorized branch
    vectorized_mod.MIN_STEPS.update({k: 2 for k in _MIN_STEPS})


def teardown_module(module):
    vectorized_mod.MIN_STEPS.update(_MIN_STEPS)



# ------------------------------------------------------------------ CleanRL GAE

CLEANRL = """\
import torch

with torch.no_grad():
    next_value = agent.get_value(next_obs).reshape(1, -1)
    advantages = torch.zeros_like(rewards).to(device)
    lastgaelam = 0
    for t in reversed(range(args.num_steps)):
        if t == args.num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
    returns = advantages + values
"""


class _Agent:
    def __init__(self, value):
        self.value = value

    def get_value(self, obs):
        return self.value


@HYP
@given(T=lengths, N=st.sampled_from([1, 3]), dtype=dtypes, seed=st.integers(0, 2**16),
       done_kind=st.sampled_from(["tensor", "float"]))
def test_cleanrl_gae_bitwise(T, N, dtype, seed, done_kind):
    next_done = tensor(seed + 5, (N,), dtype, "dones") if done_kind == "tensor" else float(seed % 2)
    env = dict(
        agent=_Agent(tensor(seed + 4, (N, 1), dtype)),
        next_obs=None,
        device="cpu",
        args=types.SimpleNamespace(num_steps=T, gamma=0.99, gae_lambda=0.95),
        rewards=tensor(seed, (T, N), dtype),
        values=tensor(seed + 1, (T, N), dtype),
        dones=tensor(seed + 2, (T, N), dtype, "dones"),
        next_done=next_done,
    )
    ns1, ns2 = run_both(CLEANRL, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)  # advantages, returns, lastgaelam, t, delta, nextvalues, ... bitwise


CARTPOLE_GAE = """\
def gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda, num_steps):
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages, lastgaelam, delta, t

import torch
out = gae(rewards, values, dones, next_value, next_done, 0.99, 0.95, T)
"""


@HYP
@given(T=lengths, dtype=dtypes, seed=st.integers(0, 2**16), nv=st.sampled_from(["0d", "1", "row"]))
def test_gae_1d_tensors_in_a_function(T, dtype, seed, nv):
    shape = {"0d": (), "1": (1,), "row": (1, 1)}[nv]
    env = dict(
        T=T,
        rewards=tensor(seed, (T,), dtype),
        values=tensor(seed + 1, (T,), dtype),
        dones=tensor(seed + 2, (T,), dtype, "dones"),
        next_value=tensor(seed + 3, shape, dtype),
        next_done=float(seed % 2),
    )
    ns1, ns2 = run_both(CARTPOLE_GAE, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


# ------------------------------------------------------------------ SB3 (numpy, self attributes)



@HYP
@given(T=lengths, N=st.sampled_from([1, 3]), dt=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 2**16))
def test_sb3_numpy_bitwise(T, N, dt, seed):
    rng = np.random.default_rng(seed)
    env = dict(
        rewards=rng.standard_normal((T, N)).astype(dt),
        values=rng.standard_normal((T, N)).astype(dt),
        episode_starts=(rng.random((T, N)) < 0.2).astype(dt),
        last_values=rng.standard_normal(N).astype(dt),
        dones=rng.random(N) < 0.5,
    )
    ns1, ns2 = run_both(SB3, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


# ------------------------------------------------------------------ REINFORCE over lists

REINFORCE_INSERT = """\
R = 0
returns = []
for r in reversed(rewards):
    R = r + gamma * R
    returns.insert(0, R)
"""

REINFORCE_APPEND_REVERSE = """\
R = 0.0
returns = []
for r in rewards[::-1]:
    R = r + gamma * R
    returns.append(R)
returns.reverse()
"""

REINFORCE_APPEND_SLICE = """\
def disc(rewards, gamma):
    R = 0
    returns = []
    for r in rewards[::-1]:
        R = R * gamma + r
        returns.append(R)
    returns = returns[::-1]
    return returns

out = disc(rewards, gamma)
"""

REINFORCE_INDEX = """\
def disc(rewards, gamma):
    running = 0.0
    returns = []
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        returns.insert(0, running)
    return returns, running, t

out = disc(rewards, gamma)
"""


@HYP
@given(T=lengths, seed=st.integers(0, 2**16), gamma=st.sampled_from([0.99, 0.9, 1.0]),
       src=st.sampled_from([REINFORCE_INSERT, REINFORCE_APPEND_REVERSE, REINFORCE_APPEND_SLICE, REINFORCE_INDEX]))
def test_reinforce_lists_of_floats_bitwise(T, seed, gamma, src):
    rng = np.random.default_rng(seed)
    rewards = [float(x) for x in rng.standard_normal(T)]
    ns1, ns2 = run_both(src, dict(rewards=rewards, gamma=gamma), vectorized=T >= 2)
    same_namespaces(ns1, ns2)


@HYP
@given(T=lengths, seed=st.integers(0, 2**16), dtype=dtypes, shape=st.sampled_from([(), (3,)]),
       src=st.sampled_from([REINFORCE_INSERT, REINFORCE_INDEX]))
def test_reinforce_lists_of_tensors_bitwise(T, seed, dtype, shape, src):
    rewards = [tensor(seed + i, shape, dtype) for i in range(T)]
    ns1, ns2 = run_both(src, dict(rewards=rewards, gamma=0.99), vectorized=T >= 2)
    same_namespaces(ns1, ns2)


@HYP
@given(T=lengths, seed=st.integers(0, 2**16), dtype=dtypes, kind=st.sampled_from(["tensor", "numpy"]))
def test_reinforce_over_arrays_bitwise(T, seed, dtype, kind):
    r = tensor(seed, (T,), dtype)
    rewards = r if kind == "tensor" else r.numpy()
    ns1, ns2 = run_both(REINFORCE_INDEX, dict(rewards=rewards, gamma=0.99), vectorized=T >= 2)
    same_namespaces(ns1, ns2)


# ------------------------------------------------------------------ PPO-PyTorch (zip, episode resets)

PPO_PYTORCH = """\
rewards_out = []
discounted_reward = 0
for reward, is_terminal in zip(reversed(buffer.rewards), reversed(buffer.is_terminals)):
    if is_terminal:
        discounted_reward = 0
    discounted_reward = reward + (gamma * discounted_reward)
    rewards_out.insert(0, discounted_reward)
"""


@HYP
@given(T=lengths, seed=st.integers(0, 2**16), p=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
       kind=st.sampled_from(["lists", "tensors"]))
def test_ppo_pytorch_resets_bitwise(T, seed, p, kind):
    rng = np.random.default_rng(seed)
    if kind == "lists":
        rewards = [float(x) for x in rng.standard_normal(T)]
        terms = [bool(x) for x in rng.random(T) < p]
    else:
        rewards = torch.from_numpy(rng.standard_normal(T).astype(np.float32))
        terms = torch.from_numpy(rng.random(T) < p)
    buf = types.SimpleNamespace(rewards=rewards, is_terminals=terms)
    ns1, ns2 = run_both(PPO_PYTORCH, dict(buffer=buf, gamma=0.99), vectorized=T >= 2)
    same_namespaces(ns1, ns2)


# ------------------------------------------------------------------ masks, shifted values, expression outputs

MASKS = """\
import torch
returns = torch.zeros_like(rewards)
running = next_value
for t in reversed(range(rewards.size(0))):
    returns[t] = running = rewards[t] + gamma * running * masks[t]
"""


@HYP
@given(T=lengths, N=st.sampled_from([1, 3]), dtype=dtypes, seed=st.integers(0, 2**16))
def test_masks_reassociated(T, N, dtype, seed):
    env = dict(
        rewards=tensor(seed, (T, N), dtype),
        masks=1.0 - tensor(seed + 1, (T, N), dtype, "dones"),
        next_value=tensor(seed + 2, (N,), dtype),
        gamma=0.99,
    )
    ns1, ns2 = run_both(MASKS, env, exactness=REASSOCIATED, vectorized=T >= 2)
    same_namespaces(ns1, ns2, exact=False)


def test_masks_refused_without_reassociation():
    out, sites = rewrite(MASKS, reassociate=False)
    assert out == MASKS
    assert any(s.action == SKIPPED and "reassociat" in s.reason for s in sites)


SHIFTED = """\
def gae(rewards, values, masks, last_value, gamma, lam):
    gae = 0.0
    next_value = last_value
    adv = torch.zeros_like(rewards)
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_value * masks[t] - values[t]
        gae = delta + gamma * lam * masks[t] * gae
        next_value = values[t]
        adv[t] = gae
    return adv, gae, next_value, delta, t

import torch
out = gae(rewards, values, masks, last_value, 0.99, 0.95)
"""


@HYP
@given(T=lengths, dtype=dtypes, seed=st.integers(0, 2**16))
def test_value_carried_from_the_previous_step(T, dtype, seed):
    env = dict(
        rewards=tensor(seed, (T,), dtype),
        values=tensor(seed + 1, (T,), dtype),
        masks=1.0 - tensor(seed + 2, (T,), dtype, "dones"),
        last_value=tensor(seed + 3, (), dtype),
    )
    ns1, ns2 = run_both(SHIFTED, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


PPO_RETURNS = """\
def compute_gae(next_value, rewards, masks, values, gamma=0.99, tau=0.95):
    values = values + [next_value]
    gae = 0
    returns = []
    for step in reversed(range(len(rewards))):
        delta = rewards[step] + gamma * values[step + 1] * masks[step] - values[step]
        gae = delta + gamma * tau * masks[step] * gae
        returns.insert(0, gae + values[step])
    return returns

out = compute_gae(next_value, rewards, masks, values)
"""


@HYP
@given(T=lengths, seed=st.integers(0, 2**16), kind=st.sampled_from(["floats", "tensors"]))
def test_expression_output_insert(T, seed, kind):
    rng = np.random.default_rng(seed)
    if kind == "floats":
        mk = lambda n: [float(x) for x in rng.standard_normal(n)]  # noqa: E731
        env = dict(rewards=mk(T), values=mk(T), masks=[float(x) for x in rng.random(T) > 0.1],
                   next_value=float(rng.standard_normal()))
    else:
        mk = lambda n: [torch.tensor(x, dtype=torch.float32) for x in rng.standard_normal(n)]  # noqa: E731
        env = dict(rewards=mk(T), values=mk(T),
                   masks=[torch.tensor(float(x)) for x in rng.random(T) > 0.1],
                   next_value=torch.tensor(float(rng.standard_normal())))
    ns1, ns2 = run_both(PPO_RETURNS, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


TWO = """\
def both(rewards, values, masks, next_value, gamma, lam):
    T = len(rewards)
    returns = torch.zeros_like(rewards)
    advantages = torch.zeros_like(rewards)
    ret = next_value
    adv = 0.0
    for t in reversed(range(T)):
        if t == T - 1:
            nv = next_value
        else:
            nv = values[t + 1]
        ret = rewards[t] + gamma * masks[t] * ret
        delta = rewards[t] + gamma * nv * masks[t] - values[t]
        adv = delta + gamma * lam * masks[t] * adv
        returns[t] = ret
        advantages[t] = adv
    return returns, advantages, ret, adv

import torch
out = both(rewards, values, masks, next_value, 0.99, 0.95)
"""


@HYP
@given(T=lengths, N=st.sampled_from([1, 3]), dtype=dtypes, seed=st.integers(0, 2**16))
def test_two_recurrences_in_one_loop(T, N, dtype, seed):
    env = dict(
        rewards=tensor(seed, (T, N), dtype),
        values=tensor(seed + 1, (T, N), dtype),
        masks=1.0 - tensor(seed + 2, (T, N), dtype, "dones"),
        next_value=tensor(seed + 3, (N,), dtype),
    )
    ns1, ns2 = run_both(TWO, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


def test_other_backends_report_reassociated():
    for backend in ("cuda", "npu"):
        res = harness.rewrite_result(CLEANRL, ID, backend)
        (site,) = res.report.sites
        assert site.action == REWRITTEN and site.exactness == REASSOCIATED, site.describe()
        assert "cpu=True" not in res.output.decode()
    assert "cpu=True" in rewritten(CLEANRL)


def test_short_sequences_stay_on_the_loop_by_default(monkeypatch):
    monkeypatch.setattr(recurrence_guard, "MIN_STEPS", dict(_MIN_STEPS))
    floats = [1.0] * 100
    assert not vectorized_mod.recurrence_ok(100, seqs=((floats, 0),), scalars=(0.9,))
    # lists of Python floats: only where the loop inserts at the front (quadratic), from 1024 steps;
    # appended or stored by index the loop is faster at every length measured
    assert not vectorized_mod.recurrence_ok(600, seqs=(([1.0] * 600, 0),), scalars=(0.9,), front=True)
    assert vectorized_mod.recurrence_ok(1024, seqs=(([1.0] * 1024, 0),), scalars=(0.9,), front=True)
    assert not vectorized_mod.recurrence_ok(100000, seqs=(([1.0] * 100000, 0),), scalars=(0.9,))
    assert not vectorized_mod.recurrence_ok(3, seqs=((torch.zeros(3), 0),))
    assert vectorized_mod.recurrence_ok(64, seqs=((torch.zeros(64), 0),))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cleanrl_gae_on_cuda(dtype):
    """On the cuda backend the op may run a parallel scan: reassociated, within tolerance, and the
    vectorized branch is taken for CUDA tensors."""
    res = harness.rewrite_result(CLEANRL, ID, "cuda")
    assert [s.exactness for s in res.report.sites] == [REASSOCIATED]
    T, N = 512, 8
    env = dict(
        agent=_Agent(tensor(4, (N, 1), dtype).cuda()),
        next_obs=None,
        device="cuda",
        args=types.SimpleNamespace(num_steps=T, gamma=0.99, gae_lambda=0.95),
        rewards=tensor(0, (T, N), dtype).cuda(),
        values=tensor(1, (T, N), dtype).cuda(),
        dones=tensor(2, (T, N), dtype, "dones").cuda(),
        next_done=tensor(5, (N,), dtype, "dones").cuda(),
    )
    with harness.spy(vectorized_mod, "recurrence_ok") as answers:
        ns1, ns2 = harness.run_pair(CLEANRL, res.output, env, clone=clone)
    assert answers == [True]
    for key in ("advantages", "returns", "lastgaelam", "delta"):
        torch.testing.assert_close(ns1[key], ns2[key], rtol=1e-5, atol=1e-5)


def test_cpu_backend_keeps_other_devices_on_the_loop():
    assert not vectorized_mod.recurrence_ok(4, seqs=((torch.zeros(4, device="meta"), 0),), cpu=True)
    assert vectorized_mod.recurrence_ok(4, seqs=((torch.zeros(4), 0),), cpu=True)


IKOSTRIKOV = """\
import torch


class RolloutStorage(object):
    def __init__(self, rewards, value_preds, masks, bad_masks):
        self.rewards, self.value_preds, self.masks, self.bad_masks = rewards, value_preds, masks, bad_masks
        self.returns = torch.zeros_like(value_preds)

    def compute_returns(self, next_value, use_gae, gamma, gae_lambda, use_proper_time_limits=True):
        if use_proper_time_limits:
            if use_gae:
                self.value_preds[-1] = next_value
                gae = 0
                for step in reversed(range(self.rewards.size(0))):
                    delta = self.rewards[step] + gamma * self.value_preds[
                        step + 1] * self.masks[step +
                                               1] - self.value_preds[step]
                    gae = delta + gamma * gae_lambda * self.masks[step +
                                                                  1] * gae
                    gae = gae * self.bad_masks[step + 1]
                    self.returns[step] = gae + self.value_preds[step]
            else:
                self.returns[-1] = next_value
                for step in reversed(range(self.rewards.size(0))):
                    self.returns[step] = (self.returns[step + 1] * \\
                        gamma * self.masks[step + 1] + self.rewards[step]) * self.bad_masks[step + 1] \\
                        + (1 - self.bad_masks[step + 1]) * self.value_preds[step]
        else:
            if use_gae:
                self.value_preds[-1] = next_value
                gae = 0
                for step in reversed(range(self.rewards.size(0))):
                    delta = self.rewards[step] + gamma * self.value_preds[
                        step + 1] * self.masks[step +
                                               1] - self.value_preds[step]
                    gae = delta + gamma * gae_lambda * self.masks[step +
                                                                  1] * gae
                    self.returns[step] = gae + self.value_preds[step]
            else:
                self.returns[-1] = next_value
                for step in reversed(range(self.rewards.size(0))):
                    self.returns[step] = self.returns[step + 1] * \\
                        gamma * self.masks[step + 1] + self.rewards[step]


storage = RolloutStorage(rewards, value_preds, masks, bad_masks)
storage.compute_returns(next_value, use_gae, 0.99, 0.95, proper)
"""


def test_ikostrikov_storage_sites():
    _, sites = rewrite(IKOSTRIKOV)
    got = [(s.action, s.exactness) for s in sites]
    # GAE with time-limit masks (two chained updates), returns through memory (twice), plain GAE
    assert got == [(REWRITTEN, REASSOCIATED), (REWRITTEN, REASSOCIATED), (REWRITTEN, EXACT),
                   (REWRITTEN, REASSOCIATED)], [s.describe() for s in sites]


@HYP
@given(T=lengths, N=st.sampled_from([1, 3]), dtype=dtypes, seed=st.integers(0, 2**16),
       use_gae=st.booleans(), proper=st.booleans())
def test_ikostrikov_storage(T, N, dtype, seed, use_gae, proper):
    env = dict(
        rewards=tensor(seed, (T, N, 1), dtype),
        value_preds=tensor(seed + 1, (T + 1, N, 1), dtype),
        masks=1.0 - tensor(seed + 2, (T + 1, N, 1), dtype, "dones"),
        bad_masks=1.0 - tensor(seed + 3, (T + 1, N, 1), dtype, "dones"),
        next_value=tensor(seed + 4, (N, 1), dtype),
        use_gae=use_gae,
        proper=proper,
    )
    ns1, ns2 = run_both(IKOSTRIKOV, env, exactness=None, vectorized=T >= 2)
    same_namespaces(ns1, ns2, exact=use_gae and not proper)


# ------------------------------------------------------------------ the guard's else branch

def _rewritten_forbidding_op(src: str, exactness: Optional[str] = EXACT) -> str:
    """The rewrite, with the op replaced by one that fails: any run that gets a result took the
    else branch (the original loop)."""
    new = rewritten(src, exactness)
    lines = new.splitlines(keepends=True)
    i = max(k for k, line in enumerate(lines) if line.startswith("from scalebox_cst.runtime"))
    lines.insert(i + 1, "def linear_recurrence(*a, **k):\n    raise AssertionError('vectorized branch taken')\n")
    return "".join(lines)


def run_falling_back(src: str, env: dict):
    """Exec the original and the rewrite whose op fails (only the else branch can finish) on
    copies of ``env``; both must raise the same exception type or none. Both namespaces and
    that type (None)."""
    new = _rewritten_forbidding_op(src)
    ns1, ns2 = harness.run_pair(src, new, env, clone=clone)
    return ns1, ns2, harness.outcome(src, clone(env), "orig")


@pytest.mark.parametrize(
    "src,env",
    [
        # (tuples of ints, ints among floats, lists of numpy scalars are vectorized exactly now:
        # tests/runtime/test_vectorize_guard_types.py)
        (REINFORCE_INSERT, dict(rewards=[1.0, 2**60, 3.0], gamma=0.5)),  # an int too large to promote exactly
        (REINFORCE_INSERT, dict(rewards=[1.0, 2.0], gamma=torch.tensor([0.5, 0.9]))),  # array coefficient
        (REINFORCE_APPEND_REVERSE, dict(rewards=torch.arange(5.0), gamma=0.9)),  # tensor[::-1] raises
        (PPO_PYTORCH, dict(buffer=types.SimpleNamespace(rewards=[1.0] * 5, is_terminals=[False] * 4),
                           gamma=0.9)),  # zip of unequal lengths
        (CARTPOLE_GAE, dict(T=5, rewards=torch.arange(5.0), values=torch.arange(5.0).double(),
                            dones=torch.zeros(5), next_value=torch.tensor(1.0), next_done=0.0)),  # mixed dtypes
        (CARTPOLE_GAE, dict(T=6, rewards=torch.arange(5.0), values=torch.arange(5.0),
                            dones=torch.zeros(5), next_value=torch.tensor(1.0), next_done=0.0)),  # too short
        (CARTPOLE_GAE, dict(T=1, rewards=torch.arange(1.0), values=torch.arange(1.0),
                            dones=torch.zeros(1), next_value=torch.tensor(1.0), next_done=0.0)),  # one step
    ],
)
def test_guard_falls_back_to_the_loop(src, env):
    ns1, ns2, _ = run_falling_back(src, env)
    same_namespaces(ns1, ns2)


def test_guard_wants_a_0d_coefficient_of_the_common_dtype():
    r32 = torch.zeros(8)
    ok = vectorized_mod.recurrence_ok
    assert ok(8, seqs=((r32, 0),), scalars=(torch.tensor(0.9),))
    assert not ok(8, seqs=((r32, 0),), scalars=(torch.tensor(0.9, dtype=torch.float64),))
    assert not ok(8, seqs=((r32, 0),), scalars=(torch.tensor([0.9, 0.8]),))
    assert not ok(8, seqs=((r32, 0),), scalars=(np.float32(0.9),))
    assert ok(8, seqs=((r32.numpy(), 0),), scalars=(np.float32(0.9),))


ALIAS = """\
import torch
def f(rewards, gamma, out):
    R = torch.zeros(())
    for t in reversed(range(len(rewards))):
        R = rewards[t] + gamma * R
        out[t] = R
    return out, R
"""


def test_guard_refuses_an_output_that_aliases_an_input():
    g1, g2 = harness.run_pair(ALIAS, _rewritten_forbidding_op(ALIAS), {})
    r1, r2 = torch.arange(6.0), torch.arange(6.0)
    same(g1["f"](r1, 0.5, r1), g2["f"](r2, 0.5, r2))  # in place over its own input: the loop runs
    b1, b2 = torch.arange(7.0), torch.arange(7.0)
    same(g1["f"](b1[:6], 0.5, b1[1:]), g2["f"](b2[:6], 0.5, b2[1:]))  # a shifted view: the loop runs
    same(b1, b2)


def test_requires_grad_output_leaf_takes_the_loop():
    """Inputs that require grad are vectorized (tests/transforms/vectorize/recurrence/test_vectorize_recurrence_grad.py); an output
    that is a leaf requiring grad is not: ``out[t] = R`` raises there in the loop, and still does."""
    g1, g2 = harness.run_pair(ALIAS, _rewritten_forbidding_op(ALIAS), {})
    r = torch.arange(6.0, requires_grad=True)
    for g in (g1, g2):
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            g["f"](r, 0.5, torch.zeros(6, requires_grad=True))


# ------------------------------------------------------------------ look-alikes left alone

NEGATIVE = [
    ("""\
def train(rewards, gamma, optimizer, loss):
    R = 0.0
    for t in reversed(range(len(rewards))):
        R = rewards[t] + gamma * R
        loss.backward()
        optimizer.step()
    return R
""", "calls `loss.backward()`"),
    ("""\
def returns(rewards, gamma, normalizer):
    R = 0.0
    out = []
    for r in reversed(rewards):
        normalizer.update(r)
        R = r + gamma * R
        out.insert(0, R)
    return out
""", "calls `normalizer.update()`"),
    ("""\
def returns(rewards, gamma):
    R = 0.0
    out = []
    for r in reversed(rewards):
        if r is None:
            break
        R = r + gamma * R
        out.insert(0, R)
    return out
""", "conditional"),
    ("""\
def returns(rewards, gamma):
    R = 0.0
    out = []
    for r in reversed(rewards):
        R = r + gamma * R
        out.insert(0, R)
        break
    return out
""", "`break`"),
    ("""\
def forward(out, r, gamma):
    for i in range(1, len(r)):
        out[i] = out[i - 1] * gamma + r[i]
    return out
""", "reads `out[i - 1]`"),
    ("""\
def truncated_advantages(rewards, values, dones, gamma, lam):
    advantages = np.zeros(len(rewards), dtype=np.float32)
    for t in range(len(rewards) - 1):
        discount = 1
        a_t = 0
        for k in range(t, len(rewards) - 1):
            a_t += discount * (rewards[k] + gamma * values[k + 1] * (1 - int(dones[k])) - values[k])
            discount *= gamma * lam
            if dones[k]:
                break
        advantages[t] = a_t
    return advantages
""", "episode-truncated sum"),
    ("""\
def f(r, T):
    s = 0.0
    for t in reversed(range(T)):
        s = s * s + r[t]
    return s
""", "appears non-affinely"),
    ("""\
def f(returns, rewards, gamma):
    for step in reversed(range(rewards.size(0))):
        returns[step] = rewards[step] + gamma * returns[step + 1] + gamma * gamma * returns[step + 2]
    return returns
""", "recurrence through memory"),
    ("""\
def f(returns, rewards, gamma):
    for step in reversed(range(rewards.size(0))):
        returns[step] = returns[step + 1] * returns[step + 1] + rewards[step]
    return returns
""", "appears non-affinely"),
    ("""\
def f(rewards, gamma):
    R = 0.0
    out = []
    for r in reversed(rewards):
        R = r + gamma * R
        out.insert(0, R)
    else:
        out.append(None)
    return out
""", "`else:` clause"),
    ("""\
def f(rewards, gamma):
    R = 0.0
    out = []
    for t in reversed(range(len(rewards))):
        out.insert(0, R)
        R = rewards[t] + gamma * R
    return out
""", "read before its update"),
    ("""\
def f(rewards, gamma):
    R = 0.0
    out = []
    for t in reversed(range(len(rewards))):
        R = rewards[t] * t + gamma * R
        out.insert(0, R)
    return out
""", "loop index `t` as a value"),
]


@pytest.mark.parametrize("src,reason", NEGATIVE, ids=[r for _, r in NEGATIVE])
def test_look_alikes_are_left_alone(src, reason):
    out, sites = rewrite(src)
    assert out == src  # byte for byte
    skipped = [s for s in sites if s.action == SKIPPED]
    assert any(reason in s.reason for s in skipped), [s.describe() for s in sites]
    assert not any(s.action == REWRITTEN for s in sites)


QUADRATIC = """\
import numpy as np


def quadratic_advantages(rewards, values, dones, gamma, lam):
    advantages = np.zeros(len(rewards), dtype=np.float32)
    for t in range(len(rewards) - 1):
        discount = 1
        a_t = 0
        for k in range(t, len(rewards) - 1):
            a_t += discount * (rewards[k] + gamma * values[k + 1] * (1 - int(dones[k])) - values[k])
            discount *= gamma * lam
        advantages[t] = a_t
    return advantages


out = quadratic_advantages(rewards, values, dones, 0.99, 0.95)
"""


def test_quadratic_loop_keeps_its_behaviour():
    """The quadratic advantage loop whose discount never resets at episode ends is rewritten
    (reassociated) and keeps computing what it computed: sums that run across episode ends."""
    rng = np.random.default_rng(0)
    n = 50
    dones = rng.random(n) < 0.2
    env = dict(rewards=rng.normal(size=n), values=rng.normal(size=n), dones=dones)
    new = rewritten(QUADRATIC, REASSOCIATED)
    with harness.spy(vectorized_mod, "quadratic_ok") as answers:
        ns1, ns2 = harness.run_pair(QUADRATIC, new, env, clone=clone)
    assert answers == [True]
    np.testing.assert_allclose(ns2["out"], ns1["out"], rtol=1e-6, atol=1e-6)
    # the sums cross episode ends: a per-episode (reset at dones) GAE differs
    reset = np.zeros(n, dtype=np.float32)
    s = 0.0
    for k in reversed(range(n - 1)):
        delta = env["rewards"][k] + 0.99 * env["values"][k + 1] * (1 - dones[k]) - env["values"][k]
        s = delta + 0.99 * 0.95 * (1 - dones[k]) * s
        reset[k] = s
    assert not np.allclose(ns1["out"], reset)


def test_loops_that_are_not_candidates_report_nothing():
    src = """\
import scipy.signal


def discount_cumsum(x, discount):
    # spinningup: already vectorized
    return scipy.signal.lfilter([1], [1, float(-discount)], x[::-1], axis=0)[::-1]


for step in range(10):
    obs = env_step(obs)
for p, tp in zip(net.parameters(), target.parameters()):
    tp.data.copy_(tau * p.data + (1 - tau) * tp.data)
steps = list(range(0, n, 1))
for t in steps:
    acc = acc * 0.5 + x[t]
steps = sorted(range(n - 1, -1, -1))
for t in steps:
    acc = acc * 0.5 + x[t]
"""
    out, sites = rewrite(src)
    assert out == src and sites == []


def test_backward_loops_that_are_not_candidates_are_reported():
    """Backward loops carrying nothing the vectorizer knows are no candidates, but each is
    reported (the README's promise), with what it does instead of carrying a value."""
    src = """\
for layer in reversed(layers):
    layer.reset_parameters()
for i in reversed(range(n)):
    out[i] = x[i] * 2
for a, b in pairs[::-1]:
    seen.append(a)
"""
    out, sites = rewrite(src)
    assert out == src
    assert [(s.line, s.action) for s in sites] == [(1, "skipped"), (3, "skipped"), (5, "skipped")]
    assert "calls `layer.reset_parameters()`" in sites[0].reason
    assert sites[1].reason == "backward loop with no value carried between steps: nothing to vectorize as a recurrence"
    assert "calls `seen.append()`" in sites[2].reason


# ------------------------------------------------------------------ findings from the real-code corpus

CLEANRL_RETURNS = """\
import torch

with torch.no_grad():
    next_value = agent.get_value(next_obs).reshape(1, -1)
    returns = torch.zeros_like(rewards).to(device)
    for t in reversed(range(args.num_steps)):
        if t == args.num_steps - 1:
            nextnonterminal = 1.0 - next_done
            next_return = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            next_return = returns[t + 1]
        returns[t] = rewards[t] + args.gamma * nextnonterminal * next_return
    advantages = returns - values
"""

# the same carried value read back through a temporary outside the last-step split
ALIASED_RETURNS = """\
def returns_of(rewards, masks, next_value, gamma):
    returns = torch.zeros(rewards.shape[0] + 1, *rewards.shape[1:], dtype=rewards.dtype)
    returns[-1] = next_value
    for step in reversed(range(rewards.size(0))):
        nxt = returns[step + 1]
        returns[step] = rewards[step] + gamma * masks[step] * nxt
    return returns, nxt, step

import torch
out = returns_of(rewards, masks, next_value, 0.99)
"""


@HYP
@given(T=lengths, N=st.sampled_from([1, 3]), dtype=dtypes, seed=st.integers(0, 2**16),
       done_kind=st.sampled_from(["tensor", "float"]))
def test_cleanrl_returns_through_a_temporary_bitwise(T, N, dtype, seed, done_kind):
    """F-cleanrl-returns: ``next_return = returns[t + 1]`` in the else branch of the last-step
    split carries the value; every variable (next_return, nextnonterminal, t too) bitwise."""
    next_done = tensor(seed + 5, (N,), dtype, "dones") if done_kind == "tensor" else float(seed % 2)
    env = dict(
        agent=_Agent(tensor(seed + 4, (N, 1), dtype)),
        next_obs=None,
        device="cpu",
        args=types.SimpleNamespace(num_steps=T, gamma=0.99),
        rewards=tensor(seed, (T, N), dtype),
        values=tensor(seed + 1, (T, N), dtype),
        dones=tensor(seed + 2, (T, N), dtype, "dones"),
        next_done=next_done,
    )
    ns1, ns2 = run_both(CLEANRL_RETURNS, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


@HYP
@given(T=lengths, N=st.sampled_from([1, 3]), dtype=dtypes, seed=st.integers(0, 2**16))
def test_carried_value_read_into_a_temporary_bitwise(T, N, dtype, seed):
    env = dict(
        rewards=tensor(seed, (T, N), dtype),
        masks=1.0 - tensor(seed + 1, (T, N), dtype, "dones"),
        next_value=tensor(seed + 2, (N,), dtype),
    )
    ns1, ns2 = run_both(ALIASED_RETURNS, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


def test_cleanrl_returns_site():
    out, sites = rewrite(CLEANRL_RETURNS)
    (site,) = sites
    assert (site.action, site.exactness) == (REWRITTEN, EXACT), site.describe()
    assert "next_return = returns[t + 1]" in site.reason
    assert "memo=(returns,)" in out


# pytorch/examples reinforce.py: returns built with deque.appendleft over rewards[::-1]
APPENDLEFT = """\
from collections import deque

def finish(rewards, gamma, returns):
    R = 0
    for r in rewards[::-1]:
        R = r + gamma * R
        returns.appendleft(R)
    return returns, R, r

out = finish(rewards, gamma, returns)
"""


@HYP
@given(T=lengths, seed=st.integers(0, 2**16), kind=st.sampled_from(["floats", "tensors", "numpy"]),
       prefill=st.sampled_from([0, 2]), maxlen=st.sampled_from([None, 5]))
def test_appendleft_on_a_deque_bitwise(T, seed, kind, prefill, maxlen):
    """F-appendleft: ``returns.appendleft(R)`` on a ``collections.deque`` (also one already holding
    items, and a bounded one that drops items at the right end as the loop goes)."""
    rng = np.random.default_rng(seed)
    if kind == "floats":
        rewards = [float(x) for x in rng.standard_normal(T)]
    elif kind == "tensors":
        rewards = [torch.tensor(x, dtype=torch.float32) for x in rng.standard_normal(T)]
    else:
        rewards = rng.standard_normal(T)
    env = dict(rewards=rewards, gamma=0.99, returns=deque([7.0] * prefill, maxlen))
    ns1, ns2 = run_both(APPENDLEFT, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


@pytest.mark.parametrize("returns", [[], [1.0]], ids=["list", "list-prefilled"])
def test_appendleft_on_a_list_takes_the_loop(returns):
    """``appendleft`` on something other than a deque: the loop runs and fails as it would."""
    new = _rewritten_forbidding_op(APPENDLEFT)
    env = dict(rewards=[1.0, 2.0, 3.0, 4.0], gamma=0.5, returns=returns)
    with pytest.raises(AttributeError):
        harness.load(APPENDLEFT, filename="orig", namespace=clone(env))
    with pytest.raises(AttributeError):
        harness.load(new, filename="new", namespace=clone(env))


# minimalRL a2c.py compute_target: lists of per-env numpy rows, int64 masks (1 - done of bools)
A2C_ROWS = """\
gamma = 0.98

def compute_target(v_final, r_lst, mask_lst):
    G = v_final.reshape(-1)
    td_target = list()

    for r, mask in zip(r_lst[::-1], mask_lst[::-1]):
        G = r + gamma * G * mask
        td_target.append(G)

    return td_target[::-1], G, r, mask

out = compute_target(v_final, r_lst, mask_lst)
"""

# the mask in the coefficient, grouped as the op groups it (exact), the per-step input integer
ROWS_EXACT = """\
def f(r_lst, m_lst, k_lst, G):
    out = []
    for r, m, k in zip(reversed(r_lst), reversed(m_lst), reversed(k_lst)):
        G = (r + k) + (0.9 * m) * G
        out.insert(0, G)
    return out, G

res = f(r_lst, m_lst, k_lst, G)
"""


@HYP
@given(T=lengths, n=st.sampled_from([1, 3]), seed=st.integers(0, 2**16),
       mask=st.sampled_from(["int64", "bool", "float64", "uint8"]), v_dtype=st.sampled_from([np.float32, np.float64]))
def test_lists_of_numpy_rows(T, n, seed, mask, v_dtype):
    """F-a2c-rows: lists of numpy rows with integer, bool or float masks take the vectorized
    branch; the rewrite is reassociated (``gamma * G * mask`` regrouped) and equal up to rounding,
    with the loop's types (a list of float64 rows)."""
    rng = np.random.default_rng(seed)
    dones = [rng.random(n) < 0.1 for _ in range(T)]
    masks = {"int64": [1 - d for d in dones], "bool": [~d for d in dones],
             "float64": [1.0 - d for d in dones], "uint8": [(1 - d).astype(np.uint8) for d in dones]}[mask]
    env = dict(v_final=rng.standard_normal((n, 1)).astype(v_dtype),
               r_lst=[rng.standard_normal(n) / 100.0 for _ in range(T)], mask_lst=masks)
    ns1, ns2 = run_both(A2C_ROWS, env, exactness=REASSOCIATED, vectorized=T >= 2)
    same_namespaces(ns1, ns2, exact=False)


@HYP
@given(T=lengths, n=st.sampled_from([(1,), (4,), (3, 2)]), seed=st.integers(0, 2**16),
       kinds=st.sampled_from([("f8", "i8", "i8"), ("f8", "f8", "b1"), ("i8", "f8", "f8"), ("f8", "u1", "i4")]))
def test_numpy_rows_with_integer_inputs_bitwise(T, n, seed, kinds):
    """Integer / bool rows next to float64 ones: numpy promotes them to float64 in any grouping,
    so the stacked arrays give the rows' values bitwise (also when the per-step input ``r + k``
    or the coefficient is made of integers and float64 comes in elsewhere)."""
    rng = np.random.default_rng(seed)

    def rows(kind):
        if kind == "f8":
            return [rng.standard_normal(n) for _ in range(T)]
        if kind == "b1":
            return [rng.random(n) < 0.5 for _ in range(T)]
        return [rng.integers(0, 3, n).astype(kind) for _ in range(T)]

    r, m, k = (rows(x) for x in kinds)
    env = dict(r_lst=r, m_lst=m, k_lst=k, G=rng.standard_normal(n))
    ns1, ns2 = run_both(ROWS_EXACT, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


@pytest.mark.parametrize("case", ["float32-with-int64", "row-shapes", "int-only", "ragged-dtypes", "0-d rows",
                                  "2-d row shapes"])
def test_numpy_row_guard_declines(case):
    ok = vectorized_mod.recurrence_ok
    f32 = [np.zeros(3, np.float32)] * 8
    f64 = [np.zeros(3)] * 8
    i64 = [np.zeros(3, np.int64)] * 8
    assert ok(8, seqs=((f64, 0), (i64, 0)), lists=([],))
    bad = {
        "float32-with-int64": ((f32, 0), (i64, 0)),  # numpy would promote the rows to float64
        "row-shapes": ((f64, 0), ([np.zeros((3, 1))] * 8, 0)),
        "int-only": ((i64, 0),),
        "ragged-dtypes": ((f64[:7] + [np.zeros(3, np.float32)], 0),),
        "0-d rows": (([np.zeros(())] * 8, 0),),
        "2-d row shapes": (([np.zeros((2, 3))] * 7 + [np.zeros((3, 2))], 0),),
    }[case]
    assert not ok(8, seqs=bad, lists=([],))
    # the quadratic rewrite does not take rows
    assert not vectorized_mod.quadratic_ok(8, seqs=((f64, 0),))


# minimalRL ppo.py: the loop walks the rows of a [T, 1] array and reads element [0] of each row
MINIMALRL_PPO = """\
class PPO:
    gamma = 0.98
    lmbda = 0.95

    def gae(self, delta):
        advantage_lst = []
        advantage = 0
        for delta_t in delta[::-1]:
            advantage = self.gamma * self.lmbda * advantage + delta_t[0]
            advantage_lst.append([advantage])
        advantage_lst.reverse()
        return advantage_lst, advantage, delta_t

out = PPO().gae(delta)
"""

# the same over a tensor's rows with reversed(), a negative index and a two-index element read
ROW_ELEMENTS = """\
def f(x, y, gamma):
    s = 0.0
    out = []
    for x_t, y_t in zip(reversed(x), reversed(y)):
        s = x_t[-1] + gamma * y_t[0, 1] * s
        out.insert(0, s)
    return out, s

res = f(x, y, 0.9)
"""


@HYP
@given(T=lengths, seed=st.integers(0, 2**16), dt=st.sampled_from([np.float32, np.float64]),
       width=st.sampled_from([1, 3]))
def test_minimalrl_ppo_row_element_bitwise(T, seed, dt, width):
    """F-minimalrl-ppo: ``delta_t[0]`` of the rows of a numpy array walked by ``delta[::-1]``,
    appended as ``[advantage]``: the lists of one-element lists, ``advantage``, ``delta_t`` bitwise."""
    rng = np.random.default_rng(seed)
    ns1, ns2 = run_both(MINIMALRL_PPO, dict(delta=rng.standard_normal((T, width)).astype(dt)), vectorized=T >= 2)
    same_namespaces(ns1, ns2)
    if T:
        assert isinstance(ns2["out"][0][0], list) and len(ns2["out"][0][0]) == 1


@HYP
@given(T=lengths, seed=st.integers(0, 2**16), dtype=dtypes, kind=st.sampled_from(["tensor", "numpy"]))
def test_row_elements_of_tensors_and_arrays(T, seed, dtype, kind):
    x, y = tensor(seed, (T, 3), dtype), 1.0 - tensor(seed + 1, (T, 2, 2), dtype, "dones")
    if kind == "numpy":
        x, y = x.numpy(), y.numpy()
    ns1, ns2 = run_both(ROW_ELEMENTS, dict(x=x, y=y), vectorized=T >= 2)
    same_namespaces(ns1, ns2)


@pytest.mark.parametrize(
    "delta",
    [np.arange(6.0), [[1.0], [2.0], [3.0], [4.0]], np.zeros((5, 0))],
    ids=["1-d array: delta_t[0] raises", "list of lists", "empty rows: delta_t[0] raises"],
)
def test_row_element_guard_falls_back_to_the_loop(delta):
    ns1, ns2, err = run_falling_back(MINIMALRL_PPO, dict(delta=delta))
    if err is None:
        same_namespaces(ns1, ns2)


WIDE_OUT = """\
def f(rewards, gamma, out):
    R = 0.0
    for t in reversed(range(len(rewards))):
        R = rewards[t] + gamma * R
        out[t] = R
        wide[t] = gamma * R
    return out, R

res = f(rewards, 0.9, out)
"""


@pytest.mark.parametrize("kind", ["torch", "numpy"])
@pytest.mark.parametrize("shape", ["T-2", "3", "T-2,1", "1"])
def test_rows_written_into_wider_outputs(kind, shape):
    """A per-step value of lower rank than the output's rows is broadcast over each row, as
    ``out[t] = R`` does (before the fix the time axis was broadcast across the row: wrong values
    when the row width was T - 2, an exception otherwise)."""
    T = 9
    dims = tuple(T - 2 if d == "T-2" else int(d) for d in shape.split(","))
    r = tensor(0, (T,), torch.float64)
    env = dict(rewards=r, out=torch.zeros((T,) + dims, dtype=torch.float64),
               wide=torch.zeros((T, 1) + dims, dtype=torch.float64))
    if kind == "numpy":
        env = {k: v.numpy() for k, v in env.items()}
    ns1, ns2 = run_both(WIDE_OUT, env)
    same_namespaces(ns1, ns2)


# Khrylx/PyTorch-RL estimate_advantages: carried values read back from the output rows
KHRYLX = """\
def estimate_advantages(rewards, masks, values, gamma, tau, tensor_type):

    returns = tensor_type(rewards.size(0), 1)
    deltas = tensor_type(rewards.size(0), 1)
    advantages = tensor_type(rewards.size(0), 1)

    prev_return = 0
    prev_value = 0
    prev_advantage = 0
    for i in reversed(range(rewards.size(0))):
        returns[i] = rewards[i] + gamma * prev_return * masks[i]
        deltas[i] = rewards[i] + gamma * prev_value * masks[i] - values[i]
        advantages[i] = deltas[i] + gamma * tau * prev_advantage * masks[i]

        prev_return = returns[i, 0]
        prev_value = values[i, 0]
        prev_advantage = advantages[i, 0]
    return advantages, returns, deltas, prev_return, prev_value, prev_advantage, i

out = estimate_advantages(rewards, masks, values, 0.99, 0.95, tensor_type)
"""


@HYP
@given(T=lengths, seed=st.integers(0, 2**16), dtype=dtypes, mask_kind=st.sampled_from(["dones", "normal"]))
def test_khrylx_read_back_rows(T, seed, dtype, mask_kind):
    """F-khrylx: three recurrences in one loop, carried through ``prev = out[i, 0]`` after
    ``out[i] = ...``, ``deltas[i]`` read after its write, ``values[i, 0]`` carried one step, and
    inputs of different row ranks (``masks`` is [T], the rest [T, 1]); reassociated (``gamma *
    prev * masks[i]`` regrouped), every other variable as the loop leaves it."""
    masks = 1.0 - tensor(seed + 1, (T,), dtype, "dones") if mask_kind == "dones" else tensor(seed + 1, (T,), dtype)
    env = dict(rewards=tensor(seed, (T, 1), dtype), masks=masks, values=tensor(seed + 2, (T, 1), dtype),
               tensor_type=lambda *shape: torch.zeros(*shape, dtype=dtype))
    ns1, ns2 = run_both(KHRYLX, env, exactness=REASSOCIATED, vectorized=T >= 2)
    same_namespaces(ns1, ns2, exact=False)
    if T >= 2:
        (_, _, d1, *_), (_, _, d2, *_) = ns1["out"], ns2["out"]
        same(d1, d2, exact=True)  # deltas: same grouping, bitwise
        same(ns1["out"][4:], ns2["out"][4:], exact=False)


READ_BACK = """\
def f(rewards, values, gamma, lam, out, adv):
    s = 0.0
    g = 0.0
    for t in reversed(range(len(rewards))):
        out[t] = rewards[t] + gamma * s
        s = out[t]
        delta = out[t] - values[t]
        adv[t] = delta + (gamma * lam) * g
        g = adv[t]
    return out, adv, s, g, delta, t

res = f(rewards, values, 0.99, 0.95, out, adv)
"""


@HYP
@given(T=lengths, N=st.sampled_from([1, 3]), dtype=dtypes, seed=st.integers(0, 2**16),
       kind=st.sampled_from(["tensor", "numpy"]), out_dtype=st.sampled_from(["same", "other"]))
def test_read_back_whole_rows_bitwise(T, N, dtype, seed, kind, out_dtype):
    """``s = out[t]`` after ``out[t] = ... s``: the carried value lives in ``out`` (any row shape),
    exact; an output of another dtype (which rounds what the loop reads back) takes the loop."""
    odt = dtype if out_dtype == "same" else (torch.float64 if dtype == torch.float32 else torch.float32)
    env = dict(rewards=tensor(seed, (T, N), dtype), values=tensor(seed + 1, (T, N), dtype),
               out=torch.zeros(T, N, dtype=odt), adv=torch.zeros(T, N, dtype=odt))
    if kind == "numpy":
        env = {k: v.numpy() for k, v in env.items()}
    ns1, ns2 = run_both(READ_BACK, env, vectorized=T >= 2 and out_dtype == "same")
    same_namespaces(ns1, ns2)


ALIGNED = """\
import torch
returns = torch.zeros_like(rewards if rewards.dim() >= masks.dim() else masks)
running = next_value
for t in reversed(range(rewards.size(0))):
    returns[t] = running = rewards[t] + (gamma * masks[t]) * running
"""


@HYP
@given(T=lengths, N=st.sampled_from([1, 3]), dtype=dtypes, seed=st.integers(0, 2**16), wide=st.sampled_from(["rewards", "masks"]))
def test_inputs_of_different_row_ranks_bitwise(T, N, dtype, seed, wide):
    """Rows of [T, N] and [T] inputs broadcast per step; time first, the [T] one is aligned as
    [T, 1] (before: declined by the guard)."""
    r_shape, m_shape = ((T, N), (T,)) if wide == "rewards" else ((T,), (T, N))
    env = dict(rewards=tensor(seed, r_shape, dtype), masks=1.0 - tensor(seed + 1, m_shape, dtype, "dones"),
               next_value=tensor(seed + 2, (N,), dtype), gamma=0.99)
    ns1, ns2 = run_both(ALIGNED, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


def test_read_back_guard_wants_one_element_rows():
    """``prev = out[i, 0]`` carried as the row ``out[i]``: only when the rows hold one element."""
    new = _rewritten_forbidding_op(KHRYLX, REASSOCIATED)
    T = 7
    env = dict(rewards=tensor(0, (T, 2), torch.float64), masks=tensor(1, (T,), torch.float64),
               values=tensor(2, (T, 2), torch.float64), tensor_type=lambda *s: torch.zeros(s[0], 2, dtype=torch.float64))
    ns1, ns2 = harness.run_pair(KHRYLX, new, env, clone=clone)
    same_namespaces(ns1, ns2)
    assert not vectorized_mod.recurrence_ok(4, seqs=((torch.zeros(4, 2), 0),), memo=(torch.zeros(4, 2),),
                                            cells=(torch.zeros(4, 2),))
    assert not vectorized_mod.recurrence_ok(4, seqs=((torch.zeros(4, 1), 0),), outs=(torch.zeros(4, 1, 1),),
                                            reads=((torch.zeros(4, 1, 1), 0),))  # not among the outs


FORWARDED = """\
def f(rewards, values, gamma, lam, deltas, adv):
    g = 0.0
    for t in reversed(range(len(rewards))):
        deltas[t] = rewards[t] - values[t]
        adv[t] = g = (deltas[t] + gamma * g) * lam
    return adv, deltas, g

res = f(rewards, values, 0.99, 0.95, deltas, adv)
"""


@HYP
@given(T=lengths, dtype=dtypes, seed=st.integers(0, 2**16))
def test_read_after_write_in_a_regrouped_update(T, dtype, seed):
    """``deltas[t]`` read after this step wrote it, in an update whose invariant coefficient is
    regrouped: a per-step read of the stored slice, never a loop invariant for the guard."""
    env = dict(rewards=tensor(seed, (T,), dtype), values=tensor(seed + 1, (T,), dtype),
               deltas=torch.zeros(T, dtype=dtype), adv=torch.zeros(T, dtype=dtype))
    ns1, ns2 = run_both(FORWARDED, env, exactness=REASSOCIATED, vectorized=T >= 2)
    same_namespaces(ns1, ns2, exact=False)
    guard = next(line for line in rewritten(FORWARDED, REASSOCIATED).splitlines() if "recurrence_ok(" in line)
    assert "deltas[t]" not in guard and "reads=((deltas, 0),)" in guard


# dreamerv2 compute_return: the loop walks a list materialised from a backward range
DREAMER = """\
import torch


def compute_return(reward, value, discount, bootstrap, lambda_):
    next_values = torch.cat([value[1:], bootstrap[None]], 0)
    target = reward + discount * next_values * (1 - lambda_)
    timesteps = STEPS
    outputs = []
    accumulated_reward = bootstrap
    for t in timesteps:
        inp = target[t]
        discount_factor = discount[t]
        accumulated_reward = inp + discount_factor * lambda_ * accumulated_reward
        outputs.append(accumulated_reward)
    returns = torch.flip(torch.stack(outputs), [0])
    return returns, outputs, accumulated_reward, t, inp, discount_factor

out = compute_return(reward, value, discount, bootstrap, 0.95) if T else None
"""
STEP_LISTS = ["list(range(reward.shape[0] - 1, -1, -1))", "range(reward.shape[0] - 1, -1, -1)",
              "tuple(range(len(reward) - 1, -1, -1))", "list(reversed(range(reward.shape[0])))"]


@HYP
@given(T=lengths, B=st.sampled_from([1, 5]), dtype=dtypes, seed=st.integers(0, 2**16), steps=st.sampled_from(STEP_LISTS))
def test_dreamer_named_backward_range_bitwise(T, B, dtype, seed, steps):
    """F-dreamer: ``for t in timesteps`` over a list (tuple, range) materialised from a backward
    range a few lines up; the guard checks the list itself at run time."""
    src = DREAMER.replace("STEPS", steps)
    env = dict(T=T, reward=tensor(seed, (T, B, 1), dtype), value=tensor(seed + 1, (T, B, 1), dtype),
               discount=0.99 * (1.0 - tensor(seed + 2, (T, B, 1), dtype, "dones")), bootstrap=tensor(seed + 3, (B, 1), dtype))
    ns1, ns2 = run_both(src, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


NAMED_SPLIT = """\
def f(rewards, values, last, gamma, n):
    steps = list(range(n - 1, -1, -1))
    CHANGE
    R = 0.0
    out = []
    for t in steps:
        if t == n - 1:
            nv = last
        else:
            nv = values[t + 1]
        R = rewards[t] - nv + gamma * R
        out.insert(0, R)
    return out, R

res = f(rewards, values, 1.5, 0.9, len(rewards))
"""


@pytest.mark.parametrize("change", ["pass", "steps.reverse()", "steps.pop()", "steps.append(0)", "n = n + 1",
                                    "steps[0] = float(steps[0])", "steps[-1] = False"])
def test_named_backward_range_guard(change):
    """The list is checked at run time (reordered, shortened, changed types: the loop runs); a
    last-step test on ``n`` also wants ``n`` to still match it."""
    src = NAMED_SPLIT.replace("CHANGE", change)
    env = dict(rewards=tensor(0, (9,), torch.float64), values=tensor(1, (9,), torch.float64))
    if change == "pass":
        ns1, ns2 = run_both(src, env)
        same_namespaces(ns1, ns2)
        return
    ns1, ns2, err = run_falling_back(src, env)
    if err is None:
        same_namespaces(ns1, ns2)


def test_backward_steps():
    bs = vectorized_mod.backward_steps
    assert bs([3, 2, 1, 0]) == 4 and bs((1, 0)) == 2 and bs(range(5, -1, -1)) == 6 and bs([]) == 0
    assert bs(range(0)) == 0 and bs(range(4)) == -1 and bs(range(4, 0, -1)) == -1
    assert bs([1, 0.0]) == -1 and bs([True, False]) == -1 and bs([2, 1]) == -1 and bs(np.arange(3)[::-1]) == -1
    it = iter([1, 0])
    assert bs(it) == -1 and list(it) == [1, 0]  # not consumed
    assert bs(reversed(range(3))) == -1


# oxwhirl/pymarl build_td_lambda_targets: time along dimension 1, range(X - 2, -1, -1)
PYMARL = """\
import torch as th


def build_td_lambda_targets(rewards, terminated, mask, target_qs, n_agents, gamma, td_lambda):
    ret = target_qs.new_zeros(*target_qs.shape)
    ret[:, -1] = target_qs[:, -1] * (1 - th.sum(terminated, dim=1))
    for t in range(ret.shape[1] - 2, -1,  -1):
        ret[:, t] = td_lambda * gamma * ret[:, t + 1] + mask[:, t] \\
                    * (rewards[:, t] + (1 - td_lambda) * gamma * target_qs[:, t + 1] * (1 - terminated[:, t]))
    return ret[:, 0:-1], t

out = build_td_lambda_targets(rewards, terminated, mask, target_qs, 2, 0.99, 0.8)
"""


@HYP
@given(T=lengths, B=st.sampled_from([1, 3]), A=st.sampled_from([1, 2]), dtype=dtypes, seed=st.integers(0, 2**16))
def test_pymarl_along_dimension_1_bitwise(T, B, A, dtype, seed):
    """F-pymarl: ``ret[:, t] = c * ret[:, t + 1] + b[:, t]`` over [B, T, A] tensors walked by
    ``range(ret.shape[1] - 2, -1, -1)`` (the last step set before the loop): time-major views,
    exact (``c * x + b`` is the op's ``b + c * x``)."""
    env = dict(rewards=tensor(seed, (B, T, 1), dtype), terminated=tensor(seed + 1, (B, T, 1), dtype, "dones"),
               mask=1.0 - tensor(seed + 2, (B, T, 1), dtype, "dones"), target_qs=tensor(seed + 3, (B, T + 1, A), dtype))
    src = PYMARL if T else PYMARL.replace("ret[:, 0:-1], t", "ret[:, 0:-1], None")
    ns1, ns2 = run_both(src, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


DIM1_NUMPY = """\
def returns_of(rewards, dones, last, gamma):
    out = np.zeros((rewards.shape[0], rewards.shape[1] + 1), dtype=rewards.dtype)
    out[:, -1] = last
    for t in range(out.shape[1] - 2, -1, -1):
        out[:, t] = rewards[:, t] + gamma * (1 - dones[:, t]) * out[:, t + 1]
    return out, t

import numpy as np
res = returns_of(rewards, dones, last, 0.99) if rewards.shape[1] else None
"""


@HYP
@given(T=lengths, N=st.sampled_from([1, 4]), dt=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16))
def test_numpy_rows_along_dimension_1_bitwise(T, N, dt, seed):
    rng = np.random.default_rng(seed)
    env = dict(rewards=rng.standard_normal((N, T)).astype(dt), dones=(rng.random((N, T)) < 0.2).astype(dt),
               last=rng.standard_normal(N).astype(dt))
    ns1, ns2 = run_both(DIM1_NUMPY, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


LAST_SET_BEFORE = """\
def f(rewards, last, gamma):
    out = torch.zeros(len(rewards) + 1, *rewards.shape[1:], dtype=rewards.dtype)
    out[-1] = last
    for t in range(len(out) - 2, -1, -1):
        out[t] = rewards[t] + gamma * out[t + 1]
    return out, t

import torch
res = f(rewards, last, 0.9) if len(rewards) else None
"""


@HYP
@given(T=lengths, dtype=dtypes, seed=st.integers(0, 2**16))
def test_range_from_x_minus_2(T, dtype, seed):
    env = dict(rewards=tensor(seed, (T, 2), dtype), last=tensor(seed + 1, (2,), dtype))
    ns1, ns2 = run_both(LAST_SET_BEFORE, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


def test_dimension_1_guard_declines_what_has_no_dimension_1():
    assert vectorized_mod.dim1(torch.zeros(3)) is None and vectorized_mod.dim1([[1.0]]) is None
    x = torch.zeros(2, 5, 3)
    v = vectorized_mod.dim1(x)
    v[1:3] = 1.0
    assert x[:, 1:3].eq(1).all() and x[:, 0].eq(0).all()  # a view: writes land in x
    env = dict(rewards=tensor(0, (2, 6, 1), torch.float64), terminated=torch.zeros(2, 6, 1, dtype=torch.float64),
               mask=torch.ones(6, dtype=torch.float64), target_qs=tensor(1, (2, 7, 1), torch.float64))
    new = _rewritten_forbidding_op(PYMARL)
    with pytest.raises(IndexError):  # mask[:, t] of a 1-D mask: the loop raises as written
        harness.load(new, filename="new", namespace=clone(env))


CORPUS_NEGATIVE = [
    ("""\
def f(returns, rewards, gamma):
    for t in reversed(range(rewards.size(0))):
        nxt = returns[t + 1]
        returns[t] = rewards[t] + gamma * nxt
        bonus = 0.5 * nxt
    return returns, bonus
""", "reads `returns[t + 1]`, which the loop writes"),  # the temporary has another reader
    ("""\
def f(returns, rewards, gamma):
    nxt = 0.0
    for t in reversed(range(rewards.size(0))):
        returns[t] = rewards[t] + gamma * nxt
        nxt = returns[t + 1]
    return returns
""", "reads `returns[t + 1]`, which the loop writes"),  # read after the write: two steps back
    ("""\
def f(returns, rewards, gamma):
    for t in reversed(range(rewards.size(0))):
        nxt = returns[t + 2]
        returns[t] = rewards[t] + gamma * nxt
    return returns
""", "reads `returns[t + 2]`, which the loop writes"),
    ("""\
def f(delta, gamma, k):
    advantage = 0.0
    out = []
    for delta_t in delta[::-1]:
        advantage = gamma * advantage + delta_t[k]
        out.append(advantage)
    return out
""", "indexes `delta_t[k]`, a value computed in the loop"),  # only literal indices are columns
    ("""\
def f(delta, gamma):
    advantage = 0.0
    out = []
    for delta_t in delta[::-1]:
        advantage = gamma * advantage + delta_t[0:1]
        out.append(advantage)
    return out
""", "indexes `delta_t[0:1]`, a value computed in the loop"),
    ("""\
def f(out, rewards, gamma):
    s = 0.0
    for t in reversed(range(rewards.size(0))):
        out[t] = rewards[t] + gamma * s
        s = out[t, 0]
        bonus = 2.0 * s
    return out, bonus
""", "`s` carries a value from the previous step that is not a plain per-step read"),  # another reader
    ("""\
def f(out, rewards, gamma):
    s = 0.0
    for t in reversed(range(rewards.size(0))):
        s = out[t, 0]
        out[t] = rewards[t] + gamma * s
    return out
""", "reads `out[t, 0]`, which the loop writes"),  # read before this step's write: stale memory
    ("""\
def f(out, rewards, gamma):
    s = 0.0
    for t in reversed(range(rewards.size(0))):
        out[t] = rewards[t] + gamma * s
        out[t] = out[t] * 2.0
        s = out[t, 0]
    return out
""", "which the loop writes"),  # two writers
    ("""\
class Policy:
    def train_net(self):
        R = 0
        self.optimizer.zero_grad()
        for r, prob in self.data[::-1]:
            R = r + gamma * R
            loss = -torch.log(prob) * R
            loss.backward()
        self.optimizer.step()
""", "calls `loss.backward()`"),  # minimalRL REINFORCE: reported, not dropped silently
    ("""\
def f(data, gamma):
    R = 0.0
    out = []
    for r, p in data[::-1]:
        R = r + gamma * R
        out.insert(0, R * p)
    return out
""", "unpacks each element of `data[::-1]` into `r, p`"),
    ("""\
def f(ret, rewards, gamma):
    for t in range(ret.shape[1] - 2, -1, -1):
        ret[:, t] = rewards[:, t] + gamma * ret[:, t + 1]
        ret[0, t] = 0.0
    return ret
""", "`ret` is indexed along dimension 1 and also otherwise"),
    ("""\
def f(ret, rewards, gamma):
    for t in range(ret.shape[1] - 2, -1, -1):
        ret[:, t] = rewards[:, t] + gamma * ret[:, t + 2]
    return ret
""", "recurrence through memory"),
]


@pytest.mark.parametrize("src,reason", CORPUS_NEGATIVE, ids=[f"corpus-{i}" for i in range(len(CORPUS_NEGATIVE))])
def test_corpus_look_alikes_are_left_alone(src, reason):
    out, sites = rewrite(src)
    assert out == src  # byte for byte
    assert any(s.action == SKIPPED and reason in s.reason for s in sites), [s.describe() for s in sites]
    assert not any(s.action == REWRITTEN for s in sites)


# ------------------------------------------------------------------ form of the output


def test_cleanrl_rewrite_reads_well_and_keeps_the_loop():
    out, sites = rewrite(CLEANRL)
    (site,) = sites
    assert site.action == REWRITTEN and site.exactness == EXACT
    assert (site.line, site.end_line) == (7, 15)
    assert "from scalebox_cst.runtime.recurrence import linear_recurrence" in out
    assert "linear_recurrence(args.gamma * args.gae_lambda * nextnonterminal_v, delta_v" in out
    # the original loop, verbatim, in the else branch
    loop = CLEANRL[CLEANRL.index("    for t in"):CLEANRL.index("    returns =")]
    assert textwrap.indent(textwrap.dedent(loop), " " * 8) in out
    # everything outside the loop is untouched
    assert out.endswith("    returns = advantages + values\n")
    assert rewrite(CLEANRL)[0] == out  # deterministic


def test_rewriting_the_output_again_changes_nothing():
    out = rewritten(CLEANRL)
    again, sites = rewrite(out)
    assert again == out
    assert not any(s.action == REWRITTEN for s in sites)


NESTED = """\
import contextlib


def loop(rewards, gamma):
    R = 0.0
    out = []
    for r in reversed(rewards):
        R = r + gamma * R
        out.insert(0, R)
    return out


class A:
    def m(self, rewards, gamma, flag, mode):
        results = []
        try:
            R = 0.0
            out = []
            for r in reversed(rewards):
                R = r + gamma * R
                out.insert(0, R)
            results.append(out)
        except ValueError:
            R = 0.0
            out = []
            for r in reversed(rewards):
                R = r + gamma * R
                out.insert(0, R)
            results.append(out)
        finally:
            with contextlib.nullcontext():
                if flag:
                    pass
                elif not flag:
                    R = 0.0
                    out = []
                    for r in reversed(rewards):
                        R = r + gamma * R
                        out.insert(0, R)
                    results.append(out)
        while not results:
            break
        else:
            R = 0.0
            out = []
            for r in reversed(rewards):
                R = r + gamma * R
                out.insert(0, R)
            results.append(out)
        match mode:
            case 1:
                R = 0.0
                out = []
                for r in reversed(rewards):
                    R = r + gamma * R
                    out.insert(0, R)
                results.append(out)
        return results


res = A().m(rewards, 0.9, False, 1), loop(rewards, 0.9)
"""


def test_loops_in_every_kind_of_block():
    out, sites = rewrite(NESTED)
    lines = [(s.line, s.end_line) for s in sites if s.action == REWRITTEN]
    starts = [i + 1 for i, line in enumerate(NESTED.splitlines()) if line.strip() == "for r in reversed(rewards):"]
    assert [a for a, _ in lines] == starts and all(b == a + 2 for a, b in lines)
    ns1, ns2 = run_both(NESTED, dict(rewards=[float(x) for x in range(9)]))
    same_namespaces(ns1, ns2)
    assert len(ns1["res"][0]) == 4


def test_names_do_not_clash_with_the_users():
    src = "T = 3\nrewards_v = 1\n" + REINFORCE_INSERT
    out = rewritten(src)
    assert "T_2 :=" in out and "rewards_v_2 = " in out
    ns1, ns2 = harness.run_pair(src, out, {"rewards": [1.0, 2.0, 3.0], "gamma": 0.9}, clone=clone)
    same_namespaces(ns1, ns2)


# ------------------------------------------------------------------ the bundled examples


def _numbers(text: str) -> str:
    return re.sub(r"sps=\d+", "sps=?", text)


@pytest.mark.parametrize("script", ["cartpole_ppo/train.py", "cuda_reinforce/train.py"])
def test_rewritten_example_scripts_print_the_same(script, tmp_path):
    path = os.path.join(ROOT, "examples", script)
    src = open(path).read()
    out, sites = rewrite(src)
    assert any(s.action == REWRITTEN for s in sites), [s.describe() for s in sites]
    (tmp_path / "orig.py").write_text(src)
    (tmp_path / "new.py").write_text(out)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(tmp_path / name), "--total-steps", "600", "--device", "cpu"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for name in ("orig.py", "new.py")]
    runs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        runs.append(_numbers(stdout))
    assert runs[0] == runs[1]
    assert "final_return=" in runs[0]
