"""accelerate.defer_sync on a CleanRL-shaped PPO update: per-minibatch ``.item()`` logging, eager vs deferred.

The update below (4 epochs x 8 minibatches of 64, a 64x64 actor-critic MLP, four numbers logged
per minibatch as CleanRL does: ``clipfracs += [...item()]`` and ``writer.add_scalar(...item())``)
is rewritten by the engine's own pipeline with ``accelerate.defer_sync``; both versions run the
same networks and batches. Prints the median time of one update (wall on CUDA, synchronised
at the end; process CPU time on CPU), the ratio, and whether the logged numbers are bitwise
equal. On CPU a ``.item()`` is no device sync: the runtime reads CPU tensors at once by
default (``read-at-once`` row: the wrapper's overhead only); ``deferred`` forces the deferral
path (a copy per number, one ``tolist`` per loop) to show its cost where there is nothing to gain.

    python benchmarks/bench_defer_sync.py                 # CPU
    python benchmarks/bench_defer_sync.py --device cuda   # on a GPU: the figure to report
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

UPDATE = """\
import torch
from tensorboardX import SummaryWriter

writer = SummaryWriter("runs/bench")


def update(agent, optimizer, obs, actions, advantages, returns, old_logprob, global_step, epochs=4, mb=64):
    n = obs.shape[0]
    clipfracs = []
    for epoch in range(epochs):
        for start in range(0, n, mb):
            idx = slice(start, start + mb)
            logits, value = agent(obs[idx])
            logprob = torch.log_softmax(logits, -1).gather(1, actions[idx, None]).squeeze(1)
            ratio = (logprob - old_logprob[idx]).exp()
            pg_loss = torch.max(-advantages[idx] * ratio, -advantages[idx] * ratio.clamp(0.8, 1.2)).mean()
            v_loss = 0.5 * (value.squeeze(1) - returns[idx]).pow(2).mean()
            loss = pg_loss + 0.5 * v_loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            clipfracs += [((ratio - 1.0).abs() > 0.2).float().mean().item()]
            writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
            writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
            writer.add_scalar("losses/approx_kl", ((ratio - 1) - ratio.log()).mean().item(), global_step)
    return clipfracs


for _ in range(0):
    update(None, None, None, None, None, None, None, 0)
"""


class Agent(torch.nn.Module):
    def __init__(self, obs_dim=8, n_actions=4, hidden=64):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(obs_dim, hidden), torch.nn.Tanh(),
                                        torch.nn.Linear(hidden, hidden), torch.nn.Tanh())
        self.pi = torch.nn.Linear(hidden, n_actions)
        self.v = torch.nn.Linear(hidden, 1)

    def forward(self, x):
        h = self.body(x)
        return self.pi(h), self.v(h)


def load(code):
    fake = types.ModuleType("tensorboardX")

    class Writer:
        def __init__(self, *a, **k):
            self.log = []

        def add_scalar(self, tag, value, global_step=None, walltime=None):
            self.log.append((tag, value, global_step))  # the rewrite passes the step's walltime

    fake.SummaryWriter = Writer
    sys.modules["tensorboardX"] = fake
    ns = {"__name__": "bench"}
    exec(compile(code, "<update>", "exec"), ns)
    return ns["update"]


def per_number(dev, deferred, n=4000, repeat=7):
    """Seconds per logged number: ``xs.append(t.item())`` against the deferred call, loop alone."""
    t = torch.ones((), device=dev)
    out = {}

    def original():
        xs = []
        for _ in range(n):
            xs.append((t * 2).item())
        return xs

    def rewritten():
        xs = []
        d = deferred.Deferred("bench")
        try:
            for _ in range(n):
                d.call(xs.append, d.item(t * 2))
        finally:
            d.flush()
        return xs

    clock = time.process_time if dev.type == "cpu" else time.perf_counter
    cases = [("original", original, False), ("read-at-once", rewritten, False), ("deferred", rewritten, True)]
    if dev.type != "cpu":
        cases.pop(1)
    samples = {name: [] for name, _, _ in cases}
    for _ in range(repeat):
        for name, fn, defer_cpu in cases:
            deferred.DEFER_ON_CPU = defer_cpu
            t0 = clock()
            assert fn() == [2.0] * n
            samples[name].append((clock() - t0) / n)
    return {name: statistics.median(v) for name, v in samples.items()}


def rewritten_code() -> str:
    from scalebox_cst.config import Config
    from scalebox_cst.pipeline import Pipeline

    cfg = Config(transforms=["accelerate.defer_sync"])
    cfg.set_option("accelerate", "level", "reassociated")
    result = Pipeline(cfg, backend="cuda").rewrite("update.py", UPDATE.encode())
    sites = [s for s in result.report.sites if s.action == "rewritten"]
    assert len(sites) == 4, [s.reason for s in result.report.sites]
    return result.output.decode()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from scalebox_cst.runtime import deferred

    dev = torch.device(args.device)
    torch.manual_seed(0)
    n = args.batch
    data = dict(obs=torch.randn(n, 8, device=dev), actions=torch.randint(0, 4, (n,), device=dev),
                advantages=torch.randn(n, device=dev), returns=torch.randn(n, device=dev),
                old_logprob=torch.full((n,), -1.386, device=dev))
    init = Agent().to(dev).state_dict()
    variants = {"original": (UPDATE, False), "rewrite, read-at-once": (rewritten_code(), False),
                "rewrite, deferred": (rewritten_code(), True)}
    if args.device != "cpu":
        variants.pop("rewrite, read-at-once")  # device tensors are always deferred
    clock = time.process_time if args.device == "cpu" else time.perf_counter
    fns = {name: (load(code), defer_cpu) for name, (code, defer_cpu) in variants.items()}
    samples = {name: [] for name in fns}
    logs = {}
    for i in range(args.repeat + 2):  # round robin: the machine's drift hits every variant alike
        for name, (fn, defer_cpu) in fns.items():
            deferred.DEFER_ON_CPU = defer_cpu
            log = fn.__globals__["writer"].log
            agent = Agent().to(dev)
            agent.load_state_dict(init)
            opt = torch.optim.Adam(agent.parameters(), lr=2.5e-4)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = clock()
            fracs = fn(agent, opt, global_step=i, **data)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if i >= 2:
                samples[name].append(clock() - t0)
            logs[name] = (repr(fracs), repr(log[-96:]))
    results = {name: statistics.median(v) for name, v in samples.items()}
    micro = per_number(dev, deferred)
    base = results["original"]
    same = all(v == logs["original"] for v in logs.values())
    rows = {k: {"seconds": round(v, 6), "speedup": round(base / v, 3)} for k, v in results.items()}
    if args.json:
        print(json.dumps({"device": args.device, "rows": rows, "bitwise_same_logs": same,
                          "per_number_us": {k: round(v * 1e6, 2) for k, v in micro.items()}}))
        return
    print(f"device={args.device} update=4 epochs x {n // 64} minibatches, 4 logged numbers each; "
          f"{'process CPU' if args.device == 'cpu' else 'wall'} time per update, median of {args.repeat}")
    for k, r in rows.items():
        print(f"  {k:24s} {r['seconds'] * 1e3:8.2f} ms   {r['speedup']:.3f}x")
    print(f"  logged numbers bitwise the same: {same}")
    print("per logged number, (t * 2).item() appended in a loop of 4000: " +
          ", ".join(f"{k} {v * 1e6:.2f} us" for k, v in micro.items()))


if __name__ == "__main__":
    main()
