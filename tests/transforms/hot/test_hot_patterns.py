"""hot.distribution_args and hot.tensor_from_arrays: which calls are rewritten, and that original and
rewrite give the same tensors, bitwise, on the same seeded inputs (and raise where they raised).
"""
import warnings

import numpy as np
import pytest
import torch

from scalebox_cst.config import DEFAULT_TRANSFORMS
from scalebox_cst.report import EXACT, REWRITTEN, SKIPPED
from scalebox_cst.runtime.hot_tensors import tensor_from_arrays
from scalebox_cst.transforms import REGISTRY
from scalebox_cst.transforms.hot import arrays, distributions
from example_inputs import transitions
import harness


def rewrite(src, tid):
    return harness.rewrite(src, tid)  # the shared differential harness (tests/harness.py)


def load(code):
    return harness.load(code, "f", filename="<hot>")


def same(a, b):
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if not torch.is_tensor(a):
        return a == b
    return (a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
            and torch.equal(a.reshape(-1).view(torch.uint8) if a.dtype != torch.bool else a,
                            b.reshape(-1).view(torch.uint8) if b.dtype != torch.bool else b))


def outcome(fn, *args, **kwargs):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args, **kwargs)
    except Exception as exc:  # the same exception type on both sides
        return type(exc)


def test_registered_and_on_by_default():
    ids = [cls.id for cls in REGISTRY]
    assert distributions.ID in ids and arrays.ID in ids
    assert "hot.*" in DEFAULT_TRANSFORMS


# ------------------------------------------------------------------ distributions


# Outputs, reasons and f(x, a) side by side: tests/transforms/test_examples_registry.py.
@pytest.mark.parametrize("example", [e for e in distributions.EXAMPLES if e.rewritten], ids=lambda e: e.note[:40])
def test_distribution_examples_are_exact_and_say_what_no_longer_raises(example):
    _, sites = rewrite(example.code, distributions.ID)
    done = [s for s in sites if s.action == REWRITTEN]
    assert done and all(s.exactness == EXACT and "no longer raise" in s.reason for s in done)


def test_distribution_rewrite_changes_only_invalid_input():
    """The documented difference: NaN logits raise before the rewrite and not after."""
    out, _ = rewrite(distributions.EXAMPLES[0].code, distributions.ID)
    orig, new = load(distributions.EXAMPLES[0].code), load(out)
    x = torch.full((2, 3), float("nan"))
    a = torch.zeros(2, dtype=torch.long)
    assert outcome(orig, x, a) is ValueError
    assert outcome(new, x, a) is not ValueError


def test_multivariate_normal_of_a_diagonal_still_raises_where_it_is_not_positive_definite():
    """The claim behind rewriting MultivariateNormal(loc, torch.diag(v)): validation's symmetry
    check cannot fail, and a matrix that is not positive definite still raises, from the Cholesky
    factorization __init__ makes anyway (LinAlgError, where validation raised ValueError); a NaN
    loc no longer raises, as the contract says."""
    src = ("import torch\nfrom torch.distributions import MultivariateNormal\n"
           "def f(x, v):\n    cov = torch.diag(v)\n    return MultivariateNormal(x, cov).log_prob(x)\n")
    out, sites = rewrite(src, distributions.ID)
    assert [s.action for s in sites] == [REWRITTEN] and "validate_args=False" in out
    orig, new = load(src), load(out)
    x = torch.randn(4, 3)
    for v in (torch.tensor([0.5, 0.0, 1.0]), torch.tensor([0.5, -1.0, 1.0])):
        assert outcome(orig, x, v) is ValueError
        assert outcome(new, x, v) is torch.linalg.LinAlgError
    v = torch.tensor([0.5, 2.0, 1.0])
    assert same(orig(x, v), new(x, v))
    nan = torch.full((4, 3), float("nan"))
    assert outcome(orig, nan, v) is ValueError and torch.isnan(new(nan, v)).all()


def test_distribution_multiline_call_keeps_trailing_comma():
    src = ("import torch\nfrom torch.distributions import Categorical\n"
           "def f(x, a):\n    d = Categorical(\n        logits=x,\n    )\n    return d.log_prob(a)\n")
    out, sites = rewrite(src, distributions.ID)
    assert "logits=x, validate_args=False,\n" in out
    x, a = torch.randn(2, 3), torch.tensor([0, 2])
    assert same(load(src)(x, a), load(out)(x, a))


@pytest.mark.parametrize("change", [
    "std[mask] = -1.0", "std.sub_(2.0)", "torch.add(std, -5, out=std)", "std.data.mul_(-1)",
    "std.view(-1)[0] = -1.0", "torch.Tensor.sub_(std, 5.0)", "torch.clamp_(std, max=-1.0)", "helper(std)",
])
def test_a_scale_changed_after_its_binding_is_not_provably_positive(change):
    """Found by a differential review: ``std = log_std.exp(); std[mask] = -1.0`` then
    ``Normal(mu, std, validate_args=False)`` returned NaN log-probs where the original raised."""
    src = (f"import torch\nfrom torch.distributions import Normal\n\ndef act(mu, log_std, mask, helper):\n"
           f"    std = log_std.exp()\n    {change}\n    return Normal(mu, std)\n")
    out, sites = rewrite(src, distributions.ID)
    assert [s.action for s in sites] == [SKIPPED] and "validate_args" not in out, (change, sites)


@pytest.mark.parametrize("change", [
    "p[0].zero_()", "p.data.sub_(0.25)", "p.view(-1).sub_(0.25)", "torch.Tensor.sub_(p, 0.25)",
    "torch.clamp_(p, min=-1.0, max=0.0)",
])
def test_probs_changed_through_a_view_or_a_torch_function_are_not_a_softmax(change):
    src = (f"import torch\nfrom torch.distributions import Categorical\n\ndef act(logits):\n"
           f"    p = torch.softmax(logits, -1)\n    {change}\n    return Categorical(p)\n")
    out, sites = rewrite(src, distributions.ID)
    assert [s.action for s in sites] == [SKIPPED], (change, sites)


CLASS_BODY = {  # a scale bound once to exp(...) in the enclosing scope, read in a class body
    "function": ("def f(x):\n    std = torch.exp(x)\n    class A:\n{body}    return A.d.scale\n", "f(torch.zeros(2))"),
    "module": ("std = torch.exp(torch.zeros(2))\nclass A:\n{body}", "A.d.scale"),
}


@pytest.mark.parametrize("where", sorted(CLASS_BODY))
@pytest.mark.parametrize("body, rebound", [
    ("        std = -torch.ones(2)\n        d = Normal(torch.zeros(2), std)\n", True),
    ("        d = Normal(torch.zeros(2), std)\n        std = -torch.ones(2)\n", True),
    ("        for std in [-torch.ones(2)]:\n            pass\n        d = Normal(torch.zeros(2), std)\n", True),
    ("        d = Normal(torch.zeros(2), std)\n        class B:\n            std = 3\n", False),
    ("        d = Normal(torch.zeros(2), std)\n", False),
])
def test_a_class_body_reads_its_own_bindings(where, body, rebound):
    """Found by a differential review: a class body that binds ``std`` reads its own (here
    negative) scale, not the enclosing ``std = torch.exp(x)``; the original raised ValueError and
    the rewrite built the distribution. Names the class body does not bind are the enclosing
    scope's, as before (a nested class's bindings are its own)."""
    template, expr = CLASS_BODY[where]
    if where == "module":
        body = body.replace("    ", "", 1).replace("\n    ", "\n")
    src = "import torch\nfrom torch.distributions import Normal\n" + template.format(body=body)
    out, sites = rewrite(src, distributions.ID)
    assert [s.action for s in sites] == [SKIPPED if rebound else REWRITTEN], sites
    ns1, ns2 = {}, {}
    err1, err2 = harness.outcome(src, ns1), harness.outcome(out, ns2)
    assert err1 is err2
    if err1 is None:
        assert same(outcome(eval, expr, ns1), outcome(eval, expr, ns2))


def test_user_distribution_class_is_not_a_site():
    src = "class Categorical:\n    def __init__(self, logits): pass\ndef f(x, a):\n    return Categorical(logits=x)\n"
    out, sites = rewrite(src, distributions.ID)
    assert out == src and not sites


# ------------------------------------------------------------------ tensors from arrays


# Outputs, reasons and f(batch) side by side: tests/transforms/test_examples_registry.py.
@pytest.mark.parametrize("example", [e for e in arrays.EXAMPLES if e.rewritten], ids=lambda e: e.note[:40])
def test_array_examples_are_exact_and_raise_on_ragged_batches(example):
    out, sites = rewrite(example.code, arrays.ID)
    done = [s for s in sites if s.action == REWRITTEN]
    assert done and all(s.exactness == EXACT for s in done)
    orig, new = load(example.code), load(out)
    ragged = transitions(0)  # the examples' own input recipe (tests/example_inputs.py)
    ragged[3] = (np.zeros(5), 0, 0.0)
    assert outcome(orig, ragged) is outcome(new, ragged) is ValueError


CONSTRUCTORS = [(torch.FloatTensor, None), (torch.DoubleTensor, None)] + [
    (torch.tensor, dtype) for dtype in (None, torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                        torch.int64, torch.int32, torch.uint8, torch.bool)]


@pytest.mark.parametrize("make,dtype", CONSTRUCTORS)
@pytest.mark.parametrize("src", [np.float64, np.float32, np.float16, np.int64, np.int32, np.uint8, np.bool_])
def test_runtime_matches_constructor(make, src, dtype):
    """Legacy constructors take no dtype; torch.tensor with every target dtype, including the
    casts the fast path declines (they must then behave exactly as the original, raising too)."""
    kwargs = {} if dtype is None else {"dtype": dtype}
    rng = np.random.default_rng(1)
    for scale in (3.0, 1e300, 1e-310):
        x = rng.standard_normal((12, 4)) * scale  # 48 numbers: the fast path; data[:1] is below it
        x[0, 0], x[1, 1] = np.nan, np.inf
        with np.errstate(all="ignore"):
            data = [row.astype(src) for row in x]
        for shaped in (data, tuple(data), data[:1]):
            assert same(outcome(make, shaped, **kwargs), outcome(tensor_from_arrays, make, shaped, **kwargs))


@pytest.mark.parametrize("make,dtype", CONSTRUCTORS)
@pytest.mark.parametrize("src", [np.int64, np.uint64])
def test_runtime_matches_constructor_on_wide_integers(make, src, dtype):
    """Found by a differential review: int64 items above 2**53 made float32 (the list path rounds
    through float64, a cast of the stack once) and uint64 items (the list path raises TypeError)."""
    kwargs = {} if dtype is None else {"dtype": dtype}
    info = np.iinfo(src)
    rows = np.array([[2**60 + 2**36 + 1, 1, 2, 3], [2**53 + 1, 2**62 + 2**39 + 1, 0, 7],
                     [info.max, info.max - 1, 5, 9], [2**40 + 3, 2**55 + 5, 11, 13]] * 3, dtype=src)
    data = list(rows)
    assert same(outcome(make, data, **kwargs), outcome(tensor_from_arrays, make, data, **kwargs))


SCALAR_TYPES = [np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint16,
                np.uint32, np.uint64, np.bool_]
ONE_COPY_SCALARS = {np.float64, np.float32, np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint16, np.uint32, np.bool_}


@pytest.mark.parametrize("make,dtype", CONSTRUCTORS)
@pytest.mark.parametrize("src", SCALAR_TYPES)
def test_runtime_matches_constructor_on_lists_of_numpy_scalars(make, src, dtype, monkeypatch):
    """``torch.tensor(adv)`` where ``adv`` holds numpy scalars (Lizhi-sjtu PPO-discrete: numpy
    numbers appended in a GAE loop) took the list path, ~5x slower at 2,000 items; a list of
    scalars of one type is now one ``np.array`` copy (from 256 of them where a dtype is given,
    where torch's list path is fast). Bitwise the constructor's tensor (NaN
    payloads, infinities, wide integers, every target dtype) or its exception; float16 and uint64
    scalars, mixed types and small lists stay on the list path."""
    from scalebox_cst.runtime import hot_tensors

    paths = []
    monkeypatch.setattr(hot_tensors, "report", lambda frame, why: paths.append(why))
    kwargs = {} if dtype is None else {"dtype": dtype}
    rng = np.random.default_rng(2)
    for scale in (3.0, 1e300, 1e-310, 2.0**62):
        x = rng.standard_normal(300) * scale
        x[0], x[1], x[2] = np.nan, np.inf, -0.0
        with np.errstate(all="ignore"):
            items = list(x.astype(src))
        for shaped in (items, tuple(items), items[:100], items[:31]):
            assert same(outcome(make, shaped, **kwargs), outcome(tensor_from_arrays, make, shaped, **kwargs))
    took = [why is None for why in paths]
    if src in ONE_COPY_SCALARS and (make is not torch.tensor or dtype in (None, torch.float32, torch.float64)) \
            and not (src is np.int64 and (make is torch.FloatTensor or dtype is torch.float32)):
        # the 300-item lists and tuples; 100 items only where no dtype is given (torch's list path
        # is as fast below 256 where one is); 31 items never
        assert took.count(True) == (12 if make is torch.tensor and dtype is None else 8), paths
    if src not in ONE_COPY_SCALARS:
        assert not any(took), paths


@pytest.mark.parametrize("data", [
    [np.float32(1.0)] * 20 + [np.float64(2.0)] * 20,  # two scalar types: torch promotes as it likes
    [np.float32(1.0)] * 39 + [1.0],  # a Python number among them
    [np.int64(1)] * 39 + [True],
    [np.float64(1.0)] * 39 + [np.zeros(1)],
])
def test_runtime_leaves_mixed_scalar_lists_to_the_constructor(data):
    assert same(outcome(torch.tensor, data), outcome(tensor_from_arrays, torch.tensor, data))


@pytest.mark.parametrize("data", [
    [np.zeros(3), np.zeros(4)],  # ragged: raises as before
    [np.zeros(3), np.zeros(3, np.float32)],  # mixed dtypes
    [np.zeros(3), [0.0, 1.0, 2.0]],  # mixed kinds
    [np.float64(1.0), np.float64(2.0)],  # numpy scalars
    [np.zeros(3).astype(">f8")] * 2,  # non-native byte order
    [np.ma.masked_array(np.zeros(3))] * 2,  # ndarray subclass
    [np.array(1.5)] * 40, [np.array(2, np.int32)] * 40,  # 0-d items: torch 2.13 raises TypeError
    [], [[1.0, 2.0]], 0.99,
])
def test_runtime_falls_back_to_the_original(data):
    assert same(outcome(torch.tensor, data), outcome(tensor_from_arrays, torch.tensor, data))


def test_runtime_keeps_default_dtype_inference():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        data = [np.ones(3, np.float32)] * 4
        assert same(outcome(torch.tensor, data), tensor_from_arrays(torch.tensor, data))
    finally:
        torch.set_default_dtype(old)


def test_plain_tensor_calls_are_not_sites():
    src = "import torch\ndef f(obs):\n    return torch.tensor(obs), torch.tensor(0.99), torch.tensor([1.0, 2.0])\n"
    out, sites = rewrite(src, arrays.ID)
    assert out == src and not sites



def test_empty_displays_and_comprehensions_of_numbers_are_not_sites():
    """Found on unseen code (ElegantRL): ``torch.tensor([])`` was rewritten as "a list appended
    to", a comprehension of ``int(...)`` as one that may hold arrays: the guard only cost."""
    src = ("import torch as th\ndef f(s, device):\n    a = th.tensor([])\n"
           "    b = th.tensor((), dtype=th.long, device=device)\n"
           "    c = th.tensor([int(i) for i in s], dtype=th.bool)\n    d = th.tensor([len(x) for x in s])\n"
           "    return a, b, c, d, th.tensor([x for x in s])\n")
    out, sites = rewrite(src, arrays.ID)
    assert [s.line for s in sites if s.action == REWRITTEN] == [7]  # only the comprehension of names


def test_lists_of_displays_are_not_sites():
    """minimalRL's ``a_lst.append([a])``: no arrays in the list, the guard would only cost."""
    src = ("import torch\ndef f(batch):\n    a_lst, s_lst = [], []\n    for s, a in batch:\n"
           "        a_lst.append([a])\n        s_lst.append(s)\n    return torch.tensor(a_lst), torch.tensor(s_lst)\n")
    out, sites = rewrite(src, arrays.ID)
    assert "torch.tensor(a_lst)" in out and "_sb_tensor_from_arrays(torch.tensor, s_lst)" in out
    assert len(sites) == 1


@pytest.mark.parametrize("src", [
    # a nested function may rebind the scale's name
    "from torch.distributions import Normal\nimport torch\nstd = torch.exp(torch.zeros(1))\n"
    "def reset():\n    global std\n    std = torch.zeros(1)\ndef f(x):\n    return Normal(x, std)\n",
    # a negative beta gives negative softplus values
    "from torch.distributions import Normal\nimport torch.nn.functional as F\n"
    "def f(x):\n    return Normal(x, F.softplus(x, beta=-1))\n",
])
def test_scale_not_provably_positive(src):
    out, sites = rewrite(src, distributions.ID)
    assert out == src
    assert [s.action for s in sites] == [SKIPPED] and "not provably positive" in sites[0].reason


def test_fast_path_taken_only_where_it_pays(monkeypatch):
    from scalebox_cst.runtime import hot_tensors

    calls = []
    real = hot_tensors.np.array
    monkeypatch.setattr(hot_tensors, "np", type("np", (), {**vars(np), "array": lambda d, *a, **k: calls.append(len(d)) or real(d, *a, **k)}))
    big = [np.ones(8)] * 4
    assert same(tensor_from_arrays(torch.tensor, big), torch.tensor(np.stack(big)))
    assert calls == [4]
    small = [np.ones(4)]  # 4 numbers: the list path is as fast, the original call runs
    assert same(outcome(tensor_from_arrays, torch.tensor, small), outcome(torch.tensor, small))
    assert calls == [4]


def test_a_list_begun_empty_and_never_appended_to_is_not_said_to_be_appended_to():
    # ericyangyu/PPO-for-Beginners' rewards-to-go: `batch_rtgs = []`, filled by insert(0, ...);
    # the site said "`batch_rtgs` is a list appended to"
    src = (
        "import torch\n"
        "def rtgs(batch_rews, gamma):\n"
        "    batch_rtgs = []\n"
        "    for ep_rews in reversed(batch_rews):\n"
        "        r = 0\n"
        "        for rew in reversed(ep_rews):\n"
        "            r = rew + r * gamma\n"
        "            batch_rtgs.insert(0, r)\n"
        "    return torch.tensor(batch_rtgs, dtype=torch.float)\n"
    )
    _, sites = rewrite(src, arrays.ID)
    assert len(sites) == 1 and sites[0].action == REWRITTEN, sites
    assert "`batch_rtgs` is a list begun empty (`[]`)" in sites[0].reason
    assert "appended" not in sites[0].reason
    _, sites = rewrite(src.replace("batch_rtgs.insert(0, r)", "batch_rtgs.append(r)"), arrays.ID)
    assert "`batch_rtgs` is a list appended to" in sites[0].reason
