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
FINDINGS = {
    "runtime": (
        "F-dreamer-grad: `reward` requires grad here (as in Dreamer's imagination training, where the "
        "lambda-returns are backpropagated), and recurrence_ok keeps every input that requires grad "
        "on the loop (by design: the op's autograd path is not claimed exact), so the rewritten loop "
        "runs its else branch. Measured: with the guard's grad check lifted, values and gradients "
        "are bitwise equal to the loop's on this code (30 seeds, T=50); a general exactness argument "
        "for gradients (accumulation order when a carried value has several uses) is still missing"
    ),
}


def run(ns, T, seed):
    g = torch.Generator().manual_seed(seed)
    B = 5
    reward = torch.randn(T, B, 1, generator=g).requires_grad_()
    value = torch.randn(T, B, 1, generator=g)
    discount = 0.99 * (torch.rand(T, B, 1, generator=g) > 0.05).float()
    bootstrap = torch.randn(B, 1, generator=g)
    ret = ns["compute_return"](reward, value, discount, bootstrap, 0.95)
    return ret, torch.autograd.grad(ret.sum(), reward)[0]
