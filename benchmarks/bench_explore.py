"""scalebox explore: the engine's overhead per trial (rewrite + commit + start) against a plain
``python train.py`` of the same code.

Per trial the engine (1) finds the places again and writes the trial's values into the source,
(2) rewrites the edited file with the usual pipeline (a new blob each trial: no cache hit) and
commits source and rewrite on a new branch, (3) starts the run from the store
(``runtime.launch``: the commit served to the child, telemetry, recording) and waits for it.
A plain trial is ``python train.py`` with the same arguments. Two scripts:

- ``toy``: no imports beyond argparse, 10 printed steps: the run costs nothing, so the engine's
  total *is* its overhead;
- ``ppo``: examples/cartpole_ppo/train.py (239 lines, torch + gymnasium; 256 env steps): the
  rewrite of a real file and the start of a real run.

Figures: medians over ``--trials`` trials of wall time and CPU time (this process and its
children: ``resource.getrusage``), per step. Goal (issue 23): overhead under 1 s per trial.

    python benchmarks/bench_explore.py [--trials 5] [--quick]
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
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

TOY = """\
import argparse

LR = 0.5
parser = argparse.ArgumentParser()
parser.add_argument("--gamma", type=float, default=0.1)
args = parser.parse_args()
for step in range(10):
    print(f"step={step} score={-((LR - 0.3) ** 2 + (args.gamma - 0.7) ** 2):.6f}")
"""


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _measure(fn):
    w0, c0 = time.perf_counter(), _cpu()
    out = fn()
    return out, time.perf_counter() - w0, _cpu() - c0


def bench(name: str, source: str, params, args, trials: int, telemetry: bool):
    from scalebox_cst.explore.branches import commit_values, places_of, start_run
    from scalebox_cst.explore.places import resolve
    from scalebox_cst.project import Project

    os.environ["SCALEBOX_TELEMETRY"] = "1" if telemetry else "0"
    root = tempfile.mkdtemp(prefix=f"bench-explore-{name}-")
    try:
        with open(os.path.join(root, "train.py"), "w") as fh:
            fh.write(source)
        project, _ = Project.init(root)
        places = places_of(project.scan(), ["train.py"])
        bound = [resolve(key, places) for key, _ in params]
        plain, commit, start_run_, total = [], [], [], []
        for i in range(trials + 1):  # the first of each is a warm-up (imports, page cache)
            values = [(place, low + (high - low) * (i + 1) / (trials + 2)) for place, (_, (low, high)) in zip(bound, params)]
            _, pw, pc = _measure(lambda: subprocess.run([sys.executable, "train.py", *args], cwd=root, stdout=subprocess.DEVNULL,
                                                        stderr=subprocess.DEVNULL, check=True))
            (branch, commit_id, report), cw, cc = _measure(lambda: commit_values(project, values, f"bench, trial {i}", f"bench#{i}", "bench"))

            def go():
                execution = start_run(project, branch, commit_id, report.source_commit, "train.py", args, None, {"study": "bench", "trial": i},
                                      echo=open(os.devnull, "w"))
                record = execution.wait()
                assert record.status == "ok", record.error_tail
            _, rw, rc = _measure(go)
            if i:
                plain.append((pw, pc))
                commit.append((cw, cc))
                start_run_.append((rw, rc))
                total.append((cw + rw - pw, cc + rc - pc))
        med = lambda pairs, k: statistics.median(p[k] for p in pairs)  # noqa: E731
        print(f"{name:<4} telemetry {'on ' if telemetry else 'off'}  plain python train.py {med(plain, 0):6.3f}s wall {med(plain, 1):6.3f}s cpu | "
              f"rewrite+commit {med(commit, 0):6.3f}s wall {med(commit, 1):6.3f}s cpu | engine run {med(start_run_, 0):6.3f}s wall "
              f"{med(start_run_, 1):6.3f}s cpu | overhead per trial {med(total, 0):6.3f}s wall {med(total, 1):6.3f}s cpu")
        return med(total, 0), med(total, 1)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="the toy script only, 3 trials")
    opts = parser.parse_args()
    trials = 3 if opts.quick else opts.trials
    figures = []
    for telemetry in (True, False):
        figures.append(bench("toy", TOY, [("LR", (0.0, 1.0)), ("gamma", (0.0, 1.0))], [], trials, telemetry))
    if not opts.quick:
        with open(os.path.join(ROOT, "examples", "cartpole_ppo", "train.py")) as fh:
            ppo = fh.read()
        for telemetry in (True, False):
            figures.append(bench("ppo", ppo, [("lr", (1e-4, 1e-2)), ("gamma", (0.9, 0.999))],
                                 ["--total-steps", "256", "--update-epochs", "1"], trials, telemetry))
    print(f"worst median overhead per trial: {max(f[1] for f in figures):.3f}s cpu, {max(f[0] for f in figures):.3f}s wall "
          f"(goal < 1 s; wall above cpu is the machine's load: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
