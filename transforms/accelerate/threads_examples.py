"""``accelerate.threads``'s examples: optimizer constructions it wraps and look-alikes it keeps.

The tests set ``[accelerate] level = "reassociated"``.
"""
from __future__ import annotations

from ..base import Example, at_options

_HEAD = "import torch\nimport torch.nn as nn\nimport torch.optim as optim\n\nmodel = nn.Linear(4, 2)\n"

EXAMPLES = at_options([  # rewritten at [accelerate] level = "reassociated", CPU
    Example(_HEAD + "optimizer = optim.Adam(model.parameters(), lr=1e-3)\n", True, note="CleanRL/minimalRL: optim.Adam"),
    Example(_HEAD + "from torch.optim import RMSprop\nopt = RMSprop(model.parameters())\n", True, note="any torch.optim class"),
    Example(_HEAD + "from scalebox_cst.runtime.fused_optimizer import fused_optimizer as _sbx_fused_optimizer\n"
            "opt = _sbx_fused_optimizer(optim.Adam, model.parameters(), lr=1e-3)\n", True,
            note="accelerate.fused_optim's call (it runs first)"),
    Example(_HEAD + "torch.set_num_threads(4)\noptimizer = optim.Adam(model.parameters())\n", False,
            "sets threads itself", note="the user set the thread count"),
    Example("import os\nos.environ['OMP_NUM_THREADS'] = '8'\n" + _HEAD + "optimizer = optim.Adam(model.parameters())\n",
            False, "names OMP_NUM_THREADS", note="the environment variable set in the file"),
    Example(_HEAD + "sched = optim.lr_scheduler.StepLR(optim.SGD(model.parameters(), lr=0.1), 10)\n", True,
            note="only the optimizer inside a scheduler call is wrapped"),
    Example(_HEAD + "class Optim:\n    def __init__(self, p):\n        self.p = p\n\nopt = Optim(model.parameters())\n",
            False, "", note="a class of the file: not torch.optim (no site)"),
], (('level', 'reassociated'),))
