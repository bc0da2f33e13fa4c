"""hot.no_grad and hot.target_graph_cut read the engine's run-time helpers as the user's code.

They run after vectorize.*, hot.distribution_args/tensor_from_arrays/fresh_on_device and
grad_clip, so they analyse a version holding those transforms' helper calls. A helper missing from
callees.ENGINE_PURE / ENGINE_EFFECTS was "unknown code": quantumiracle/Popular-RL-Algorithms'
sac_v2.py got the skip "`update` (line 254) calls scalebox_cst.runtime.hot_device.tensor_on,
whose effects are unknown", naming engine code the user never wrote instead of its own call.
"""
import ast
import textwrap

import pytest
from harness import pipeline, rewrite

from scalebox_cst.report import SKIPPED
from scalebox_cst.transforms.examples import all_examples
from scalebox_cst.transforms.hot import callees
from scalebox_cst.transforms.names import ImportMap

RUNTIME = "scalebox_cst.runtime."
HOT = ("hot.no_grad", "hot.target_graph_cut")


def _helpers_called_before(transform_id):
    """{qualified helper: transform ids} for the runtime helpers that the golden outputs of the
    transforms running before ``transform_id`` (in the pipeline's order) call."""
    order = [t.id for t in pipeline("*").transforms]
    before = set(order[: order.index(transform_id)])
    found = {}
    for case in all_examples():
        if case.golden is None or case.transform.id not in before:
            continue
        tree = ast.parse(case.expected_output())
        imports = ImportMap(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                qual = imports.qualify(node.func)
                if qual is not None and qual.startswith(RUNTIME):
                    found.setdefault(qual, set()).add(case.transform.id)
    return found


@pytest.mark.parametrize("transform_id", HOT)
def test_every_helper_an_earlier_transform_calls_has_a_known_effect(transform_id):
    found = _helpers_called_before(transform_id)
    assert len(found) >= 10  # the examples do insert helpers (the scan is not vacuous)
    known = callees.ENGINE_PURE | set(callees.ENGINE_EFFECTS)
    unknown = {q: sorted(ids) for q, ids in found.items() if q not in known}
    assert not unknown


def test_pure_and_effect_tables_are_disjoint():
    assert not callees.ENGINE_PURE & set(callees.ENGINE_EFFECTS)


SAC = textwrap.dedent('''\
    import numpy as np
    import torch
    import torch.nn as nn

    device = torch.device("cpu")


    class QNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = nn.Linear(4, 1)

        def forward(self, s):
            return self.l1(s)


    class Trainer:
        def __init__(self):
            self.q = QNet()
            self.target = QNet()
            self.opt = torch.optim.Adam(self.q.parameters(), lr=1e-3)

        def update(self, batch):
            state = torch.FloatTensor(batch).to(device)
            loss = self.q(state).pow(2).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            for tp, p in zip(self.target.parameters(), self.q.parameters()):
                tp.data.copy_(0.995 * tp.data + 0.005 * p.data)
            return loss.item()


    trainer = Trainer()
    for i in range(10):
        out = trainer.update(np.random.randn(8, 4))
    ''')


def test_a_skip_after_other_rewrites_gives_the_reason_the_users_code_gives():
    out, sites = rewrite(SAC, dedent=False)
    assert "_sb_tensor_on(" in out  # hot.fresh_on_device rewrote update() before hot.no_grad ran
    call_line = SAC.splitlines().index("    out = trainer.update(np.random.randn(8, 4))") + 1
    [skip] = [s for s in sites if s.transform == "hot.no_grad" and s.line == call_line]
    _, alone = rewrite(SAC, "hot.no_grad", dedent=False)
    [twin] = [s for s in alone if s.line == call_line]
    assert skip.action == twin.action == SKIPPED
    assert skip.reason == twin.reason
    assert "scalebox_cst" not in skip.reason and "_sb" not in skip.reason


def test_an_engine_effect_is_named_as_what_the_users_code_does():
    """A body whose first problem is the (rewritten) target update: the reason says what it does."""
    src = SAC.replace(
        "        self.opt.zero_grad()\n        loss.backward()\n        self.opt.step()\n", "")
    out, sites = rewrite(src, dedent=False)
    assert "_sb_soft_update(" in out or "_sb_scale_add(" in out or "_sb_lerp_update(" in out, out
    call_line = src.splitlines().index("    out = trainer.update(np.random.randn(8, 4))") + 1
    [skip] = [s for s in sites if s.transform == "hot.no_grad" and s.line == call_line]
    assert "scalebox_cst" not in skip.reason, skip.reason
    assert skip.reason.endswith("updates target-network parameters in place"), skip.reason
