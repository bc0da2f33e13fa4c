"""Documented examples of vectorize.elementwise (rewritten and left alone), run by the example tests.
"""
from __future__ import annotations

from ..base import Example, Inputs
from .scatter_examples import EXAMPLES as SCATTER_EXAMPLES


EXAMPLES = [
    Example(
        code=(
            "import torch\n"
            "def scale(rewards, values, out, gamma):\n"
            "    for i in range(len(rewards)):\n"
            "        out[i] = rewards[i] + gamma * values[i]\n"
            "    return out\n"
        ),
        rewritten=True,
        note="indexed loop into a preallocated buffer",
        expected="indexed_loop_into_a_preallocated_buffer",
        inputs=Inputs("scale", "torch.randn(5), torch.randn(5), torch.zeros(5), 0.99"),
    ),
    Example(
        code=(
            "import torch\n"
            "def clip(ratio, eps, n):\n"
            "    clipped = torch.zeros(n)\n"
            "    for t in range(n):\n"
            "        clipped[t] = torch.clamp(ratio[t], 1 - eps, 1 + eps)\n"
            "    return clipped\n"
        ),
        rewritten=True,
        note="clamp into a fresh tensor",
        expected="clamp_into_a_fresh_tensor",
        inputs=Inputs("clip", "torch.rand(6) * 2, 0.2, 6"),
    ),
    Example(
        code=(
            "import torch\n"
            "def feats(xs, w):\n"
            "    return torch.stack([torch.tanh(x * w) for x in xs])\n"
        ),
        rewritten=True,
        note="stack of a comprehension (tanh: reassociated)",
        expected="stack_of_a_comprehension",
        inputs=Inputs("feats", "[torch.randn(3) for _ in range(4)], torch.randn(3)"),
    ),
    Example(
        code=(
            "import torch\n"
            "def adv(returns, values):\n"
            "    return torch.cat([r - v for r, v in zip(returns, values)])\n"
        ),
        rewritten=True,
        note="cat of a zipped comprehension",
        expected="cat_of_a_zipped_comprehension",
        inputs=Inputs("adv", "torch.randn(4, 2), torch.randn(4, 2)"),
    ),
    Example(
        code=(
            "import torch\n"
            "def smooth(x, out):\n"
            "    for i in range(1, len(x)):\n"
            "        out[i] = 0.5 * (x[i] + x[i - 1])\n"
            "    return out\n"
        ),
        rewritten=False,
        reason="not the current element",
        note="reads the previous element",
    ),
    Example(
        code=(
            "import torch\n"
            "def running(x):\n"
            "    for i in range(1, len(x)):\n"
            "        x[i] = x[i] * 0.9\n"
            "    return x\n"
        ),
        rewritten=False,
        reason="reads an output",
        note="in-place update reads the output",
    ),
    Example(
        code=(
            "import torch\n"
            "def f(obs, out, norm):\n"
            "    for i in range(len(obs)):\n"
            "        out[i] = norm(obs[i])\n"
            "    return out\n"
        ),
        rewritten=False,
        reason="not known to act element by element",
        note="calls a running normaliser per element",
    ),
    Example(
        code=(
            "import torch\n"
            "def f(nets, x):\n"
            "    return torch.stack([net(x) for net in nets])\n"
        ),
        rewritten=False,
        reason="not known to act element by element",
        note="ensemble forward passes",
    ),
    Example(
        code=(
            "import torch\n"
            "def f(x, out):\n"
            "    for i in range(len(x)):\n"
            "        out[i] = x[i] * 2\n"
            "    return i\n"
        ),
        rewritten=False,
        reason="may be read outside the loop",
        note="index used after the loop",
    ),
] + SCATTER_EXAMPLES  # per-row index_add_ into scatter_add_, and its look-alikes (scatter_examples.py)
