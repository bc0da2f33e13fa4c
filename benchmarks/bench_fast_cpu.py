"""What ``--fast`` could change on CPU, per call: each idea against the code it would replace.

Process CPU time (``time.process_time``) per call, medians of ``--repeat`` samples, on a
CleanRL-sized agent (two 64-unit tanh MLPs, 4 inputs, 2 actions):

* distribution validation on/off (``Categorical(probs)``, ``Normal``): what a program-wide
  ``set_default_validate_args(False)`` would add where ``hot.distribution_args`` has not already;
* the ``Categorical`` chain (``sample`` + ``log_prob`` + ``entropy``): torch's class against
  ``runtime/fast_categorical.py`` (``accelerate.fast_categorical``), 1 and 64 rows;
* ``Adam.step`` and a whole update (forward + backward + step, 64 rows): the default for-loop,
  ``foreach=True``, ``fused=True`` (``accelerate.fused_optim``);
* intra-op threads: the update with ``torch.set_num_threads(1)`` against ``(N)`` (``--threads N``);
* ``--compile``: the update's forward+loss under ``torch.compile`` (inductor, default mode) on
  CPU: compile time once, then per call; the number of calls that pays the compile back.

    OMP_NUM_THREADS=1 python benchmarks/bench_fast_cpu.py [--repeat 7] [--threads 2] [--compile]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
from torch.distributions import Categorical, Normal

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from scalebox_cst.runtime.fast_categorical import Categorical as FastCategorical  # noqa: E402


def per_call_us(fn, number: int, repeat: int, warmup: int = 50) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.process_time()
        for _ in range(number):
            fn()
        samples.append((time.process_time() - t0) / number * 1e6)
    return statistics.median(samples)


def mlp(out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, out))


def distributions(repeat: int) -> None:
    probs = torch.softmax(torch.randn(1, 2), -1)
    mu, std = torch.randn(1, 1), torch.rand(1, 1) + 0.1
    for name, make in (("Categorical(probs) + sample + log_prob", lambda v: lambda: _cat_probs(probs, v)),
                       ("Normal(mu, std) + rsample + log_prob", lambda v: lambda: _normal(mu, std, v))):
        on, off = per_call_us(make(True), 2000, repeat), per_call_us(make(False), 2000, repeat)
        print(f"{name:<44} validate on {on:7.1f} us  off {off:7.1f} us  ({on / off:.2f}x)")
    for rows in (1, 64):
        logits = torch.randn(rows, 2, requires_grad=rows > 1)

        def chain(cls):
            def f():
                d = cls(logits=logits, validate_args=False)
                a = d.sample()
                d.log_prob(a)
                d.entropy()
            return f
        base, fast = per_call_us(chain(Categorical), 2000, repeat), per_call_us(chain(FastCategorical), 2000, repeat)
        print(f"Categorical(logits) chain, {rows:>2} rows {'':<16} torch {base:7.1f} us  fast_categorical {fast:7.1f} us  ({base / fast:.2f}x)")


def _cat_probs(probs, validate):
    d = Categorical(probs, validate_args=validate)
    d.log_prob(d.sample())


def _normal(mu, std, validate):
    d = Normal(mu, std, validate_args=validate)
    d.log_prob(d.rsample())


def _update(opt_kwargs):
    torch.manual_seed(0)
    actor, critic = mlp(2), mlp(1)
    params = [*actor.parameters(), *critic.parameters()]
    opt = torch.optim.Adam(params, lr=1e-3, eps=1e-5, **opt_kwargs)
    x = torch.randn(64, 4)

    def update():
        opt.zero_grad()
        (actor(x).pow(2).mean() + critic(x).mean()).backward()
        opt.step()
    return opt, params, update


def optimizers(repeat: int) -> None:
    for label, kw in (("for-loop (default on CPU)", {}), ("foreach=True", {"foreach": True}), ("fused=True", {"fused": True})):
        opt, params, update = _update(kw)
        for p in params:
            p.grad = torch.randn_like(p)
        step = per_call_us(opt.step, 1000, repeat)
        whole = per_call_us(update, 500, repeat)
        print(f"Adam {label:<28} step {step:7.1f} us  forward+backward+step {whole:7.1f} us")


def threads(repeat: int, n: int) -> None:
    _, _, update = _update({})
    out = {}
    for k in (1, n):
        torch.set_num_threads(k)
        out[k] = per_call_us(update, 500, repeat)
    torch.set_num_threads(1)
    print(f"update with 1 thread {out[1]:7.1f} us CPU, with {n} threads {out[n]:7.1f} us CPU ({out[1] / out[n]:.2f}x)")


def compiled(repeat: int) -> None:
    torch.manual_seed(0)
    actor, critic = mlp(2), mlp(1)
    x = torch.randn(64, 4)

    def loss_fn(x):
        return actor(x).pow(2).mean() + critic(x).mean()

    eager = per_call_us(lambda: loss_fn(x).backward(), 500, repeat)
    fn = torch.compile(loss_fn)
    t0 = time.process_time()
    fn(x).backward()
    cost = time.process_time() - t0
    fast = per_call_us(lambda: fn(x).backward(), 500, repeat)
    gain = eager - fast
    calls = f"{cost / (gain * 1e-6):,.0f} calls to pay it back" if gain > 0 else "never pays back"
    print(f"torch.compile forward+loss+backward: compile {cost:.2f} s CPU, eager {eager:.1f} us, compiled {fast:.1f} us: {calls}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true")
    opts = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    distributions(opts.repeat)
    optimizers(opts.repeat)
    threads(opts.repeat, opts.threads)
    if opts.compile:
        compiled(opts.repeat)


if __name__ == "__main__":
    main()
