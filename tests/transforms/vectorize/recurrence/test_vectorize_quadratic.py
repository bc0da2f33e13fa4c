"""vectorize.recurrence on quadratic sums (advantages / returns summed over k >= t in a double loop).

Why: the rewrite re-orders every sum, so the differential tests compare the sums against the bound
the site states (relative to the sum of |c^j E(k)|, not to the result, which may cancel), while
every other variable the loop leaves behind (t, k, the sum, the discount, temporaries, the inputs)
must be bitwise what the loop left; look-alikes whose algebra differs must stay byte for byte.
"""
from __future__ import annotations

import struct
import types

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalebox_cst.report import REASSOCIATED, REWRITTEN, SKIPPED
from scalebox_cst.runtime import vectorized as vectorized_mod
from scalebox_cst.transforms.vectorize.recurrence import VectorizeRecurrence
import harness

ID = "vectorize.recurrence"
HYP = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_QUAD = dict(vectorized_mod.QUAD_MIN_STEPS)


def setup_module(module):
    # vectorize from 2 steps on, so that short random sequences exercise the vectorized branch
    vectorized_mod.QUAD_MIN_STEPS.update({k: 2 for k in _QUAD})


def teardown_module(module):
    vectorized_mod.QUAD_MIN_STEPS.update(_QUAD)


# ------------------------------------------------------------------ harness


def rewrite(src: str, **options):
    return harness.rewrite(src, ID, dedent=False, options={ID: options})  # the shared harness (tests/harness.py)


_CACHE: dict = {}


def compiled(src: str):
    """(original, rewritten) code objects; the one site must be a reassociated rewrite."""
    if src not in _CACHE:
        out, sites = rewrite(src)
        assert [(s.action, s.exactness) for s in sites] == [(REWRITTEN, REASSOCIATED)], [s.describe() for s in sites]
        assert "quadratic loop" in sites[0].reason and "(4n+2)" in sites[0].reason
        _CACHE[src] = (harness.compiled(src, "orig"), harness.compiled(out, "new"))
    return _CACHE[src]


def clone(v):
    if isinstance(v, np.ndarray):
        return v.copy()
    if isinstance(v, torch.Tensor):
        return v.clone()
    if isinstance(v, list):
        return [clone(e) for e in v]
    return v


def run_both(src: str, env: dict, vectorized: bool):
    """Exec original and rewrite on copies of ``env``; ``vectorized``: whether the guard must pick
    the vectorized branch."""
    orig, new = compiled(src)
    with harness.spy(vectorized_mod, "quadratic_ok") as answers:  # the rewrite must fail as the loop does
        ns1, ns2 = harness.run_pair(orig, new, env, clone=lambda env: {k: clone(v) for k, v in env.items()})
    if vectorized:
        assert answers == [True], answers
    else:  # refused by the guard (or by its cheap head, which then never asks quadratic_ok)
        assert True not in answers, answers
    return ns1, ns2


def bits(a, b, where: str) -> None:
    """Same type, dtype, shape and bits."""
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert a.numpy().tobytes() == b.numpy().tobytes(), f"{where}: {a} != {b}"
    elif isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and np.shape(a) == np.shape(b), where
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), f"{where}: {a} != {b}"
    elif isinstance(a, float):
        assert struct.pack("d", a) == struct.pack("d", b), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            bits(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def as64(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.double().numpy()
    if isinstance(x, list):
        return np.array([as64(e) for e in x], dtype=np.float64)
    return np.asarray(x, dtype=np.float64)


def tolerance(E: np.ndarray, c: float, offset: int, acc_dtype, old: np.ndarray, out_dtype) -> np.ndarray:
    """The bound the site states, per output element: (4n+2)·u·sum_j |c^j E(t+j)| for the n terms
    of sum t, plus one rounding of the result where the output is narrower than the sum."""
    n = len(E)
    S = np.zeros_like(E)
    s = np.zeros(E.shape[1:])
    for k in reversed(range(n)):
        s = abs(c) ** offset * np.abs(E[k]) + abs(c) * s
        S[k] = s
    terms = (n - np.arange(n)).reshape((n,) + (1,) * (E.ndim - 1))
    u = np.finfo(acc_dtype).eps / 2
    tol = np.zeros(old.shape)  # elements the loop never writes: equal (only the rounding term below)
    m = min(n, len(old))
    if m:
        tol[:m] = ((4 * terms + 2) * u * S)[:m]
    return tol + np.spacing(np.abs(old).astype(out_dtype)).astype(np.float64) + 1e-300


def close(a, b, tol: np.ndarray, where: str) -> None:
    """Same container type, dtypes and shapes; every element within ``tol``."""
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, list):
        assert len(a) == len(b), where
        for x, y in zip(a, b):
            assert type(x) is type(y) and getattr(x, "dtype", None) == getattr(y, "dtype", None), where
            assert np.shape(x) == np.shape(y), where
    else:
        assert a.dtype == b.dtype and a.shape == b.shape, where
    new, old = as64(b), as64(a)
    assert np.isfinite(old).all()
    np.testing.assert_array_less(np.abs(new - old), tol, err_msg=where)


def compare(ns1: dict, ns2: dict, out: str, tol_of) -> None:
    """``out`` within the stated bound, every other variable of the original run bitwise."""
    for key, value in ns1.items():
        if key.startswith("__") or isinstance(value, types.ModuleType) or callable(value):
            continue
        assert key in ns2, f"{key} missing after the rewrite"
        if key == out:
            close(value, ns2[key], tol_of(as64(value)), key)
        elif isinstance(value, types.SimpleNamespace):
            assert vars(value) == vars(ns2[key])
        else:
            bits(value, ns2[key], key)


def array(kind: str, values: np.ndarray, dtype: str):
    if kind == "list":
        return values.astype(np.float64).tolist()
    if kind == "numpy":
        return values.astype(dtype)
    if kind == "tlist":  # a list of per-step tensors (rewards appended one step at a time)
        return [torch.tensor(x, dtype=getattr(torch, dtype)) for x in values]
    return torch.tensor(values, dtype=getattr(torch, dtype))


def acc_dtype(kind: str, dtype: str):
    return np.float64 if kind == "list" else np.dtype(dtype)


kinds = st.sampled_from(["numpy", "torch", "list"])
dtypes = st.sampled_from(["float32", "float64"])
gammas = st.sampled_from([0.99, 0.9, 0.5, 1.0])
seeds = st.integers(0, 2**16)


# ------------------------------------------------------------------ Phil Tabor's GAE (module level)

TABOR = """\
for t in range(len(reward_arr)-1):
    discount = 1
    a_t = 0
    for k in range(t, len(reward_arr)-1):
        a_t += discount*(reward_arr[k] + self.gamma*values[k+1]*\\
                (1-int(dones_arr[k])) - values[k])
        discount *= self.gamma*self.gae_lambda
    advantage[t] = a_t
"""


def tabor_env(T, kind, dtype, seed, gamma, lam, done_kind, out_dtype):
    rng = np.random.default_rng(seed)
    r, v = rng.normal(size=T), rng.normal(size=T)
    d = rng.random(T) < 0.2
    if kind == "list":
        dones = [bool(x) for x in d]
        out = np.zeros(T, dtype=out_dtype)
    elif kind == "numpy":
        dones = d if done_kind == "bool" else d.astype(dtype)
        out = np.zeros(T, dtype=out_dtype)
    else:
        dones = torch.tensor(d) if done_kind == "bool" else torch.tensor(d, dtype=getattr(torch, dtype))
        out = torch.zeros(T, dtype=getattr(torch, out_dtype))
    env = dict(reward_arr=array(kind, r, dtype), values=array(kind, v, dtype), dones_arr=dones, advantage=out,
               self=types.SimpleNamespace(gamma=gamma, gae_lambda=lam))
    return env, r[:-1] + gamma * v[1:] * (1 - d[:-1]) - v[:-1]


@HYP
@given(T=st.integers(0, 40), kind=kinds, dtype=dtypes, seed=seeds, gamma=gammas, lam=st.sampled_from([0.95, 1.0]),
       done_kind=st.sampled_from(["bool", "float"]), out_dtype=st.sampled_from(["float32", "float64"]))
def test_tabor_gae(T, kind, dtype, seed, gamma, lam, done_kind, out_dtype):
    env, E = tabor_env(T, kind, dtype, seed, gamma, lam, done_kind, out_dtype)
    ns1, ns2 = run_both(TABOR, env, vectorized=T - 1 >= 2)
    compare(ns1, ns2, "advantage",
            lambda old: tolerance(E, gamma * lam, 0, acc_dtype(kind, dtype), old, np.dtype(out_dtype)))


# ------------------------------------------------------------------ temporary delta, discount multiplied first, [T, N]

DELTA_FIRST = """\
for t in range(T):
    a_t = 0.0
    discount = 1.0
    for k in range(t, T):
        delta = rewards[k] + gamma * values[k + 1] * (1.0 - dones[k]) - values[k]
        discount *= gamma * lam
        a_t += discount * delta
    adv[t] = a_t
"""


@HYP
@given(T=st.integers(0, 40), N=st.sampled_from([0, 1, 3]), kind=st.sampled_from(["numpy", "torch"]), dtype=dtypes,
       seed=seeds, gamma=gammas)
def test_delta_temporary_discount_first(T, N, kind, dtype, seed, gamma):
    rng = np.random.default_rng(seed)
    shape = (T,) + ((N,) if N else ())
    r, v = rng.normal(size=shape), rng.normal(size=(T + 1,) + shape[1:])
    d = (rng.random(shape) < 0.2).astype(np.float64)
    env = dict(T=T, gamma=gamma, lam=0.95, rewards=array(kind, r, dtype), values=array(kind, v, dtype),
               dones=array(kind, d, dtype), adv=array(kind, np.zeros(shape), dtype))
    E = r + gamma * v[1:] * (1 - d) - v[:-1]
    ns1, ns2 = run_both(DELTA_FIRST, env, vectorized=T >= 2)
    compare(ns1, ns2, "adv", lambda old: tolerance(E, gamma * 0.95, 1, np.dtype(dtype), old, np.dtype(dtype)))


# ------------------------------------------------------------------ discounted returns, gamma ** (k - t), append

POWER_APPEND = """\
returns = []
for t in range(len(rewards)):
    G = 0
    for k in range(t, len(rewards)):
        G += gamma ** (k - t) * rewards[k]
    returns.append(G)
"""


@HYP
@given(T=st.integers(0, 40), N=st.sampled_from([0, 2]), kind=st.sampled_from(["numpy", "torch", "list", "tlist"]),
       dtype=dtypes, seed=seeds, gamma=gammas)
def test_power_returns_appended(T, N, kind, dtype, seed, gamma):
    rng = np.random.default_rng(seed)
    shape = (T,) + ((N,) if N and kind != "list" else ())
    r = rng.normal(size=shape)
    env = dict(gamma=gamma, rewards=array(kind, r, dtype))
    ns1, ns2 = run_both(POWER_APPEND, env, vectorized=T >= 2)
    compare(ns1, ns2, "returns", lambda old: tolerance(r, gamma, 0, acc_dtype(kind, dtype), old, acc_dtype(kind, dtype)))


# ------------------------------------------------------------------ Tabor's REINFORCE: list of floats into numpy

REINFORCE = """\
G = np.zeros_like(reward_memory, dtype=np.float64)
for t in range(len(reward_memory)):
    G_sum = 0
    discount = 1
    for k in range(t, len(reward_memory)):
        G_sum += reward_memory[k] * discount
        discount *= gamma
    G[t] = G_sum
"""


@HYP
@given(T=st.integers(0, 40), seed=seeds, gamma=gammas)
def test_reinforce_list_of_floats(T, seed, gamma):
    r = np.random.default_rng(seed).normal(size=T)
    env = dict(np=np, gamma=gamma, reward_memory=r.tolist())
    ns1, ns2 = run_both(REINFORCE, env, vectorized=T >= 2)
    compare(ns1, ns2, "G", lambda old: tolerance(r, gamma, 0, np.float64, old, np.float64))


# ------------------------------------------------------------------ undiscounted, outer bound spelled differently

PLAIN = """\
for t in range(n):
    total = 0
    for k in range(t, len(rewards)):
        total = total + rewards[k]
    out[t] = total
"""


@HYP
@given(T=st.integers(0, 30), dn=st.sampled_from([0, 0, -1, 1]), kind=st.sampled_from(["numpy", "torch"]), dtype=dtypes,
       seed=seeds)
def test_plain_sum_with_a_runtime_bound_check(T, dn, kind, dtype, seed):
    r = np.random.default_rng(seed).normal(size=T)
    n = max(T + dn, 0)
    env = dict(n=n, rewards=array(kind, r, dtype), out=array(kind, np.zeros(max(n, T)), dtype))
    # the loop runs wherever range(n) and range(t, len(rewards)) disagree (the guard compares them)
    ns1, ns2 = run_both(PLAIN, env, vectorized=T >= 2 and dn == 0)
    compare(ns1, ns2, "out", lambda old: tolerance(r, 1.0, 0, np.dtype(dtype), old, np.dtype(dtype)))


@pytest.mark.parametrize("width", [1, 3, "T-1"])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_sums_stored_into_wider_rows(kind, width):
    """Each scalar sum is broadcast over its output row, as ``out[t] = total`` does (before the fix
    the time axis was broadcast across the row: wrong values when the row width is T - 1)."""
    T = 8
    r = np.random.default_rng(3).normal(size=T)
    w = T - 1 if width == "T-1" else width
    env = dict(n=T, rewards=array(kind, r, "float64"), out=array(kind, np.zeros((T, w)), "float64"))
    ns1, ns2 = run_both(PLAIN, env, vectorized=True)
    np.testing.assert_allclose(as64(ns2["out"]), as64(ns1["out"]), rtol=1e-12, atol=1e-12)
    assert (as64(ns1["out"]) == as64(ns1["out"])[:, :1]).all()


# ------------------------------------------------------------------ the guard falls back to the loop


def test_output_aliasing_an_input_runs_the_loop():
    rng = np.random.default_rng(1)
    T = 20
    values = rng.normal(size=T)
    env = dict(reward_arr=rng.normal(size=T), values=values, dones_arr=rng.random(T) < 0.2,
               self=types.SimpleNamespace(gamma=0.99, gae_lambda=0.95))
    ns = []
    for code in compiled(TABOR):
        e = {k: clone(v) for k, v in env.items()}
        e["advantage"] = e["values"]  # the loop writes what it reads
        with harness.spy(vectorized_mod, "quadratic_ok") as answers:
            ns.append(harness.load(code, namespace=e))
    assert answers == [False]
    bits(ns[0]["advantage"], ns[1]["advantage"], "advantage")
    assert not np.array_equal(ns[0]["advantage"], values)


@pytest.mark.parametrize("change", ["half_done", "np_gamma", "int_gamma", "short_values", "int_rewards", "grad",
                                    "2d_dones"])
def test_guard_refuses(change):
    rng = np.random.default_rng(2)
    T = 12
    gamma = {"np_gamma": np.float64(0.99), "int_gamma": 2}.get(change, 0.99)
    env = dict(reward_arr=rng.normal(size=T).astype(np.float32), values=rng.normal(size=T).astype(np.float32),
               dones_arr=(rng.random(T) < 0.2).astype(np.float32), advantage=np.zeros(T, dtype=np.float32),
               self=types.SimpleNamespace(gamma=gamma, gae_lambda=0.95))
    if change == "half_done":  # int(0.5) == 0: the float mask would not be what int() gives
        env["dones_arr"][3] = 0.5
    elif change == "short_values":  # the loop raises IndexError, so must the rewrite
        env["values"] = env["values"][:-2]
    elif change == "int_rewards":
        env["reward_arr"] = np.arange(T)
    elif change == "grad":
        env = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in env.items()}
        env["values"].requires_grad_(True)
    elif change == "2d_dones":  # int() of a row raises in the loop
        env["dones_arr"] = np.zeros((T, 2), dtype=np.float32)
    ns1, ns2 = run_both(TABOR, env, vectorized=False)
    if change == "grad":
        torch.testing.assert_close(ns1["advantage"], ns2["advantage"], rtol=0, atol=0)
    elif change not in ("short_values", "2d_dones"):
        bits(ns1["advantage"], ns2["advantage"], "advantage")


@pytest.mark.parametrize("T", [0, 1, 2, 3, 4, 11, 12])
def test_tiny_lengths_at_the_real_thresholds(T):
    saved = dict(vectorized_mod.QUAD_MIN_STEPS)
    vectorized_mod.QUAD_MIN_STEPS.update(_QUAD)
    try:
        env, E = tabor_env(T + 1, "numpy", "float32", T, 0.99, 0.95, "bool", "float32")
        ns1, ns2 = run_both(TABOR, env, vectorized=T >= _QUAD["numpy"])
        compare(ns1, ns2, "advantage", lambda old: tolerance(E, 0.99 * 0.95, 0, np.float32, old, np.float32))
        env = dict(gamma=0.9, rewards=torch.randn(T))
        ns1, ns2 = run_both(POWER_APPEND, env, vectorized=T >= _QUAD["torch"])
        compare(ns1, ns2, "returns", lambda old: tolerance(as64(env["rewards"]), 0.9, 0, np.float32, old, np.float32))
    finally:
        vectorized_mod.QUAD_MIN_STEPS.update(saved)


# ------------------------------------------------------------------ Phil Tabor's PPO, verbatim, as a method

PPO = """\
import numpy as np
import torch as T


class PPOMemory:
    def __init__(self, batch_size):
        self.states = []
        self.probs = []
        self.vals = []
        self.actions = []
        self.rewards = []
        self.dones = []

        self.batch_size = batch_size

    def generate_batches(self):
        n_states = len(self.states)
        batch_start = np.arange(0, n_states, self.batch_size)
        indices = np.arange(n_states, dtype=np.int64)
        np.random.shuffle(indices)
        batches = [indices[i:i+self.batch_size] for i in batch_start]

        return np.array(self.states),\\
                np.array(self.actions),\\
                np.array(self.probs),\\
                np.array(self.vals),\\
                np.array(self.rewards),\\
                np.array(self.dones),\\
                batches

    def store_memory(self, state, action, probs, vals, reward, done):
        self.states.append(state)
        self.actions.append(action)
        self.probs.append(probs)
        self.vals.append(vals)
        self.rewards.append(reward)
        self.dones.append(done)


class Agent:
    def __init__(self, actor, gamma=0.99, gae_lambda=0.95, batch_size=64, n_epochs=2):
        self.gamma = gamma
        self.gae_lambda = gae_lambda
        self.n_epochs = n_epochs
        self.actor = actor
        self.memory = PPOMemory(batch_size)
        self.seen = []

    def learn(self):
        for _ in range(self.n_epochs):
            state_arr, action_arr, old_prob_arr, vals_arr,\\
            reward_arr, dones_arr, batches = \\
                    self.memory.generate_batches()

            values = vals_arr
            advantage = np.zeros(len(reward_arr), dtype=np.float32)

            for t in range(len(reward_arr)-1):
                discount = 1
                a_t = 0
                for k in range(t, len(reward_arr)-1):
                    a_t += discount*(reward_arr[k] + self.gamma*values[k+1]*\\
                            (1-int(dones_arr[k])) - values[k])
                    discount *= self.gamma*self.gae_lambda
                advantage[t] = a_t
            advantage = T.tensor(advantage).to(self.actor.device)

            values = T.tensor(values).to(self.actor.device)
            self.seen.append((advantage, values, batches, t, k, a_t, discount))
"""


def test_phil_tabor_ppo_verbatim():
    out, sites = rewrite(PPO)
    (site,) = [s for s in sites if s.action != SKIPPED]
    assert site.action == REWRITTEN and site.exactness == REASSOCIATED
    assert (site.line, site.end_line) == (PPO.splitlines().index("            for t in range(len(reward_arr)-1):") + 1,
                                          PPO.splitlines().index("                advantage[t] = a_t") + 1)
    assert "quadratic_ok(" in out and "linear_recurrence(" in out
    saved = dict(vectorized_mod.QUAD_MIN_STEPS)
    vectorized_mod.QUAD_MIN_STEPS.update(_QUAD)  # the thresholds users get
    try:
        rng = np.random.default_rng(3)
        T = 100
        rows = [(rng.normal(size=4), int(rng.integers(2)), float(rng.normal()), float(rng.normal()),
                 float(rng.normal()), bool(rng.random() < 0.05)) for _ in range(T)]
        seen = []
        for code in (PPO, out):
            ns = harness.load(code)
            agent = ns["Agent"](types.SimpleNamespace(device="cpu"))
            for row in rows:
                agent.memory.store_memory(*row)
            np.random.seed(0)
            with harness.spy(vectorized_mod, "quadratic_ok") as answers:
                agent.learn()
            seen.append((agent.seen, answers))
    finally:
        vectorized_mod.QUAD_MIN_STEPS.update(saved)
    (orig, no_calls), (new, answers) = seen
    assert no_calls == [] and answers == [True, True]
    r = np.array([row[4] for row in rows])
    v = np.array([row[3] for row in rows])
    d = np.array([row[5] for row in rows])
    E = r[:-1] + 0.99 * v[1:] * (1 - d[:-1]) - v[:-1]
    for a, b in zip(orig, new):
        adv1, adv2 = a[0], b[0]
        assert adv1.dtype == adv2.dtype == torch.float32 and adv1.shape == adv2.shape == (T,)
        tol = tolerance(E, 0.99 * 0.95, 0, np.float64, adv1.double().numpy(), np.float32)
        torch.testing.assert_close(adv2, adv1, rtol=0, atol=float(tol.max()))
        np.testing.assert_array_less((adv2 - adv1).abs().double().numpy(), tol)
        assert adv2[-1] == 0  # never written, by the loop or the rewrite
        bits(a[1], b[1], "values")
        bits(a[3:], b[3:], "t, k, a_t, discount")


# ------------------------------------------------------------------ which loops are rewritten, which are left alone

REWRITTEN_FORMS = [
    TABOR,
    DELTA_FIRST,
    POWER_APPEND,
    REINFORCE,
    PLAIN,
    # the term written after the discount, the discount updated by an assignment
    "for t in range(0, n):\n    s = 0.0\n    d = 1.0\n    for k in range(t, n):\n        s = s + r[k] * d\n"
    "        d = d * gamma\n    out[t] = s\n",
    # a power on the right, torch-style size(0) bound, attributes
    "for t in range(self.r.size(0)):\n    acc = 0\n    for j in range(t, self.r.size(0)):\n"
    "        acc += self.r[j] * self.gamma ** (j - t)\n    self.ret[t] = acc\n",
]


@pytest.mark.parametrize("src", REWRITTEN_FORMS, ids=range(len(REWRITTEN_FORMS)))
def test_matching_forms_are_rewritten(src):
    out, sites = rewrite(src)
    assert [(s.action, s.exactness) for s in sites] == [(REWRITTEN, REASSOCIATED)], [s.describe() for s in sites]
    harness.compiled(out, "new")
    again, sites2 = rewrite(out)  # the loop kept in the else branch is not rewritten again
    assert again == out and not any(s.action == REWRITTEN for s in sites2)


def test_the_documented_bound_is_not_vacuous():
    """A rewrite that dropped the exponent offset (discount multiplied before use) would differ from
    the loop by far more than the stated bound: the tolerance can fail."""
    rng = np.random.default_rng(4)
    T = 30
    r, v, d = rng.normal(size=T), rng.normal(size=T + 1), np.zeros(T)
    E = r + 0.9 * v[1:] * (1 - d) - v[:-1]
    env = dict(T=T, gamma=0.9, lam=0.95, rewards=r, values=v, dones=d, adv=np.zeros(T))
    ns1, _ = run_both(DELTA_FIRST, env, vectorized=True)
    s, wrong = 0.0, np.zeros(T)
    for k in reversed(range(T)):
        s = E[k] + 0.9 * 0.95 * s
        wrong[k] = s
    with pytest.raises(AssertionError):
        close(ns1["adv"], wrong, tolerance(E, 0.9 * 0.95, 1, np.float64, ns1["adv"], np.float64), "adv")


LOOK_ALIKES = [
    ("for t in range(T):\n    s = 0\n    d = 1\n    for k in range(t + 1, T):\n        s += d * r[k]\n"
     "        d *= gamma\n    out[t] = s\n", "starts at `t + 1`, not at `t`"),
    ("s = 0\nfor t in range(T):\n    d = 1\n    for k in range(t, T):\n        s += d * r[k]\n"
     "        d *= gamma\n    out[t] = s\n", "`s` is not reset before the inner loop"),
    ("d = 1\nfor t in range(T):\n    s = 0\n    for k in range(t, T):\n        s += d * r[k]\n"
     "        d *= gamma\n    out[t] = s\n", "discount `d` is not reset for each `t`"),
    ("for t in range(T):\n    s = 0\n    d = 1\n    for k in range(t, T):\n        s += d * r[k]\n"
     "        d *= gamma * (1 - dones[k])\n    out[t] = s\n", "changes with `k`"),
    ("for t in range(T):\n    s = 0\n    d = 1\n    for k in range(t, T):\n        s += d * r[k]\n"
     "        d *= gamma\n        if dones[k]:\n            break\n    out[t] = s\n", "episode-truncated sum"),
    ("for t in range(T):\n    s = 0\n    d = 1\n    for k in range(t, T):\n        s += d * r[k]\n"
     "        d *= gamma\n        break\n    out[t] = s\n", "`break` in the inner loop"),
    ("for t in range(T):\n    s = 0\n    d = 1\n    for k in range(t, T):\n        s += d * r[k]\n"
     "        d *= gamma\n    out[t] = s\n    continue\n", "`continue` in the outer loop"),
    ("def f(r, T, gamma, out):\n    for t in range(T):\n        s = 0\n        for k in range(t, T):\n"
     "            s += gamma ** (k - t) * r[k]\n            return s\n        out[t] = s\n", "`return` in the inner loop"),
    ("def f(r, T, gamma, out):\n    for t in range(T):\n        s = 0\n        for k in range(t, T):\n"
     "            s += gamma ** (k - t) * r[k]\n            if s > 10:\n                return out\n"
     "        out[t] = s\n", "conditional `if s > 10:` in the inner loop"),
    ("for t in range(T):\n    s = 0\n    d = 1\n    for k in range(t, T):\n        s += d * (r[k] - v[t])\n"
     "        d *= gamma\n    out[t] = s\n", "reads the outer index `t`"),
    ("for t in range(T):\n    s = 0\n    d = 1\n    for k in range(t, T):\n        s += d * norm(r[k])\n"
     "        d *= gamma\n    out[t] = s\n", "calls `norm()`"),
    ("for t in range(T):\n    s = 0\n    d = 1\n    for k in range(t, T):\n        log.append(r[k])\n"
     "        s += d * r[k]\n        d *= gamma\n    out[t] = s\n", "calls `log.append()`"),
    ("for t in range(T):\n    s = 1\n    d = 1\n    for k in range(t, T):\n        s += d * r[k]\n"
     "        d *= gamma\n    out[t] = s\n", "starts each sum at `1`, not 0"),
    ("for t in range(T):\n    s = 0\n    d = 0.5\n    for k in range(t, T):\n        s += d * r[k]\n"
     "        d *= gamma\n    out[t] = s\n", "starts at `0.5`, not 1"),
    ("for t in range(T):\n    s = 0\n    for k in range(t, T):\n        s += gamma ** (k - t - 1) * r[k]\n"
     "    out[t] = s\n", "exponent is `(k - t - 1)`, not `k - t`"),
    ("for t in range(T):\n    s = 0\n    d = 1\n    for k in range(t, min(t + H, T)):\n        s += d * r[k]\n"
     "        d *= gamma\n    out[t] = s\n", "depends on `t`"),
    ("for t in range(T):\n    s = 0\n    d = 1\n    for k in range(t, T):\n        s += d * x\n"
     "        x = r[k]\n        d *= gamma\n    out[t] = s\n", "`x` is read before it is assigned"),
    ("for t in range(T):\n    s = 0\n    d = 1\n    for k in range(t, T):\n        s += d * r[k]\n"
     "        d *= gamma\n    out[t] = s / T\n", "after the inner loop"),
    ("for t in range(T):\n    s = 0\n    d = 1\n    for k in range(t, T):\n        s += d * (r[k] + out[k])\n"
     "        d *= gamma\n    out[t] = s\n", "which the loop writes"),
    ("for t in range(T):\n    s = 0\n    d = 1\n    for k in range(t, T):\n        s += d * r[k]\n"
     "        d *= gamma\n        out[k] = s\n    out[t] = s\n", "the inner loop writes `out[k]`"),
    ("for t in range(T):\n    s = 0\n    d = 1\n    for k in range(t, T):\n        s += d * r[k] * k\n"
     "        d *= gamma\n    out[t] = s\n", "uses the loop index `k` as a value"),
    ("returns = []\nfor t in range(n):\n    G = 0\n    for k in range(t, len(returns) + n):\n"
     "        G += gamma ** (k - t) * r[k]\n    returns.append(G)\n", "reads `returns`, which the loop writes"),
    ("for t in reversed(range(T)):\n    s = 0\n    for k in range(t, T):\n        s += gamma ** (k - t) * r[k]\n"
     "    out[t] = s\n", "only `range(T)` is understood"),
]


@pytest.mark.parametrize("src,reason", LOOK_ALIKES, ids=[r for _, r in LOOK_ALIKES])
def test_look_alikes_are_left_alone(src, reason):
    out, sites = rewrite(src)
    assert out == src  # byte for byte
    assert not any(s.action == REWRITTEN for s in sites)
    assert any(s.action == SKIPPED and reason in s.reason for s in sites), [s.describe() for s in sites]


def test_reassociation_off_leaves_the_loop():
    out, sites = rewrite(TABOR, reassociate=False)
    assert out == TABOR
    assert any("reassociation is off" in s.reason for s in sites), [s.describe() for s in sites]


def test_shadowed_builtin_leaves_the_loop():
    src = "def int(x):\n    return 1\n\n\n" + TABOR
    out, sites = rewrite(src)
    assert out == src and any("rebinds `int`" in s.reason for s in sites)


def test_examples_cover_quadratic_forms():
    quad = [ex for ex in VectorizeRecurrence.EXAMPLES if "for k in range(t," in ex.code]
    assert {ex.rewritten for ex in quad} == {True, False}
    for ex in quad:
        out, sites = rewrite(ex.code)
        if ex.rewritten:
            assert any(s.action == REWRITTEN and s.exactness == REASSOCIATED for s in sites)
        else:
            assert out == ex.code and any(ex.reason in s.reason for s in sites), [s.describe() for s in sites]


def test_rewritten_code_reads_well():
    out, _ = rewrite(TABOR)
    assert "# t = 0 .. T - 2: the sums over k >= t as one backward recurrence" in out
    assert "reward_arr_v[0:T] + self.gamma * values_v[1:T + 1] * (1 - dones_arr_m[0:T]) - values_v[0:T]" in out
    assert "linear_recurrence((self.gamma * self.gae_lambda), a_t_b)" in out
    assert "advantage[0:T - 1] = _sbx.to_rank(a_t_seq[0:T - 1], advantage)" in out
    assert "    t = T - 1\n    discount = 1\n" in out
    assert out.rstrip().endswith("advantage[t] = a_t")
