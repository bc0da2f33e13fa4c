"""easy-rl A2C.compute_returns: returns over a Python list of [N, 1] tensors, masks per step,
bootstrapped from next_value, returns.insert(0, R).

Source: datawhalechina/easy-rl, codes/A2C/agent.py (A2C.compute_returns). Commit: not recorded
by the index. License: not recorded.
Adapted: the agent is reduced to gamma (set in __init__); the method is verbatim.
"""
import torch


class A2C:
    def __init__(self, gamma) -> None:
        self.gamma = gamma

    def compute_returns(self,next_value, rewards, masks):
        R = next_value
        returns = []
        for step in reversed(range(len(rewards))):
            R = rewards[step] + self.gamma * R * masks[step]
            returns.insert(0, R)
        return returns


EXPECT = {
    "for step in reversed(range(len(rewards))):": ("vectorize.recurrence", "REWRITTEN", "reassociated"),
}


def run(ns, T, seed):
    g = torch.Generator().manual_seed(seed)
    N = 4
    w = torch.randn(3, 1, generator=g).requires_grad_()
    next_value = torch.randn(N, 3, generator=g) @ w
    rewards = [torch.randn(N, 1, generator=g) for _ in range(T)]
    masks = [(torch.rand(N, 1, generator=g) > 0.1).float() for _ in range(T)]
    ret = torch.cat(ns["A2C"](0.99).compute_returns(next_value, rewards, masks))
    return ret, torch.autograd.grad(ret.sum(), w)[0]
