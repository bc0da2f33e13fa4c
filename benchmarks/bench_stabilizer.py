"""Benchmark: the cost of the inserted gradient guard against the unguarded training step.

    python benchmarks/bench_stabilizer.py [--quick] [--json PATH]

Single thread on CPU. Each case is a whole training step (forward, backward, [guard], step)
timed in interleaved rounds (every variant once per round, so drift on a shared machine hits
all alike; the overhead is the median over rounds of variant/unguarded in the same round) in CPU
time of the thread (``time.thread_time``: other processes on a shared machine
do not count); reported: the median per step and the overhead against the unguarded step, and
the cost of the guard call alone (on the same gradients, repeated) as a share of that step.
Metrics go to a temporary metrics.jsonl, as in a recorded run (the JSON writing is in the cost).

Variants: ``none`` (the user's code), ``guard`` (``stabilizer.stabilize``, the default
insertion), ``old`` (``runtime.clip.clip_grad_norm`` at max_norm=1.0, the previous default and
now ``mode = "fixed"``), ``torch`` (``torch.nn.utils.clip_grad_norm_`` on ``model.parameters()``).

``in-step``: mlp-small once more with one shared model and optimizer (the per-variant models of
the rounds above sit at different addresses, a bias of the order of the guard itself on a small
model), the variant drawn per step, single steps timed; with ``one_op`` (one trivial torch call
in the guard's place) as the floor any guard that calls torch at that point pays.

Cases:
* ``mlp-small``: 17-64-64-6 MLP, batch 64, Adam (a PPO-sized policy);
* ``mlp-256``: 17-256-256-6 MLP, batch 256, Adam (a SAC/TD3-sized network);
* ``sac``: CleanRL's SAC update at HalfCheetah sizes (obs 17, act 6, 256-256 actor and two
  critics, batch 256): three optimizers per step (critics, actor, entropy temperature), each
  guarded / clipped, as the transform inserts them.
"""
import argparse
import copy
import json
import os
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

VARIANTS = ("none", "guard", "old", "torch")


def _guard(opt, params, site):
    return {
        "none": lambda: None,
        "guard": lambda: stabilizer.stabilize(opt, site=site),
        "old": lambda: clip.clip_grad_norm(opt, max_norm=1.0),
        "torch": lambda: torch.nn.utils.clip_grad_norm_(params, 1.0),
    }


def mlp(hidden, batch, variant, seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(17, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 6))
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    x, y = torch.randn(batch, 17), torch.randn(batch, 6)
    guard = _guard(opt, list(model.parameters()), "bench.py:1")[variant]

    def step():
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        guard()
        opt.step()

    return step


def sac(variant, seed=0, obs=17, act=6, batch=256):
    torch.manual_seed(seed)

    def net(i, o):
        return nn.Sequential(nn.Linear(i, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, o))

    actor, qf1, qf2 = net(obs, 2 * act), net(obs + act, 1), net(obs + act, 1)
    qf1_t, qf2_t = copy.deepcopy(qf1), copy.deepcopy(qf2)
    log_alpha = torch.zeros(1, requires_grad=True)
    q_opt = torch.optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=1e-3)
    a_opt = torch.optim.Adam(actor.parameters(), lr=3e-4)
    al_opt = torch.optim.Adam([log_alpha], lr=1e-3)
    g_q = _guard(q_opt, list(qf1.parameters()) + list(qf2.parameters()), "sac.py:1")[variant]
    g_a = _guard(a_opt, list(actor.parameters()), "sac.py:2")[variant]
    g_al = _guard(al_opt, [log_alpha], "sac.py:3")[variant]
    o, a, r, o2, d = torch.randn(batch, obs), torch.randn(batch, act), torch.randn(batch, 1), torch.randn(batch, obs), torch.zeros(batch, 1)

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
        g_q()
        q_opt.step()
        act_, logp = pi(o)
        qmin = torch.min(qf1(torch.cat([o, act_], 1)), qf2(torch.cat([o, act_], 1)))
        actor_loss = (alpha * logp - qmin).mean()
        a_opt.zero_grad()
        actor_loss.backward()
        g_a()
        a_opt.step()
        with torch.no_grad():
            _, logp = pi(o)
        alpha_loss = (-log_alpha.exp() * (logp - act)).mean()
        al_opt.zero_grad()
        alpha_loss.backward()
        g_al()
        al_opt.step()
        with torch.no_grad():
            for p, tp in zip(qf1.parameters(), qf1_t.parameters()):
                tp.data.mul_(0.995).add_(0.005 * p.data)
            for p, tp in zip(qf2.parameters(), qf2_t.parameters()):
                tp.data.mul_(0.995).add_(0.005 * p.data)

    return step


clock = time.thread_time


def measure(make, number, rounds):
    steps = {v: make(v) for v in VARIANTS}
    for fn in steps.values():
        for _ in range(max(3, number // 4)):
            fn()
    samples = {v: [] for v in VARIANTS}
    for _ in range(rounds):
        for v, fn in steps.items():
            t0 = clock()
            for _ in range(number):
                fn()
            samples[v].append((clock() - t0) / number)
    med = {v: statistics.median(s) for v, s in samples.items()}
    # paired: each round's variant against that round's unguarded step (drift cancels)
    paired = {v: statistics.median(a / b for a, b in zip(samples[v], samples["none"])) - 1.0 for v in VARIANTS}
    return med, paired


def in_step(steps_per_variant, seed=0):
    """mlp-small with ONE model and optimizer for all variants (no per-variant memory layout),
    the variant chosen per step in a shuffled round-robin, each step timed alone (thread CPU
    time). Returns per-variant quantiles (p25, median) of the step. ``one_op`` puts a single
    ``torch.empty(())`` where the guard goes: the floor of any torch call at that point of the step
    (after backward its code is cold; a norm of the gradients is several such calls)."""
    import random

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(17, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 6))
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    x, y = torch.randn(64, 17), torch.randn(64, 6)
    calls = {"none": lambda: None, "one_op": lambda: torch.empty(()),
             "guard": lambda: stabilizer.stabilize(opt, site="in_step.py:1")}

    def step(call):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        call()
        opt.step()

    for call in calls.values():
        for _ in range(30):
            step(call)
    samples = {v: [] for v in calls}
    order, rng = list(calls), random.Random(seed)
    for _ in range(steps_per_variant):
        rng.shuffle(order)
        for v in order:
            t0 = clock()
            step(calls[v])
            samples[v].append(clock() - t0)
    out = {}
    for v, s in samples.items():
        s.sort()
        out[v] = {"p25_s": s[len(s) // 4], "median_s": s[len(s) // 2]}
    return out


def guard_alone(number, rounds):
    """Seconds per call of each guard variant on a fixed set of gradients (mlp-small's)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(17, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 6))
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    ((model(torch.randn(64, 17)) - torch.randn(64, 6)) ** 2).mean().backward()
    saved = [p.grad.clone() for p in model.parameters()]
    calls = {v: f for v, f in _guard(opt, list(model.parameters()), "alone.py:1").items() if v != "none"}
    out = {}
    for v, fn in calls.items():
        samples = []
        for _ in range(rounds):
            for p, g in zip(model.parameters(), saved):
                p.grad.copy_(g)  # the clip variants scale the gradients: start each round alike
            t0 = clock()
            for _ in range(number):
                fn()
            samples.append((clock() - t0) / number)
        out[v] = statistics.median(samples)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="bench-stabilizer-")
    os.environ[metrics.ENV_FILE] = os.path.join(tmp, "metrics.jsonl")
    rounds = 5 if args.quick else 31
    cases = {
        "mlp-small": (lambda v: mlp(64, 64, v), 100),
        "mlp-256": (lambda v: mlp(256, 256, v), 40),
        "sac": (sac, 10),
    }
    results = {}
    print(f"torch {torch.__version__}, 1 thread, {rounds} interleaved rounds; median per training step")
    for name, (make, number) in cases.items():
        med, paired = measure(make, number, rounds)
        results[name] = {v: {"median_s": t, "overhead_paired": paired[v]} for v, t in med.items()}
        row = "  ".join(f"{v}={t * 1e6:8.1f}us ({paired[v] * 100:+5.1f}%)" for v, t in med.items())
        print(f"{name:10s} {row}")
    alone = guard_alone(200, rounds)
    base = results["mlp-small"]["none"]["median_s"]
    print("guard call alone (mlp-small's 6 gradient tensors): " + "  ".join(
        f"{v}={t * 1e6:.1f}us ({t / base * 100:.1f}% of the unguarded step)" for v, t in alone.items()))
    results["alone"] = {v: {"median_s": t, "share_of_mlp_small_step": t / base} for v, t in alone.items()}
    inner = in_step(300 if args.quick else 3000)
    b = inner["none"]
    print("in-step (mlp-small, one model, per-step shuffled round-robin; p25 / median of single steps): " + "  ".join(
        f"{v}={r['p25_s'] * 1e6:.1f}/{r['median_s'] * 1e6:.1f}us ({(r['p25_s'] / b['p25_s'] - 1) * 100:+.1f}%/"
        f"{(r['median_s'] / b['median_s'] - 1) * 100:+.1f}%)" for v, r in inner.items()))
    results["in_step"] = inner
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return results


if __name__ == "__main__":
    main()
