"""Tianshou's reference episodic return (the slow baseline its tests compare against): a numpy
backward loop that stores the reward, adds the discounted carry only where the step is not done,
and reads the stored value back as the carry.

Source: thu-ml/tianshou, test/base/test_returns.py @ 024055fcc32a4b62181497f4f85fa6537c6dec79
(compute_episodic_return_base). License: MIT.
Adapted: none (function verbatim); Batch is a SimpleNamespace.
"""
import numpy as np


def compute_episodic_return_base(batch, gamma):
    returns = np.zeros_like(batch.rew)
    last = 0
    for i in reversed(range(len(batch.rew))):
        returns[i] = batch.rew[i]
        if not batch.done[i]:
            returns[i] += last * gamma
        last = returns[i]
    batch.returns = returns
    return batch


EXPECT = {
    "for i in reversed(range(len(batch.rew))):": ("vectorize.recurrence", "SKIPPED", None),
}
LEAVE_ALONE = True


def run(ns, T, seed):
    from types import SimpleNamespace
    rng = np.random.default_rng(seed)
    out = []
    for done in (rng.random(T) < 0.1, (rng.random(T) < 0.1).astype(np.float64)):
        batch = SimpleNamespace(rew=rng.random(T), done=done)
        out.append(ns["compute_episodic_return_base"](batch, 0.99).returns)
    return out
