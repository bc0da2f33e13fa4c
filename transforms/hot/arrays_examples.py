"""Documented examples of hot.tensor_from_arrays (rewritten and left alone), run by tests/transforms/hot/test_hot_patterns.py.

Each rewritten example defines ``f(batch)`` (batch: a list of (obs ndarray, action int, reward
float) tuples); the tests run original and rewrite on the same seeded batches and compare bitwise.
"""
from __future__ import annotations

from ..base import Example, Inputs

#: every rewritten example is called as f(batch): 8 (observation array, action, reward) tuples whose
#: observation dtype cycles with the seed (tests/example_inputs.py: transitions)
_BATCH = Inputs("f", "transitions(seed)", seeds=tuple(range(8)))

EXAMPLES = [
    Example(
        code=(
            "import torch\n"
            "def f(batch):\n"
            "    s_lst, a_lst, r_lst = [], [], []\n"
            "    for s, a, r in batch:\n"
            "        s_lst.append(s)\n"
            "        a_lst.append([a])\n"
            "        r_lst.append([r])\n"
            "    return torch.tensor(s_lst, dtype=torch.float), torch.tensor(a_lst), torch.tensor(r_lst)\n"
        ),
        rewritten=True,
        note="minimalRL ReplayBuffer.sample: lists appended to",
        expected="minimalrl_replaybuffer_sample",
        inputs=_BATCH,
    ),
    Example(
        code=(
            "import torch\n"
            "def f(batch):\n"
            "    states, actions, rewards = zip(*batch)\n"
            "    return torch.FloatTensor(states), torch.tensor(rewards)\n"
        ),
        rewritten=True,
        note="zip(*batch) unpacked into tuples of arrays, legacy FloatTensor",
        expected="zip",
        inputs=_BATCH,
    ),
    Example(
        code=(
            "import torch\n"
            "def f(batch):\n"
            "    return torch.tensor([s for s, _, _ in batch]), torch.tensor([batch[0][0], batch[1][0]])\n"
        ),
        rewritten=True,
        note="comprehension and list display of arrays",
        expected="comprehension_and_list_display_of_arrays",
        inputs=_BATCH,
    ),
    Example(
        code=(
            "import torch\n"
            "def f(batch):\n"
            "    obs = [s for s, _, _ in batch]\n"
            "    return torch.Tensor(obs)\n"
        ),
        rewritten=False,
        reason="default tensor type",
        note="torch.Tensor follows the default tensor type",
    ),
    Example(
        code=(
            "import torch\n"
            "def f(batch):\n"
            "    acts = [[a] for _, a, _ in batch]\n"
            "    return torch.LongTensor(acts)\n"
        ),
        rewritten=False,
        reason="integer legacy constructors",
        note="LongTensor of a list",
    ),
    Example(
        code=(
            "import torch\n"
            "def f(batch):\n"
            "    state = batch[0][0]\n"
            "    return torch.tensor([state], dtype=torch.float)\n"
        ),
        rewritten=False,
        reason="one element",
        note="one observation with a batch dimension (per-step action selection)",
    ),
    Example(
        code=(
            "import numpy as np\n"
            "import torch\n"
            "def f(batch):\n"
            "    state, action, reward = map(np.stack, zip(*batch))\n"
            "    return torch.FloatTensor(state), torch.tensor(reward)\n"
        ),
        rewritten=False,
        reason="",
        note="map(np.stack, zip(*batch)) (quantumiracle's SAC, higgsfield): each name is one array, not a list",
    ),
]
