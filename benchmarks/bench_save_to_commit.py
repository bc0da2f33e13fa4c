"""Save-to-commit latency: a save of a 300-line training file → a new run branch in the store.

Two figures per project shape, medians and p90 over repeated edits:
- ``commit``: ``Project.commit_change()`` alone (scan, hash, rewrite what changed, commit);
- ``watch``: a real save observed by the watcher (inotify + debounce) until the branch exists.
Shapes: the 300-line file alone, and with 99 other files of 100-300 lines (one file changed).
Target (issue 2): p50 ≤ 150 ms on a 2-core machine; 100 files ≤ 2× the single-file cost.

    python benchmarks/bench_save_to_commit.py [--edits 25]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "cartpole_ppo", "train.py")

EXTRA_FUNCTION = '''

def update_{i}(model, optimizer, batch, gamma=0.99):
    """Padding function {i}: a typical update step."""
    obs, actions, rewards, dones = batch
    values = model(obs).squeeze(-1)
    returns = torch.zeros_like(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running * (1.0 - dones[t])
        returns[t] = running
    loss = (returns - values).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
'''


def make_file(lines: int, seed: int = 0) -> str:
    with open(EXAMPLE, encoding="utf-8") as fh:
        text = fh.read()
    i = seed * 1000
    while text.count("\n") < lines:
        text += EXTRA_FUNCTION.format(i=i)
        i += 1
    return "\n".join(text.split("\n")[:lines]).rstrip() + "\n"


def make_project(root: str, n_files: int) -> str:
    os.makedirs(root, exist_ok=True)
    main = os.path.join(root, "train.py")
    with open(main, "w", encoding="utf-8") as fh:
        fh.write(make_file(300))
    for k in range(n_files - 1):
        pkg = os.path.join(root, "agents")
        os.makedirs(pkg, exist_ok=True)
        with open(os.path.join(pkg, f"mod_{k:03d}.py"), "w", encoding="utf-8") as fh:
            fh.write(make_file(100 + (k * 37) % 200, seed=k + 1))
    return main


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def bench_commit(root: str, main: str, edits: int):
    from scalebox_cst.project import Project

    Project.init(root)
    project = Project(root, backend="cpu")
    project.commit_change()  # first snapshot: everything parsed once
    times = []
    for k in range(edits):
        with open(main, "a", encoding="utf-8") as fh:
            fh.write(f"# edit {k}\n")
        t0 = time.perf_counter()
        result = project.commit_change()
        times.append(time.perf_counter() - t0)
        assert result.created, "each edit must make a branch"
    return times


def bench_watch(root: str, main: str, edits: int, debounce: float):
    from scalebox_cst.project import Project
    from scalebox_cst.watcher import Watcher

    Project.init(root)
    project = Project(root, backend="cpu")
    done = threading.Event()
    watcher = Watcher(project, debounce=debounce, echo=lambda msg: done.set() if msg.startswith("scalebox: run/") else None)
    watcher.start()
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            watcher.process_pending(timeout=0.05)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    times = []
    try:
        for k in range(edits):
            done.clear()
            time.sleep(0.1)
            tmp = main + ".tmp"
            with open(main, encoding="utf-8") as fh:
                text = fh.read()
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text + f"# watch edit {k}\n")
            t0 = time.perf_counter()
            os.replace(tmp, main)  # editor-style atomic save
            if not done.wait(10):
                raise RuntimeError("no branch within 10 s")
            times.append(time.perf_counter() - t0)
    finally:
        stop.set()
        thread.join()
        watcher.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--edits", type=int, default=25)
    parser.add_argument("--debounce", type=float, default=0.03)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n_files in (1, 100):
            for mode in ("commit", "watch"):
                root = os.path.join(tmp, f"{mode}_{n_files}")
                main_file = make_project(root, n_files)
                if mode == "commit":
                    times = bench_commit(root, main_file, args.edits)
                else:
                    times = bench_watch(root, main_file, args.edits, args.debounce)
                rows.append((mode, n_files, statistics.median(times), percentile(times, 0.9)))
    print(f"save-to-commit, 300-line file, {args.edits} edits each, debounce {args.debounce * 1e3:.0f} ms "
          f"(python {sys.version.split()[0]}, {os.cpu_count()} cpus)")
    print(f"{'mode':<8}{'files':>6}{'p50 ms':>10}{'p90 ms':>10}{'vs 1 file':>11}")
    base = {mode: p50 for mode, n, p50, _ in rows if n == 1}
    for mode, n, p50, p90 in rows:
        print(f"{mode:<8}{n:>6}{p50 * 1e3:>10.1f}{p90 * 1e3:>10.1f}{p50 / base[mode]:>10.2f}x")


if __name__ == "__main__":
    main()
