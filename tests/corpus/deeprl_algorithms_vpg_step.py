"""DeepRL_Algorithms vpg_step: the critic loop adds `param.pow(2).sum() * l2_reg` per parameter (a
sum over tensors of different shapes: not an element-wise reduction, must stay) and steps without
clipping; the policy step already clips (must not be clipped twice).

Source: RITCHIEHuang/DeepRL_Algorithms, Algorithms/pytorch/VPG/vpg_step.py. Commit: not recorded
by the index. License: not recorded.
Adapted: none (verbatim).
"""
import torch
import torch.nn as nn


def vpg_step(policy_net, value_net, optimizer_policy, optimizer_value, optim_value_iternum, states, actions,
             returns, advantages, l2_reg):
    """update critic"""
    value_loss = None
    for _ in range(optim_value_iternum):
        values_pred = value_net(states)
        value_loss = nn.MSELoss()(values_pred, returns)
        # weight decay
        for param in value_net.parameters():
            value_loss += param.pow(2).sum() * l2_reg
        optimizer_value.zero_grad()
        value_loss.backward()
        optimizer_value.step()

    """update policy"""
    log_probs = policy_net.get_log_prob(states, actions)
    policy_loss = -(log_probs * advantages).mean()

    optimizer_policy.zero_grad()
    policy_loss.backward()
    torch.nn.utils.clip_grad_norm_(policy_net.parameters(), 40)
    optimizer_policy.step()

    return {"critic_loss": value_loss,
            "policy_loss": policy_loss
            }


EXPECT = {
    # the L2 penalty over the critic's parameters: one sum over them laid end to end (issue 20)
    "for param in value_net.parameters():": ("vectorize.reduction", "REWRITTEN", "reassociated"),
    "optimizer_value.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
    "optimizer_policy.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
}
LENGTHS = (1, 3)


def run(ns, T, seed):
    torch.manual_seed(seed)
    policy = nn.Linear(4, 2)
    policy.get_log_prob = lambda s, a: torch.log_softmax(policy(s), -1).gather(1, a)
    value = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(32, 4, generator=g)
    actions = torch.randint(0, 2, (32, 1), generator=g)
    returns = torch.randn(32, 1, generator=g)
    adv = torch.randn(32, 1, generator=g)
    out = ns["vpg_step"](policy, value, torch.optim.SGD(policy.parameters(), lr=0.1),
                         torch.optim.SGD(value.parameters(), lr=0.1), T, states, actions, returns, adv, 1e-3)
    return [p.detach().clone() for p in policy.parameters()], [p.detach().clone() for p in value.parameters()], out
