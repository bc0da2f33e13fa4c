"""CleanRL PPO: GAE and the plain discounted-return branch, backward recurrences over [T, N].

Source: vwxyzjn/cleanrl, cleanrl/ppo.py @ 2f4172eef96118b4d9d7111e1ecab1859a4b257c (the block
after the rollout). License: MIT.
Adapted: the module-level block is wrapped in a function whose parameters are the globals it
reads (indentation moved accordingly); the loop text is verbatim.
"""
from types import SimpleNamespace

import torch


def compute_advantages(args, agent, next_obs, next_done, rewards, dones, values, device):
    # bootstrap reward if not done. reached the batch limit
    with torch.no_grad():
        last_value = agent.get_value(next_obs.to(device)).reshape(1, -1)
        if args.gae:
            advantages = torch.zeros_like(rewards).to(device)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = last_value
                else:
                    nextnonterminal = 1.0 - dones[t+1]
                    nextvalues = values[t+1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values
        else:
            returns = torch.zeros_like(rewards).to(device)
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    nextnonterminal = 1.0 - next_done
                    next_return = last_value
                else:
                    nextnonterminal = 1.0 - dones[t+1]
                    next_return = returns[t+1]
                returns[t] = rewards[t] + args.gamma * nextnonterminal * next_return
            advantages = returns - values
    return advantages, returns


EXPECT = {
    "for t in reversed(range(args.num_steps)):@1": ("vectorize.recurrence", "REWRITTEN", "exact"),
    "for t in reversed(range(args.num_steps)):@2": ("vectorize.recurrence", "REWRITTEN", "exact"),
}


def run(ns, T, seed):
    g = torch.Generator().manual_seed(seed)
    N = 4
    rewards = torch.randn(T, N, generator=g)
    dones = (torch.rand(T, N, generator=g) < 0.1).float()
    values = torch.randn(T, N, generator=g)
    next_obs = torch.randn(N, 3, generator=g)
    next_done = (torch.rand(N, generator=g) < 0.3).float()
    agent = SimpleNamespace(get_value=lambda x: x.sum(-1, keepdim=True))
    fn = ns["compute_advantages"]
    gae = SimpleNamespace(gae=True, num_steps=T, gamma=0.99, gae_lambda=0.95)
    plain = SimpleNamespace(gae=False, num_steps=T, gamma=0.99, gae_lambda=0.95)
    return (
        fn(gae, agent, next_obs, next_done, rewards, dones, values, "cpu"),
        fn(plain, agent, next_obs, next_done, rewards, dones, values, "cpu"),
    )
