"""A public RL library's own test suite, run on the library as written and on its default rewrite.

A training script shows that one run's output is unchanged; a library's tests reach the code
from many sides (each algorithm, each space, save/load, seeds compared across runs). Each entry
names a repository, a commit, the package folder and the test files to run. The package is
rewritten with ``scalebox rewrite --out`` (the default transforms, the store in a scratch
checkout), files that are not Python (``version.txt``, ``py.typed``) are copied beside the
rewrite, and pytest runs the same test files against each tree (``PYTHONPATH`` puts the tree
first). The rewrite passes when pytest gives both trees the same outcome for every test id:
tests that fail on the original (an upstream bug, a missing optional dependency) must fail the
same way, nothing more.

    python benchmarks/library_suites.py --cache /work/.mirror [--only sb3,skrl] [--json OUT]

Repositories come from the cache as in bench_public_scripts.py (``--fetch`` clones what is
missing). Test dependencies the engine's venv lacks (pandas for SB3, tensorboard and tqdm for
skrl) are the caller's: ``--pythonpath DIR`` adds a folder of them after the tree.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_public_scripts import _git_dir  # noqa: E402

LIBRARIES = [
    {
        "name": "sb3",
        "repo": "DLR-RM/stable-baselines3",
        "commit": "e05d2dbe6eda0acd0ef2e316e3e4065677add3eb",
        "package": "stable_baselines3",
        "tests": ["tests/test_gae.py", "tests/test_buffers.py", "tests/test_deterministic.py", "tests/test_run.py",
                  "tests/test_sde.py", "tests/test_train_eval_mode.py", "tests/test_custom_policy.py",
                  "tests/test_predict.py", "tests/test_her.py", "tests/test_dict_env.py", "tests/test_n_step_replay.py",
                  "tests/test_spaces.py", "tests/test_distributions.py", "tests/test_vec_check_nan.py"],
    },
    {
        "name": "skrl",
        "repo": "Toni-SM/skrl",
        "commit": "c29ced630e83ab32304dc8a3de241a70d3bc5746",
        "package": "skrl",
        "tests": ["tests/agents/torch", "tests/multi_agents/torch", "tests/memories/torch"],
    },
    {
        "name": "mushroom",
        "repo": "MushroomRL/mushroom-rl",
        "commit": "5c3834d7f06906989c9fe93f1c60974bf5c3fd19",
        "package": "mushroom_rl",
        "tests": ["tests/algorithms", "tests/policy", "tests/approximators", "tests/utils", "tests/core"],
        # written for gymnasium < 1.0 (``gym.logger.set_level`` at import); the same shim for both trees
        "shim": "import gymnasium.logger as _l\nif not hasattr(_l, 'set_level'):\n    _l.set_level = lambda level: None\n",
    },
]

#: pytest's short summary (``-rA``): "PASSED tests/x.py::test[a b]", "FAILED tests/x.py::t - why"
_OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (.+?)(?: - .*)?$")


def checkout(cache: str, lib: dict, dest: str, fetch: bool) -> None:
    git_dir = _git_dir(cache, lib["repo"], fetch)
    git_dir = git_dir if git_dir.endswith("repo") else os.path.join(git_dir, ".git")
    os.makedirs(dest)
    archive = subprocess.run(["git", "--git-dir", git_dir, "archive", lib["commit"]], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", dest], input=archive.stdout, check=True)


def rewrite(original: str, lib: dict, out: str, fast: bool = False) -> str:
    """The package's default rewrite under ``out`` (plus the package's non-Python files); the
    summary line of ``scalebox rewrite``."""
    scalebox = [os.path.join(os.path.dirname(sys.executable), "scalebox")]
    subprocess.run([*scalebox, "init"], cwd=original, check=True, capture_output=True)
    proc = subprocess.run([*scalebox, "rewrite", *(["--fast"] if fast else []), "--out", out, lib["package"]],
                          cwd=original, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{lib['name']}: scalebox rewrite failed: {proc.stderr.strip()[-400:]}")
    for folder, _, files in os.walk(os.path.join(original, lib["package"])):
        for name in files:
            if not name.endswith((".py", ".pyc")):
                src = os.path.join(folder, name)
                dst = os.path.join(out, os.path.relpath(src, original))
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                if not os.path.exists(dst):
                    shutil.copy2(src, dst)
    shutil.copytree(os.path.join(original, "tests"), os.path.join(out, "tests"), dirs_exist_ok=True)
    for name in ("pyproject.toml", "setup.cfg", "pytest.ini", "conftest.py"):
        if os.path.exists(os.path.join(original, name)):
            shutil.copy2(os.path.join(original, name), os.path.join(out, name))
    return next((line for line in proc.stdout.splitlines() if "site(s)" in line), proc.stdout.strip()[-200:])


def outcomes(tree: str, tests: List[str], pythonpath: str, timeout: float, shim: str = "") -> Tuple[Dict[str, str], str]:
    """test id -> outcome for pytest run in ``tree`` (its package first on the path, after the
    folder ``shim`` holding a sitecustomize where given); the summary."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in (shim, tree, pythonpath) if p))
    cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:randomly", *tests]
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    found: Dict[str, str] = {}
    for line in proc.stdout.splitlines():
        m = _OUTCOME.match(line)
        if m:
            found[m.group(2)] = m.group(1)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()[-300:]
    return found, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=os.environ.get("SCALEBOX_BENCH_CACHE", ""), required=not os.environ.get("SCALEBOX_BENCH_CACHE"))
    ap.add_argument("--fetch", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated names")
    ap.add_argument("--pythonpath", default="", help="a folder of the libraries' test dependencies")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per pytest run")
    ap.add_argument("--fast", action="store_true", help="the --fast tier's rewrite (reassociated: tests that compare values may differ)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    wanted = {n for n in args.only.split(",") if n}
    results = []
    for lib in LIBRARIES:
        if wanted and lib["name"] not in wanted:
            continue
        with tempfile.TemporaryDirectory(prefix=f"suite-{lib['name']}-") as tmp:
            original, rewritten = os.path.join(tmp, "original"), os.path.join(tmp, "rewrite")
            checkout(args.cache, lib, original, args.fetch)
            shim = os.path.join(tmp, "shim") if lib.get("shim") else ""
            if shim:  # an environment fix the library needs on today's dependencies
                os.makedirs(shim)
                with open(os.path.join(shim, "sitecustomize.py"), "w", encoding="utf-8") as fh:
                    fh.write(lib["shim"])
            summary = rewrite(original, lib, rewritten, args.fast)
            shutil.rmtree(os.path.join(original, ".scalebox"), ignore_errors=True)
            before, s0 = outcomes(original, lib["tests"], args.pythonpath, args.timeout, shim)
            after, s1 = outcomes(rewritten, lib["tests"], args.pythonpath, args.timeout, shim)
        differ = sorted(t for t in set(before) | set(after) if before.get(t) != after.get(t))
        row = {"name": lib["name"], "rewrite": summary, "original": s0, "rewritten": s1, "tests": len(before),
               "differ": [(t, before.get(t), after.get(t)) for t in differ]}
        results.append(row)
        print(f"{lib['name']}: {summary}")
        print(f"  original:  {s0}\n  rewritten: {s1}\n  outcomes differ: {len(differ)} of {len(before)} tests")
        for t, a, b in row["differ"][:20]:
            print(f"    {t}: {a} -> {b}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    if any(r["differ"] or not r["tests"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
