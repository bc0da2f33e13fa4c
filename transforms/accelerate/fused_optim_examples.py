"""``accelerate.fused_optim``'s examples: optimizers it builds fused and look-alikes it keeps.

A rewritten example defines ``train()`` -> the parameters after a few steps (the differential
test: original and rewrite on the same seed, close, not bitwise). The tests set ``[accelerate]
level = "reassociated"``.
"""
from __future__ import annotations

from ..base import Example, at_options

_NET = """\
import torch
import torch.nn as nn
{imports}

def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))


def train():
{body}
    x = torch.randn(8, 4)
    for _ in range(20):
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]
"""


def _ex(imports: str, body: str, rewritten: bool, reason: str = "", note: str = "") -> Example:
    return Example(_NET.format(imports=imports, body=body), rewritten, reason, note=note)


EXAMPLES = at_options([  # rewritten at [accelerate] level = "reassociated", CPU
    _ex("import torch.optim as optim", "    model = net()\n    optimizer = optim.Adam(model.parameters(), lr=1e-3, eps=1e-5)",
        True, note="CleanRL: optim.Adam(agent.parameters(), lr=..., eps=1e-5)"),
    _ex("from torch.optim import Adam", "    model = net()\n    optimizer = Adam(model.parameters(), 1e-2)",
        True, note="spinningup: from torch.optim import Adam, lr positional"),
    _ex("", "    model = net()\n    optimizer = torch.optim.AdamW(params=model.parameters(), lr=1e-3, weight_decay=0.1)",
        True, note="AdamW with params= as a keyword"),
    _ex("", "    model = net()\n    optimizer = torch.optim.Adam([{'params': model[0].parameters()}, "
            "{'params': model[2].parameters(), 'lr': 1e-2}], lr=1e-3, amsgrad=True)",
        True, note="parameter groups (generators inside dicts), amsgrad"),
    _ex("import torch.optim as optim", "    model = net()\n    optimizer = optim.Adam(model.parameters(), lr=1e-3, foreach=True)",
        False, "foreach= is given", note="the user chose foreach"),
    _ex("import torch.optim as optim", "    model = net()\n    optimizer = optim.Adam(model.parameters(), lr=1e-3, fused=False)",
        False, "fused= is given", note="the user turned fused off"),
    _ex("import torch.optim as optim", "    model = net()\n    optimizer = optim.Adam(model.parameters(), lr=1e-3, differentiable=True)",
        False, "differentiable= is given", note="differentiable excludes fused"),
    _ex("import torch.optim as optim", "    model = net()\n    kw = dict(lr=1e-3)\n    optimizer = optim.Adam(model.parameters(), **kw)",
        False, "unpacked arguments", note="**kwargs could hold foreach/fused"),
    _ex("import torch.optim as optim", "    model = net()\n    optimizer = optim.Adam(model[0].parameters(), lr=1e-3)\n"
        "    optimizer.add_param_group({'params': model[2].parameters()})",
        False, "add_param_group", note="groups added after construction are not checked"),
    _ex("import torch.optim as optim", "    model = net()\n    optimizer = optim.SGD(model.parameters(), lr=1e-3)",
        False, "", note="SGD: not this transform's (no site at all)"),
    _ex("", "    model = net()\n\n    class Adam:\n        def __init__(self, params, lr):\n            self.params = list(params)\n"
        "        def zero_grad(self):\n            pass\n        def step(self):\n            pass\n"
        "    optimizer = Adam(model.parameters(), lr=1e-3)",
        False, "", note="a local class named Adam: not torch's (no site)"),
], (('level', 'reassociated'),))
