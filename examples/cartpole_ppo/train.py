"""PPO on CartPole-v1, written the way many RL users write it.

Plain PyTorch + gymnasium + numpy. Rollouts are stored in preallocated torch
tensors of shape [T]; advantages are computed with the classic CleanRL-style
backward GAE loop, and episode discounted returns are logged with a backward
loop over a Python list.

Usage:
    python examples/cartpole_ppo/train.py --total-steps 60000 --seed 0
"""
import argparse
import random
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributions import Categorical


def parse_args():
    parser = argparse.ArgumentParser(description="PPO on CartPole-v1")
    parser.add_argument("--total-steps", type=int, default=60000,
                        help="total number of environment steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", type=str, default="cpu")
    parser.add_argument("--env-id", type=str, default="CartPole-v1")
    parser.add_argument("--num-steps", type=int, default=256,
                        help="rollout length per update")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--gae-lambda", type=float, default=0.95)
    parser.add_argument("--update-epochs", type=int, default=10)
    parser.add_argument("--num-minibatches", type=int, default=4)
    parser.add_argument("--clip-coef", type=float, default=0.2)
    parser.add_argument("--ent-coef", type=float, default=0.0)
    parser.add_argument("--vf-coef", type=float, default=0.5)
    parser.add_argument("--log-interval", type=int, default=5,
                        help="print a progress line every N updates")
    return parser.parse_args()


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), std=0.01),
        )

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        logits = self.actor(x)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def discounted_returns(rews, gamma):
    R = 0
    returns = []
    for r in reversed(rews):
        R = r + gamma * R
        returns.insert(0, R)
    return returns


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
    n_actions = env.action_space.n

    agent = Agent(obs_dim, n_actions).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5)

    num_steps = args.num_steps
    gamma = args.gamma
    gae_lambda = args.gae_lambda
    minibatch_size = max(1, num_steps // args.num_minibatches)
    num_updates = args.total_steps // num_steps

    # rollout storage
    obs = torch.zeros((num_steps, obs_dim), device=device)
    actions = torch.zeros(num_steps, dtype=torch.long, device=device)
    logprobs = torch.zeros(num_steps, device=device)
    rewards = torch.zeros(num_steps, device=device)
    dones = torch.zeros(num_steps, device=device)
    values = torch.zeros(num_steps, device=device)

    episode_returns = []
    episode_rews = []
    ep_return = 0.0
    global_step = 0
    start_time = time.time()

    next_obs_np, _ = env.reset(seed=args.seed)
    next_obs = torch.tensor(next_obs_np, dtype=torch.float32, device=device)
    next_done = 0.0

    def run_env_step(action_int):
        nonlocal ep_return, next_obs_np
        o, r, terminated, truncated, _ = env.step(action_int)
        ep_return += r
        episode_rews.append(float(r))
        done = terminated or truncated
        if done:
            disc = discounted_returns(episode_rews, gamma)
            episode_returns.append(ep_return)
            print(f"step={global_step} episode_return={ep_return:.1f} "
                  f"episode_length={len(episode_rews)} "
                  f"episode_disc_return={disc[0]:.3f}", flush=True)
            ep_return = 0.0
            episode_rews.clear()
            o, _ = env.reset()
        return o, r, done

    if num_updates == 0:
        # budget smaller than one rollout: just act with the initial policy
        for _ in range(args.total_steps):
            global_step += 1
            with torch.no_grad():
                action, _, _, _ = agent.get_action_and_value(next_obs)
            next_obs_np, _, _ = run_env_step(int(action.item()))
            next_obs = torch.tensor(next_obs_np, dtype=torch.float32, device=device)

    for update in range(1, num_updates + 1):
        for step in range(num_steps):
            global_step += 1
            obs[step] = next_obs
            dones[step] = next_done

            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()[0]
            actions[step] = action
            logprobs[step] = logprob

            next_obs_np, reward, done = run_env_step(int(action.item()))
            rewards[step] = float(reward)
            next_obs = torch.tensor(next_obs_np, dtype=torch.float32, device=device)
            next_done = float(done)

        # bootstrap value and GAE
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1)[0]
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(num_steps)):
                if t == num_steps - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values

        # optimize policy and value network
        b_inds = np.arange(num_steps)
        clipfracs = []
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, num_steps, minibatch_size):
                end = start + minibatch_size
                mb_inds = torch.as_tensor(b_inds[start:end], device=device)

                _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                    obs[mb_inds], actions[mb_inds])
                logratio = newlogprob - logprobs[mb_inds]
                ratio = logratio.exp()

                with torch.no_grad():
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean().item())

                mb_advantages = advantages[mb_inds]
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                newvalue = newvalue.view(-1)
                v_loss = 0.5 * ((newvalue - returns[mb_inds]) ** 2).mean()
                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

        if update % args.log_interval == 0 or update == num_updates:
            recent = episode_returns[-10:]
            mean_ret = float(np.mean(recent)) if recent else float("nan")
            sps = int(global_step / max(time.time() - start_time, 1e-6))
            print(f"step={global_step} update={update} mean_return={mean_ret:.2f} "
                  f"loss={loss.item():.4f} pg_loss={pg_loss.item():.4f} "
                  f"v_loss={v_loss.item():.4f} entropy={entropy_loss.item():.4f} "
                  f"approx_kl={approx_kl.item():.5f} clipfrac={np.mean(clipfracs):.4f} "
                  f"sps={sps}", flush=True)

    env.close()
    recent = episode_returns[-10:]
    final_return = float(np.mean(recent)) if recent else float("nan")
    print(f"final_return={final_return:.2f}", flush=True)


if __name__ == "__main__":
    main()
