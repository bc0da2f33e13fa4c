"""TD3 author code (sfujimoto/TD3 lineage): tab-indented; critic and actor steps after their own
backward(), delayed policy update, then two soft-update loops
`target_param.data.copy_(self.tau * param.data + (1 - self.tau) * target_param.data)`.

Source: Kelym/TD3 (a fork of sfujimoto/TD3), TD3.py @ 30d1fd44be47f1b2983284034736273ca34521b2
(Actor, Critic, TD3.__init__, TD3.train). License: MIT (sfujimoto/TD3).
Adapted: the module-level `device` is CPU; save/load/select_action are left out; everything
else is verbatim, tabs included.
"""
import copy
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


device = torch.device("cpu")

class Actor(nn.Module):
	def __init__(self, state_dim, action_dim, min_action, max_action):
		super(Actor, self).__init__()

		self.l1 = nn.Linear(state_dim, 256)
		self.l2 = nn.Linear(256, 256)
		self.l3 = nn.Linear(256, action_dim)

		self.min_action = torch.Tensor(min_action).float()
		self.max_action = max_action
		self.half_range_action = torch.Tensor(max_action - min_action).float() / 2
		self.mid_action = torch.Tensor(max_action + min_action).float() / 2

	def to(self, device):
		super().to(device)
		self.min_action = self.min_action.to(device)
		self.half_range_action = self.half_range_action.to(device)
		self.mid_action = self.mid_action.to(device)
		return self

	def forward(self, state):
		a = F.relu(self.l1(state))
		a = F.relu(self.l2(a))
		return self.half_range_action * torch.tanh(self.l3(a)) + self.mid_action


class Critic(nn.Module):
	def __init__(self, state_dim, action_dim):
		super(Critic, self).__init__()

		# Q1 architecture
		self.l1 = nn.Linear(state_dim + action_dim, 256)
		self.l2 = nn.Linear(256, 256)
		self.l3 = nn.Linear(256, 1)

		# Q2 architecture
		self.l4 = nn.Linear(state_dim + action_dim, 256)
		self.l5 = nn.Linear(256, 256)
		self.l6 = nn.Linear(256, 1)


	def forward(self, state, action):
		sa = torch.cat([state, action], 1)

		q1 = F.relu(self.l1(sa))
		q1 = F.relu(self.l2(q1))
		q1 = self.l3(q1)

		q2 = F.relu(self.l4(sa))
		q2 = F.relu(self.l5(q2))
		q2 = self.l6(q2)
		return q1, q2


	def Q1(self, state, action):
		sa = torch.cat([state, action], 1)

		q1 = F.relu(self.l1(sa))
		q1 = F.relu(self.l2(q1))
		q1 = self.l3(q1)
		return q1


class TD3(object):
	def __init__(
		self,
		state_dim,
		action_dim,
		min_action,
		max_action,
		discount=0.99,
		tau=0.005,
		policy_noise=0.2,
		noise_clip=0.5,
		policy_freq=2,
		actor_lr=3e-4,
		critic_lr=3e-4,
	):

		self.actor = Actor(state_dim, action_dim, min_action, max_action).to(device)
		self.actor_target = copy.deepcopy(self.actor)
		self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=actor_lr)

		self.critic = Critic(state_dim, action_dim).to(device)
		self.critic_target = copy.deepcopy(self.critic)
		self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=critic_lr)

		self.min_action = torch.tensor(min_action, dtype=torch.float32, device=device)
		self.max_action = torch.tensor(max_action, dtype=torch.float32, device=device)
		self.discount = discount
		self.tau = tau
		self.policy_noise = torch.tensor(policy_noise, dtype=torch.float32, device=device)
		self.noise_clip = torch.tensor(noise_clip, dtype=torch.float32, device=device)
		self.policy_freq = policy_freq

		self.total_it = 0


	def train(self, replay_buffer, batch_size, summaryWriter):
		self.total_it += 1

		# Sample replay buffer 
		state, action, next_state, reward, not_done = replay_buffer.sample(batch_size)

		with torch.no_grad():
			# Select action according to policy and add clipped noise
			noise = (
				torch.randn_like(action) * self.policy_noise
			).clamp(-self.noise_clip, self.noise_clip)
			
			next_action = (
				self.actor_target(next_state) + noise
			).clamp(self.min_action, self.max_action)

			# Compute the target Q value
			target_Q1, target_Q2 = self.critic_target(next_state, next_action)
			target_Q = torch.min(target_Q1, target_Q2)
			target_Q = reward + not_done * self.discount * target_Q

		# Get current Q estimates
		current_Q1, current_Q2 = self.critic(state, action)

		# Compute critic loss
		critic_loss = F.mse_loss(current_Q1, target_Q) + F.mse_loss(current_Q2, target_Q)

		# Optimize the critic
		self.critic_optimizer.zero_grad()
		critic_loss.backward()
		self.critic_optimizer.step()

		summaryWriter.add_scalar("Train/CriticLoss", critic_loss.item(), self.total_it)
		summaryWriter.add_scalar("Train/CriticTarget", target_Q.mean(), self.total_it)

		# Delayed policy updates
		if self.total_it % self.policy_freq == 0:

			# Compute actor losse
			actor_loss = -self.critic.Q1(state, self.actor(state)).mean()
			
			# Optimize the actor 
			self.actor_optimizer.zero_grad()
			actor_loss.backward()
			self.actor_optimizer.step()

			# Update the frozen target models
			for param, target_param in zip(self.critic.parameters(), self.critic_target.parameters()):
				target_param.data.copy_(self.tau * param.data + (1 - self.tau) * target_param.data)

			for param, target_param in zip(self.actor.parameters(), self.actor_target.parameters()):
				target_param.data.copy_(self.tau * param.data + (1 - self.tau) * target_param.data)

			summaryWriter.add_scalar("Train/ActorLoss", actor_loss.item(), self.total_it)


EXPECT = {
    "self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=actor_lr)": ("device.optimizer", "REWRITTEN", "exact"),
    "self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=critic_lr)": ("device.optimizer", "REWRITTEN", "exact"),
    "self.critic_optimizer.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
    "self.actor_optimizer.step()": ("grad_clip", "REWRITTEN", "exact-until-intervention"),
    "for param, target_param in zip(self.critic.parameters(), self.critic_target.parameters()):": ("vectorize.target_update", "REWRITTEN", "exact"),
    "for param, target_param in zip(self.actor.parameters(), self.actor_target.parameters()):": ("vectorize.target_update", "REWRITTEN", "exact"),
}
LENGTHS = (1, 3)


class _Buffer:
    def __init__(self, seed, state_dim, action_dim):
        self.g = torch.Generator().manual_seed(seed)
        self.state_dim, self.action_dim = state_dim, action_dim

    def sample(self, batch_size):
        g = self.g
        return (
            torch.randn(batch_size, self.state_dim, generator=g),
            torch.rand(batch_size, self.action_dim, generator=g) * 2 - 1,
            torch.randn(batch_size, self.state_dim, generator=g),
            torch.randn(batch_size, 1, generator=g),
            (torch.rand(batch_size, 1, generator=g) > 0.05).float(),
        )


class _Writer:
    def __init__(self):
        self.values = []

    def add_scalar(self, tag, value, step):
        self.values.append((tag, float(value), step))


def run(ns, T, seed):
    torch.manual_seed(seed)
    state_dim, action_dim = 5, 2
    low, high = -np.ones(action_dim, dtype=np.float32), np.ones(action_dim, dtype=np.float32)
    agent = ns["TD3"](state_dim, action_dim, low, high)
    buf, writer = _Buffer(seed, state_dim, action_dim), _Writer()
    for _ in range(T + 1):  # T + 1 updates: the delayed policy update runs T // 2 + ... times
        agent.train(buf, 16, writer)
    nets = (agent.actor, agent.actor_target, agent.critic, agent.critic_target)
    return [[p.detach().clone() for p in n.parameters()] for n in nets], writer.values
