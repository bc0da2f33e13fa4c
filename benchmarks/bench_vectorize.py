"""Benchmark: the loops vectorize.* rewrites, naive vs the code the transforms emit, with peers.

    python benchmarks/bench_vectorize.py [--quick] [--compile] [--device cpu|cuda] [--json PATH]

Single thread on CPU (OMP_NUM_THREADS=1, torch.set_num_threads(1)). Every "rewritten" row runs
the code the pipeline actually emits for the naive source (rewritten at start-up), so the
guards and the cache checks are in the timing.

* target update: soft update of a 26-256-256-1 MLP (72,961 parameters, six tensors), TD3's
  per-parameter loop vs the rewrite (exact: foreach sequence, and the compiled numba pass it
  switches to after 1000 calls; and with ``allow_lerp``), vs peers:
  ``torch._foreach_lerp_`` on lists cached by hand (no guard), SB3's ``polyak_update`` (its loop:
  ``mul_`` + ``torch.add(..., alpha=tau, out=)`` per tensor, parameter generators per call),
  and, with ``--compile``, ``torch.compile`` of the loop (compile time reported apart);
* reduction: REINFORCE's ``policy_loss.append(-log_prob * R)`` + ``torch.cat(...).sum()`` over
  T=100/1000/10000 log-probs of shape [1], forward only and forward+backward, vs the
  hand-vectorized ``-(torch.cat(log_probs) * returns).sum()``;
* elementwise: ``for i in range(n): out[i] = rewards[i] + gamma * values[i]`` with
  n=256/2048/16384, vs the hand-vectorized ``out[:] = rewards + gamma * values``.

With ``--compile``, ``torch.compile`` of each naive loop joins as a peer (at the smallest size
only for the reduction and elementwise loops: dynamo unrolls them, so compile time grows with
the trip count); compile time is reported apart. ``--quick`` runs one size per family.

Reported: median time per call over repeats and the ratio naive / method.
"""

import argparse
import copy
import json
import os
import sys
import textwrap
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

torch.set_num_threads(1)

import _timing  # noqa: E402  (benchmarks/_timing.py, beside this script)
from scalebox_cst.config import Config  # noqa: E402
from scalebox_cst.pipeline import Pipeline  # noqa: E402
from scalebox_cst.runtime import target_update as tu  # noqa: E402

DEVICE = "cpu"


def sync():
    _timing.sync(DEVICE)


def timeit(fn, number, repeat):
    """Median seconds per call over ``repeat`` samples of ``number`` calls."""
    return _timing.median_time(fn, number, repeat, DEVICE, warmup=max(3, number // 10))


def rewritten(src, name, **options):
    """Compile ``src`` through the vectorize.* transforms; return (naive fn, rewritten fn, sites)."""
    src = textwrap.dedent(src)
    cfg = Config(transforms=["vectorize.*"])
    for key, value in options.items():
        cfg.set_option("vectorize.target_update", key, value)
    result = Pipeline(cfg, backend=DEVICE).rewrite("bench.py", src.encode())
    assert result.report.error is None, result.report.error
    ns_a, ns_b = {}, {}
    exec(src, ns_a)
    exec(result.output.decode(), ns_b)
    sites = [s for s in result.report.sites if s.action == "rewritten"]
    assert sites, result.report.sites
    return ns_a[name], ns_b[name], sites


# ------------------------------------------------------------------ target update

SOFT = """\
def soft_update(net, target, tau):
    for param, target_param in zip(net.parameters(), target.parameters()):
        target_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)
"""


def polyak_update(params, target_params, tau):
    """stable_baselines3.common.utils.polyak_update (v2), with zip_strict's length check."""
    with torch.no_grad():
        params, target_params = list(params), list(target_params)
        if len(params) != len(target_params):
            raise ValueError("Iterables have different lengths")
        for param, target_param in zip(params, target_params):
            target_param.data.mul_(1 - tau)
            torch.add(target_param.data, param.data, alpha=tau, out=target_param.data)


def bench_target_update(args, rows):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(26, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)).to(DEVICE)
    target = copy.deepcopy(net)
    nparams = sum(p.numel() for p in net.parameters())
    naive, exact, sites = rewritten(SOFT, "soft_update")
    _, lerp, lerp_sites = rewritten(SOFT, "soft_update", allow_lerp=True)
    tau = 0.005
    ps = [p.data for p in net.parameters()]
    ts = [p.data for p in target.parameters()]
    number, repeat = (200, 5) if args.quick else (2000, 15)
    if DEVICE == "cuda":
        number //= 4
    def with_numba(after, fn):
        def run():
            tu.NUMBA_AFTER = after
            return fn()

        return run

    cases = [
        ("per-parameter loop (TD3/CleanRL)", lambda: naive(net, target, tau)),
        (f"rewritten, {sites[0].exactness}, foreach (until the switch pays)", with_numba(-1, lambda: exact(net, target, tau))),
    ]
    if DEVICE == "cpu" and tu._load_numba():
        tu.clear_cache()
        tu.NUMBA_AFTER = 0
        exact(net, target, tau)  # compile (or load from numba's cache) outside the timing
        cases.append((f"rewritten, {sites[0].exactness}, numba pass (later calls)", with_numba(0, lambda: exact(net, target, tau))))
    cases += [
        (f"rewritten, allow_lerp ({lerp_sites[0].exactness})", lambda: lerp(net, target, tau)),
        ("peer: _foreach_lerp_ on cached lists", lambda: torch._foreach_lerp_(ts, ps, tau)),
        ("peer: SB3 polyak_update", lambda: polyak_update(net.parameters(), target.parameters(), tau)),
    ]
    if args.compile:
        compiled = torch.compile(naive)
        t0 = time.perf_counter()
        compiled(net, target, tau)
        sync()
        compile_s = time.perf_counter() - t0
        cases.append((f"peer: torch.compile(loop) [compile {compile_s:.1f} s]", lambda: compiled(net, target, tau)))
    base = None
    title = f"soft update, MLP 26-256-256-1 ({nparams:,} params, {len(ps)} tensors), {DEVICE}"
    for label, fn in cases:
        t = timeit(fn, number, repeat)
        base = base or t
        rows.append({"case": title, "method": label, "us": t * 1e6, "speedup": base / t})
    # exactness check of the emitted code against the loop, on fresh copies, both CPU paths
    for after in (-1, 0):
        tu.NUMBA_AFTER = after
        t1, t2 = copy.deepcopy(target), copy.deepcopy(target)
        for _ in range(10):
            naive(net, t1, tau)
            exact(net, t2, tau)
        same = all(torch.equal(a, b) for a, b in zip(t1.parameters(), t2.parameters()))
        path = "foreach" if after < 0 else "numba/foreach"
        rows.append({"case": title, "method": f"check: rewritten ({path}) == loop, bitwise", "us": None, "speedup": None, "ok": same})
    tu.NUMBA_AFTER = None  # the default: auto


# ------------------------------------------------------------------ reduction

REINFORCE = """\
import torch
def policy_loss_of(log_probs, returns):
    policy_loss = []
    for log_prob, R in zip(log_probs, returns):
        policy_loss.append(-log_prob * R)
    policy_loss = torch.cat(policy_loss).sum()
    return policy_loss
"""


def reinforce_peer(log_probs, returns):
    """What a user vectorizing by hand writes."""
    return -(torch.cat(log_probs) * returns).sum()


def compiled_peer(args, fn, call):
    """``torch.compile`` of the naive loop (compile time reported apart), or None without --compile."""
    if not args.compile:
        return None
    compiled = torch.compile(fn)
    t0 = time.perf_counter()
    call(compiled)
    sync()
    return compiled, time.perf_counter() - t0


def bench_reduction(args, rows):
    naive, new, sites = rewritten(REINFORCE, "policy_loss_of")
    for T in ((1000,) if args.quick else (100, 1000, 10000)):
        torch.manual_seed(0)
        logits = torch.randn(T, 4, device=DEVICE, requires_grad=True)
        log_probs = list(torch.log_softmax(logits, -1)[:, :1].unbind(0))  # T tensors of shape [1]
        returns = torch.randn(T, device=DEVICE)
        number, repeat = (5, 5) if args.quick else (max(3, 30000 // T), 9)
        title = f"reduction: REINFORCE policy loss, T={T}, {DEVICE} ({sites[0].exactness})"

        def fwd_bwd(fn):
            def run():
                loss = fn(log_probs, returns)
                torch.autograd.grad(loss, logits, retain_graph=True)

            return run

        methods = [("loop + cat().sum()", naive), ("rewritten", new), ("peer: hand-vectorized -(cat * R).sum()", reinforce_peer)]
        if T <= 100:  # dynamo unrolls the loop: compile time grows with T
            got = compiled_peer(args, naive, lambda f: f(log_probs, returns))
            if got:
                methods.append((f"peer: torch.compile(loop) [compile {got[1]:.1f} s]", got[0]))
        fwd, both = [], []
        for label, fn in methods:
            fwd.append((label, timeit(lambda: fn(log_probs, returns), number, repeat)))
            both.append((label, timeit(fwd_bwd(fn), number, repeat)))
        with torch.no_grad():
            a, b = naive(log_probs, returns), new(log_probs, returns)
            rel = ((a - b).abs() / a.abs().clamp_min(1e-30)).item()
        for suffix, results in ((", forward", fwd), (", forward+backward", both)):
            for label, t in results:
                rows.append({"case": title + suffix, "method": label, "us": t * 1e6, "speedup": results[0][1] / t})
            if suffix == ", forward":
                rows.append({"case": title + suffix, "method": "check: |rewritten - loop| / |loop|", "us": None, "speedup": None, "ok": rel})


# ------------------------------------------------------------------ elementwise

ELEMENTWISE = """\
def bootstrap(rewards, values, out, gamma):
    for i in range(len(rewards)):
        out[i] = rewards[i] + gamma * values[i]
    return out
"""


def bench_elementwise(args, rows):
    naive, new, sites = rewritten(ELEMENTWISE, "bootstrap")
    for n in ((2048,) if args.quick else (256, 2048, 16384)):
        torch.manual_seed(0)
        rewards, values = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
        o1, o2, o3 = (torch.zeros(n, device=DEVICE) for _ in range(3))
        number, repeat = (5, 5) if args.quick else (max(3, 40000 // n), 9)
        title = f"elementwise: out[i] = r[i] + gamma * v[i], n={n}, {DEVICE} ({sites[0].exactness})"
        methods = [
            ("index loop", lambda: naive(rewards, values, o1, 0.99)),
            ("rewritten", lambda: new(rewards, values, o2, 0.99)),
            ("peer: hand-vectorized out[:] = r + gamma * v", lambda: o3.copy_(rewards + 0.99 * values)),
        ]
        if n <= 256:  # dynamo unrolls the loop: compile time grows with n
            o4 = torch.zeros(n, device=DEVICE)
            got = compiled_peer(args, naive, lambda f: f(rewards, values, o4, 0.99))
            if got:
                methods.append((f"peer: torch.compile(loop) [compile {got[1]:.1f} s]", lambda: got[0](rewards, values, o4, 0.99)))
        base = None
        for label, fn in methods:
            t = timeit(fn, number, repeat)
            base = base or t
            rows.append({"case": title, "method": label, "us": t * 1e6, "speedup": base / t})
        rows.append({"case": title, "method": "check: rewritten == loop, bitwise", "us": None, "speedup": None, "ok": bool(torch.equal(o1, o2))})


def main(argv=None):
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    parser.add_argument("--compile", action="store_true", help="add torch.compile of each naive loop as a peer")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    DEVICE = args.device
    rows = []
    bench_target_update(args, rows)
    bench_reduction(args, rows)
    bench_elementwise(args, rows)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {DEVICE}")
    case = None
    for r in rows:
        if r["case"] != case:
            case = r["case"]
            print(f"\n{case}")
        if r["us"] is None:
            print(f"  {r['method']:<52} {r['ok']}")
        else:
            print(f"  {r['method']:<52} {r['us']:>10.1f} us  {r['speedup']:>7.1f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
