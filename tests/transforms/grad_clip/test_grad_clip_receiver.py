"""grad_clip names the optimizer it guards by the step's receiver text, read once more before
``step()``: where that text reads a property of a class in the file, the guard would run the
property's code a second time each step (a print, a counter, a new object each read), so the
step is left alone with the reason. Plain attributes, ``cached_property`` and properties of other
names are guarded as before."""
import pytest

import harness

CLASS = '''
import functools
import torch


class Agent:
    def __init__(self):
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 1)
        self._opt = torch.optim.SGD(self.net.parameters(), lr=0.1)
        self.plain_opt = self._opt
        self.reads = 0

{accessor}

    def update(self, x):
        loss = self.net(x).pow(2).mean()
        self.{name}.zero_grad()
        loss.backward()
        self.{name}.step()
        return loss.item()
'''

PROPERTY = '''    @property
    def optimizer(self):
        self.reads += 1
        return self._opt'''

PROPERTY_CALL = '''    def _get(self):
        self.reads += 1
        return self._opt

    optimizer = property(_get)'''

SETTER = '''    @property
    def optimizer(self):
        self.reads += 1
        return self._opt

    @optimizer.setter
    def optimizer(self, value):
        self._opt = value'''

CACHED = '''    @functools.cached_property
    def optimizer(self):
        self.reads += 1
        return self._opt'''

OTHER = '''    @property
    def optimiser_lr(self):
        self.reads += 1
        return self._opt.param_groups[0]["lr"]'''


def _steps(module, n=3):
    import torch

    agent = module["Agent"]()
    losses = [agent.update(torch.randn(8, 4)) for _ in range(n)]
    return agent.reads, losses, [p.detach().clone() for p in agent.net.parameters()]


@pytest.mark.parametrize("accessor", [PROPERTY, PROPERTY_CALL, SETTER], ids=["property", "property()", "with setter"])
def test_a_step_through_a_property_is_left_alone_and_runs_as_written(accessor):
    src = CLASS.format(accessor=accessor, name="optimizer")
    out, sites = harness.rewrite(src, "grad_clip", dedent=False)
    (step,) = [s for s in sites if s.transform == "grad_clip"]
    assert step.action == "skipped" and "optimizer is a property of a class in this file" in step.reason
    original, rewritten = harness.load(src), harness.load(out)
    before, after = _steps(original), _steps(rewritten)
    assert after[0] == before[0] == 6  # zero_grad and step read it, three steps
    assert after[1] == before[1]


@pytest.mark.parametrize("accessor, name", [(CACHED, "optimizer"), (OTHER, "plain_opt"), ("", "plain_opt")],
                         ids=["cached_property", "a property of another name", "a plain attribute"])
def test_look_alikes_are_guarded_and_read_as_often_as_before(accessor, name):
    src = CLASS.format(accessor=accessor, name=name)
    out, sites = harness.rewrite(src, "grad_clip", dedent=False)
    (step,) = [s for s in sites if s.transform == "grad_clip"]
    assert step.action == "rewritten", step.reason
    original, rewritten = harness.load(src), harness.load(out)
    before, after = _steps(original), _steps(rewritten)
    assert after[0] == before[0]
    assert after[1] == before[1]
    assert all((a == b).all() for a, b in zip(before[2], after[2]))
