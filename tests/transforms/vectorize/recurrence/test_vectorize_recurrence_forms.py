"""vectorize.recurrence, issue 14 part 2 forms: the last-step special case written as a conditional
expression, loop-invariant conditions unswitched, if/else episode resets that write two outputs.
Differential tests (original vs rewritten code on the same random inputs, bitwise where the site
says exact) and look-alikes that must stay as written, with their reasons."""
from __future__ import annotations


import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from scalebox_cst.report import EXACT, REASSOCIATED, REWRITTEN
from scalebox_cst.runtime import vectorized as vectorized_mod
from scalebox_cst.runtime.vectorized import conversions as vectorized_conversions

from differential import HYP, arrays, dtypes, kinds, lengths, same_namespaces, tensor
from recurrence_harness import left_alone, rewrite, run_both, sites_of

_MIN_STEPS = dict(vectorized_mod.MIN_STEPS)


def setup_module(module):
    # vectorize from 2 steps on, so that short random sequences exercise the vectorized branch
    vectorized_mod.MIN_STEPS.update({k: 2 for k in _MIN_STEPS})


def teardown_module(module):
    vectorized_mod.MIN_STEPS.update(_MIN_STEPS)


# ------------------------------------------------------------------ 1. last step as a conditional expression

# LLM fine-tuning code (per-token GAE over a response, lists of floats): the bootstrap is 0 at the end
TOKEN_GAE = """\
def gae_advantages(values, rewards, gae_lambda, gae_gamma):
    response_length = len(values)
    lastgaelam = 0.0
    advantages_reversed = []
    for t in reversed(range(response_length)):
        nextvalues = values[t + 1] if t < response_length - 1 else 0.0
        delta = rewards[t] + gae_gamma * nextvalues - values[t]
        lastgaelam = delta + gae_gamma * gae_lambda * lastgaelam
        advantages_reversed.append(lastgaelam)
    return advantages_reversed[::-1]

out = gae_advantages(values, rewards, 0.95, 0.99)
"""


@HYP
@given(T=lengths, seed=st.integers(0, 2**16))
def test_token_gae_over_lists_bitwise(T, seed):
    rng = np.random.default_rng(seed)
    env = dict(values=[float(x) for x in rng.standard_normal(T)], rewards=[float(x) for x in rng.standard_normal(T)])
    ns1, ns2 = run_both(TOKEN_GAE, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


# the same written with the bootstrap value and the episode mask, each chosen by a conditional
# expression, the mirrored spellings of the last-step test, and one used inline in the update
MIRRORED = """\
def gae(rewards, values, dones, last_value, last_done, gamma, lam, adv):
    T = len(rewards)
    gae = 0.0
    for t in reversed(range(T)):
        nv = last_value if t == T - 1 else values[t + 1]
        nonterminal = 1.0 - dones[t + 1] if t + 1 < T else 1.0 - last_done
        delta = rewards[t] + gamma * nv * nonterminal - values[t]
        gae = delta + gamma * lam * nonterminal * gae
        adv[t] = gae
    return adv, gae, delta, nv, nonterminal, t

out = gae(rewards, values, dones, last_value, last_done, 0.99, 0.95, adv)
"""

INLINE = """\
def gae(rewards, values, dones, last_value, last_done, gamma, lam, adv):
    T = len(rewards)
    gae = 0.0
    for t in reversed(range(T)):
        delta = rewards[t] + gamma * (values[t + 1] if t != T - 1 else last_value) * (1.0 - dones[t]) - values[t]
        gae = delta + gamma * lam * (1.0 - dones[t + 1] if T - 1 > t else 1.0 - last_done) * gae
        adv[t] = gae
    return adv, gae

out = gae(rewards, values, dones, last_value, last_done, 0.99, 0.95, adv)
"""


@HYP
@given(T=lengths, N=st.sampled_from([1, 3]), dtype=dtypes, seed=st.integers(0, 2**16), kind=kinds,
       src=st.sampled_from([MIRRORED, INLINE]))
def test_gae_with_conditional_last_step_bitwise(T, N, dtype, seed, kind, src):
    env = dict(
        rewards=arrays(kind, seed, (T, N), dtype),
        values=arrays(kind, seed + 1, (T, N), dtype),
        dones=arrays(kind, seed + 2, (T, N), dtype, "dones"),
        last_value=arrays(kind, seed + 3, (N,), dtype),
        last_done=arrays(kind, seed + 4, (N,), dtype, "dones"),
        adv=arrays(kind, seed + 5, (T, N), dtype) * 0,
    )
    ns1, ns2 = run_both(src, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


# carried through memory: the output's next row, or nothing at the end (was "appears non-affinely")
MEMORY_INLINE = """\
def returns_of(x, rewards, gamma):
    for i in reversed(range(len(rewards))):
        x[i] = rewards[i] + gamma * (x[i + 1] if i < len(rewards) - 1 else 0)
    return x

out = returns_of(x, rewards, 0.99)
"""

# ... and through a temporary (was "recurrence through memory"); the bootstrap at the end
MEMORY_TEMP = """\
def returns_of(rewards, dones, next_value, gamma, returns):
    T = rewards.shape[0]
    for t in reversed(range(T)):
        next_return = returns[t + 1] if t < T - 1 else next_value
        returns[t] = rewards[t] + gamma * (1.0 - dones[t]) * next_return
    return returns, next_return

out = returns_of(rewards, dones, next_value, 0.99, returns)
"""

# the advantage read back from the output next to a bootstrapped value, both chosen the same way
MEMORY_TWO = """\
def advantages(rewards, values, last_value, gamma, lam, adv):
    T = len(rewards)
    for t in reversed(range(T)):
        nxt = adv[t + 1] if t < T - 1 else 0.0
        nv = values[t + 1] if t < T - 1 else last_value
        adv[t] = rewards[t] + gamma * nv - values[t] + gamma * lam * nxt
    return adv, nxt, nv

out = advantages(rewards, values, last_value, 0.99, 0.95, adv)
"""


@HYP
@given(T=lengths, N=st.sampled_from([1, 3]), dtype=dtypes, seed=st.integers(0, 2**16), kind=kinds,
       src=st.sampled_from([MEMORY_INLINE, MEMORY_TEMP, MEMORY_TWO]))
def test_memory_recurrence_with_conditional_last_step_bitwise(T, N, dtype, seed, kind, src):
    env = dict(
        rewards=arrays(kind, seed, (T, N), dtype),
        values=arrays(kind, seed + 1, (T, N), dtype),
        dones=arrays(kind, seed + 2, (T, N), dtype, "dones"),
        next_value=arrays(kind, seed + 3, (N,), dtype),
        last_value=arrays(kind, seed + 3, (N,), dtype),
        x=arrays(kind, seed + 4, (T, N), dtype),
        returns=arrays(kind, seed + 5, (T, N), dtype),
        adv=arrays(kind, seed + 6, (T, N), dtype),
    )
    ns1, ns2 = run_both(src, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


# Stanford CS234's policy-gradient returns: the previous return read back from the list being
# built, the last step's case a conditional expression (ret is empty there)
CS234_RETURNS = """\
def get_returns(paths, gamma):
    all_returns = []
    for path in paths:
        rewards = path["reward"]
        ret = []
        T = len(rewards)
        for t in range(T - 1, -1, -1):
            r = rewards[t] + (ret[-1] * gamma if t < T - 1 else 0)
            ret.append(r)
        ret = ret[::-1]
        all_returns.append(ret)
    return all_returns

out = get_returns(paths, 0.99)
"""


@HYP
@given(Ts=st.lists(lengths, min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_cs234_returns_read_back_from_the_list_bitwise(Ts, seed):
    rng = np.random.default_rng(seed)
    env = dict(paths=[{"reward": [float(x) for x in rng.standard_normal(T)]} for T in Ts])
    ns1, ns2 = run_both(CS234_RETURNS, env, vectorized=max(Ts) >= 2)
    same_namespaces(ns1, ns2)


def test_conditional_last_step_sites():
    for src, shown in ((MEMORY_INLINE, "x[i + 1] if i < len(rewards) - 1 else 0"),
                       (MEMORY_TEMP, "next_return = returns[t + 1] if t < T - 1 else next_value"),
                       (INLINE, "1.0 - dones[t + 1] if T - 1 > t else 1.0 - last_done")):
        out, done, skipped = sites_of(src)
        assert len(done) == 1 and not skipped, [s.describe() for s in done + skipped]
        assert done[0].exactness == EXACT
        assert shown in done[0].reason  # the update as written, conditional included
        loop = src[src.index("    for "):src.index("\n    return ") + 1]
        assert "".join("    " + ln + "\n" for ln in loop.splitlines()) in out  # kept in the else branch


# a value carried into the next step that the last step sets its own way: the step after it would
# compute it from the other steps' formula (this was rewritten wrongly in the statement form too)
CARRIED_OTHERWISE = [
    """\
def f(values, rewards, gamma, T, adv):
    gae = 0.0
    prev = 0.0
    for t in reversed(range(T)):
        gae = rewards[t] + gamma * prev + gamma * gae
        adv[t] = gae
        prev = 0.0 if t == T - 1 else values[t]
    return adv
""",
    """\
def f(values, rewards, gamma, T, adv):
    gae = 0.0
    prev = 0.0
    for t in reversed(range(T)):
        gae = rewards[t] + gamma * prev + gamma * gae
        adv[t] = gae
        if t == T - 1:
            prev = 0.0
        else:
            prev = values[t]
    return adv
""",
]


@pytest.mark.parametrize("src", CARRIED_OTHERWISE, ids=["expression", "statement"])
def test_value_carried_from_the_last_step_case_is_left_alone(src):
    left_alone(src, "`prev` carries into the next step a value the last-step case t = T-1 computes otherwise")


def test_value_carried_the_same_way_in_both_cases_still_rewrites():
    src = CARRIED_OTHERWISE[1].replace("prev = 0.0\n        else:", "prev = values[t]\n        else:")
    out, done, skipped = sites_of(src)
    assert done and not skipped, [s.describe() for s in done + skipped]
    env = dict(values=torch.randn(7, dtype=torch.float64), rewards=torch.randn(7, dtype=torch.float64),
               adv=torch.zeros(7, dtype=torch.float64))
    ns1, ns2 = run_both(src + "out = f(values, rewards, 0.9, 7, adv)\n", env)
    same_namespaces(ns1, ns2)


CONDITIONAL_LOOK_ALIKES = [
    ("""\
def f(values, rewards, gamma, lam, adv):
    gae = 0.0
    for i in reversed(range(len(rewards))):
        nv = values[i + 1] if i % 2 else 0.0
        gae = rewards[i] + gamma * nv - values[i] + gamma * lam * gae
        adv[i] = gae
    return adv
""", "conditional expression `values[i + 1] if i % 2 else 0.0`"),
    ("""\
def f(values, rewards, last, gamma, lam, adv, T):
    gae = 0.0
    for t in reversed(range(T)):
        nv = values[t + 1] if t < T - 2 else last
        gae = rewards[t] + gamma * nv - values[t] + gamma * lam * gae
        adv[t] = gae
    return adv
""", "conditional expression `values[t + 1] if t < T - 2 else last`"),
    ("""\
def f(values, rewards, last, gamma, lam, adv, T):
    gae = 0.0
    for t in reversed(range(T)):
        nv = values[t + 1] if t < T - 1 else last.pop()
        gae = rewards[t] + gamma * nv - values[t] + gamma * lam * gae
        adv[t] = gae
    return adv
""", "calls `last.pop()`"),
    ("""\
def f(x, rewards, gamma, T):
    for t in reversed(range(T)):
        x[t] = rewards[t] + gamma * (x[t + 1] if t < T - 1 else x[t + 2])
    return x
""", "recurrence through memory"),
    ("""\
def f(values, rewards, gamma, lam, adv, T):
    gae = 0.0
    for t in reversed(range(T)):
        nv = values[t - 1] if t > 0 else 0.0
        gae = rewards[t] + gamma * nv - values[t] + gamma * lam * gae
        adv[t] = gae
    return adv
""", "conditional expression `values[t - 1] if t > 0 else 0.0`"),
]


@pytest.mark.parametrize("src,reason", CONDITIONAL_LOOK_ALIKES, ids=[r for _, r in CONDITIONAL_LOOK_ALIKES])
def test_conditional_look_alikes_are_left_alone(src, reason):
    left_alone(src, reason)


# ------------------------------------------------------------------ 2. loop-invariant conditions unswitched

# the numpy returns/advantages helper of several PPO/A2C code bases (deepcopy dropped: not pure)
UNSWITCH_NUMPY = """\
import numpy as np


def returns_advs(rews, vals, masks, last_val, gamma, use_gae, gae_lambda, rets, advs):
    ret, adv = last_val, np.zeros_like(last_val)
    for i in reversed(range(len(rews))):
        ret = rews[i] + gamma * masks[i] * ret
        if not use_gae:
            adv = ret - vals[i]
        else:
            td_error = rews[i] + gamma * masks[i] * vals[i + 1] - vals[i]
            adv = adv * gae_lambda * gamma * masks[i] + td_error
        rets[i] = ret
        advs[i] = adv
    return rets, advs, ret, adv, i

out = returns_advs(rews, vals, masks, last_val, 0.99, use_gae, 0.95, rets, advs)
"""


@HYP
@given(T=lengths, N=st.sampled_from([1, 3]), dtype=dtypes, seed=st.integers(0, 2**16), kind=kinds,
       use_gae=st.booleans())
def test_unswitched_numpy_helper(T, N, dtype, seed, kind, use_gae):
    env = dict(
        rews=arrays(kind, seed, (T, N), dtype),
        vals=arrays(kind, seed + 1, (T + 1, N), dtype),
        masks=1 - arrays(kind, seed + 2, (T, N), dtype, "dones"),
        last_val=arrays(kind, seed + 3, (N,), dtype),
        rets=arrays(kind, seed + 4, (T, N), dtype),
        advs=arrays(kind, seed + 5, (T, N), dtype),
        use_gae=use_gae,
    )
    ns1, ns2 = run_both(UNSWITCH_NUMPY, env, exactness=REASSOCIATED, vectorized=T >= 2)
    # without GAE the loop taken is the exact one; with it the advantage's coefficient is regrouped
    same_namespaces(ns1, ns2, exact=not use_gae)


def test_unswitched_site_names_both_versions():
    out, done, skipped = sites_of(UNSWITCH_NUMPY)
    assert len(done) == 1 and not skipped, [s.describe() for s in done + skipped]
    reason, branches = done[0].reason, done[0].details["branches"]
    assert reason.startswith("`not use_gae` unswitched (reassociated): one loop per branch, when true vectorized")
    assert branches["when true"].startswith("backward linear recurrence `ret = ")
    assert "(coefficients regrouped)" in branches["otherwise"]
    assert done[0].exactness == REASSOCIATED
    assert "if _sbx.no_steps(len(rews)) or (not use_gae):" in out


# DeepRL-style agent: the flag is an attribute, the GAE branch holds the last-step case itself
UNSWITCH_AGENT = """\
class Agent:
    def __init__(self, use_gae):
        self.use_gae = use_gae

    def returns(self, storage, rollout_length, returns, advantages, discount, gae_tau):
        for i in reversed(range(rollout_length)):
            returns = storage.r[i] + discount * returns
            if not self.use_gae:
                advantages = returns - storage.v[i]
            else:
                if i == rollout_length - 1:
                    td_error = storage.r[i] - storage.v[i]
                else:
                    td_error = storage.r[i] + discount * storage.v[i + 1] - storage.v[i]
                advantages = advantages * gae_tau * discount + td_error
            storage.adv[i] = advantages
            storage.ret[i] = returns
        return returns, advantages


class Storage:
    pass


storage = Storage()
storage.r, storage.v, storage.adv, storage.ret = r, v, adv, ret
out = Agent(use_gae).returns(storage, T, last, zero, 0.99, 0.95)
"""


@HYP
@given(T=lengths, N=st.sampled_from([1, 4]), dtype=dtypes, seed=st.integers(0, 2**16), use_gae=st.booleans())
def test_unswitched_attribute_flag_with_last_step_case(T, N, dtype, seed, use_gae):
    env = dict(
        T=T, use_gae=use_gae,
        r=tensor(seed, (T, N), dtype), v=tensor(seed + 1, (T, N), dtype),
        adv=tensor(seed + 2, (T, N), dtype), ret=tensor(seed + 3, (T, N), dtype),
        last=tensor(seed + 4, (N,), dtype), zero=torch.zeros(N, dtype=dtype),
    )
    ns1, ns2 = run_both(UNSWITCH_AGENT, env, exactness=REASSOCIATED, vectorized=T >= 2)
    same_namespaces(ns1, ns2, exact=not use_gae)


class _Flag:
    """A condition that counts how often its truth is asked for (and may refuse to answer)."""

    def __init__(self, value, explode=False):
        self.value, self.asked, self.explode = value, 0, explode

    def __bool__(self):
        self.asked += 1
        if self.explode:
            raise RuntimeError("asked")
        return self.value


UNSWITCH_PLAIN = """\
def f(rewards, values, gamma, lam, flag, out):
    g = 0.0
    for t in reversed(range(len(rewards))):
        if flag:
            g = rewards[t] + gamma * values[t + 1] - values[t] + gamma * lam * g
        else:
            g = rewards[t] + gamma * g
        out[t] = g
    return out, g

res = f(rewards, values, 0.99, 0.95, flag, out)
"""


@pytest.mark.parametrize("T", [0, 1, 2, 5])
@pytest.mark.parametrize("value", [True, False])
def test_unswitched_condition_is_asked_once_and_never_without_steps(T, value):
    src = "flag = make_flag()\n" + UNSWITCH_PLAIN  # each run its own flag
    env = dict(rewards=torch.randn(T, dtype=torch.float64), values=torch.randn(T + 1, dtype=torch.float64),
               out=torch.zeros(T, dtype=torch.float64), make_flag=lambda: _Flag(value))
    ns1, ns2 = run_both(src, env, vectorized=T >= 2)
    same_namespaces({k: v for k, v in ns1.items() if k != "flag"}, {k: v for k, v in ns2.items() if k != "flag"})
    assert ns1["flag"].asked == T
    assert ns2["flag"].asked == min(T, 1)  # once before the first step; a loop without steps: never
    if T == 0:  # a condition that would raise is not evaluated either
        env["make_flag"] = lambda: _Flag(value, explode=True)
        run_both(src, env, vectorized=False)


UNSWITCH_ELIF = """\
def f(rewards, values, gamma, lam, mode, out):
    g = 0.0
    for t in reversed(range(len(rewards))):
        if mode == "gae":
            g = rewards[t] + gamma * values[t + 1] - values[t] + gamma * lam * g
        elif mode == "mc":
            g = rewards[t] + gamma * g
        else:
            g = g * g + rewards[t]
        out[t] = g
    return out, g

res = f(rewards, values, 0.99, 0.95, mode, out)
"""


@pytest.mark.parametrize("mode", ["gae", "mc", "other"])
@pytest.mark.parametrize("T", [0, 3, 9])
def test_unswitched_elif_chain(mode, T):
    out, done, skipped = sites_of(UNSWITCH_ELIF)
    assert len(done) == 1 and not skipped
    assert "`mode == \"gae\"` unswitched" in done[0].reason  # each branch's own reason: the details
    inner = done[0].details["branches"]["otherwise"]  # the elif: unswitched again, its branches nested
    assert "otherwise left as written" in inner["reason"]
    assert "left as written: the carried value `g` appears non-affinely" in inner["branches"]["otherwise"]
    env = dict(rewards=torch.randn(T, dtype=torch.float64) / 4, values=torch.randn(T + 1, dtype=torch.float64),
               out=torch.zeros(T, dtype=torch.float64), mode=mode)
    ns1, ns2 = run_both(UNSWITCH_ELIF, env, vectorized=T >= 2 and mode != "other")
    same_namespaces(ns1, ns2)


UNSWITCH_LOOK_ALIKES = [
    (UNSWITCH_PLAIN.replace("        out[t] = g\n", "        out[t] = g\n        log(g)\n"),
     "the loop-invariant `if flag:` is not unswitched: the body calls `log()`"),
    (UNSWITCH_PLAIN.replace("        out[t] = g\n", "        out[t] = g\n        flag = g\n"),
     "conditional `if flag:`"),  # the loop binds the name: not invariant
    (UNSWITCH_PLAIN.replace("if flag:", "if flag.enabled():"), "conditional `if flag.enabled():`"),
    (UNSWITCH_PLAIN.replace("if flag:", "if flags[0]:").replace("        out[t] = g\n", "        flags[t] = g\n"),
     "conditional `if flags[0]:`"),  # a subscript in the test: not accepted
    (UNSWITCH_PLAIN.replace("if flag:", "if t % 2:"), "conditional `if t % 2:`"),
    (UNSWITCH_PLAIN.replace("        out[t] = g\n", "        out[t] = g\n        cfg.flag = g\n").replace(
        "if flag:", "if cfg.flag:"), "the body assigns `cfg.flag`"),
    (UNSWITCH_PLAIN.replace("rewards[t] + gamma * g", "g * g + rewards[t]").replace(
        "values[t + 1] - values[t] + gamma * lam * g", "values[t + 1] * g * g"),
     "unswitched on the loop-invariant `flag`, no loop is vectorized"),
]


@pytest.mark.parametrize("src,reason", UNSWITCH_LOOK_ALIKES, ids=[r for _, r in UNSWITCH_LOOK_ALIKES])
def test_unswitch_look_alikes_are_left_alone(src, reason):
    left_alone(src, reason)


# ------------------------------------------------------------------ 3. resets as if/else, two outputs

# an episode end stores the constants instead of updating; two carried values, two outputs
SWITCH_TWO = """\
def gae_and_returns(rewards, values, dones, gamma, lam, adv, returns):
    gae = 0.0
    ret = 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * values[t + 1] - values[t]
        if dones[t]:
            gae = 0
            ret = 0
        else:
            gae = delta + gamma * lam * gae
            ret = rewards[t] + gamma * ret
        adv[t] = gae
        returns[t] = ret
    return adv, returns, gae, ret, delta

out = gae_and_returns(rewards, values, dones, 0.99, 0.95, adv, returns)
"""

# the same the other way round, the mask a comparison (`== 0`: the truth of a number)
SWITCH_MIRRORED = """\
def gae_and_returns(rewards, values, masks, gamma, lam, adv, returns):
    gae = 0.0
    ret = 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * values[t + 1] - values[t]
        if masks[t] != 0:
            gae = delta + gamma * lam * gae
            ret = rewards[t] + gamma * ret
        else:
            gae = 0.0
            ret = -1
        adv[t] = gae
        returns[t] = ret
    return adv, returns, gae, ret

out = gae_and_returns(rewards, values, 1 - dones, 0.99, 0.95, adv, returns)
"""

# PyTorch policy-gradient tutorials: a zero reward ends the game, the return starts again
SWITCH_PG = """\
def discount(reward_pool, gamma, steps, out):
    running_add = 0
    for i in reversed(range(steps)):
        if reward_pool[i] == 0:
            running_add = 0
        else:
            running_add = running_add * gamma + reward_pool[i]
        out[i] = running_add
    return out, running_add

res = discount(rewards, 0.99, T, adv)
"""

# Karpathy's Pong discount (reset then update, the mask a comparison); two resets at once
RESET_PONG = """\
def discount_rewards(rewards, gamma, out):
    running_add = 0
    for t in reversed(range(0, len(rewards))):
        if rewards[t] != 0:
            running_add = 0
        running_add = running_add * gamma + rewards[t]
        out[t] = running_add
    return out, running_add

res = discount_rewards(rewards, 0.99, adv)
"""

RESET_TWO = """\
def gae_and_returns(rewards, values, dones, gamma, lam, adv, returns):
    gae = ret = 0.0
    for t in reversed(range(len(rewards))):
        if dones[t]:
            gae = 0
            ret = 0
        gae = rewards[t] + gamma * values[t + 1] - values[t] + gamma * lam * gae
        ret = rewards[t] + gamma * ret
        adv[t] = gae
        returns[t] = ret
    return adv, returns, gae, ret

out = gae_and_returns(rewards, values, dones, 0.99, 0.95, adv, returns)
"""


@HYP
@given(T=lengths, N=st.sampled_from([(), (3,)]), dtype=dtypes, seed=st.integers(0, 2**16), kind=kinds,
       p=st.sampled_from([0.0, 0.15, 0.5, 1.0]),
       src=st.sampled_from([SWITCH_TWO, SWITCH_MIRRORED, SWITCH_PG, RESET_PONG, RESET_TWO]))
def test_resets_with_two_outputs_bitwise(T, N, dtype, seed, kind, p, src):
    dones = (torch.rand(T, generator=torch.Generator().manual_seed(seed + 2)) < p).to(dtype)
    rewards = tensor(seed, (T,) + N, dtype)
    if src in (SWITCH_PG, RESET_PONG):  # the reward itself says where a game ends
        rewards = tensor(seed, (T,), dtype) * (1 - dones)  # one number per step (its truth is the test)
    env = dict(
        T=T,
        rewards=rewards if kind == "torch" else rewards.numpy(),
        values=arrays(kind, seed + 1, (T + 1,) + N, dtype),
        dones=dones if kind == "torch" else dones.numpy(),
        adv=arrays(kind, seed + 3, rewards.shape, dtype),
        returns=arrays(kind, seed + 4, rewards.shape, dtype),
    )
    ns1, ns2 = run_both(src, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)  # outputs bitwise; the carried values of the same type (an int 0 after a reset)


def test_switch_helper_matches_its_definition():
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        n = seed % 7
        a, b = torch.randn(n, 2, generator=g, dtype=torch.float64), torch.randn(n, 2, generator=g, dtype=torch.float64)
        reset = torch.rand(n, generator=g) < 0.3
        init = torch.randn(2, generator=g, dtype=torch.float64)
        x, want = init, []
        for t in reversed(range(n)):
            x = torch.full_like(init, 2.5) if reset[t] else b[t] + a[t] * x
            want.insert(0, x)
        for conv in (lambda v: v, lambda v: v.numpy()):
            out, last = vectorized_mod.switch_linear_recurrence(conv(a), conv(b), conv(reset), 2.5, init=conv(init),
                                                                return_last=True)
            got = torch.as_tensor(out)
            assert got.shape == (n, 2)
            if n:
                assert torch.equal(got, torch.stack(want)) and torch.equal(torch.as_tensor(last), want[0])


SWITCH_LOOK_ALIKES = [
    (SWITCH_TWO.replace("            ret = 0\n", ""),
     "`ret` is updated only on steps that do not end an episode"),
    (SWITCH_TWO.replace("        delta = rewards[t] + gamma * values[t + 1] - values[t]\n", "").replace(
        "            gae = delta + gamma * lam * gae\n",
        "            delta = rewards[t] + gamma * values[t + 1] - values[t]\n"
        "            gae = delta + gamma * lam * gae\n"),
     "`delta` is computed only on steps that do not end an episode"),
    (SWITCH_PG.replace("        out[i] = running_add\n", "").replace(
        "            running_add = running_add * gamma + reward_pool[i]\n",
        "            running_add = running_add * gamma + reward_pool[i]\n            out[i] = running_add\n"),
     "runs only on steps that do not end an episode"),
    ("""\
def discount(rewards, dones, gamma):
    R = 0.0
    out = []
    for t in reversed(range(len(rewards))):
        if dones[t]:
            R = 0
        else:
            R = rewards[t] + gamma * R
        out.insert(0, R)
    return out
""", "an episode reset as an if/else in a loop that writes a list"),
    ("""\
def f(rewards, values, gamma, lam, adv):
    gae = 0.0
    for t in reversed(range(len(rewards))):
        if adv[t + 1]:
            gae = 0
        gae = rewards[t] + gamma * values[t + 1] - values[t] + gamma * lam * gae
        adv[t] = gae
    return adv
""", "reads `adv[t + 1]`, which the loop writes"),  # the reset depends on what the loop writes
    ("""\
def f(rewards, dones, gamma, adv):
    gae = 0.0
    for t in reversed(range(len(rewards))):
        if dones[t]:
            gae = rewards[t]
        else:
            gae = rewards[t] + gamma * gae
        adv[t] = gae
    return adv
""", "conditional `if dones[t]:`"),  # a reset to a per-step value is no constant
    ("""\
def f(rewards, gamma, adv):
    gae = 0.0
    for t in reversed(range(len(rewards))):
        if rewards[t] > gamma:
            gae = 0
        gae = rewards[t] + gamma * gae
        adv[t] = gae
    return adv
""", "episode reset on `rewards[t] > gamma`"),  # a comparison with something other than a number
]


@pytest.mark.parametrize("src,reason", SWITCH_LOOK_ALIKES, ids=[r for _, r in SWITCH_LOOK_ALIKES])
def test_reset_look_alikes_are_left_alone(src, reason):
    left_alone(src, reason)


# ------------------------------------------------------------------ all forms

ALL_FORMS = [TOKEN_GAE, MIRRORED, INLINE, MEMORY_INLINE, MEMORY_TEMP, MEMORY_TWO, UNSWITCH_NUMPY, UNSWITCH_AGENT,
             UNSWITCH_PLAIN, UNSWITCH_ELIF, SWITCH_TWO, SWITCH_MIRRORED, SWITCH_PG, RESET_PONG, RESET_TWO,
             CS234_RETURNS]


@pytest.mark.parametrize("src", ALL_FORMS, ids=range(len(ALL_FORMS)))
def test_rewriting_the_output_again_changes_nothing(src):
    out, done, _ = sites_of(src)
    assert done
    again, sites = rewrite(out)
    assert again == out
    assert not any(s.action == REWRITTEN for s in sites)


# ------------------------------------------------------------------ the carried value kept in a copy

# LLM RL code: gae computed from last_gae, appended, then copied for the next step
COPY_LIST = """\
def estimate_gaes_and_returns(rewards, values, gamma=0.99, lamb=0.9):
    gaes_reversed = []
    last_gae = 0.
    for t in reversed(range(len(values))):
        next_value = values[t + 1] if t < (len(values) - 1) else 0
        delta = rewards[t] + gamma * next_value - values[t]
        gae = delta + gamma * lamb * last_gae
        gaes_reversed.append(gae)
        last_gae = gae
    gaes = gaes_reversed[::-1]
    returns = [a + v for a, v in zip(gaes, values)]
    return gaes, returns, gae, last_gae

out = estimate_gaes_and_returns(rewards, values)
"""

COPY_TENSOR = """\
def gae(rewards, values, dones, last_value, gamma, lam, adv):
    last_gae = 0.0
    T = len(rewards)
    for t in reversed(range(T)):
        nv = values[t + 1] if t + 1 < T else last_value
        delta = rewards[t] + gamma * nv * (1.0 - dones[t]) - values[t]
        adv[t] = gae = delta + gamma * lam * (1.0 - dones[t]) * last_gae
        last_gae = gae
    return adv, gae, last_gae

out = gae(rewards, values, dones, last_value, 0.99, 0.95, adv)
"""


@HYP
@given(T=lengths, seed=st.integers(0, 2**16))
def test_carried_copy_over_lists_bitwise(T, seed):
    rng = np.random.default_rng(seed)
    env = dict(values=[float(x) for x in rng.standard_normal(T)], rewards=[float(x) for x in rng.standard_normal(T)])
    ns1, ns2 = run_both(COPY_LIST, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


@HYP
@given(T=lengths, N=st.sampled_from([1, 3]), dtype=dtypes, seed=st.integers(0, 2**16), kind=kinds)
def test_carried_copy_with_an_output_bitwise(T, N, dtype, seed, kind):
    env = dict(
        rewards=arrays(kind, seed, (T, N), dtype), values=arrays(kind, seed + 1, (T, N), dtype),
        dones=arrays(kind, seed + 2, (T, N), dtype, "dones"), last_value=arrays(kind, seed + 3, (N,), dtype),
        adv=arrays(kind, seed + 4, (T, N), dtype),
    )
    ns1, ns2 = run_both(COPY_TENSOR, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


COPY_LOOK_ALIKES = [
    (COPY_TENSOR.replace("        last_gae = gae\n", "        if t == T - 1:\n            last_gae = 0.0\n"
                         "        else:\n            last_gae = gae\n"),
     "`last_gae` carries a value from the previous step"),  # the copy not made in the first step
    (COPY_TENSOR.replace("        last_gae = gae\n", "        last_gae = gae\n        gae = values[t]\n"),
     "`last_gae` carries a value from the previous step that is not a plain per-step read"),
    (COPY_TENSOR.replace("        adv[t] = gae = delta", "        adv[t] = last_gae\n        gae = delta"),
     "read before its update"),  # the copy read between update and copy: the previous step's value
]


@pytest.mark.parametrize("src,reason", COPY_LOOK_ALIKES, ids=[r for _, r in COPY_LOOK_ALIKES])
def test_carried_copy_look_alikes_are_left_alone(src, reason):
    left_alone(src, reason)


# ------------------------------------------------------------------ outputs accumulated in place: out[t] += v

# DI-engine's rl_utils/gae.py: the advantages added into a zeroed output
DIENGINE_GAE = """\
def gae(value, next_value, reward, done, traj_flag, gamma, lambda_, like):
    next_value = next_value * (1 - done)
    delta = reward + gamma * next_value - value
    factor = gamma * lambda_ * (1 - traj_flag)
    adv = like(value)
    gae_item = like(value[0])
    for t in reversed(range(reward.shape[0])):
        gae_item = delta[t] + factor[t] * gae_item
        adv[t] += gae_item
    return adv, gae_item

out = gae(value, next_value, reward, done, done, 0.99, 0.97, zeros_like)
"""

# DI-engine's vtrace_nstep_return: a base cloned, then each step's value taken off (or added to) it;
# the last step special-cased, the output at a dtype of its own (promotion, then a cast back)
ONTO_BASE = """\
def onto(base, rewards, masks, last, gamma, copy):
    result = copy(base)
    T = rewards.shape[0]
    acc = last
    for t in reversed(range(T)):
        m = masks[t + 1] if t < T - 1 else 1.0
        acc = rewards[t] + gamma * m * acc
        result[t] OP acc
    return result, acc

out = onto(base, rewards, masks, last, 0.95, copy)
"""


@HYP
@given(T=lengths, N=st.integers(1, 4), dtype=dtypes, kind=kinds, seed=st.integers(0, 2**16))
def test_diengine_gae_accumulated_into_its_output_bitwise(T, N, dtype, kind, seed):
    out, done, _ = sites_of(DIENGINE_GAE)
    assert [s.exactness for s in done] == [EXACT] and "adv[0:" in out and "] += " in out
    env = dict(value=arrays(kind, seed, (T, N), dtype), next_value=arrays(kind, seed + 1, (T, N), dtype),
               reward=arrays(kind, seed + 2, (T, N), dtype), done=arrays(kind, seed + 3, (T, N), dtype, "dones"),
               zeros_like=torch.zeros_like if kind == "torch" else np.zeros_like)
    ns1, ns2 = run_both(DIENGINE_GAE, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


@HYP
@given(T=lengths, N=st.integers(1, 4), op=st.sampled_from(["+=", "-="]), kind=kinds,
       base_dtype=dtypes, dtype=dtypes, seed=st.integers(0, 2**16))
def test_accumulation_reads_each_old_row_once_bitwise(T, N, op, kind, base_dtype, dtype, seed):
    """The output holds values before the loop; each step reads its own row's and writes it back
    (rows of another dtype: computed in the promoted one, stored at the output's)."""
    if kind == "numpy" and base_dtype != dtype:
        dtype = base_dtype  # numpy's same_kind casting would take it too; kept to one dtype here
    src = ONTO_BASE.replace("OP", op)
    env = dict(base=arrays(kind, seed, (T, N), base_dtype), rewards=arrays(kind, seed + 1, (T, N), dtype),
               masks=arrays(kind, seed + 2, (T, N), dtype, "dones"), last=arrays(kind, seed + 3, (N,), dtype),
               copy=torch.clone if kind == "torch" else np.copy)
    ns1, ns2 = run_both(src, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


@given(T=st.integers(2, 24), seed=st.integers(0, 2**16))
@HYP
def test_accumulation_with_time_along_dimension_one_bitwise(T, seed):
    src = """\
def f(rewards, dones, adv, gamma):
    s = 0.0
    for t in reversed(range(rewards.shape[1])):
        s = rewards[:, t] + gamma * (1.0 - dones[:, t]) * s
        adv[:, t] += s
    return adv, s

out = f(rewards, dones, adv, 0.9)
"""
    env = dict(rewards=tensor(seed, (3, T), torch.float32), dones=tensor(seed + 1, (3, T), torch.float32, "dones"),
               adv=tensor(seed + 2, (3, T), torch.float32))
    ns1, ns2 = run_both(src, env)
    same_namespaces(ns1, ns2)


def test_accumulation_into_an_input_of_the_loop_falls_back_to_the_loop():
    """``adv`` is also what the recurrence reads (the same tensor passed twice): the guard sees the
    output share memory with an input and the loop runs as written."""
    src = DIENGINE_GAE.replace("zeros_like)", "zeros_like)\nout2 = f2(reward, 0.9)") + """
def f2(x, gamma):
    s = 0.0
    for t in reversed(range(x.shape[0])):
        s = x[t] + gamma * s
        x[t] += s
    return x
"""
    src = src.replace("out2 = f2(reward, 0.9)\n", "") + "out2 = f2(reward, 0.9)\n"
    env = dict(value=tensor(1, (6, 2), torch.float32), next_value=tensor(2, (6, 2), torch.float32),
               reward=tensor(3, (6, 2), torch.float32), done=tensor(4, (6, 2), torch.float32, "dones"),
               zeros_like=torch.zeros_like)
    _, sites = rewrite(src)
    assert sum(s.action == REWRITTEN for s in sites) == 1  # f2's loop reads what it writes: left alone
    ns1, ns2 = run_both(src, env)
    same_namespaces(ns1, ns2)


@pytest.mark.parametrize("body, reason", [
    ("s = r[t] + g * s + out[t + 1]\n        out[t] += s", "updates `out` in place and the loop also reads it"),
    ("s = r[t] + g * s\n        out[t] += s\n        w = out.sum()", "updates `out` in place and the loop also reads it"),
    ("s = r[t] + g * s\n        out[t] += s\n        out[t] = s", "and another write of `out` in one step"),
    ("s = r[t] + g * s\n        out[t] *= s", "augmented assignment `out[t] *= s` (updates `out[t]` in place"),
    ("s = r[t] + g * s\n        out[t + 1] += s", "augmented assignment `out[t + 1] += s`"),
])
def test_accumulation_look_alikes_left_alone(body, reason):
    src = f"""\
def f(r, out, g):
    s = 0.0
    for t in reversed(range(len(r))):
        {body}
    return out
"""
    left_alone(src, reason)


# ------------------------------------------------------------------ a temporary assigned twice in one step

# the bootstrap value carried from the previous step, masked at the top of the step and set to
# this step's value at its end (a common hand-written GAE); T = 1, 2 included by `lengths`
MASKED_LAST_VALUE = """\
def compute_gae(rewards, values, dones, last_value, gamma, lam, adv):
    last_gae = 0.0
    for t in reversed(range(len(rewards))):
        mask = 1.0 - dones[t]
        last_value = last_value * mask
        delta = rewards[t] + gamma * last_value - values[t]
        last_gae = delta + gamma * lam * mask * last_gae
        adv[t] = last_gae
        last_value = values[t]
    return adv, last_gae, last_value, delta, mask

out = compute_gae(rewards, values, dones, last_value, 0.99, 0.95, adv)
"""

# the next value read, a first value used, then masked (three assignments of one name in a step)
NEXT_VALUE_MASKED = """\
def compute_gae(rewards, values, masks, gamma, lam, adv, boot):
    gae = 0.0
    for step in reversed(range(len(rewards))):
        last_value = values[step + 1]
        bootstrap = gamma * last_value
        last_value = last_value * masks[step]
        delta = rewards[step] + gamma * last_value - values[step]
        last_value = last_value + bootstrap
        gae = delta + gamma * lam * masks[step] * gae
        adv[step] = gae
        boot[step] = last_value
    return adv, boot, gae, last_value, bootstrap

out = compute_gae(rewards, values, masks, 0.99, 0.95, adv, boot)
"""


@HYP
@given(T=lengths, N=st.sampled_from([1, 3]), dtype=dtypes, seed=st.integers(0, 2**16), kind=kinds,
       src=st.sampled_from([MASKED_LAST_VALUE, NEXT_VALUE_MASKED]))
def test_temporary_assigned_twice_in_one_step_bitwise(T, N, dtype, seed, kind, src):
    n_values = T + 1 if src is NEXT_VALUE_MASKED else T
    env = dict(
        rewards=arrays(kind, seed, (T, N), dtype),
        values=arrays(kind, seed + 1, (n_values, N), dtype),
        dones=arrays(kind, seed + 2, (T, N), dtype, "dones"),
        masks=1 - arrays(kind, seed + 2, (T, N), dtype, "dones"),
        last_value=arrays(kind, seed + 3, (N,), dtype),
        adv=arrays(kind, seed + 5, (T, N), dtype) * 0,
        boot=arrays(kind, seed + 6, (T, N), dtype) * 0,
    )
    ns1, ns2 = run_both(src, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


def test_temporary_assigned_twice_sites():
    for src in (MASKED_LAST_VALUE, NEXT_VALUE_MASKED):
        _, done, skipped = sites_of(src)
        assert len(done) == 1 and not skipped and done[0].exactness == EXACT, [s.describe() for s in done + skipped]


@pytest.mark.parametrize("body, reason", [
    # the carried value stored between two updates of it: not one update of the previous value
    ("s = s * g\n        out[t] = s\n        s = s + r[t]", "not a plain per-step read"),
    # a reset between the two assignments of the name it resets
    ("v = x[t + 1]\n        if d[t]:\n            v = 0.0\n        v = v * g\n        s = r[t] + v * s\n        out[t] = s",
     "`v` is reset"),
    # the first assignment chosen by a last-step conditional expression
    ("v = x[t + 1] if t < len(r) - 1 else 0.0\n        w = v * 2\n        v = v * g\n        s = r[t] + w * s + v\n"
     "        out[t] = s", "assigned twice in one step"),
])
def test_temporary_assigned_twice_look_alikes_left_alone(body, reason):
    src = f"""\
def f(r, x, d, out, g):
    s = 0.0
    for t in reversed(range(len(r))):
        {body}
    return out
"""
    left_alone(src, reason)


# ------------------------------------------------------------------ resets on a comparison or through .item()

RESET_COMPARED = """\
def discounted_returns(rewards, dones, gamma, returns):
    advantage = 0.0
    for t in reversed(range(len(rewards))):
        if dones[t] == 1:
            advantage = 0.0
        advantage = rewards[t] + gamma * advantage
        returns[t] = advantage
    return returns, advantage

out = discounted_returns(rewards, dones, 0.99, returns)
"""

# the flag compared on the left, with another operator, and as the else branch of the update
RESET_COMPARED_SWITCH = """\
def discounted_returns(rewards, dones, gamma, returns):
    R = 0.0
    for t in reversed(range(len(rewards))):
        if 0.5 < dones[t]:
            R = 0.0
        else:
            R = rewards[t] + gamma * R
        returns[t] = R
    return returns, R

out = discounted_returns(rewards, dones, 0.99, returns)
"""

# per-env flags of shape (T, N) read one element at a time as a Python number
RESET_ITEM = """\
def discounted_returns(rewards, dones, gamma, returns):
    R = 0.0
    for t in reversed(range(len(rewards))):
        if dones[t][0].item():
            R = 0.0
        R = rewards[t] + gamma * R
        returns[t] = R
    return returns, R

out = discounted_returns(rewards, dones, 0.99, returns)
"""

RESET_NOT_ITEM = RESET_ITEM.replace("if dones[t][0].item():\n            R = 0.0\n        R = rewards[t] + gamma * R",
                                    "if not masks[t].item():\n            R = 0.0\n        R = rewards[t] + gamma * R")
RESET_NOT_ITEM = RESET_NOT_ITEM.replace("dones,", "masks,").replace("(rewards, dones,", "(rewards, masks,")


def _flags(kind, seed, shape, dtype):
    g = torch.Generator().manual_seed(seed)
    x = torch.tensor([0.0, 1.0, 2.0, 0.5, 1.0, 0.0])[torch.randint(0, 6, shape, generator=g)].to(dtype)
    if kind == "torch":
        return x
    if kind == "numpy":
        return x.numpy()
    return [float(v) for v in x.reshape(-1)] if len(shape) == 1 else [row.tolist() for row in x]


@HYP
@given(T=lengths, dtype=dtypes, seed=st.integers(0, 2**16), kind=st.sampled_from(["torch", "numpy", "list"]),
       src=st.sampled_from([RESET_COMPARED, RESET_COMPARED_SWITCH]), nep50=st.booleans())
def test_reset_on_a_comparison_bitwise(T, dtype, seed, kind, src, nep50, monkeypatch_module):
    monkeypatch_module.setattr(vectorized_conversions, "_NEP50", nep50)  # NumPy 1: element by element
    rewards = arrays("torch" if kind == "list" else kind, seed, (T,), dtype)
    env = dict(rewards=rewards, dones=_flags(kind, seed + 1, (T,), dtype), returns=rewards * 0)
    ns1, ns2 = run_both(src, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


def test_switch_reset_on_a_list_of_flags_next_to_tensors():
    """`if dones[t]: R = 0 else: R = ...` with the flags a list and the rewards a tensor: the
    vectorized steps select with the flags' numpy mask (was a TypeError from torch.where)."""
    src = RESET_COMPARED_SWITCH.replace("0.5 < dones[t]", "dones[t]")
    rewards = arrays("torch", 3, (7,), torch.float32)
    env = dict(rewards=rewards, dones=[0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0], returns=rewards * 0)
    ns1, ns2 = run_both(src, env, vectorized=True)
    same_namespaces(ns1, ns2)


@HYP
@given(T=lengths, N=st.sampled_from([1, 3]), dtype=dtypes, seed=st.integers(0, 2**16), kind=kinds)
def test_reset_through_item_bitwise(T, N, dtype, seed, kind):
    rewards = arrays(kind, seed, (T,), dtype)
    env = dict(rewards=rewards, dones=_flags(kind, seed + 1, (T, N), dtype), returns=rewards * 0)
    ns1, ns2 = run_both(RESET_ITEM, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)
    env = dict(rewards=rewards, masks=_flags(kind, seed + 2, (T,), dtype), returns=rewards * 0)
    ns1, ns2 = run_both(RESET_NOT_ITEM, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_reset_through_item_of_python_numbers_runs_the_loop():
    """Python floats have no .item(): the guard declines the list and the loop raises as written."""
    env = dict(rewards=[1.0, 2.0, 3.0], masks=[1.0, 0.0, 1.0], returns=[0.0] * 3)
    ns1, ns2 = run_both(RESET_NOT_ITEM, env, vectorized=False)
    assert "out" not in ns1 and "out" not in ns2  # both raised AttributeError


def test_reset_condition_sites():
    for src in (RESET_COMPARED, RESET_COMPARED_SWITCH, RESET_ITEM, RESET_NOT_ITEM):
        _, done, skipped = sites_of(src)
        assert len(done) == 1 and not skipped and done[0].exactness == EXACT, [s.describe() for s in done + skipped]


@pytest.mark.parametrize("cond, reason", [
    ("dones[t].item() == 1", "episode reset on `dones[t].item() == 1`"),  # compares Python floats
    ("dones[t] == gamma", "episode reset on `dones[t] == gamma`"),  # not a number literal
    ("dones[t] == 1 == dones[t]", "episode reset on"),
    ("dones[t][k] > 0", "indexes `dones[t][k]`"),  # not an integer literal index
])
def test_reset_condition_look_alikes_left_alone(cond, reason):
    src = f"""\
def f(rewards, dones, gamma, returns, k):
    R = 0.0
    for t in reversed(range(len(rewards))):
        if {cond}:
            R = 0.0
        R = rewards[t] + gamma * R
        returns[t] = R
    return returns
"""
    left_alone(src, reason)
