"""ikostrikov A2C_ACKTR.update: clips only when not ACKTR (`if self.acktr == False:
nn.utils.clip_grad_norm_(...)`) between backward() and step(), after an optional Fisher
backward(retain_graph=True): conditional clipping must not be doubled by an inserted clip.

Source: ikostrikov/pytorch-a2c-ppo-acktr-gail, a2c_ppo_acktr/algo/a2c_acktr.py @
4370cb975c7864540459b84ee0a1be352a206e26. License: MIT.
Adapted: `from a2c_ppo_acktr.algo.kfac import KFACOptimizer` is dropped (the project module is
not here; the test runs the A2C branch, where it is never called). Otherwise verbatim.
"""
import torch
import torch.nn as nn
import torch.optim as optim


class A2C_ACKTR():
    def __init__(self,
                 actor_critic,
                 value_loss_coef,
                 entropy_coef,
                 lr=None,
                 eps=None,
                 alpha=None,
                 max_grad_norm=None,
                 acktr=False):

        self.actor_critic = actor_critic
        self.acktr = acktr

        self.value_loss_coef = value_loss_coef
        self.entropy_coef = entropy_coef

        self.max_grad_norm = max_grad_norm

        if acktr:
            self.optimizer = KFACOptimizer(actor_critic)
        else:
            self.optimizer = optim.RMSprop(
                actor_critic.parameters(), lr, eps=eps, alpha=alpha)

    def update(self, rollouts):
        obs_shape = rollouts.obs.size()[2:]
        action_shape = rollouts.actions.size()[-1]
        num_steps, num_processes, _ = rollouts.rewards.size()

        values, action_log_probs, dist_entropy, _ = self.actor_critic.evaluate_actions(
            rollouts.obs[:-1].view(-1, *obs_shape),
            rollouts.recurrent_hidden_states[0].view(-1, self.actor_critic.recurrent_hidden_state_size),
            rollouts.masks[:-1].view(-1, 1),
            rollouts.actions.view(-1, action_shape))

        values = values.view(num_steps, num_processes, 1)
        action_log_probs = action_log_probs.view(num_steps, num_processes, 1)

        advantages = rollouts.returns[:-1] - values
        value_loss = advantages.pow(2).mean()

        action_loss = -(advantages.detach() * action_log_probs).mean()

        if self.acktr and self.optimizer.steps % self.optimizer.Ts == 0:
            # Sampled fisher, see Martens 2014
            self.actor_critic.zero_grad()
            pg_fisher_loss = -action_log_probs.mean()

            value_noise = torch.randn(values.size())
            if values.is_cuda:
                value_noise = value_noise.cuda()

            sample_values = values + value_noise
            vf_fisher_loss = -(values - sample_values.detach()).pow(2).mean()

            fisher_loss = pg_fisher_loss + vf_fisher_loss
            self.optimizer.acc_stats = True
            fisher_loss.backward(retain_graph=True)
            self.optimizer.acc_stats = False

        self.optimizer.zero_grad()
        (value_loss * self.value_loss_coef + action_loss -
         dist_entropy * self.entropy_coef).backward()

        if self.acktr == False:
            nn.utils.clip_grad_norm_(self.actor_critic.parameters(),
                                     self.max_grad_norm)

        self.optimizer.step()

        return value_loss.item(), action_loss.item(), dist_entropy.item()


EXPECT = {
    "self.optimizer.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
}
LENGTHS = (1, 5)


class _ActorCritic(torch.nn.Module):
    recurrent_hidden_state_size = 1

    def __init__(self):
        super().__init__()
        self.pi = torch.nn.Linear(4, 2)
        self.v = torch.nn.Linear(4, 1)

    def evaluate_actions(self, obs, rnn, masks, actions):
        dist = torch.distributions.Categorical(logits=self.pi(obs))
        return self.v(obs), dist.log_prob(actions[:, 0]).unsqueeze(-1), dist.entropy().mean(), rnn


def run(ns, T, seed):
    from types import SimpleNamespace
    torch.manual_seed(seed)
    ac = _ActorCritic()
    g = torch.Generator().manual_seed(seed)
    N = 3
    rollouts = SimpleNamespace(
        obs=torch.randn(T + 1, N, 4, generator=g), actions=torch.randint(0, 2, (T, N, 1), generator=g),
        rewards=torch.randn(T, N, 1, generator=g), recurrent_hidden_states=torch.zeros(T + 1, N, 1),
        masks=torch.ones(T + 1, N, 1), returns=torch.randn(T + 1, N, 1, generator=g))
    agent = ns["A2C_ACKTR"](ac, 0.5, 0.01, lr=7e-4, eps=1e-5, alpha=0.99, max_grad_norm=0.5)
    losses = agent.update(rollouts)
    return losses, [p.detach().clone() for p in ac.parameters()]
