"""TD3 (twin-critic DDPG) on Pendulum-v1, written the way many RL users write it.

Plain PyTorch + gymnasium + numpy. A numpy ring-buffer replay memory, actor and
critic MLPs, target networks updated with per-parameter Python soft-update
loops, and two optimizers (actor and critic).

Usage:
    python examples/pendulum_ddpg/train.py --total-steps 20000 --seed 0
"""
import argparse
import copy
import random
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def parse_args():
    parser = argparse.ArgumentParser(description="TD3/DDPG on Pendulum-v1")
    parser.add_argument("--total-steps", type=int, default=15000,
                        help="total number of environment steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", type=str, default="cpu")
    parser.add_argument("--env-id", type=str, default="Pendulum-v1")
    parser.add_argument("--buffer-size", type=int, default=100000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--learning-starts", type=int, default=1000)
    parser.add_argument("--actor-lr", type=float, default=1e-3)
    parser.add_argument("--critic-lr", type=float, default=1e-3)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--tau", type=float, default=0.005)
    parser.add_argument("--exploration-noise", type=float, default=0.1)
    parser.add_argument("--policy-noise", type=float, default=0.2)
    parser.add_argument("--noise-clip", type=float, default=0.5)
    parser.add_argument("--policy-freq", type=int, default=2)
    parser.add_argument("--log-interval", type=int, default=1000)
    return parser.parse_args()


class ReplayBuffer:
    def __init__(self, obs_dim, act_dim, size):
        self.obs = np.zeros((size, obs_dim), dtype=np.float32)
        self.next_obs = np.zeros((size, obs_dim), dtype=np.float32)
        self.actions = np.zeros((size, act_dim), dtype=np.float32)
        self.rewards = np.zeros((size, 1), dtype=np.float32)
        self.dones = np.zeros((size, 1), dtype=np.float32)
        self.size = size
        self.ptr = 0
        self.full = False

    def add(self, obs, next_obs, action, reward, done):
        self.obs[self.ptr] = obs
        self.next_obs[self.ptr] = next_obs
        self.actions[self.ptr] = action
        self.rewards[self.ptr] = reward
        self.dones[self.ptr] = done
        self.ptr += 1
        if self.ptr == self.size:
            self.ptr = 0
            self.full = True

    def __len__(self):
        return self.size if self.full else self.ptr

    def sample(self, batch_size, device):
        idx = np.random.randint(0, len(self), size=batch_size)
        return (
            torch.as_tensor(self.obs[idx], device=device),
            torch.as_tensor(self.actions[idx], device=device),
            torch.as_tensor(self.rewards[idx], device=device),
            torch.as_tensor(self.next_obs[idx], device=device),
            torch.as_tensor(self.dones[idx], device=device),
        )


class Actor(nn.Module):
    def __init__(self, obs_dim, act_dim, max_action):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc3 = nn.Linear(256, act_dim)
        self.max_action = max_action

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.max_action * torch.tanh(self.fc3(x))


class Critic(nn.Module):
    """Twin Q networks."""

    def __init__(self, obs_dim, act_dim):
        super().__init__()
        self.q1_fc1 = nn.Linear(obs_dim + act_dim, 256)
        self.q1_fc2 = nn.Linear(256, 256)
        self.q1_out = nn.Linear(256, 1)
        self.q2_fc1 = nn.Linear(obs_dim + act_dim, 256)
        self.q2_fc2 = nn.Linear(256, 256)
        self.q2_out = nn.Linear(256, 1)

    def forward(self, obs, action):
        sa = torch.cat([obs, action], 1)
        q1 = F.relu(self.q1_fc1(sa))
        q1 = F.relu(self.q1_fc2(q1))
        q1 = self.q1_out(q1)
        q2 = F.relu(self.q2_fc1(sa))
        q2 = F.relu(self.q2_fc2(q2))
        q2 = self.q2_out(q2)
        return q1, q2

    def q1(self, obs, action):
        sa = torch.cat([obs, action], 1)
        q1 = F.relu(self.q1_fc1(sa))
        q1 = F.relu(self.q1_fc2(q1))
        return self.q1_out(q1)


class TD3:
    def __init__(self, obs_dim, act_dim, max_action, args, device):
        self.device = device
        self.actor = Actor(obs_dim, act_dim, max_action).to(device)
        self.actor_target = copy.deepcopy(self.actor)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=args.actor_lr)

        self.critic = Critic(obs_dim, act_dim).to(device)
        self.critic_target = copy.deepcopy(self.critic)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=args.critic_lr)

        self.max_action = max_action
        self.gamma = args.gamma
        self.tau = args.tau
        self.policy_noise = args.policy_noise * max_action
        self.noise_clip = args.noise_clip * max_action
        self.policy_freq = args.policy_freq
        self.total_it = 0
        self.last_actor_loss = float("nan")

    def select_action(self, obs):
        with torch.no_grad():
            obs_t = torch.as_tensor(obs, dtype=torch.float32, device=self.device).unsqueeze(0)
            return self.actor(obs_t).cpu().numpy()[0]

    def soft_update(self):
        tau = self.tau
        for param, target_param in zip(self.critic.parameters(), self.critic_target.parameters()):
            target_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)
        for param, target_param in zip(self.actor.parameters(), self.actor_target.parameters()):
            target_param.data.mul_(1 - tau).add_(tau * param.data)

    def train(self, replay_buffer, batch_size):
        self.total_it += 1
        obs, action, reward, next_obs, done = replay_buffer.sample(batch_size, self.device)

        with torch.no_grad():
            noise = (torch.randn_like(action) * self.policy_noise).clamp(
                -self.noise_clip, self.noise_clip)
            next_action = (self.actor_target(next_obs) + noise).clamp(
                -self.max_action, self.max_action)
            target_q1, target_q2 = self.critic_target(next_obs, next_action)
            target_q = torch.min(target_q1, target_q2)
            target_q = reward + (1.0 - done) * self.gamma * target_q

        current_q1, current_q2 = self.critic(obs, action)
        critic_loss = F.mse_loss(current_q1, target_q) + F.mse_loss(current_q2, target_q)

        self.critic_optimizer.zero_grad()
        critic_loss.backward()
        self.critic_optimizer.step()

        if self.total_it % self.policy_freq == 0:
            actor_loss = -self.critic.q1(obs, self.actor(obs)).mean()

            self.actor_optimizer.zero_grad()
            actor_loss.backward()
            self.actor_optimizer.step()
            self.last_actor_loss = actor_loss.item()

            self.soft_update()

        return critic_loss.item(), self.last_actor_loss


def main():
    args = parse_args()
    torch.set_num_threads(1)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)

    env = gym.make(args.env_id)
    env.action_space.seed(args.seed)
    obs_dim = env.observation_space.shape[0]
    act_dim = env.action_space.shape[0]
    max_action = float(env.action_space.high[0])

    agent = TD3(obs_dim, act_dim, max_action, args, device)
    replay_buffer = ReplayBuffer(obs_dim, act_dim, args.buffer_size)

    episode_returns = []
    ep_return = 0.0
    ep_len = 0
    critic_loss = float("nan")
    actor_loss = float("nan")
    start_time = time.time()

    obs, _ = env.reset(seed=args.seed)
    for global_step in range(1, args.total_steps + 1):
        if global_step <= args.learning_starts:
            action = env.action_space.sample()
        else:
            action = agent.select_action(obs)
            action = action + np.random.normal(0, max_action * args.exploration_noise, size=act_dim)
            action = action.clip(-max_action, max_action).astype(np.float32)

        next_obs, reward, terminated, truncated, _ = env.step(action)
        # only true termination cuts bootstrapping (Pendulum only truncates)
        replay_buffer.add(obs, next_obs, action, reward, float(terminated))
        obs = next_obs
        ep_return += float(reward)
        ep_len += 1

        if global_step > args.learning_starts:
            critic_loss, actor_loss = agent.train(replay_buffer, args.batch_size)

        if terminated or truncated:
            episode_returns.append(ep_return)
            print(f"step={global_step} episode_return={ep_return:.2f} "
                  f"episode_length={ep_len}", flush=True)
            obs, _ = env.reset()
            ep_return = 0.0
            ep_len = 0

        if global_step % args.log_interval == 0:
            recent = episode_returns[-10:]
            mean_ret = float(np.mean(recent)) if recent else float("nan")
            sps = int(global_step / max(time.time() - start_time, 1e-6))
            print(f"step={global_step} mean_return={mean_ret:.2f} "
                  f"critic_loss={critic_loss:.4f} actor_loss={actor_loss:.4f} "
                  f"sps={sps}", flush=True)

    env.close()
    recent = episode_returns[-10:]
    final_return = float(np.mean(recent)) if recent else float("nan")
    print(f"final_return={final_return:.2f}", flush=True)


if __name__ == "__main__":
    main()
