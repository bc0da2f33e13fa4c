"""Whole public training scripts: CPU time of the original against the default rewrite (and
``--fast`` where ``scalebox rewrite --fast`` exists), whether the printed results stay the same,
and what bounds each script per the engine's analyzer.

The manifest (``benchmarks/public_scripts.json`` by default; JSON, or TOML by its extension; or
``SCALEBOX_BENCH_MANIFEST``) names each script by repository, commit and path; no third-party
code is kept in this repository. The files are read from a local cache (``--cache DIR`` or
``SCALEBOX_BENCH_CACHE``) holding either ``DIR/OWNER+NAME/repo`` (a bare git directory, the
layout of a mirror) or ``DIR/OWNER/NAME`` (a git clone); ``--fetch`` clones what is missing
into ``DIR/OWNER/NAME`` from GitHub (``git clone --filter=blob:none``). An entry::

    {"name": "mrl_dqn", "repo": "seungeunrho/minimalRL", "commit": "c8efed84...", "path": "dqn.py",
     "files": ["utils.py"],        # other files of the same folder the script imports
     "args": [...], "env": {...},   # command line and environment of the run
     "gym": "gymnasium|legacy",     # `import gym` served by gymnasium (see _public_harness.py)
     "max_steps": 12000,            # environment steps at which the run ends (no step argument)
     "ignore_lines": "^SPS:"}       # printed lines left out of the comparison (timings)

The older form ``{"folder": DIR, "scripts": [{"script": "x.py", "args": [], "env": {}}]}`` (a
folder of your own scripts) is read too. Each script is copied to ``project/NAME/``; the project
is rewritten with ``scalebox rewrite --out`` (variants: ``rewrite`` = default transforms,
``no-hot`` = default less ``hot.*``, ``hot-only``, ``fast`` = ``--fast``, ``without:ID`` = default
less one transform). Each script then runs in
each folder, interleaved (the order rotates every round), ``repeats`` times, under
``_public_harness.py`` (seeds random/numpy/torch and the first ``reset()`` of every environment;
``OMP_NUM_THREADS=1``, or, with ``--threads as-is``, the thread settings of the calling shell, as
users run: torch then uses one intra-op thread per core, which ``accelerate.threads`` acts on). Figures are the CPU time (user + system) of the whole process, medians;
``ratio`` is original / variant (above 1: faster). ``identical`` says whether every run of the
variant printed the bytes of the first original run. Last, the original runs once under
``scalebox run`` and ``scalebox profile --json`` gives the analyzer's category shares.

    python benchmarks/bench_public_scripts.py [MANIFEST] --cache DIR [--fetch] [--repeats N]
        [--variants original,rewrite,fast] [--only NAME,...] [--no-profile] [--json OUT]
        [--threads one|as-is]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCALEBOX = [sys.executable, "-c", "from scalebox_cst.cli import main; main()"]
HARNESS = os.path.join(HERE, "_public_harness.py")
HARNESS_NAME = "_sb_bench_harness.py"
FLAGS = {"rewrite": [], "no-hot": ["--no-transform", "hot.*"], "hot-only": ["--transform", "hot.*"], "fast": ["--fast"]}


def load_manifest(path: str) -> dict:
    with open(path, "rb") as fh:
        raw = fh.read()
    data = __import__("tomllib").loads(raw.decode()) if path.endswith(".toml") else json.loads(raw)
    if not isinstance(data.get("scripts"), list):
        raise SystemExit(f"{path}: needs a list 'scripts' (see benchmarks/bench_public_scripts.py)")
    for item in data["scripts"]:
        if not (("repo" in item and "commit" in item and "path" in item and "name" in item)
                or ("script" in item and data.get("folder"))):
            raise SystemExit(f"{path}: each script needs name/repo/commit/path (or 'script' with a top-level 'folder'): {item}")
    return data


def _git_dir(cache: str, repo: str, fetch: bool) -> str:
    owner, name = repo.split("/", 1)
    for cand in (os.path.join(cache, f"{owner}+{name}", "repo"), os.path.join(cache, owner, name)):
        if os.path.isdir(cand):
            return cand
    if not fetch:
        raise SystemExit(f"{repo} is not in the cache {cache} (as {owner}+{name}/repo or {owner}/{name}); "
                         "add --fetch to clone it")
    dest = os.path.join(cache, owner, name)
    subprocess.run(["git", "clone", "-q", "--filter=blob:none", "--no-checkout", f"https://github.com/{repo}", dest], check=True)
    return dest


def read_source(cache: str, repo: str, commit: str, path: str, fetch: bool) -> bytes:
    git_dir = _git_dir(cache, repo, fetch)
    proc = subprocess.run(["git", "--git-dir", git_dir if git_dir.endswith("repo") else os.path.join(git_dir, ".git"),
                           "show", f"{commit}:{path}"], capture_output=True)
    if proc.returncode != 0:
        raise SystemExit(f"{repo}@{commit[:10]}:{path}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def materialize(manifest: dict, project: str, cache: str, fetch: bool) -> list:
    """Write every script (and its sibling files) under project/; return the runnable items."""
    items = []
    for item in manifest["scripts"]:
        if "script" in item:
            shutil.copytree(manifest["folder"], project, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(".scalebox", "__pycache__", "scalebox.toml"))
            items.append(dict(item, name=item.get("name", item["script"]), rel=item["script"]))
            continue
        if not cache:
            raise SystemExit("give --cache DIR (or SCALEBOX_BENCH_CACHE): where the repositories are (or go, with --fetch)")
        folder = os.path.join(project, item["name"])
        os.makedirs(folder, exist_ok=True)
        base = os.path.dirname(item["path"])
        for rel in [os.path.basename(item["path"]), *item.get("files", [])]:
            with open(os.path.join(folder, rel), "wb") as fh:
                fh.write(read_source(cache, item["repo"], item["commit"], f"{base}/{rel}" if base else rel, fetch))
        items.append(dict(item, rel=f"{item['name']}/{os.path.basename(item['path'])}"))
    return items


def run_child(cmd, cwd, env, ignore):
    """Run one child and measure its own CPU (RUSAGE_CHILDREN delta; runs are sequential)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out = proc.stdout
    if ignore:
        pattern = re.compile(ignore.encode())
        out = b"".join(line for line in out.splitlines(True) if not pattern.search(line))
    return cpu, hashlib.sha256(out).hexdigest()[:12], proc.returncode, proc.stderr.decode(errors="replace")


def rewrite(project: str, out: str, extra) -> dict:
    proc = subprocess.run([*SCALEBOX, "rewrite", ".", "--backend", "cpu", "--json", "--out", out, *extra],
                          cwd=project, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"scalebox rewrite {' '.join(extra)} failed: {proc.stderr.strip()[-500:]}")
    shutil.copytree(project, out, dirs_exist_ok=True, ignore=lambda d, names: [  # --out writes rewritten files only
        n for n in names if n in (".scalebox", "__pycache__", ".git")
        or os.path.isfile(os.path.join(out, os.path.relpath(os.path.join(d, n), project)))])
    return json.loads(proc.stdout)


def has_fast() -> bool:
    proc = subprocess.run([*SCALEBOX, "rewrite", "--help"], capture_output=True, text=True)
    return "--fast" in proc.stdout


def sites_of(report: dict, item: dict) -> list:
    """Transforms with a rewritten site in the script (repository entries: any file of its folder)."""
    def ours(path):
        return path.startswith(item["name"] + "/") if "repo" in item else path == item["rel"]
    return sorted({s["transform"] for f in report["files"] if ours(f["path"]) for s in f["sites"]
                   if s["action"] == "rewritten"})


def profile_of(project: str, item: dict, env) -> dict:
    """The analyzer's category shares of one ``scalebox run --original`` of the script itself (the
    harness comes in as ``sitecustomize``, so the script is the run's entry and its lines are the user's)."""
    site = os.path.join(os.path.dirname(project), "site")
    os.makedirs(site, exist_ok=True)
    shutil.copy2(HARNESS, os.path.join(site, "sitecustomize.py"))
    env = dict(env, PYTHONPATH=os.pathsep.join([site, env.get("PYTHONPATH", "")]))
    run = subprocess.run([*SCALEBOX, "run", "--original", item["rel"], "--", *item.get("args", [])],
                         cwd=project, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        return {"error": f"profiled run failed: {(run.stderr.strip().splitlines() or [str(run.returncode)])[-1]}"}
    prof = subprocess.run([*SCALEBOX, "profile", "--json"], cwd=project, env=env, capture_output=True, text=True)
    try:
        cats = (json.loads(prof.stdout).get("profile") or {}).get("categories", [])
    except ValueError:
        return {"error": "no profile"}
    return {c["category"]: round(float(c["share"]), 4) for c in cats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("manifest", nargs="?", default=os.environ.get("SCALEBOX_BENCH_MANIFEST") or os.path.join(HERE, "public_scripts.json"))
    ap.add_argument("--cache", default=os.environ.get("SCALEBOX_BENCH_CACHE"), help="where the repositories are")
    ap.add_argument("--fetch", action="store_true", help="clone repositories missing from the cache")
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--only", help="comma-separated script names")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--profile-only", action="store_true", help="only the analyzer's shares (no timed runs)")
    ap.add_argument("--json", dest="json_out", help="write the figures here as JSON")
    ap.add_argument("--variants", default="original,rewrite,fast",
                    help=f"original and any of {', '.join(FLAGS)}, without:TRANSFORM_ID")
    ap.add_argument("--threads", choices=("one", "as-is"), default="one",
                    help="one: OMP/MKL_NUM_THREADS=1 (steadier figures); as-is: this shell's settings, as users run")
    opts = ap.parse_args()
    manifest = load_manifest(opts.manifest)
    if opts.only:
        wanted = set(opts.only.split(","))
        manifest["scripts"] = [s for s in manifest["scripts"] if s.get("name", s.get("script")) in wanted]
    repeats = opts.repeats or int(manifest.get("repeats", 3))
    variants = [v.strip() for v in opts.variants.split(",") if v.strip()]
    for v in variants:  # without:ID = the default rewrite less one transform (what that transform adds)
        if v.startswith("without:"):
            FLAGS[v] = ["--no-transform", v[len("without:"):]]
    unknown = [v for v in variants if v != "original" and v not in FLAGS]
    if unknown or "original" not in variants:
        raise SystemExit(f"--variants: needs original and any of {', '.join(FLAGS)}; got {opts.variants}")
    notes = []
    if "fast" in variants and not has_fast():
        variants.remove("fast")
        notes.append("fast: skipped, `scalebox rewrite --fast` does not exist in this engine yet")
    base_env = dict(os.environ, PYTHONHASHSEED="0")
    if opts.threads == "one":
        base_env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    base_env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, base_env.get("PYTHONPATH")) if p)
    base_env.pop("SCALEBOX_RUN", None)
    with tempfile.TemporaryDirectory(prefix="sb_public_") as work:
        project = os.path.join(work, "project")
        os.makedirs(project)
        items = materialize(manifest, project, opts.cache, opts.fetch)
        shutil.copy2(HARNESS, os.path.join(project, HARNESS_NAME))
        subprocess.run([*SCALEBOX, "init", "."], cwd=project, capture_output=True, check=True)
        folders, reports = {"original": project}, {}
        for variant in variants:
            if variant != "original":
                folders[variant] = os.path.join(work, variant)
                reports[variant] = rewrite(project, folders[variant], FLAGS[variant])

        def env_of(item):
            env = dict(base_env, **{k: str(v) for k, v in item.get("env", {}).items()})
            env["SB_BENCH_GYM"], env["SB_BENCH_MAX_STEPS"] = item.get("gym", ""), str(item.get("max_steps", ""))
            return env

        results = {}
        if opts.profile_only:
            for item in items:
                print(item["name"], json.dumps(profile_of(project, item, env_of(item))), flush=True)
            return
        for rnd in range(repeats):
            for item in items:
                order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
                for variant in order:
                    cmd = [sys.executable, HARNESS_NAME, item["rel"], *item.get("args", [])]
                    cpu, digest, rc, err = run_child(cmd, folders[variant], env_of(item), item.get("ignore_lines"))
                    if rc != 0:
                        raise SystemExit(f"{item['name']} ({variant}) exited {rc}: {err.strip()[-800:]}")
                    results.setdefault((item["name"], variant), []).append((cpu, digest))
                cpus = {v: results[(item["name"], v)][-1][0] for v in variants}
                print(f"round {rnd + 1}/{repeats}: {item['name']} "
                      + " ".join(f"{v} {c:.2f}s" for v, c in cpus.items()), file=sys.stderr)
        rows = []
        for item in items:
            name = item["name"]
            med = {v: statistics.median(c for c, _ in results[(name, v)]) for v in variants}
            first = results[(name, "original")][0][1]
            row = {"script": name, "repo": item.get("repo", ""), "path": item.get("path", item["rel"]),
                   "cpu_s": {v: round(med[v], 3) for v in variants},
                   "runs_s": {v: [round(c, 3) for c, _ in results[(name, v)]] for v in variants},
                   "ratio": {v: round(med["original"] / med[v], 3) for v in variants if v != "original"},
                   "identical": {v: all(d == first for _, d in results[(name, v)]) for v in variants},
                   "sites": {v: sites_of(reports[v], item) for v in reports}}
            row["profile"] = {} if opts.no_profile else profile_of(project, item, env_of(item))
            rows.append(row)
    others = [v for v in variants if v != "original"]
    print(f"{'script':<18} {'repo':<22} {'orig s':>7} " + " ".join(f"{v + ' x':>10} {'same':>5}" for v in others)
          + f" {'orig same':>9} {'env %':>6}  bound by (analyzer shares of the original)")
    for row in rows:
        prof = row["profile"]
        shares = prof.get("error") or ", ".join(f"{k} {v * 100:.0f}%" for k, v in sorted(prof.items(), key=lambda kv: -kv[1])[:4] if v >= 0.02)
        env = prof.get("env", prof.get("environment step", 0.0 if prof and "error" not in prof else None))
        print(f"{row['script']:<18} {row['repo']:<22} {row['cpu_s']['original']:>7.2f} "
              + " ".join(f"{row['ratio'][v]:>9.3f}x {'yes' if row['identical'][v] else 'NO':>5}" for v in others)
              + f" {'yes' if row['identical']['original'] else 'NO':>9} {'' if env is None else f'{env * 100:.0f}':>6}  {shares}")
    for v in others:
        print(f"median ratio {v}: {statistics.median(r['ratio'][v] for r in rows):.3f}x over {len(rows)} scripts")
    for note in notes:
        print(note)
    if opts.json_out:
        with open(opts.json_out, "w") as fh:
            json.dump({"variants": variants, "repeats": repeats, "notes": notes, "scripts": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
