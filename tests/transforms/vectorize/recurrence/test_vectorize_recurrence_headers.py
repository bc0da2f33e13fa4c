"""Backward headers found in public RL code beyond the first forms: ``range(T)[::-1]``,
``sorted(range(T), reverse=True)`` (rewritten, original vs rewrite bitwise on random inputs), and a
forward range walking backward through a computed index ``idx = T - 1 - i`` (a site with its
reason, the file untouched); look-alikes that walk forward or by another stride left alone.
"""
from __future__ import annotations

import ast

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from scalebox_cst.report import EXACT, REWRITTEN, SKIPPED
from scalebox_cst.runtime import vectorized as vectorized_mod
from scalebox_cst.transforms.vectorize.recurrence import backward
from scalebox_cst.transforms.vectorize.recurrence.candidates import _coefficient

import harness
from differential import HYP, dtypes, same_namespaces, tensor
from recurrence_harness import rewrite, run_both

_MIN_STEPS = dict(vectorized_mod.MIN_STEPS)


def setup_module(module):
    # vectorize from 2 steps on, so that short random sequences exercise the vectorized branch
    vectorized_mod.MIN_STEPS.update({k: 2 for k in _MIN_STEPS})


def teardown_module(module):
    vectorized_mod.MIN_STEPS.update(_MIN_STEPS)


def loop_line(src: str) -> int:
    return next(n.lineno for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.For, ast.While)))


# --------------------------------------------------------------------------- range(T)[::-1], sorted(...)

RETURNS = """\
import torch
out = torch.zeros_like(rewards)
g = torch.zeros_like(rewards[0])
for t in HEADER:
    g = rewards[t] + gamma * (1.0 - dones[t]) * g
    out[t] = g
"""

HEADERS = ["range(T)[::-1]", "range(0, T)[::-1]", "sorted(range(T), reverse=True)",
           "sorted(range(0, T), reverse=True)"]


@pytest.mark.parametrize("header", HEADERS)
@HYP
@given(T=st.integers(min_value=0, max_value=40), N=st.integers(min_value=1, max_value=3), dtype=dtypes,
       seed=st.integers(0, 2**16))
def test_backward_range_headers_bitwise(header, T, N, dtype, seed):
    src = RETURNS.replace("HEADER", header)
    env = {"rewards": tensor(seed, (T, N), dtype), "dones": tensor(seed + 1, (T, N), dtype, "dones"),
           "gamma": 0.97, "T": T}
    ns1, ns2 = run_both(src, env, EXACT, vectorized=T >= 2)
    same_namespaces(ns1, ns2)


@pytest.mark.parametrize("header", HEADERS)
def test_backward_range_headers_sites(header):
    src = RETURNS.replace("HEADER", header)
    out, sites = rewrite(src)
    assert [(s.line, s.action, s.exactness) for s in sites] == [(loop_line(src), REWRITTEN, EXACT)]
    assert f"for t in {header}:" in out  # the original loop kept as the fallback


@pytest.mark.parametrize("header", ["range(T)[::-1]", "sorted(range(T), reverse=True)"])
def test_backward_range_headers_t_not_an_int(header):
    """range(2.0) raises in the original; the rewrite raises alike."""
    src = RETURNS.replace("HEADER", header)
    env = {"rewards": tensor(1, (3, 2), torch.float32), "dones": tensor(2, (3, 2), torch.float32, "dones"),
           "gamma": 0.9, "T": 2.0}
    run_both(src, env, EXACT, vectorized=False)


#: walk forward, by another stride, or over another range: never rewritten; (snippet, reason start
#: or None for no site at all)
LOOKALIKES = [
    ("range(T)[::-2]", "backward loop over `range(T)[::-2]`: header not recognised"),
    ("range(1, T)[::-1]", "backward loop over `range(1, T)[::-1]`: header not recognised"),
    ("range(T)[::1]", None),
    ("sorted(range(T))", None),
    ("sorted(range(T), reverse=False)", None),
    ("sorted(range(T), reverse=flag)", None),
    ("sorted(steps, reverse=True)", None),
    ("sorted(range(T), key=abs, reverse=True)", "backward loop over `sorted(range(T), key=abs, reverse=True)`"),
]


@pytest.mark.parametrize("header,reason", LOOKALIKES)
def test_backward_range_lookalikes_left_alone(header, reason):
    src = RETURNS.replace("HEADER", header)
    out, sites = rewrite(src)
    assert out == src
    if reason is None:
        assert sites == []
    else:
        assert [(s.line, s.action) for s in sites] == [(loop_line(src), SKIPPED)]
        assert sites[0].reason.startswith(reason), sites[0].reason


def test_rebound_sorted_is_left_alone():
    src = "def sorted(x, reverse=False):\n    return list(x)\n\n\n" + RETURNS.replace("HEADER", "sorted(range(T), reverse=True)")
    out, sites = rewrite(src)
    assert out == src
    assert [s.action for s in sites] == [SKIPPED] and "sorted" in sites[0].reason


def test_rebound_sorted_does_not_name_itself_for_other_headers():
    src = "def sorted(x):\n    return list(x)\n\n\n" + RETURNS.replace("HEADER", "range(T - 1, 0, -1)")
    _, sites = rewrite(src)
    assert [s.action for s in sites] == [SKIPPED] and "rebound" not in sites[0].reason, sites[0].reason


def test_walks_backward_sorted():
    yes = ["sorted(range(n), reverse=True)", "sorted(range(0, n), reverse=True)"]
    no = ["sorted(range(n))", "sorted(x, reverse=True)", "sorted(range(n), reverse=False)"]
    assert [t for t in yes if not backward.walks_backward(ast.parse(t, mode="eval").body)] == []
    assert [t for t in no if backward.walks_backward(ast.parse(t, mode="eval").body)] == []


# --------------------------------------------------------------------------- computed backward index

COMPUTED = """\
def returns(rewards, gamma, out, T, x):
    for i in range(BOUND):
        idx = INDEX
        out[idx] = rewards[idx] + gamma * out[idx + 1]
    return out
"""


@pytest.mark.parametrize("bound,index", [
    ("T", "T - 1 - i"), ("T", "T - i - 1"), ("len(x)", "len(x) - 1 - i"), ("T", "-i + T - 1"),
    ("T", "T - (i + 1)"), ("0, T", "(T - 1) - i"), ("T", "T - 1 - 2 * i + i"),
])
def test_computed_backward_index_gets_a_site(bound, index):
    src = COMPUTED.replace("BOUND", bound).replace("INDEX", index)
    out, sites = rewrite(src)
    assert out == src
    assert [(s.line, s.action) for s in sites] == [(loop_line(src), SKIPPED)]
    assert sites[0].reason.startswith(f"backward walk through a computed index (`idx = {ast.unparse(ast.parse(index))}`"), \
        sites[0].reason


@pytest.mark.parametrize("bound,index", [
    ("T", "i + 1"), ("T", "T - 1"), ("T", "T - 1 - 2 * i"), ("T", "i * i"), ("T", "T - i // 1"),
    ("0, T, 2", "T - 1 - i"),
])
def test_computed_index_lookalikes_get_no_site(bound, index):
    src = COMPUTED.replace("BOUND", bound).replace("INDEX", index)
    out, sites = rewrite(src)
    assert out == src and sites == [], [s.describe() for s in sites]


@pytest.mark.parametrize("store", ["out[T - 1 - i]", "out[len(x) - i - 1]", "out[T - 1 - i, 0]", "out[:, T - i - 1]"])
def test_inline_computed_backward_index_gets_a_site(store):
    src = (f"def f(r, g, out, T, x):\n    for i in range(T):\n        {store} = r[T - 1 - i] + g * out[T - i]\n"
           "    return out\n")
    out, sites = rewrite(src)
    assert out == src
    assert [(s.line, s.action) for s in sites] == [(2, SKIPPED)]
    assert sites[0].reason.startswith(f"backward walk through a computed index (`{store}` written"), sites[0].reason


@pytest.mark.parametrize("store", ["out[i]", "out[2 * i]", "out[T - 1 - i, i]", "out[f(i) - i]", "out[T - 1 - i:]",
                                   "out[s[i], a[i]]", "out[s[i], T - 1 - i]", "out[f(i), g(i)]"])
def test_inline_index_lookalikes_get_no_site(store):
    src = f"def f(r, out, T):\n    for i in range(T):\n        {store} = r[T - 1 - i]\n    return out\n"
    out, sites = rewrite(src)
    assert out == src and sites == [], [s.describe() for s in sites]


def test_subscripts_by_values_read_per_step_get_no_site():
    """MushroomRL's Table: ``self[state[i], action[i]]`` indexes by two non-affine parts (the
    check once sorted their coefficients, None among them, and the transform failed the file)."""
    src = ("def f(self, state, action, q):\n    for i in range(len(state)):\n        val = self[state[i], action[i]]\n"
           "        q[i] = val\n    for i in range(len(state)):\n        q[state[i], action[i]] = self[state[i], :]\n")
    out, sites = rewrite(src)
    assert out == src and sites == [], [s.describe() for s in sites]


def test_computed_index_not_used_as_an_index_gets_no_site():
    src = "def f(T, log):\n    for i in range(T):\n        j = T - 1 - i\n        log.append(j)\n"
    out, sites = rewrite(src)
    assert out == src and sites == []


@given(a=st.integers(-3, 3), b=st.integers(-3, 3), c=st.integers(-5, 5), i=st.integers(-10, 10),
       n=st.integers(-10, 10))
def test_coefficient_matches_evaluation(a, b, c, i, n):
    """The coefficient read from the syntax is the slope of the expression's values."""
    text = f"{a} * i + n * {b} - ({c} - i)"
    e = ast.parse(text, mode="eval").body
    k = _coefficient(e, "i")
    assert k == a + 1
    f = eval(compile(ast.Expression(e), "c", "eval"), {"n": n, "i": i})  # noqa: S307
    g = eval(compile(ast.Expression(e), "c", "eval"), {"n": n, "i": i + 1})  # noqa: S307
    assert g - f == k


# --------------------------------------------------------------------------- zip of call chains

ZIPPED = """\
adv = []
a = 0.0
for delta, done in zip(deltas[::-1], x.cpu().flatten().numpy()[::-1]):
    a = delta + gamma * (1.0 - done) * a
    adv.append(a)
"""


@HYP
@given(T=st.integers(min_value=0, max_value=40), seed=st.integers(0, 2**16), dtype=dtypes,
       mixed=st.booleans())
def test_zip_of_a_call_chain_bitwise(T, seed, dtype, mixed):
    deltas = tensor(seed, (T,), dtype).numpy()
    dones = tensor(seed + 1, (T, 1), dtype, "dones")
    # mixed float dtypes: the guard declines and the loop runs (on the same objects)
    env = {"deltas": deltas, "gamma": 0.97, "x": dones.double() if mixed and dtype == torch.float32 else dones}
    ns1, ns2 = run_both(ZIPPED, env, EXACT, vectorized=T >= 2 and not (mixed and dtype == torch.float32))
    same_namespaces(ns1, ns2)


def test_zip_of_a_call_chain_site():
    out, sites = rewrite(ZIPPED)
    assert [(s.line, s.action, s.exactness) for s in sites] == [(loop_line(ZIPPED), REWRITTEN, EXACT)]
    assert "zip's arguments evaluated once before the guard" in sites[0].details["contracts"]["hoisted"]["checks"][0]
    assert "`x.cpu().flatten().numpy()` into `zipped`" in sites[0].reason
    lines = out.splitlines()
    at = lines.index("zipped = x.cpu().flatten().numpy()")
    assert lines[at - 1] == "a = 0.0" and lines[at + 1].startswith("if ")
    assert out.count("x.cpu()") == 1  # evaluated in one place, before the guard
    assert "    for delta, done in zip(deltas[::-1], zipped[::-1]):" in lines
    again, sites2 = rewrite(out)
    assert again == out and all(s.action == SKIPPED for s in sites2)


class Tracked:
    """A tensor whose conversions log each call (to count and order the evaluations)."""

    def __init__(self, log, values):
        self.log, self.values = log, values

    def cpu(self):
        self.log.append("cpu")
        return self

    def flatten(self):
        self.log.append("flatten")
        return self

    def numpy(self):
        self.log.append("numpy")
        return self.values


@pytest.mark.parametrize("case", ["vectorized", "fallback", "raises"])
def test_zip_arguments_evaluated_once_in_order(case):
    out, _ = rewrite(ZIPPED)
    rng = np.random.default_rng(3)
    deltas = rng.standard_normal(9)
    deltas = {"vectorized": deltas, "fallback": deltas.astype(np.float32), "raises": ["not a number"] * 9}[case]
    dones = (rng.random(9) < 0.2).astype(np.float64)
    runs = []
    for code in (ZIPPED, out):
        log: list = []
        ns = {"deltas": deltas, "gamma": 0.9, "x": Tracked(log, dones)}
        with harness.spy(vectorized_mod, "recurrence_ok") as answers:
            err = harness.outcome(code, ns, "snippet")
        runs.append((log, err, ns.get("adv")))
    assert (True in answers) == (case == "vectorized"), answers  # the rewrite's run
    (log1, err1, adv1), (log2, err2, adv2) = runs
    assert log1 == log2 == ["cpu", "flatten", "numpy"]
    assert err1 == err2 == (TypeError if case == "raises" else None)
    if case != "raises":
        assert adv1 == adv2


HOIST_LOOKALIKES = [
    # a call that may have effects (not in the purity table): not hoisted, the header not recognised
    ("zip(deltas[::-1], compute(x)[::-1])", "backward loop over `zip(deltas[::-1], compute(x)[::-1])`: header not recognised"),
    ("zip(deltas[::-1], x.numpy().sort()[::-1])", "header not recognised"),
    ("zip(deltas[::-1], x.cpu().numpy(out)[::-1])", "header not recognised"),
    ("zip(deltas[::-1], x.reshape(shape())[::-1])", "header not recognised"),
    ("zip(deltas[::-1], self.flatten()[::-1])", "header not recognised"),
    # not a backward walk of the chain
    ("zip(deltas[::-1], x.cpu().numpy()[::2])", "header not recognised"),
    ("zip(deltas, x.cpu().numpy())", None),
]


@pytest.mark.parametrize("header,reason", HOIST_LOOKALIKES)
def test_zip_lookalikes_not_hoisted(header, reason):
    src = "def f(self, deltas, x, gamma, compute, shape, out):\n" + "".join(
        "    " + ln + "\n" for ln in ZIPPED.replace(
            "zip(deltas[::-1], x.cpu().flatten().numpy()[::-1])", header).splitlines())
    out, sites = rewrite(src)
    assert out == src
    if reason is None:
        assert sites == []
    else:
        assert [s.action for s in sites] == [SKIPPED] and reason in sites[0].reason, sites[0].reason


def test_zip_of_reversed_call_chain():
    src = ZIPPED.replace("zip(deltas[::-1], x.cpu().flatten().numpy()[::-1])",
                         "zip(reversed(deltas), reversed(x.view(-1)))")
    out, sites = rewrite(src)
    assert [s.action for s in sites] == [REWRITTEN]
    assert "zipped = x.view(-1)\n" in out and "zip(reversed(deltas), reversed(zipped))" in out
    for T in (0, 1, 2, 7):
        env = {"deltas": tensor(T, (T,), torch.float64), "gamma": 0.9, "x": tensor(T + 1, (T, 1), torch.float64, "dones")}
        ns1, ns2 = run_both(src, env, EXACT, vectorized=T >= 2)
        same_namespaces(ns1, ns2)


# --------------------------------------------------------------------------- HF Deep RL course REINFORCE

REINFORCE = """\
from collections import deque


def returns_of(rewards, gamma, n_steps):
    returns = deque(maxlen=n_steps)
    for t in HEADER:
        disc_return_t = (returns[0] if len(returns) > 0 else 0)
        returns.appendleft(gamma * disc_return_t + rewards[t])
    return returns
"""


@pytest.mark.parametrize("header", ["range(n_steps)[::-1]", "reversed(range(n_steps))"])
def test_reinforce_deque_read_back_left_alone_with_its_reason(header):
    """The read-back through a conditional expression is not understood (the first step's
    ``len(returns) > 0`` decided as written, the others' only if every step appends): left
    alone, with the temporary named."""
    src = REINFORCE.replace("HEADER", header)
    out, sites = rewrite(src)
    assert out == src
    assert [(s.line, s.action) for s in sites] == [(loop_line(src), SKIPPED)]
    assert sites[0].reason.startswith("reads `returns[0]` in `disc_return_t = (returns[0] if len(returns) > 0 else 0)`")
    assert "through a temporary" in sites[0].reason


# --------------------------------------------------------------------------- zip of reversed slices

# TD(lambda) returns over a value list one longer than the rewards: each step reads the value of
# its state and of the next one through two shifted slices of one sequence
ZIP_SLICES = """\
def gae(values, rewards, masks, gamma, lam):
    adv = []
    gae = 0.0
    for v, next_v, r, m in zip(reversed(values[:-1]), reversed(values[1:]), reversed(rewards), reversed(masks)):
        delta = r + gamma * next_v * m - v
        gae = delta + gamma * lam * m * gae
        adv.insert(0, gae)
    return adv, gae

out = gae(values, rewards, masks, 0.99, 0.95)
"""

ZIP_SLICES_ITEMS = """\
def lambda_returns(values, rewards, items, gamma, lam):
    returns = []
    ret = values[-1]
    for v, next_v, it in zip(reversed(values[:-1]), reversed(values[1:]), reversed(items[:-1])):
        ret = it + gamma * ((1 - lam) * next_v + lam * ret)
        returns.append(ret)
    return returns[::-1], ret

out = lambda_returns(values, rewards, items, 0.99, 0.95)
"""


def _seq(kind, seed, n, dtype, what="normal"):
    t = tensor(seed, (n,), dtype, what)
    return {"torch": t, "numpy": t.numpy(), "list": [float(x) for x in t]}[kind]


@HYP
@given(T=st.integers(min_value=0, max_value=40), seed=st.integers(0, 2**16), dtype=dtypes,
       kind=st.sampled_from(["torch", "numpy", "list"]), extra=st.sampled_from([0, 0, 1]))
def test_zip_of_reversed_slices_bitwise(T, seed, dtype, kind, extra):
    """``extra``: a sequence one longer than the others (zip of reversed sequences pairs them from
    their ends: the guard takes the loop)."""
    env = {"values": _seq(kind, seed, T + 1, dtype), "rewards": _seq(kind, seed + 1, T + extra, dtype),
           "masks": _seq(kind, seed + 2, T, dtype, "dones")}
    ns1, ns2 = run_both(ZIP_SLICES, env, EXACT, vectorized=T >= 2 and not extra)
    same_namespaces(ns1, ns2)


@HYP
@given(T=st.integers(min_value=0, max_value=40), seed=st.integers(0, 2**16), dtype=dtypes,
       kind=st.sampled_from(["torch", "numpy"]))
def test_zip_of_reversed_slices_reassociated(T, seed, dtype, kind):
    env = {"values": _seq(kind, seed, T + 1, dtype), "rewards": None, "items": _seq(kind, seed + 1, T + 1, dtype)}
    ns1, ns2 = run_both(ZIP_SLICES_ITEMS, env, "reassociated", vectorized=T >= 2)
    same_namespaces(ns1, ns2, exact=False)


def test_zip_of_reversed_slices_site():
    out, sites = rewrite(ZIP_SLICES)
    assert [(s.action, s.exactness) for s in sites] == [(REWRITTEN, EXACT)]
    assert "`values[:-1]` into `zipped`" in sites[0].reason and "`values[1:]` into `zipped_2`" in sites[0].reason
    assert out.count("values[:-1]") == 1 and out.count("values[1:]") == 1  # evaluated once, before the guard


@pytest.mark.parametrize("header", [
    "zip(reversed(values[:n()]), reversed(values[1:]), reversed(rewards), reversed(masks))",  # a call in a bound
    "zip(reversed(values[[0, 1]]), reversed(values[1:]), reversed(rewards), reversed(masks))",  # not a slice
    "zip(reversed(values[:-1]), reversed(values[1:]), reversed(rewards), reversed(masks + m))",
])
def test_zip_of_reversed_slices_lookalikes_not_hoisted(header):
    src = ZIP_SLICES.replace(
        "zip(reversed(values[:-1]), reversed(values[1:]), reversed(rewards), reversed(masks))", header
    ).replace("gamma, lam):", "gamma, lam, n=len, m=0):")
    out, sites = rewrite(src)
    assert out == src
    assert [s.action for s in sites] == [SKIPPED] and "header not recognised" in sites[0].reason, sites
