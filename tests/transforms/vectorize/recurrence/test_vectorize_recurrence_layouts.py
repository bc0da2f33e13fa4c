"""vectorize.recurrence, issue 14 part 2 layouts: time indexed in the middle (``x[..., t, :]``,
``x[:, t]`` with trailing dims, ``x[:, :, t]``, ``x[t, :]``) and the carried value read back from
the list being built (``adv.append(f(adv[-1]))``, ``returns.insert(0, f(returns[0]))``).
Differential tests (original vs rewritten code on the same random inputs: bitwise where the site
says exact, within rounding where it says reassociated), the guard's refusals (the loop then runs,
errors included), and look-alikes that must stay as written, with their reasons."""
from __future__ import annotations


import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scalebox_cst.report import EXACT, REASSOCIATED
from scalebox_cst.runtime import vectorized as vectorized_mod

from differential import HYP, arrays, dtypes, kinds, lengths, same_namespaces, tensor
from recurrence_harness import left_alone, run_both, sites_of

_MIN_STEPS = dict(vectorized_mod.MIN_STEPS)


def setup_module(module):
    # vectorize from 2 steps on, so that short random sequences exercise the vectorized branch
    vectorized_mod.MIN_STEPS.update({k: 2 for k in _MIN_STEPS})


def teardown_module(module):
    vectorized_mod.MIN_STEPS.update(_MIN_STEPS)


batch_shapes = st.sampled_from([(), (1,), (3,), (2, 3)])


# ------------------------------------------------------------------ 1. time in the middle

# torchrl's generalized_advantage_estimate: [*B, T, F] tensors, time at dimension -2
TORCHRL_GAE = """\
def generalized_advantage_estimate(gamma, lmbda, state_value, next_state_value, reward, done):
    not_done = 1 - done.to(next_state_value.dtype)
    *batch_size, time_steps = not_done.shape[:-1]
    advantage = torch.empty(*batch_size, time_steps, not_done.shape[-1], dtype=not_done.dtype)
    prev_advantage = 0
    for t in reversed(range(time_steps)):
        delta = (
            reward[..., t, :]
            + (gamma * next_state_value[..., t, :] * not_done[..., t, :])
            - state_value[..., t, :]
        )
        prev_advantage = advantage[..., t, :] = delta + (
            gamma * lmbda * prev_advantage * not_done[..., t, :]
        )
    value_target = advantage + state_value
    return advantage, value_target

import torch
out = generalized_advantage_estimate(0.99, 0.95, state_value, next_state_value, reward, done)
"""


@HYP
@given(T=lengths, B=batch_shapes, F=st.sampled_from([1, 2]), dtype=dtypes, seed=st.integers(0, 2**16))
def test_torchrl_gae_time_at_minus_2(T, B, F, dtype, seed):
    shape = B + (T, F)
    env = dict(state_value=tensor(seed, shape, dtype), next_state_value=tensor(seed + 1, shape, dtype),
               reward=tensor(seed + 2, shape, dtype), done=tensor(seed + 3, shape, dtype, "dones") > 0)
    ns1, ns2 = run_both(TORCHRL_GAE, env, exactness=REASSOCIATED, vectorized=T >= 2)
    same_namespaces(ns1, ns2, exact=False)


def test_torchrl_gae_site_says_where_time_is():
    _, done, _ = sites_of(TORCHRL_GAE)
    assert len(done) == 1 and done[0].exactness == REASSOCIATED
    assert "time along dimension -2 (from the end)" in done[0].reason
    assert "not_done[..., t, :]" in done[0].reason  # the user's spelling, not the view's


# torchrl's td1_return_estimate (rolling gamma): chained assignment through the output, exact
TORCHRL_TD1 = """\
def td1_return_estimate(gamma, next_state_value, reward, done):
    not_done = 1 - done.to(next_state_value.dtype)
    returns = torch.empty_like(next_state_value)
    T = returns.shape[-2]
    gamma = gamma * not_done
    g = next_state_value[..., -1, :]
    for i in reversed(range(T)):
        g = returns[..., i, :] = reward[..., i, :] + gamma[..., i, :] * g
    return returns

import torch
out = td1_return_estimate(0.9, next_state_value, reward, done)
"""


@HYP
@given(T=st.integers(1, 40), B=batch_shapes, F=st.sampled_from([1, 3]), dtype=dtypes, seed=st.integers(0, 2**16))
def test_torchrl_td1_bitwise(T, B, F, dtype, seed):
    shape = B + (T, F)
    env = dict(next_state_value=tensor(seed, shape, dtype), reward=tensor(seed + 1, shape, dtype),
               done=tensor(seed + 2, shape, dtype, "dones") > 0)
    ns1, ns2 = run_both(TORCHRL_TD1, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


# Meta's early torchrl GAE: [B, T, 1] tensors indexed x[:, t], carried through advantage[:, t + 1]
META_GAE = """\
def generalized_advantage_estimate(gamma, lamda, value_old_state, value_new_state, reward, done):
    not_done = 1 - done.to(value_new_state.dtype)
    batch_size, time_steps = not_done.shape[:2]
    advantage = torch.zeros(batch_size, time_steps + 1, not_done.shape[2], dtype=not_done.dtype)
    for t in reversed(range(time_steps)):
        delta = reward[:, t] + (gamma * value_new_state[:, t] * not_done[:, t]) - value_old_state[:, t]
        advantage[:, t] = delta + (gamma * lamda * advantage[:, t + 1] * not_done[:, t])
    value_target = advantage[:, :time_steps] + value_old_state
    return advantage[:, :time_steps], value_target

import torch
out = generalized_advantage_estimate(0.99, 0.95, value_old_state, value_new_state, reward, done)
"""


@HYP
@given(T=lengths, B=st.sampled_from([1, 4]), N=st.sampled_from([1, 3]), dtype=dtypes, seed=st.integers(0, 2**16))
def test_meta_gae_trailing_dims_along_dimension_1(T, B, N, dtype, seed):
    shape = (B, T, N)
    env = dict(value_old_state=tensor(seed, shape, dtype), value_new_state=tensor(seed + 1, shape, dtype),
               reward=tensor(seed + 2, shape, dtype), done=tensor(seed + 3, shape, dtype, "dones"))
    ns1, ns2 = run_both(META_GAE, env, exactness=REASSOCIATED, vectorized=T >= 2)
    same_namespaces(ns1, ns2, exact=False)


# time at the last dimension (x[..., t]) and at dimension 2 (x[:, :, t]), numpy and torch, exact
LAST_DIM = """\
def returns_of(rewards, dones, last, gamma):
    out = rewards * 0
    s = last
    for t in reversed(range(rewards.shape[-1])):
        s = rewards[..., t] + gamma * (1 - dones[..., t]) * s
        out[..., t] = s
    return out, s

res = returns_of(rewards, dones, last, 0.97)
"""

DIM2 = LAST_DIM.replace("[..., t]", "[:, :, t]").replace("shape[-1]", "shape[2]")
MIDDLE_COLON = """\
def returns_of(rewards, dones, ret, gamma):
    for t in range(rewards.shape[1] - 1, -1, -1):
        ret[:, t, :] = rewards[:, t, :] + gamma * (1 - dones[:, t, :]) * ret[:, t + 1, :]
    return ret

res = returns_of(rewards, dones, ret, 0.97)
"""


@HYP
@given(T=lengths, lead=st.sampled_from([(2,), (1, 3), (2, 2)]), kind=kinds, dtype=dtypes,
       seed=st.integers(0, 2**16))
def test_last_dimension_bitwise(T, lead, kind, dtype, seed):
    env = dict(rewards=arrays(kind, seed, lead + (T,), dtype), dones=arrays(kind, seed + 1, lead + (T,), dtype, "dones"),
               last=arrays(kind, seed + 2, lead, dtype))
    ns1, ns2 = run_both(LAST_DIM, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


@HYP
@given(T=lengths, B=st.sampled_from([1, 3]), C=st.sampled_from([1, 2]), kind=kinds, dtype=dtypes,
       seed=st.integers(0, 2**16))
def test_dimension_2_bitwise(T, B, C, kind, dtype, seed):
    env = dict(rewards=arrays(kind, seed, (B, C, T), dtype), dones=arrays(kind, seed + 1, (B, C, T), dtype, "dones"),
               last=arrays(kind, seed + 2, (B, C), dtype))
    ns1, ns2 = run_both(DIM2, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


@HYP
@given(T=lengths, B=st.sampled_from([1, 3]), N=st.sampled_from([1, 2]), kind=kinds, dtype=dtypes,
       seed=st.integers(0, 2**16))
def test_trailing_full_slice_through_memory_bitwise(T, B, N, kind, dtype, seed):
    env = dict(rewards=arrays(kind, seed, (B, T, N), dtype), dones=arrays(kind, seed + 1, (B, T, N), dtype, "dones"),
               ret=arrays(kind, seed + 2, (B, T + 1, N), dtype))
    ns1, ns2 = run_both(MIDDLE_COLON, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


def test_site_reasons_name_the_dimension():
    for src, where in ((LAST_DIM, "dimension -1 (from the end)"), (DIM2, "dimension 2"),
                       (MIDDLE_COLON, "dimension 1"), (TORCHRL_TD1, "dimension -2 (from the end)")):
        _, done, _ = sites_of(src)
        assert len(done) == 1 and f"time along {where}" in done[0].reason, [s.describe() for s in done]


def test_guards_bind_views_with_the_dimension():
    assert "dim_view(rewards, -1, 2)" in sites_and_code(LAST_DIM)
    assert "dim_view(rewards, 2, 3)" in sites_and_code(DIM2)
    assert "dim_view(ret, 1, 3)" in sites_and_code(MIDDLE_COLON)


def sites_and_code(src: str) -> str:
    out, done, _ = sites_of(src)
    assert done
    return out


# mixed forms: x[:, t] next to y[t], per-step rows that broadcast the way the loop's rows do
MIXED = """\
def f(x, y, gamma):
    s = 0.0
    out = []
    for t in reversed(range(x.shape[1])):
        s = x[:, t] + y[t] + gamma * s
        out.append(s)
    return out, s

res = f(x, y, 0.9)
"""


@HYP
@given(T=lengths, B=st.sampled_from([1, 3]), yshape=st.sampled_from(["TB", "T", "T1", "TB1"]), kind=kinds,
       dtype=dtypes, seed=st.integers(0, 2**16))
def test_mixed_dimension_1_and_time_first(T, B, yshape, kind, dtype, seed):
    """``x[:, t]`` of x [B, T] is the row x[:, t] (B,); ``y[t]`` is y's row t: (B,), (), (1,) or
    (B, 1), which broadcast against (B,) per step to (B,), (B,), (B,), (B, B): the time-major
    view of x and y's own rows give the same broadcasts (seqs_of aligns the ranks)."""
    ys = {"TB": (T, B), "T": (T,), "T1": (T, 1), "TB1": (T, B, 1)}[yshape]
    env = dict(x=arrays(kind, seed, (B, T), dtype), y=arrays(kind, seed + 1, ys, dtype))
    ns1, ns2 = run_both(MIXED, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


def test_mixed_forms_on_arrays_whose_dims_do_not_line_up_fail_as_the_loop_does():
    """x [B, T] and y [B, T] with B != T: ``x[:, t] + y[t]`` is (B,) + (T,) in the loop, which
    raises; the rewrite's first step runs as written and raises the same."""
    env = dict(x=tensor(1, (3, 5), torch.float64), y=tensor(2, (3, 5), torch.float64))
    ns1, ns2 = run_both(MIXED, env, vectorized=False)
    env = dict(x=tensor(1, (4, 4), torch.float64), y=tensor(2, (4, 4), torch.float64))  # square: both run
    ns1, ns2 = run_both(MIXED, env, vectorized=True)
    same_namespaces(ns1, ns2)


def test_guard_takes_the_loop_when_the_time_dimension_is_shorter():
    """``x[:, t]`` over an array whose dimension 1 is shorter than the loop: the guard checks each
    view's length along time and declines; the loop raises IndexError as written."""
    src = """\
def f(x, y, T, gamma):
    s = 0.0
    for t in reversed(range(T)):
        s = x[..., t, :] + gamma * y[..., t, :] * s
    return s

res = f(x, y, 6, 0.9)
"""
    short = dict(x=tensor(1, (2, 6, 3), torch.float32), y=tensor(2, (2, 5, 3), torch.float32))
    run_both(src, short, vectorized=False)  # same error type in both
    longer = dict(x=tensor(1, (2, 9, 3), torch.float32), y=tensor(2, (2, 7, 3), torch.float32))
    ns1, ns2 = run_both(src, longer, vectorized=True)  # longer than the loop: it reads the first T
    same_namespaces(ns1, ns2)


def test_guard_takes_the_loop_for_too_few_dimensions_and_lists():
    src = """\
def f(x, T, gamma):
    s = 0.0
    out = []
    for t in reversed(range(T)):
        s = x[..., t] + gamma * s
        out.append(s)
    return out

res = f(x, len(x), 0.9) if hasattr(x, '__len__') else None
"""
    # a 1-D numpy array: x[..., t] is a 0-d array where the view would give scalars: the loop
    run_both(src, dict(x=np.arange(6, dtype=np.float64)), vectorized=False)
    ns1, ns2 = run_both(src, dict(x=np.arange(12, dtype=np.float64).reshape(2, 6)[:, :2].T.copy()), vectorized=True)
    same_namespaces(ns1, ns2)


def test_dim_view_runtime():
    x = torch.arange(24.0).reshape(2, 3, 4)
    assert torch.equal(vectorized_mod.dim_view(x, -2, 2)[1], x[..., 1, :])
    assert torch.equal(vectorized_mod.dim_view(x, 2, 3)[3], x[:, :, 3])
    assert torch.equal(vectorized_mod.dim_view(x, 0, 2)[1], x[1, :])
    v = vectorized_mod.dim_view(x, -1, 2)
    v[0] = -1.0  # writes land in x
    assert bool((x[..., 0] == -1).all())
    n = np.arange(24.0).reshape(2, 3, 4)
    assert np.array_equal(vectorized_mod.dim_view(n, 1, 2)[2], n[:, 2])
    for bad in ([[1.0, 2.0]], np.arange(3.0), np.ma.array([[1.0, 2.0]]), torch.zeros(3)):
        assert vectorized_mod.dim_view(bad, 1, 2) is None
    assert vectorized_mod.dim_view(x, 2, 4) is None  # the subscript needs 4 dimensions
    assert vectorized_mod.dim_view(x, 3, 3) is None and vectorized_mod.dim_view(x, -4, 2) is None


LAYOUT_LOOK_ALIKES = [
    ("""\
def f(ret, rewards, gamma):
    for t in range(ret.shape[1] - 2, -1, -1):
        ret[:, t] = rewards[:, t] + gamma * ret[:, t + 1]
        ret[t] = 0.0
    return ret
""", "`ret` is indexed along dimension 1 and also otherwise"),
    ("""\
def f(x, y, gamma, T):
    s = 0.0
    for t in reversed(range(T)):
        s = x[..., t] + x[:, t] + gamma * s
    return s
""", "indexed with time along two dimensions"),
    ("""\
def f(x, j, gamma, T):
    s = 0.0
    for t in reversed(range(T)):
        s = x[:, t, j] + gamma * s
    return s
""", "indexes `x[:, t, j]`"),
    ("""\
def f(x, gamma, T):
    s = 0.0
    for t in reversed(range(T)):
        s = x[:, t, :, 0] + gamma * s
    return s
""", "indexes `x[:, t, :, 0]`"),
    ("""\
def f(ret, rewards, gamma, T):
    for t in reversed(range(T)):
        ret[..., t, :] = rewards[..., t, :] + gamma * ret[..., t + 2, :]
    return ret
""", "recurrence through memory"),
    ("""\
def f(x, gamma, T):
    s = 0.0
    for t in reversed(range(T)):
        x = x * 1.0
        s = x[..., t] + gamma * s
    return s
""", "reassigned in the loop"),
]


@pytest.mark.parametrize("src,reason", LAYOUT_LOOK_ALIKES, ids=[f"layout-{i}" for i in range(len(LAYOUT_LOOK_ALIKES))])
def test_layout_look_alikes_are_left_alone(src, reason):
    left_alone(src, reason)


# ------------------------------------------------------------------ 2. the previous output read back from the list

# zip of reversed slices, a seeded list, adv[-1] read back, reversed after the loop
ZIP_SLICES = """\
def gae(deltas, dones, gamma, lam):
    adv = [0.0]
    for delta, done in zip(deltas[::-1], dones[::-1]):
        adv.append(delta + gamma * lam * (1 - done) * adv[-1])
    adv.reverse()
    return adv[:-1]

res = gae(deltas, dones, 0.99, 0.95)
"""


@HYP
@given(T=lengths, kind=st.sampled_from(["numpy", "floats", "torch"]), dtype=dtypes, seed=st.integers(0, 2**16))
def test_zip_of_reversed_slices_with_adv_minus_1_bitwise(T, kind, dtype, seed):
    src = ZIP_SLICES if kind != "torch" else ZIP_SLICES.replace("deltas[::-1], dones[::-1]",
                                                                "reversed(deltas), reversed(dones)")
    if kind == "floats":
        rng = np.random.default_rng(seed)
        env = dict(deltas=[float(x) for x in rng.standard_normal(T)], dones=[float(x < 0.2) for x in rng.random(T)])
    else:
        env = dict(deltas=arrays(kind, seed, (T,), dtype), dones=arrays(kind, seed + 1, (T,), dtype, "dones"))
    ns1, ns2 = run_both(src, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


# seeded with the last delta, walked by index (an expression appended)
SEEDED = """\
def calculate_advantages(deltas, gamma, decay):
    advantages = [deltas[-1]]
    for i in reversed(range(len(deltas) - 1)):
        advantages.append(deltas[i] + decay * gamma * advantages[-1])
    return advantages[::-1]

res = calculate_advantages(deltas, 0.99, 0.97) if len(deltas) else None
"""

# the value appended has a name; range(X - 2, -1, -1)
NAMED = """\
def compute_advantages(deltas, gamma, lambda_):
    advantages = [deltas[-1]]
    for t in range(len(deltas) - 2, -1, -1):
        advantage_t = deltas[t] + gamma * lambda_ * advantages[-1]
        advantages.append(advantage_t)
    advantages = advantages[::-1]
    return advantages, advantage_t

res = compute_advantages(deltas, 0.99, 0.95) if len(deltas) > 1 else None
"""


@HYP
@given(T=lengths, src=st.sampled_from([SEEDED, NAMED]), kind=st.sampled_from(["numpy", "floats", "torch", "rows"]),
       dtype=dtypes, seed=st.integers(0, 2**16))
def test_seeded_list_read_back_bitwise(T, src, kind, dtype, seed):
    if kind == "floats":
        deltas = [float(x) for x in np.random.default_rng(seed).standard_normal(T)]
    elif kind == "rows":  # a list of [N] tensors
        deltas = list(tensor(seed, (T, 3), dtype).unbind(0))
    else:
        deltas = arrays(kind, seed, (T,), dtype)
    ns1, ns2 = run_both(src, dict(deltas=deltas), vectorized=T >= 3)
    same_namespaces(ns1, ns2)


# rl-adventure style: returns seeded with the bootstrap value, insert(0) and returns[0] read back
INSERT_FRONT = """\
def compute_returns(next_value, rewards, masks, gamma):
    returns = [next_value]
    for r, m in zip(reversed(rewards), reversed(masks)):
        returns.insert(0, r + gamma * returns[0] * m)
    return returns[:-1]

res = compute_returns(next_value, rewards, masks, 0.99)
"""


@HYP
@given(T=lengths, kind=st.sampled_from(["floats", "tensors", "torch"]), dtype=dtypes, seed=st.integers(0, 2**16))
def test_insert_front_read_back_reassociated(T, kind, dtype, seed):
    rng = np.random.default_rng(seed)
    if kind == "floats":
        env = dict(rewards=[float(x) for x in rng.standard_normal(T)], masks=[float(x > 0.2) for x in rng.random(T)],
                   next_value=float(rng.standard_normal()))
    elif kind == "tensors":  # lists of [N, 1] tensors, as collected step by step
        env = dict(rewards=list(tensor(seed, (T, 2, 1), dtype).unbind(0)),
                   masks=list((1 - tensor(seed + 1, (T, 2, 1), dtype, "dones")).unbind(0)),
                   next_value=tensor(seed + 2, (2, 1), dtype))
    else:
        env = dict(rewards=tensor(seed, (T, 2), dtype), masks=1 - tensor(seed + 1, (T, 2), dtype, "dones"),
                   next_value=tensor(seed + 2, (2,), dtype))
    ns1, ns2 = run_both(INSERT_FRONT, env, exactness=REASSOCIATED, vectorized=T >= 2)
    same_namespaces(ns1, ns2, exact=False)


APPENDLEFT = """\
from collections import deque
def returns_of(rewards, gamma):
    out = deque([0.0])
    for r in rewards[::-1]:
        out.appendleft(r + gamma * out[0])
    return out

res = returns_of(rewards, 0.9)
"""


@HYP
@given(T=lengths, seed=st.integers(0, 2**16))
def test_deque_appendleft_read_back_bitwise(T, seed):
    rewards = np.random.default_rng(seed).standard_normal(T)
    ns1, ns2 = run_both(APPENDLEFT, dict(rewards=rewards), vectorized=T >= 2)
    same_namespaces(ns1, ns2)


def test_list_read_back_sites_name_the_list():
    _, done, _ = sites_of(SEEDED)
    assert len(done) == 1 and done[0].exactness == EXACT
    assert "`advantages.append(deltas[i] + decay * gamma * advantages[-1])`, carried through the list `advantages`" \
        in done[0].reason
    _, done, _ = sites_of(NAMED)
    assert "`advantage_t = deltas[t] + gamma * lambda_ * advantages[-1]`, carried through the list `advantages`" \
        in done[0].reason


def test_an_empty_list_read_back_raises_as_the_loop_does():
    src = ZIP_SLICES.replace("adv = [0.0]", "adv = []")
    run_both(src, dict(deltas=np.ones(5), dones=np.zeros(5)), vectorized=True)  # IndexError in both, step T-1


def apart_answers(monkeypatch):
    """The answers ``written_apart`` gives (it follows ``recurrence_ok`` in the guard)."""
    answers = []
    real = vectorized_mod.written_apart

    def spy(*args):
        answers.append(real(*args))
        return answers[-1]

    monkeypatch.setattr(vectorized_mod, "written_apart", spy)
    return answers


def test_list_under_another_name_takes_the_loop(monkeypatch):
    """The body reads ``other[-1]`` as a loop-invariant element; when ``other`` is the list being
    built under a second name that element changes each step (the loop squares the carried
    value): the guard (``written_apart``) takes the loop."""
    src = """\
def f(deltas, gamma, other, adv):
    for d in reversed(deltas):
        adv.append(d + gamma * adv[-1] * other[-1])
    return adv

res = f(deltas, 0.9, adv if alias else other, adv)
"""
    answers = apart_answers(monkeypatch)
    env = dict(deltas=np.linspace(0.5, 2.0, 7), adv=[1.0], other=[1.0], alias=True)
    ns1, ns2 = run_both(src, env, exactness=REASSOCIATED)  # recurrence_ok passes ...
    assert answers == [False]  # ... written_apart does not: the loop ran
    same_namespaces(ns1, ns2)
    env = dict(deltas=np.linspace(0.5, 2.0, 7), adv=[1.0], other=[1.0], alias=False)
    ns1, ns2 = run_both(src, env, exactness=REASSOCIATED)
    assert answers == [False, True]
    same_namespaces(ns1, ns2, exact=False)


def test_an_output_aliased_by_a_constant_read_takes_the_loop(monkeypatch):
    """The same hole for a plain carried value: ``R = r + gamma * R * other[0]; returns.insert(0, R)``
    with ``other is returns`` read ``other[0]`` as a constant (wrong values before written_apart)."""
    src = """\
def f(rewards, gamma, other, returns):
    R = 0.0
    for r in reversed(rewards):
        R = r + gamma * R * other[0]
        returns.insert(0, R)
    return returns

res = f(rewards, 0.9, returns, returns)
"""
    answers = apart_answers(monkeypatch)
    ns1, ns2 = run_both(src, dict(rewards=[0.5, 1.0, 2.0, 3.0, 1.5], returns=[1.0]), exactness=REASSOCIATED)
    assert answers == [False]
    same_namespaces(ns1, ns2)
    src2 = """\
def g(rewards, gamma, other, out):
    s = 0.0
    for t in reversed(range(len(rewards))):
        s = rewards[t] + gamma * s * other[2]
        out[t] = s
    return out

res = g(rewards, 0.9, out if alias else other, out)
"""
    ns1, ns2 = run_both(src2, dict(rewards=np.linspace(0.5, 2.0, 6), out=np.zeros(6), other=np.ones(3), alias=True),
                        exactness=REASSOCIATED)
    assert answers == [False, False]
    same_namespaces(ns1, ns2)
    ns1, ns2 = run_both(src2, dict(rewards=np.linspace(0.5, 2.0, 6), out=np.zeros(6), other=np.ones(3), alias=False),
                        exactness=REASSOCIATED)
    assert answers == [False, False, True]
    same_namespaces(ns1, ns2, exact=False)


def test_written_apart_runtime():
    L, a, t = [1.0], np.zeros(4), torch.zeros(4)
    wa = vectorized_mod.written_apart
    assert wa((L,), ([1.0],)) and not wa((L,), (L,))
    assert not wa((a,), (a[1:],)) and wa((a,), (np.zeros(4),))
    assert not wa((t,), (t[2:],)) and wa((t,), (torch.zeros(4),))


LIST_LOOK_ALIKES = [
    ("""\
def f(deltas, gamma, lam):
    adv = [0.0, 0.0]
    for delta in reversed(deltas):
        adv.append(delta + gamma * lam * adv[-2])
    return adv
""", "reads `adv[-2]` of the list `adv` while it appends to it"),
    ("""\
def f(rewards, gamma):
    advantages = [0]
    for r in reversed(rewards):
        advantage = r + gamma * advantages[-1]
        advantages.insert(0, advantage)
    return advantages
""", "reads `advantages[-1]` of the list `advantages` while it inserts at its front"),
    ("""\
def f(rewards, gamma):
    out = [0.0]
    for r in reversed(rewards):
        out.append(r + gamma * out[0])
    return out
""", "only the element written last (`out[-1]`)"),
    ("""\
def f(rewards, gamma):
    out = [0.0]
    s = 0.0
    for r in reversed(rewards):
        out.append(r)
        s = out[-1] + gamma * s
    return out, s
""", "after `out.append(r)` in the same step"),
    ("""\
def f(rewards, gamma):
    out = [[0.0]]
    for r in reversed(rewards):
        out.append([r + gamma * out[-1]])
    return out
""", "appends one-element lists"),
    ("""\
def f(rewards, gamma):
    out = [0.0]
    for r in reversed(rewards):
        out.append(r + gamma * out[-1])
        out.append(r)
    return out
""", "writes into `out` twice per step"),
    ("""\
def f(rewards, gamma):
    out = [0.0]
    for r in reversed(rewards):
        s = r + gamma * out[-1]
        out.append(s * 2.0)
    return out
""", "reaches the write through a temporary"),
]


@pytest.mark.parametrize("src,reason", LIST_LOOK_ALIKES, ids=[f"list-{i}" for i in range(len(LIST_LOOK_ALIKES))])
def test_list_look_alikes_are_left_alone(src, reason):
    left_alone(src, reason)


# both forms at once: a list of [B, 1] tensors seeded with zeros, time at dimension 1 of [B, T, 1]
BOTH = """\
def gae(vf, rewards, dones, gamma, lamb):
    vf_next = vf[:, 1:, :]
    discounts = gamma * (1 - dones)
    deltas = rewards + discounts * vf_next - vf[:, :-1, :]
    advantages = [torch.zeros_like(vf_next[:, 0, :])]
    for i in reversed(range(vf_next.shape[1])):
        advantages.append(deltas[:, i, :] + lamb * discounts[:, i, :] * advantages[-1])
    advantages = torch.stack(advantages[1:])
    return torch.flip(advantages, dims=[0]).transpose(0, 1)

import torch
res = gae(vf, rewards, dones, 0.99, 0.95)
"""


@HYP
@given(T=st.integers(1, 40), B=st.sampled_from([1, 3]), dtype=dtypes, seed=st.integers(0, 2**16))
def test_list_read_back_with_time_in_the_middle(T, B, dtype, seed):
    env = dict(vf=tensor(seed, (B, T + 1, 1), dtype), rewards=tensor(seed + 1, (B, T, 1), dtype),
               dones=tensor(seed + 2, (B, T, 1), dtype, "dones"))
    ns1, ns2 = run_both(BOTH, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


# torchrl's td_lambda_return_estimate (rolling gamma, per-step lambda): the carried value nested in the
# update, regrouped (reassociated)
TORCHRL_TD_LAMBDA = """\
def td_lambda_return_estimate(gamma, lmbda, next_state_value, reward, done):
    not_done = 1 - done.to(next_state_value.dtype)
    returns = torch.empty_like(next_state_value)
    *batch, T, lastdim = returns.shape
    gamma = torch.full_like(next_state_value, gamma) * not_done
    lmbda = torch.full_like(next_state_value, lmbda)
    g = next_state_value[..., -1, :]
    for i in reversed(range(T)):
        g = returns[..., i, :] = reward[..., i, :] + gamma[..., i, :] * (
            (1 - lmbda[..., i, :]) * next_state_value[..., i, :] + lmbda[..., i, :] * g
        )
    return returns

import torch
out = td_lambda_return_estimate(0.99, 0.9, next_state_value, reward, done)
"""


@HYP
@given(T=st.integers(1, 40), B=batch_shapes, F=st.sampled_from([1, 2]), dtype=dtypes, seed=st.integers(0, 2**16))
def test_torchrl_td_lambda_reassociated(T, B, F, dtype, seed):
    shape = B + (T, F)
    env = dict(next_state_value=tensor(seed, shape, dtype), reward=tensor(seed + 1, shape, dtype),
               done=tensor(seed + 2, shape, dtype, "dones") > 0)
    ns1, ns2 = run_both(TORCHRL_TD_LAMBDA, env, exactness=REASSOCIATED, vectorized=T >= 2)
    same_namespaces(ns1, ns2, exact=False)


# two containers, two time dimensions: ret[:, t] (dimension 1) next to rewards[..., t] (the last)
TWO_DIMS = """\
def f(ret, rewards, gamma):
    for t in range(ret.shape[1] - 2, -1, -1):
        ret[:, t] = rewards[..., t] + gamma * ret[:, t + 1]
    return ret

res = f(ret, rewards, 0.9)
"""


@HYP
@given(T=lengths, B=st.sampled_from([1, 3]), N=st.sampled_from([None, 1, 2]), kind=kinds, dtype=dtypes,
       seed=st.integers(0, 2**16))
def test_two_time_dimensions_bitwise(T, B, N, kind, dtype, seed):
    """ret [B, T+1] or [B, T+1, N]; rewards [B, T] or [B, N, T]: per step (B,) / (B, N) rows on
    both sides, as the views give them."""
    ret_shape = (B, T + 1) if N is None else (B, T + 1, N)
    rew_shape = (B, T) if N is None else (B, N, T)
    env = dict(ret=arrays(kind, seed, ret_shape, dtype), rewards=arrays(kind, seed + 1, rew_shape, dtype))
    ns1, ns2 = run_both(TWO_DIMS, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


# ------------------------------------------------------------------ 3. for t, r in reversed(list(enumerate(x)))

ENUMERATED = """\
def discounted(rewards, gamma, out):
    q_value = 0.0
    for t, reward in reversed(list(enumerate(rewards))):
        q_value = reward + gamma * q_value
        out[t] = q_value
    return out, t, reward

res = discounted(rewards, 0.99, out) if len(rewards) else None
"""

ENUMERATED_INSERT = """\
def compute_discounted_returns(rewards, gamma):
    returns = []
    G = 0.0
    for t, r in reversed(tuple(enumerate(rewards))):
        G = r + gamma * G
        returns.insert(0, G)
    return returns

res = compute_discounted_returns(rewards, 0.9)
"""

ENUMERATED_RESET = """\
def process(rewards, gamma):
    processed = rewards * 0
    sliding_sum = 0
    for i, reward in reversed(list(enumerate(rewards))):
        if reward != 0:
            sliding_sum = 0
        sliding_sum = sliding_sum * gamma + reward
        processed[i] = sliding_sum
    return processed

res = process(rewards, 0.99)
"""


@HYP
@given(T=lengths, kind=st.sampled_from(["torch", "numpy", "floats"]), dtype=dtypes, seed=st.integers(0, 2**16))
def test_reversed_enumerate_bitwise(T, kind, dtype, seed):
    """``t`` walks T-1 .. 0 and ``reward`` is ``rewards[t]``; both are left as the loop leaves them."""
    if kind == "floats":
        rewards = [float(x) for x in np.random.default_rng(seed).standard_normal(T)]
        out = np.zeros(T)
    else:
        rewards = arrays(kind, seed, (T,), dtype)
        out = rewards * 0
    ns1, ns2 = run_both(ENUMERATED, dict(rewards=rewards, out=out), vectorized=T >= 2)
    same_namespaces(ns1, ns2)
    ns1, ns2 = run_both(ENUMERATED_INSERT, dict(rewards=rewards), vectorized=T >= 2)
    same_namespaces(ns1, ns2)


@HYP
@given(T=lengths, dtype=dtypes, seed=st.integers(0, 2**16))
def test_reversed_enumerate_with_resets_bitwise(T, dtype, seed):
    rewards = tensor(seed, (T,), dtype) * (tensor(seed + 1, (T,), dtype, "dones"))  # mostly zeros
    ns1, ns2 = run_both(ENUMERATED_RESET, dict(rewards=rewards), vectorized=T >= 2)
    same_namespaces(ns1, ns2)


def test_reversed_enumerate_of_a_generator_takes_the_loop():
    """``list(enumerate(gen))`` works on any iterable; the guard's length is -1 for one without
    ``len`` (never an exception), and the loop runs."""
    src = ENUMERATED_INSERT.replace("compute_discounted_returns(rewards, 0.9)",
                                    "compute_discounted_returns((float(x) for x in rewards), 0.9)")
    ns1, ns2 = run_both(src, dict(rewards=[1.0, 2.0, 3.0, 4.0]), vectorized=False)
    same_namespaces(ns1, ns2)


def test_enumerate_look_alikes():
    shadowed = "def enumerate(x):\n    return zip(range(len(x)), x[::-1])\n\n" + ENUMERATED
    out, done, _ = sites_of(shadowed)
    assert not done and out == shadowed
    forward = ENUMERATED.replace("reversed(list(enumerate(rewards)))", "list(enumerate(rewards))")
    out, done, _ = sites_of(forward)
    assert not done and out == forward


# ------------------------------------------------------------------ 4. tuple assignments of per-step values

# both forms and a tuple assignment, as in a [B, T, 1] GAE over a list seeded with zeros
UNPACKED = """\
def gae(vf, rewards, dones, gamma, lamb):
    vf_next = vf[:, 1:, :]
    discounts = gamma * (1 - dones)
    deltas = rewards + discounts * vf_next - vf[:, :-1, :]
    advantages = [torch.zeros_like(vf_next[:, 0, :])]
    for i in reversed(range(vf_next.shape[1])):
        discount_t, delta_t = discounts[:, i, :], deltas[:, i, :]
        advantages.append(delta_t + lamb * discount_t * advantages[-1])
    advantages = torch.stack(advantages[1:])
    return torch.flip(advantages, dims=[0]).transpose(0, 1), discount_t, delta_t

import torch
res = gae(vf, rewards, dones, 0.99, 0.95)
"""


@HYP
@given(T=st.integers(1, 40), B=st.sampled_from([1, 3]), dtype=dtypes, seed=st.integers(0, 2**16))
def test_tuple_assignment_of_per_step_values_bitwise(T, B, dtype, seed):
    env = dict(vf=tensor(seed, (B, T + 1, 1), dtype), rewards=tensor(seed + 1, (B, T, 1), dtype),
               dones=tensor(seed + 2, (B, T, 1), dtype, "dones"))
    ns1, ns2 = run_both(UNPACKED, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


UNPACKED_ELEMENTS = """\
def f(rewards, dones, gamma):
    s = 0.0
    out = []
    for r, d in zip(reversed(rewards), reversed(dones)):
        m, x = 1.0 - d, r * 2.0
        s = x + gamma * m * s
        out.insert(0, s)
    return out, m, x

res = f(rewards, dones, 0.9)
"""


@HYP
@given(T=lengths, seed=st.integers(0, 2**16))
def test_tuple_assignment_over_elements_bitwise(T, seed):
    rng = np.random.default_rng(seed)
    env = dict(rewards=[float(v) for v in rng.standard_normal(T)], dones=[float(v < 0.2) for v in rng.random(T)])
    ns1, ns2 = run_both(UNPACKED_ELEMENTS if T else UNPACKED_ELEMENTS.replace("out, m, x", "out"), env,
                        vectorized=T >= 2)
    same_namespaces(ns1, ns2)


UNPACK_LOOK_ALIKES = [
    ("""\
def f(rewards, gamma):
    s, p = 0.0, 0.0
    for r in reversed(rewards):
        s, p = r + gamma * s, s
    return s, p
""", "assigns to `s, p`"),
    ("""\
def f(rewards, gamma):
    s = 0.0
    for r in reversed(rewards):
        a, a = r, 2 * r
        s = a + gamma * s
    return s
""", "assigns to `a, a`"),
    ("""\
def f(pairs, gamma):
    s = 0.0
    for p in reversed(pairs):
        a, b = p
        s = a + gamma * b * s
    return s
""", "assigns to `a, b`"),
]


@pytest.mark.parametrize("src,reason", UNPACK_LOOK_ALIKES, ids=[f"unpack-{i}" for i in range(len(UNPACK_LOOK_ALIKES))])
def test_unpack_look_alikes_are_left_alone(src, reason):
    left_alone(src, reason)


# IPPO returns in pymarl-style code: [B, T(+1), 1] tensors indexed x[:, step], the list seeded with
# the bootstrap value and read back as returns[-1] (both forms at once), concatenated after
IPPO = """\
import torch as th
import types


def compute_returns(self, value_preds, rewards, terminated):
    returns = []
    T = rewards.shape[1]
    returns.append(value_preds[:, -1])
    for step in reversed(range(T)):
        returns.append(returns[-1] * self.gamma * terminated[:, step + 1] + rewards[:, step])
    returns = th.flip(th.cat(returns, axis=1), dims=[1]).unsqueeze(-1)
    return returns[:, :T]

res = compute_returns(types.SimpleNamespace(gamma=0.99), value_preds, rewards, terminated)
"""


@HYP
@given(T=lengths, B=st.sampled_from([1, 4]), dtype=dtypes, seed=st.integers(0, 2**16))
def test_ippo_list_read_back_along_dimension_1(T, B, dtype, seed):
    env = dict(value_preds=tensor(seed, (B, T + 1, 1), dtype), rewards=tensor(seed + 1, (B, T, 1), dtype),
               terminated=1 - tensor(seed + 2, (B, T + 1, 1), dtype, "dones"))
    ns1, ns2 = run_both(IPPO, env, exactness=REASSOCIATED, vectorized=T >= 2)
    same_namespaces(ns1, ns2, exact=False)


# time first with trailing full slices (x[t, :], x[t, ...]): a view along dimension 0 checks the
# dimensions the subscript needs
TIME_FIRST_SLICED = """\
def returns_of(ret, rewards, masks, gamma):
    for t in reversed(range(rewards.shape[0])):
        ret[t, :] = rewards[t, ...] + gamma * masks[t, :] * ret[t + 1, :]
    return ret

res = returns_of(ret, rewards, masks, 0.99)
"""


@HYP
@given(T=lengths, N=st.sampled_from([1, 3]), kind=kinds, dtype=dtypes, seed=st.integers(0, 2**16))
def test_time_first_with_trailing_slices_bitwise(T, N, kind, dtype, seed):
    env = dict(ret=arrays(kind, seed, (T + 1, N), dtype), rewards=arrays(kind, seed + 1, (T, N), dtype),
               masks=1 - arrays(kind, seed + 2, (T, N), dtype, "dones"))
    ns1, ns2 = run_both(TIME_FIRST_SLICED, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)
    out = sites_and_code(TIME_FIRST_SLICED)
    assert "dim_view(ret, 0, 2)" in out and "dim_view(masks, 0, 2)" in out and "dim_view(rewards, 0, 2)" in out


# enumerate of a backward walk: the counter counts up while the elements walk back; a body that
# does not read it is vectorized, the counter left as the loop leaves it
ENUMERATE_COUNTER = """\
def gae(deltas, dones, gamma, lam):
    adv = [0.0]
    i = None
    for i, (delta, done) in enumerate(zip(reversed(deltas), reversed(dones))):
        adv.append(delta + gamma * lam * (1 - done) * adv[-1])
    return adv[::-1], i

res = gae(deltas, dones, 0.99, 0.95)
"""

ENUMERATE_SLICE = """\
def returns_of(rewards, gamma):
    R = 0.0
    out = []
    k = None
    for k, r in enumerate(rewards[::-1]):
        R = r + gamma * R
        out.insert(0, R)
    return out, k, r if k is not None else None

res = returns_of(rewards, 0.9)
"""


@HYP
@given(T=lengths, kind=st.sampled_from(["numpy", "floats", "torch"]), dtype=dtypes, seed=st.integers(0, 2**16))
def test_enumerate_counter_unused_bitwise(T, kind, dtype, seed):
    rng = np.random.default_rng(seed)
    if kind == "floats":
        env = dict(deltas=[float(x) for x in rng.standard_normal(T)], dones=[float(x < 0.2) for x in rng.random(T)])
    else:
        env = dict(deltas=arrays(kind, seed, (T,), dtype), dones=arrays(kind, seed + 1, (T,), dtype, "dones"))
    ns1, ns2 = run_both(ENUMERATE_COUNTER, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)
    if kind != "torch":  # tensors refuse x[::-1] (the loop raises, and so does the rewrite)
        src = ENUMERATE_SLICE if T else ENUMERATE_SLICE.replace("out, k, r if", "out, k, None if")
        ns1, ns2 = run_both(src, dict(rewards=env["deltas"]), vectorized=T >= 2)
        same_namespaces(ns1, ns2)


def test_enumerate_counter_read_is_left_alone():
    left_alone("""\
def f(rewards, gamma):
    R = 0.0
    out = []
    for k, r in enumerate(reversed(rewards)):
        R = r * k + gamma * R
        out.insert(0, R)
    return out
""", "reads the enumerate counter `k`")


# ------------------------------------------------------------------ the layout rule itself

@st.composite
def subscripts(draw):
    """A subscript with the time index ``t`` somewhere in the middle: leading full slices or one
    ellipsis among them, then integer indices and full slices (or a trailing ellipsis)."""
    lead = draw(st.lists(st.sampled_from([":", "..."]), max_size=3).filter(lambda xs: xs.count("...") <= 1))
    ints = draw(st.lists(st.sampled_from(["0", "-1", "1"]), max_size=2))
    tail = draw(st.lists(st.just(":"), max_size=2))
    if "..." not in lead and draw(st.booleans()):
        tail = tail + ["..."]
    return ", ".join(lead + ["t"] + ints + tail)


@settings(max_examples=300, deadline=None)
@given(sub=subscripts(), shape=st.lists(st.integers(1, 3), min_size=1, max_size=5), seed=st.integers(0, 2**16))
def test_layout_views_give_the_loops_slices(sub, shape, seed):
    """Wherever ``_layout`` reads ``x[<sub>]`` as ``v[t]`` with ``v = dim_view(x, dim, ndim, ints)``,
    that is the loop's slice for every t (same values, same shape), on tensors and ndarrays;
    ``dim_view`` declines arrays with too few dimensions for the subscript (or an integer index
    out of range: the loop then raises as written)."""
    import libcst as cst
    from scalebox_cst.transforms.vectorize.recurrence.views import _layout

    node = cst.parse_expression(f"x[{sub}]")
    lay = _layout(node, "t")
    if lay is None:  # x[t], x[t, 0]: time first, handled without a view
        assert not sub.replace("t", "").replace("0", "").replace("-1", "").replace("1", "").strip(", ")
        return
    x = np.random.default_rng(seed).standard_normal(shape)
    for arr in (x, torch.from_numpy(x)):
        v = vectorized_mod.dim_view(arr, lay.dim, lay.ndim, lay.ints)
        if v is None:
            with pytest.raises(IndexError):  # too few dimensions or an index out of range
                if arr.ndim < 2:
                    raise IndexError
                eval(f"arr[{sub}]", {"arr": arr, "t": 0})
            continue
        for t in range(v.shape[0]):
            want = eval(f"arr[{sub}]", {"arr": arr, "t": t})
            got = v[t]
            assert tuple(got.shape) == tuple(want.shape) and bool((got == want).all()), (sub, shape, t)


# integer indices after a time index in the middle index the dimensions after time: x[:, t, 0] is
# x's [:, :, 0] walked along dimension 1 (read as column 0 of the time-major rows it was the wrong
# dimension: B == N gave wrong values under a passing guard)
INT_AFTER_TIME = """\
def f(ret, rewards, values, gamma):
    s = 0.0
    for t in range(rewards.shape[1] - 1, -1, -1):
        s = rewards[:, t, 0] + gamma * values[..., t, -1] * s
        ret[:, t] = s
    return ret

res = f(ret, rewards, values, 0.9)
"""


@HYP
@given(T=lengths, B=st.sampled_from([1, 2, 3]), N=st.sampled_from([1, 2, 3]), kind=kinds, dtype=dtypes,
       seed=st.integers(0, 2**16))
def test_integer_index_after_time_in_the_middle_bitwise(T, B, N, kind, dtype, seed):
    env = dict(ret=arrays(kind, seed, (B, T), dtype), rewards=arrays(kind, seed + 1, (B, T, N), dtype),
               values=arrays(kind, seed + 2, (B, T, N), dtype))
    ns1, ns2 = run_both(INT_AFTER_TIME, env, vectorized=T >= 2)
    same_namespaces(ns1, ns2)
    out = sites_and_code(INT_AFTER_TIME)
    assert "dim_view(rewards, 1, 3, (0,))" in out and "dim_view(values, -2, 2, (-1,))" in out


# ------------------------------------------------------------------ memory shared under two storages

# a GAE whose output and inputs are tensors over one numpy buffer (torch.from_numpy of its views:
# each tensor gets a storage of its own, at its view's address)
BUFFER_GAE = """\
values = torch.from_numpy(buf[lo_v:lo_v + T + 1])
adv = torch.from_numpy(buf[lo_a:lo_a + T])
lastgaelam = 0.0
for t in reversed(range(T)):
    delta = rewards[t] + 0.99 * values[t + 1] - values[t]
    lastgaelam = delta + 0.99 * 0.95 * lastgaelam
    adv[t] = lastgaelam
"""


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("lo_v, lo_a, overlap", [
    (1, 0, True),  # adv[t] is values[t - 1]: the loop reads what it wrote a step before
    (0, 1, True),
    (0, 0, True),
    (0, 40, False),  # disjoint parts of one buffer: vectorized
])
def test_an_output_over_the_memory_of_an_input_under_another_storage_takes_the_loop(monkeypatch, fused, lo_v, lo_a, overlap):
    """The guard compared storage addresses: two tensors made over overlapping memory (here
    ``torch.from_numpy`` of two views of one array) have storages at different addresses, so an
    output overlapping an input passed and the vectorized steps, reading every input before
    writing, computed other values than the loop, which reads what it wrote a step before."""
    if not fused:
        monkeypatch.setattr(vectorized_mod, "fused_linear", lambda *args, **kwargs: None)
    T = 12
    rng = np.random.default_rng(0)
    env = dict(torch=torch, T=T, lo_v=lo_v, lo_a=lo_a, buf=rng.standard_normal(64).astype(np.float32),
               rewards=torch.from_numpy(rng.standard_normal(T).astype(np.float32)))
    ns1, ns2 = run_both(BUFFER_GAE, env, vectorized=not overlap)
    same_namespaces(ns1, ns2)
