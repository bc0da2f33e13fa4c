"""Phil Tabor PPO learn(): the quadratic advantage double loop (it does not reset at episode ends,
it multiplies the TD error by 1 - done) over numpy arrays; two optimizers stepped after one
backward().

Source: philtabor/Youtube-Code-Repository,
ReinforcementLearning/PolicyGradient/PPO/torch/ppo_torch.py @
26fa62e92ca403a33c098395a308d7d03290e4ce (Agent.learn, advantage part). License: none stated
(no LICENSE file in the repository).
Adapted: the advantage computation is wrapped in a function of the arrays generate_batches()
returns (self.gamma/self.gae_lambda kept through a small agent object); loop text verbatim.
"""
import numpy as np
import torch as T


class Agent:
    def __init__(self, gamma=0.99, gae_lambda=0.95):
        self.gamma = gamma
        self.gae_lambda = gae_lambda

    def advantages(self, reward_arr, vals_arr, dones_arr):
            values = vals_arr
            advantage = np.zeros(len(reward_arr), dtype=np.float32)

            for t in range(len(reward_arr)-1):
                discount = 1
                a_t = 0
                for k in range(t, len(reward_arr)-1):
                    a_t += discount*(reward_arr[k] + self.gamma*values[k+1]*\
                            (1-int(dones_arr[k])) - values[k])
                    discount *= self.gamma*self.gae_lambda
                advantage[t] = a_t
            advantage = T.tensor(advantage)
            return advantage


EXPECT = {
    "for t in range(len(reward_arr)-1):": ("vectorize.recurrence", "REWRITTEN", "reassociated"),
}
LENGTHS = (1, 2, 3, 40)


def run(ns, T_, seed):
    rng = np.random.default_rng(seed)
    rewards = rng.standard_normal(T_)  # np.array of a list of Python floats, as PPOMemory gives
    vals = rng.standard_normal(T_)
    dones = rng.random(T_) < 0.1
    return ns["Agent"]().advantages(rewards, vals, dones)
