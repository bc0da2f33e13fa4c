"""Bundled examples: training wall time before and after rewriting, reward curve compared.

Each example is copied to a temporary project and committed twice: unchanged (branch run/0001)
and rewritten with the ``vectorize.*`` transforms (run/0002; every site exact, so the printed
numbers must not change). Both run through ``scalebox run``, so launcher costs are the same
on both sides and the rewrite's own costs (numba import, kernel cache load) are counted.
Runs alternate, ``--repeats`` times each; prints median [min-max] wall times, the ratio, whether
the two sets of runs are separated (every rewritten run faster than every original run: a gain
beyond this machine's noise) and whether every printed number is identical.

    python benchmarks/bench_examples.py [--repeats 3] [--quick]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUDGETS = {"cartpole_ppo": 60000, "pendulum_ddpg": 8000, "cuda_reinforce": 20000}
SPS = re.compile(r"\s*sps=\S+")


def numbers(stdout: str):
    from scalebox_cst.runner.execution import parse_metric_line

    return [SPS.sub("", line) for line in stdout.splitlines() if parse_metric_line(line)]


def timed(cmd, cwd, env):
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return elapsed, proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="quarter budgets")
    parser.add_argument("--only", nargs="*", default=sorted(BUDGETS))
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    scalebox = [sys.executable, "-c", "from scalebox_cst.cli import main; main()"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only:
            steps = BUDGETS[name] // (4 if args.quick else 1)
            project = os.path.join(tmp, name)
            shutil.copytree(os.path.join(ROOT, "examples", name), project)
            for transforms in ("none", "vectorize.*"):  # run/0001: as written; run/0002: rewritten
                rewrite = subprocess.run(
                    [*scalebox, "rewrite", ".", "--transform", transforms, "--backend", "cpu"],
                    cwd=project, env=env, capture_output=True, text=True, check=True,
                )
            sites = rewrite.stdout.count(" rewritten [")
            original, rewritten, same = [], [], True
            for _ in range(args.repeats):
                run = [*scalebox, "run"]
                t, out_a = timed([*run, "run/0001", "train.py", "--", "--total-steps", str(steps)], project, env)
                original.append(t)
                t, out_b = timed([*run, "run/0002", "train.py", "--", "--total-steps", str(steps)], project, env)
                rewritten.append(t)
                same = same and numbers(out_a) == numbers(out_b)
            rows.append((name, steps, sites, original, rewritten, same))
    print(f"bundled examples, vectorize.* rewrite, median [min-max] of {args.repeats} runs each "
          "(wall time of the whole process); 'separated': every rewritten run beat every original run")
    print(f"{'example':<16}{'steps':>7}{'sites':>6}{'original s':>20}{'rewritten s':>20}{'speed-up':>10}"
          "  separated  numbers identical")
    for name, steps, sites, a, b, same in rows:
        sep = "yes" if max(b) < min(a) else "no"
        print(f"{name:<16}{steps:>7}{sites:>6}{_spread(a):>20}{_spread(b):>20}"
              f"{statistics.median(a) / statistics.median(b):>9.2f}x  {sep:<9}  {'yes' if same else 'NO'}")


def _spread(xs) -> str:
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]"


if __name__ == "__main__":
    main()
