"""Hands-on-RL (boyuai, the book's rl_utils) compute_advantage: `for delta in td_delta[::-1]`
over the rows of a [T, 1] numpy array, list.append then reverse(), torch.tensor of the list.

Source: lanceyliao/Hands-on-RL (a copy of boyuai/Hands-on-RL), rl_utils.py @
216c1a88fb5c4631369164dcaeb6920bc33a0fcf (compute_advantage). License: Apache-2.0 (the book's
repository); the copy states none.
Adapted: none (function verbatim).
"""
import torch


def compute_advantage(gamma, lmbda, td_delta):
    td_delta = td_delta.detach().numpy()
    advantage_list = []
    advantage = 0.0
    for delta in td_delta[::-1]:  # 从后往前逆序算，刚好可以算出广义优势估计的值
        advantage = gamma * lmbda * advantage + delta
        advantage_list.append(advantage)  # 保存每一步的优势估计
    advantage_list.reverse()
    return torch.tensor(advantage_list, dtype=torch.float)


EXPECT = {
    "for delta in td_delta[::-1]:  # 从后往前逆序算，刚好可以算出广义优势估计的值": ("vectorize.recurrence", "REWRITTEN", "exact"),
}


def run(ns, T, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for shape in ((T, 1), (T,)):
        td_delta = torch.randn(shape, generator=g)
        out.append(ns["compute_advantage"](0.98, 0.95, td_delta))
    return out
