"""PyTorch examples actor-critic finish_episode: returns.insert(0, R) over rewards[::-1], then a
zip loop appending to two loss lists (one calls F.smooth_l1_loss), summed by torch.stack().sum().

Source: pytorch/examples, reinforcement_learning/actor_critic.py @
02d5761dfd12e36d9df6a2054820831e3d558712 (finish_episode). License: BSD-3-Clause.
Adapted: the module globals finish_episode reads (model, optimizer, args, eps) become
parameters; the body is verbatim.
"""
from collections import namedtuple

import torch
import torch.nn.functional as F

SavedAction = namedtuple('SavedAction', ['log_prob', 'value'])


def finish_episode(model, optimizer, args, eps):
    """
    Training code. Calculates actor and critic loss and performs backprop.
    """
    R = 0
    saved_actions = model.saved_actions
    policy_losses = [] # list to save actor (policy) loss
    value_losses = [] # list to save critic (value) loss
    returns = [] # list to save the true values

    # calculate the true value using rewards returned from the environment
    for r in model.rewards[::-1]:
        # calculate the discounted value
        R = r + args.gamma * R
        returns.insert(0, R)

    returns = torch.tensor(returns)
    returns = (returns - returns.mean()) / (returns.std() + eps)

    for (log_prob, value), R in zip(saved_actions, returns):
        advantage = R - value.item()

        # calculate actor (policy) loss 
        policy_losses.append(-log_prob * advantage)

        # calculate critic (value) loss using L1 smooth loss
        value_losses.append(F.smooth_l1_loss(value, torch.tensor([R])))

    # reset gradients
    optimizer.zero_grad()

    # sum up all the values of policy_losses and value_losses
    loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()

    # perform backprop
    loss.backward()
    optimizer.step()

    # reset rewards and action buffer
    del model.rewards[:]
    del model.saved_actions[:]


EXPECT = {
    "for r in model.rewards[::-1]:": ("vectorize.recurrence", "REWRITTEN", "exact"),
    "for (log_prob, value), R in zip(saved_actions, returns):": ("vectorize.reduction", "REWRITTEN", "reassociated"),
    "optimizer.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
}


def run(ns, T, seed):
    from types import SimpleNamespace
    torch.manual_seed(seed)
    net = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(seed)
    out = net(torch.randn(T, 4, generator=g))
    logp = torch.log_softmax(out[:, :2], -1)
    acts = torch.randint(0, 2, (T,), generator=g)
    saved = [ns["SavedAction"](logp[t, acts[t]], out[t, 2:]) for t in range(T)]
    model = SimpleNamespace(rewards=[float(x) for x in torch.rand(T, generator=g)], saved_actions=saved)
    ns["finish_episode"](model, opt, SimpleNamespace(gamma=0.99), 1e-7)
    return [p.detach().clone() for p in net.parameters()]
