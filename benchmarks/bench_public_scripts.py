"""Whole training scripts (your own or public ones): CPU time of the original against the default
rewrite, and what bounds each script.

The manifest (JSON, or TOML by its extension; or the path in ``SCALEBOX_BENCH_MANIFEST``) names
a folder of scripts and how to run each (the folder is copied; nothing in it is edited)::

    {"folder": "/tmp/pub/scripts", "repeats": 3,
     "scripts": [{"script": "mrl_dqn.py", "args": [], "env": {"EPISODES": "60"}}, ...]}

The copy is rewritten twice with ``scalebox rewrite --out``: with the default transforms
(``rewrite``) and with the default less ``hot.*`` (``no-hot``, to tell what the hot.* rewrites
add). Each script then runs in the three folders, interleaved (the order rotates every round),
``repeats`` times, under a harness that seeds ``random``/numpy/torch and the first
``reset()`` of every gymnasium environment, with ``OMP_NUM_THREADS=1``. Figures are the CPU
time (user + system) of the whole process, medians; ``ratio`` is original / rewrite (above 1:
the rewrite is faster). ``differs`` names the variants with a run that printed other bytes than
the first original run (``exact`` rewrites must not; the original itself when it is not
deterministic). ``--variants`` also offers ``hot-only`` (hot.* alone) and ``fast`` (``--fast``: the
reassociated tier, torch.compile; its output may differ). Last, the original runs once under ``scalebox run`` and
``scalebox profile --json`` gives the analyzer's category shares (what bounds the script).

    python benchmarks/bench_public_scripts.py MANIFEST [--repeats N] [--no-profile]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCALEBOX = [sys.executable, "-c", "from scalebox_cst.cli import main; main()"]

HARNESS = r'''
import random, runpy, sys
import numpy as np
import torch
random.seed(0); np.random.seed(0); torch.manual_seed(0)
try:
    import gymnasium
    _make = gymnasium.make
    def make(*args, **kwargs):
        env = _make(*args, **kwargs)
        reset, first = env.reset, [True]
        def seeded_reset(*a, **k):
            if first[0] and "seed" not in k:
                k["seed"] = 0
            first[0] = False
            return reset(*a, **k)
        env.reset = seeded_reset
        env.action_space.seed(0)
        return env
    gymnasium.make = make
except ImportError:
    pass
sys.argv = sys.argv[1:]
sys.path.insert(0, ".")
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def load_manifest(path: str) -> dict:
    with open(path, "rb") as fh:
        raw = fh.read()
    if path.endswith(".toml"):
        import tomllib

        data = tomllib.loads(raw.decode())
    else:
        data = json.loads(raw)
    if not isinstance(data.get("scripts"), list) or not data.get("folder"):
        raise SystemExit(f"{path}: needs 'folder' and a list 'scripts' of {{script, args, env}}")
    return data


def run_child(cmd, cwd, env):
    """Run one child and measure its own CPU (RUSAGE_CHILDREN delta; runs are sequential)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, hashlib.sha256(proc.stdout).hexdigest()[:12], proc.returncode, proc.stderr.decode(errors="replace")


def rewrite(project: str, out: str, extra) -> dict:
    proc = subprocess.run([*SCALEBOX, "rewrite", ".", "--backend", "cpu", "--json", "--out", out, *extra],
                          cwd=project, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"scalebox rewrite failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def sites_of(report: dict, script: str, prefix: str) -> int:
    return sum(1 for f in report["files"] if f["path"] == script for s in f["sites"]
               if s["action"] == "rewritten" and s["transform"].startswith(prefix))


def profile_shares(project: str, script: str, args, env) -> str:
    run = subprocess.run([*SCALEBOX, "run", "--original", script, "--", *args], cwd=project, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        return f"(profiled run failed: {run.stderr.strip().splitlines()[-1:] or run.returncode})"
    prof = subprocess.run([*SCALEBOX, "profile", "--json"], cwd=project, env=env, capture_output=True, text=True)
    try:
        cats = (json.loads(prof.stdout).get("profile") or {}).get("categories", [])
    except ValueError:
        return "(no profile)"
    return ", ".join(f"{c['category']} {float(c['share']) * 100:.0f}%" for c in cats[:5] if float(c["share"]) >= 0.02)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("manifest", nargs="?", default=os.environ.get("SCALEBOX_BENCH_MANIFEST"))
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--variants", default="original,rewrite,no-hot",
                    help="comma-separated, from original, rewrite (default transforms), no-hot (default less hot.*), "
                         "hot-only (hot.* alone), fast (scalebox rewrite --fast)")
    opts = ap.parse_args()
    if not opts.manifest:
        raise SystemExit("give a manifest (or set SCALEBOX_BENCH_MANIFEST)")
    manifest = load_manifest(opts.manifest)
    repeats = opts.repeats or int(manifest.get("repeats", 3))
    base_env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    base_env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, base_env.get("PYTHONPATH")) if p)
    base_env.pop("SCALEBOX_RUN", None)
    with tempfile.TemporaryDirectory(prefix="sb_public_") as work:
        project = os.path.join(work, "project")
        shutil.copytree(manifest["folder"], project, ignore=shutil.ignore_patterns(".scalebox", "__pycache__", "scalebox.toml"))
        subprocess.run([*SCALEBOX, "init", "."], cwd=project, capture_output=True, check=True)
        variants = [v.strip() for v in opts.variants.split(",") if v.strip()]
        flags = {"rewrite": [], "no-hot": ["--no-transform", "hot.*"], "hot-only": ["--transform", "hot.*"], "fast": ["--fast"]}
        unknown = [v for v in variants if v != "original" and v not in flags]
        if unknown or "original" not in variants:
            raise SystemExit(f"--variants: needs original and any of {', '.join(flags)}; got {opts.variants}")
        folders = {"original": project}
        reports = {}
        for variant in variants[1:] if variants[0] == "original" else [v for v in variants if v != "original"]:
            folders[variant] = os.path.join(work, variant)
            reports[variant] = rewrite(project, folders[variant], flags[variant])
            for name in os.listdir(project):  # --out writes rewritten files only: carry the rest
                src, dst = os.path.join(project, name), os.path.join(folders[variant], name)
                if not os.path.exists(dst) and os.path.isfile(src):
                    shutil.copy2(src, dst)
        harness = os.path.join(work, "harness.py")
        with open(harness, "w") as fh:
            fh.write(HARNESS)
        results = {}
        for rnd in range(repeats):
            for item in manifest["scripts"]:
                env = dict(base_env, **{k: str(v) for k, v in item.get("env", {}).items()})
                order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
                for variant in order:
                    cpu, digest, rc, err = run_child([sys.executable, harness, item["script"], *item.get("args", [])], folders[variant], env)
                    if rc != 0:
                        raise SystemExit(f"{item['script']} ({variant}) exited {rc}: {err.strip()[-800:]}")
                    results.setdefault((item["script"], variant), []).append((cpu, digest))
                print(f"round {rnd + 1}/{repeats}: {item['script']} done", file=sys.stderr)
        others = [v for v in variants if v != "original"]
        print(f"{'script':<24} {'orig cpu s':>10} " + " ".join(f"{v:>9} {'ratio':>6}" for v in others)
              + f" {'hot sites':>9} {'differs':>10}  bound by (analyzer shares of the original)")
        for item in manifest["scripts"]:
            script = item["script"]
            med = {v: statistics.median(c for c, _ in results[(script, v)]) for v in variants}
            first = results[(script, "original")][0][1]
            differs = [v for v in variants if any(d != first for _, d in results[(script, v)])]
            shares = "" if opts.no_profile else profile_shares(project, script, item.get("args", []),
                                                               dict(base_env, **{k: str(v) for k, v in item.get("env", {}).items()}))
            hot = max((sites_of(reports[v], script, "hot.") for v in others), default=0)
            print(f"{script:<24} {med['original']:>10.2f} "
                  + " ".join(f"{med[v]:>9.2f} {med['original'] / med[v]:>5.3f}x" for v in others)
                  + f" {hot:>9} {','.join(differs) or 'none':>10}  {shares}")


if __name__ == "__main__":
    main()
