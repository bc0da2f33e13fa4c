"""PyMARL build_td_lambda_targets: a backward recurrence through ret[:, t + 1] along dimension 1
of [B, T, A] tensors, walked by range(T - 2, -1, -1).

Source: oxwhirl/pymarl, src/utils/rl_utils.py @ eaf6b063822e2bdf1992d72dc159a500f235dbc4.
License: Apache-2.0.
Adapted: none (function verbatim).
"""
import torch as th


def build_td_lambda_targets(rewards, terminated, mask, target_qs, n_agents, gamma, td_lambda):
    # Assumes  <target_qs > in B*T*A and <reward >, <terminated >, <mask > in (at least) B*T-1*1
    # Initialise  last  lambda -return  for  not  terminated  episodes
    ret = target_qs.new_zeros(*target_qs.shape)
    ret[:, -1] = target_qs[:, -1] * (1 - th.sum(terminated, dim=1))
    # Backwards  recursive  update  of the "forward  view"
    for t in range(ret.shape[1] - 2, -1,  -1):
        ret[:, t] = td_lambda * gamma * ret[:, t + 1] + mask[:, t] \
                    * (rewards[:, t] + (1 - td_lambda) * gamma * target_qs[:, t + 1] * (1 - terminated[:, t]))
    # Returns lambda-return from t=0 to t=T-1, i.e. in B*T-1*A
    return ret[:, 0:-1]


EXPECT = {
    # exact: td_lambda * gamma * ret[:, t + 1] + b is the op's b + a * x (a sum of two terms commutes)
    "for t in range(ret.shape[1] - 2, -1,  -1):": ("vectorize.recurrence", "REWRITTEN", "exact"),
}


def run(ns, T, seed):
    g = th.Generator().manual_seed(seed)
    B, A = 3, 2
    Tm = T + 1  # target_qs has one more step than rewards
    rewards = th.randn(B, T, 1, generator=g)
    terminated = (th.rand(B, T, 1, generator=g) < 0.05).float()
    mask = (th.rand(B, T, 1, generator=g) > 0.1).float()
    target_qs = th.randn(B, Tm, A, generator=g)
    return ns["build_td_lambda_targets"](rewards, terminated, mask, target_qs, A, 0.99, 0.8)
