"""CleanRL's scripts as written, rewritten with ``--fast``, and LeanRL's hand-compiled versions:
steps/s side by side (issue 21's GPU goal: LeanRL's 2.7x PPO-continuous, 5.7x SAC on an H100).

Two steps, so that the rewrite is made where the engine is installed and only plain Python runs
on the GPU machine:

    # here: copy the scripts out of git checkouts (or mirrors) and rewrite them
    python benchmarks/fast_gpu_check.py prepare OUT --cleanrl CLEANRL_GIT --leanrl LEANRL_GIT
    # on the GPU machine (scalebox_cst importable: the rewrite imports scalebox_cst.runtime.compiled)
    python benchmarks/fast_gpu_check.py run OUT --env-id Pendulum-v1 --steps 20000

``prepare`` writes ``OUT/original/`` (CleanRL's ``ppo_continuous_action.py``,
``sac_continuous_action.py`` and ``cleanrl_utils/``), ``OUT/fast/`` (the same after
``scalebox rewrite --fast --backend cuda --out``, with the report in ``OUT/fast/report.json``) and
``OUT/leanrl/`` (LeanRL's ``*_torchcompile.py``, run with ``--compile --cudagraphs``; they need
``tensordict``). ``run`` runs each script of each variant once, one after another, and prints
the last ``SPS`` line each printed (CleanRL and LeanRL print steps/s), its wall and CPU time, and
each variant's SPS over the original's; ``--variants`` picks some, ``--fast-env`` passes
``SCALEBOX_COMPILE=0`` / ``SCALEBOX_COMPILE_CUDAGRAPHS=0`` style switches to the fast variant.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPTS = ("ppo_continuous_action", "sac_continuous_action")
SCALEBOX = [sys.executable, "-c", "from scalebox_cst.cli import main; main()"]


def _git_show(repo: str, path: str) -> bytes:
    return subprocess.run(["git", "-C", repo, "show", f"HEAD:{path}"], check=True, capture_output=True).stdout


def prepare(out: str, cleanrl: str, leanrl: str) -> None:
    original, fast, lean = (os.path.join(out, d) for d in ("original", "fast", "leanrl"))
    for folder in (original, lean):
        os.makedirs(folder, exist_ok=True)
    os.makedirs(os.path.join(original, "cleanrl_utils"), exist_ok=True)
    for name in SCRIPTS:
        with open(os.path.join(original, name + ".py"), "wb") as fh:
            fh.write(_git_show(cleanrl, f"cleanrl/{name}.py"))
        with open(os.path.join(lean, name + "_torchcompile.py"), "wb") as fh:
            fh.write(_git_show(leanrl, f"leanrl/{name}_torchcompile.py"))
    with open(os.path.join(original, "cleanrl_utils", "buffers.py"), "wb") as fh:
        fh.write(_git_show(cleanrl, "cleanrl_utils/buffers.py"))
    open(os.path.join(original, "cleanrl_utils", "__init__.py"), "w").close()
    subprocess.run([*SCALEBOX, "init", "."], cwd=original, check=True, capture_output=True)
    proc = subprocess.run([*SCALEBOX, "rewrite", *[n + ".py" for n in SCRIPTS], "--fast", "--backend", "cuda",
                           "--json", "--out", fast], cwd=original, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"scalebox rewrite failed: {proc.stderr.strip()[-800:]}")
    shutil.copytree(os.path.join(original, "cleanrl_utils"), os.path.join(fast, "cleanrl_utils"), dirs_exist_ok=True)
    with open(os.path.join(fast, "report.json"), "w") as fh:
        fh.write(proc.stdout)
    sites = [f"{f['path']}:{s['line']} {s['transform']} {s['action']}"
             for f in json.loads(proc.stdout)["files"] for s in f["sites"] if s["transform"].startswith("accelerate.")]
    print("\n".join(sites) or "no accelerate.* site")
    print(f"prepared {out}: original/, fast/, leanrl/")


def _run(cmd, cwd, env):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    sps = re.findall(r"SPS:\s*([0-9.]+)", proc.stdout + proc.stderr)
    sps += re.findall(r"([0-9.]+) sps,", proc.stdout + proc.stderr)  # LeanRL: a tqdm description
    tail = (proc.stderr.strip().splitlines() or [""])[-1]
    return proc.returncode, float(sps[-1]) if sps else None, wall, cpu, tail


def run(out: str, env_id: str, steps: int, variants, extra_env) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env.setdefault("WANDB_MODE", "disabled")  # LeanRL calls wandb.init
    for name in SCRIPTS:
        base = None
        for variant in variants:
            folder = os.path.join(out, variant)
            script = name + ("_torchcompile.py" if variant == "leanrl" else ".py")
            args = ["--env-id", env_id, "--total-timesteps", str(steps)]
            if variant == "leanrl":
                args += ["--compile", "--cudagraphs"]
            if name.startswith("sac"):
                args += ["--learning-starts", str(min(5000, steps // 4))]
            run_env = dict(env, **(extra_env if variant == "fast" else {}))
            rc, sps, wall, cpu, tail = _run([sys.executable, script, *args], folder, run_env)
            if variant == "original":
                base = sps
            ratio = f"{sps / base:.2f}x" if sps and base else "-"
            print(f"{name:<24} {variant:<9} rc={rc} SPS={sps} wall={wall:.1f}s cpu={cpu:.1f}s {ratio} {tail if rc else ''}",
                  flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("out")
    p.add_argument("--cleanrl", required=True, help="a git checkout or mirror of vwxyzjn/cleanrl")
    p.add_argument("--leanrl", required=True, help="a git checkout or mirror of pytorch-labs/LeanRL")
    r = sub.add_parser("run")
    r.add_argument("out")
    r.add_argument("--env-id", default="Pendulum-v1")
    r.add_argument("--steps", type=int, default=20000)
    r.add_argument("--variants", default="original,fast,leanrl")
    r.add_argument("--fast-env", action="append", default=[], metavar="NAME=VALUE")
    opts = ap.parse_args()
    if opts.cmd == "prepare":
        prepare(opts.out, opts.cleanrl, opts.leanrl)
    else:
        extra = dict(item.split("=", 1) for item in opts.fast_env)
        run(opts.out, opts.env_id, opts.steps, [v.strip() for v in opts.variants.split(",") if v.strip()], extra)


if __name__ == "__main__":
    main()
