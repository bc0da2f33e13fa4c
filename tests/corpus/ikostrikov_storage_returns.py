"""ikostrikov pytorch-a2c-ppo-acktr-gail RolloutStorage.compute_returns: four backward loops
(GAE and plain returns, with and without proper time limits) over [T(+1), N, 1] tensors.

Source: ikostrikov/pytorch-a2c-ppo-acktr-gail, a2c_ppo_acktr/storage.py @
225eed3b50caa3a3297abe96ba0ac2bf44bb8262 (RolloutStorage.__init__ storage shapes,
compute_returns). License: MIT.
Adapted: __init__ keeps only the tensors compute_returns reads; compute_returns is verbatim.
"""
import torch


class RolloutStorage(object):
    def __init__(self, num_steps, num_processes):
        self.rewards = torch.zeros(num_steps, num_processes, 1)
        self.value_preds = torch.zeros(num_steps + 1, num_processes, 1)
        self.returns = torch.zeros(num_steps + 1, num_processes, 1)
        self.masks = torch.ones(num_steps + 1, num_processes, 1)

        # Masks that indicate whether it's a true terminal state
        # or time limit end state
        self.bad_masks = torch.ones(num_steps + 1, num_processes, 1)

        self.num_steps = num_steps
        self.step = 0

    def compute_returns(self,
                        next_value,
                        use_gae,
                        gamma,
                        gae_lambda,
                        use_proper_time_limits=True):
        if use_proper_time_limits:
            if use_gae:
                self.value_preds[-1] = next_value
                gae = 0
                for step in reversed(range(self.rewards.size(0))):
                    delta = self.rewards[step] + gamma * self.value_preds[
                        step + 1] * self.masks[step +
                                               1] - self.value_preds[step]
                    gae = delta + gamma * gae_lambda * self.masks[step +
                                                                  1] * gae
                    gae = gae * self.bad_masks[step + 1]
                    self.returns[step] = gae + self.value_preds[step]
            else:
                self.returns[-1] = next_value
                for step in reversed(range(self.rewards.size(0))):
                    self.returns[step] = (self.returns[step + 1] * \
                        gamma * self.masks[step + 1] + self.rewards[step]) * self.bad_masks[step + 1] \
                        + (1 - self.bad_masks[step + 1]) * self.value_preds[step]
        else:
            if use_gae:
                self.value_preds[-1] = next_value
                gae = 0
                for step in reversed(range(self.rewards.size(0))):
                    delta = self.rewards[step] + gamma * self.value_preds[
                        step + 1] * self.masks[step +
                                               1] - self.value_preds[step]
                    gae = delta + gamma * gae_lambda * self.masks[step +
                                                                  1] * gae
                    self.returns[step] = gae + self.value_preds[step]
            else:
                self.returns[-1] = next_value
                for step in reversed(range(self.rewards.size(0))):
                    self.returns[step] = self.returns[step + 1] * \
                        gamma * self.masks[step + 1] + self.rewards[step]


EXPECT = {
    "for step in reversed(range(self.rewards.size(0))):@1": ("vectorize.recurrence", "REWRITTEN", "reassociated"),
    "for step in reversed(range(self.rewards.size(0))):@2": ("vectorize.recurrence", "REWRITTEN", "reassociated"),
    "for step in reversed(range(self.rewards.size(0))):@3": ("vectorize.recurrence", "REWRITTEN", "exact"),
    "for step in reversed(range(self.rewards.size(0))):@4": ("vectorize.recurrence", "REWRITTEN", "reassociated"),
}


def _storage(ns, T, seed):
    g = torch.Generator().manual_seed(seed)
    N = 6
    s = ns["RolloutStorage"](T, N)
    s.rewards.copy_(torch.randn(T, N, 1, generator=g))
    s.value_preds.copy_(torch.randn(T + 1, N, 1, generator=g))
    s.masks.copy_((torch.rand(T + 1, N, 1, generator=g) > 0.1).float())
    s.bad_masks.copy_((torch.rand(T + 1, N, 1, generator=g) > 0.05).float())
    next_value = torch.randn(N, 1, generator=g)
    return s, next_value


def run(ns, T, seed):
    out = []
    s, v = _storage(ns, T, seed)
    s.compute_returns(v, True, 0.99, 0.95, True)
    out.append((s.returns, s.value_preds))
    s, v = _storage(ns, T, seed)
    s.compute_returns(v, False, 0.99, 0.95, True)
    out.append((s.returns, s.value_preds))
    s, v = _storage(ns, T, seed)
    s.compute_returns(v, True, 0.99, 0.95, False)
    out.append((s.returns, s.value_preds))
    s, v = _storage(ns, T, seed)
    s.compute_returns(v, False, 0.99, 0.95, False)
    out.append((s.returns, s.value_preds))
    return out
