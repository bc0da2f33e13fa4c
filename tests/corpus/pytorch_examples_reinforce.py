"""PyTorch examples REINFORCE finish_episode: returns by deque.appendleft over rewards[::-1],
then policy_loss.append(-log_prob * R) and torch.cat(policy_loss).sum(); no gradient clipping.

Source: pytorch/examples, reinforcement_learning/reinforce.py @
2f5815e164db37800dbfac93fc3783233f7bef6b (finish_episode). License: BSD-3-Clause.
Adapted: the module globals finish_episode reads (policy, optimizer, args, eps) become
parameters; the body is verbatim.
"""
from collections import deque

import numpy as np
import torch


def finish_episode(policy, optimizer, args, eps):
    R = 0
    policy_loss = []
    returns = deque()
    for r in policy.rewards[::-1]:
        R = r + args.gamma * R
        returns.appendleft(R)
    returns = torch.tensor(returns)
    returns = (returns - returns.mean()) / (returns.std() + eps)
    for log_prob, R in zip(policy.saved_log_probs, returns):
        policy_loss.append(-log_prob * R)
    optimizer.zero_grad()
    policy_loss = torch.cat(policy_loss).sum()
    policy_loss.backward()
    optimizer.step()
    del policy.rewards[:]
    del policy.saved_log_probs[:]


EXPECT = {
    "for r in policy.rewards[::-1]:": ("vectorize.recurrence", "REWRITTEN", "exact"),
    "for log_prob, R in zip(policy.saved_log_probs, returns):": ("vectorize.reduction", "REWRITTEN", "reassociated"),
    "optimizer.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
}


def run(ns, T, seed):
    from types import SimpleNamespace
    torch.manual_seed(seed)
    net = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T, 1, 4, generator=g)
    acts = torch.randint(0, 2, (T, 1), generator=g)
    logp = torch.log_softmax(net(obs), -1)  # [T, 1, 2]
    saved = [logp[t, :, acts[t, 0]] for t in range(T)]  # each of shape [1], as Categorical.log_prob gives
    policy = SimpleNamespace(rewards=[float(x) for x in torch.rand(T, generator=g)], saved_log_probs=saved)
    eps = np.finfo(np.float32).eps.item()
    ns["finish_episode"](policy, opt, SimpleNamespace(gamma=0.99), eps)
    return [p.detach().clone() for p in net.parameters()], policy.rewards, policy.saved_log_probs
