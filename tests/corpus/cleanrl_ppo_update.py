"""CleanRL PPO minibatch update: already clips (`nn.utils.clip_grad_norm_(agent.parameters(),
args.max_grad_norm)` between backward() and step(): must not be clipped twice), early stop on KL.

Source: vwxyzjn/cleanrl, cleanrl/ppo.py @ 020cf0e53305793c8e39f4b68f9ac1ae9099f004 (the
`# Optimizing the policy and value network` block). License: MIT.
Adapted: the block is wrapped in a function whose parameters are the names it reads; the loop
text is verbatim.
"""
import numpy as np
import torch
import torch.nn as nn


def optimize(args, agent, optimizer, b_obs, b_logprobs, b_actions, b_advantages, b_returns, b_values):
        # Optimizing the policy and value network
        b_inds = np.arange(args.batch_size)
        clipfracs = []
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
                end = start + args.minibatch_size
                mb_inds = b_inds[start:end]

                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions.long()[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()

                with torch.no_grad():
                    # calculate approx_kl http://joschu.net/blog/kl-approx.html
                    old_approx_kl = (-logratio).mean()
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]

                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss
                newvalue = newvalue.view(-1)
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds],
                        -args.clip_coef,
                        args.clip_coef,
                    )
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss_max = torch.max(v_loss_unclipped, v_loss_clipped)
                    v_loss = 0.5 * v_loss_max.mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            if args.target_kl is not None:
                if approx_kl > args.target_kl:
                    break
        return clipfracs, v_loss.item(), pg_loss.item()


EXPECT = {
    "optimizer.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
}
LENGTHS = (1, 2)


class _Agent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.actor = torch.nn.Linear(4, 2)
        self.critic = torch.nn.Linear(4, 1)

    def get_action_and_value(self, x, action):
        probs = torch.distributions.Categorical(logits=self.actor(x))
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def run(ns, T, seed):
    from types import SimpleNamespace
    torch.manual_seed(seed)
    np.random.seed(seed)
    agent = _Agent()
    opt = torch.optim.SGD(agent.parameters(), lr=0.1)
    n = 64
    g = torch.Generator().manual_seed(seed)
    args = SimpleNamespace(batch_size=n, minibatch_size=16, update_epochs=T, clip_coef=0.2, norm_adv=True,
                           clip_vloss=True, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, target_kl=None)
    out = ns["optimize"](args, agent, opt, torch.randn(n, 4, generator=g), -torch.rand(n, generator=g),
                         torch.randint(0, 2, (n,), generator=g).float(), torch.randn(n, generator=g),
                         torch.randn(n, generator=g), torch.randn(n, generator=g))
    return out, [p.detach().clone() for p in agent.parameters()]
