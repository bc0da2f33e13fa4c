"""vectorize.recurrence under autograd: rewritten loops whose inputs require grad (Dreamer
lambda-returns on imagined trajectories, actor-critic returns / GAE through a critic that is not
detached) take the vectorized branch, and give the loop's values and gradients: bitwise where no
value the gradients flow through has more than two uses, up to reassociation where one has three
(see the policy in ``runtime.vectorized.recurrence_ok``). The guard's refusals under autograd
(in-place writes into leaves, read-back outputs, loop-invariant tensors that require grad) are
checked to keep the loop's behaviour, errors included.
"""
from conftest import TESTS  # tests/: the corpus, fake_torch_npu and the repository root beside it
import os

import pytest
import torch
from hypothesis import given, settings, strategies as st

from scalebox_cst.report import EXACT, REWRITTEN
from scalebox_cst.runtime import vectorized as vectorized_mod
import harness

HERE = TESTS
with open(os.path.join(HERE, "corpus", "dreamerv2_lambda_return.py")) as _f:
    DREAMER = _f.read().split("\nEXPECT = {")[0] + "\n"  # the function verbatim, not the harness

CLEANRL_GAE = """\
import torch
def gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    returns = advantages + values
    return advantages, returns
"""

RETURNS_INSERT = """\
def returns_of(rewards, masks, next_value, gamma):
    R = next_value
    returns = []
    for step in reversed(range(len(rewards))):
        R = rewards[step] + gamma * masks[step] * R
        returns.insert(0, R)
    return returns
"""

RETURNS_APPEND = """\
def returns_of(rewards, masks, next_value, gamma):
    returns = []
    R = next_value
    for r, m in zip(reversed(rewards), reversed(masks)):
        R = r + gamma * m * R
        returns.append(R)
    returns.reverse()
    return returns
"""

RETURNS_TENSOR = """\
import torch
def returns_of(rewards, dones, last_value, gamma):
    returns = torch.zeros_like(rewards)
    R = last_value
    for t in reversed(range(rewards.shape[0])):
        R = rewards[t] + gamma * (1.0 - dones[t]) * R
        returns[t] = R
    return returns
"""

INTO = """\
def returns_into(rewards, gamma, out):
    R = 0.0
    for t in reversed(range(len(rewards))):
        R = rewards[t] + gamma * R
        out[t] = R
    return out
"""

MIN_T = vectorized_mod.MIN_STEPS["torch"]
assert MIN_T == vectorized_mod.MIN_STEPS["tlist"]
_CACHE: dict = {}


def functions(src, name):
    """(original, rewritten) function; the rewrite is checked to claim exact with the gradient
    condition in its details (the linear_recurrence contract)."""
    if src not in _CACHE:
        f1, f2, _, all_sites = harness.pair(src, name, "vectorize.recurrence", dedent=False)
        sites = [s for s in all_sites if s.action == REWRITTEN]
        assert len(sites) == 1, [s.describe() for s in all_sites]
        assert sites[0].exactness == EXACT
        gradients = " ".join(sites[0].details["contracts"]["linear_recurrence"]["checks"])
        assert "gradients through it bitwise too where no value they flow through has more than two uses" in gradients
        assert "else reassociated" in gradients
        _CACHE[src] = (f1, f2)
    return _CACHE[src]


class Spy:
    """Records what recurrence_ok answered while the rewritten code ran."""

    def __enter__(self):
        self.answers = []
        self.real = real = vectorized_mod.recurrence_ok

        def spy(*a, **k):
            self.answers.append(real(*a, **k))
            return self.answers[-1]

        vectorized_mod.recurrence_ok = spy
        return self

    def __exit__(self, *exc):
        vectorized_mod.recurrence_ok = self.real

    @property
    def vectorized(self):
        return True in self.answers


def run(fn, make, loss_of, wrt, create_graph=False):
    """Values (detached) and gradients w.r.t. the inputs at ``wrt`` of one call on fresh inputs;
    or the type of the exception raised."""
    args = make()
    try:
        out = fn(*args)
        loss = loss_of(out)
        if not loss.requires_grad:  # nothing to differentiate (T == 0)
            return detach(out), None
        grads = torch.autograd.grad(loss, [args[i] for i in wrt], allow_unused=True, create_graph=create_graph)
    except Exception as exc:
        return type(exc), None
    return detach(out), grads


def detach(x):
    if isinstance(x, torch.Tensor):
        return x.detach()
    return type(x)(detach(e) for e in x)


def same(a, b, exact):
    if isinstance(a, type) or isinstance(b, type):
        assert a == b, (a, b)
    elif a is None or b is None:
        assert a is None and b is None
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        if exact:
            assert torch.equal(a, b), (a - b).abs().max()
        else:
            torch.testing.assert_close(a, b)
    else:
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y, exact)


def differential(src, name, make, loss_of, wrt, exact_grads, T):
    """Original vs rewritten: values bitwise; gradients bitwise for the indices in ``exact_grads``
    (the rest assert_close); the vectorized branch taken iff T reaches the guard's minimum."""
    orig, new = functions(src, name)
    v1, g1 = run(orig, make, loss_of, wrt)
    with Spy() as spy:
        v2, g2 = run(new, make, loss_of, wrt)
    assert spy.vectorized == (T >= MIN_T), spy.answers
    same(v1, v2, True)
    if g1 is None or g2 is None:
        assert g1 is None and g2 is None
        return
    for i, a, b in zip(wrt, g1, g2):
        if a is None or b is None:
            assert a is None and b is None
            continue
        same(a, b, i in exact_grads)


SIZES = dict(
    T=st.integers(0, 40),
    N=st.integers(1, 5),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**31 - 1),
    p_done=st.sampled_from([0.0, 0.1, 0.5]),
)


def weights(g, shape, dtype):
    return torch.randn(shape, generator=g, dtype=dtype)


# --------------------------------------------------------------------------- differential, hypothesis


@settings(max_examples=30, deadline=None)
@given(**SIZES, with_returns=st.booleans())
def test_cleanrl_gae_through_the_critic(T, N, dtype, seed, p_done, with_returns):
    """Actor-critic GAE with values that require grad. Advantages alone: values[t] has two uses
    (delta[t], delta[t - 1]): bitwise. With ``returns = advantages + values`` in the loss it has
    three: the values' gradient is reassociated, the rewards' and next value's stay bitwise."""

    def make():
        g = torch.Generator().manual_seed(seed)
        rewards = torch.randn(T, N, generator=g, dtype=dtype).requires_grad_()
        values = torch.randn(T, N, generator=g, dtype=dtype).requires_grad_()
        dones = (torch.rand(T, N, generator=g) < p_done).to(dtype)
        next_value = torch.randn(N, generator=g, dtype=dtype).requires_grad_()
        next_done = (torch.rand(N, generator=g) < p_done).to(dtype)
        return rewards, values, dones, next_value, next_done, 0.99, 0.95

    w = weights(torch.Generator().manual_seed(seed + 1), (T, N), dtype)
    if with_returns:
        loss_of = lambda out: (out[0] * w).sum() + out[1].pow(2).sum()  # noqa: E731
        exact = {0, 3}
    else:
        loss_of = lambda out: (out[0] * w).sum()  # noqa: E731
        exact = {0, 1, 3}
    differential(CLEANRL_GAE, "gae", make, loss_of, [0, 1, 3], exact, T)


@settings(max_examples=30, deadline=None)
@given(**SIZES)
def test_dreamer_lambda_return(T, N, dtype, seed, p_done):
    """dreamerv2's compute_return verbatim, reward, value, discount (a learned discount head) and
    bootstrap all requiring grad: no value has more than two uses, everything bitwise."""
    T = max(T, 1)  # torch.stack of no outputs raises in both; covered by test_exceptions_match

    def make():
        g = torch.Generator().manual_seed(seed)
        reward = torch.randn(T, N, 1, generator=g, dtype=dtype).requires_grad_()
        value = torch.randn(T, N, 1, generator=g, dtype=dtype).requires_grad_()
        discount = (0.99 * (torch.rand(T, N, 1, generator=g) >= p_done)).to(dtype).requires_grad_()
        bootstrap = torch.randn(N, 1, generator=g, dtype=dtype).requires_grad_()
        return reward, value, discount, bootstrap, 0.95

    w = weights(torch.Generator().manual_seed(seed + 1), (T, N, 1), dtype)
    differential(DREAMER, "compute_return", make, lambda out: (out * w).sum(), [0, 1, 2, 3], {0, 1, 2, 3}, T)


@pytest.mark.parametrize("src", [RETURNS_INSERT, RETURNS_APPEND], ids=["insert0", "append_reverse"])
@settings(max_examples=25, deadline=None)
@given(**SIZES, scalar_masks=st.booleans())
def test_lists_of_tensors(src, T, N, dtype, seed, p_done, scalar_masks):
    """ikostrikov-style returns over lists of per-step tensors, masks per env or one per step, the
    bootstrap value from the critic requiring grad: each list item keeps its own history (the
    gradient reaches the bootstrap value through every item). Rewards that require grad in a
    list keep the loop (see recurrence_ok): the last check."""

    def make(reward_grad=False):
        g = torch.Generator().manual_seed(seed)
        rewards = [torch.randn(N, generator=g, dtype=dtype).requires_grad_(reward_grad) for _ in range(T)]
        shape = () if scalar_masks else (N,)
        masks = [(torch.rand(shape, generator=g) >= p_done).to(dtype) for _ in range(T)]
        next_value = torch.randn(N, generator=g, dtype=dtype).requires_grad_()
        return rewards, masks, next_value, 0.99

    w = weights(torch.Generator().manual_seed(seed + 1), (T, N), dtype)

    def loss_of(out):
        return (torch.stack(out) * w).sum() if out else torch.zeros(())

    orig, new = functions(src, "returns_of")

    def call(fn, reward_grad=False):  # gradients w.r.t. the bootstrap value (and the rewards)
        rewards, masks, next_value, gamma = make(reward_grad)
        out = fn(rewards, masks, next_value, gamma)
        loss = loss_of(out)
        wrt = (rewards if reward_grad else []) + [next_value]
        grads = torch.autograd.grad(loss, wrt) if loss.requires_grad else None
        return detach(out), grads

    v1, g1 = call(orig)
    with Spy() as spy:
        v2, g2 = call(new)
    assert spy.vectorized == (T >= MIN_T), spy.answers
    same(v1, v2, True)
    same(g1, g2, True)
    if T >= MIN_T:  # every item a tensor of its own with its own history, as the loop's
        assert all(r.grad_fn is not None and r._base is None for r in new(*make()))
    v1, g1 = call(orig, True)
    with Spy() as spy:
        v2, g2 = call(new, True)
    assert not spy.vectorized
    same(v1, v2, True)
    same(g1, g2, True)


@settings(max_examples=25, deadline=None)
@given(**SIZES, done_rows=st.booleans())
def test_returns_into_a_fresh_tensor(T, N, dtype, seed, p_done, done_rows):
    """``returns[t] = R`` into ``torch.zeros_like(rewards)`` (a fresh tensor: fine in the loop),
    rewards and the bootstrap value requiring grad; dones per env or [T, 1]."""

    def make():
        g = torch.Generator().manual_seed(seed)
        rewards = torch.randn(T, N, generator=g, dtype=dtype).requires_grad_()
        dones = (torch.rand(T, 1 if done_rows else N, generator=g) < p_done).to(dtype)
        last_value = torch.randn(N, generator=g, dtype=dtype).requires_grad_()
        return rewards, dones, last_value, 0.97

    w = weights(torch.Generator().manual_seed(seed + 1), (T, N), dtype)
    differential(RETURNS_TENSOR, "returns_of", make, lambda out: (out * w).sum(), [0, 2], {0, 2}, T)


# --------------------------------------------------------------------------- higher order, errors


def gae_inputs(T=24, N=3, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, N, generator=g, dtype=dtype).requires_grad_()
    values = torch.randn(T, N, generator=g, dtype=dtype).requires_grad_()
    dones = (torch.rand(T, N, generator=g) < 0.1).to(dtype)
    next_value = torch.randn(N, generator=g, dtype=dtype).requires_grad_()
    return rewards, values, dones, next_value, torch.zeros(N, dtype=dtype), 0.99, 0.95


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_double_backward(dtype):
    """Second derivatives through the op's differentiable backward (a gradient penalty on the
    critic): equal to the loop's up to rounding."""
    orig, new = functions(CLEANRL_GAE, "gae")
    outs = []
    for fn, vec in ((orig, False), (new, True)):
        args = gae_inputs(dtype=dtype)
        rewards, values, dones, next_value = args[:4]
        with Spy() as spy:
            adv, _ = fn(*args)
        assert spy.vectorized == vec
        w = torch.linspace(-1, 1, adv.numel(), dtype=dtype).view_as(adv)
        (gv,) = torch.autograd.grad((adv.pow(2) * w).sum(), values, create_graph=True)
        outs.append(torch.autograd.grad(gv.pow(2).sum(), [rewards, values, next_value]))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b)
    assert any(a.abs().sum() > 0 for a in outs[0])  # the second derivative is not trivially zero


def test_exceptions_match():
    """No steps: the Dreamer code raises in torch.stack of no outputs, in both."""
    orig, new = functions(DREAMER, "compute_return")
    args = lambda: (torch.zeros(0, 2, 1, requires_grad=True), torch.zeros(0, 2, 1),  # noqa: E731
                    torch.zeros(0, 2, 1), torch.zeros(2, 1), 0.95)
    with pytest.raises(RuntimeError):
        orig(*args())
    with pytest.raises(RuntimeError):
        new(*args())


def test_in_place_into_a_leaf_that_requires_grad_raises_as_in_the_loop():
    """``out[t] = R`` into a leaf (or a view of one) that requires grad raises in the loop under
    grad mode: the guard sends it there, so the rewrite raises the same error."""
    orig, new = functions(INTO, "returns_into")
    rewards = torch.randn(12)
    for make_out in (lambda: torch.zeros(12, requires_grad=True),
                     lambda: torch.zeros(12, 2, requires_grad=True)[:, 0]):
        errors = []
        for fn in (orig, new):
            with Spy() as spy, pytest.raises(RuntimeError) as info:
                fn(rewards, 0.9, make_out())
            errors.append(str(info.value).split("\n")[0])
            assert True not in spy.answers
        assert errors[0] == errors[1]
    # under no_grad the loop writes into the leaf; so does the loop of the rewrite (the guard keeps
    # refusing outputs that require grad there)
    with torch.no_grad():
        a, b = orig(rewards, 0.9, torch.zeros(12, requires_grad=True)), new(rewards, 0.9, torch.zeros(12, requires_grad=True))
    assert torch.equal(a, b)


def test_non_leaf_output_and_saved_tensor_version_errors():
    """A non-leaf output (``out = w * 1``) is written by both versions: gradients of the
    overwritten rows are zero in both, the rest bitwise; a tensor saved from ``out`` before the
    loop makes backward fail in both (each version bumps ``out``'s version counter)."""
    orig, new = functions(INTO, "returns_into")
    rewards = torch.randn(12, 2, dtype=torch.float64, requires_grad=True)
    w0 = torch.randn(14, 2, dtype=torch.float64)
    grads = []
    for fn in (orig, new):
        w = w0.clone().requires_grad_()
        out = w * 1.0
        with Spy() as spy:
            res = fn(rewards, 0.9, out)
        assert spy.vectorized == (fn is new)
        grads.append(torch.autograd.grad((res * res).sum(), [rewards, w]))
    same(grads[0], grads[1], True)
    assert torch.equal(grads[1][1][:12], torch.zeros(12, 2, dtype=torch.float64))
    for fn in (orig, new):
        w = torch.randn(14, 2, dtype=torch.float64, requires_grad=True)
        out = w * 1.0
        saved = out * out  # saves out
        fn(rewards, 0.9, out)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            saved.sum().backward()


def test_list_items_can_be_modified_in_place():
    """The loop's list items are tensors of their own: modifying one in place afterwards works
    (and changes the gradient the same way) in the rewrite too; views of one unbind would raise."""
    orig, new = functions(RETURNS_INSERT, "returns_of")
    grads = []
    for fn in (orig, new):
        g = torch.Generator().manual_seed(3)
        rewards = [torch.randn(4, generator=g) for _ in range(20)]
        masks = [torch.ones(4) for _ in range(20)]
        next_value = torch.randn(4, generator=g).requires_grad_()
        with Spy() as spy:
            out = fn(rewards, masks, next_value, 0.9)
        assert spy.vectorized == (fn is new)
        out[7].mul_(3.0)
        out[8].add_(1.0)
        grads.append(torch.autograd.grad(torch.stack(out).pow(2).sum(), next_value))
    same(grads[0], grads[1], True)


# --------------------------------------------------------------------------- the guard's policy


def test_guard_policy_under_autograd():
    ok = vectorized_mod.recurrence_ok
    T = 16
    x = torch.randn(T, 3, requires_grad=True)
    plain = torch.randn(T, 3)
    assert ok(T, seqs=((x, 0),), consts=(0.9,), cpu=True)  # accepted now
    assert ok(T, seqs=((list(plain.unbind(0)), 0),), consts=(0.9,))  # lists of tensors without grad
    assert not ok(T, seqs=((list(x.unbind(0)), 0),), consts=(0.9,))  # with grad: see the docstring
    assert ok(T, seqs=((x, 0), (plain, 0)), outs=(torch.zeros(T, 3),))
    assert ok(T, seqs=((x, 0),), outs=(torch.zeros(T, 3, requires_grad=True) * 1,))  # a non-leaf
    # declined: the loop keeps what it does
    assert not ok(T, seqs=((x, 0),), consts=(torch.tensor(0.9, requires_grad=True),))  # sum over steps
    assert not ok(T, seqs=((plain, 0),), scalars=(torch.tensor(0.9, requires_grad=True),))
    assert not ok(T, seqs=((plain, 0), (torch.randn(T, 1, requires_grad=True), 0)), aligned=True)  # broadcast row
    assert not ok(T, seqs=((x, 0),), outs=(torch.zeros(T, 3), torch.zeros(T, 3)))  # two outputs
    assert not ok(T, seqs=((x, 0),), outs=(torch.zeros(T, 3),), lists=([],))
    assert not ok(T, seqs=((x, 0),), outs=(torch.zeros(T, 1, 3),))  # rows other than the row shape
    assert not ok(T, seqs=((x, 0),), memo=(torch.zeros(T, 3),))  # read back
    assert not ok(T, seqs=((x, 0),), outs=(torch.zeros(T, 3, requires_grad=True),))  # a leaf
    assert not ok(T, seqs=((x, 0),), outs=(torch.zeros(T, 2, 3, requires_grad=True)[:, 0],))  # its view
    assert not ok(T, seqs=((x.half(), 0),))  # float16 never
    # the same without grad flowing: as before
    assert ok(T, seqs=((plain, 0),), outs=(torch.zeros(T, 3), torch.zeros(T, 3)))
    assert ok(T, seqs=((plain, 0),), memo=(torch.zeros(T, 3),))
    with torch.no_grad():
        assert ok(T, seqs=((x, 0),), consts=(torch.tensor(0.9, requires_grad=True),))
        assert ok(T, seqs=((x, 0),), outs=(torch.zeros(T, 3), torch.zeros(T, 3)))
    # quadratic sums keep the loop whenever grad flows
    assert not vectorized_mod.quadratic_ok(T, seqs=((x, 0),))
    assert vectorized_mod.quadratic_ok(T, seqs=((plain, 0),))


def test_items_of_keeps_history_per_item():
    seq = torch.randn(5, 3, requires_grad=True) * 2
    items = vectorized_mod.items_of(seq, [None])
    assert all(i._base is None and i.grad_fn is not None for i in items)
    with torch.no_grad():  # a tensor of its own each, as the loop appends: no storage shared
        items = vectorized_mod.items_of(seq, [None])
        assert all(i._base is None for i in items)
        assert len({i.untyped_storage().data_ptr() for i in items}) == len(items)
