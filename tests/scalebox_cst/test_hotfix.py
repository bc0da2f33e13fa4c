"""Hot-fix branches: the policy's signals, the branch it commits, the heal loop and its limit.

The end-to-end test runs a fixture whose learning-rate schedule explodes at step 150: the default
guard clips the growing norms (and the run still ends in inf), the policy sees repeated
interventions, the heal loop stops the run and runs the hot-fix branch (a fixed clip from the
healthy history + host-checked skips), which finishes with finite values.
"""
import json
import math
import os
import textwrap

import pytest

from scalebox_cst import hotfix, runs
from scalebox_cst.config import Config
from scalebox_cst.project import Project

DIVERGING = textwrap.dedent("""\
    import time

    import torch

    torch.manual_seed(0)
    X = torch.randn(1024, 4) * 1.5
    Y = X @ torch.tensor([[1.0], [2.0], [-1.0], [0.5]]) + 0.1 * torch.randn(1024, 1)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(1, 1001):
        lr = min(0.05 * 1.1 ** max(step - 150, 0), 2.0)  # an exploding learning-rate schedule
        if step > 150:
            time.sleep(0.005)  # a real run goes on for long after it blows up: time for the policy to act
        for group in optimizer.param_groups:
            group["lr"] = lr
        idx = torch.randint(0, 1024, (32,))
        loss = ((model(X[idx]) - Y[idx]) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step={step} loss={loss.item():.6g}", flush=True)
    print(f"final_loss={loss.item()}")
""")


def write_run(tmp_path, metrics=(), events=()):
    d = tmp_path / "run"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / runs.METRICS, "a") as fh:
        for name, step, value in metrics:
            fh.write(json.dumps({"name": name, "step": step, "value": value if math.isfinite(value) else str(value), "time": 0}) + "\n")
    with open(d / runs.EVENTS, "a") as fh:
        for e in events:
            fh.write(json.dumps({"time": 0, "message": e.get("kind"), **e}) + "\n")
    return str(d)


# --------------------------------------------------------------------------- the policy


def test_one_skipped_step_is_the_guards_job_three_are_a_signal(tmp_path):
    d = write_run(tmp_path, events=[{"kind": "nonfinite", "site": "t.py:9", "step": 40},
                                    {"kind": "step_skipped", "site": "t.py:9", "step": 40, "skipped": True}])
    watch = hotfix.RunWatch(d)
    assert watch.poll() is None
    write_run(tmp_path, events=[{"kind": "step_skipped", "site": "t.py:9", "step": 500, "skipped": True},
                                {"kind": "spike_clipped", "site": "t.py:3", "step": 501}])
    assert watch.poll() is None  # far apart, or at other sites
    write_run(tmp_path, events=[{"kind": "step_skipped", "site": "t.py:9", "step": 520, "skipped": True},
                                {"kind": "spike_clipped", "site": "t.py:9", "step": 560}])
    sig = watch.poll()
    assert (sig.kind, sig.step, sig.site) == ("repeated-interventions", 560, "t.py:9")
    assert watch.poll() is sig  # sticky


def test_unskipped_nonfinite_and_nonfinite_losses_and_divergence(tmp_path):
    d = write_run(tmp_path / "a", events=[{"kind": "guard_intervened", "site": "t.py:9", "step": 7, "skipped": False}])
    sig = hotfix.RunWatch(d).poll()
    assert sig.kind == "nonfinite-unskipped" and sig.step == 7
    d = write_run(tmp_path / "b", metrics=[("losses/value_loss", 3, math.nan), ("losses/value_loss", 4, 1.0)])
    watch = hotfix.RunWatch(d)
    assert watch.poll() is None
    write_run(tmp_path / "b", metrics=[("losses/value_loss", 5, math.inf)])
    assert watch.poll().kind == "nonfinite-loss"
    healthy = [("scalebox/grad_norm", 8 * i, 1.0 + 0.1 * (i % 3)) for i in range(1, 21)]
    d = write_run(tmp_path / "c", metrics=healthy + [("scalebox/grad_norm/t.py:30", 8, 50.0), ("scalebox/grad_norm", 168, 5e3)])
    watch = hotfix.RunWatch(d)
    sig = watch.poll()
    assert sig.kind == "grad-norm-divergence" and sig.step == 168
    assert sorted(watch.healthy_norms()) == [50.0]  # the larger-norm optimizer's history


def test_a_scripts_own_grad_norm_tag_and_clipped_norms_are_not_the_policys(tmp_path):
    """Issue 20: a SummaryWriter "grad_norm" is the script's series, and the guard's norm after the
    code's clip is bounded by its max_norm: neither is read as the engine's grad norm."""
    healthy = [(name, 8 * i, 1.0) for i in range(1, 21) for name in ("grad_norm", "scalebox/grad_norm_clipped")]
    d = write_run(tmp_path, metrics=healthy + [("grad_norm", 168, 5e3), ("scalebox/grad_norm_clipped", 168, 5e3)])
    watch = hotfix.RunWatch(d)
    assert watch.poll() is None and watch.healthy_norms() == []
    write_run(tmp_path, metrics=[("scalebox/grad_norm_preclip", 8 * i, 2.0) for i in range(1, 21)] + [("scalebox/grad_norm_preclip", 176, 5e3)])
    assert watch.poll().kind == "grad-norm-divergence"


def test_failed_after_nonfinite_is_a_signal_only_after_exit(tmp_path):
    d = write_run(tmp_path, events=[{"kind": "nonfinite", "name": "losses/pg", "step": 12}])
    watch = hotfix.RunWatch(d)
    assert watch.poll() is None and watch.after_exit("ok") is None
    assert watch.after_exit("failed").kind == "failed-nonfinite"


def test_partial_last_line_is_read_when_complete(tmp_path):
    d = write_run(tmp_path)
    with open(os.path.join(d, runs.EVENTS), "a") as fh:
        fh.write('{"kind": "guard_intervened", "site": "s", "step": 3, "skipped": false')
    watch = hotfix.RunWatch(d)
    assert watch.poll() is None
    with open(os.path.join(d, runs.EVENTS), "a") as fh:
        fh.write(', "message": "m"}\n')
    assert watch.poll().kind == "nonfinite-unskipped"


def test_clip_threshold_from_history():
    assert hotfix.clip_threshold([1.0, 2.0, 3.0, 100.0]) == 2.5
    assert hotfix.clip_threshold([]) == 1.0
    assert hotfix.clip_threshold([4.0], previous=2.0) == 1.0
    assert hotfix.clip_threshold([0.123456]) == 0.123


def test_bad_hotfix_settings_are_one_line_errors():
    cfg = Config()
    cfg.set_option("hotfix", "max_per_sauce", 1)
    with pytest.raises(hotfix.HotfixError, match=r"unknown option hotfix.max_per_sauce \(did you mean 'max_per_source'\?\)"):
        hotfix.settings(cfg)
    cfg = Config()
    cfg.set_option("hotfix", "window", "x")
    with pytest.raises(hotfix.HotfixError, match="window"):
        hotfix.settings(cfg)


# --------------------------------------------------------------------------- the branch


@pytest.fixture
def diverging(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text(DIVERGING)
    project, _ = Project.init(str(root))
    project = Project(str(root), backend="cpu")
    change = project.commit_change()
    return project, change.branch


def test_hotfix_branch_same_snapshot_stronger_stabilizer_and_limit(diverging):
    project, branch = diverging
    store = project.store
    sig = hotfix.Signal("repeated-interventions", 163, "3 guard interventions at train.py:20 within 200 steps", "train.py:20")
    fix = hotfix.make_hotfix(project, branch, 1, sig, [0.3, 0.2, 0.25])
    info, parent = store.resolve(fix.branch), store.resolve(branch)
    assert info.source_commit == parent.source_commit and fix.branch != branch
    text = store.files(info.commit)["train.py"].decode()
    assert "_scalebox_stabilize(optimizer, site='train.py:20', max_norm=0.25, sync=True)" in text
    assert store.files(info.source_commit)["train.py"].decode() == DIVERGING  # the user's file, untouched
    message = store.repo[info.commit].message
    assert message.startswith(f"hotfix of {branch}#1 at step 163: repeated-interventions")
    assert "3 guard interventions at train.py:20" in message and 'mode = "fixed", max_norm = 0.25' in message
    report = store.report(fix.branch)
    assert report["hotfix_of"] == f"{branch}#1" and report["hotfix"]["max_norm"] == 0.25
    events, _ = runs.read_events(runs.project_events_path(project.root))
    assert [(e["kind"], e["branch"], e["hotfix_of"]) for e in events] == [("hotfix_created", fix.branch, f"{branch}#1")]
    # a hot-fix of the hot-fix halves the threshold; then the limit (2 per snapshot) stops it
    second = hotfix.make_hotfix(project, fix.branch, 1, sig, [0.3])
    assert "max_norm=0.125" in store.files(store.resolve(second.branch).commit)["train.py"].decode()
    with pytest.raises(hotfix.HotfixError, match="hot-fix limit reached: 2 hot-fix"):
        hotfix.make_hotfix(project, second.branch, 1, sig, [0.3])
    assert len(store.branches()) == 3


class FakeRun:
    """A run that has already written its telemetry (the heal loop only reads files)."""

    def __init__(self, directory, events, status="ok"):
        os.makedirs(directory, exist_ok=True)
        write_run_dir(directory, events)
        self.dir, self.status = directory, status
        self.record = type("R", (), {"run": 1, "status": status})()
        self.stopped = None

    def poll(self):
        return None if self.stopped is None else 0

    def stop(self, grace=None, reason=""):
        self.stopped = reason
        self.record.status = "stopped"
        return self.record

    def wait(self):
        return self.record


def write_run_dir(directory, events):
    with open(os.path.join(directory, runs.EVENTS), "a") as fh:
        for e in events:
            fh.write(json.dumps({"time": 0, "message": e["kind"], **e}) + "\n")


def test_heal_loop_never_loops(diverging, tmp_path):
    project, branch = diverging
    project.config.set_option("hotfix", "max_per_source", 1)
    started = []
    bad = [{"kind": "guard_intervened", "site": "train.py:16", "step": 9, "skipped": False}]

    def start(info, hotfix_of):
        run = FakeRun(str(tmp_path / f"r{len(started)}"), bad)  # every run, hot-fix or not, blows up
        run.poll = (lambda r=run: 0 if r.stopped else None)
        started.append((info.name, hotfix_of, run))
        return run

    notes = []
    record, made = hotfix.heal_loop(project, branch, "train.py", [], start=start, notice=notes.append, poll_s=0)
    assert [(n, h) for n, h, _ in started] == [(branch, None), (made[0].branch, f"{branch}#1")]
    assert len(made) == 1 and all(r.stopped.startswith("hot-fix: nonfinite-unskipped") for _, _, r in started)
    assert any("hot-fix limit reached" in n for n in notes) and any(f"hot-fix {made[0].branch}" in n for n in notes)


def test_heal_loop_leaves_a_healthy_run_alone(diverging, tmp_path):
    project, branch = diverging
    run = FakeRun(str(tmp_path / "ok"), [{"kind": "step_skipped", "site": "s", "step": 3, "skipped": True}])
    run.poll = lambda: 0
    record, made = hotfix.heal_loop(project, branch, "train.py", [], start=lambda info, of: run, notice=print, poll_s=0)
    assert made == [] and run.stopped is None


@pytest.mark.timeout(600)
def test_diverging_run_is_healed_end_to_end(diverging):
    """``scalebox run --heal``, real runs from the store: the guarded run is stopped, the hot-fix
    branch runs in its place and finishes finite; log and diff show it as a hot-fix."""
    from conftest import scalebox

    project, branch = diverging
    proc = scalebox("run", "--heal", branch, "train.py", cwd=project.root, timeout=600)
    (fix_branch,) = [b.name for b in project.store.branches() if b.name != branch]
    all_runs = {r.id: r for r in runs.list_runs(project.root)}
    first, healed = all_runs[f"{branch}#1"], all_runs[f"{fix_branch}#1"]
    assert first.status == "stopped" and healed.status == "ok" and healed.record.get("hotfix_of") == f"{branch}#1"
    report = project.store.report(fix_branch)
    assert report["hotfix"]["signal"] == "repeated-interventions" and report["hotfix"]["step"] > 150  # LR explodes at 150
    final = [l for l in proc.stdout.splitlines() if l.startswith("final_loss=")]
    assert len(final) == 1 and math.isfinite(float(final[0].split("=")[1])), proc.stdout[-2000:]
    assert f"{branch}#1 unstable" in proc.stderr and f"hot-fix {fix_branch}" in proc.stderr
    log = scalebox("log", cwd=project.root).stdout
    assert f"HOT-FIX of {branch}#1" in log and f"hot-fix of {branch}#1" in log
    diff = scalebox("diff", fix_branch, cwd=project.root).stdout
    assert "max_norm=" in diff and "sync=True" in diff and "changes-semantics" in diff


LOCATE = textwrap.dedent("""\
    import torch
    torch.manual_seed(0)
    class Blowup(torch.nn.Module):
        def forward(self, x, step):
            return x.log() if step == 5 else x.abs()
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.bad, self.out = torch.nn.Linear(3, 3), Blowup(), torch.nn.Linear(3, 1)
        def forward(self, x, step):
            return self.out(self.bad(self.fc(x) - 10.0, step))
    net = Net()
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    for step in range(1, 9):
        loss = net(torch.randn(4, 3), step).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("done", all(bool(torch.isfinite(p).all()) for p in net.parameters()))
""")


@pytest.mark.timeout(600)
def test_locate_nan_from_the_cli(tmp_path):
    from conftest import scalebox

    root = tmp_path / "loc"
    root.mkdir()
    (root / "train.py").write_text(LOCATE)
    scalebox("init", ".", cwd=root)
    first = scalebox("run", "train.py", cwd=root, timeout=300)
    assert "done True" in first.stdout  # the guard skipped step 5 instead of writing NaN
    assert "first non-finite gradient at train.py:18 step 5" in first.stderr  # the child's stderr, on stderr
    proc = scalebox("run", "--locate-nan", "train.py", cwd=root, timeout=300)
    assert "Net.bad (Blowup) produced the first non-finite output at train.py:18 step 5" in proc.stderr
    assert "train.py:11" in proc.stderr and "done" not in proc.stdout, proc.stdout
    bad = scalebox("run", "--heal", "--locate-nan", "train.py", cwd=root, check=False)
    assert bad.returncode == 2 and "not with each other" in bad.stderr


@pytest.mark.timeout(600)
def test_watcher_runs_the_hotfix_in_place_of_the_unstable_run(diverging):
    """scalebox-watch --run: the watcher's run is healed as under --heal (the hook in reap_run)."""
    import io
    import time

    from scalebox_cst.watcher import Watcher

    project, branch = diverging
    messages = []
    watcher = Watcher(project, "train.py", [], polling=True, echo=messages.append, run_output=io.StringIO(), grace=2.0)
    try:
        watcher.start()
        deadline = time.time() + 500
        healed = None
        while time.time() < deadline:
            watcher.process_pending(timeout=0.2)
            done = [r for r in runs.list_runs(project.root) if r.record.get("hotfix_of") and r.status in ("ok", "failed", "stopped")]
            if done:
                healed = done[0]
                break
        assert healed is not None, messages
    finally:
        watcher.close()
    assert healed.status == "ok" and healed.record["hotfix_of"].endswith("#1")
    stopped = [r for r in runs.list_runs(project.root) if r.id == healed.record["hotfix_of"]]
    assert stopped and stopped[0].status == "stopped"
    assert any("unstable" in m for m in messages) and any(m.startswith("scalebox: hot-fix run/") for m in messages)


def test_heal_loop_stops_its_run_when_interrupted(diverging, tmp_path, monkeypatch):
    project, branch = diverging
    run = FakeRun(str(tmp_path / "r"), [])

    def interrupted(_):
        raise KeyboardInterrupt("SIGTERM")

    from scalebox_cst.runner import supervisor

    monkeypatch.setattr(supervisor.time, "sleep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        hotfix.heal_loop(project, branch, "train.py", [], start=lambda info, of: run, notice=print, poll_s=0)
    assert run.stopped == "SIGTERM to scalebox run --heal"
