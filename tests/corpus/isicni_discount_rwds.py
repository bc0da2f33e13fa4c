"""isicni tutorials discount_rwds: the Karpathy-style running_add over a numpy array of rewards
(np.asarray of a list), reversed(range(0, rewards.size)).

Source: annikc/isicni_tutorials, ReinforcementLearning/2022/rl_utils.py (discount_rwds). Commit:
not recorded by the index. License: not recorded.
Adapted: none (function verbatim).
"""
import numpy as np


# backward rollout of return value through the reward vector
def discount_rwds(rewards, gamma):
    rewards = np.asarray(rewards)
    disc_rwds = np.zeros_like(rewards)
    running_add = 0
    for t in reversed(range(0, rewards.size)):
        running_add = running_add*gamma + rewards[t]
        disc_rwds[t] = running_add
    return disc_rwds


EXPECT = {
    "for t in reversed(range(0, rewards.size)):": ("vectorize.recurrence", "REWRITTEN", "exact"),
}


def run(ns, T, seed):
    rng = np.random.default_rng(seed)
    return (
        ns["discount_rwds"](rng.standard_normal(T), 0.99),
        ns["discount_rwds"](rng.standard_normal(T).astype(np.float32), 0.9),
        ns["discount_rwds"]([float(x) for x in rng.standard_normal(T)], 0.99),
        ns["discount_rwds"]([int(x) for x in rng.integers(0, 2, T)], 0.99),
    )
