"""vectorize.recurrence, the last step folded into the vectorized steps (transforms/vectorize/
recurrence/fold.py): differential tests of functions whose loop temporaries are dead after the
loop (original vs rewrite on the same random inputs, bitwise, the carried value's type included),
and look-alikes where something can read what the last step leaves, which keep it as written."""
from __future__ import annotations

import re
import struct
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalebox_cst.report import EXACT
from scalebox_cst.transforms.vectorize.recurrence import fold
from scalebox_cst.runtime import vectorized as vectorized_mod
import harness

ID = "vectorize.recurrence"
HYP = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FOLDED = re.compile(r"# steps t = \w+ - 2 \.\. 0, vectorized")
PEELED = re.compile(r"# step t = 0, as written|# steps t = \w+ - 1 \.\. 0, as written")  # (the loop of the steps left)
_MIN_STEPS = dict(vectorized_mod.MIN_STEPS)


def setup_module(module):
    vectorized_mod.MIN_STEPS.update({k: 2 for k in _MIN_STEPS})  # vectorize short inputs too


def teardown_module(module):
    vectorized_mod.MIN_STEPS.update(_MIN_STEPS)


def rewrite(src: str):
    out, sites = harness.rewrite(src, ID)
    return out, harness.rewritten_sites(sites)


_CACHE: dict = {}


def functions(src: str, name: str = "f"):
    """(original function, rewritten function, rewritten text); every site exact."""
    if src not in _CACHE:
        original, rewritten, new, sites = harness.pair(src, name, ID)
        done = harness.rewritten_sites(sites)
        assert done and all(s.exactness == EXACT for s in done), done
        _CACHE[src] = (original, rewritten, new, done)
    return _CACHE[src]


def same(a, b, where="result"):
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert a.contiguous().numpy().tobytes() == b.contiguous().numpy().tobytes(), f"{where}: {a} != {b}"
    elif isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and np.shape(a) == np.shape(b), where
        assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), f"{where}: {a} != {b}"
    elif isinstance(a, float):
        assert struct.pack("d", a) == struct.pack("d", b), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def clone(v):
    if isinstance(v, torch.Tensor):
        return v.clone()
    if isinstance(v, np.ndarray):
        return v.copy()
    if isinstance(v, list):
        return [clone(x) for x in v]
    return v


def check(src, args, folded=True, vectorized=True):
    f, g, new, done = functions(src)
    assert bool(FOLDED.search(new)) == folded, new
    assert bool(PEELED.search(new)) == (not folded), new
    if folded:
        assert all("the last step folded in" in s.reason for s in done), [s.reason for s in done]
    answers = []
    real = vectorized_mod.recurrence_ok

    def spy(*a, **k):
        answers.append(real(*a, **k))
        return answers[-1]

    def call(fn):
        try:
            return fn(*[clone(a) for a in args])
        except Exception as exc:  # the rewrite must fail the same way
            return type(exc)

    fused = []
    real_fused = vectorized_mod.fused_linear

    def spy_fused(*a, **k):
        fused.append(real_fused(*a, **k))
        return fused[-1]

    want = call(f)
    vectorized_mod.recurrence_ok, vectorized_mod.fused_linear = spy, spy_fused
    try:
        got = call(g)
    finally:
        vectorized_mod.recurrence_ok, vectorized_mod.fused_linear = real, real_fused
    one_pass = any(x is not None for x in fused)
    assert (True in answers or one_pass) == vectorized, (answers, fused)
    same(want, got)
    if one_pass:  # the vectorized steps behind the one-pass tier agree too
        vectorized_mod.fused_linear = lambda *a, **k: None
        try:
            same(want, call(g))
        finally:
            vectorized_mod.fused_linear = real_fused
    return new


def data(seed, T, N, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, N, generator=g, dtype=torch.float64).to(dtype)
    values = torch.randn(T, N, generator=g, dtype=torch.float64).to(dtype)
    dones = (torch.rand(T, N, generator=g) < 0.2).to(dtype)
    next_value = torch.randn(N, generator=g, dtype=torch.float64).to(dtype)
    next_done = (torch.rand(N, generator=g) < 0.5).to(dtype)
    return rewards, values, dones, next_value, next_done


# ------------------------------------------------------------------ folded forms

GAE = """
import torch

def f(rewards, values, dones, next_value, next_done, gamma=0.99, lam=0.95):
    T = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(T)):
        if t == T - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * lam * nextnonterminal * lastgaelam
    return advantages, advantages + values, lastgaelam, t
"""


@HYP
@given(seed=st.integers(0, 2**31 - 1), T=st.integers(2, 40), N=st.integers(1, 9),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_cleanrl_gae_in_a_function_folds_the_last_step(seed, T, N, dtype):
    new = check(GAE, data(seed, T, N, dtype))
    assert re.search(r"advantages\[0:(\w+) - 1\] = .*\n", new) and re.search(r"values_v\[0:\w+ - 1\]", new)


def test_short_inputs_and_the_loop_fallback():
    for T in (0, 1):  # the guard declines: the loop as written
        check(GAE, data(3, T, 4), vectorized=False)
    check(GAE, data(3, 2, 4))  # T = 2: the vectorized steps are the last step alone
    r, v, d, nv, nd = data(4, 12, 3)
    check(GAE, (r, v, d, nv.double(), nd))  # float64 carry after the first step: carry_ok says no


GAE_NUMPY_1D = """
import numpy as np

def f(rewards, values, dones, last_value, gamma=0.99, lam=0.95):
    n = len(rewards)
    adv = np.zeros(n, dtype=rewards.dtype)
    gae = 0.0
    for t in reversed(range(n)):
        next_v = last_value if t == n - 1 else values[t + 1]
        delta = rewards[t] + gamma * next_v * (1.0 - dones[t]) - values[t]
        gae = delta + gamma * lam * (1.0 - dones[t]) * gae
        adv[t] = gae
    return adv, gae
"""


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("T", [2, 3, 17])
def test_numpy_gae_with_a_conditional_expression(dtype, T):
    rng = np.random.default_rng(T)
    r = rng.standard_normal(T).astype(dtype)
    v = rng.standard_normal(T).astype(dtype)
    d = (rng.random(T) < 0.2).astype(dtype)
    check(GAE_NUMPY_1D, (r, v, d, dtype(0.5)))  # the carry is a numpy scalar, as the loop leaves it


RETURNS_LIST = """
def f(rewards, masks, next_value, gamma=0.99):
    R = next_value
    returns = []
    for step in reversed(range(len(rewards))):
        R = rewards[step] + gamma * masks[step] * R
        returns.insert(0, R)
    return returns, R
"""


def test_returns_inserted_into_a_list_of_floats_and_of_tensors():
    rng = np.random.default_rng(0)
    r = [float(x) for x in rng.standard_normal(600)]
    m = [float(x > 0.1) for x in rng.random(600)]
    check(RETURNS_LIST, (r, m, 0.25))  # lists of floats: the carry stays a Python float
    g = torch.Generator().manual_seed(1)
    rt = list(torch.randn(30, 1, 4, generator=g))
    mt = list((torch.rand(30, 1, 4, generator=g) > 0.1).float())
    check(RETURNS_LIST, (rt, mt, torch.randn(1, 4, generator=g)))


RETURNS_APPEND = """
def f(rewards, dones, gamma=0.99):
    discounted = 0.0
    out = []
    for reward, done in zip(reversed(rewards), reversed(dones)):
        discounted = reward + gamma * (1.0 - done) * discounted
        out.append(discounted)
    out.reverse()
    return out, discounted, reward, done
"""


def test_zip_of_reversed_sequences_binds_its_elements_as_the_loop_leaves_them():
    g = torch.Generator().manual_seed(2)
    check(RETURNS_APPEND, (torch.randn(25, 3, generator=g), (torch.rand(25, 3, generator=g) < 0.3).float()))


MEMO = """
def f(rewards, masks, returns, gamma=0.99):
    for t in reversed(range(rewards.size(0))):
        returns[t] = rewards[t] + gamma * masks[t] * returns[t + 1]
    return returns
"""


def test_recurrence_through_memory():
    g = torch.Generator().manual_seed(3)
    T = 20
    returns = torch.zeros(T + 1, 5)
    returns[-1] = torch.randn(5, generator=g)
    check(MEMO, (torch.randn(T, 5, generator=g), (torch.rand(T, 5, generator=g) > 0.2).float(), returns))


RESETS = """
import numpy as np

def f(rewards, dones, gamma=0.9):
    running = 0.0
    out = np.zeros_like(rewards)
    for t in reversed(range(len(rewards))):
        if dones[t]:
            running = 0.0
        running = rewards[t] + gamma * running
        out[t] = running
    return out, running
"""


def test_episode_resets():
    rng = np.random.default_rng(4)
    for dtype in (np.float32, np.float64):
        r = rng.standard_normal(300).astype(dtype)
        d = rng.random(300) < 0.05
        for first in (False, True):
            d[0] = first  # a reset at the folded step itself, or none
            check(RESETS, (r, d))


# ------------------------------------------------------------------ look-alikes: the last step kept


def test_a_temporary_read_after_the_loop_keeps_the_last_step():
    src = GAE.replace("return advantages, advantages + values, lastgaelam, t",
                      "return advantages, delta, nextvalues")
    check(src, data(5, 10, 3), folded=False)


def test_a_temporary_read_in_a_nested_function_keeps_the_last_step():
    src = GAE.replace("    return advantages, advantages + values, lastgaelam, t",
                      "    show = lambda: delta\n    return advantages, show()")
    check(src, data(6, 10, 3), folded=False)


@pytest.mark.parametrize("tail", ["locals()", "vars()", "eval('nextnonterminal')"])
def test_introspection_keeps_the_last_step(tail):
    src = GAE.replace("return advantages, advantages + values, lastgaelam, t",
                      f"return advantages, {tail}")
    f, g, new, _ = functions(src)
    assert PEELED.search(new) and not FOLDED.search(new)
    args = data(7, 9, 2)
    want, got = f(*[clone(a) for a in args]), g(*[clone(a) for a in args])
    same(want[0], got[0])
    if not isinstance(want[1], dict):
        same(want[1], got[1])
    else:  # the same local names, bitwise the same values for what both hold
        assert sorted(k for k in want[1]) == sorted(k for k in got[1] if k in want[1])
        for k in ("delta", "nextvalues", "nextnonterminal", "lastgaelam", "t"):
            same(want[1][k], got[1][k], k)


def test_frame_access_keeps_the_last_step():
    src = GAE.replace("    return advantages, advantages + values, lastgaelam, t",
                      "    import sys\n    frame = sys._getframe()\n    return advantages, frame.f_locals['delta']")
    check(src, data(10, 9, 2), folded=False)


def test_del_and_global_keep_the_last_step():
    check(GAE.replace("    return advantages, advantages + values, lastgaelam, t",
                      "    del delta\n    return advantages"), data(8, 9, 2), folded=False)
    src = GAE.replace("    T = rewards.shape[0]", "    global delta\n    T = rewards.shape[0]")
    check(src, data(8, 9, 2), folded=False)


def test_module_level_loop_keeps_the_last_step():
    src = textwrap.dedent(GAE).replace("def f(rewards, values, dones, next_value, next_done, gamma=0.99, lam=0.95):",
                                       "if True:").replace("    return advantages, advantages + values, lastgaelam, t", "")
    src = "rewards, values, dones, next_value, next_done = DATA\ngamma, lam = 0.99, 0.95\n" + src
    new, done = rewrite(src)
    assert done and PEELED.search(new) and not FOLDED.search(new)


NESTED = """
import torch

def f(rewards, values, dones, next_value, next_done, gamma=0.99, lam=0.95):
    T = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    seen = []
    delta = torch.zeros_like(next_value)
    for epoch in range(2):
        lastgaelam = 0
        for t in reversed(range(T)):
            if t == T - 1:
                nextnonterminal = 1.0 - next_done + 0 * delta
                nextvalues = next_value
            else:
                nextnonterminal = 1.0 - dones[t + 1]
                nextvalues = values[t + 1]
            delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
            advantages[t] = lastgaelam = delta + gamma * lam * nextnonterminal * lastgaelam
        seen.append(advantages.clone())
    return seen
"""


def test_first_step_reading_what_the_previous_run_left_keeps_the_last_step():
    # the first step reads `delta` before assigning it: a second run of the loop sees what the
    # first left there (`delta` is also named outside the loop here, which alone keeps it)
    check(NESTED, data(9, 8, 3), folded=False)
    src = NESTED.replace("    delta = torch.zeros_like(next_value)\n", "")
    new, done = rewrite(src)
    assert not FOLDED.search(new)  # without that name outside: the first-step read alone keeps it


_WIDEN_TOKENS = ["x_v", "xx_v", "x_v2", "a.x_v", "y", "é_v", "x_v[", "[1:", "[0:", "[2:T]", "[12:", " ", "+", "(",
                 ")", "x_v[3:", "yx_v[2:", "_x_v[1:", "x_v [1:"]


@settings(max_examples=400, deadline=None)
@given(
    mid=st.lists(st.lists(st.sampled_from(_WIDEN_TOKENS), max_size=12).map("".join), max_size=3),
    arrays=st.lists(st.sampled_from(["x_v", "xx_v", "x_v2", "é_v", "y", "_x_v"]), max_size=3),
)
def test_widen_moves_exactly_the_slices_of_the_arrays_named(mid, arrays):
    """fold.widen against the pattern it had (an alternation of the escaped names, compiled per
    site): the same lines, or None, for names that prefix one another, follow a dot or a word."""
    names = sorted(set(arrays), key=len, reverse=True)
    if not names:
        expected = None
    else:
        pat = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, names)) + r")\[(\d+):")
        expected = None if any(int(m.group(2)) < 1 for line in mid for m in pat.finditer(line)) else \
            [pat.sub(lambda m: f"{m.group(1)}[{int(m.group(2)) - 1}:", line) for line in mid]
    assert fold.widen(mid, arrays) == expected
