"""REINFORCE with a learned baseline on CartPole-v1, written CUDA-first, with a modern MLP.

A migration demo for the device transforms: the policy trunk is a pre-norm SwiGLU block
(``nn.RMSNorm``, ``a, b = h.chunk(2, dim=-1)``, ``F.silu(a) * b``), the policy head normalises
with ``F.rms_norm`` and a learned weight, the value head uses ``nn.GELU()``. The script picks CUDA
from an argparse option, moves modules with ``.cuda()``, seeds CUDA, sets cuDNN flags, has an
optional AMP path (``torch.cuda.amp.autocast`` + ``torch.cuda.amp.GradScaler``), clips gradients,
and normalises returns in float64 on the host. Without CUDA it runs on the CPU.

Usage:
    python examples/cuda_migration_demo/train.py --total-steps 20000 --seed 0
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
    parser = argparse.ArgumentParser(description="CUDA-first REINFORCE with baseline (SwiGLU/RMSNorm MLP)")
    parser.add_argument("--total-steps", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", type=str, default="cuda", choices=["cpu", "cuda"],
                        help="cuda is used when available")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--amp", action="store_true", default=False)
    return parser.parse_args()


class SwiGLUBlock(nn.Module):
    """Pre-norm residual block: x + W_down(silu(a) * b), with a, b the halves of W_up(norm(x))."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.norm = nn.RMSNorm(dim, eps=1e-6)
        self.up = nn.Linear(dim, 2 * hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        h = self.up(self.norm(x))
        a, b = h.chunk(2, dim=-1)
        return x + self.down(F.silu(a) * b)


class ActorCritic(nn.Module):
    def __init__(self, obs_dim, n_actions, dim, hidden):
        super().__init__()
        self.embed = nn.Linear(obs_dim, dim)
        self.block = SwiGLUBlock(dim, hidden)
        self.head_weight = nn.Parameter(torch.ones(dim))
        self.pi = nn.Linear(dim, n_actions)
        self.v = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, 1))

    def forward(self, obs):
        z = self.block(F.gelu(self.embed(obs)))
        logits = self.pi(F.rms_norm(z, (z.shape[-1],), self.head_weight, 1e-5))
        return logits, self.v(z).squeeze(-1)


def main():
    args = parse_args()
    torch.set_num_threads(1)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.cuda.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = True

    device = torch.device(args.device if torch.cuda.is_available() else "cpu")
    use_cuda = device.type == "cuda"

    env = gym.make("CartPole-v1")
    env.action_space.seed(args.seed)
    model = ActorCritic(env.observation_space.shape[0], env.action_space.n, 32, args.hidden)
    if use_cuda:
        model = model.cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scaler = torch.cuda.amp.GradScaler(enabled=args.amp)

    global_step, episode = 0, 0
    recent = []
    start = time.time()
    obs, _ = env.reset(seed=args.seed)
    while global_step < args.total_steps:
        log_probs, values, rewards = [], [], []
        done = False
        while not done and global_step < args.total_steps:
            obs_t = torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0)
            with torch.cuda.amp.autocast(enabled=args.amp):
                logits, value = model(obs_t)
            dist = Categorical(logits=logits.float())
            action = dist.sample()
            log_probs.append(dist.log_prob(action))
            values.append(value.float())
            obs, reward, terminated, truncated, _ = env.step(action.item())
            rewards.append(reward)
            global_step += 1
            done = terminated or truncated
        if not done:
            break
        episode += 1
        recent.append(sum(rewards))
        obs, _ = env.reset()

        # discounted returns, normalised in float64 on the host
        returns, R = [], 0.0
        for r in reversed(rewards):
            R = r + args.gamma * R
            returns.insert(0, R)
        ret = torch.tensor(returns, dtype=torch.float64)
        ret = (ret - ret.mean()) / (ret.std(unbiased=False) + 1e-8)
        ret = ret.float().to(device)

        values_t = torch.cat(values)
        advantages = ret - values_t.detach()
        policy_loss = -(torch.cat(log_probs) * advantages).sum()
        value_loss = F.mse_loss(values_t, ret)
        loss = policy_loss + 0.5 * value_loss

        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        if use_cuda:
            torch.cuda.synchronize()

        print(f"step={global_step} episode={episode} return={recent[-1]:.1f} loss={loss.item():.5f} "
              f"grad_norm={grad_norm.item():.5f}", flush=True)
        if episode % 20 == 0:
            sps = int(global_step / max(time.time() - start, 1e-6))
            print(f"step={global_step} mean_return={np.mean(recent[-20:]):.2f} sps={sps}", flush=True)

    env.close()
    print(f"final_return={np.mean(recent[-10:]) if recent else float('nan'):.2f}", flush=True)


if __name__ == "__main__":
    main()
