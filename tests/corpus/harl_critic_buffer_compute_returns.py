"""HARL OnPolicyCriticBufferEP.compute_returns: MAPPO's four backward loops with the
loop-invariant condition on a parameter (`if value_normalizer is not None:`) instead of an
attribute, ValueNorm.denormalize calls in one branch, GAE with bad-mask resets, returns through
memory.

Source: PKU-MARL/HARL, harl/common/buffers/on_policy_critic_buffer_ep.py @
690fb1d957c8b526d533bc8705c16c701ec8e691 (OnPolicyCriticBufferEP.compute_returns). License: MIT.
Adapted: the buffer is reduced to the attributes the method reads (set in __init__); the method
is verbatim (docstring shortened); ValueNorm is a stub with the same denormalize().
"""
import numpy as np


class ValueNormStub:
    def __init__(self, mean, std):
        self.mean, self.std = mean, std

    def denormalize(self, x):
        return x * self.std + self.mean


class OnPolicyCriticBufferEP:
    def __init__(self, args, rewards, value_preds, masks, bad_masks):
        self.gamma = args.gamma
        self.gae_lambda = args.gae_lambda
        self.use_gae = args.use_gae
        self.use_proper_time_limits = args.use_proper_time_limits
        self.rewards = rewards
        self.value_preds = value_preds
        self.masks = masks
        self.bad_masks = bad_masks
        self.returns = np.zeros_like(value_preds)

    def compute_returns(self, next_value, value_normalizer=None):
        """Compute returns either as discounted sum of rewards, or using GAE."""
        if (
            self.use_proper_time_limits
        ):  # consider the difference between truncation and termination
            if self.use_gae:  # use GAE
                self.value_preds[-1] = next_value
                gae = 0
                for step in reversed(range(self.rewards.shape[0])):
                    if value_normalizer is not None:  # use ValueNorm
                        delta = (
                            self.rewards[step]
                            + self.gamma
                            * value_normalizer.denormalize(self.value_preds[step + 1])
                            * self.masks[step + 1]
                            - value_normalizer.denormalize(self.value_preds[step])
                        )
                        gae = (
                            delta
                            + self.gamma * self.gae_lambda * self.masks[step + 1] * gae
                        )
                        gae = self.bad_masks[step + 1] * gae
                        self.returns[step] = gae + value_normalizer.denormalize(
                            self.value_preds[step]
                        )
                    else:  # do not use ValueNorm
                        delta = (
                            self.rewards[step]
                            + self.gamma
                            * self.value_preds[step + 1]
                            * self.masks[step + 1]
                            - self.value_preds[step]
                        )
                        gae = (
                            delta
                            + self.gamma * self.gae_lambda * self.masks[step + 1] * gae
                        )
                        gae = self.bad_masks[step + 1] * gae
                        self.returns[step] = gae + self.value_preds[step]
            else:  # do not use GAE
                self.returns[-1] = next_value
                for step in reversed(range(self.rewards.shape[0])):
                    if value_normalizer is not None:  # use ValueNorm
                        self.returns[step] = (
                            self.returns[step + 1] * self.gamma * self.masks[step + 1]
                            + self.rewards[step]
                        ) * self.bad_masks[step + 1] + (
                            1 - self.bad_masks[step + 1]
                        ) * value_normalizer.denormalize(
                            self.value_preds[step]
                        )
                    else:  # do not use ValueNorm
                        self.returns[step] = (
                            self.returns[step + 1] * self.gamma * self.masks[step + 1]
                            + self.rewards[step]
                        ) * self.bad_masks[step + 1] + (
                            1 - self.bad_masks[step + 1]
                        ) * self.value_preds[
                            step
                        ]
        else:  # do not consider the difference between truncation and termination, i.e. all done episodes are terminated
            if self.use_gae:  # use GAE
                self.value_preds[-1] = next_value
                gae = 0
                for step in reversed(range(self.rewards.shape[0])):
                    if value_normalizer is not None:  # use ValueNorm
                        delta = (
                            self.rewards[step]
                            + self.gamma
                            * value_normalizer.denormalize(self.value_preds[step + 1])
                            * self.masks[step + 1]
                            - value_normalizer.denormalize(self.value_preds[step])
                        )
                        gae = (
                            delta
                            + self.gamma * self.gae_lambda * self.masks[step + 1] * gae
                        )
                        self.returns[step] = gae + value_normalizer.denormalize(
                            self.value_preds[step]
                        )
                    else:  # do not use ValueNorm
                        delta = (
                            self.rewards[step]
                            + self.gamma
                            * self.value_preds[step + 1]
                            * self.masks[step + 1]
                            - self.value_preds[step]
                        )
                        gae = (
                            delta
                            + self.gamma * self.gae_lambda * self.masks[step + 1] * gae
                        )
                        self.returns[step] = gae + self.value_preds[step]
            else:  # do not use GAE
                self.returns[-1] = next_value
                for step in reversed(range(self.rewards.shape[0])):
                    self.returns[step] = (
                        self.returns[step + 1] * self.gamma * self.masks[step + 1]
                        + self.rewards[step]
                    )


EXPECT = {
    # left alone: the body calls value_normalizer.denormalize(), and unswitch declines any call;
    # the test reads only the local parameter by identity (`is not None`), which no call can
    # rebind, so the reason overstates the risk (finding in the audit report)
    "for step in reversed(range(self.rewards.shape[0])):@1": ("vectorize.recurrence", "SKIPPED", None),
    "for step in reversed(range(self.rewards.shape[0])):@2": ("vectorize.recurrence", "SKIPPED", None),
    "for step in reversed(range(self.rewards.shape[0])):@3": ("vectorize.recurrence", "SKIPPED", None),
    # returns through memory, (x * gamma) * mask regrouped
    "for step in reversed(range(self.rewards.shape[0])):@4": ("vectorize.recurrence", "REWRITTEN", "reassociated"),
}


def run(ns, T, seed):
    from types import SimpleNamespace
    rng = np.random.default_rng(seed)
    threads = 5
    out = []
    for proper in (True, False):
        for gae in (True, False):
            for norm in (False, True):
                rewards = rng.standard_normal((T, threads, 1)).astype(np.float32)
                values = rng.standard_normal((T + 1, threads, 1)).astype(np.float32)
                masks = (rng.random((T + 1, threads, 1)) > 0.05).astype(np.float32)
                bad = (rng.random((T + 1, threads, 1)) > 0.02).astype(np.float32)
                args = SimpleNamespace(gamma=0.99, gae_lambda=0.95, use_gae=gae, use_proper_time_limits=proper)
                buf = ns["OnPolicyCriticBufferEP"](args, rewards, values, masks, bad)
                vn = ns["ValueNormStub"](np.float32(0.5), np.float32(2.0)) if norm else None
                buf.compute_returns(rng.standard_normal((threads, 1)).astype(np.float32), vn)
                out.append((buf.returns, buf.value_preds))
    return out
