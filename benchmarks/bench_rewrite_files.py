"""Rewrite CPU time per real file: this tree against an older one (a git ref or a code folder).

``bench_scaling.py`` measures generated files of 1k..50k lines; users save files of 100-1,500
lines, where what a rewrite costs is mostly per statement and per transform. This benchmark
rewrites each given file with ``Pipeline(Config(), backend)`` under the old code and under this
tree's, each side in a process of its own (the old code is unpacked as ``bench_scaling``'s
``--identity`` does), alternating old and new ``--rounds`` times. In a round each file is
rewritten ``--repeat`` times in-process and its best CPU time kept; a file's figure is its best
over the rounds (a shared machine only ever adds time). Printed per file: old and new
milliseconds and their ratio; then the medians and the totals, per group of files when the file
names carry one (``owner+repo_path.py``: the repository) and over all. The outputs are compared
too: a file whose rewrite differs between the two trees is flagged (speed-ups must not change
what is written; ``bench_scaling.py --identity`` is the full check).

    python benchmarks/bench_rewrite_files.py --old HEAD~1 FILE_OR_DIR... [--rounds 3] [--repeat 3] [--backend cpu]

Measured (issue 19, fifteenth session; ba49a40 -> b40d1d5: a final newline added where a file has
none, hot.* visits that enter only the statements holding their calls and position only those,
the ClassDef emitter; defaults, on the loaded 2-core machine): 22 public scripts (CleanRL 10,
minimalRL 5, LeanRL 3, tianshou 3, torchrl 1) 6.86 -> 4.03 s (0.59x, median ratio 0.57; CleanRL
0.56x, minimalRL 0.54x, LeanRL 0.61x, tianshou 0.77x); the slowest files of the sweep of 16 new
repositories, classes that are most of their file (DI-engine cql/iql/sac/trex, PPO-PyTorch) 0.30-
0.45x (cql 796 -> 251 ms); generated files of bench_scaling (mixed 20k, sparse 20k, loops 5k)
0.98-1.01x. Outputs identical in every pair.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List

os.environ.setdefault("OMP_NUM_THREADS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)


def measure_here(paths: List[str], backend: str, repeat: int) -> Dict[str, list]:
    """{path: [best CPU seconds over ``repeat`` rewrites, digest of the output and sites]} in this process."""
    import gc
    import time

    from scalebox_cst.config import Config
    from scalebox_cst.pipeline import Pipeline

    pipeline = Pipeline(Config(), backend)
    out: Dict[str, list] = {}
    for path in paths:
        with open(path, "rb") as fh:
            data = fh.read()
        best = float("inf")
        result = None
        for _ in range(repeat):
            gc.collect()
            t0 = time.process_time()
            result = pipeline.rewrite(path, data)
            best = min(best, time.process_time() - t0)
        assert result is not None
        sites = [(s.transform, s.line, s.end_line, s.action, s.reason) for s in result.report.sites]
        digest = hashlib.sha256(result.output + json.dumps(sites).encode()).hexdigest()[:16]
        out[path] = [best, digest]
    return out


def _side(code_root: str, paths_json: str, backend: str, repeat: int) -> Dict[str, list]:
    snippet = (
        "import json, sys; sys.path.insert(0, %r); sys.path.insert(1, %r); import scalebox_cst; "
        "assert scalebox_cst.__file__.startswith(%r), scalebox_cst.__file__; import bench_rewrite_files as b; "
        "print(json.dumps(b.measure_here(json.load(open(%r)), %r, %d)))"
        % (code_root, HERE, os.path.join(code_root, ""), paths_json, backend, repeat)
    )
    proc = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"rewrite under {code_root} failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _group(path: str) -> str:
    name = os.path.basename(path)
    return name.split("_", 1)[0] if "+" in name.split("_", 1)[0] else "files"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="Python files, or folders of them")
    parser.add_argument("--old", required=True, help="a git ref of this repository, or a folder holding scalebox_cst/, transforms/, runtime/")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backend", default="cpu")
    args = parser.parse_args(argv)
    from bench_scaling import _code_tree

    files: List[str] = []
    for p in args.paths:
        files += sorted(glob.glob(os.path.join(p, "*.py"))) if os.path.isdir(p) else [p]
    files = [os.path.abspath(f) for f in files]
    with tempfile.TemporaryDirectory() as work:
        old_root = _code_tree(args.old, work)
        paths_json = os.path.join(work, "paths.json")
        with open(paths_json, "w", encoding="utf-8") as fh:
            json.dump(files, fh)
        best: Dict[str, Dict[str, float]] = {"old": {}, "new": {}}
        digests: Dict[str, Dict[str, str]] = {"old": {}, "new": {}}
        for _ in range(args.rounds):
            for side, root in (("old", old_root), ("new", ROOT)):
                for path, (seconds, digest) in _side(root, paths_json, args.backend, args.repeat).items():
                    best[side][path] = min(best[side].get(path, float("inf")), seconds)
                    digests[side][path] = digest
    groups: Dict[str, List[str]] = {}
    print(f"{'file':60s} {'old ms':>8s} {'new ms':>8s} {'new/old':>8s}")
    for path in files:
        o, n = best["old"][path], best["new"][path]
        flag = "  OUTPUT DIFFERS" if digests["old"][path] != digests["new"][path] else ""
        print(f"{os.path.basename(path)[:60]:60s} {o * 1e3:8.1f} {n * 1e3:8.1f} {n / o if o else float('nan'):8.2f}{flag}")
        groups.setdefault(_group(path), []).append(path)
    print()
    for name, members in sorted(groups.items()) + ([("all", files)] if len(groups) > 1 else []):
        o = sum(best["old"][p] for p in members)
        n = sum(best["new"][p] for p in members)
        ratios = [best["new"][p] / best["old"][p] for p in members if best["old"][p]]
        print(f"{name:40s} {len(members):4d} files  total {o:7.2f} -> {n:7.2f} s ({n / o:.2f}x)  median ratio {statistics.median(ratios):.2f}")
    differ = sum(1 for p in files if digests["old"][p] != digests["new"][p])
    print(f"outputs differing: {differ} of {len(files)}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
