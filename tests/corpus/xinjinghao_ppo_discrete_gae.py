"""PPO-Discrete-Pytorch (XinJingHao) GAE: zip(deltas[::-1], masks[::-1]) over flattened numpy
arrays, the previous output read back as adv[-1] from a list seeded with [0], adv.reverse() and
adv[0:-1] afterwards.

Source: XinJingHao/PPO-Discrete-Pytorch, PPO.py @ 19cab32d472915356ea932a03201eb849d6eac3c
(PPO.train, the block under "Use TD+GAE+LongTrajectory"). License: MIT.
Adapted: the block is wrapped in a function whose parameters are what it reads (self.critic
outputs vs / vs_, the batch tensors, gamma and lambd); the loop text is verbatim.
"""
import copy

import torch


def gae_block(r, vs, vs_, done_mask, dw_mask, gamma, lambd, device="cpu"):
    with torch.no_grad():
        '''dw(dead and win) for TD_target and Adv'''
        deltas = r + gamma * vs_ * (1 - dw_mask) - vs
        deltas = deltas.cpu().flatten().numpy()
        adv = [0]

        '''done for GAE'''
        for dlt, mask in zip(deltas[::-1], done_mask.cpu().flatten().numpy()[::-1]):
            advantage = dlt + gamma * lambd * adv[-1] * (1 - mask)
            adv.append(advantage)
        adv.reverse()
        adv = copy.deepcopy(adv[0:-1])
        adv = torch.tensor(adv).unsqueeze(1).float().to(device)
        td_target = adv + vs
    return adv, td_target


EXPECT = {
    "for dlt, mask in zip(deltas[::-1], done_mask.cpu().flatten().numpy()[::-1]):": ("vectorize.recurrence", "REWRITTEN", "reassociated"),
}
def run(ns, T, seed):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(T, 1, generator=g)
    vs = torch.randn(T, 1, generator=g)
    vs_ = torch.randn(T, 1, generator=g)
    done = (torch.rand(T, 1, generator=g) < 0.05).float()
    dw = (torch.rand(T, 1, generator=g) < 0.02).float()
    return ns["gae_block"](r, vs, vs_, done, dw, 0.99, 0.95)
