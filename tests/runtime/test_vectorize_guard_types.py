"""Guards and the types real code passes (issue 9, items 1-4): a rewritten site gives what the
loop gives, value and type, for every input it accepts, and accepts the common ones.

- the carried start value decides the loop's arithmetic (an ``np.float32`` start makes a loop
  over Python floats compute in float32): checked after the first step (``carry_ok``), the other
  steps run as written when it is not what the vectorized steps compute with;
- two writes into one list per step are not two ``extend`` calls (that reorders the list);
- ``np.matrix``, ``np.ma`` arrays and tensor subclasses are not arrays to a guard (exact types);
- Python ``bool`` / ``int`` / ``np.bool_`` flags and lists of numpy scalars are vectorized where
  the result stays exact (float64 maths), and fall back where it would not.
"""
import contextlib
import copy
import random
import sys
import types

import numpy as np
import pytest
import torch

from scalebox_cst.report import EXACT, REWRITTEN, SKIPPED
from scalebox_cst.runtime import loop_batch, target_update
from scalebox_cst.runtime import vectorized as vectorized_mod

from corpus_harness import Sub, Trace, same
import harness

_MIN = dict(vectorized_mod.MIN_STEPS)


def setup_module(module):
    vectorized_mod.MIN_STEPS.update({k: 2 for k in _MIN})


def teardown_module(module):
    vectorized_mod.MIN_STEPS.update(_MIN)


def rewrite(src, transform="vectorize.recurrence"):
    return harness.rewrite(src, transform, dedent=False)


def clone(env):
    def one(v):
        if isinstance(v, types.ModuleType):
            return v
        if isinstance(v, torch.Tensor) and type(v) is not torch.nn.Parameter:
            return v.clone()  # a subclass stays one (deepcopy refuses plain subclasses)
        return copy.deepcopy(v)

    return {k: one(v) for k, v in env.items()}


def run_both(src, env, transform="vectorize.recurrence", exact=True):
    """Exec the original and the rewrite on deep copies of ``env``: (original ns, rewritten ns, trace)."""
    new, sites = rewrite(src, transform)
    assert any(s.action == REWRITTEN for s in sites), [s.describe() for s in sites]
    trace = Trace()

    @contextlib.contextmanager
    def traced_with_a_deadline():
        with harness.deadline(20, lambda: TimeoutError("the rewritten code did not finish")):
            sys.setprofile(trace)
            try:
                yield
            finally:
                sys.setprofile(None)

    ns1, ns2 = harness.run_pair(src, new, env, clone=clone, around_rewrite=traced_with_a_deadline)
    for k in env:
        if not k.startswith("__"):
            same(ns1[k], ns2[k], exact, k)
    return ns1, ns2, trace


RETURNS_INSERT = """\
R = start
returns = []
for r in rewards[::-1]:
    R = r + gamma * R
    returns.insert(0, R)
"""

GAE_NUMPY = """\
T = len(rewards)
adv = np.zeros_like(rewards)
last = 0
for t in reversed(range(T)):
    nonterm = 1.0 - dones[t]
    delta = rewards[t] + gamma * values[t + 1] * nonterm - values[t]
    last = delta + gamma * lam * nonterm * last
    adv[t] = last
"""

CLEANRL_GAE = """\
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
"""

RETURNS_DONE = """\
R = 0.0
returns = []
for t in reversed(range(len(rewards))):
    R = rewards[t] + gamma * R * (1 - dones[t])
    returns.append(R)
"""


# ------------------------------------------------------------------ item 1: the carried start value


def test_float32_start_over_python_floats_stays_float32():
    """The issue's loop: 600 Python floats, start ``net(x).data.numpy()[0, 0]`` (np.float32). The
    loop computes in float32 and yields np.float32 items; so must the rewrite (it ran float64)."""
    rng = np.random.default_rng(0)
    start = torch.nn.Linear(3, 1)(torch.randn(1, 3)).data.numpy()[0, 0]
    assert type(start) is np.float32
    env = dict(rewards=[float(x) for x in rng.standard_normal(600)], start=start, gamma=0.99)
    ns1, ns2, trace = run_both(RETURNS_INSERT, env)
    assert type(ns2["returns"][0]) is np.float32
    assert ("carry_ok", False) in trace.calls  # the other steps ran as written


@pytest.mark.parametrize("start", [0, 0.0, 1.5, True])
def test_python_number_start_is_vectorized(start):
    env = dict(rewards=[float(x) for x in np.random.default_rng(1).standard_normal(50)], start=start, gamma=0.9)
    ns1, ns2, trace = run_both(RETURNS_INSERT, env)
    assert trace.vectorized()
    assert all(type(x) is float for x in ns2["returns"])


@pytest.mark.parametrize("start", [np.float64(0.5), np.array(0.5), np.array([0.5]), torch.tensor(0.5),
                                   np.float16(0.5), np.int64(2)])
def test_other_starts_give_the_loop_result(start):
    env = dict(rewards=[float(x) for x in np.random.default_rng(2).standard_normal(40)], start=start, gamma=0.9)
    run_both(RETURNS_INSERT, env)


@pytest.mark.parametrize("next_value", [torch.tensor([0.3, -0.2], dtype=torch.float64),
                                        np.float32(0.25), torch.tensor([[0.3, -0.2]])])
def test_special_cased_last_step_value_of_another_kind(next_value):
    """CleanRL's last step reads ``next_value``: a float64 one makes the float32 loop compute in
    float64 from there on (the guard never sees it; carry_ok does, after that step)."""
    g = torch.Generator().manual_seed(3)
    T = 30
    env = dict(torch=torch, T=T, rewards=torch.randn(T, 2, generator=g), values=torch.randn(T, 2, generator=g),
               dones=(torch.rand(T, 2, generator=g) < 0.2).float(), next_done=torch.zeros(2),
               next_value=next_value, gamma=0.99, lam=0.95)
    run_both(CLEANRL_GAE, env)


# ------------------------------------------------------------------ item 2: two writes per step


def test_two_appends_per_step_keep_the_list_order():
    src = """\
G = 0.0
out = []
for r in reversed(rewards):
    G = r + gamma * G
    out.append(G)
    out.append(-G)
"""
    new, sites = rewrite(src)
    site = [s for s in sites if s.transform == "vectorize.recurrence"][0]
    assert site.action == SKIPPED and "twice per step" in site.reason
    assert new == src


@pytest.mark.parametrize("kinds", [("insert", "insert"), ("append", "insert"), ("appendleft", "appendleft")])
def test_two_writes_into_one_container_are_skipped(kinds):
    a, b = kinds
    call = {"insert": "insert(0, {})", "append": "append({})", "appendleft": "appendleft({})"}
    src = ("from collections import deque\nG = 0.0\nout = deque()\nfor r in reversed(rewards):\n    G = r + gamma * G\n"
           f"    out.{call[a].format('G')}\n    out.{call[b].format('2 * G')}\n")
    new, sites = rewrite(src)
    assert [s.action for s in sites if s.transform == "vectorize.recurrence"] == [SKIPPED]


def test_writes_into_two_lists_are_still_vectorized():
    src = """\
G = 0.0
out, neg = [], []
for r in reversed(rewards):
    G = r + gamma * G
    out.append(G)
    neg.append(-G)
"""
    env = dict(rewards=[float(x) for x in np.random.default_rng(4).standard_normal(30)], gamma=0.9)
    ns1, ns2, trace = run_both(src, env)
    assert trace.vectorized()


# ------------------------------------------------------------------ item 3: exact array types


def _gae_env(kind, T=20):
    rng = np.random.default_rng(5)
    rewards = rng.standard_normal(T)
    values = rng.standard_normal(T + 1)
    dones = (rng.random(T) < 0.2).astype(np.float64)
    if kind == "matrix":  # column matrices, as np.matrix(...).T gives
        rewards, values, dones = np.matrix(rewards).T, np.matrix(values).T, np.matrix(dones).T
    elif kind == "ma":
        rewards = np.ma.masked_array(rewards, mask=rng.random(T) < 0.2)
        values = np.ma.masked_array(values, mask=rng.random(T + 1) < 0.2)
    return dict(np=np, rewards=rewards, values=values, dones=dones, gamma=0.99, lam=0.95)


@pytest.mark.parametrize("kind", ["matrix", "ma"])
def test_matrix_and_masked_inputs_give_the_loop_result(kind):
    """np.matrix made the rewritten GAE loop forever (as_row strips leading 1-dims of a matrix,
    which stays 2-D); masked arrays computed other values. Neither is an ndarray to a guard."""
    ns1, ns2, trace = run_both(GAE_NUMPY, _gae_env(kind))
    assert not trace.vectorized()


def test_plain_arrays_still_vectorized():
    ns1, ns2, trace = run_both(GAE_NUMPY, _gae_env("plain"))
    assert trace.vectorized()


def test_tensor_subclass_takes_the_loop_and_parameter_does_not():
    T = 12
    g = torch.Generator().manual_seed(6)
    base = dict(torch=torch, T=T, values=torch.randn(T, 2, generator=g), dones=torch.zeros(T, 2),
                next_done=torch.zeros(2), next_value=torch.zeros(2), gamma=0.99, lam=0.95)
    sub = dict(base, rewards=torch.randn(T, 2, generator=g).as_subclass(Sub))
    assert not run_both(CLEANRL_GAE, sub)[2].vectorized()
    with torch.no_grad():
        par = dict(base, rewards=torch.nn.Parameter(torch.randn(T, 2, generator=g)))
        assert run_both(CLEANRL_GAE, par)[2].vectorized()


def test_guards_refuse_subclasses_and_other_accumulator_dtypes():
    xs = torch.randn(5, 3)
    assert loop_batch.batch_zip([xs]) is not None
    assert loop_batch.batch_zip([xs.as_subclass(Sub)]) is None
    assert loop_batch.batch_zip([list(xs.as_subclass(Sub).unbind(0))]) is None
    assert loop_batch.batch_zip([xs], invariants=[torch.ones(3).as_subclass(Sub)]) is None
    assert loop_batch.batch_zip([xs], invariants=[np.float32(2.0)]) is None
    assert loop_batch.batch_zip([xs], accs=[torch.zeros(())]) is not None
    assert loop_batch.batch_zip([xs], accs=[torch.zeros((), dtype=torch.float64)]) is None  # sums in its precision
    assert loop_batch.batch_zip([xs], accs=[np.float32(0)]) is None
    assert loop_batch.batch_range(range(5), [xs], outs=[torch.zeros(5, 3).as_subclass(Sub)]) is None
    assert vectorized_mod.recurrence_ok(4, seqs=((np.matrix(np.ones((4, 1))), 0),)) is False
    assert vectorized_mod.recurrence_ok(4, seqs=((np.ma.ones(4), 0),)) is False
    assert vectorized_mod.recurrence_ok(4, seqs=((np.ones(4), 0),), outs=(np.ma.zeros(4),)) is False
    assert vectorized_mod.recurrence_ok(4, seqs=((torch.ones(4), 0),), consts=(torch.ones(()).as_subclass(Sub),)) is False
    assert vectorized_mod.length(np.matrix(np.ones((4, 1)))) == -1
    assert vectorized_mod.dim1(np.matrix(np.ones((4, 2)))) is None


def test_target_update_refuses_parameter_subclasses():
    src, tgt = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    assert target_update._build(src, tgt) is not None

    class SubParam(torch.nn.Parameter):
        pass

    tgt.weight = SubParam(tgt.weight.detach().clone())
    assert target_update._build(src, tgt) is None


# ------------------------------------------------------------------ item 4: flags and lists of per-step values


def _flags(n, kind, rng):
    d = rng.random(n) < 0.3
    return {"bool": [bool(x) for x in d], "int": [int(x) for x in d], "np_bool": list(d)}[kind]


@pytest.mark.parametrize("kind", ["bool", "int"])
def test_python_flags_over_python_floats_are_vectorized(kind):
    rng = np.random.default_rng(7)
    env = dict(rewards=[float(x) for x in rng.standard_normal(40)], dones=_flags(40, kind, rng), gamma=0.9)
    ns1, ns2, trace = run_both(RETURNS_DONE, env)
    assert trace.vectorized()
    assert all(type(x) is float for x in ns2["returns"])


# PPO-PyTorch's (nikhilbarhate99) returns: a reset to the int 0, inserted at the front
RETURNS_INT_START = """\
discounted_reward = 0
returns = []
for reward, is_terminal in zip(reversed(rewards), reversed(dones)):
    if is_terminal:
        discounted_reward = 0
    discounted_reward = reward + (gamma * discounted_reward)
    returns.insert(0, discounted_reward)
R = discounted_reward
"""


@pytest.mark.parametrize("flags", ["npbool", "first"])
@pytest.mark.parametrize("gamma", [1, 0.9])
def test_python_ints_throughout_stay_ints(gamma, flags):
    """Found by a differential review (PPO-PyTorch, gamma = 1, rewards some of them ints): the
    loop keeps a Python int where every input of a step is one (after a reset to 0); the
    vectorized path gave floats. With no float coefficient and no list of floats only, the loop
    runs. The review's own inputs: T = 1030, rewards 0 / 1 / -1 or a float, 5% resets."""
    rng = random.Random(1030)
    rewards = [rng.choice([0, 1, -1, rng.gauss(0, 1)]) for _ in range(1030)]
    resets = [rng.random() < 0.05 for _ in range(1030)]
    dones = [np.bool_(t) for t in resets] if flags == "npbool" else [True] + [False] * 1029
    ns1, ns2, trace = run_both(RETURNS_INT_START, dict(rewards=rewards, dones=dones, gamma=gamma))
    assert [type(x) for x in ns1["returns"]] == [type(x) for x in ns2["returns"]]
    assert ns1["returns"] == ns2["returns"] and type(ns1["R"]) is type(ns2["R"])


@pytest.mark.parametrize("kind", ["bool", "int", "np_bool"])
def test_flags_next_to_float64_arrays_are_vectorized(kind):
    rng = np.random.default_rng(8)
    for rewards in (rng.standard_normal(40), torch.from_numpy(rng.standard_normal(40))):
        env = dict(rewards=rewards, dones=_flags(40, kind, rng), gamma=0.9)
        ns1, ns2, trace = run_both(RETURNS_DONE, env)
        assert trace.vectorized(), type(rewards)


@pytest.mark.parametrize("kind", ["bool", "int", "np_bool"])
def test_flags_next_to_float32_take_the_loop(kind):
    """A flag may meet a Python float before it meets an array: that rounds once in the loop and
    twice once the flags are a float32 array, so float32 maths keeps the loop."""
    rng = np.random.default_rng(9)
    for rewards in (rng.standard_normal(40).astype(np.float32), torch.randn(40)):
        env = dict(rewards=rewards, dones=_flags(40, kind, rng), gamma=0.9)
        ns1, ns2, trace = run_both(RETURNS_DONE, env)
        if kind != "np_bool" or isinstance(rewards, torch.Tensor):
            assert not trace.vectorized(), type(rewards)


@pytest.mark.parametrize("rewards", [(1, 2, 3, 4, 5), [1.0, 2, 3.0, True, 5.5], [np.float64(1.5)] * 6,
                                     [np.float32(0.5), np.float32(-1.25)] * 4])
def test_ints_mixed_lists_and_numpy_scalars_are_vectorized(rewards):
    env = dict(rewards=rewards, start=0, gamma=0.5)
    ns1, ns2, trace = run_both(RETURNS_INSERT, env)
    assert trace.vectorized()


def test_ints_too_large_to_promote_exactly_take_the_loop():
    env = dict(rewards=[1.0, 2**60, 3.0, 1.0], start=0, gamma=0.5)
    assert not run_both(RETURNS_INSERT, env)[2].vectorized()


def test_report_says_what_the_guard_needs():
    new, sites = rewrite(RETURNS_INSERT)
    site = [s for s in sites if s.action == REWRITTEN][0]
    assert "recurrence_ok" in site.reason and "carry_ok" in site.reason
    needs = " ".join(c for g in site.details["contracts"].values() for c in g["checks"])
    assert "exact types" in needs and "flags" in needs
    assert [s.exactness for s in sites if s.action == REWRITTEN] == [EXACT]


def test_the_steps_after_a_failed_carry_check_are_not_rewritten_again():
    """The rewrite's own ``for t in range(T - 2, -1, -1)`` (run when carry_ok declines) is a
    backward loop too: a second pass must leave it alone (idempotence)."""
    for src in (RETURNS_INSERT, CLEANRL_GAE, GAE_NUMPY):
        once, _ = rewrite(src)
        assert ".carry_ok(" in once
        twice, sites = rewrite(once)
        assert twice == once, [s.describe() for s in sites]


@pytest.mark.parametrize("T", [2, 3, 4])
def test_short_loops_after_a_failed_carry_check(T):
    rng = np.random.default_rng(T)
    env = dict(rewards=[float(x) for x in rng.standard_normal(T)], start=np.float32(0.5), gamma=0.99)
    run_both(RETURNS_INSERT, env)
    zipped = """\
G = start
out = []
for r, m in zip(reversed(rewards), reversed(masks)):
    G = r + gamma * G * m
    out.append(G)
"""
    env = dict(rewards=list(rng.standard_normal(T)), masks=[float(x) for x in rng.random(T) < 0.7],
               start=np.float32(0.5), gamma=0.99)
    run_both(zipped, env)


GAE_LISTS = """\
T = len(rewards)
adv = np.zeros(T, dtype=values.dtype)
last = 0
for t in reversed(range(T)):
    nonterm = 1 - dones[t]
    delta = rewards[t] + gamma * values[t + 1] * nonterm - values[t]
    last = delta + gamma * lam * nonterm * last
    adv[t] = last
"""


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("dones", ["bool", "int", "np_bool"])
def test_lists_of_python_floats_and_flags_next_to_an_array(dtype, dones):
    """Rewards and dones collected in lists, values a numpy array: exact (and vectorized) with
    float64 values, where Python float arithmetic is the arrays'; the loop with float32 ones."""
    rng = np.random.default_rng(11)
    T = 30
    env = dict(np=np, rewards=[float(x) for x in rng.standard_normal(T)], dones=_flags(T, dones, rng),
               values=rng.standard_normal(T + 1).astype(dtype), gamma=0.99, lam=0.95)
    ns1, ns2, trace = run_both(GAE_LISTS, env)
    assert trace.vectorized() == (dtype == np.float64), trace.calls


def test_items_made_of_flags_alone_keep_their_python_type():
    """``flags.append(1 - dones[t])`` appends Python ints in the loop: with the flags turned into
    a float64 array they would come back as floats, so the guard is told (weak=False)."""
    src = """\
R = 0.0
out = []
flags = []
for t in reversed(range(len(rewards))):
    R = rewards[t] + gamma * R * (1 - dones[t])
    out.append(R)
    flags.append(1 - dones[t])
"""
    assert "weak=False" in rewrite(src)[0]
    rng = np.random.default_rng(12)
    env = dict(rewards=[float(x) for x in rng.standard_normal(30)], dones=_flags(30, "bool", rng), gamma=0.9)
    ns1, ns2, trace = run_both(src, env, exact=False)
    assert not trace.vectorized()
    assert all(type(x) is int for x in ns2["flags"])


# ------------------------------------------------------------------ bool tensor masks (skrl)

BOOL_MASK_GAE = """\
advantages = torch.zeros_like(rewards)
advantage = 0
for i in reversed(range(T)):
    nv = values[i + 1] if i < T - 1 else next_values
    delta = rewards[i] + gamma * nv * not_terminated[i] - values[i]
    advantage = delta + gamma * lam * not_terminated[i] * advantage
    advantages[i] = advantage
"""


def _mask_env(dtype, rows):
    g = torch.Generator().manual_seed(3)
    shape = (50, *rows)
    return dict(
        torch=torch, T=50, gamma=0.99, lam=0.95,
        rewards=torch.randn(shape, generator=g, dtype=dtype), values=torch.randn(shape, generator=g, dtype=dtype),
        next_values=torch.randn(rows, generator=g, dtype=dtype) if rows else torch.randn((), generator=g, dtype=dtype),
        not_terminated=torch.rand(shape, generator=g) > 0.1,  # terminated.logical_not(), as skrl builds it
    )


@pytest.mark.parametrize("rows", [(), (4, 1)])
def test_bool_tensor_masks_in_the_default_dtype_are_vectorized_bitwise(rows):
    """``gamma * mask[t]`` of a bool tensor is in the default dtype, 0-d step or slice alike: with
    float32 data (the default) the vectorized steps give the loop's bits."""
    ns1, ns2, trace = run_both(BOOL_MASK_GAE, _mask_env(torch.float32, rows))
    assert trace.vectorized() and ns2["advantages"].dtype == torch.float32


@pytest.mark.parametrize("rows", [(), (4, 1)])
def test_bool_tensor_masks_next_to_another_float_dtype_take_the_loop(rows):
    ns1, ns2, trace = run_both(BOOL_MASK_GAE, _mask_env(torch.float64, rows))
    assert not trace.vectorized()  # gamma * mask[t] is float32 in both forms; the loop is kept anyway


def test_bool_tensor_masks_follow_the_default_dtype():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        ns1, ns2, trace = run_both(BOOL_MASK_GAE, _mask_env(torch.float64, (4, 1)))
        assert trace.vectorized()
    finally:
        torch.set_default_dtype(previous)


def test_integer_tensor_masks_are_still_refused():
    """Within the integer kinds a 0-d step and a slice promote differently against a dimensioned
    operand of another width: only bool (one dtype) is admitted."""
    env = _mask_env(torch.float32, (4, 1))
    ok = lambda m: vectorized_mod.recurrence_ok(  # noqa: E731
        50, seqs=((env["values"], 0), (env["rewards"], 0), (m, 0)), consts=(0.95, 0.99),
        outs=(torch.zeros(50, 4, 1),), aligned=True, cpu=True)
    assert ok(env["not_terminated"]) is True
    assert ok(env["not_terminated"].long()) is False and ok(env["not_terminated"].to(torch.uint8)) is False
