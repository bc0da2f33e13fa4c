"""Khrylx PyTorch-RL estimate_advantages: three recurrences carried through prev_* scalars read
back from the [T, 1] outputs (returns[i, 0]), one loop, then normalisation.

Source: Khrylx/PyTorch-RL, core/common.py @ 2489b804c8783fc7181330c21cc3c998222ca90a.
License: MIT.
Adapted: none (function verbatim).
"""


def estimate_advantages(rewards, masks, values, gamma, tau, tensor_type):

    returns = tensor_type(rewards.size(0), 1)
    deltas = tensor_type(rewards.size(0), 1)
    advantages = tensor_type(rewards.size(0), 1)

    prev_return = 0
    prev_value = 0
    prev_advantage = 0
    for i in reversed(range(rewards.size(0))):
        returns[i] = rewards[i] + gamma * prev_return * masks[i]
        deltas[i] = rewards[i] + gamma * prev_value * masks[i] - values[i]
        advantages[i] = deltas[i] + gamma * tau * prev_advantage * masks[i]

        prev_return = returns[i, 0]
        prev_value = values[i, 0]
        prev_advantage = advantages[i, 0]
    advantages = (advantages - advantages.mean()) / advantages.std()

    return advantages, returns


EXPECT = {
    # reassociated: `gamma * prev_return * masks[i]` is regrouped as (gamma * masks[i]) * prev_return
    "for i in reversed(range(rewards.size(0))):": ("vectorize.recurrence", "REWRITTEN", "reassociated"),
}
LENGTHS = (2, 3, 40)


def run(ns, T, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, 1, dtype=torch.float64, generator=g)
    masks = (torch.rand(T, generator=g) > 0.1).double()
    values = torch.randn(T, 1, dtype=torch.float64, generator=g)
    return ns["estimate_advantages"](rewards, masks, values, 0.99, 0.95, torch.DoubleTensor)
