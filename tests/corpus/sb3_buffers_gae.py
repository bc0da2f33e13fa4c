"""Stable-Baselines3 RolloutBuffer.compute_returns_and_advantage: GAE over [buffer_size, n_envs] numpy.

Source: DLR-RM/stable-baselines3, stable_baselines3/common/buffers.py @
019aeadc1cd1f7149578c202bc931f6f7792bc7c (RolloutBuffer.compute_returns_and_advantage).
License: MIT.
Adapted: the buffer is reduced to the attributes the method reads (set in __init__); the method
is verbatim (docstring shortened).
"""
import numpy as np
import torch as th


class RolloutBuffer:
    def __init__(self, buffer_size, n_envs, gamma, gae_lambda, rewards, values, episode_starts):
        self.buffer_size = buffer_size
        self.n_envs = n_envs
        self.gamma = gamma
        self.gae_lambda = gae_lambda
        self.rewards = rewards
        self.values = values
        self.episode_starts = episode_starts
        self.advantages = np.zeros((self.buffer_size, self.n_envs), dtype=np.float32)
        self.returns = np.zeros((self.buffer_size, self.n_envs), dtype=np.float32)

    def compute_returns_and_advantage(self, last_values: th.Tensor, dones: np.ndarray) -> None:
        """
        Post-processing step: compute the lambda-return (TD(lambda) estimate)
        and GAE(lambda) advantage.
        """
        # Convert to numpy
        last_values = last_values.clone().cpu().numpy().flatten()  # type: ignore[assignment]

        last_gae_lam = 0
        for step in reversed(range(self.buffer_size)):
            if step == self.buffer_size - 1:
                next_non_terminal = 1.0 - dones.astype(np.float32)
                next_values = last_values
            else:
                next_non_terminal = 1.0 - self.episode_starts[step + 1]
                next_values = self.values[step + 1]
            delta = self.rewards[step] + self.gamma * next_values * next_non_terminal - self.values[step]
            last_gae_lam = delta + self.gamma * self.gae_lambda * next_non_terminal * last_gae_lam
            self.advantages[step] = last_gae_lam
        # TD(lambda) estimator, see Github PR #375 or "Telescoping in TD(lambda)"
        # in David Silver Lecture 4: https://www.youtube.com/watch?v=PnHCvfgC_ZA
        self.returns = self.advantages + self.values


EXPECT = {
    "for step in reversed(range(self.buffer_size)):": ("vectorize.recurrence", "REWRITTEN", "exact"),
}


def run(ns, T, seed):
    rng = np.random.default_rng(seed)
    n_envs = 8
    rewards = rng.standard_normal((T, n_envs)).astype(np.float32)
    values = rng.standard_normal((T, n_envs)).astype(np.float32)
    starts = (rng.random((T, n_envs)) < 0.05).astype(np.float32)
    buf = ns["RolloutBuffer"](T, n_envs, 0.99, 0.95, rewards, values, starts)
    last_values = th.from_numpy(rng.standard_normal((n_envs, 1)).astype(np.float32))
    dones = rng.random(n_envs) < 0.2
    buf.compute_returns_and_advantage(last_values, dones)
    return buf.advantages, buf.returns
