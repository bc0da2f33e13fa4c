"""RLProject REINFORCE loss: `loss += log_probs[t] * (rewards[t] + discount_factor * rtrn)` with the
return carried in the same backward loop: a reduction over a recurrence, which must stay as written.

Source: DuckerDuck/RLProject, losses/REINFORCE.py (loss). Commit: not recorded by the index.
License: not recorded.
Adapted: none (verbatim).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim

def loss():
    def loss(policy, episode, discount_factor):
        """
        Computes reinforce loss for given episode.
        Args:
            policy: A policy which allows us to get probabilities of actions in states with its get_probs method.
        Returns:
            loss: reinforce loss
        """
        # Compute the reinforce loss
        # Make sure that your function runs in LINEAR TIME
        # Note that the rewards/returns should be maximized 
        # while the loss should be minimized so you need a - somewhere
        # YOUR CODE HERE

        # −∑𝑡log𝜋𝜃(𝑎𝑡|𝑠𝑡)𝐺𝑡
        states, actions, rewards, _ = episode
        log_probs = torch.log(policy.get_probs(states,actions))
        rtrn = 0
        loss = 0

        for t in range(len(states) - 1, -1, -1):
            loss += log_probs[t] * (rewards[t] + discount_factor * rtrn)
            rtrn = discount_factor * rtrn + rewards[t]
        loss *= -1
        return loss

    return loss


EXPECT = {
    "for t in range(len(states) - 1, -1, -1):": ("vectorize.recurrence", "SKIPPED", None),
    "for t in range(len(states) - 1, -1, -1):@1": ("vectorize.reduction", "SKIPPED", None),
}


def run(ns, T, seed):
    from types import SimpleNamespace
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(T, 1, generator=g).add_(0.1).requires_grad_()
    policy = SimpleNamespace(get_probs=lambda s, a: w * 0.9)
    episode = (torch.zeros(T, 4), torch.zeros(T, 1), torch.randn(T, 1, generator=g), None)
    out = ns["loss"]()(policy, episode, 0.99)
    return out, torch.autograd.grad(out.sum(), w)[0]
