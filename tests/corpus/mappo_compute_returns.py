"""MAPPO (marlbenchmark/on-policy) SharedReplayBuffer.compute_returns: four backward loops over
[T + 1, threads, agents, 1] numpy buffers, each with a loop-invariant `if self._use_popart:` in the
body (unswitching), GAE with a bad-mask reset, plain returns through memory self.returns[step + 1].

Source: marlbenchmark/on-policy, onpolicy/utils/shared_buffer.py @
41563a64de3845ec73131a1e34743d5294ac38e1 (SharedReplayBuffer.compute_returns). License: MIT.
Adapted: the buffer is reduced to the attributes the method reads (set in __init__); the method
is verbatim (docstring shortened); PopArt is a stub with the same denormalize().
"""
import numpy as np


class PopArtStub:
    def __init__(self, mean, std):
        self.mean, self.std = mean, std

    def denormalize(self, x):
        return x * self.std + self.mean


class SharedReplayBuffer:
    def __init__(self, args, rewards, value_preds, masks, bad_masks):
        self.gamma = args.gamma
        self.gae_lambda = args.gae_lambda
        self._use_gae = args.use_gae
        self._use_popart = args.use_popart
        self._use_proper_time_limits = args.use_proper_time_limits
        self.rewards = rewards
        self.value_preds = value_preds
        self.masks = masks
        self.bad_masks = bad_masks
        self.returns = np.zeros_like(value_preds)

    def compute_returns(self, next_value, value_normalizer=None):
        """
        Compute returns either as discounted sum of rewards, or using GAE.
        """
        if self._use_proper_time_limits:
            if self._use_gae:
                self.value_preds[-1] = next_value
                gae = 0
                for step in reversed(range(self.rewards.shape[0])):
                    if self._use_popart:
                        # step + 1
                        delta = self.rewards[step] + self.gamma * value_normalizer.denormalize(
                            self.value_preds[step + 1]) * self.masks[step + 1] \
                                - value_normalizer.denormalize(self.value_preds[step])
                        gae = delta + self.gamma * self.gae_lambda * gae * self.masks[step + 1]
                        gae = gae * self.bad_masks[step + 1]
                        self.returns[step] = gae + value_normalizer.denormalize(self.value_preds[step])
                    else:
                        delta = self.rewards[step] + self.gamma * self.value_preds[step + 1] * self.masks[step + 1] - \
                                self.value_preds[step]
                        gae = delta + self.gamma * self.gae_lambda * self.masks[step + 1] * gae
                        gae = gae * self.bad_masks[step + 1]
                        self.returns[step] = gae + self.value_preds[step]
            else:
                self.returns[-1] = next_value
                for step in reversed(range(self.rewards.shape[0])):
                    if self._use_popart:
                        self.returns[step] = (self.returns[step + 1] * self.gamma * self.masks[step + 1] + self.rewards[
                            step]) * self.bad_masks[step + 1] \
                                             + (1 - self.bad_masks[step + 1]) * value_normalizer.denormalize(
                            self.value_preds[step])
                    else:
                        self.returns[step] = (self.returns[step + 1] * self.gamma * self.masks[step + 1] + self.rewards[
                            step]) * self.bad_masks[step + 1] \
                                             + (1 - self.bad_masks[step + 1]) * self.value_preds[step]
        else:
            if self._use_gae:
                self.value_preds[-1] = next_value
                gae = 0
                for step in reversed(range(self.rewards.shape[0])):
                    if self._use_popart:
                        delta = self.rewards[step] + self.gamma * value_normalizer.denormalize(
                            self.value_preds[step + 1]) * self.masks[step + 1] \
                                - value_normalizer.denormalize(self.value_preds[step])
                        gae = delta + self.gamma * self.gae_lambda * self.masks[step + 1] * gae
                        self.returns[step] = gae + value_normalizer.denormalize(self.value_preds[step])
                    else:
                        delta = self.rewards[step] + self.gamma * self.value_preds[step + 1] * self.masks[step + 1] - \
                                self.value_preds[step]
                        gae = delta + self.gamma * self.gae_lambda * self.masks[step + 1] * gae
                        self.returns[step] = gae + self.value_preds[step]
            else:
                self.returns[-1] = next_value
                for step in reversed(range(self.rewards.shape[0])):
                    self.returns[step] = self.returns[step + 1] * self.gamma * self.masks[step + 1] + self.rewards[step]


EXPECT = {
    # left alone: the loop-invariant `if self._use_popart:` is not unswitched because the body
    # stores into self.returns[step] (a subscript store the analysis does not prove leaves
    # self._use_popart alone)
    "for step in reversed(range(self.rewards.shape[0])):@1": ("vectorize.recurrence", "SKIPPED", None),
    "for step in reversed(range(self.rewards.shape[0])):@2": ("vectorize.recurrence", "SKIPPED", None),
    "for step in reversed(range(self.rewards.shape[0])):@3": ("vectorize.recurrence", "SKIPPED", None),
    # returns through memory, (x * gamma) * mask regrouped
    "for step in reversed(range(self.rewards.shape[0])):@4": ("vectorize.recurrence", "REWRITTEN", "reassociated"),
}


def run(ns, T, seed):
    from types import SimpleNamespace
    rng = np.random.default_rng(seed)
    threads, agents = 4, 3
    out = []
    for proper in (True, False):
        for gae in (True, False):
            for popart in (False, True):
                rewards = rng.standard_normal((T, threads, agents, 1)).astype(np.float32)
                values = rng.standard_normal((T + 1, threads, agents, 1)).astype(np.float32)
                masks = (rng.random((T + 1, threads, agents, 1)) > 0.05).astype(np.float32)
                bad = (rng.random((T + 1, threads, agents, 1)) > 0.02).astype(np.float32)
                args = SimpleNamespace(gamma=0.99, gae_lambda=0.95, use_gae=gae, use_popart=popart,
                                       use_proper_time_limits=proper)
                buf = ns["SharedReplayBuffer"](args, rewards, values, masks, bad)
                norm = ns["PopArtStub"](np.float32(0.5), np.float32(2.0)) if popart else None
                buf.compute_returns(rng.standard_normal((threads, agents, 1)).astype(np.float32), norm)
                out.append((buf.returns, buf.value_preds))
    return out
