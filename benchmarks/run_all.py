"""Run every benchmark in one go (`make bench`), each in its own process, one thread.

    python benchmarks/run_all.py [--quick]

``--quick`` passes each benchmark's own quick mode where it has one. GPU sections run where
CUDA is present.
"""
from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARKS = [
    ("bench_recurrence.py", []),
    ("bench_vectorize.py", ["--quick"]),
    ("bench_scatter.py", ["--quick"]),
    ("bench_save_to_commit.py", ["--edits", "10"]),
    ("bench_store.py", []),
    ("bench_import_hook.py", []),
    ("bench_examples.py", ["--quick"]),
    ("bench_engine_cost.py", ["--quick"]),
    ("bench_hot_patterns.py", ["--quick"]),
    ("bench_explore.py", ["--quick"]),
]


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    failed = []
    for script, quick_args in BENCHMARKS:
        print(f"\n=== {script} ===", flush=True)
        args = quick_args if quick else []
        if proc := subprocess.run([sys.executable, os.path.join(HERE, script), *args], env=env).returncode:
            failed.append(f"{script} (exit {proc})")
    if failed:
        print("\nfailed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
