"""Import-hook cost: a warm (cached) import of a 500-line module vs a plain cached import.

Each figure is the median over fresh interpreter processes of the time spent in the ``import``
statement alone (torch and the clip helper the rewrite imports are loaded before the clock
starts, in both cases). Target: warm / plain <= 1.5. The cold cost (pipeline + commit + cache
write) is reported beside it, once with an empty store and once with only the bytecode cache gone.

    python benchmarks/bench_import_hook.py [--runs 15]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PKG = "benchagents"

PRELUDE = "import time, torch, scalebox_cst.runtime.clip\n"
PLAIN = PRELUDE + f"t0 = time.perf_counter()\nimport {PKG}.agent\nprint((time.perf_counter() - t0) * 1e6)\n"
HOOKED = PRELUDE + (
    "t0 = time.perf_counter()\n"
    "from scalebox_cst import install_import_hook\n"
    f"hook = install_import_hook([{PKG!r}], project={{root!r}})\n"
    "t1 = time.perf_counter()\n"
    f"import {PKG}.agent\n"
    "t2 = time.perf_counter()\n"
    f"assert {PKG}.agent.__loader__.rewritten\n"
    "hook.flush()\n"
    "t3 = time.perf_counter()\n"
    "print((t2 - t1) * 1e6, (t1 - t0) * 1e6, (t3 - t2) * 1e6)\n"
)


def module_source(n_lines: int = 500) -> str:
    """A 500-line agent module: one unclipped training step (rewritten), classes and helpers."""
    out = [
        '"""Synthetic agent module for the import-hook benchmark."""',
        "import math",
        "",
        "import torch",
        "",
        "",
        "def train_step(model, optimizer, batch):",
        "    loss = model(batch).pow(2).mean()",
        "    optimizer.zero_grad()",
        "    loss.backward()",
        "    optimizer.step()",
        "    return loss",
        "",
    ]
    i = 0
    while len(out) < n_lines - 20:
        out += [
            "",
            f"class Agent{i}:",
            f'    """Agent number {i}."""',
            "",
            f"    def __init__(self, gamma={0.9 + i * 0.001:.3f}, lam=0.95):",
            "        self.gamma = gamma",
            "        self.lam = lam",
            "        self.buffer = []",
            "",
            "    def discount(self, rewards):",
            "        out, running = [], 0.0",
            "        for r in reversed(rewards):",
            "            running = r + self.gamma * running",
            "            out.append(running)",
            "        return out[::-1]",
            "",
            "    def score(self, x):",
            f"        return math.tanh(x * {i + 1}) + self.lam",
            "",
        ]
        i += 1
    while len(out) < n_lines:
        out.append(f"CONST_{len(out)} = {len(out)}")
    return "\n".join(out) + "\n"


def make_project(root: str) -> None:
    os.makedirs(os.path.join(root, PKG), exist_ok=True)
    with open(os.path.join(root, "scalebox.toml"), "w") as fh:
        fh.write('backend = "cpu"\ntransforms = ["grad_clip"]\n')
    with open(os.path.join(root, PKG, "__init__.py"), "w") as fh:
        fh.write("")
    with open(os.path.join(root, PKG, "agent.py"), "w") as fh:
        fh.write(module_source())


def run(root: str, code: str) -> list:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALEBOX_HOOK")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the plain import is measured with its __pycache__
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([root, REPO]))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{proc.stderr}")
    return [float(x) for x in proc.stdout.split()]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--cold-runs", type=int, default=5)
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="scalebox-bench-")
    try:
        make_project(root)
        hooked = HOOKED.format(root=root)
        state = os.path.join(root, ".scalebox")
        cold, cold_store = [], []
        for _ in range(args.cold_runs):
            shutil.rmtree(state, ignore_errors=True)
            cold.append(run(root, hooked)[0])  # empty store: parse, rewrite, commit, cache
            shutil.rmtree(os.path.join(state, "pycache"))
            cold_store.append(run(root, hooked)[0])  # the store's rewrite cache, no bytecode cache
        run(root, PLAIN)  # writes __pycache__
        run(root, hooked)  # writes .scalebox/pycache
        plain, warm, install, record = [], [], [], []
        for _ in range(args.runs):  # interleaved, so drift hits both alike
            plain.append(run(root, PLAIN)[0])
            w, i, r = run(root, hooked)
            warm.append(w)
            install.append(i)
            record.append(r)
        med = statistics.median
        print("500-line module, median of fresh processes (import statement only):")
        print(f"  plain cached import          {med(plain) / 1000:8.3f} ms")
        print(f"  hook, warm (cache hit)       {med(warm) / 1000:8.3f} ms   ratio {med(warm) / med(plain):.2f}x (target <= 1.5x)")
        print(f"  hook, cold (empty store)     {med(cold) / 1000:8.3f} ms   ({med(cold) / med(plain):.0f}x)")
        print(f"  hook, cold (store cache hit) {med(cold_store) / 1000:8.3f} ms")
        print(f"  install_import_hook()        {med(install) / 1000:8.3f} ms   (once per process)")
        print(f"  recording the warm hit       {med(record) / 1000:8.3f} ms   (flush: once per process, after the module ran)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
