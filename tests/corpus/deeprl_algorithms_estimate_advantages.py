"""DeepRL_Algorithms estimate_advantages: GAE over [T, 1] tensors whose carries are read back
from the rows just written (prev_value = values[i, 0], prev_advantage = advantages[i, 0]), with
deltas stored in a buffer of their own.

Source: Renzhenxuexidemaimai/DeepRL_Algorithms (a copy of RITCHIEHuang/DeepRL_Algorithms, whose GAE
follows Khrylx/PyTorch-RL: see khrylx_estimate_advantages.py for the three-output original),
Common/GAE.py. Commit: not recorded by the index. License: not stated.
Adapted: the imports of FLOAT / device from Utils.torch_utils are replaced by their definitions
(torch.FloatTensor on the CPU); the function is verbatim.
"""
import torch

FLOAT = torch.FloatTensor
device = torch.device("cpu")


def estimate_advantages(rewards, masks, values, gamma, tau):
    deltas = FLOAT(rewards.size(0), 1).to(device)
    advantages = FLOAT(rewards.size(0), 1).to(device)

    prev_value = 0
    prev_advantage = 0
    for i in reversed(range(rewards.size(0))):
        deltas[i] = rewards[i] + gamma * prev_value * masks[i] - values[i]
        advantages[i] = deltas[i] + gamma * tau * prev_advantage * masks[i]

        prev_value = values[i, 0]
        prev_advantage = advantages[i, 0]

    returns = values + advantages
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-10)

    return advantages, returns


EXPECT = {
    "for i in reversed(range(rewards.size(0))):": ("vectorize.recurrence", "REWRITTEN", "reassociated"),
}


def run(ns, T, seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, 1, generator=g)
    masks = (torch.rand(T, 1, generator=g) > 0.05).float()
    values = torch.randn(T, 1, generator=g)
    return ns["estimate_advantages"](rewards, masks, values, 0.99, 0.95)
