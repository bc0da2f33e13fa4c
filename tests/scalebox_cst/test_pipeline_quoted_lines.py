"""Line numbers quoted in site reasons name the user's lines, whatever ran before.

Each transform sees the version the transforms before it made: a recurrence rewritten above a
training step moves every later line by ~20. The site spans were mapped back, but the numbers
the reasons quote ("its output `loss` (line 35) reads .backward") were not for hot.no_grad,
hot.target_graph_cut, accelerate.* and device.*: on Lizhi-sjtu/DRL-code-pytorch's REINFORCE.py
the skip cited line 86 for a backward() on line 63. The pipeline now maps quoted numbers like
the spans, so these tests run the real transforms, each alone and in the default order.
"""
import re
from typing import List

import pytest
from harness import rewrite

from scalebox_cst.report import Site

SRC = '''\
import torch
import torch.nn as nn
import torch.nn.functional as F


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(4, 16)
        self.l2 = nn.Linear(16, 2)

    def forward(self, s):
        return F.softmax(self.l2(F.relu(self.l1(s))), dim=1)


class Agent:
    def __init__(self):
        self.gamma = 0.99
        self.policy = Policy()
        self.opt = torch.optim.Adam(self.policy.parameters(), lr=1e-3)
        self.rewards, self.states, self.actions = [], [], []

    def learn(self):
        returns = []
        g = 0.0
        for r in reversed(self.rewards):
            g = self.gamma * g + r
            returns.insert(0, g)
        for t in range(len(self.rewards)):
            s = torch.tensor(self.states[t], dtype=torch.float).unsqueeze(0)
            prob = self.policy(s).flatten()
            loss = -returns[t] * torch.log(prob[self.actions[t]])
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
'''
BACKWARD = SRC.splitlines().index("            loss.backward()") + 1
FAST = {"accelerate": {"level": "reassociated"}}


def quoted(site: Site) -> List[int]:
    return [int(n) for n in re.findall(r"\blines? (\d+)", site.reason)]


@pytest.mark.parametrize("options", [None, FAST], ids=["default", "fast"])
def test_a_skip_after_inserted_lines_quotes_the_users_backward_line(options):
    _, sites = rewrite(SRC, options=options, dedent=False)
    by = {(s.transform, s.action): s for s in sites}
    assert ("vectorize.recurrence", "rewritten") in by  # it inserts lines above the step
    assert quoted(by[("hot.no_grad", "skipped")]) == [BACKWARD]
    assert quoted(by[("grad_clip", "rewritten")]) == [BACKWARD]  # quoted once, mapped once


@pytest.mark.parametrize("options", [None, FAST], ids=["default", "fast"])
def test_every_quoted_line_is_the_one_the_transform_quotes_alone(options):
    """A transform run alone on the user's file sees the user's lines: in the pipeline, the same
    site must quote the same numbers."""
    _, sites = rewrite(SRC, options=options, dedent=False)
    compared = 0
    for site in sites:
        if not quoted(site):
            continue
        _, alone = rewrite(SRC, site.transform, options=options, dedent=False)
        twins = [s for s in alone if (s.line, s.end_line, s.action) == (site.line, site.end_line, site.action)]
        assert twins, site
        assert quoted(site) == quoted(twins[0]), (site.reason, twins[0].reason)
        compared += 1
    assert compared >= 2
