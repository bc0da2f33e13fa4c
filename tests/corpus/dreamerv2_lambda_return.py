"""dreamerv2 (RajGhugare19) compute_return: lambda-returns over a precomputed list of time
indices (range(T - 1, -1, -1) materialised), outputs.append, torch.flip(torch.stack(outputs)).

Source: RajGhugare19/dreamerv2, dreamerv2/utils/algorithm.py (compute_return). Commit: not
recorded by the index. License: not recorded.
Adapted: none (function verbatim).
"""
import torch


def compute_return(
                    reward: torch.Tensor,
                    value: torch.Tensor,
                    discount: torch.Tensor,
                    bootstrap: torch.Tensor,
                    lambda_: float
                ):
    """
    Compute the discounted reward for a batch of data.
    reward, value, and discount are all shape [horizon - 1, batch, 1] (last element is cut off)
    Bootstrap is [batch, 1]
    """
    next_values = torch.cat([value[1:], bootstrap[None]], 0)
    target = reward + discount * next_values * (1 - lambda_)
    timesteps = list(range(reward.shape[0] - 1, -1, -1))
    outputs = []
    accumulated_reward = bootstrap
    for t in timesteps:
        inp = target[t]
        discount_factor = discount[t]
        accumulated_reward = inp + discount_factor * lambda_ * accumulated_reward
        outputs.append(accumulated_reward)
    returns = torch.flip(torch.stack(outputs), [0])
    return returns


EXPECT = {
    "for t in timesteps:": ("vectorize.recurrence", "REWRITTEN", "exact"),
}


def run(ns, T, seed):
    g = torch.Generator().manual_seed(seed)
    B = 5
    # imagined rollouts: reward, value, discount heads and bootstrap all carry grad (actor training
    # backpropagates the lambda-returns); no value has more than two uses, so gradients are bitwise
    reward = torch.randn(T, B, 1, generator=g).requires_grad_()
    value = torch.randn(T, B, 1, generator=g).requires_grad_()
    discount = (0.99 * (torch.rand(T, B, 1, generator=g) > 0.05).float()).requires_grad_()
    bootstrap = torch.randn(B, 1, generator=g).requires_grad_()
    ret = ns["compute_return"](reward, value, discount, bootstrap, 0.95)
    w = torch.randn(T, B, 1, generator=g)
    return ret, torch.autograd.grad((ret * w).sum(), [reward, value, discount, bootstrap])
