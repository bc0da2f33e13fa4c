"""precision.autocast on a SAC-size update step: fp32 (the user's code) against the rewrite (issue 24).

The update below (twin critics and a Gaussian actor, 256x256 MLPs, batch 256, HalfCheetah's 17/6
dims by default) is rewritten by the engine's own pipeline with ``precision.autocast`` for the
device's backend; both versions run on the same networks and batches. Prints the median time
per update step of each, their ratio (the seed system claims 1.8x on an accelerator) and the
relative difference of the critic loss after the timed steps (changes-semantics: close, not equal).

    python benchmarks/bench_precision.py                 # CPU, bf16 autocast (usually no gain)
    python benchmarks/bench_precision.py --device cuda   # on a GPU: the figure to report
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import median_time  # noqa: E402

UPDATE = """\
import torch
import torch.nn.functional as F


def update(nets, opts, batch, gamma=0.99, alpha=0.2):
    actor, q1, q2, q1_t, q2_t = nets
    actor_opt, critic_opt = opts
    obs, act, rew, nxt, done = batch
    with torch.no_grad():
        nxt_act, nxt_logp = actor(nxt)
        nxt_in = torch.cat([nxt, nxt_act], 1)
        min_q = torch.min(q1_t(nxt_in), q2_t(nxt_in)).squeeze(1) - alpha * nxt_logp
        target = rew + gamma * (1 - done) * min_q
    pair = torch.cat([obs, act], 1)
    critic_loss = F.mse_loss(q1(pair).squeeze(1), target) + F.mse_loss(q2(pair).squeeze(1), target)
    critic_opt.zero_grad()
    critic_loss.backward()
    critic_opt.step()
    pi, logp = actor(obs)
    pi_in = torch.cat([obs, pi], 1)
    actor_loss = (alpha * logp - torch.min(q1(pi_in), q2(pi_in)).squeeze(1)).mean()
    actor_opt.zero_grad()
    actor_loss.backward()
    actor_opt.step()
    return critic_loss.item()
"""


class Actor(torch.nn.Module):
    def __init__(self, obs_dim, act_dim, hidden):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(obs_dim, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU())
        self.mu, self.log_std = torch.nn.Linear(hidden, act_dim), torch.nn.Linear(hidden, act_dim)

    def forward(self, obs):
        h = self.body(obs)
        std = self.log_std(h).clamp(-5, 2).exp()
        u = self.mu(h) + std * torch.randn_like(std)
        a = torch.tanh(u)
        logp = (-0.5 * ((u - self.mu(h)) / std) ** 2 - std.log()).sum(1) - torch.log(1 - a.pow(2) + 1e-6).sum(1)
        return a, logp


def critic(in_dim, hidden):
    return torch.nn.Sequential(torch.nn.Linear(in_dim, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))


def make(obs_dim, act_dim, hidden, device):
    torch.manual_seed(0)
    actor, q1, q2 = Actor(obs_dim, act_dim, hidden), critic(obs_dim + act_dim, hidden), critic(obs_dim + act_dim, hidden)
    nets = [m.to(device) for m in (actor, q1, q2, copy.deepcopy(q1), copy.deepcopy(q2))]
    opts = (torch.optim.Adam(nets[0].parameters(), lr=3e-4), torch.optim.Adam([*nets[1].parameters(), *nets[2].parameters()], lr=3e-4))
    return nets, opts


def rewritten(device: str, mode: str) -> str:
    from scalebox_cst.config import Config
    from scalebox_cst.pipeline import Pipeline

    cfg = Config()
    cfg.transforms = ["precision.autocast"]
    cfg.set_option("precision", "mode", mode)
    result = Pipeline(cfg, device).rewrite("sac_update.py", UPDATE.encode())
    sites = [s for s in result.report.sites if s.action == "rewritten"]
    if len(sites) != 2:
        raise SystemExit(f"expected both losses' forwards rewritten, got {result.report.sites}")
    return result.output.decode()


def load(code: str):
    namespace: dict = {}
    exec(compile(code, "sac_update.py", "exec"), namespace)
    return namespace["update"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--obs", type=int, default=17)
    ap.add_argument("--act", type=int, default=6)
    ap.add_argument("--number", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    g = torch.Generator().manual_seed(1)
    batch = [t.to(args.device) for t in (
        torch.randn(args.batch, args.obs, generator=g), torch.rand(args.batch, args.act, generator=g) * 2 - 1,
        torch.randn(args.batch, generator=g), torch.randn(args.batch, args.obs, generator=g), torch.zeros(args.batch))]
    out = {"device": args.device, "batch": args.batch, "hidden": args.hidden, "dtype": "bfloat16",
           "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None}
    losses = {}
    for name, code in (("fp32", UPDATE), ("autocast", rewritten(args.device, "bf16"))):
        update = load(code)
        nets, opts = make(args.obs, args.act, args.hidden, args.device)
        out[f"{name}_ms"] = round(1e3 * median_time(lambda: update(nets, opts, batch), args.number, args.repeat, args.device), 4)
        torch.manual_seed(2)
        losses[name] = update(nets, opts, batch)
    out["speedup"] = round(out["fp32_ms"] / out["autocast_ms"], 3)
    out["critic_loss_rel_diff"] = round(abs(losses["autocast"] - losses["fp32"]) / max(abs(losses["fp32"]), 1e-12), 5)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{args.device} ({out['gpu'] or 'cpu'}): fp32 {out['fp32_ms']:.3f} ms/update, autocast bf16 {out['autocast_ms']:.3f} "
              f"ms/update, speedup {out['speedup']:.2f}x; critic loss rel. diff {out['critic_loss_rel_diff']:.2e}")


if __name__ == "__main__":
    main()
