"""REINFORCE on CartPole-v1, written "CUDA-first" the way many GPU users write it.

The script targets CUDA when available and silently falls back to CPU:
cuda seeding, cuDNN determinism flags, an optional AMP path (autocast +
torch.cuda.amp.GradScaler, off by default), tensors created directly on the
device, and an exact-GELU MLP policy. Discounted returns are computed with a
backward Python loop over a list of floats.

Usage:
    python examples/cuda_reinforce/train.py --total-steps 60000 --seed 0
    python examples/cuda_reinforce/train.py --total-steps 500     # quick smoke run
"""
import argparse
import random
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical


def parse_args():
    parser = argparse.ArgumentParser(description="CUDA-first REINFORCE on CartPole-v1")
    parser.add_argument("--total-steps", type=int, default=60000,
                        help="total number of environment steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", type=str, default="auto",
                        help="'auto' picks cuda when available, else cpu")
    parser.add_argument("--env-id", type=str, default="CartPole-v1")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--amp", action="store_true", default=False,
                        help="enable mixed precision (CUDA only)")
    parser.add_argument("--log-interval", type=int, default=10,
                        help="print a summary line every N episodes")
    return parser.parse_args()


class Policy(nn.Module):
    def __init__(self, obs_dim, n_actions, hidden):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, n_actions)

    def forward(self, x):
        x = F.gelu(self.fc1(x))
        x = F.gelu(self.fc2(x))
        return self.out(x)


def main():
    args = parse_args()
    torch.set_num_threads(1)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.cuda.manual_seed_all(args.seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.device != "auto":
        device = torch.device(args.device)

    env = gym.make(args.env_id)
    env.action_space.seed(args.seed)
    obs_dim = env.observation_space.shape[0]
    n_actions = env.action_space.n

    model = Policy(obs_dim, n_actions, args.hidden)
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scaler = torch.cuda.amp.GradScaler(enabled=args.amp)

    gamma = args.gamma
    episode_returns = []
    global_step = 0
    episode = 0
    loss_value = float("nan")
    start_time = time.time()

    obs, _ = env.reset(seed=args.seed)
    while global_step < args.total_steps:
        log_probs = []
        rewards = []
        done = False
        # run one episode (or until the step budget is spent)
        while not done and global_step < args.total_steps:
            state = torch.tensor(obs, dtype=torch.float32, device=device).unsqueeze(0)
            with torch.autocast("cuda", enabled=args.amp):
                logits = model(state)
            dist = Categorical(logits=logits.float())
            action = dist.sample()
            log_probs.append(dist.log_prob(action))
            obs, reward, terminated, truncated, _ = env.step(action.item())
            rewards.append(float(reward))
            global_step += 1
            done = terminated or truncated

        if not done:
            # budget ran out mid-episode: drop the partial episode
            break

        episode += 1
        ep_return = sum(rewards)
        episode_returns.append(ep_return)
        obs, _ = env.reset()

        # discounted returns, computed backwards over a Python list
        R = 0.0
        returns = []
        for r in reversed(rewards):
            R = r + gamma * R
            returns.insert(0, R)
        returns = torch.tensor(returns, dtype=torch.float32, device=device)
        if len(returns) > 1:
            returns = (returns - returns.mean()) / (returns.std() + 1e-8)
        else:
            returns = returns - returns.mean()

        log_probs_t = torch.cat(log_probs)
        loss = -(log_probs_t * returns).sum()

        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        loss_value = loss.item()

        print(f"step={global_step} episode={episode} episode_return={ep_return:.1f} "
              f"loss={loss_value:.4f}", flush=True)
        if episode % args.log_interval == 0:
            recent = episode_returns[-10:]
            sps = int(global_step / max(time.time() - start_time, 1e-6))
            print(f"step={global_step} episode={episode} "
                  f"mean_return={float(np.mean(recent)):.2f} sps={sps}", flush=True)

    env.close()
    recent = episode_returns[-10:]
    final_return = float(np.mean(recent)) if recent else float("nan")
    print(f"final_return={final_return:.2f}", flush=True)


if __name__ == "__main__":
    main()
