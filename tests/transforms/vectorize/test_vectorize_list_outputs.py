"""Python lists as outputs and accumulators.

Backward recurrences whose output is written by index (``out[t] = gae``): an output the function
creates as a Python list is left alone with its reason (the guard stores only into arrays, so the
rewrite would never run vectorized); look-alikes whose output is an array, or may be one (a
parameter, a list rebound to a tensor), are rewritten and run vectorized on arrays, bitwise equal
to the loop.

Loss loops whose accumulators are created by one tuple assignment (SB3-style ``actor, critic = [],
[]``) or on one line are batched like ``a = []`` on lines of their own, bitwise equal to the loop
(loss and gradients); ``a = b = []`` (one list under two names) and other creations are left alone
with their reason.
"""

import numpy as np
import pytest

import torch

from scalebox_cst.report import REWRITTEN, SKIPPED
from scalebox_cst.runtime.fused import available as fused_available
import scalebox_cst.runtime.vectorized as V
from scalebox_cst.runtime.vectorized import MIN_STEPS

import harness  # noqa: E402
from corpus_harness import RuntimeTrace, compare  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

BODY = '''
    for t in reversed(range(T)):
        delta = rewards[t] + gamma * values[t + 1] * (1 - dones[t]) - values[t]
        gae = delta + gamma * lam * (1 - dones[t]) * gae
        {out}[t] = gae
'''


def src(create, out="adv", ret="adv", params="rewards, values, dones"):
    return (f"import torch\nimport numpy as np\n\ndef gae_of({params}, gamma=0.99, lam=0.95):\n"
            f"    T = len(rewards)\n    gae = 0.0\n{create}" + BODY.format(out=out) + f"    return {ret}\n")


def rewrite(code):
    out, sites = harness.rewrite(code, dedent=False, path="m.py", check=False)  # tests/harness.py
    sites = [s for s in sites if s.transform == "vectorize.recurrence"]
    assert len(sites) == 1
    return sites[0], out


def _exec(code, tag):
    return harness.load(code, "gae_of", f"<list outputs {tag}>", module="lo", cache_lines=True)  # tests/harness.py


def tensors(T, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, 3, generator=g, dtype=dtype), torch.randn(T + 1, 3, generator=g, dtype=dtype),
            (torch.rand(T, 3, generator=g) < 0.1).to(dtype))


def arrays(T, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(T), rng.standard_normal(T + 1), (rng.random(T) < 0.1).astype(float)


@pytest.mark.parametrize("create", [
    "    adv = [0.0] * len(rewards)\n",
    "    adv = [0] * T\n",
    "    adv = len(rewards) * [None]\n",
    "    adv = [0.0 for _ in range(T)]\n",
    "    adv, ret = [0.0] * T, [0.0] * T\n",
    "    adv = ret = [0.0] * T\n",
    "    adv: list = [0.0] * T\n",
    "    adv = []\n    adv += [0.0] * T\n",
])
def test_list_created_in_the_function_is_left_alone(create):
    code = src(create)
    site, out = rewrite(code)
    assert site.action == SKIPPED
    assert site.reason.startswith("output is a Python list written by index: `adv` (`adv")
    assert out == code


@pytest.mark.parametrize("T", [2, 3, 11, 12, 64])
@pytest.mark.parametrize("make", ["tensor", "numpy"])
def test_array_output_rewritten_and_vectorized_bitwise(make, T):
    create = {"tensor": "    adv = torch.zeros_like(rewards)\n", "numpy": "    adv = np.zeros(T)\n"}[make]
    code = src(create)
    site, out = rewrite(code)
    assert site.action == REWRITTEN and site.exactness == "exact"
    assert "a Python list output takes the loop" in " ".join(site.details["contracts"]["recurrence_ok"]["checks"])
    args = tensors(T, seed=T) if make == "tensor" else arrays(T, seed=T)
    want = _exec(code, "orig")(*args)
    with RuntimeTrace() as trace:
        got = _exec(out, "new")(*args)
    compare(want, got, exact=True)
    # from the guard's break-even length on; from T = 2 where the one-pass tier takes them (runtime.fused:
    # 3.6x the loop at T = 2, where the vectorized steps lose; numpy arrays with NumPy 2)
    tier = make == "tensor" or int(np.__version__.split(".")[0]) >= 2
    least = 2 if tier and "fused_linear(" in out and fused_available() else \
        MIN_STEPS["torch" if make == "tensor" else "numpy"]
    assert trace.accepted("vectorize.recurrence") == (T >= least)


def test_list_rebound_to_a_tensor_is_rewritten_and_vectorized():
    code = src("    adv = [0.0] * T\n    adv = torch.tensor(adv).unsqueeze(1).repeat(1, 3)\n")
    site, out = rewrite(code)
    assert site.action == REWRITTEN
    args = tensors(40)
    want = _exec(code, "orig")(*args)
    with RuntimeTrace() as trace:
        got = _exec(out, "new")(*args)
    compare(want, got, exact=True)
    assert trace.accepted("vectorize.recurrence")


@pytest.mark.parametrize("kind", ["list", "tensor"])
def test_output_parameter_decided_at_run_time(kind):
    """A parameter may be an array or a list: rewritten; a list takes the loop, same results."""
    code = src("", params="rewards, values, dones, adv")
    site, out = rewrite(code)
    assert site.action == REWRITTEN
    args = tensors(30)

    def make():
        return (*args, [0.0] * 30 if kind == "list" else torch.zeros(30, 3))
    want = _exec(code, "orig")(*make())
    with RuntimeTrace() as trace:
        got = _exec(out, "new")(*make())
    compare(want, got, exact=True)
    assert trace.accepted("vectorize.recurrence") == (kind == "tensor")


def test_attribute_output_is_not_decided_here():
    code = src("    self.adv = [0.0] * T\n", out="self.adv", ret="self.adv", params="self, rewards, values, dones")
    site, _ = rewrite(code)
    assert site.action == REWRITTEN


def test_sum_with_a_possible_array_is_not_taken_for_a_list():
    """``[0.0] + x`` is an array where ``x`` is one (ndarray.__radd__): not decided here."""
    code = src("    adv = [0.0] + zeros\n", params="rewards, values, dones, zeros")
    site, out = rewrite(code)
    assert site.action == REWRITTEN
    args = arrays(40)
    want = _exec(code, "orig")(*args, np.zeros(40))
    with RuntimeTrace() as trace:
        got = _exec(out, "new")(*args, np.zeros(40))
    compare(want, got, exact=True)
    assert trace.accepted("vectorize.recurrence")


# ------------------------------------------------------------------ loss-loop accumulators

from differential import LOSS_LOOP, loss_spy as Spy  # noqa: E402
from scalebox_cst.transforms.vectorize.reduction import ID as REDUCTION  # noqa: E402

load = harness.load
pair = harness.pairer(REDUCTION)
rewrite_reduction = harness.rewriter(REDUCTION)

SPLIT = "    policy_losses = []\n    value_losses = []\n"


@pytest.mark.parametrize("init", [
    "    policy_losses, value_losses = [], []\n",
    "    [policy_losses, value_losses] = [[], []]\n",
    "    policy_losses = []; value_losses = []\n",
    "    value_losses, policy_losses = ([], [])\n",
    "    policy_losses, value_losses = [[], []]\n",  # two new lists too
])
@pytest.mark.parametrize("T", [1, 2, 7, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tuple_created_accumulators_batched_bitwise(init, T, dtype, monkeypatch):
    src = LOSS_LOOP.replace(SPLIT, init)
    assert src != LOSS_LOOP
    spy = Spy(monkeypatch)
    orig, new, out, sites = pair(src, "f")
    assert [s.action for s in sites] == [REWRITTEN]
    assert "for (log_prob, value), R in zip(saved_actions, returns):" in out
    SA = load(src, "SavedAction")
    g = torch.Generator().manual_seed(T)
    logp, values, rets = (torch.randn(T, generator=g, dtype=dtype), torch.randn(T, 1, generator=g, dtype=dtype),
                          torch.randn(T, generator=g, dtype=dtype))

    def run(fn):
        lp, v = logp.clone().requires_grad_(), values.clone().requires_grad_()
        loss = fn([SA(a, b) for a, b in zip(lp.unbind(0), v.unbind(0))], rets)
        return (loss.detach(),) + torch.autograd.grad(loss, (lp, v))

    a, b = run(orig), run(new)
    assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b)), (a, b)
    assert spy.fast == (T >= V.LOSS_MIN_SAMPLES)  # shorter episodes run the loop


@pytest.mark.parametrize("init,reason", [
    ("    policy_losses = value_losses = []\n",
     "`policy_losses` and `value_losses` are the same list (`policy_losses = value_losses = []`)"),
    ("    value_losses = policy_losses = []\n",
     "`policy_losses` and `value_losses` are the same list (`value_losses = policy_losses = []`)"),
    ("    policy_losses, value_losses = [], [0.0]\n", "`value_losses` is not created empty"),
    ("    value_losses = []\n    policy_losses, value_losses = [], value_losses\n",
     "`value_losses` is not created empty"),
    ("    policy_losses, *value_losses = [], []\n", "`policy_losses` is not created empty"),
    ("    policy_losses = []; policy_losses.append(0.0); value_losses = []\n", "`policy_losses` is not created empty"),
])
def test_other_creations_left_alone(init, reason):
    src = LOSS_LOOP.replace(SPLIT, init)
    out, sites = rewrite_reduction(src)
    assert out == src
    assert [s.action for s in sites] == [SKIPPED]
    assert sites[0].reason.startswith(reason), sites[0].reason


def test_aliased_accumulators_would_differ():
    """Why ``a = b = []`` stays on the loop: both names append to one list, so each stack holds
    every value (2T of them), which batching each accumulator on its own would not give."""
    src = LOSS_LOOP.replace(SPLIT, "    policy_losses = value_losses = []\n").replace(
        "    return torch.stack(policy_losses).sum()", "    return len(policy_losses), torch.stack(policy_losses).sum()")
    SA = load(src, "SavedAction")
    T = 5
    g = torch.Generator().manual_seed(0)
    saved = [SA(a, b) for a, b in zip(torch.randn(T, generator=g), torch.randn(T, 1, generator=g))]
    n, _ = load(src, "f")(saved, torch.randn(T, generator=g))
    assert n == 2 * T
