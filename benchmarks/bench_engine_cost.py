"""Cost of the engine itself (issue 20 item 9): CPU seconds of whole process trees.

Two figures, each a median over ``--repeats`` runs, in CPU time (user + system of the process
and every child it waited for: ``resource.getrusage(RUSAGE_CHILDREN)`` before and after each
``subprocess.run``), which a loaded, shared machine disturbs far less than wall time:

1. ``scalebox run`` over plain ``python``: the bundled ``examples/cartpole_ppo/train.py`` (a short
   ``--total-steps``) run as ``python train.py``, as ``scalebox run --original`` (the same code,
   through the launcher, executor, metrics tailer and TensorBoard writer) and as ``scalebox run``
   (the rewrite), alternating. Printed: medians, the overhead over plain python in seconds and
   as a ratio. Goal: under 1 s CPU over plain python.
2. The commands that only read the store and the run records (``log``, ``diff``, ``compare``,
   ``status``) and the ones that write (``init`` in a fresh folder, ``rewrite``), each against
   ``python -c pass`` (interpreter start-up). Goal: readers under 0.5 s.

    python benchmarks/bench_engine_cost.py [--repeats 5] [--total-steps 3000] [--quick]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLE = os.path.join(ROOT, "examples", "cartpole_ppo")


def tree_cpu(cmd, cwd, env) -> float:
    """CPU seconds (user + sys) of ``cmd`` and every process under it; raises if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _scalebox(*args):
    return [sys.executable, "-c", "from scalebox_cst.cli import main; main()", *args]


def _median(samples):
    return statistics.median(samples), min(samples), max(samples)


def _show(label, samples, base=None):
    med, lo, hi = _median(samples)
    text = f"  {label:<28} {med:6.2f} s  [{lo:.2f}-{hi:.2f}]"
    if base is not None:
        text += f"  over base {med - base:+.2f} s ({med / base:.2f}x)" if base > 0 else ""
    print(text, flush=True)
    return med


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--total-steps", type=int, default=3000)
    parser.add_argument("--quick", action="store_true", help="3 repeats, 1000 steps")
    ns = parser.parse_args()
    if ns.quick:
        ns.repeats, ns.total_steps = 3, 1000
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    work = tempfile.mkdtemp(prefix="bench_engine_cost_")
    try:
        project = os.path.join(work, "proj")
        shutil.copytree(EXAMPLE, project)
        tree_cpu(_scalebox("init", "."), project, env)
        tree_cpu(_scalebox("rewrite", "."), project, env)
        script = ["train.py", "--", "--total-steps", str(ns.total_steps)]
        plain_cmd = [sys.executable, "train.py", "--total-steps", str(ns.total_steps)]
        sides = {"python train.py": [], "scalebox run --original": [], "scalebox run": []}
        for _ in range(ns.repeats):
            sides["python train.py"].append(tree_cpu(plain_cmd, project, env))
            sides["scalebox run --original"].append(tree_cpu(_scalebox("run", "--original", *script), project, env))
            sides["scalebox run"].append(tree_cpu(_scalebox("run", *script), project, env))
        print(f"1. run ({ns.total_steps} CartPole PPO steps), CPU of the process tree, median [min-max] of {ns.repeats}:")
        base = _show("python train.py", sides["python train.py"])
        _show("scalebox run --original", sides["scalebox run --original"], base)
        _show("scalebox run", sides["scalebox run"], base)

        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "scalebox log": _scalebox("log"),
            "scalebox diff": _scalebox("diff"),
            "scalebox compare": _scalebox("compare", "run/0001", "original"),
            "scalebox status": _scalebox("status"),
            "scalebox rewrite .": _scalebox("rewrite", "."),
        }
        samples = {name: [] for name in [*commands, "scalebox init"]}
        for i in range(ns.repeats):
            for name, cmd in commands.items():
                samples[name].append(tree_cpu(cmd, project, env))
            fresh = os.path.join(work, f"fresh{i}")
            os.makedirs(fresh)
            samples["scalebox init"].append(tree_cpu(_scalebox("init", "."), fresh, env))
        print(f"2. commands, CPU of the process tree, median [min-max] of {ns.repeats}:")
        base = _show("python -c pass", samples.pop("python -c pass"))
        for name, values in samples.items():
            _show(name, values, base)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
