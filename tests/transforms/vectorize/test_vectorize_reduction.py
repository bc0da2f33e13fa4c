"""vectorize.reduction: accumulation loops become one batched reduction with the same value and gradients.

Differential tests exec the original and the rewritten function on the same random inputs
(hypothesis varies length, including 0 and 1, element shape, dtype and container type) and compare
values and autograd gradients; guard tests feed inputs the runtime must decline and check that the
original loop runs (and raises where it raised); look-alikes come back byte for byte.
"""
from conftest import TESTS  # tests/: the corpus, fake_torch_npu and the repository root beside it
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalebox_cst.report import EXACT, REASSOCIATED, REWRITTEN, SKIPPED
from scalebox_cst.runtime import loop_batch
from scalebox_cst.transforms import REGISTRY
from scalebox_cst.transforms.vectorize.reduction import ID, VectorizeReduction
import harness
from harness import pairer, rewriter


rewrite = rewriter(ID)  # (text, sites); load, pair: the shared differential harness (tests/harness.py)
pair = pairer(ID)


def clone_args(args):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a.detach().clone().requires_grad_(a.requires_grad))
        elif isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
            out.append([t.detach().clone().requires_grad_(t.requires_grad) for t in a])
        else:
            out.append(a)
    return out


def leaves(args):
    found = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.requires_grad:
            found.append(a)
        elif isinstance(a, list):
            found.extend(t for t in a if isinstance(t, torch.Tensor) and t.requires_grad)
    return found


def compare(orig, new, args, exact, grad=True):
    """Run both on clones; compare results (bitwise if exact) and gradients of their sum."""
    a1, a2 = clone_args(args), clone_args(args)
    r1, r2 = orig(*a1), new(*a2)
    assert type(r1) is type(r2)
    if not isinstance(r1, torch.Tensor):
        assert r1 == r2
        return
    assert r1.shape == r2.shape and r1.dtype == r2.dtype
    if exact:
        assert torch.equal(r1, r2)
    else:
        torch.testing.assert_close(r1, r2)
    if grad and r1.requires_grad:
        g1 = torch.autograd.grad(r1.sum(), leaves(a1), allow_unused=True)
        g2 = torch.autograd.grad(r2.sum(), leaves(a2), allow_unused=True)
        for x, y in zip(g1, g2):
            if x is None or y is None:
                assert x is None and y is None
            elif exact:
                assert torch.equal(x, y)
            else:
                torch.testing.assert_close(x, y)


def test_registered_between_recurrence_and_grad_clip():
    ids = [cls.id for cls in REGISTRY]
    assert ID in ids
    if "grad_clip" in ids:
        assert ids.index(ID) < ids.index("grad_clip")
    if "vectorize.recurrence" in ids:
        assert ids.index("vectorize.recurrence") < ids.index(ID)


# ------------------------------------------------------------------ EXAMPLES

@pytest.mark.parametrize("example", VectorizeReduction.EXAMPLES, ids=lambda e: e.note[:40])
def test_examples_rewrite_one_site_or_report_none(example):
    """Outputs, reasons and inputs side by side (values and gradients):
    tests/transforms/test_examples_registry.py. Here: one site per rewritten example, and a
    look-alike without a reason is not even reported."""
    _, sites = rewrite(example.code, dedent=False)
    if example.rewritten:
        assert len([s for s in sites if s.action == REWRITTEN]) == 1
    elif not example.reason:
        assert sites == []


def test_golden_reinforce():
    src = """\
    import torch


    def finish_episode(policy, returns, optimizer):
        policy_loss = []
        for log_prob, R in zip(policy.saved_log_probs, returns):
            policy_loss.append(-log_prob * R)
        optimizer.zero_grad()
        policy_loss = torch.cat(policy_loss).sum()
        policy_loss.backward()
    """
    out, sites = rewrite(src)
    assert out == textwrap.dedent(
        """\
        from scalebox_cst.runtime.loop_batch import batch_zip as _sb_batch_zip
        import torch


        def finish_episode(policy, returns, optimizer):
            policy_loss = []
            _sb_batch = _sb_batch_zip((policy.saved_log_probs, returns), (), (), (), 1)
            if _sb_batch is not None:
                _sb_log_prob, _sb_R = _sb_batch
                _sb_policy_loss = (-_sb_log_prob * _sb_R)
            else:
                _sb_policy_loss = None
                for log_prob, R in zip(policy.saved_log_probs, returns):
                    policy_loss.append(-log_prob * R)
            optimizer.zero_grad()
            policy_loss = (_sb_policy_loss.sum() if _sb_policy_loss is not None else torch.cat(policy_loss).sum())
            policy_loss.backward()
        """
    )
    # the span reaches line 9, the `torch.cat(policy_loss).sum()` the rewrite changes too
    assert [(s.line, s.end_line, s.action, s.exactness) for s in sites] == [(6, 9, REWRITTEN, REASSOCIATED)]


# ------------------------------------------------------------------ hypothesis differential

FORMS = {
    "aug_range": ("""\
        def f(xs, ys, w):
            acc = 0
            for i in range(len(xs)):
                acc += xs[i] * w - ys[i]
            return acc
        """, "seq2", False),
    "assign_zip": ("""\
        import torch
        def f(xs, ys, w):
            acc = 0.0
            for x, y in zip(xs, ys):
                acc = acc + torch.tanh(x) * y
            return acc
        """, "seq2", False),
    "sub_iter": ("""\
        def f(xs, ys, w):
            acc = 1.5
            for x in xs:
                acc -= x.abs() / w
            return acc
        """, "seq2", False),
    "stack_sum": ("""\
        import torch
        def f(xs, ys, w):
            out = []
            for x, y in zip(xs, ys):
                out.append((x - y).clamp(min=-1.0, max=1.0) * w)
            return torch.stack(out).sum()
        """, "seq2", False),
    "stack_mean": ("""\
        import torch as th
        def f(xs, ys, w):
            out = []
            for i in range(len(xs)):
                out.append(th.minimum(xs[i], ys[i]))
            return th.mean(th.stack(out))
        """, "seq2", False),
    "builtin_sum": ("""\
        def f(xs, ys, w):
            parts = []
            for x in xs:
                parts.append(x * x)
            total = sum(parts)
            return total
        """, "seq2", False),
    "stack_exact": ("""\
        import torch
        def f(xs, ys, w):
            out = []
            for x, y in zip(xs, ys):
                out.append(x * w + y / 3)
            return torch.stack(out, dim=0)
        """, "seq2", True),
}


def make_seq(kind, n, shape, dtype, grad):
    base = torch.randn(n, *shape, dtype=dtype)
    if kind == "tensor":
        return base.requires_grad_(grad)
    return [t.clone().requires_grad_(grad) for t in base]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    form=st.sampled_from(sorted(FORMS)),
    n=st.integers(0, 6),
    shape=st.sampled_from([(), (1,), (3,), (2, 3)]),
    kinds=st.tuples(st.sampled_from(["tensor", "list"]), st.sampled_from(["tensor", "list"])),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    w=st.sampled_from([0.5, 2, 3.25]),
    seed=st.integers(0, 2**16),
)
def test_forms_differential(form, n, shape, kinds, dtype, w, seed):
    src, _, exact_form = FORMS[form]
    orig, new, _, sites = pair(src, "f")
    assert sites[0].action == REWRITTEN
    assert (sites[0].exactness == EXACT) == exact_form
    torch.manual_seed(seed)
    xs = make_seq(kinds[0], n, shape, dtype, grad=True)
    ys = make_seq(kinds[1], n, shape, dtype, grad=False)
    if form == "sub_iter":
        ys = None
    try:
        expected = orig(*clone_args([xs, ys, w]))
    except (RuntimeError, TypeError, ValueError) as exc:  # e.g. stacking an empty list
        with pytest.raises(type(exc)):
            new(*clone_args([xs, ys, w]))
        return
    compare(orig, new, [xs, ys, w], exact=exact_form)
    del expected


def test_fast_path_is_taken():
    """The guard accepts ordinary tensors (else the differential tests would only test the loop)."""
    xs = torch.randn(4, 3)
    assert loop_batch.batch_zip((xs, list(xs)), (2.0,), (0,)) is not None
    assert loop_batch.batch_range(range(4), (xs,), (), (0.0,)) is not None


# ------------------------------------------------------------------ guards: the loop runs instead

ACC = """\
def f(xs, ys):
    acc = 0
    for x, y in zip(xs, ys):
        acc += x * y
    return acc
"""


def test_guard_python_floats():
    orig, new, _, _ = pair(ACC, "f")
    xs, ys = [1.0, 2.5, 3.0], [0.1, 0.2, 0.3]
    assert loop_batch.batch_zip((xs, ys)) is None
    assert orig(xs, ys) == new(xs, ys)


SUM_OF_LIST = """\
def f(xs):
    terms = []
    for x in xs:
        terms.append(x * 1.0)
    return sum(terms)
"""


@pytest.mark.parametrize("src", [ACC.replace("x * y", "x * 1.0"), SUM_OF_LIST])
@pytest.mark.parametrize("dtype, n", [(torch.float16, 4096), (torch.bfloat16, 1024)])
def test_guard_16_bit_running_sums_run_the_loop(src, dtype, n):
    """A running sum of 16-bit values rounds at every step (float16 ones stop growing at 2048);
    one batched sum does not: far outside reassociation's bound, so the loop runs."""
    orig, new, _, _ = pair(src, "f")
    args = (torch.ones(n, dtype=dtype),) + ((torch.ones(n, dtype=dtype),) if "ys" in src else ())
    want, got = orig(*args), new(*args)
    assert torch.equal(torch.as_tensor(want), torch.as_tensor(got)) and float(got) < n
    spiky = torch.tensor([6e4, 6e4, -6e4, -5e4, 1, 1], dtype=torch.float16)
    assert torch.equal(torch.as_tensor(orig(*(spiky,) * len(args))), torch.as_tensor(new(*(spiky,) * len(args))))
    f32 = torch.ones(8)
    assert loop_batch.batch_zip((f32,), (), (0,)) is not None  # float32 still batched
    assert loop_batch.batch_zip((f32.to(dtype),), (), ()) is not None  # no running sum: batched
    assert loop_batch.batch_zip((f32.to(dtype),), (), (), running=True) is None


def test_guard_zip_truncation():
    orig, new, _, _ = pair(ACC, "f")
    xs, ys = torch.randn(5), torch.randn(3)
    assert loop_batch.batch_zip((xs, ys)) is None
    assert torch.equal(orig(xs, ys), new(xs, ys))


def test_guard_empty_keeps_int_zero():
    orig, new, _, _ = pair(ACC, "f")
    xs = torch.zeros(0)
    assert orig(xs, xs) == 0 and new(xs, xs) == 0 and type(new(xs, xs)) is int


def test_guard_integer_tensors():
    orig, new, _, _ = pair(ACC, "f")
    xs, ys = torch.arange(5, dtype=torch.int32), torch.arange(5, dtype=torch.int32)
    r1, r2 = orig(xs, ys), new(xs, ys)
    assert r1.dtype == r2.dtype == torch.int32 and torch.equal(r1, r2)


def test_guard_mixed_dtypes():
    orig, new, _, _ = pair(ACC, "f")
    xs, ys = torch.randn(4, dtype=torch.float64), torch.randn(4)
    assert loop_batch.batch_zip((xs, ys)) is None
    assert torch.equal(orig(xs, ys), new(xs, ys))


def test_guard_accumulator_aliasing_input():
    src = """\
    def f(xs):
        acc = xs[0]
        for x in xs:
            acc += x * 2
        return acc
    """
    orig, new, _, sites = pair(src, "f")
    assert sites[0].action == REWRITTEN
    xs = torch.arange(4.0)
    assert loop_batch.batch_zip((xs,), (), (xs[0],)) is None
    a, b = xs.clone(), xs.clone()
    assert torch.equal(orig(a), new(b)) and torch.equal(a, b)  # the loop feeds its own writes back


@pytest.mark.parametrize("loop", ["for x in xs:\n        acc += x * 2", "for i in range(len(xs)):\n        acc += xs[i] * 2"])
def test_guard_accumulator_aliased_by_the_items_of_a_list(loop):
    """The items of a list operand are the accumulator itself: the loop adds what it has summed so
    far (a stacked copy would add the start value): the guard declines, the loop runs. Items of
    their own memory run batched."""
    src = f"def f(acc, xs):\n    {loop}\n    return acc\n"
    orig, new, _, sites = pair(src, "f", dedent=False)
    assert [s.action for s in sites] == [REWRITTEN], sites
    a, b = torch.ones(3), torch.ones(3)
    assert loop_batch.batch_zip(([b, b],), (), (b,)) is None
    assert loop_batch.batch_range(range(2), ([b, b],), (), (b,)) is None
    assert torch.equal(orig(a, [a, a, a]), new(b, [b, b, b])) and torch.equal(a, torch.full((3,), 27.0))
    own = [torch.ones(3), torch.ones(3)]
    assert loop_batch.batch_zip((own,), (), (torch.ones(3),)) is not None
    assert loop_batch.batch_range(range(1, 2), ([b, own[1]],), (), (b,)) is not None  # only the items read


def test_guard_list_accumulator():
    orig, new, _, _ = pair(ACC.replace("acc = 0", "acc = []"), "f")
    xs, ys = torch.randn(3, 2), torch.randn(3, 2)
    r1, r2 = orig(xs, ys), new(xs, ys)
    assert isinstance(r2, list) and all(torch.equal(a, b) for a, b in zip(r1, r2))


def test_guard_range_past_the_end_raises_like_the_loop():
    src = """\
    def f(xs, n):
        acc = 0
        for i in range(n):
            acc += xs[i] * 2
        return acc
    """
    orig, new, _, _ = pair(src, "f")
    xs = torch.randn(3)
    for fn in (orig, new):
        with pytest.raises(IndexError):
            fn(xs, 5)
    assert torch.equal(orig(xs, 2), orig(xs, 2))
    torch.testing.assert_close(orig(xs, 2), new(xs, 2))
    assert loop_batch.batch_range(range(-1, 2), (xs,)) is None  # xs[-1] wraps around


def test_guard_cat_of_0d_results_raises_like_the_loop():
    src = """\
    import torch
    def f(xs):
        out = []
        for x in xs:
            out.append(x * 2)
        return torch.cat(out).sum()
    """
    orig, new, _, _ = pair(src, "f")
    xs = [torch.tensor(1.0), torch.tensor(2.0)]
    for fn in (orig, new):
        with pytest.raises(RuntimeError):
            fn(xs)
    ys = [torch.randn(2), torch.randn(2)]
    torch.testing.assert_close(orig(ys), new(ys))


def test_guard_invariant_numpy_array_falls_back():
    np = pytest.importorskip("numpy")
    src = """\
    def f(xs, w):
        acc = 0
        for x in xs:
            acc += x * w
        return acc
    """
    orig, new, _, _ = pair(src, "f")
    xs = torch.randn(3)
    assert loop_batch.batch_zip((xs,), (np.float64(2.0),)) is None
    torch.testing.assert_close(orig(xs, np.float32(2.0)), new(xs, np.float32(2.0)))


def test_invariant_with_more_dims_than_elements_broadcasts_like_the_loop():
    src = """\
    def f(xs, w):
        acc = 0
        for x in xs:
            acc += x * w
        return acc
    """
    orig, new, _, _ = pair(src, "f")
    xs, w = torch.randn(3), torch.randn(3)  # n == len(w): a naive batch would pair them up
    r1, r2 = orig(xs, w), new(xs, w)
    assert r1.shape == r2.shape == (3,)
    torch.testing.assert_close(r1, r2)


# ------------------------------------------------------------------ leave alone

LEAVE_ALONE = [
    ("""\
    def f(xs, opt):
        total = 0
        for x in xs:
            total += x * 2
            opt.step()
    """, "opt.step()"),
    ("""\
    import torch
    def f(xs):
        out = []
        for x in xs:
            out.append(x * 2)
        out.append(torch.zeros(()))
        return torch.stack(out).sum()
    """, "other than by a stack/cat/sum/mean reduction"),
    ("""\
    def f(xs, ys):
        total = 0
        for i in range(len(xs)):
            total += xs[i] * ys[i + 1]
    """, "not the current element"),
    ("""\
    def f(xs):
        total = 0
        for i in range(len(xs)):
            total += xs[i] * i
    """, "is used as a value"),
    ("""\
    def f(xs):
        total = 0
        for x in xs:
            total += x
    """, "nothing is computed"),
    ("""\
    def f(xs, k):
        total = 0
        for x in xs[:k]:
            total += x * 2
    """, "bind it to a name before the loop (`items = xs[:k]`"),
    ("""\
    import numpy as np
    def f(xs):
        total = 0
        for x in xs:
            total += np.exp(x)
    """, "numpy.exp"),
    ("""\
    def f(xs):
        total = 0
        for x in xs:
            total += total * x
    """, "is used as a value"),
]


@pytest.mark.parametrize("src,reason", LEAVE_ALONE, ids=[r for _, r in LEAVE_ALONE])
def test_leave_alone(src, reason):
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src)
    assert any(reason in s.reason for s in sites if s.action == SKIPPED), sites


def test_cuda_reinforce_example_left_alone():
    import os

    path = os.path.join(os.path.dirname(TESTS), "examples", "cuda_reinforce", "train.py")
    src = open(path, encoding="utf-8").read()
    result = harness.rewrite_result(src, ID, path=path)
    assert result.report.error is None
    # its loops step the environment or run a recurrence: nothing here is a reduction
    assert all(s.action != REWRITTEN for s in result.report.sites)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("form", sorted(FORMS))
def test_cuda_forms(form):
    src, _, exact_form = FORMS[form]
    orig, new, _, sites = pair(src, "f")
    torch.manual_seed(0)
    xs = torch.randn(300, 3, device="cuda", requires_grad=True)
    ys = torch.randn(300, 3, device="cuda")
    compare(orig, new, [xs, ys, 0.5], exact=exact_form)


def test_pytorch_reinforce_example_as_written_today():
    """pytorch/examples reinforce.py: ``R`` is the recurrence's carry before it is the loop variable."""
    src = """\
    from collections import deque
    import torch

    def finish_episode(saved_log_probs, rewards, gamma, eps):
        R = 0
        policy_loss = []
        returns = deque()
        for r in rewards[::-1]:
            R = r + gamma * R
            returns.appendleft(R)
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + eps)
        for log_prob, R in zip(saved_log_probs, returns):
            policy_loss.append(-log_prob * R)
        policy_loss = torch.cat(policy_loss).sum()
        return policy_loss
    """
    orig, new, out, sites = pair(src, "finish_episode")
    assert [s.action for s in sites] == [REWRITTEN], sites
    torch.manual_seed(0)
    log_probs = [torch.randn(1, requires_grad=True) for _ in range(20)]
    rewards = [float(x) for x in torch.rand(20)]
    compare(orig, new, [log_probs, rewards, 0.99, 1e-8], exact=False)


# ------------------------------------------------------------------ found on real code (tests/corpus)


@pytest.mark.parametrize(
    "body",
    [
        # dreamerv2 compute_return: temporaries, a carried value, the values appended
        "inp = target[t]\n        acc = inp + disc[t] * 0.95 * acc\n        outputs.append(acc)",
        # minimalRL ppo: carried value first, appended wrapped in a list
        "acc = 0.98 * 0.95 * acc + target[t]\n        outputs.append([acc])",
        # in-place carried value
        "acc *= disc[t]\n        outputs.append(acc)",
    ],
)
def test_recurrence_collecting_values_is_not_reported(body):
    """A loop that carries a value and appends it is a recurrence (vectorize.recurrence reports it),
    not a reduction: reporting it as a skipped reduction was noise on real code."""
    src = (
        "import torch\n"
        "def f(target, disc, acc):\n"
        "    outputs = []\n"
        "    for t in range(len(target)):\n"
        f"        {body}\n"
        "    return torch.stack(outputs).sum()\n"
    )
    out, sites = rewrite(src)
    assert out == src
    assert sites == []


def test_sum_with_a_carried_value_is_still_reported():
    """A real sum next to a carried value stays a (skipped) reduction candidate."""
    src = (
        "def f(logp, rewards, g):\n"
        "    loss = 0\n"
        "    rtrn = 0\n"
        "    for t in range(len(logp) - 1, -1, -1):\n"
        "        loss += logp[t] * (rewards[t] + g * rtrn)\n"
        "        rtrn = g * rtrn + rewards[t]\n"
        "    return loss\n"
    )
    out, sites = rewrite(src)
    assert out == src
    assert [s.action for s in sites] == [SKIPPED] and "carries a value from one iteration" in sites[0].reason


@pytest.mark.parametrize(
    "src",
    [
        # a replay-buffer sample: rows collected for torch.tensor(...), nothing reduced (minimalRL)
        "import torch\n"
        "def sample(batch):\n"
        "    s_lst, r_lst = [], []\n"
        "    for transition in batch:\n"
        "        s, r = transition\n"
        "        s_lst.append(s)\n"
        "        r_lst.append([r])\n"
        "    return torch.tensor(s_lst), torch.tensor(r_lst)\n",
        # layers collected for nn.Sequential
        "import torch.nn as nn\n"
        "def mlp(sizes):\n"
        "    layers = []\n"
        "    for j in range(len(sizes) - 1):\n"
        "        n_in = sizes[j]\n"
        "        layers.append(nn.Linear(n_in, sizes[j + 1]))\n"
        "    return nn.Sequential(*layers)\n",
        # a counter and a list extended by displays
        "def f(items):\n"
        "    n = 0\n"
        "    seen = []\n"
        "    for it in items:\n"
        "        n += 1\n"
        "        seen += [it]\n"
        "    return n, seen\n",
        # a string being built (SB3 get_system_info)
        "def info(d):\n"
        "    text = ''\n"
        "    for key, value in d.items():\n"
        "        text += f'- {key}: {value}\\n'\n"
        "    return text\n",
        # rows gathered then stacked along dim 1 (ikostrikov recurrent_generator): not a reduction
        "import torch\n"
        "def gather(obs, perm, n):\n"
        "    rows = []\n"
        "    for k in range(n):\n"
        "        ind = perm[k]\n"
        "        rows.append(obs[:, ind])\n"
        "    return torch.stack(rows, 1)\n",
    ],
    ids=["buffer-sample", "layers", "counter-and-extend", "string", "stack-dim-1"],
)
def test_loops_that_reduce_nothing_are_not_reported(src):
    """Found by the whole-file sweep of real RL code: loops that only collect values nothing
    reduces afterwards, count, or build strings were reported as skipped reductions ("the body
    also runs `s, r = transition`, which is not an accumulation"), noise on every replay buffer."""
    out, sites = rewrite(src)
    assert out == src
    assert sites == []


@pytest.mark.parametrize("which", ["noise", "candidate"])
def test_noise_filter_on_the_full_pass(monkeypatch, which):
    """The same decisions on the libcst fallback pass (taken when the ast and libcst statement
    lists do not pair up)."""
    from scalebox_cst.transforms.analysis.statements import CstStatements

    monkeypatch.setattr(CstStatements, "matches", lambda self, astmts: False)
    body = "out.append([x])" if which == "noise" else "out.append(x * 2.0)\n        n = x"
    src = (
        "import torch\n"
        "class A:\n"
        "    def f(self, xs):\n"
        "        out = []\n"
        "        for x in xs:\n"
        f"            {body}\n"
        "        return torch.tensor(out) if self else torch.stack(out).sum()\n"
    ).replace("\n        n = x", "\n            n = x")
    if which == "noise":
        src = src.replace(" if self else torch.stack(out).sum()", "")
    out, sites = rewrite(src)
    assert out == src
    assert [s.action for s in sites] == ([] if which == "noise" else [SKIPPED])


def test_collected_list_reduced_later_is_still_reported():
    """The noise filter keeps a real candidate: appends whose list a stack().sum() reduces
    somewhere in the function (here under an ``if``) stay a reported skip."""
    src = (
        "import torch\n"
        "def loss(pairs, scale):\n"
        "    losses = []\n"
        "    for logp, ret in pairs:\n"
        "        adv = ret - scale\n"
        "        losses.append(-logp * adv)\n"
        "    if losses:\n"
        "        return torch.stack(losses).sum()\n"
        "    return 0.0\n"
    )
    out, sites = rewrite(src)
    assert out == src
    assert [s.action for s in sites] == [SKIPPED] and "the loop unpacks its elements" in sites[0].reason


def test_stack_declines_what_the_loop_would_compute_differently():
    """The bulk check of list operands: one dtype (torch.stack would promote), one shape and
    device (stack raises), strided plain tensors or Parameters only."""
    from scalebox_cst.runtime.loop_batch import _stack

    f32, f64 = torch.ones(2), torch.ones(2, dtype=torch.float64)
    assert _stack([f32, f32]) is not None
    assert _stack([torch.nn.Parameter(f32), f32]) is not None
    assert _stack([f64, f32]) is None and _stack([f32, f64]) is None
    assert _stack([f32, torch.ones(3)]) is None
    assert _stack([f32, torch.ones(2, device="meta")]) is None
    assert _stack([f32.to_sparse(), f32.to_sparse()]) is None
    assert _stack([f32, 1.0]) is None
    assert _stack([]) is None

    class Sub(torch.Tensor):
        pass

    assert _stack([f32.as_subclass(Sub), f32]) is None


@pytest.mark.parametrize("consumer", ["aug", "stack"])
def test_results_of_different_ranks_keep_their_shapes(consumer):
    """Two accumulations over elements of different ranks: the batches are aligned to the higher
    rank, which gave the 0-d one a [1] sum (or a [T, 1] stack) where the loop gives [] ([T]).
    Such loops take the loss-loop path, which fits each result to its per-sample rank."""
    if consumer == "aug":
        src = (
            "def f(xs, ys):\n"
            "    a = 0\n"
            "    b = 0\n"
            "    for x, y in zip(xs, ys):\n"
            "        a += x * 2\n"
            "        b += y * 2\n"
            "    return a, b\n"
        )
    else:
        src = (
            "import torch\n"
            "def f(xs, ys):\n"
            "    la = []\n"
            "    lb = []\n"
            "    for x, y in zip(xs, ys):\n"
            "        la.append(x * 2)\n"
            "        lb.append(y * 2)\n"
            "    return torch.stack(la), torch.stack(lb)\n"
        )
    orig, new, _, sites = pair(src, "f")
    assert [s.action for s in sites] == [REWRITTEN]
    xs, ys = torch.randn(5), torch.randn(5, 3)
    for r1, r2 in zip(orig(xs, ys), new(xs, ys)):
        assert r1.shape == r2.shape
        if consumer == "stack":
            assert torch.equal(r1, r2)
        else:
            torch.testing.assert_close(r1, r2)


def test_loop_variable_read_after_the_loop_is_the_last_item():
    """``for x in xs: ws += x * 2`` then ``return x``: the batched branch binds ``x = xs[-1]``,
    what the loop leaves (the very object for a list, the same view for a tensor)."""
    src = """\
    def f(xs, ws):
        for x in xs:
            ws += x * 2
        return x
    """
    orig, new, _, sites = pair(src, "f")
    assert [s.action for s in sites] == [REWRITTEN]
    xs = [torch.randn(3) for _ in range(6)]
    w1, w2 = torch.zeros(3), torch.zeros(3)
    assert orig(xs, w1) is xs[-1] and new(xs, w2) is xs[-1]
    torch.testing.assert_close(w1, w2)


# ------------------------------------------------------------------ penalties over m.parameters()

PENALTY_FORMS = {
    "trpo": "value_loss += param.pow(2).sum() * l2_reg",
    "coef_left": "value_loss = value_loss + l2_reg * torch.sum(param ** 2)",
    "l1": "value_loss += param.abs().sum() / l2_reg",
    "right": "value_loss = (param * param).sum() * l2_reg + value_loss",
    "minus": "value_loss -= torch.sum(param.pow(2)) * l2_reg",
}


def penalty_source(body):
    return (
        "import torch\n"
        "def get_value_loss(value_net, states, targets, l2_reg):\n"
        "    values_ = value_net(states)\n"
        "    value_loss = (values_ - targets).pow(2).mean()\n"
        "    for param in value_net.parameters():\n"
        f"        {body}\n"
        "    return value_loss\n"
    )


def penalty_net(sizes, dtype, seed):
    torch.manual_seed(seed)
    layers = [torch.nn.Identity()]
    for a, b in zip(sizes, sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers).to(dtype)


def run_penalty(fn, net, states, targets, coef):
    import copy

    net = copy.deepcopy(net)
    loss = fn(net, states, targets, coef)
    grads = torch.autograd.grad(loss, list(net.parameters())) if list(net.parameters()) else ()
    return loss, grads


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    form=st.sampled_from(sorted(PENALTY_FORMS)),
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    coef=st.sampled_from([1e-3, 0.5, 3, torch.tensor(1e-3)]),
    seed=st.integers(0, 2**16),
)
def test_penalty_over_parameters_differential(form, sizes, dtype, coef, seed):
    """One sum over the parameters laid end to end: the loss and every parameter's gradient agree
    to rounding; a one-layer-free network (no parameters) keeps the loss as it was."""
    src = penalty_source(PENALTY_FORMS[form])
    orig, new, out, sites = pair(src, "get_value_loss")
    assert [(s.action, s.exactness) for s in sites] == [(REWRITTEN, REASSOCIATED)], sites
    net = penalty_net(sizes, dtype, seed)
    states = torch.randn(5, sizes[0], dtype=dtype)
    targets = torch.randn(5, sizes[-1], dtype=dtype)
    if isinstance(coef, torch.Tensor):
        coef = coef.to(dtype)
    (l1, g1), (l2, g2) = run_penalty(orig, net, states, targets, coef), run_penalty(new, net, states, targets, coef)
    assert l1.dtype == l2.dtype and l1.shape == l2.shape
    torch.testing.assert_close(l1, l2)
    for x, y in zip(g1, g2):
        torch.testing.assert_close(x, y)


@pytest.mark.parametrize("case", ["half", "numpy_coef", "empty", "acc_is_a_param"])
def test_penalty_guard_runs_the_loop(case):
    """What flat_params declines: the loop runs as written (the same value bit for bit)."""
    import numpy as np

    src = penalty_source(PENALTY_FORMS["trpo"])
    orig, new, out, _ = pair(src, "get_value_loss")
    net = penalty_net([3, 4, 2], torch.float32, 0)
    states, targets, coef = torch.randn(5, 3), torch.randn(5, 2), 1e-3
    if case == "half":
        net = net.half()
        states, targets = states.half(), targets.half()
    elif case == "numpy_coef":
        coef = np.float32(1e-3)
    elif case == "empty":
        net = torch.nn.Sequential(torch.nn.Identity())
        targets = states
    if case == "acc_is_a_param":  # `acc += ...` in place into a parameter the loop reads later
        w = net[1].weight
        assert loop_batch.flat_params(list(net.parameters()), w, (coef,)) is None
        assert loop_batch.flat_params(list(net.parameters()), w.detach().clone(), (coef,)) is not None
        return
    assert (loop_batch.flat_params(list(net.parameters()), 0.0, (coef,)) is None) is True
    (l1, g1), (l2, g2) = run_penalty(orig, net, states, targets, coef), run_penalty(new, net, states, targets, coef)
    assert torch.equal(l1, l2) and all(torch.equal(x, y) for x, y in zip(g1, g2))


def test_penalty_guard_declines_mixed_dtypes_and_devices():
    a, b = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(2, 2, dtype=torch.float64))
    assert loop_batch.flat_params([a, b], 0.0, (1e-3,)) is None
    assert loop_batch.flat_params([a, a.detach().clone()], 0.0, (1e-3,)) is not None
    assert loop_batch.flat_params([], 0.0, ()) is None
    assert loop_batch.flat_params((a,), 0.0, ()) is None  # a tuple: not what list(...) gave
    assert loop_batch.flat_params([a], 0.0, (torch.tensor(1.0, dtype=torch.float64),)) is None


@pytest.mark.parametrize("body", [
    "value_loss += torch.norm(param) * l2_reg",  # a norm is not additive over the parameters
    "value_loss += param.pow(2).sum(0).mean() * l2_reg",  # a sum over one dimension
    "value_loss += (param - w0).pow(2).sum() * l2_reg",  # broadcast against a tensor
    "value_loss += param.pow(2).mean() * l2_reg",  # a mean: weights differ once laid end to end
    "value_loss += param.pow(2).sum() * param.numel()",  # the scale reads the parameter
    "value_loss *= param.pow(2).sum()",
])
def test_penalty_look_alikes_left_alone(body):
    src = penalty_source(body).replace("l2_reg):", "l2_reg, w0=0):")
    out, sites = rewrite(src)
    assert out == src
    assert all(s.action == SKIPPED for s in sites), sites


def test_penalty_loop_variable_read_after_the_loop_is_left_alone():
    src = penalty_source(PENALTY_FORMS["trpo"]).replace("    return value_loss\n", "    return value_loss, param\n")
    out, sites = rewrite(src)
    assert out == src and [s.action for s in sites] == [SKIPPED]
    assert "`param` may be read outside the loop" in sites[0].reason


def test_iterable_expression_reason_says_what_to_write_and_that_works():
    """The reason for an iterable expression names the fix; written that way, the loop is rewritten."""
    src = """\
    def f(xs, k):
        total = 0
        for x in xs[:k]:
            total += x * 2
        return total
    """
    out, sites = rewrite(src)
    assert "bind it to a name before the loop (`items = xs[:k]`" in sites[0].reason
    fixed = src.replace("        for x in xs[:k]:", "        items = xs[:k]\n        for x in items:")
    orig, new, _, sites = pair(fixed, "f")
    assert [s.action for s in sites] == [REWRITTEN]
    compare(orig, new, (torch.randn(7, 3, requires_grad=True), 5), exact=False)


def test_parameters_iterable_reason_names_the_understood_form():
    src = """\
    import torch
    def f(net):
        reg = torch.tensor(0.)
        for param in net.parameters():
            reg += torch.norm(param) ** 2
        return reg
    """
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src)
    assert [s.action for s in sites] == [SKIPPED]
    assert "iterates `net.parameters()`: parameters of different shapes" in sites[0].reason
    assert "acc += p.pow(2).sum() * c" in sites[0].reason


def test_a_temporary_rebound_from_itself_in_the_same_iteration_carries_nothing():
    """dongminlee94/deep_rl's TRPO update_model: ``new_param = new_params[index: ...]`` then
    ``new_param = new_param.view(params.size())`` in one iteration. The skip said `new_param`
    "carries a value from one iteration to the next": each iteration binds it afresh. It is bound
    twice (what the analysis refuses); a name read before any binding in the body still carries."""
    src = textwrap.dedent('''
        import torch
        def update_model(model, new_params):
            index = 0
            total = 0.0
            for params in model.parameters():
                params_length = len(params.view(-1))
                new_param = new_params[index: index + params_length]
                new_param = new_param.view(params.size())
                total += new_param.sum()
            return total
    ''')
    out, sites = rewrite(src, dedent=False)
    assert out == src
    assert [(s.action, s.reason) for s in sites] == [(SKIPPED, "`new_param` is bound twice in the body")], sites
    carried = src.replace("        new_param = new_params[index: index + params_length]\n", "")
    assert "`new_param` carries a value from one iteration to the next" in rewrite(carried, dedent=False)[1][0].reason
