"""SamplingReconstruction calculate_returns: returns over [B, T] tensors with time in the second
dimension (rewards[:, i], returns[:, i]), walked by range(returns.shape[1] - 1, -1, -1), a zero
tensor carry moved to the device first.

Source: ottersome/SamplingReconstruction, samprecon/utils/rl_utils.py (calculate_returns, the
version with `R = ...; returns[:, i] = R`). Commit: not recorded by the index. License: not
recorded.
Adapted: none (function verbatim).
"""

import torch


def calculate_returns(rewards, gamma):
    device = rewards.device
    R = torch.zeros((rewards.shape[0])).to(device)
    n = len(rewards)
    returns = torch.zeros_like(rewards).to(device)

    for i in range(returns.shape[1] - 1, -1, -1):
        R = rewards[:, i] + gamma * R
        returns[:, i] = R

    return returns


EXPECT = {
    "for i in range(returns.shape[1] - 1, -1, -1):": ("vectorize.recurrence", "REWRITTEN", "exact"),
}


def run(ns, T, seed):
    g = torch.Generator().manual_seed(seed)
    return (
        ns["calculate_returns"](torch.randn(5, T, generator=g), 0.99),
        # float64 rewards: the float32 zero carry is promoted on the first step
        ns["calculate_returns"](torch.randn(3, T, generator=g, dtype=torch.float64), 0.9),
    )
