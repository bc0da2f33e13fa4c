"""hot.no_grad and hot.target_graph_cut: a forward's output written as text stays as written (and a
constant a forward stores on its module does not stop the rewrite).

A tensor's text shows its autograd state (``tensor([0.35, 0.64], grad_fn=<SoftmaxBackward0>)``):
under ``no_grad`` (or cut from its graph) the same values print without it, so a rewrite would
change what the user's program prints or logs. Both transforms followed ``print``, f-strings and
loggers as safe ends and reported the site ``exact``. Each case here compares what the original
and the rewrite print; the look-alikes (text of ``.item()``, a formatted 0-d value, numeric
logging, ``float()``) keep the rewrite.
"""
import contextlib
import io
import logging

import pytest
import torch

from scalebox_cst.report import REWRITTEN, SKIPPED
from scalebox_cst.transforms.hot import no_grad, target_cut
from scalebox_cst.transforms.hot.target_cut_examples import _NET as _QNET, _TRAIN
import harness

POLICY = '''
import logging
import torch
import torch.nn as nn
log = logging.getLogger("sbtest.text")
class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
    def forward(self, x):
        return torch.softmax(self.fc(x), dim=-1)
def act(seed):
    torch.manual_seed(seed)
    policy = Policy()
    q = policy(torch.ones(4))
    {use}
    return q.argmax().item()
'''

TEXT = [
    "print(q)",
    "print('q', q)",
    "s = str(q); print(s)",
    "print(repr(q))",
    "print(format(q))",
    "print(f'q={q}')",
    "print(f'q={q!r}')",
    "print('q %s' % q)",
    "print('q %s %s' % (q, 1))",
    "log.warning('q %s', q)",
    "logging.warning('q %s', q)",
    "log.warning(q)",
]

NOT_TEXT = [
    "print(q.argmax().item())",
    "print(f'{q.max().item():.3f}')",
    "print(float(q.max()))",
    "print(len(q), q.shape)",
    "print(q.detach())",
    "log.warning('%d', int(q.argmax()))",
]


def _printed(fn, seed=0):
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger = logging.getLogger()
    logger.addHandler(handler)
    try:
        with contextlib.redirect_stdout(out):
            result = fn(seed)
    finally:
        logger.removeHandler(handler)
    return result, out.getvalue()


@pytest.mark.parametrize("use", TEXT)
def test_a_forward_output_written_as_text_is_left_alone(use):
    original, rewritten, out, sites = harness.pair(POLICY.format(use=use), "act", no_grad.ID)
    assert not [s for s in sites if s.action == REWRITTEN], out
    assert any("the text shows its grad_fn" in s.reason for s in sites if s.action == SKIPPED), sites
    assert _printed(original) == _printed(rewritten)
    assert "grad_fn" in _printed(original)[1]


@pytest.mark.parametrize("use", NOT_TEXT)
def test_text_of_values_without_autograd_state_keeps_the_rewrite(use):
    original, rewritten, out, sites = harness.pair(POLICY.format(use=use), "act", no_grad.ID)
    assert [s for s in sites if s.action == REWRITTEN], sites
    assert "torch.no_grad()" in out
    assert _printed(original) == _printed(rewritten)


def test_a_rebound_print_is_not_taken_for_the_builtin():
    """The module's own ``print`` writes nothing: the call is followed into it, not refused."""
    src = POLICY.format(use="print(q)") + "def print(*args):\n    return args\n"
    original, rewritten, out, sites = harness.pair(src, "act", no_grad.ID)
    assert "torch.no_grad()" in out, sites
    assert _printed(original) == _printed(rewritten)


#: the documented example's training loop, with the target network's output bound and used
TARGET = _QNET + _TRAIN.replace(
    "        max_q_prime = q_target(s2).max(1)[0].unsqueeze(1)\n",
    "        nq = q_target(s2)\n        {use}\n        max_q_prime = nq.max(1)[0].unsqueeze(1)\n",
) + """def train_run(seed):
    torch.manual_seed(seed)
    q = Qnet()
    q_target = Qnet()
    q_target.load_state_dict(q.state_dict())
    optimizer = torch.optim.Adam(q.parameters(), lr=1e-2)
    return train(q, q_target, optimizer, batches(2))
"""


@pytest.mark.parametrize("use, rewritten", [("print(nq[0])", False), ("print(f'{nq}')", False),
                                            ("print(nq[0].tolist())", True)])
def test_target_network_output_written_as_text(use, rewritten):
    original, new, out, sites = harness.pair(TARGET.replace("{use}", use), "train_run", target_cut.ID, dedent=False)
    assert bool([s for s in sites if s.action == REWRITTEN]) is rewritten, sites
    if not rewritten:
        assert any("the text shows its grad_fn" in s.reason for s in sites if s.action == SKIPPED), sites
    assert _printed(original) == _printed(new)


# quantumiracle's ac.py: forward() sets `self.log_std_min = -20` before its layers; the callee
# check refused every acting call of it ("stores into self.log_std_min ... it could carry grad"),
# a reason that is not true of a constant.
CONSTANT_STORE = '''
import torch
import torch.nn as nn
class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.calls = 0
    def forward(self, x):
        {store}
        return torch.clamp(self.fc(x), -2.0, 2.0)
    def act(self, x):
        a = self.forward(x)
        return a.detach()
def run(seed):
    torch.manual_seed(seed)
    actor = Actor()
    return actor.act(torch.ones(4)), actor.fc.weight.grad
'''


@pytest.mark.parametrize("store, rewritten", [
    ("self.log_std_min = -20", True),
    ("self.bounds = (-20, 2.5)", True),
    ("self.name, self.k = 'actor', None", True),
    ("self.last = x", False),  # the input: a tensor that may carry a graph
    ("self.calls += 1", False),  # augmented: the old value may be a tensor
])
def test_a_constant_stored_on_self_by_a_forward_keeps_the_rewrite(store, rewritten):
    src = CONSTANT_STORE.replace("{store}", store)
    original, new, out, sites = harness.pair(src, "run", no_grad.ID, dedent=False)
    assert ("torch.no_grad()" in out) is rewritten, sites
    if not rewritten:
        assert any("stores into" in s.reason for s in sites if s.action == SKIPPED), sites
    a, b = original(0), new(0)
    assert torch.equal(a[0], b[0]) and a[1] is None and b[1] is None
