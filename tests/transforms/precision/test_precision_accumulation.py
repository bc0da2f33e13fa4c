"""precision.autocast in fp16: gradients that several ``backward()`` calls accumulate before one step.

``GradScaler.unscale_`` divides every gradient the optimizer holds by the loss scale; a gradient
another, unscaled backward left there (an actor loss before the critic's, a previous round with
no ``zero_grad``, a ``retain_graph`` second pass) would shrink by 65536. Such backwards are left
alone together, each with the other's line in its reason; bf16 has no scaler and wraps them all.
Each case runs the original and the rewrite on the same seeded model and compares the weights."""
from __future__ import annotations

import pytest

from scalebox_cst.transforms.precision import AutocastTransform
import harness

torch = pytest.importorskip("torch")

ID = AutocastTransform.id


def _rewrite(code, mode="fp16"):
    out, sites = harness.rewrite(code, ID, dedent=False, path="train.py", options={"precision": {"mode": mode}})
    return out, [s for s in sites if s.transform == ID]


def _weights_after(code, rounds=3, lr=0.1):
    """The model's weights after ``train(model, opt, data)`` of ``code`` on seeded inputs."""
    train = harness.load(code, "train", filename="train.py")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=float(lr))
    g = torch.Generator().manual_seed(5)
    data = [(torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)) for _ in range(rounds)]
    train(model, opt, data)
    return [p.detach().clone() for p in model.parameters()]


def _assert_same_training(code, out, atol=1e-2, lr=0.1):
    for a, b in zip(_weights_after(code, lr=lr), _weights_after(out, lr=lr)):
        assert torch.allclose(a, b, atol=atol, rtol=0.02), (a - b).abs().max()


TWO_BACKWARDS = """\
import torch


def train(model, opt, data):
    for x, y in data:
        opt.zero_grad()
        l1 = (model(x) - y).abs().mean()
        l1.backward()
        l2 = model(x).mean() * 1e-3
        l2.backward()
        opt.step()
"""

ACTOR_CRITIC = """\
import torch


def train(model, opt, data):
    for x, y in data:
        opt.zero_grad()
        actor_loss = -model(x).mean()
        actor_loss.backward()
        critic_loss = ((model(x) - y) ** 2).mean()
        critic_loss.backward()
        opt.step()
"""

NO_ZERO_GRAD_IN_LOOP = """\
import torch


def train(model, opt, data):
    for x, y in data:
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
"""

BACKWARD_IN_AN_OUTER_BLOCK = """\
import torch


def train(model, opt, data):
    for x, y in data:
        opt.zero_grad()
        l1 = (model(x) - y).abs().mean()
        l1.backward()
        if x.shape[0] > 1:
            l2 = model(x).mean() * 1e-3
            l2.backward()
            opt.step()
"""

@pytest.mark.parametrize("code, lines", [
    (TWO_BACKWARDS, (8, 10)),
    (ACTOR_CRITIC, (8, 10)),
    (BACKWARD_IN_AN_OUTER_BLOCK, (8, 11)),
])
def test_fp16_leaves_backwards_that_share_one_step_alone(code, lines):
    out, sites = _rewrite(code)
    _assert_same_training(code, out)  # a scaler for one of them: unscale_ divides the other's share by the scale
    assert out == code, out
    first, second = lines
    reasons = " | ".join(s.reason for s in sites)
    assert f"line {first}" in reasons and f"line {second}" in reasons, reasons


ZERO_GRAD_SKIPPED_BY_CONTINUE = """\
import torch


def train(model, opt, data):
    for x, y in data:
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        if y.sum() > 0:
            continue
        opt.zero_grad()
"""

ZERO_GRAD_IN_AN_IF = """\
import torch


def train(model, opt, data):
    for i, (x, y) in enumerate(data):
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        if i % 2:
            opt.zero_grad()
"""

ZERO_GRAD_IN_THE_OUTER_LOOP_ONLY = """\
import torch


def train(model, opt, data):
    for epoch in range(1):
        opt.zero_grad()
        for x, y in data:
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
"""


@pytest.mark.parametrize("code, line", [
    (NO_ZERO_GRAD_IN_LOOP, 7),
    (ZERO_GRAD_SKIPPED_BY_CONTINUE, 7),
    (ZERO_GRAD_IN_AN_IF, 7),
    (ZERO_GRAD_IN_THE_OUTER_LOOP_ONLY, 9),
])
def test_fp16_a_backward_repeated_without_zero_grad_accumulates_across_rounds(code, line):
    out, sites = _rewrite(code)
    _assert_same_training(code, out)
    assert out == code
    assert any("previous round" in s.reason and f"line {line}" in s.reason for s in sites), sites


#: losses scaled down: GradScaler's first scale (65536) would overflow fp16 and skip a step (the
#: weights then differ for a reason of its own)
FP16_LOOK_ALIKES = [
    # one backward per zero_grad, in a loop: zero_grad before the forward
    ("""\
import torch


def train(model, opt, data):
    for x, y in data:
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean() * 1e-2
        loss.backward()
        opt.step()
""", 1),
    # zero_grad after the step: the next round starts from zero too
    ("""\
import torch


def train(model, opt, data):
    for x, y in data:
        loss = ((model(x) - y) ** 2).mean() * 1e-2
        loss.backward()
        opt.step()
        opt.zero_grad()
""", 1),
    # two updates, each with its own zero_grad (actor-critic with two steps)
    ("""\
import torch


def train(model, opt, data):
    for x, y in data:
        opt.zero_grad()
        critic_loss = ((model(x) - y) ** 2).mean() * 1e-2
        critic_loss.backward()
        opt.step()
        opt.zero_grad()
        actor_loss = -model(x).mean() * 1e-4
        actor_loss.backward()
        opt.step()
""", 2),
]


@pytest.mark.parametrize("code, scaled", FP16_LOOK_ALIKES)
def test_fp16_one_backward_per_zero_grad_is_still_scaled(code, scaled):
    out, sites = _rewrite(code)
    assert out.count("_scalebox_scaler.scale(") == scaled and out.count("torch.autocast(") == scaled, out
    assert [s.action for s in sites] == ["rewritten"] * scaled
    _assert_same_training(code, out, atol=2e-2)


def test_bf16_wraps_both_backwards_of_one_step():
    """bf16 has no scaler: each backward of an autocast forward adds fp32 gradients as before."""
    out, sites = _rewrite(TWO_BACKWARDS, mode="bf16")
    assert out.count("torch.autocast(") == 2 and [s.action for s in sites] == ["rewritten", "rewritten"]
    _assert_same_training(TWO_BACKWARDS, out, atol=2e-2)


RETAINED_GRAPH = """\
import torch


def train(model, opt, data):
    for x, y in data:
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward(retain_graph=True)
        opt.step()
        opt.zero_grad()
        loss.backward()
"""


@pytest.mark.parametrize("mode", ["bf16", "fp16"])
def test_a_second_backward_through_the_graph_after_a_step_is_left_alone(mode):
    """The original raises (the step changed weights the graph saved); autocast's casts of the
    weights would hide that and the second backward would run on stale weights."""
    out, sites = _rewrite(RETAINED_GRAPH, mode=mode)
    for code in (RETAINED_GRAPH, out):
        with pytest.raises(RuntimeError, match="inplace"):
            _weights_after(code)
    assert out == RETAINED_GRAPH, out
    assert any("line 8" in s.reason and "line 11" in s.reason for s in sites), sites


def test_a_second_backward_with_nothing_between_stays_wrapped():
    code = RETAINED_GRAPH.replace("        opt.step()\n        opt.zero_grad()\n", "")
    out, sites = _rewrite(code, mode="bf16")
    assert out.count("torch.autocast(") == 1 and [s.action for s in sites] == ["rewritten"]


# A function that steps but never zeroes: each call adds to what the previous call left, unless
# a caller clears it. Scaled, unscale_ divided the earlier call's (already unscaled) gradients by
# 65536 again: the weights after three calls differed from the original's.
NEVER_ZEROED = """\
import torch


def update(model, opt, x, y):
    loss = ((model(x) - y) ** 2).mean() * 1e-2
    loss.backward()
    opt.step()


def train(model, opt, data):
    for x, y in data:
        update(model, opt, x, y)
"""


def test_fp16_in_a_function_that_never_zeroes_its_gradients_is_left_fp32():
    out, sites = _rewrite(NEVER_ZEROED)
    assert out == NEVER_ZEROED
    (site,) = sites
    assert site.action == "skipped" and "never calls zero_grad around loss.backward() (line 6)" in site.reason
    _assert_same_training(NEVER_ZEROED, out, atol=0, lr=10)  # nothing rewritten: the same run


@pytest.mark.parametrize("zero", ["    opt.zero_grad()\n    loss = ", "    opt.step()\n    opt.zero_grad()\n"])
def test_fp16_in_a_function_zeroing_before_or_after_is_scaled(zero):
    anchor = "    loss = " if zero.endswith("loss = ") else "    opt.step()\n"
    code = NEVER_ZEROED.replace(anchor, zero, 1)
    out, sites = _rewrite(code)
    assert [s.action for s in sites] == ["rewritten"] and "_scalebox_scaler.scale(" in out, sites
    _assert_same_training(code, out, atol=2e-2, lr=10)
