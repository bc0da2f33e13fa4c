"""Benchmark: the cost of the inserted gradient guard against the unguarded training step.

    python benchmarks/bench_stabilizer.py [--quick] [--json PATH]

Single thread on CPU, thread CPU time (``time.thread_time``: other processes on a shared machine
do not count, their cache pollution does). One model and optimizer per case for every variant
(per-variant models sit at other addresses: a bias of the size of the guard on a small model).
Rounds: one whole training step of each variant, in a shuffled order per round, each step timed
alone; reported per variant, as medians over the rounds:

* the step; against the unguarded step: the ratio of the medians, the median of the paired
  ratios (this round's step / this round's unguarded step) and of the extra microseconds;
* the call alone, timed inside the same steps between ``backward()`` and ``step()`` (where its
  code and data are cold), less the same timing around nothing.

Variants (the call between ``backward()`` and ``step()``):
``none`` the user's code; ``guard`` ``stabilizer.stabilize`` as inserted (the C helper when
built); ``guard-torch`` the same with the pure-torch fallback (what runs without the C helper);
``old`` ``runtime.clip.clip_grad_norm(max_norm=1.0)``, the previous default and now
``mode = "fixed"``; ``foreach`` a bare ``torch._foreach_norm`` of the gradients (the floor of a
torch-measured norm); ``one_op`` one ``torch.empty(())`` (the floor of any torch call there).

Cases:
* ``mlp-small``: 17-64-64-6 MLP, batch 64, Adam (a PPO-sized policy);
* ``mlp-256``: 17-256-256-6 MLP, batch 256, Adam (a SAC/TD3-sized network);
* ``sac``: CleanRL's SAC update at HalfCheetah sizes (obs 17, act 6, 256-256 actor and two
  critics, batch 256): three optimizers per step (critics, actor, entropy temperature), each
  guarded / clipped, as the transform inserts them.
Metrics go to a temporary metrics.jsonl, as in a recorded run (the guard's recording is in the cost).
"""
import argparse
import copy
import json
import os
import random
import statistics
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from scalebox_cst.runtime import clip, metrics, stabilizer  # noqa: E402

VARIANTS = ("none", "guard", "guard-torch", "old", "foreach", "one_op")
clock = time.thread_time_ns


_FAST = stabilizer._fast


def _path(variant):
    """guard-torch runs as an install without the C helper does (no C entry either)."""
    stabilizer._fast = None if variant == "guard-torch" else _FAST


def _torch_path(opt, site):
    """The guard of (opt, site) measured by torch (what runs where the C helper is not built)."""
    guard = stabilizer._known.get((id(opt), site))
    if guard is not None:
        guard.c_dtype = None  # as _c_refused leaves it; refresh() only recomputes it when the groups change


def calls_for(opt, site):
    """The call each variant makes between ``opt``'s backward() and step()."""
    params = [p for g in opt.param_groups for p in g["params"]]
    torch_site = site + "#torch"
    stabilizer.stabilize(opt, site=torch_site)  # makes the guard (not timed), then its path is set
    _torch_path(opt, torch_site)
    return {
        "none": lambda: None,
        "guard": lambda: stabilizer.stabilize(opt, site=site),
        "guard-torch": lambda: stabilizer.stabilize(opt, site=torch_site),
        "old": lambda: clip.clip_grad_norm(opt, max_norm=1.0),
        "foreach": lambda: torch._foreach_norm([p.grad for p in params if p.grad is not None], 2.0),
        "one_op": lambda: torch.empty(()),
    }


class Timed:
    """The variant's call, timed alone inside the step (the call's own cost where it runs)."""

    def __init__(self):
        self.call = None
        self.samples = []

    def __call__(self):
        t0 = clock()
        self.call()
        self.samples.append(clock() - t0)


def mlp(hidden, batch, seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(17, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 6))
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    x, y = torch.randn(batch, 17), torch.randn(batch, 6)
    slot = {"call": None}

    def step():
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        slot["call"]()
        opt.step()

    calls = calls_for(opt, "bench.py:1")

    def use(variant, timed):
        _path(variant)
        timed.call = calls[variant]
        slot["call"] = timed

    return step, use


def sac(seed=0, obs=17, act=6, batch=256):
    torch.manual_seed(seed)

    def net(i, o):
        return nn.Sequential(nn.Linear(i, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, o))

    actor, qf1, qf2 = net(obs, 2 * act), net(obs + act, 1), net(obs + act, 1)
    qf1_t, qf2_t = copy.deepcopy(qf1), copy.deepcopy(qf2)
    log_alpha = torch.zeros(1, requires_grad=True)
    q_opt = torch.optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=1e-3)
    a_opt = torch.optim.Adam(actor.parameters(), lr=3e-4)
    al_opt = torch.optim.Adam([log_alpha], lr=1e-3)
    o, a, r, o2, d = torch.randn(batch, obs), torch.randn(batch, act), torch.randn(batch, 1), torch.randn(batch, obs), torch.zeros(batch, 1)
    slot = {}

    def pi(x):
        mean, log_std = actor(x).chunk(2, -1)
        std = log_std.clamp(-5, 2).exp()
        u = mean + std * torch.randn_like(mean)
        logp = (-0.5 * ((u - mean) / std) ** 2 - std.log()).sum(-1, keepdim=True) - (2 * (0.6931 - u - nn.functional.softplus(-2 * u))).sum(-1, keepdim=True)
        return torch.tanh(u), logp

    def step():
        alpha = log_alpha.exp().item()
        with torch.no_grad():
            a2, logp2 = pi(o2)
            q_t = torch.min(qf1_t(torch.cat([o2, a2], 1)), qf2_t(torch.cat([o2, a2], 1))) - alpha * logp2
            target = r + 0.99 * (1 - d) * q_t
        q_loss = ((qf1(torch.cat([o, a], 1)) - target) ** 2).mean() + ((qf2(torch.cat([o, a], 1)) - target) ** 2).mean()
        q_opt.zero_grad()
        q_loss.backward()
        slot["q"]()
        q_opt.step()
        act_, logp = pi(o)
        qmin = torch.min(qf1(torch.cat([o, act_], 1)), qf2(torch.cat([o, act_], 1)))
        actor_loss = (alpha * logp - qmin).mean()
        a_opt.zero_grad()
        actor_loss.backward()
        slot["a"]()
        a_opt.step()
        with torch.no_grad():
            _, logp = pi(o)
        alpha_loss = (-log_alpha.exp() * (logp - act)).mean()
        al_opt.zero_grad()
        alpha_loss.backward()
        slot["al"]()
        al_opt.step()
        with torch.no_grad():
            for p, tp in zip(qf1.parameters(), qf1_t.parameters()):
                tp.data.mul_(0.995).add_(0.005 * p.data)
            for p, tp in zip(qf2.parameters(), qf2_t.parameters()):
                tp.data.mul_(0.995).add_(0.005 * p.data)

    calls = {k: calls_for(opt, site) for k, opt, site in (("q", q_opt, "sac.py:1"), ("a", a_opt, "sac.py:2"), ("al", al_opt, "sac.py:3"))}
    chained = {v: {k: _chain(calls[k][v], first=k == "q") for k in calls} for v in VARIANTS}

    def use(variant, timed):
        _path(variant)
        for k, call in chained[variant].items():  # the three calls of a step timed together
            call.timed = timed
            slot[k] = call

    return step, use


class _chain:
    """One of a step's several calls, timed into the same sample."""

    def __init__(self, call, first):
        self.call, self.first, self.timed = call, first, None

    def __call__(self):
        t0 = clock()
        self.call()
        dt = clock() - t0
        if self.first:
            self.timed.samples.append(dt)
        else:
            self.timed.samples[-1] += dt


def measure(make, steps, seed=0):
    """Single whole steps, one per variant per round in a shuffled order (drift and the load of
    a shared machine hit every variant alike; a variant's code is as cold as in a run where other
    work runs between its steps), the call inside each step timed too."""
    step, use = make()
    timed = {v: Timed() for v in VARIANTS}
    for v in VARIANTS:
        use(v, timed[v])
        for _ in range(20):
            step()
        timed[v].samples.clear()
    whole = {v: [] for v in VARIANTS}
    order, rng = list(VARIANTS), random.Random(seed)
    for _ in range(steps):
        rng.shuffle(order)
        for v in order:
            use(v, timed[v])
            t0 = clock()
            step()
            whole[v].append((clock() - t0) / 1e3)  # us
    base = whole["none"]
    empty = statistics.median(timed["none"].samples)
    out = {}
    for v, w in whole.items():
        out[v] = {
            "step_us": statistics.median(w),
            "ratio": statistics.median(w) / statistics.median(base),
            "paired_ratio": statistics.median(x / y for x, y in zip(w, base)),
            "extra_us": statistics.median(x - y for x, y in zip(w, base)),
            "call_us": (statistics.median(timed[v].samples) - empty) / 1e3,
        }
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="bench-stabilizer-")
    os.environ[metrics.ENV_FILE] = os.path.join(tmp, "metrics.jsonl")
    scale = 0.1 if args.quick else 1.0
    cases = {
        "mlp-small": (lambda: mlp(64, 64), int(4000 * scale)),
        "mlp-256": (lambda: mlp(256, 256), int(1500 * scale)),
        "sac": (sac, int(200 * scale)),
    }
    helper = "C helper built" if stabilizer._c is not None else "C helper NOT built: guard == guard-torch"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"torch {torch.__version__}, 1 thread, {os.cpu_count()} CPUs, load {load:.1f}; {helper}")
    print("median step (us) | vs unguarded: ratio of medians, median of paired ratios | median extra per step (us)"
          " | the call alone inside the step (us)")
    results = {"load_before": load, "c_helper": stabilizer._c is not None}
    for name, (make, steps) in cases.items():
        out = measure(make, steps)
        results[name] = out
        print(f"{name} ({steps} steps per variant)")
        for v, r in out.items():
            print(f"  {v:12s} {r['step_us']:9.1f}  {(r['ratio'] - 1) * 100:+6.2f}% {(r['paired_ratio'] - 1) * 100:+6.2f}%"
                  f"  {r['extra_us']:+8.1f}  {r['call_us']:8.1f}")
    results["load_after"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load after: {results['load_after']:.1f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return results


if __name__ == "__main__":
    main()
