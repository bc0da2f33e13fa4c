"""Documented examples of hot.fresh_on_device (rewritten and left alone), run by
tests/transforms/hot/test_hot_fresh_device.py.

Each rewritten example defines ``f(x, device)`` (x: a numpy array, list or number; device: a
``torch.device``, a string, or a dtype); the tests run original and rewrite on the same inputs and
compare the results bitwise (dtype, device, values, requires_grad) or the exception type.
"""
from __future__ import annotations

from ..base import Example, Inputs

#: one seeded float64 state and the CPU; the family test sweeps every dtype, layout and device form
_STATE = Inputs("f", "rng.standard_normal((3, 4)), torch.device(\"cpu\")", seeds=(0, 1))

EXAMPLES = [
    Example(
        code=(
            "import torch\n"
            "def f(x, device):\n"
            "    return torch.FloatTensor(x.reshape(1, -1)).to(device)\n"
        ),
        rewritten=True,
        note="sfujim/TD3 select_action: FloatTensor(state).to(device)",
        expected="sfujim_td3_select_action",
        inputs=_STATE,
    ),
    Example(
        code=(
            "import torch\n"
            "class Buffer:\n"
            "    def __init__(self, device):\n"
            "        self.device = device\n"
            "    def get(self, x):\n"
            "        return torch.DoubleTensor(x).to(self.device), torch.Tensor(x).to(self.device)\n"
            "def f(x, device):\n"
            "    return Buffer(device).get(x)\n"
        ),
        rewritten=True,
        note="replay sample: DoubleTensor / Tensor(...).to(self.device)",
        expected="replay_sample",
        inputs=_STATE,
    ),
    Example(
        code=(
            "import torch as th\n"
            "def f(x, device):\n"
            "    return th.tensor(x).to(device).view(-1), th.tensor(x, dtype=th.float32).to(device)\n"
        ),
        rewritten=False,
        reason="a list given to it measured 0.44x",
        note="CleanRL: torch.tensor(reward).to(device): a list through the guard loses more than an array gains",
    ),
    Example(
        code=(
            "import torch\n"
            "def f(x, device):\n"
            "    return torch.FloatTensor(x, requires_grad=True).to(device)\n"
        ),
        rewritten=False,
        reason="requires_grad",
        note="requires_grad: the moved tensor is a non-leaf",
    ),
    Example(
        code=(
            "import torch\n"
            "def f(x, device):\n"
            "    return torch.FloatTensor(x).to(device, non_blocking=True)\n"
        ),
        rewritten=False,
        reason="keywords",
        note="non_blocking move",
    ),
    Example(
        code=(
            "import torch\n"
            "def f(x, device):\n"
            "    return torch.Tensor(x).to(torch.float16)\n"
        ),
        rewritten=False,
        reason="not a plain device",
        note="to(dtype): a cast, not a move",
    ),
    Example(
        code=(
            "import torch\n"
            "def f(x, device):\n"
            "    return torch.FloatTensor(x).to(pick(device))\n"
            "def pick(d):\n"
            "    return d\n"
        ),
        rewritten=False,
        reason="not a plain device",
        note="device computed by a call (order of evaluation)",
    ),
    Example(
        code=(
            "import torch\n"
            "def f(x, device):\n"
            "    return torch.from_numpy(x).to(device), torch.LongTensor(x).to(device), torch.FloatTensor(4).to(device)\n"
        ),
        rewritten=False,
        note="from_numpy (aliases the array), LongTensor, a size",
    ),
]
