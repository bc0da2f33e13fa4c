"""DRL-ExampleCode cal_returns: Monte Carlo returns over a [T] tensor with bool dones negated by
`~ dones[t]`, a 0-d tensor carry, statements ended by semicolons.

Source: DarriusL/DRL-ExampleCode, agent/algorithm/alg_util.py (cal_returns). Commit: not recorded
by the index. License: not stated.
Adapted: none (function verbatim).
"""
import torch


def cal_returns(rewards, dones, gamma):
    '''Compute the returns in the trajectory produced by the Monte Carlo simulation
    '''
    T = rewards.shape[0];
    rets = torch.zeros_like(rewards);
    future_ret = torch.tensor(.0, dtype=rewards.dtype)
    for t in reversed(range(T)):
        future_ret = rewards[t] + gamma * future_ret * (~ dones[t]);
        rets[t] = future_ret;
    return rets;


EXPECT = {
    # `~` is bitwise on integers (~0 == -1); only a bool tensor makes it a logical not
    "for t in reversed(range(T)):": ("vectorize.recurrence", "SKIPPED", None),
}
LEAVE_ALONE = True


def run(ns, T, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for dtype in (torch.float32, torch.float64):
        rewards = torch.randn(T, generator=g, dtype=dtype)
        dones = torch.rand(T, generator=g) < 0.1
        out.append(ns["cal_returns"](rewards, dones, 0.99))
    return out
