"""foxyNN AC_lossfunc: the PyTorch actor-critic example's two loops as a free function: returns
by `for r in rewards[::-1]` with returns.insert(0, R), then a per-sample loss loop over
zip(actions, returns) with a pure temporary `advantage = R - value.item()` and two appends.

Source: janursa/foxyNN, foxyNN/lossfuncs.py (AC_lossfunc). Commit: not recorded by the index.
License: not recorded.
Adapted: none (function verbatim).
"""
import numpy as np
import torch
import torch.nn.functional as F
def AC_lossfunc(rewards,actions,gamma=None):
    """
    Calculates loss based on the actor and critic algorithm.
    """
    assert gamma != None
    R = 0
    policy_losses = [] # list to save actor (policy) loss
    value_losses = [] # list to save critic (value) loss
    returns = [] # list to save the true values

    # calculate the true value. The rewards in later time is more important than the initial ones 
    for r in rewards[::-1]:
        # calculate the discounted value
        R = r + gamma * R
        returns.insert(0, R)  
    returns = torch.tensor(returns)
    returns = (returns - returns.mean()) / (returns.std() + np.finfo(np.float32).eps.item())
    for (log_prob, value), R in zip(actions, returns):
        advantage = R - value.item()

        # calculate actor (policy) loss 
        policy_losses.append(-log_prob * advantage)

        # calculate critic (value) loss using L1 smooth loss
        value_losses.append(F.smooth_l1_loss(value, torch.tensor([R])))

    # sum up all the values of policy_losses and value_losses
    loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()
    return loss


EXPECT = {
    "for r in rewards[::-1]:": ("vectorize.recurrence", "REWRITTEN", "exact"),
    "for (log_prob, value), R in zip(actions, returns):": ("vectorize.reduction", "REWRITTEN", "reassociated"),
}


def run(ns, T, seed):
    torch.manual_seed(seed)
    net = torch.nn.Linear(4, 3)
    g = torch.Generator().manual_seed(seed)
    out = net(torch.randn(T, 4, generator=g))
    logp = torch.log_softmax(out[:, :2], -1)
    acts = torch.randint(0, 2, (T,), generator=g)
    actions = [(logp[t, acts[t]], out[t, 2:]) for t in range(T)]
    rewards = [float(x) for x in torch.rand(T, generator=g)]
    loss = ns["AC_lossfunc"](rewards, actions, gamma=0.99)
    return loss, torch.autograd.grad(loss, list(net.parameters()))
