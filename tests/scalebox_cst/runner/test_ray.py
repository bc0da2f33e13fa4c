"""Many runs on Ray: each (branch, seed) a Ray task on a local Ray instance, recorded like local runs.

The commit travels with the job's runtime_env (no shared file system): a run must see the
committed modules, not the files on disk, and must not run in the project folder; its record,
log and metrics must come back into the project's ``.scalebox/runs``; a failing seed is recorded
failed with its traceback; stopping the call stops every run and leaves no process behind.
"""
import os
import signal
import subprocess
import sys
import textwrap
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


def _wait_for(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _sleeping(run_dir):
    try:
        with open(os.path.join(run_dir, "log.txt"), encoding="utf-8") as fh:
            return "sleeping" in fh.read()
    except OSError:
        return False


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_stopping_the_call_stops_every_run_and_ray(ray_project, how):
    """SIGTERM to `scalebox run --launcher ray`: every task is cancelled, each run stopped and
    recorded so. SIGKILL: no shutdown runs, yet the runs and the local Ray instance end."""
    from scalebox_cst.rayreaper import descendants as _descendants

    driver = subprocess.Popen(
        [sys.executable, "-c", "from scalebox_cst.cli import main; main()", "run", "--launcher", "ray", "--seeds", "0,1",
         "run/0001", "train.py", "--", "--sleep", "300"],
        cwd=ray_project, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True,
    )
    dirs = [os.path.join(str(ray_project), ".scalebox", "runs", "run", "0001", f"{n:04d}") for n in (1, 2)]
    try:
        _wait_for(lambda: all(_sleeping(d) for d in dirs), 300, "both runs to start")
        pids = [runs.load_record(d)["pid"] for d in dirs]  # the children that run the script
        ray_processes = [pid for pid, _ in _descendants(driver.pid)]  # the local instance, its workers
        assert len(ray_processes) > 3 and not any(_gone(p) for p in pids)
        started = time.time()
        os.kill(driver.pid, getattr(signal, how))
        code = driver.wait(timeout=120)
        _wait_for(lambda: all(_gone(p) for p in pids + ray_processes), 60, "every process of the call to end")
        assert time.time() - started < 100
        if how == "SIGTERM":
            assert code == 128 + signal.SIGTERM, driver.stderr.read()
            assert [runs.load_record(d)["status"] for d in dirs] == ["stopped", "stopped"]
    finally:
        if driver.poll() is None:
            driver.kill()


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
