"""The one-pass tier of rewritten recurrences (transforms/vectorize/recurrence/one_pass.py): the
loop body handed to runtime.fused.fused_linear in front of the vectorized steps. Differential:
original loop vs the rewrite with the tier, and vs the rewrite with the tier turned off (the
vectorized steps behind it), bitwise; look-alikes that must not get the tier."""
from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalebox_cst.report import EXACT
from scalebox_cst.runtime import fused as fused_mod
from scalebox_cst.runtime import vectorized as vectorized_mod

from recurrence_harness import SB3 as SB3_BUFFER
import harness

pytestmark = pytest.mark.skipif(not fused_mod.available(), reason="the _fused_c extension is not built")
HYP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rewrite(src: str):
    out, sites = harness.rewrite(src, "vectorize.recurrence", dedent=False, path="m.py", check=False)
    return out, harness.rewritten_sites(sites, "vectorize.recurrence")  # the shared harness (tests/harness.py)


_REWRITES: dict = {}


def functions(src: str, name: str = "f"):
    if src not in _REWRITES:  # one rewrite per snippet (hypothesis calls this per example)
        _REWRITES[src] = rewrite(src)
    new, done = _REWRITES[src]
    return harness.load(src, name, filename="orig"), harness.load(new, name, filename="new"), new, done


def same(a, b, where="result"):
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert a.contiguous().numpy().tobytes() == b.contiguous().numpy().tobytes(), f"{where}: {a} != {b}"
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), where
    elif isinstance(a, float):
        assert struct.pack("d", a) == struct.pack("d", b), where
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def clone(v):
    if isinstance(v, torch.Tensor):
        return v.clone()
    if isinstance(v, np.ndarray):
        return v.copy()
    return v


def run(f, g, args):
    """f(args) vs g(args) with the tier, and g(args) with it off; whether the tier ran."""
    def call(fn):
        try:
            return fn(*map(clone, args))
        except Exception as exc:  # the rewrite must fail the same way
            return type(exc)

    want = call(f)
    seen = []
    real = vectorized_mod.fused_linear

    def spy(*a, **k):
        seen.append(real(*a, **k))
        return seen[-1]

    vectorized_mod.fused_linear = spy
    try:
        got = call(g)
    finally:
        vectorized_mod.fused_linear = real
    same(want, got)
    vectorized_mod.fused_linear = lambda *a, **k: None
    try:
        same(want, call(g), "with the tier off")
    finally:
        vectorized_mod.fused_linear = real
    return any(x is not None for x in seen)


def data(T, N, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, N, generator=g, dtype=torch.float64).to(dtype)
    values = torch.randn(T, N, generator=g, dtype=torch.float64).to(dtype)
    dones = (torch.rand(T, N, generator=g) < 0.2).to(dtype)
    next_value = torch.randn(N, generator=g, dtype=torch.float64).to(dtype)
    next_done = (torch.rand(N, generator=g) < 0.5).to(dtype)
    return rewards, values, dones, next_value, next_done


CLEANRL = """\
import torch

def f(rewards, values, dones, next_value, next_done, gamma=0.99, gae_lambda=0.95, init=0):
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = init
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages, advantages + values
"""


def test_cleanrl_program_and_reason():
    f, g, new, done = functions(CLEANRL)
    assert len(done) == 1 and done[0].exactness == EXACT
    assert "fused_linear, else" in done[0].reason
    assert "bitwise the loop" in " ".join(done[0].details["contracts"]["fused_linear"]["checks"])
    assert ("'dones[T] = next_done; values[T] = next_value; nextnonterminal = 1.0 - dones[t + 1]; "
            "nextvalues = values[t + 1]; delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]; "
            "advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam; "
            "del lastgaelam'") in new
    assert "is not None or _sbx.recurrence_ok(" in new  # both tiers on the guard's line
    harness.compiled(new, "new")


#: a temporary read after the loop: the program stops at t = 1, the last step runs as written
NOT_DEAD = CLEANRL.replace("return advantages, advantages + values", "return advantages, delta, lastgaelam, t")


@HYP
@given(T=st.integers(0, 48), N=st.sampled_from([1, 3]), dtype=st.sampled_from([torch.float32, torch.float64]),
       seed=st.integers(0, 2**16), init=st.sampled_from(["int", "float", "row", "0d", "1xN"]),
       tail=st.sampled_from(["row", "1xN"]), src=st.sampled_from(["folded", "last step as written"]))
def test_cleanrl_bitwise(T, N, dtype, seed, init, tail, src):
    """Every start value kind, CleanRL's ``next_value.reshape(1, -1)`` (the carried value is [1, N]
    from the first step on), with the last step folded in and as written."""
    f, g, new, _ = functions(CLEANRL if src == "folded" else NOT_DEAD)
    assert ("stop=1" in new) == (src != "folded")
    args = list(data(T, N, dtype, seed))
    if tail == "1xN":
        args[3] = args[3].reshape(1, -1)
    gen = torch.Generator().manual_seed(seed + 1)
    start = {"int": 0, "float": 0.25, "row": torch.randn(N, generator=gen, dtype=torch.float64).to(dtype),
             "0d": torch.tensor(0.5, dtype=dtype), "1xN": torch.randn(1, N, generator=gen, dtype=torch.float64).to(dtype)}[init]
    ran = run(f, g, args + [0.99, 0.95, start])
    assert ran == (T >= 2)


IFEXP = """\
import torch

def f(rewards, values, dones, last_value, last_done, gamma, lam):
    T = len(rewards)
    adv = torch.zeros_like(rewards)
    gae = 0.0
    for i in range(T - 1, -1, -1):
        next_values = values[i + 1] if i < T - 1 else last_value
        mask = 1.0 - dones[i + 1] if i + 1 < T else 1.0 - last_done
        delta = rewards[i] + gamma * next_values * mask - values[i]
        gae = delta + gamma * lam * mask * gae
        adv[i] = gae
    return adv, gae
"""


@HYP
@given(T=st.integers(0, 40), dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 2**16))
def test_conditional_expression_last_step_and_live_carried_value(T, dtype, seed):
    """The conditional-expression spelling gives the same tails; the carried value is returned,
    so the program hands it back (no ``del``)."""
    f, g, new, done = functions(IFEXP)
    assert "values[T] = last_value; dones[T] = last_done" in new and "del gae" not in new
    assert "gae = gae_fused" in new
    r, v, d, lv, ld = data(T, 2, dtype, seed)
    assert run(f, g, [r, v, d, lv, ld, 0.97, 0.9]) == (T >= 2)


RENAMED = """\
import torch

class Agent:
    def returns(self, T, lam):
        n = self.rewards.shape[0]
        out = torch.zeros_like(self.rewards)
        g = 0.0
        for t_ in reversed(range(n)):
            out[t_] = g = self.rewards[t_] * T + lam * self.masks[t_] * g
        return out

def f(rewards, masks, T, lam):
    a = Agent()
    a.rewards, a.masks = rewards, masks
    return a.returns(T, lam)
"""


def test_user_names_t_and_T_and_attribute_chains():
    """A user constant named ``T`` and containers ``self.x`` become program-local names."""
    f, g, new, done = functions(RENAMED)
    assert "fused_linear('out[t] = g = rewards[t] * T_2 + lam * masks[t] * g; del g'" in new, new
    for T in (1, 2, 9):
        r, m = torch.randn(T, 4), (torch.rand(T, 4) > 0.3).float()
        assert run(f, g, [r, m, 0.5, 0.9]) == (T >= 2)


LITERAL_TAIL = IFEXP.replace("if i < T - 1 else last_value", "if i < T - 1 else 0.0")
OTHER_FIRST = CLEANRL.replace("nextvalues = next_value\n", "nextvalues = next_value * 0.5\n")


@pytest.mark.parametrize("src", [LITERAL_TAIL, OTHER_FIRST], ids=["literal-tail", "other-first-step"])
def test_look_alikes_keep_the_vectorized_steps_only(src):
    """Rewritten as before, without the one-pass tier: a last-step value that is a Python number
    (the loop meets it in Python arithmetic), a first step that is not the others with boundary
    rows."""
    f, g, new, done = functions(src)
    assert done and "fused_linear" not in new
    args = list(data(12, 3, torch.float32, 0))
    if src is LITERAL_TAIL:
        args += [0.97, 0.9]
    assert not run(f, g, args)


NUMPY_CLEANRL = CLEANRL.replace("torch.zeros_like", "np.zeros_like").replace("import torch", "import numpy as np")


@HYP
@given(T=st.integers(0, 40), N=st.sampled_from([1, 3]), dtype=st.sampled_from([torch.float32, torch.float64]),
       seed=st.integers(0, 2**16), init=st.sampled_from(["int", "float", "row", "0d", "1xN"]),
       tail=st.sampled_from(["row", "1xN"]), src=st.sampled_from(["folded", "last step as written"]))
def test_numpy_arrays_take_the_tier_bitwise(T, N, dtype, seed, init, tail, src):
    """SB3's buffers are numpy arrays: NumPy 2 rounds a Python number meeting an array to its dtype
    as torch does, so the same kernel gives the loop's bits; the carried value comes back as the
    loop leaves it (an array of the row's shape)."""
    f, g, new, _ = functions(NUMPY_CLEANRL if src == "folded" else NOT_DEAD.replace("torch.zeros_like", "np.zeros_like")
                             .replace("import torch", "import numpy as np"))
    args = [a.numpy() for a in data(T, N, dtype, seed)]
    if tail == "1xN":
        args[3] = args[3].reshape(1, -1)
    rng = np.random.default_rng(seed)
    npdt = args[0].dtype
    start = {"int": 0, "float": 0.25, "row": rng.standard_normal(N).astype(npdt), "0d": np.array(0.5, npdt),
             "1xN": rng.standard_normal((1, N)).astype(npdt)}[init]
    ran = run(f, g, args + [0.99, 0.95, start])
    assert ran == (T >= 2 and int(np.__version__.split(".")[0]) >= 2)


NUMPY_SCALARS = """import numpy as np

def f(rewards, masks, gamma, out):
    R = 0.0
    for t in reversed(range(len(rewards))):
        R = rewards[t] + gamma * masks[t] * R
        out[t] = R
    return out, R

def g(rewards, masks, gamma, out):
    R = 0.0
    for t in reversed(range(len(rewards))):
        R = rewards[t] + gamma / masks[t] * R
        out[t] = R
    return out, R
"""


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_numbers_per_step_and_what_numpy_computes_otherwise(dtype):
    """1-D arrays: each step's values are numpy scalars, and so is the carried value after the loop
    (the tier returns one of that dtype). ``gamma / masks[t]`` is one division in numpy and torch's
    reciprocal times gamma: left to the vectorized steps. A read-only, a non-contiguous or a
    byte-swapped array is not taken either."""
    f1, g1, _, _ = functions(NUMPY_SCALARS, "f")
    rng = np.random.default_rng(3)
    r, m = rng.standard_normal(33).astype(dtype), (rng.random(33) > 0.2).astype(dtype)
    numpy2 = int(np.__version__.split(".")[0]) >= 2
    assert run(f1, g1, [r, m, 0.9, np.zeros(33, dtype)]) == numpy2
    want = f1(r, m, 0.9, np.zeros(33, dtype))[1]
    assert type(want) is np.dtype(dtype).type
    f2, g2, _, _ = functions(NUMPY_SCALARS, "g")
    assert not run(f2, g2, [r, m + 1, 0.9, np.zeros(33, dtype)])
    prog = "out[t] = R = rewards[t] + gamma * masks[t] * R"
    assert fused_mod.params_of(prog) == ("out", "R", "rewards", "gamma", "masks")
    call = lambda out, r: fused_mod.fused_linear(prog, 33, out, 0.0, r, 0.9, m)  # noqa: E731
    assert type(call(np.zeros(33, dtype), r)) is np.dtype(dtype).type  # the kernel takes these
    frozen = np.zeros(33, dtype)
    frozen.flags.writeable = False
    assert call(frozen, r) is None and not frozen.any()  # (the loop raises on it)
    assert call(np.zeros(33, dtype), np.repeat(r, 2)[::2]) is None
    assert call(np.zeros(33, dtype), r.astype(np.dtype(dtype).newbyteorder(">"))) is None
    assert call(np.zeros(33, dtype), np.ma.masked_array(r)) is None
    assert call(np.zeros(33, dtype), torch.from_numpy(r)) is None  # one family of values, not two


# Stable-Baselines3's RolloutBuffer.compute_returns_and_advantage (numpy buffers), as the main
# recurrence tests have it
SB3 = SB3_BUFFER.split("\nbuf = RolloutBuffer(")[0] + """
def f(rewards, values, episode_starts, last_values, dones, gamma=0.99, gae_lambda=0.95):
    b = RolloutBuffer(rewards, values, episode_starts, gamma, gae_lambda)
    b.compute_returns_and_advantage(last_values, dones)
    return b.advantages, b.returns
"""


@HYP
@given(T=st.integers(0, 40), N=st.sampled_from([1, 4]), dones=st.sampled_from(["bool", "float32", "float64", "none"]),
       seed=st.integers(0, 2**16))
def test_sb3_first_step_expression_is_a_tail_bitwise(T, N, dones, seed):
    """The first step's ``1.0 - dones.astype(np.float32)``: a pure loop-invariant value in the step's
    first statement, passed as the tail (evaluated where the loop first would); a ``dones`` that
    has no ``astype`` raises the loop's AttributeError."""
    f, g, new, done = functions(SB3)
    assert "fused_linear('episode_starts[T] = tail_value; values[T] = last_values;" in new
    assert "dones.astype(np.float32), self.values" in new
    r, v, d, lv, _ = (a.numpy() for a in data(T, N, torch.float32, seed))
    last_dones = {"bool": np.arange(N) % 2 == 0, "float32": np.ones(N, np.float32),
                  "float64": np.zeros(N), "none": None}[dones]
    ran = run(f, g, [r, v, d, lv, last_dones])
    numpy2 = int(np.__version__.split(".")[0]) >= 2
    assert ran == (T >= 2 and numpy2 and dones != "none")


@pytest.mark.parametrize("first", [
    "next_non_terminal = 1.0 - dones.astype(np.float32) * rng.random()",  # not pure
    "next_non_terminal = 1.0 - self.advantages[0]",  # a container the loop writes
    "next_non_terminal = 1.0 - (k := dones)",  # binds a name
])
def test_first_step_expressions_that_are_not_tails(first):
    src = SB3.replace("next_non_terminal = 1.0 - dones.astype(np.float32)", first) \
        .replace("def compute_returns_and_advantage(self, last_values, dones):",
                 "def compute_returns_and_advantage(self, last_values, dones, rng=None):")
    f, g, new, done = functions(src)
    assert "fused_linear" not in new  # (the vectorized steps may take the loop, or nothing does)
    r, v, d, lv, ld = (a.numpy() for a in data(9, 3, torch.float32, 5))
    assert not run(f, g, [r, v, d, lv, ld])


@pytest.mark.parametrize("kind", ["tensor-constant", "grad"])
def test_values_the_kernel_does_not_take_fall_back(kind):
    """A tensor gamma, inputs requiring grad: fused_linear says None, the vectorized steps (or the
    loop) give the loop's results."""
    src = CLEANRL.replace("torch.zeros_like", "np.zeros_like").replace("import torch", "import numpy as np\nimport torch") \
        if kind == "numpy" else CLEANRL
    f, g, _, _ = functions(src)
    args = list(data(10, 3, torch.float64, 1)) + [0.99, 0.95, 0]
    if kind == "numpy":
        args = [a.numpy() if isinstance(a, torch.Tensor) else a for a in args]
        args[-1] = 0.0
    elif kind == "tensor-constant":
        args[5] = torch.tensor(0.99, dtype=torch.float64)
    else:
        args[1] = args[1].clone().requires_grad_()
    if kind == "grad":
        want = f(*args)
        got = g(*args)
        same(want[0].detach(), got[0].detach())
        return
    assert not run(f, g, args)


def test_saved_output_still_fails_backward():
    """An output autograd saved before the loop: the loop's writes make backward raise, and so do
    the kernel's (it bumps the output's version)."""
    f, g, _, _ = functions(CLEANRL.replace("advantages = torch.zeros_like(rewards)\n", "advantages = out\n")
                           .replace("init=0):", "init=0, out=None):"))
    for fn in (f, g):
        w = torch.ones(3, requires_grad=True)
        args = list(data(6, 3, torch.float32, 2))
        out = torch.zeros(6, 3)
        y = (w * out).sum()  # saves `out` for the gradient of w
        fn(*args, 0.99, 0.95, 0, out)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()


MEMO = """\
import torch

class Storage:
    def __init__(self, rewards, masks, bad_masks, value_preds, returns):
        self.rewards, self.masks, self.bad_masks = rewards, masks, bad_masks
        self.value_preds, self.returns = value_preds, returns

    def compute_returns(self, next_value, gamma, proper_time_limits):
        if proper_time_limits:
            self.returns[-1] = next_value
            for step in reversed(range(self.rewards.size(0))):
                self.returns[step] = (self.returns[step + 1] * \\
                    gamma * self.masks[step + 1] + self.rewards[step]) * self.bad_masks[step + 1] \\
                    + (1 - self.bad_masks[step + 1]) * self.value_preds[step]
        else:
            self.returns[-1] = next_value
            for step in reversed(range(self.rewards.size(0))):
                self.returns[step] = self.returns[step + 1] * \\
                    gamma * self.masks[step + 1] + self.rewards[step]
        return self.returns

def f(rewards, masks, bad_masks, value_preds, returns, next_value, gamma, proper):
    return Storage(rewards, masks, bad_masks, value_preds, returns).compute_returns(next_value, gamma, proper)
"""


@HYP
@given(T=st.integers(0, 40), dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 2**16),
       proper=st.booleans(), shape=st.sampled_from([(4,), (4, 1)]))
def test_recurrence_through_memory_as_written_bitwise(T, dtype, seed, proper, shape):
    """ikostrikov's returns (the carried value lives in ``returns``, ``returns[step + 1] * gamma *
    mask`` rounds twice): the vectorized steps regroup it (reassociated), the one-pass tier runs it
    as written, bitwise, one row at a time."""
    f, g, new, done = functions(MEMO)
    assert new.count("fused_linear(") == 2 and len(done) == 2
    assert "'returns[t] = returns[t + 1] * gamma * masks[t + 1] + rewards[t]'" in new
    gen = torch.Generator().manual_seed(seed)

    def rnd(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype)

    masks = (torch.rand(T + 1, *shape, generator=gen) > 0.1).to(dtype)
    bad = (torch.rand(T + 1, *shape, generator=gen) > 0.1).to(dtype)
    args = [rnd(T, *shape), masks, bad, rnd(T + 1, *shape), torch.zeros(T + 1, *shape, dtype=dtype),
            rnd(*shape), 0.99, proper]
    want = f(*map(clone, args))
    seen = []
    real = vectorized_mod.fused_linear
    vectorized_mod.fused_linear = lambda *a, **k: seen.append(real(*a, **k)) or seen[-1]
    try:
        got = g(*map(clone, args))
    finally:
        vectorized_mod.fused_linear = real
    same(want, got)  # bitwise: the tier is the loop as written
    assert any(x is not None for x in seen) == (T >= 2)


@pytest.mark.parametrize("program, loop", [
    ("ret[t] = s = s * gamma * m[t] + r[t]", None),
    ("ret[t] = s = r[t] + gamma * s * m[t] / (1.0 + s * s)", None),
    ("s = r[t] - 2.0 / (s + 3.0); ret[t] = s", None),
    ("s = -s * m[t] + r[t]; ret[t] = s + m[t]", None),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_by_row_updates_match_the_loop(program, loop, dtype):
    """Updates that are not one multiply and one add of the carried value run as written, one row
    at a time, bitwise the torch loop (the carried value before the loop a tensor: a Python number
    there would make the first step Python arithmetic, which is left to the loop)."""
    from scalebox_cst.runtime.fused import fused_linear, params_of

    T, N = 37, 5
    gen = torch.Generator().manual_seed(3)
    env = dict(r=torch.randn(T, N, generator=gen, dtype=dtype), m=torch.rand(T, N, generator=gen, dtype=dtype),
               gamma=0.97, s=torch.randn(N, generator=gen, dtype=dtype))
    ret1, ret2 = torch.zeros(T, N, dtype=dtype), torch.zeros(T, N, dtype=dtype)
    ns = dict(env, ret=ret1, s=env["s"].clone())
    harness.load(f"for t in range({T} - 1, -1, -1):\n    " + program.replace("; ", "\n    "), namespace=ns)
    vals = dict(env, ret=ret2, s=env["s"].clone())
    last = fused_linear(program, T, *[vals[n] for n in params_of(program)])
    assert last is not None
    same(ret1, ret2)
    same(ns["s"], last)
    vals = dict(env, ret=torch.zeros(T, N, dtype=dtype), s=0.5)
    assert fused_linear(program, T, *[vals[n] for n in params_of(program)]) is None


def test_inference_tensor_output_outside_inference_mode_is_left_to_the_loop():
    """``out[t] = ...`` on an inference tensor raises outside inference mode: the kernel does not
    write it there (inside inference mode it does, as the loop does)."""
    from scalebox_cst.runtime.fused import fused_linear

    program = "ret[t] = s = r[t] + 0.5 * s"
    r = torch.randn(10, 3)
    with torch.inference_mode():
        ret = torch.zeros(10, 3)
    assert fused_linear(program, 10, ret, 0.0, r) is None
    assert not ret.any()
    with torch.inference_mode():
        assert fused_linear(program, 10, ret, 0.0, r) is not None
    assert ret.any()
