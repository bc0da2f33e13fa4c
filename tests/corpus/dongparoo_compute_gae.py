"""enhanced-ppo-mobile-robot-nav compute_gae: GAE over Python lists (values + [last_value]),
advantages preallocated as [0.0] * T and written by index, dones as Python bools or floats,
returns by a comprehension, torch.tensor of both lists.

Source: dongparoo/enhanced-ppo-mobile-robot-nav, utils.py (compute_gae). Commit: not recorded by
the index. License: not recorded.
Adapted: none (function verbatim).
"""
# utils.py

import torch

def compute_gae(rewards, values, dones, last_value, gamma=0.99, lam=0.95):
    values = values + [last_value]                 # ★ bootstrap
    advantages = [0.0] * len(rewards)
    gae = 0.0
    for i in reversed(range(len(rewards))):
        delta = rewards[i] + gamma * values[i+1] * (1 - dones[i]) - values[i]
        gae   = delta + gamma * lam * (1 - dones[i]) * gae
        advantages[i] = gae
    returns = [adv + v for adv, v in zip(advantages, values[:-1])]
    return torch.tensor(advantages, dtype=torch.float32), \
           torch.tensor(returns,     dtype=torch.float32)


EXPECT = {
    "for i in reversed(range(len(rewards))):": ("vectorize.recurrence", "REWRITTEN", "exact"),
}
FINDINGS = {
    "runtime": (
        "the output is a Python list written by index (advantages = [0.0] * len(rewards); "
        "advantages[i] = gae): recurrence_ok takes outs to be arrays and declines, so the site is "
        "reported rewritten but never runs vectorized on this code's inputs (lists of floats and "
        "bool / float / int flags); it should either store into the list or be left alone with a reason"
    ),
}


def run(ns, T, seed):
    import random
    rnd = random.Random(seed)
    out = []
    for flag in (lambda: rnd.random() < 0.1, lambda: float(rnd.random() < 0.1), lambda: int(rnd.random() < 0.1)):
        rewards = [rnd.gauss(0, 1) for _ in range(T)]
        values = [rnd.gauss(0, 1) for _ in range(T)]
        dones = [flag() for _ in range(T)]
        out.append(ns["compute_gae"](rewards, values, dones, rnd.gauss(0, 1)))
    return out
