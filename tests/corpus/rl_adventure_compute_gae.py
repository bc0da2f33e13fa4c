"""RL-Adventure-2 (higgsfield) compute_gae / compute_returns: backward loops over Python lists of
[N, 1] tensors with values + [next_value], returns.insert(0, ...), then torch.cat(returns).

Source: whikwon/RL-Adventure-2 (a copy of higgsfield/RL-Adventure-2): src/ppo_pros.py @
b18ffff5f6a47b91181bacbd8826132675703e7b (compute_gae) and 1.actor-critic.ipynb @
1a80dcc8b7cf97ded8aa7e043ae759a21ef06d98 (compute_returns cell). License: none stated.
Adapted: none (both functions verbatim).
"""
import torch


def compute_gae(next_value, rewards, masks, values, gamma=0.99, tau=0.95):
    values = values + [next_value]
    gae = 0
    returns = []
    for step in reversed(range(len(rewards))):
        delta = rewards[step] + gamma * values[step + 1] * masks[step] - values[step]
        gae = delta + gamma * tau * masks[step] * gae
        returns.insert(0, gae + values[step])
    return returns


def compute_returns(next_value, rewards, masks, gamma=0.99):
    R = next_value
    returns = []
    for step in reversed(range(len(rewards))):
        R = rewards[step] + gamma * R * masks[step]
        # new return should be located in front of all previous results.
        returns.insert(0, R)
    return returns


EXPECT = {
    "for step in reversed(range(len(rewards))):@1": ("vectorize.recurrence", "REWRITTEN", "exact"),
    "for step in reversed(range(len(rewards))):@2": ("vectorize.recurrence", "REWRITTEN", "reassociated"),
}


def run(ns, T, seed):
    g = torch.Generator().manual_seed(seed)
    N = 5
    w = torch.randn(3, 1, generator=g).requires_grad_()
    obs = torch.randn(T + 1, N, 3, generator=g)
    values = list((obs[:T] @ w).unbind(0))  # [N, 1] each, with grad, as model(state) gives
    next_value = obs[T] @ w
    rewards = [torch.randn(N, generator=g).unsqueeze(1) for _ in range(T)]
    masks = [(torch.rand(N, generator=g) > 0.1).float().unsqueeze(1) for _ in range(T)]
    gae = torch.cat(ns["compute_gae"](next_value, rewards, masks, values))
    ret = torch.cat(ns["compute_returns"](next_value, rewards, masks))
    grad = torch.autograd.grad((gae * 1.5).sum() + ret.sum(), w)[0]
    return gae, ret, grad
