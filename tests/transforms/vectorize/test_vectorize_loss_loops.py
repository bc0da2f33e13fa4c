"""vectorize.reduction on per-sample loss loops: temporaries, ``.item()``, per-sample losses.

Differential tests exec the original and the rewritten function on the same random inputs and
compare values and the gradients of every input that requires grad (bitwise where the site says
``exact``, and on the forms whose consumer is ``torch.stack(xs).sum()`` of the same per-sample
values, measured bitwise on CPU although the site keeps the reduction's ``reassociated``);
guard tests check that the loop runs where the batched form would compute something else;
look-alikes come back byte for byte with their reason.
"""
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scalebox_cst.runtime.vectorized as V
from scalebox_cst.report import EXACT, REASSOCIATED, REWRITTEN, SKIPPED
from scalebox_cst.transforms.vectorize.reduction import ID
from differential import LOSS_LOOP, loss_spy as Spy
from harness import load, pairer, rewriter

rewrite = rewriter(ID)
pair = pairer(ID)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def clone(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone().requires_grad_(x.requires_grad)
    if isinstance(x, list):
        return [clone(e) for e in x]
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*map(clone, x))
    if isinstance(x, tuple):
        return tuple(map(clone, x))
    return x


def leaves(x, out):
    if isinstance(x, torch.Tensor) and x.requires_grad:
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for e in x:
            leaves(e, out)
    return out


def check(orig, new, args, bitwise):
    """Run both on clones of ``args``; results equal (bitwise or to rounding), gradients too."""
    a1, a2 = clone(args), clone(args)
    r1, r2 = orig(*a1), new(*a2)
    if not isinstance(r1, torch.Tensor):  # an empty loop leaves the accumulator as it was
        assert type(r1) is type(r2) and r1 == r2
        return
    assert isinstance(r2, torch.Tensor) and r1.shape == r2.shape and r1.dtype == r2.dtype, (r1, r2)
    if bitwise:
        assert torch.equal(r1, r2), (r1, r2)
    else:
        torch.testing.assert_close(r1, r2)
    l1, l2 = leaves(a1, []), leaves(a2, [])
    if r1.requires_grad:
        g1 = torch.autograd.grad(r1.sum(), l1, allow_unused=True)
        g2 = torch.autograd.grad(r2.sum(), l2, allow_unused=True)
        for x, y in zip(g1, g2):
            if x is None or y is None:
                assert x is None and y is None
            elif bitwise:
                assert torch.equal(x, y)
            else:
                torch.testing.assert_close(x, y)


# ------------------------------------------------------------------ pytorch/examples actor_critic.py

ACTOR_CRITIC = """\
from collections import namedtuple

import torch
import torch.nn.functional as F

SavedAction = namedtuple('SavedAction', ['log_prob', 'value'])


def finish_episode(saved_actions, rewards, gamma, eps):
    R = 0
    policy_losses = []
    value_losses = []
    returns = []
    for r in rewards[::-1]:
        R = r + gamma * R
        returns.insert(0, R)
    returns = torch.tensor(returns)
    returns = (returns - returns.mean()) / (returns.std() + eps)
    for (log_prob, value), R in zip(saved_actions, returns):
        advantage = R - value.item()
        policy_losses.append(-log_prob * advantage)
        value_losses.append(F.smooth_l1_loss(value, torch.tensor([R])))
    loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()
    return loss
"""


def actor_critic_inputs(T, seed, ns, dtype=torch.float32):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    net = torch.nn.Linear(4, 3).to(dtype)
    out = net(torch.randn(T, 4, generator=g, dtype=dtype) * 3)
    logp = torch.log_softmax(out[:, :2], -1)
    acts = torch.randint(0, 2, (T,), generator=g)
    saved = [ns["SavedAction"](logp[t, acts[t]], out[t, 2:]) for t in range(T)]
    rewards = [float(x) for x in torch.rand(T, generator=g) * 4]
    return net, saved, rewards


@pytest.mark.parametrize("T", [4, 5, 17, 300])
def test_actor_critic_verbatim(T, monkeypatch):
    spy = Spy(monkeypatch)
    orig, new, out, sites = pair(ACTOR_CRITIC, "finish_episode")
    done = [s for s in sites if s.transform == ID]
    assert [(s.action, s.exactness) for s in done] == [(REWRITTEN, REASSOCIATED)]
    assert "for (log_prob, value), R in zip(saved_actions, returns):" in out  # the loop kept as fallback
    results = []
    for fn in (orig, new):
        ns = {"SavedAction": load(ACTOR_CRITIC, "SavedAction")}
        net, saved, rewards = actor_critic_inputs(T, T, ns)
        loss = fn(saved, rewards, 0.99, 1e-7)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in net.parameters()]))
    assert spy.fast
    (l1, g1), (l2, g2) = results
    # measured bitwise: the batched values are the per-sample ones, summed as the same [T] tensor
    assert torch.equal(l1, l2)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2))




@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    T=st.integers(0, 9),
    vshape=st.sampled_from([(), (1,)]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    as_list=st.booleans(),
    scale=st.sampled_from([0.1, 1.0, 4.0]),  # |value - R| on both sides of smooth_l1's beta = 1
    seed=st.integers(0, 2**16),
)
def test_actor_critic_loss_loop_differential(T, vshape, dtype, as_list, scale, seed):
    """The loss loop alone: namedtuples of (0-d log-prob, value of shape [] or [1]), returns as a
    tensor or a list of 0-d tensors; loss and the gradients of log-probs and values bitwise."""
    orig, new, _, sites = pair(LOSS_LOOP, "f")
    assert [s.action for s in sites] == [REWRITTEN]
    SA = load(LOSS_LOOP, "SavedAction")
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(T, generator=g, dtype=dtype)
    values = torch.randn(T, *vshape, generator=g, dtype=dtype) * scale
    rets = torch.randn(T, generator=g, dtype=dtype) * scale

    def run(fn):
        lp, v = logp.clone().requires_grad_(), values.clone().requires_grad_()
        saved = [SA(a, b) for a, b in zip(lp.unbind(0), v.unbind(0))]
        try:
            loss = fn(saved, list(rets.unbind(0)) if as_list else rets)
        except RuntimeError as exc:  # an empty episode: torch.stack([]) raises
            return type(exc)
        return (loss.detach(),) + torch.autograd.grad(loss, (lp, v))

    a, b = run(orig), run(new)
    if isinstance(a, type):
        assert a is b
        return
    assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b)), (a, b)


def test_actor_critic_short_episode_keeps_the_loop(monkeypatch):
    spy = Spy(monkeypatch)
    orig, new, _, _ = pair(ACTOR_CRITIC, "finish_episode")
    for T in (2, 3):
        ns = {"SavedAction": load(ACTOR_CRITIC, "SavedAction")}
        _, saved, rewards = actor_critic_inputs(T, T, ns)
        assert torch.equal(orig(saved, rewards, 0.99, 1e-7), new(saved, rewards, 0.99, 1e-7))
    assert spy.results and not spy.fast


def test_actor_critic_golden():
    out, _ = rewrite(ACTOR_CRITIC)
    fast = out.split("if _sb_batch is not None:\n")[1].split("    else:\n")[0]
    assert fast == textwrap.indent(textwrap.dedent("""\
        _sb_log_prob, _sb_value, _sb_R = _sb_batch.seqs
        _sb_advantage = (_sb_R - _sb_batch.weak(_sb_batch.item(_sb_value)))
        _sb_policy_losses = _sb_batch.fit(((-_sb_log_prob) * _sb_advantage), 0)
        _sb_value_losses = _sb_batch.fit(F.smooth_l1_loss(_sb_value, _sb_batch.new(_sb_R), reduction='none'), 1)
        """), " " * 8)
    assert ("_sb_loss_zip((saved_actions, returns), ((True, True), True), (), (), units=(1,), zerod=(2,), "
            "fits=(((0, 2), (), 0), ((), (), 0)), rank=1, cpu=True, floats=True)") in out


# ------------------------------------------------------------------ forms found in public RL code

FORMS = {
    # graph actor-critic (reward.unsqueeze(0) as the target, one running sum)
    "ac_sum": ("""\
        import torch
        import torch.nn.functional as F
        def f(logprobs, values, rewards, c):
            loss = 0
            for logprob, value, reward in zip(logprobs, values, rewards):
                advantage = reward - value.item()
                action_loss = -logprob * advantage
                value_loss = F.smooth_l1_loss(value, reward.unsqueeze(0))
                loss += (action_loss + value_loss)
            return loss
        """, REASSOCIATED),
    # TD errors over an index
    "td_range": ("""\
        def f(logprobs, values, rewards, c):
            loss = 0.0
            for i in range(len(rewards)):
                td = rewards[i] - values[i]
                loss += td ** 2
            return loss
        """, REASSOCIATED),
    # advantage from .item(), accumulated as loss = loss + (...)
    "adv_item_range": ("""\
        def f(logprobs, values, rewards, c):
            loss = 0
            for i in range(len(logprobs)):
                adv = rewards[i] - values[i].item()
                loss = loss + (-logprobs[i] * adv)
            return loss
        """, REASSOCIATED),
    # Python-float arithmetic per sample (float64 in the loop), then a tensor: stacked, exact
    "py_chain": ("""\
        import torch
        def f(logprobs, values, rewards, c):
            out = []
            for lp, v, r in zip(logprobs, values, rewards):
                scaled = v.item() * c - 0.1
                gap = float(r) - scaled
                out.append(lp * gap + r * c)
            return torch.stack(out)
        """, EXACT),
    # critic loss per sample, mean of torch.cat
    "mse_cat_mean": ("""\
        import torch
        import torch.nn.functional as F
        def f(logprobs, values, rewards, c):
            losses = []
            for v, r in zip(values, rewards):
                target = torch.tensor([r])
                losses.append(F.mse_loss(v, target) * c)
            return torch.stack(losses).mean()
        """, REASSOCIATED),
    # REINFORCE with an entropy bonus summed as is (one sum computes nothing per sample)
    "entropy_bonus": ("""\
        def f(logprobs, values, rewards, c):
            policy_loss = 0.0
            entropy_bonus = 0.0
            for log_prob, advantage, entropy in zip(logprobs, rewards, values):
                policy_loss += -log_prob * advantage
                entropy_bonus += entropy
            return policy_loss - c * entropy_bonus
        """, REASSOCIATED),
    # one episode's return as a 1-element tensor: the target of every sample's critic loss
    "mse_invariant_target": ("""\
        import torch
        import torch.nn.functional as F
        def f(logprobs, values, rewards, c):
            R = torch.tensor([float(c)], dtype=values[0].dtype)
            policy_loss = 0
            value_loss = 0
            for log_prob, value in zip(logprobs, values):
                advantage = R - value.detach()
                policy_loss += -log_prob * advantage
                value_loss += F.mse_loss(value, R)
            return policy_loss + value_loss
        """, REASSOCIATED),
    # two lists of different per-sample ranks (the old path's [T, 1] result)
    "ranks": ("""\
        import torch
        def f(logprobs, values, rewards, c):
            a = []
            b = []
            for lp, v in zip(logprobs, values):
                a.append(lp * c)
                b.append(v * 2)
            return torch.stack(a)[:, None] + torch.stack(b)
        """, EXACT),
}


def form_inputs(T, vshape, dtype, seed, kind):
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(T, generator=g, dtype=dtype).requires_grad_()
    values = torch.randn(T, *vshape, generator=g, dtype=dtype).requires_grad_()
    rewards = torch.randn(T, generator=g, dtype=dtype) * 2
    if kind == "list":
        return [list(logp.unbind(0)), list(values.unbind(0)), list(rewards.unbind(0))]
    return [logp, values, rewards]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    form=st.sampled_from(sorted(FORMS)),
    T=st.integers(0, 7),
    vshape=st.sampled_from([(), (1,), (1, 1)]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    kind=st.sampled_from(["tensor", "list"]),
    c=st.sampled_from([0.5, 3, 0.37]),
    seed=st.integers(0, 2**16),
)
def test_forms_differential(form, T, vshape, dtype, kind, c, seed):
    src, exactness = FORMS[form]
    orig, new, out, sites = pair(src, "f")
    assert [(s.action, s.exactness) for s in sites] == [(REWRITTEN, exactness)], [s.reason for s in sites]
    args = form_inputs(T, vshape, dtype, seed, kind) + [c]
    if form == "mse_cat_mean" and dtype != torch.get_default_dtype():
        args[2] = [float(r) for r in args[2]]  # torch.tensor([r]) then has the default dtype either way
    try:
        orig(*clone(args))
    except (RuntimeError, TypeError, ValueError, IndexError) as exc:  # empty stack, mixed dtypes...
        with pytest.raises(type(exc)):
            new(*clone(args))
        return
    check(orig, new, args, bitwise=exactness == EXACT)


def test_forms_take_the_batched_branch(monkeypatch):
    """Each form's guard accepts ordinary inputs (else the differential test only tests the loop)."""
    spy = Spy(monkeypatch)
    for form, (src, exactness) in sorted(FORMS.items()):
        _, new, _, _ = pair(src, "f")
        args = form_inputs(6, (1,), torch.float32, 0, "tensor") + [0.5]
        spy.results.clear()
        new(*args)
        assert spy.fast, form


@pytest.mark.parametrize("form", ["py_chain", "ranks"])
def test_exact_forms_bitwise_at_length(form):
    src, _ = FORMS[form]
    orig, new, _, _ = pair(src, "f")
    for dtype in (torch.float32, torch.float64):
        check(orig, new, form_inputs(1000, (1,), dtype, 3, "tensor") + [0.37], bitwise=True)


def test_sums_agree_to_rounding_at_length():
    for form in ("ac_sum", "td_range", "adv_item_range"):
        src, _ = FORMS[form]
        orig, new, _, _ = pair(src, "f")
        check(orig, new, form_inputs(2000, (1,), torch.float32, 5, "tensor") + [0.37], bitwise=False)


# ------------------------------------------------------------------ guards: the loop runs instead


def test_item_of_a_multi_element_value_raises_like_the_loop(monkeypatch):
    src, _ = FORMS["adv_item_range"]
    spy = Spy(monkeypatch)
    orig, new, _, _ = pair(src, "f")
    args = form_inputs(5, (2,), torch.float32, 0, "tensor") + [0.5]
    with pytest.raises(RuntimeError) as e1:
        orig(*clone(args))
    with pytest.raises(RuntimeError) as e2:
        new(*clone(args))
    assert str(e1.value) == str(e2.value) and not spy.fast


@pytest.mark.parametrize("what", ["float16", "mixed", "tensor_invariant_with_py", "int_too_big"])
def test_guard_declines(what, monkeypatch):
    src, _ = FORMS["py_chain"]
    spy = Spy(monkeypatch)
    orig, new, _, _ = pair(src, "f")
    args = form_inputs(6, (1,), torch.float32, 1, "tensor") + [0.5]
    if what == "float16":  # a Python scalar meets half tensors in float opmath: not a cast first
        args = [a.detach().half() for a in args[:3]] + [0.5]
    elif what == "mixed":
        args[2] = args[2].double()
    elif what == "tensor_invariant_with_py":  # v.item() * c with c a tensor is a tensor, not a float
        args[3] = torch.tensor(0.5)
    else:
        args[3] = 2**60
    r1, r2 = orig(*clone(args)), new(*clone(args))
    assert not spy.fast
    assert torch.equal(r1, r2)


def test_default_dtype_guard_for_tensor_of_a_python_float(monkeypatch):
    src = """\
    import torch
    import torch.nn.functional as F
    def f(values, rets):
        losses = []
        for v, r in zip(values, rets):
            losses.append(F.l1_loss(v, torch.tensor([r.item() * 2])))
        return torch.stack(losses).sum()
    """
    spy = Spy(monkeypatch)
    orig, new, _, sites = pair(src, "f")
    assert sites[0].action == REWRITTEN
    values, rets = torch.randn(5, 1, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    torch.testing.assert_close(orig(values, rets), new(values, rets))  # target float32, values float64
    assert not spy.fast
    values, rets = values.float(), rets.float()
    torch.testing.assert_close(orig(values, rets), new(values, rets))
    assert spy.fast


def test_unpacking_guard():
    """Items that do not unpack into two (or a tuple subclass that iterates its own way) decline."""

    class Odd(tuple):
        def __iter__(self):
            return iter(reversed(tuple.__iter__(self)))

    a, b = torch.randn(5), torch.randn(5)
    ok = V.loss_zip(([(x, y) for x, y in zip(a, b)], a), ((True, True), True), fits=(((0, 1, 2), (), 0),))
    assert ok is not None and torch.equal(ok.seqs[1], b)
    assert V.loss_zip(([(x, y, x) for x, y in zip(a, b)], a), ((True, True), True)) is None
    assert V.loss_zip(([Odd((x, y)) for x, y in zip(a, b)], a), ((True, True), True)) is None
    assert V.loss_zip(([(x, y) for x, y in zip(a, b)], a[:2]), ((True, True), True)) is None
    short = ([(x, y) for x, y in zip(a[:3], b[:3])], a[:3])  # fewer samples than pay for the batching
    assert V.loss_zip(short, ((True, True), True), fits=(((0, 1, 2), (), 0),)) is None


# ------------------------------------------------------------------ left alone, with the reason

LEAVE_ALONE = [
    ("""\
    def f(log_probs, values):
        global adv
        loss = 0
        for lp, v in zip(log_probs, values):
            adv = v * 2
            loss += -lp * adv
        return loss
    """, "declared global/nonlocal"),
    ("""\
    def f(log_probs, states, critic):
        loss = 0
        for log_prob, s in zip(log_probs, states):
            v = critic(s)
            loss += -log_prob * v
        return loss
    """, "calls `critic`"),
    ("""\
    def f(log_probs, rewards, g):
        loss = 0
        rtrn = 0
        for t in range(len(log_probs) - 1, -1, -1):
            loss += log_probs[t] * (rewards[t] + g * rtrn)
            rtrn = g * rtrn + rewards[t]
        return loss
    """, "`rtrn` carries a value from one iteration to the next"),
    ("""\
    def f(xs):
        loss = 0
        prev = 0
        for x in xs:
            loss += prev * x
            prev = x * 2
        return loss
    """, "`prev` is read before it is bound"),
    ("""\
    def f(xs):
        loss = 0
        for x in xs:
            d = x * 2
            d = d + 1
            loss += d
        return loss
    """, "`d` is both a temporary and an accumulator"),
    ("""\
    def f(log_probs, values, scale):
        loss = 0
        for lp, v in zip(log_probs, values):
            adv = v.item() / scale
            loss += -lp * adv
        return loss
    """, "divides or raises Python floats"),
    ("""\
    def f(log_probs, values):
        loss = 0
        for lp, v in zip(log_probs, values):
            adv = v.sum().item()
            loss += -lp * adv
        return loss
    """, "calls `v.sum`, which is pure but not known to act element by element"),
    ("""\
    import torch.nn.functional as F
    def f(values, targets):
        loss = 0
        for v, t in zip(values, targets):
            l = F.smooth_l1_loss(v, t, reduction='none')
            loss += l
        return loss
    """, "reduction 'mean' or 'sum' only"),
    # RL code (a Gt form): value[0] indexes inside the sample
    ("""\
    import torch.nn.functional as F
    def f(log_probs, state_values, returns):
        loss_actor = 0
        loss_critic = 0
        for log_prob, value, Gt in zip(log_probs, state_values, returns):
            advantage = Gt - value.item()
            policy_loss = - log_prob * advantage
            value_loss = F.smooth_l1_loss(value[0], Gt)
            loss_actor += policy_loss
            loss_critic += value_loss
        return loss_actor, loss_critic
    """, "reads `value[0]`"),
    ("""\
    def f(log_probs, values):
        loss = 0
        for lp, v in zip(log_probs, values):
            adv = v.item()
            loss += adv
        return loss
    """, "is a Python float per sample"),
    ("""\
    def f(xs, env):
        loss = 0
        for x in xs:
            y = x * 2
            env.step(y)
            loss += y
        return loss
    """, "the body also runs `env.step(y)`"),
    ("""\
    def f(xs, w):
        loss = 0
        for x in xs:
            k = w * 2
            loss += x * k
        return loss
    """, "the temporary `k` does not depend on the loop element"),
    ("""\
    def f(xs):
        loss = 0
        for x in xs:
            x = x * 2
            loss += x
        return loss
    """, "rebinds the loop variable `x`"),
]


@pytest.mark.parametrize("src,reason", LEAVE_ALONE, ids=[r[:40] for _, r in LEAVE_ALONE])
def test_leave_alone(src, reason):
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src)
    assert any(reason in s.reason for s in sites if s.action == SKIPPED), [s.reason for s in sites]


LAST_VALUE = {
    # the last advantage returned next to the loss (a Python float per sample, then a tensor)
    "returned": """\
        import torch
        def f(log_probs, values, returns):
            losses = []
            for log_prob, value, R in zip(log_probs, values, returns):
                advantage = R - value.item()
                gap = value.item() * 2.5
                losses.append(-log_prob * advantage + gap)
            return torch.stack(losses).sum(), advantage, gap
        """,
    # read by a closure after the loop
    "closure": """\
        def f(log_probs, values, returns):
            loss = 0
            for lp, v in zip(log_probs, values):
                d = lp * 2 - v
                loss += d
            return loss, (lambda: d)()
        """,
    # an inexact temporary (exp): the last iteration's statement runs as written, so still bitwise
    "inexact": """\
        import torch
        def f(log_probs, values, returns):
            loss = 0
            for log_prob, R in zip(log_probs, returns):
                ratio = torch.exp(log_prob)
                loss += -ratio * R
            return loss, ratio, R
        """,
    # rebound after the loop before it is read (another meaning): binding the last value is harmless
    "rebound": """\
        import torch
        def f(log_probs, values, returns):
            losses = []
            for log_prob, value, R in zip(log_probs, values, returns):
                advantage = R - value.item()
                losses.append(-log_prob * advantage)
            advantage = 0
            return torch.stack(losses).sum(), advantage
        """,
}


@pytest.mark.parametrize("form", sorted(LAST_VALUE))
def test_temporary_read_after_the_loop_gets_its_last_value(form, monkeypatch):
    """Temporaries and loop variables read after the loop are bound as the last iteration binds
    them (its items, then its temporaries' statements as written): the same value, type (tensor
    or Python float), shape, dtype and autograd history (no gradient reaches other samples)."""
    spy = Spy(monkeypatch)
    orig, new, out, sites = pair(LAST_VALUE[form], "f")
    assert [s.action for s in sites] == [REWRITTEN], [s.reason for s in sites]
    for dtype in (torch.float32, torch.float64):
        args = form_inputs(7, (1,), dtype, 11, "list")
        a1, a2 = clone(args), clone(args)
        r1, r2 = orig(*a1), new(*a2)
        for i, (x, y) in enumerate(zip(r1, r2)):
            assert type(x) is type(y)
            if not isinstance(x, torch.Tensor):
                assert x == y
            elif i:  # what the loop left bound: bitwise
                assert x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
            else:  # the loss (a sum or a stack's sum: reassociated)
                torch.testing.assert_close(x, y)
        last1, last2 = r1[-1], r2[-1]
        if isinstance(last1, torch.Tensor) and last1.requires_grad:
            g1 = torch.autograd.grad(last1.sum(), leaves(a1, []), allow_unused=True)
            g2 = torch.autograd.grad(last2.sum(), leaves(a2, []), allow_unused=True)
            assert all((x is None and y is None) or torch.equal(x, y) for x, y in zip(g1, g2))
    assert spy.fast


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("form", sorted(FORMS))
def test_cuda_forms(form, monkeypatch):
    """On CUDA, Python floats meet float32 tensors cast first too (opmath float); forms that call
    torch.tensor(...) make CPU targets there, which the loop cannot mix with CUDA values: the
    guard declines and both raise."""
    spy = Spy(monkeypatch)
    src, exactness = FORMS[form]
    orig, new, _, _ = pair(src, "f")
    for dtype in (torch.float32, torch.float64):
        args = [a.detach().cuda().requires_grad_(a.requires_grad) for a in form_inputs(500, (1,), dtype, 7, "tensor")] + [0.37]
        spy.results.clear()
        try:
            orig(*clone(args))
        except RuntimeError as exc:
            with pytest.raises(type(exc)):
                new(*clone(args))
            assert not spy.fast
            continue
        check(orig, new, args, bitwise=exactness == EXACT)
        assert spy.fast


def test_range_bound_with_a_pure_call():
    """Range bounds as the reduction reads them (pure calls from analysis.purity: x.size(0))."""
    src = """\
    def f(returns, values):
        loss = 0.0
        for i in range(returns.size(0)):
            td = returns[i] - values[i]
            loss += td ** 2
        return loss
    """
    orig, new, _, sites = pair(src, "f")
    assert [s.action for s in sites] == [REWRITTEN]
    check(orig, new, [torch.randn(9), torch.randn(9, requires_grad=True)], bitwise=False)


@pytest.mark.parametrize("imports,call", [
    ("from torch.nn.functional import smooth_l1_loss", "smooth_l1_loss(v, torch.tensor([r]), beta=0.5)"),
    ("import torch.nn as nn", "nn.functional.mse_loss(v, torch.tensor([r]), reduction='sum')"),
    ("import torch.nn.functional as F", "F.l1_loss(v, r.unsqueeze(0))"),
])
def test_loss_spellings(imports, call, monkeypatch):
    spy = Spy(monkeypatch)
    src = (f"import torch\n{imports}\n"
           "def f(values, rets):\n"
           "    losses = []\n"
           "    for v, r in zip(values, rets):\n"
           f"        losses.append({call})\n"
           "    return torch.stack(losses)\n")
    orig, new, _, sites = pair(src, "f")
    assert [(s.action, s.exactness) for s in sites] == [(REWRITTEN, EXACT)], [s.reason for s in sites]
    values = torch.randn(9, 1, requires_grad=True)
    check(orig, new, [values, torch.randn(9) * 2], bitwise=True)
    assert spy.fast


def test_float_rebound_is_not_item():
    src = """\
    def float(x):
        return x * 3
    def f(log_probs, values):
        loss = 0
        for lp, v in zip(log_probs, values):
            adv = float(v) - 1
            loss += -lp * adv
        return loss
    """
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src) and sites[0].action == SKIPPED


def test_returns_as_python_floats_keep_the_loop(monkeypatch):
    """Returns collected as Python floats (``returns.insert(0, G)`` without torch.tensor): per
    sample, ``G - value.item()`` is float64 arithmetic, which the tensor-typed batched body does
    not model; the guard declines from the first item and the loop runs."""
    spy = Spy(monkeypatch)
    orig, new, _, _ = pair(LOSS_LOOP, "f")
    SA = load(LOSS_LOOP, "SavedAction")
    saved = [SA(torch.randn(()), torch.randn(1)) for _ in range(8)]
    rets = [float(x) for x in torch.randn(8)]
    assert torch.equal(orig(saved, rets), new(saved, rets))
    assert spy.results == [None]


# ------------------------------------------------------------------ a list also read besides its reduction

KEPT = """\
import torch
def finish_episode(log_probs, returns, stats):
    policy_loss = []
    for log_prob, R in zip(log_probs, returns):
        policy_loss.append(-log_prob * R)
    stats.append(len(policy_loss))
    loss = torch.stack(policy_loss).sum()
    mean = torch.stack(policy_loss).mean()
    return loss, mean, torch.stack(policy_loss)
"""

KEPT_TEMPS = """\
import torch
def finish_episode(saved, returns, stats):
    policy_losses = []
    for (log_prob, value), R in zip(saved, returns):
        advantage = R - value.item()
        policy_losses.append(-log_prob * advantage)
    loss = torch.stack(policy_losses).sum()
    stats.append(len(policy_losses))
    return loss, sum(policy_losses), torch.stack(policy_losses)
"""


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(T=st.integers(0, 9), dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 2**16),
       src=st.sampled_from([KEPT, KEPT_TEMPS]), as_list=st.booleans())
def test_list_kept_for_its_other_reads_differential(T, dtype, seed, src, as_list):
    """The reduction batched, the list still filled for len() and a second reduction: the same
    length, the same elements (values, shapes, dtypes), results and gradients to rounding."""
    orig, new, out, sites = pair(src, "finish_episode")
    assert [s.action for s in sites] == [REWRITTEN], sites
    assert ".extend(" in out
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(T, generator=g, dtype=dtype)
    values = torch.randn(T, generator=g, dtype=dtype)
    rets = torch.randn(T, generator=g, dtype=dtype)

    def run(fn):
        lp = logp.clone().requires_grad_()
        first = list(lp.unbind(0)) if src is KEPT else [(a, b) for a, b in zip(lp.unbind(0), values.unbind(0))]
        stats = []
        try:
            loss, other, items = fn(first, list(rets.unbind(0)) if as_list else rets, stats)
        except RuntimeError as exc:  # an empty episode: torch.stack([]) raises in both
            return type(exc), stats
        grads = torch.autograd.grad(loss + other, lp)
        return (loss.detach(), other.detach(), items.detach(), grads), stats

    (a, s1), (b, s2) = run(orig), run(new)
    assert s1 == s2
    if isinstance(a, type):
        assert a is b
        return
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[1], b[1])
    assert a[2].shape == b[2].shape and a[2].dtype == b[2].dtype and torch.equal(a[2], b[2])
    torch.testing.assert_close(a[3][0], b[3][0])


KEPT_WRITTEN = {  # the stacked result written in place, then the kept list read again
    "stack": """\
import torch
def f(xs, w):
    out = []
    for x in xs:
        out.append(x * w + 1)
    s = torch.stack(out)
    s.mul_(2)
    return s, torch.stack(out), sum(out), len(out)
""",
    "cat-temps": """\
import torch
def f(xs, w):
    out = []
    for x in xs:
        y = x * w
        out.append(y + 1)
    s = torch.cat(out)
    s += 1
    return s, torch.cat(out), len(out)
""",
    "stack-not-kept": """\
import torch
def f(xs, w):
    out = []
    for x in xs:
        out.append(x * w + 1)
    s = torch.stack(out)
    s.mul_(2)
    return s, xs
""",
}


@pytest.mark.parametrize("name", sorted(KEPT_WRITTEN))
@pytest.mark.parametrize("as_list", [True, False])
def test_stack_of_a_kept_list_is_a_tensor_of_its_own(name, as_list):
    """``torch.stack(L)`` returns a new tensor: the batched stand-in must not be what the kept
    list's rows view, or an in-place write to it shows in later reductions of the list."""
    orig, new, out, sites = pair(KEPT_WRITTEN[name], "f")
    assert [s.action for s in sites] == [REWRITTEN], sites
    assert (".extend(" in out) is (name != "stack-not-kept")
    g = torch.Generator().manual_seed(3)
    xs, w = torch.randn(4, 3, generator=g), torch.randn(3, generator=g)
    args = (lambda: (list(xs.clone().unbind(0)) if as_list else xs.clone(), w.clone()))
    a, b = orig(*args()), new(*args())
    assert len(a) == len(b)
    for u, v in zip(a, b):
        if isinstance(u, torch.Tensor):
            assert torch.equal(u, v)
        elif isinstance(u, list):
            assert all(torch.equal(p, q) for p, q in zip(u, v))
        else:
            assert u == v


@pytest.mark.parametrize("use, reason", [
    ("policy_loss[0].mul_(2)", "used after the loop other than by a stack/cat/sum/mean reduction"),
    ("stats.append(policy_loss)", "used after the loop other than by a stack/cat/sum/mean reduction"),
    ("policy_loss.append(0.0)", "used after the loop other than by a stack/cat/sum/mean reduction"),
])
def test_list_read_otherwise_is_left_alone(use, reason):
    src = KEPT.replace("    stats.append(len(policy_loss))\n", f"    {use}\n")
    out, sites = rewrite(src)
    assert out == src
    assert [s.action for s in sites] == [SKIPPED] and reason in sites[0].reason, sites


def test_list_read_otherwise_after_the_reduction_is_left_alone():
    src = KEPT.replace("    return loss,", "    policy_loss[0].mul_(2)\n    return loss,")
    out, sites = rewrite(src)
    assert out == src
    assert [s.action for s in sites] == [SKIPPED] and "len(policy_loss), torch.stack/cat(policy_loss)" in sites[0].reason


# ------------------------------------------------------------------ .item() of a value computed per sample

ITEM_FORMS = {
    "detach_item": """\
import torch
import torch.nn.functional as F
def f(saved, returns, w):
    policy_losses = []
    value_losses = []
    for (log_prob, value), R in zip(saved, returns):
        advantage = R - value.detach().item()
        policy_losses.append(-log_prob * advantage)
        value_losses.append(F.smooth_l1_loss(value, torch.tensor([R])))
    return torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()
""",
    "computed_item": """\
def f(saved, returns, w):
    loss = 0
    for (log_prob, value), R in zip(saved, returns):
        adv = (R - value * w).item()
        loss = loss - log_prob * adv
    return loss
""",
    "float_of_computed": """\
def f(saved, returns, w):
    loss = 0
    for (log_prob, value), R in zip(saved, returns):
        td = float(R - value.detach())
        loss += -log_prob * td * 0.5
    return loss
""",
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    form=st.sampled_from(sorted(ITEM_FORMS)),
    T=st.integers(0, 9),
    vshape=st.sampled_from([(), (1,), (2,)]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    w=st.sampled_from([2.0, 3, "one", "two"]),
    seed=st.integers(0, 2**16),
)
def test_item_of_a_computed_value_differential(form, T, vshape, dtype, w, seed):
    """``.item()`` / ``float()`` of a value computed per sample: the float64 copies of the same
    values, bitwise; values of two elements (or a 2-element invariant) make the loop raise, and
    the guard lets it."""
    src = ITEM_FORMS[form]
    orig, new, out, sites = pair(src, "f")
    assert [s.action for s in sites] == [REWRITTEN], sites
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(T, generator=g, dtype=dtype)
    values = torch.randn(T, *vshape, generator=g, dtype=dtype)
    rets = torch.randn(T, generator=g, dtype=dtype)
    scale = {"one": torch.tensor([1.5], dtype=dtype), "two": torch.tensor([1.5, 2.0], dtype=dtype)}.get(w, w)

    def run(fn):
        lp, v = logp.clone().requires_grad_(), values.clone().requires_grad_()
        saved = [(a, b) for a, b in zip(lp.unbind(0), v.unbind(0))]
        try:
            loss = fn(saved, rets, scale)
        except (RuntimeError, ValueError) as exc:  # .item() of 2 elements, torch.stack([])
            return type(exc)
        if not isinstance(loss, torch.Tensor):
            return loss
        return (loss.detach(),) + torch.autograd.grad(loss.sum(), (lp, v), allow_unused=True)

    a, b = run(orig), run(new)
    if not isinstance(a, tuple):
        assert a == b
        return
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if x is None or y is None:
            assert x is None and y is None
        else:
            assert x.shape == y.shape and x.dtype == y.dtype
            torch.testing.assert_close(x, y, rtol=1e-6 if dtype == torch.float32 else 1e-12, atol=1e-6)


@pytest.mark.parametrize("form", sorted(ITEM_FORMS))
def test_item_of_a_computed_value_takes_the_batched_branch(form, monkeypatch):
    spy = Spy(monkeypatch)
    orig, new, _, _ = pair(ITEM_FORMS[form], "f")
    g = torch.Generator().manual_seed(5)
    logp, values, rets = (torch.randn(6, generator=g) for _ in range(3))
    results = []
    for fn in (orig, new):
        lp = logp.clone().requires_grad_()
        loss = fn(list(zip(lp.unbind(0), values.unbind(0))), rets, 2.0)
        results.append((loss.detach(), torch.autograd.grad(loss, lp)[0]))
    assert spy.fast
    (l1, g1), (l2, g2) = results
    torch.testing.assert_close(l1, l2)
    assert torch.equal(g1, g2)  # the per-sample coefficients (the .item() values) bitwise
