"""Benchmark: GAE / linear recurrences, naive loops vs scalebox_cst.runtime.recurrence.

    python benchmarks/bench_recurrence.py [--quick] [--compile] [--sweep] [--no-cpu]
                                          [--rewrite-only] [--runs K]

CPU section (single thread): GAE advantages from (rewards, values, dones) with
gamma=0.99, lambda=0.95 at a few (T, N) sizes, computed by

* naive torch loop   -- the CleanRL-style backward Python loop (the baseline);
* numpy loop         -- the same loop on numpy arrays;
* linear_recurrence  -- vectorised deltas + one ``linear_recurrence`` call (the C
  extension where it was built, else numba);
* torch scan         -- the same with ``impl="scan"`` (pure torch, log-step);
* vec peer           -- TorchRL's ``vec_generalized_advantage_estimate`` when
  torchrl is importable, else a re-implementation of its approach
  (split the batch into trajectories at dones, pad, discounted sums by
  ``conv1d`` with a geometric filter);

median time per call over repeats, and the ratio naive / method.  The
``op only`` rows time just the recurrence call on precomputed (a, delta).
First-call time without the C extension is measured in fresh subprocesses: the
first calls run the exact numpy loop (numba is loaded only once that loop has
cost as much as loading it), then the numba load itself, with an empty and with
a warm cache.

Engine-rewrite section (T=2048, N=8, CPU): the CleanRL GAE function rewritten by the engine
(``vectorize.recurrence``), timed in K fresh processes each (``--runs``, medians printed): the
first call, the mean of the first 50 calls, then the steady state; the recurrence op's first call
on precomputed (a, delta) in a fresh process next to a plain compiled C loop (the extension's
kernel called directly, no Python around it), and the naive loop in the same run; ratios to the
naive loop and to the C loop; the steady state also of the rewrite where the body's temporaries
are live after the loop (module-level code: the one pass stops at t = 1, the last step runs as
written) and of the vectorized steps alone (the one-pass tier off: the rendering before it), and
as interleaved rounds (the load of a shared machine drifts). Done for the C-extension backends
and, with ``$SCALEBOX_RECURRENCE_C=0 $SCALEBOX_FUSED_C=0``, for the route a machine without a
compiler takes (the vectorized steps; the op: numpy, then numba).

GPU section (when CUDA is available): naive loop, torch scan, triton kernel
(time per call including launch, synchronised), effective bandwidth of the op;
``--compile`` adds ``torch.compile`` of the scan-based GAE (and of the naive loop
for T <= 128) with its compile time; ``--sweep`` times a grid of triton launch
configurations.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import textwrap
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from scalebox_cst.runtime import recurrence as R  # noqa: E402
from scalebox_cst.runtime.recurrence import backends as RB  # noqa: E402
from scalebox_cst.runtime.recurrence import kernels as RK  # noqa: E402
from scalebox_cst.runtime.recurrence import linear_recurrence  # noqa: E402

GAMMA, LAM = 0.99, 0.95
SIZES = [(128, 1), (2048, 8), (2048, 64), (512, 1024)]
GPU_SIZES = [(128, 1), (2048, 8), (2048, 64), (512, 1024), (2048, 16384)]


# ------------------------------------------------------------------ data


def make_data(T, N, device="cpu", dtype=torch.float32, p_done=0.01, seed=0):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, N, generator=g, dtype=dtype)
    values = torch.randn(T, N, generator=g, dtype=dtype)
    dones = (torch.rand(T, N, generator=g) < p_done).to(dtype)
    next_value = torch.randn(N, generator=g, dtype=dtype)
    next_done = torch.zeros(N, dtype=dtype)
    return [x.to(device) for x in (rewards, values, dones, next_value, next_done)]


# ------------------------------------------------------------------ GAE variants


def gae_naive(rewards, values, dones, next_value, next_done):
    """CleanRL's loop, verbatim in structure."""
    T = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(T)):
        if t == T - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + GAMMA * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + GAMMA * LAM * nextnonterminal * lastgaelam
    return advantages


def gae_numpy(rewards, values, dones, next_value, next_done):
    T = rewards.shape[0]
    advantages = np.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(T)):
        if t == T - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + GAMMA * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + GAMMA * LAM * nextnonterminal * lastgaelam
    return advantages


def gae_prelude(rewards, values, dones, next_value, next_done):
    """Vectorised per-step terms, computed exactly as the loop computes them."""
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done[None]])
    nextvalues = torch.cat([values[1:], next_value[None]])
    delta = rewards + GAMMA * nextvalues * nextnonterminal - values
    a = GAMMA * LAM * nextnonterminal
    return a, delta


def make_gae_op(impl):
    def gae(rewards, values, dones, next_value, next_done):
        a, delta = gae_prelude(rewards, values, dones, next_value, next_done)
        return linear_recurrence(a, delta, 0.0, impl=impl)

    return gae


try:  # the real TorchRL, when present
    from torchrl.objectives.value.functional import vec_generalized_advantage_estimate as _trl_vec_gae

    def gae_vec_peer(rewards, values, dones, next_value, next_done):
        # TorchRL layout: [*B, T, F]; done flags mark the end of a step
        nv = torch.cat([values[1:], next_value[None]])
        done = torch.cat([dones[1:], next_done[None]]).bool()
        adv, _ = _trl_vec_gae(GAMMA, LAM, values.T[..., None], nv.T[..., None],
                              rewards.T[..., None], done.T[..., None], done.T[..., None])
        return adv[..., 0].T

    VEC_PEER = "torchrl vec_gae"
except Exception:  # pragma: no cover - torchrl not installed here

    def gae_vec_peer(rewards, values, dones, next_value, next_done):
        """TorchRL's approach re-implemented: split at dones, pad, conv1d."""
        T, N = rewards.shape
        nnt = 1.0 - torch.cat([dones[1:], next_done[None]])
        nv = torch.cat([values[1:], next_value[None]])
        delta = rewards + GAMMA * nv * nnt - values
        # env-major flat sequence; a trajectory ends where nextnonterminal == 0
        d = delta.T.reshape(-1)
        ends = (nnt.T == 0).clone()
        ends[:, -1] = True
        ends = ends.reshape(-1).long()
        traj = torch.cumsum(ends, 0) - ends
        lengths = torch.bincount(traj)
        L = int(lengths.max())
        start = torch.cumsum(lengths, 0) - lengths
        pos = torch.arange(d.numel(), device=d.device) - start[traj]
        padded = torch.zeros(lengths.numel(), L, dtype=d.dtype, device=d.device)
        padded[traj, pos] = d
        filt = (GAMMA * LAM) ** torch.arange(L, dtype=d.dtype, device=d.device)
        x = torch.nn.functional.pad(padded[:, None, :], (0, L - 1))
        y = torch.nn.functional.conv1d(x, filt[None, None, :])[:, 0, :]
        return y[traj, pos].reshape(N, T).T

    VEC_PEER = "vec peer (split+pad+conv1d)"


# ------------------------------------------------------------------ timing


def bench(fn, args, repeat=7, min_time=0.2, sync=None):
    """Median seconds per call (timeit-style: autorange the number of calls)."""

    def run(n):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*args)
        if sync:
            sync()
        return time.perf_counter() - t0

    fn(*args)
    if sync:
        sync()
    n = 1
    while True:
        dt = run(n)
        if dt >= min_time or n >= 1_000_000:
            break
        n = max(n * 2, int(n * min_time / max(dt, 1e-9) * 1.1))
    times = [run(n) / n for _ in range(repeat)]
    return statistics.median(times)


def fmt_t(s):
    if s >= 1e-3:
        return "%8.2f ms" % (s * 1e3)
    return "%8.1f us" % (s * 1e6)


def print_table(title, rows, baseline_key):
    print("\n" + title)
    hdr = "%-11s  %-34s %12s %10s" % ("size", "method", "median", "x naive")
    print(hdr)
    print("-" * len(hdr))
    for size, entries in rows:
        base = dict(entries).get(baseline_key)
        for name, t in entries:
            ratio = ("%9.1fx" % (base / t)) if (base and t) else "        -"
            print("%-11s  %-34s %12s %10s" % (size, name, fmt_t(t) if t else "    skipped", ratio))


# ------------------------------------------------------------------ first call


FIRST_CALL = textwrap.dedent(
    """
    import time
    t0 = time.perf_counter()
    import torch
    from scalebox_cst.runtime.recurrence import linear_recurrence
    t1 = time.perf_counter()
    b = torch.randn(2048, 8); a = torch.rand(2048, 8)
    t2 = time.perf_counter()
    linear_recurrence(a, b)
    t3 = time.perf_counter()
    linear_recurrence(a, b)
    t4 = time.perf_counter()
    from scalebox_cst.runtime import recurrence as R
    R.backend_available("numba")  # what "auto" does once the numpy loop has cost this much
    linear_recurrence(a, b)  # the first numba call compiles or loads the kernel
    t5 = time.perf_counter()
    print("%.6f %.6f %.6f %.6f" % (t1 - t0, t3 - t2, t4 - t3, t5 - t4))
    """
)


def first_call_times():
    import tempfile

    res = {}
    with tempfile.TemporaryDirectory() as d:
        for label, env_extra in (("cold cache (compile)", {"NUMBA_CACHE_DIR": d}),
                                 ("warm cache (load)", {"NUMBA_CACHE_DIR": d})):
            env = dict(os.environ, SCALEBOX_RECURRENCE_C="0", **env_extra)  # the route without a compiler
            env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
            out = subprocess.run([sys.executable, "-c", FIRST_CALL], env=env,
                                 capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                res[label] = None
                print(out.stderr[-2000:])
                continue
            res[label] = [float(v) for v in out.stdout.split()]
    return res


# ------------------------------------------------------------------ the engine's rewrite, fresh processes

#: the GAE the engine rewrites (CleanRL's loop in a function, as in most training code)
GAE_SRC = textwrap.dedent(
    """
    import torch

    def gae(rewards, values, dones, next_value, next_done, gamma=0.99, gae_lambda=0.95):
        num_steps = rewards.shape[0]
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
        return advantages, advantages + values
    """
)

#: one fresh process: argv[1] = "gae" (the rewrite read from stdin: first call, first 50), "op"
#: (linear_recurrence's first call on precomputed a, delta, loading its kernel included; then its
#: steady state) or "c" (the plain C loop: the extension imported and its kernel called directly on
#: numpy views of the same a, delta, the import included; then its steady state); prints one
#: JSON line
FRESH = textwrap.dedent(
    """
    import json, statistics, sys, time
    t0 = time.perf_counter()
    import torch
    torch.set_num_threads(1)
    from scalebox_cst.runtime import recurrence as R
    t_import = time.perf_counter() - t0
    mode, src = sys.argv[1], sys.stdin.read()
    g = torch.Generator().manual_seed(0)
    T, N = 2048, 8
    rewards, values = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    dones = (torch.rand(T, N, generator=g) < 0.01).float()
    next_value, next_done = torch.randn(N, generator=g), torch.zeros(N)
    res = {"import": t_import}
    clock = time.perf_counter
    if mode == "gae":
        ns = {}
        exec(compile(src, "gae_rewritten", "exec"), ns)
        args = (rewards, values, dones, next_value, next_done)
        times = []
        for _ in range(int(sys.argv[2])):
            t = clock(); ns["gae"](*args); times.append(clock() - t)
        res.update(first=times[0], first50=sum(times) / len(times))
        res["backend"] = R.cpu_backend()
    else:
        nnt = 1.0 - torch.cat([dones[1:], next_done[None]])
        delta = rewards + 0.99 * torch.cat([values[1:], next_value[None]]) * nnt - values
        a = 0.99 * 0.95 * nnt

        def steady(fn):
            best = []
            for _ in range(7):
                t = clock()
                for _ in range(100):
                    fn()
                best.append((clock() - t) / 100)
            return statistics.median(best)

        if mode == "fused":  # the one-pass tier alone: its import, the program's compile, the call
            adv = torch.zeros_like(rewards)
            args = dict(dones=dones, next_done=next_done, values=values, next_value=next_value, rewards=rewards,
                        gamma=0.99, gae_lambda=0.95, advantages=adv, lastgaelam=0)
            t = clock()
            from scalebox_cst.runtime.fused import fused_linear, params_of
            vals = [args[n] for n in params_of(src)]
            assert fused_linear(src, T, *vals) is not None
            res["first"] = clock() - t
            res["backend"] = "fused"
            res["steady"] = steady(lambda: fused_linear(src, T, *vals))
        elif mode == "op":
            t = clock(); R.linear_recurrence(a, delta); res["first"] = clock() - t
            res["backend"] = R.cpu_backend()
            res["steady"] = steady(lambda: R.linear_recurrence(a, delta))
        else:
            import numpy as np
            an, bn, zn = a.numpy(), delta.numpy(), np.zeros(N, np.float32)
            on = np.empty((T, N), np.float32)
            t = clock()
            from scalebox_cst.runtime import _recurrence_c as C
            C.rec(an, bn, zn, on, True)
            res["first"] = clock() - t
            res["steady"] = steady(lambda: C.rec(an, bn, zn, on, True))
    print(json.dumps(res))
    """
)


def rewritten_gae(fold=True, one_pass=True):
    """The engine's rewrite of GAE_SRC (asserting the loop was rewritten, exactly); ``fold=False``:
    as where the body's temporaries are live after the loop (module-level code): the last step is
    kept as written; ``one_pass=False``: without the one-pass tier (runtime.fused_linear), the
    vectorized steps alone (the rendering before that tier, for comparison)."""
    from scalebox_cst.config import Config
    from scalebox_cst.pipeline import Pipeline
    from scalebox_cst.transforms.vectorize.recurrence import build as rbuild

    real, real_site = rbuild._foldable, rbuild.one_pass.site
    if not fold:
        rbuild._foldable = lambda *a: False
    if not one_pass:
        rbuild.one_pass.site = lambda *a: None
    try:
        res = Pipeline(Config(transforms=["vectorize.recurrence"]), backend="cpu").rewrite("gae.py", GAE_SRC.encode())
    finally:
        rbuild._foldable, rbuild.one_pass.site = real, real_site
    done = [x for x in res.report.sites if x.action == "rewritten"]
    assert done and done[0].exactness == "exact", [x.describe() for x in res.report.sites]
    return res.output.decode(), "last step folded in" in done[0].reason


def fresh(mode, src, env_extra, runs, calls=50):
    """Medians over ``runs`` fresh processes of each number FRESH prints."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **env_extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    # as a user's process starts: modules load from their cached bytecode (a shell with
    # $PYTHONDONTWRITEBYTECODE compiles every module of the package again, ~10 ms of a first call)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    got = []
    subprocess.run([sys.executable, "-c", FRESH, mode, "1"], input=src, env=env, capture_output=True,
                   text=True, timeout=600)  # writes the bytecode caches; not counted
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", FRESH, mode, str(calls)], input=src, env=env,
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            print(out.stderr[-2000:])
            return None
        got.append(__import__("json").loads(out.stdout.strip().splitlines()[-1]))
    keys = [k for k in got[0] if k != "backend"]
    med = {k: statistics.median(g[k] for g in got) for k in keys}
    med["backend"] = got[0].get("backend")
    return med


def rewrite_section(args):
    """The engine's rewrite of GAE at T=2048 N=8: fresh-process first calls and steady state, next
    to the naive loop and a plain C loop, medians and ratios (see the module docstring)."""
    src, folded = rewritten_gae()
    ns_orig, ns_new = {}, {}
    exec(compile(GAE_SRC, "gae", "exec"), ns_orig)
    exec(compile(src, "gae_rewritten", "exec"), ns_new)
    data = make_data(2048, 8)
    R.backend_available("numba")  # the steady state of every backend, loaded up front
    assert torch.equal(ns_orig["gae"](*data)[0], ns_new["gae"](*data)[0]), "rewrite not bitwise"
    variants = [("one pass, last step as written (temporaries live after the loop)", rewritten_gae(fold=False)[0]),
                ("vectorized steps only (one-pass tier off)", rewritten_gae(one_pass=False)[0])]
    others = []
    for label, text in variants:
        ns = {}
        exec(compile(text, label, "exec"), ns)
        assert torch.equal(ns_orig["gae"](*data)[0], ns["gae"](*data)[0]), label + ": not bitwise"
        others.append((label, ns["gae"]))
    repeat = 3 if args.quick else 7
    runs = args.runs
    t_naive = bench(ns_orig["gae"], data, repeat=repeat)
    t_steady = bench(ns_new["gae"], data, repeat=repeat)
    print("\n== engine rewrite of CleanRL GAE, T=2048 N=8 (one pass, last step %s; %d fresh processes, medians) =="
          % ("folded in" if folded else "as written", runs))
    print("steady state: naive loop %s, rewrite %s (%.0fx the naive loop)"
          % (fmt_t(t_naive), fmt_t(t_steady), t_naive / t_steady))
    for label, fn in others:
        t = bench(fn, data, repeat=repeat)
        print("  %s: %s (%.0fx)" % (label, fmt_t(t), t_naive / t))
    # the machine's load drifts between the runs above: ratios from interleaved rounds too
    ratios = [[] for _ in range(1 + len(others))]
    for _ in range(3 if args.quick else 7):
        tn = bench(ns_orig["gae"], data, repeat=1, min_time=0.05)
        for i, fn in enumerate([ns_new["gae"]] + [f for _, f in others]):
            ratios[i].append(tn / bench(fn, data, repeat=1, min_time=0.05))
    print("interleaved rounds (median ratio to the naive loop): rewrite %.0fx; %s"
          % (statistics.median(ratios[0]), "; ".join("%s %.0fx" % (label.split(" (")[0], statistics.median(r))
                                                    for (label, _), r in zip(others, ratios[1:]))))
    routes = [("C extension", {})]
    if R.backend_available("c"):
        routes.append(("no C extension (vectorized steps; numpy, then numba)", {"SCALEBOX_RECURRENCE_C": "0", "SCALEBOX_FUSED_C": "0"}))
    naive_first = fresh("gae", GAE_SRC, {}, runs, calls=1)
    if naive_first is not None:  # torch's first use of each op in a process costs 0.1-0.3 ms: both pay it
        print("naive loop, fresh process: first call %s" % fmt_t(naive_first["first"]))
    c_loop = fresh("c", "", {}, runs) if R.backend_available("c") else None
    if c_loop is not None:
        print("plain C loop (the extension's kernel called directly, a fresh process): first call %s "
              "(its import included), steady %s" % (fmt_t(c_loop["first"]), fmt_t(c_loop["steady"])))
    program = next((m.group(1) for m in [re.search(r"fused_linear\('([^']*)'", src)] if m), None)
    fz = fresh("fused", program, {}, runs) if program else None
    if fz is not None and c_loop is not None:
        print("one-pass op alone (fused_linear: its import, the program's compile, the call), fresh process: "
              "first call %s, steady %s -> %.1fx / %.1fx the C loop's first call / steady (it computes the "
              "deltas too)" % (fmt_t(fz["first"]), fmt_t(fz["steady"]), fz["first"] / c_loop["first"],
                               fz["steady"] / c_loop["steady"]))
    for label, env_extra in routes:
        g = fresh("gae", src, env_extra, runs)
        o = fresh("op", "", env_extra, runs)
        if g is None or o is None:
            continue
        print("  %s [backend after 50 calls: %s]" % (label, g["backend"]))
        t_nf = naive_first["first"] if naive_first else t_naive
        print("    rewrite, fresh process: first call %s (%.0fx the naive loop's first call), first 50 calls %s "
              "a call (%.0fx the naive loop's steady state)"
              % (fmt_t(g["first"]), t_nf / g["first"], fmt_t(g["first50"]), t_naive / g["first50"]))
        line = "    op alone (precomputed a, delta), fresh process: first call %s, steady %s" % (
            fmt_t(o["first"]), fmt_t(o["steady"]))
        if c_loop is not None:
            line += " -> %.1fx / %.1fx the C loop's first call / steady" % (
                o["first"] / c_loop["first"], o["steady"] / c_loop["steady"])
        print(line)


# ------------------------------------------------------------------ sections


def cpu_section(args):
    print("== CPU (torch %s, numpy %s, %d thread) ==" % (torch.__version__, np.__version__, torch.get_num_threads()))
    print("CPU kernels: C extension %s, numba %s; 'auto' uses: %s" % (
        R.backend_available("c"), R.backend_available("numba"), R.cpu_backend()))
    kernel = R.cpu_backend()
    rows, op_rows = [], []
    repeat = 3 if args.quick else 7
    for T, N in SIZES:
        data = make_data(T, N)
        np_data = [x.numpy() for x in data]
        ref = gae_naive(*data)
        out = make_gae_op("auto")(*data)
        exact = torch.equal(out, ref)
        entries = [("naive torch loop", bench(gae_naive, data, repeat=repeat))]
        entries.append(("numpy loop", bench(gae_numpy, np_data, repeat=repeat)))
        entries.append(("linear_recurrence (%s)%s" % (kernel, "" if exact else " NOT EXACT"),
                        bench(make_gae_op("auto"), data, repeat=repeat)))
        entries.append(("torch scan (impl='scan')", bench(make_gae_op("scan"), data, repeat=repeat)))
        peer_ok = torch.allclose(gae_vec_peer(*data), ref, rtol=1e-3, atol=1e-3)
        entries.append((VEC_PEER + ("" if peer_ok else " WRONG"), bench(gae_vec_peer, data, repeat=repeat)))
        if args.compile:
            entries += compile_entries(data, repeat)
        rows.append(("T=%d N=%d" % (T, N), entries))
        a, delta = gae_prelude(*data)
        op_rows.append(("T=%d N=%d" % (T, N), [
            ("naive recurrence loop", bench(lambda a, d: RK._run_loop(a, d, 0.0, True, tuple(d.shape[1:])),
                                            (a, delta), repeat=repeat)),
            ("linear_recurrence (%s)" % kernel, bench(linear_recurrence, (a, delta), repeat=repeat)),
            ("linear_recurrence impl='scan'", bench(lambda a, d: linear_recurrence(a, d, impl="scan"),
                                                    (a, delta), repeat=repeat)),
        ]))
    print_table("GAE advantages, CPU (bitwise-exact check vs naive: see method names)", rows, "naive torch loop")
    print_table("recurrence op only (a, delta precomputed), CPU", op_rows, "naive recurrence loop")
    if R.backend_available("numba"):
        fc = first_call_times()
        print("\nwithout the C extension, fresh process (T=2048 N=8): import / first and second call (exact numpy loop until it has"
              "\ncost as much as loading numba) / loading numba (paid once the numpy loop has cost as much)")
        for k, v in fc.items():
            if v:
                print("  %-22s import %s  first %s  second %s  numba load + first call %s"
                      % (k, fmt_t(v[0]), fmt_t(v[1]), fmt_t(v[2]), fmt_t(v[3])))


def compile_entries(data, repeat, sync=None):
    out = []
    T = data[0].shape[0]
    for name, fn in (("torch.compile(scan GAE)", make_gae_op("scan")),
                     ("torch.compile(naive loop)", gae_naive if T <= 128 else None)):
        if fn is None:
            continue
        try:
            torch._dynamo.reset()
            cf = torch.compile(fn)
            t0 = time.perf_counter()
            cf(*data)
            if sync:
                sync()
            print("  [%s T=%d N=%d] compile + first call: %.2f s" % (name, T, data[0].shape[1], time.perf_counter() - t0))
            out.append((name, bench(cf, data, repeat=repeat, sync=sync)))
        except Exception as exc:  # pragma: no cover
            print("  [%s] failed: %r" % (name, exc))
    return out


def gpu_section(args):
    dev = "cuda"
    sync = torch.cuda.synchronize
    print("\n== GPU: %s (torch %s) ==" % (torch.cuda.get_device_name(0), torch.version.cuda))
    print("triton backend available: %s" % R.backend_available("triton"))
    rows, op_rows = [], []
    repeat = 3 if args.quick else 7
    tiny = torch.randn(1, 1, device=dev)
    print("per-call floor: linear_recurrence(0.9, [1, 1] tensor) %s, torch.empty + add %s"
          % (fmt_t(bench(linear_recurrence, (0.9, tiny), repeat=repeat, sync=sync)),
             fmt_t(bench(lambda x: torch.empty_like(x).add_(x), (tiny,), repeat=repeat, sync=sync))))
    for T, N in GPU_SIZES:
        data = make_data(T, N, device=dev)
        entries = []
        ref = None
        if T * N <= 2048 * 1024:
            ref = gae_naive(*data)
            entries.append(("naive torch loop", bench(gae_naive, data, repeat=3, min_time=0.1, sync=sync)))
        else:
            ref = gae_naive(*[x.double() for x in data]).float()
            entries.append(("naive torch loop", None))
        for name, impl in (("linear_recurrence (triton)", "auto"), ("torch scan", "scan")):
            f = make_gae_op(impl)
            err = (f(*data) - ref).abs().max().item()
            entries.append(("%s err=%.1e" % (name, err), bench(f, data, repeat=repeat, sync=sync)))
        if args.compile:
            entries += compile_entries(data, repeat, sync=sync)
        rows.append(("T=%d N=%d" % (T, N), entries))
        a, delta = gae_prelude(*data)
        t_tri = bench(linear_recurrence, (a, delta), repeat=repeat, sync=sync)
        t_scan = bench(lambda a, d: linear_recurrence(a, d, impl="scan"), (a, delta), repeat=repeat, sync=sync)
        gbs = 3 * a.numel() * a.element_size() / t_tri / 1e9
        op_rows.append(("T=%d N=%d" % (T, N), [
            ("triton op (%.0f GB/s eff.)" % gbs, t_tri),
            ("torch scan op", t_scan),
        ]))
        if args.sweep and R.backend_available("triton") and (T, N) in ((2048, 8), (2048, 64), (2048, 16384)):
            sweep(a, delta, time.perf_counter() + args.sweep_budget / 3)
    print_table("GAE advantages, GPU (err = max abs diff vs naive loop)", rows, "naive torch loop")
    print_table("recurrence op only, GPU (time per call incl. launch)", op_rows, None)


def sweep_configs(M):
    from scalebox_cst.runtime._recurrence_triton import _next_pow2

    if M <= 16:
        bn = _next_pow2(M)
        for bt in (1024, 512, 256, 2048, 128):
            for nw in (4, 8, 2, 1):
                for st in (1, 2):
                    yield (bt, bn, nw, st)
    else:
        for bn in (32, 64, 16):
            for bt in (64, 32, 128, 16, 256):
                for nw in (4, 2, 8):
                    for st in (1, 2):
                        if bt * bn <= 16384:
                            yield (bt, bn, nw, st)


def sweep(a, delta, deadline):
    tri = RB._load_triton()
    T, M = delta.shape
    out = torch.empty_like(delta)
    res = []
    for cfg in sweep_configs(M):
        if time.perf_counter() > deadline:
            print("  (sweep stopped at its time budget)")
            break
        try:
            f = lambda: tri.launch(a, delta, 0.0, out, True, config=cfg)  # noqa: E731
            t = bench(f, (), repeat=3, min_time=0.03, sync=torch.cuda.synchronize)
            res.append((t, cfg))
        except Exception as exc:
            print("   config %s failed: %s" % (cfg, str(exc).splitlines()[0][:100]))
    res.sort()
    print("  sweep T=%d M=%d, default %s (%d configs); best:" % (T, M, tri.pick_config(T, M, 4), len(res)))
    for t, cfg in res[:5]:
        print("    %s  BLOCK_T=%d BLOCK_N=%d warps=%d stages=%d" % ((fmt_t(t),) + cfg))
    default = [t for t, c in res if c == tri.pick_config(T, M, 4)]
    if default:
        print("    default config: %s" % fmt_t(default[0]))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer repeats")
    p.add_argument("--compile", action="store_true", help="also time torch.compile (slow)")
    p.add_argument("--sweep", action="store_true", help="GPU: sweep triton launch configurations")
    p.add_argument("--sweep-budget", type=float, default=150.0, help="seconds for the whole sweep")
    p.add_argument("--no-cpu", action="store_true", help="skip the CPU section")
    p.add_argument("--rewrite-only", action="store_true", help="only the engine-rewrite section")
    p.add_argument("--runs", type=int, default=5, help="fresh processes per first-call figure")
    args = p.parse_args()
    if args.rewrite_only:
        rewrite_section(args)
        return
    if not args.no_cpu:
        cpu_section(args)
        rewrite_section(args)
    if torch.cuda.is_available():
        gpu_section(args)
    else:
        print("\n(no CUDA device: GPU section skipped)")


if __name__ == "__main__":
    main()
