"""seagul discount_cumsum: returns through memory (future = cumulative_rewards[i]) into
torch.empty_like(torch.as_tensor(rewards)), rewards given as a tensor or a list of floats.

Source: sgillen/seagul, seagul/rl/common.py (discount_cumsum). Commit: not recorded by the
index. License: not recorded.
Adapted: none (function verbatim).
"""
import torch

# can make this faster I think?
def discount_cumsum(rewards, discount):
    future_cumulative_reward = 0
    cumulative_rewards = torch.empty_like(torch.as_tensor(rewards))
    for i in range(len(rewards) - 1, -1, -1):
        cumulative_rewards[i] = rewards[i] + discount * future_cumulative_reward
        future_cumulative_reward = cumulative_rewards[i]
    return cumulative_rewards


EXPECT = {
    "for i in range(len(rewards) - 1, -1, -1):": ("vectorize.recurrence", "REWRITTEN", "exact"),
}


def run(ns, T, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for dtype in (torch.float32, torch.float64):
        out.append(ns["discount_cumsum"](torch.randn(T, generator=g, dtype=dtype), 0.99))
        out.append(ns["discount_cumsum"](torch.randn(T, 3, generator=g, dtype=dtype), 0.99))
    out.append(ns["discount_cumsum"]([float(x) for x in torch.randn(T, generator=g)], 0.99))
    return out
