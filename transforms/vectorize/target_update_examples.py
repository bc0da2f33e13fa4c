"""Documented examples of vectorize.target_update (rewritten and left alone), run by the example tests.
"""
from __future__ import annotations

from ..base import Example, Inputs


def _soft(call: str) -> Inputs:
    """call(net, target, 0.005): an MLP and its perturbed target, float32 then float64 (tests/example_inputs.py)."""
    return Inputs(call, "*mlp_pair(torch.float64 if seed % 2 else torch.float32), 0.005", seeds=(0, 1))


def _hard(call: str) -> Inputs:
    """call(net, target)."""
    return Inputs(call, "*mlp_pair(torch.float64 if seed % 2 else torch.float32)", seeds=(0, 1))


EXAMPLES = [
    Example(
        code=(
            "import torch\n"
            "def soft_update(critic, critic_target, tau):\n"
            "    for param, target_param in zip(critic.parameters(), critic_target.parameters()):\n"
            "        target_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)\n"
        ),
        rewritten=True,
        note="TD3 author code / CleanRL soft update",
        expected="td3_author_code_cleanrl_soft_update",
        inputs=_soft("soft_update"),
    ),
    Example(
        code=(
            "import torch\n"
            "def sync(q_network, target_network, tau):\n"
            "    for target_network_param, q_network_param in zip(target_network.parameters(), q_network.parameters()):\n"
            "        target_network_param.data.copy_(\n"
            "            tau * q_network_param.data + (1.0 - tau) * target_network_param.data\n"
            "        )\n"
        ),
        rewritten=True,
        note="CleanRL DQN: target first in zip",
        expected="cleanrl_dqn",
        inputs=_soft("sync"),
    ),
    Example(
        code=(
            "import torch\n"
            "def update(ac, ac_targ, polyak):\n"
            "    with torch.no_grad():\n"
            "        for p, p_targ in zip(ac.parameters(), ac_targ.parameters()):\n"
            "            p_targ.data.mul_(polyak)\n"
            "            p_targ.data.add_((1 - polyak) * p.data)\n"
        ),
        rewritten=True,
        note="spinningup polyak update",
        expected="spinningup_polyak_update",
        inputs=_soft("update"),
    ),
    Example(
        code=(
            "import torch\n"
            "def update(net, target, tau):\n"
            "    for p, tp in zip(net.parameters(), target.parameters()):\n"
            "        tp.data.mul_(1 - tau).add_(tau * p.data)\n"
        ),
        rewritten=True,
        note="chained mul_().add_()",
        expected="chained_mul",
        inputs=_soft("update"),
    ),
    Example(
        code=(
            "import torch\n"
            "@torch.no_grad()\n"
            "def update(net, target, tau):\n"
            "    for p, tp in zip(net.parameters(), target.parameters()):\n"
            "        tp.mul_(1.0 - tau).add_(p, alpha=tau)\n"
        ),
        rewritten=True,
        note="direct in-place update with alpha under no_grad",
        expected="direct_in_place_update_with_alpha_under",
        inputs=_soft("update"),
    ),
    Example(
        code=(
            "import torch\n"
            "def update(net, target, tau):\n"
            "    with torch.no_grad():\n"
            "        for p, tp in zip(net.parameters(), target.parameters()):\n"
            "            tp.lerp_(p, tau)\n"
        ),
        rewritten=True,
        note="lerp_",
        expected="lerp",
        inputs=_soft("update"),
    ),
    Example(
        code=(
            "def soft_update(net, target, polyak):\n"
            "    for p, p_targ in zip(net.parameters(), target.parameters()):\n"
            "        p_targ.data *= polyak\n"
            "        p_targ.data += (1 - polyak) * p.data\n"
        ),
        rewritten=True,
        note="augmented assignments *= then += on .data",
        expected="augmented_assignments_then_on_data",
        inputs=_soft("soft_update"),
    ),
    Example(
        code=(
            "def update(source, target, tau):\n"
            "    for target_p, source_p in zip(target.parameters(), source.parameters()):\n"
            "        new_val = tau * target_p.data + (1.0 - tau) * source_p.data\n"
            "        target_p.data.copy_(new_val)\n"
        ),
        rewritten=True,
        note="the new value in a temporary first",
        expected="the_new_value_in_a_temporary_first",
        inputs=_soft("update"),
    ),
    Example(
        code=(
            "def hard_update(net, target):\n"
            "    for p, tp in zip(net.parameters(), target.parameters()):\n"
            "        tp.data.copy_(p.data)\n"
        ),
        rewritten=True,
        note="hard copy",
        expected="hard_copy",
        inputs=_hard("hard_update"),
    ),
    Example(
        code=(
            "def soft(net, target, tau):\n"
            "    for p, tp in zip(net.parameters(), target.parameters()):\n"
            "        tp.data.copy_(tau * p.data + (1 - tau) * tp.data)\n"
        ),
        rewritten=True,
        note="allow_lerp: lerp_ instead of the exact form",
        options=(("allow_lerp", True),),
        expected="allow_lerp",
        inputs=_soft("soft"),
    ),
    Example(
        code=(
            "def soft(net, target, tau):\n"
            "    for p, tp in zip(net.state_dict().values(), target.state_dict().values()):\n"
            "        tp.copy_(tau * p + (1 - tau) * tp)\n"
        ),
        rewritten=False,
        reason="state_dict() values",
        note="state_dict includes buffers",
    ),
    Example(
        code=(
            "def soft(net, target, tau):\n"
            "    for p, tp in zip(net.parameters(), target.parameters()):\n"
            "        tp.data.copy_(tau * p.data + (1 - tau) * tp.data)\n"
            "    return tp\n"
        ),
        rewritten=False,
        reason="may be read outside the loop",
        note="loop variable used after the loop",
    ),
    Example(
        code=(
            "def soft(net, target, tau):\n"
            "    for p, tp in zip(net.parameters(), target.parameters()):\n"
            "        tp.data = tau * p.data + (1 - tau) * tp.data\n"
        ),
        rewritten=True,
        note=".data assignment of a soft update (stores new tensors, as the loop does)",
        expected="data_assignment_of_a_soft_update",
        inputs=_soft("soft"),
    ),
    Example(
        code=(
            "def hard(net, target):\n"
            "    for p, tp in zip(net.parameters(), target.parameters()):\n"
            "        tp.data = p.data\n"
        ),
        rewritten=False,
        reason="share the source's storage",
        note="tp.data = p.data shares storage: not a copy",
    ),
    Example(
        code=(
            "def soft(net, target, tau):\n"
            "    for p, tp in zip(net.parameters(), target.parameters()):\n"
            "        tp.data = tau * p.data + (1 - tau) * tp.data\n"
            "        tp.data.clamp_(-1, 1)\n"
        ),
        rewritten=False,
        reason="assigns .data",
        note=".data assignment followed by another statement",
    ),
    Example(
        code=(
            "def soft(net, target, tau, stats):\n"
            "    for p, tp in zip(net.parameters(), target.parameters()):\n"
            "        tp.data.copy_(tau * p.data + (1 - tau) * tp.data)\n"
            "        stats.record(tp)\n"
        ),
        rewritten=False,
        reason="not a recognised target-network update",
        note="extra call in the body",
    ),
    Example(
        code=(
            "def soft(net, target, tau):\n"
            "    for p, tp in zip(net.parameters(), target.parameters()):\n"
            "        tp.data.copy_(tau * p.data.clamp(-1, 1) + (1 - tau) * tp.data)\n"
        ),
        rewritten=False,
        reason="not a recognised target-network update",
        note="non-trivial expression of the parameter",
    ),
    Example(
        code=(
            "def soft(q_params, q_targ_params, tau):\n"
            "    for p, tp in zip(q_params, q_targ_params):\n"
            "        tp.data.copy_(tau * p.data + (1 - tau) * tp.data)\n"
        ),
        rewritten=False,
        reason="not the .parameters() of two modules",
        note="plain lists (could be generators: not rewritten)",
    ),
    Example(
        code=(
            "def copy_grads(net, shared):\n"
            "    for p, sp in zip(net.parameters(), shared.parameters()):\n"
            "        sp._grad = p.grad\n"
        ),
        rewritten=False,
        reason="not a recognised target-network update",
        note="A3C gradient sharing look-alike",
    ),
]
