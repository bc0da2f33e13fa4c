"""rl_proj GAE.compute (a staticmethod): numpy GAE over [T] arrays, np.append of the bootstrap
value, mask = 1.0 - dones[t] (0/1 floats or bools), float32 advantages.

Source: BigbossDD/rl_proj, src/helper_classes/PPO_helper_classes/GAE.py (GAE.compute). Commit:
not recorded by the index. License: not recorded.
Adapted: none (class verbatim, docstring shortened).
"""
import numpy as np


class GAE:
    """
    Computes Generalized Advantage Estimation (GAE) for PPO.
    """

    @staticmethod
    def compute(values, rewards, dones, last_value, gamma, lam):
        """
        returns --> 
            advantages (np.ndarray)
            returns (np.ndarray)
        """
        T = len(rewards)

        advantages = np.zeros(T, dtype=np.float32)
        gae = 0.0

        # append last value for bootstrapping
        values = np.append(values, last_value)

        for t in reversed(range(T)):
            mask = 1.0 - dones[t]
            delta = rewards[t] + gamma * values[t + 1] * mask - values[t]
            gae = delta + gamma * lam * mask * gae
            advantages[t] = gae

        returns = advantages + values[:-1]

        return advantages, returns


EXPECT = {
    "for t in reversed(range(T)):": ("vectorize.recurrence", "REWRITTEN", "exact"),
}


def run(ns, T, seed):
    rng = np.random.default_rng(seed)
    out = []
    for dtype in (np.float32, np.float64):
        values = rng.standard_normal(T).astype(dtype)
        rewards = rng.standard_normal(T).astype(dtype)
        for dones in ((rng.random(T) < 0.1).astype(dtype), rng.random(T) < 0.1):
            out.append(ns["GAE"].compute(values, rewards, dones, float(rng.standard_normal()), 0.99, 0.95))
    return out
