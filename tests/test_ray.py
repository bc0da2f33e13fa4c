"""Many runs on Ray: each (branch, seed) a Ray task on a local Ray instance, recorded like local runs.

The commit travels with the job's runtime_env (no shared file system): a run must see the
committed modules, not the files on disk, and must not run in the project folder; its record,
log and metrics must come back into the project's ``.scalebox/runs``; a failing seed is recorded
failed with its traceback; stopping the call stops every run and leaves no process behind.
"""
import os
import textwrap
import threading
import time

import pytest

from scalebox_cst import runs
from scalebox_cst.project import Project

from conftest import scalebox

SCRIPT = textwrap.dedent(
    """\
    import argparse
    import os
    import time

    import torch

    import helpers

    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fail-seed", type=int, default=-1)
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step={step} loss={loss.item():.6f}")
    if args.seed == args.fail_seed:
        raise RuntimeError(f"seed {args.seed} fails here")
    rewritten = any(name.startswith("_scalebox_") for name in globals())
    print("mark", helpers.MARK, rewritten, os.getcwd(), flush=True)
    if args.sleep:
        print("sleeping", flush=True)
        time.sleep(args.sleep)
    """
)


@pytest.fixture
def ray_project(project):
    pytest.importorskip("ray", reason='Ray is an optional extra: pip install "scalebox_cst[ray]"')
    (project / "train.py").write_text(SCRIPT)
    (project / "helpers.py").write_text("MARK = 'committed'\n")
    (project / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n')
    scalebox("rewrite", str(project))
    (project / "helpers.py").write_text("MARK = 'disk'\n")
    return project


def _jobs(root, seeds, extra=()):
    from scalebox_cst.raylaunch import RayJob

    project = Project(str(root))
    info = project.store.resolve("run/0001")
    return project, [
        RayJob(info.name, info.commit, "train.py", ["--seed", str(s), *extra], source_commit=info.source_commit, seed=s, seed_via="option")
        for s in seeds
    ]


def test_two_seeds_on_a_local_ray_come_back_as_runs(ray_project):
    """`scalebox run --launcher ray --seeds 0,1 --branches A,B`: four tasks, four runs."""
    (ray_project / "helpers.py").write_text("MARK = 'second'\n")
    scalebox("rewrite", str(ray_project))  # run/0002: the same script, another module
    (ray_project / "helpers.py").write_text("MARK = 'disk'\n")
    proc = scalebox(
        "run", "--launcher", "ray", "--seeds", "0,1", "--branches", "run/0001,run/0002", "train.py", "--", "--fail-seed", "1",
        cwd=ray_project, check=False, timeout=600,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # seed 1 fails on both branches
    project = Project(str(ray_project))
    for branch, mark in (("run/0001", "committed"), ("run/0002", "second")):
        found = {r.run: r for r in runs.list_runs(project.root, branch)}
        assert sorted(found) == [1, 2], proc.stderr
        ok, failed = found[1].record, found[2].record
        assert (ok["status"], ok["seed"], ok["launcher"], ok["args"]) == ("ok", 0, "ray", ["--fail-seed", "1", "--seed", "0"]), ok
        assert (failed["status"], failed["seed"], failed["launcher"]) == ("failed", 1, "ray"), failed
        assert ok["ray"]["address"] == "local" and ok["ray"]["node_id"]
        log = open(os.path.join(found[1].dir, "log.txt"), encoding="utf-8").read()
        words = next(line.split() for line in log.splitlines() if line.startswith("mark "))
        assert words[1:3] == [mark, "True"], log  # the branch's committed module, the rewritten script
        assert os.path.realpath(words[3]) != os.path.realpath(project.root)  # ran in the shipped tree
        losses = {}
        for number in (1, 2):
            points = runs.read_metrics(os.path.join(found[number].dir, "metrics.jsonl"))[0]
            losses[number] = [p.value for p in points if p.name == "loss"]
            assert [p.step for p in points if p.name == "loss"] == [0, 1, 2]
        assert losses[1] != losses[2]  # the seeds differ
        assert ok["metrics"]["loss"]["count"] == 3 and ok["headline"]["last"]["loss"] == losses[1][-1]
        events = [e["kind"] for e in runs.read_events(os.path.join(found[1].dir, "events.jsonl"))[0]]
        assert events == ["started", "ended"]
        tail = failed["error_tail"]
        assert tail[0].startswith("Traceback") and tail[-1] == "RuntimeError: seed 1 fails here", tail
        assert any('raise RuntimeError(f"seed {args.seed} fails here")' in line for line in tail), tail
    # compare reads them like local runs
    compared = scalebox("compare", "run/0001", "run/0002", "--json", cwd=ray_project, check=False)
    assert compared.returncode == 0, compared.stdout + compared.stderr


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_stopping_the_call_stops_every_run(ray_project, monkeypatch):
    from scalebox_cst.raylaunch import run_ray

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    project, jobs = _jobs(ray_project, [0, 1], ["--sleep", "300"])
    stop = threading.Event()
    pids = {}

    def watch():
        deadline = time.time() + 240
        while time.time() < deadline and not stop.is_set():
            for job in jobs:
                record = runs.load_record(job.dir) if job.dir else None
                try:
                    sleeping = "sleeping" in open(os.path.join(job.dir, "log.txt"), encoding="utf-8").read()
                except OSError:
                    sleeping = False
                if record and record.get("pid") and sleeping:
                    pids[job.seed] = record["pid"]
            if len(pids) == len(jobs):
                break
            time.sleep(0.3)
        stop.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.time()
    records = run_ray(project.root, project.store.path, jobs, parallel=2, notice=lambda text: None, stop=stop)
    watcher.join(timeout=5)
    assert sorted(pids) == [0, 1], records
    assert time.time() - started < 200
    assert [r["status"] for r in records] == ["stopped", "stopped"], records
    deadline = time.time() + 30
    while time.time() < deadline and not all(_gone(p) for p in pids.values()):
        time.sleep(0.2)
    assert all(_gone(p) for p in pids.values()), pids


def test_without_ray_the_launcher_says_how_to_install_it(project, tmp_path):
    (project / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n')
    scalebox("rewrite", str(project))
    hidden = tmp_path / "no_ray"
    (hidden / "ray").mkdir(parents=True)
    (hidden / "ray" / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    proc = scalebox("run", "--launcher", "ray", "--seeds", "0,1", "train.py", cwd=project, check=False,
                    env={"PYTHONPATH": os.pathsep.join(p for p in (str(hidden), os.environ.get("PYTHONPATH")) if p)})
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == 'scalebox: the ray launcher needs Ray: pip install "scalebox_cst[ray]" (or pip install "ray>=2.9")', proc.stderr
    assert runs.list_runs(str(project)) == []  # nothing started, nothing recorded
