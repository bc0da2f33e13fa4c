"""The monitor's API: series downsampling, incremental reads, branches/diff/events JSON, HTTP.

Fixture projects are real stores (branches committed by the pipeline, a real rollback) with run
folders written in the on-disk layout of scalebox_cst.runs (records, metrics, events, sites),
as a running or finished `scalebox run` leaves them.
"""
from __future__ import annotations

import http.client
import json
import math
import os
import random
import textwrap
import threading
import time
import urllib.request

import numpy as np
import pytest
from conftest import scalebox
from hypothesis import given, settings, strategies as st

from scalebox_cst import diffview, runs
from scalebox_cst.monitor import series as series_mod
from scalebox_cst.monitor.api import ApiError, Monitor
from scalebox_cst.monitor.series import Series
from scalebox_cst.monitor.server import STATIC, MonitorServer
from scalebox_cst.project import Project
from scalebox_cst.report import RunReport
from scalebox_cst.store import Store

TRAIN_V1 = textwrap.dedent(
    """\
    import torch

    def gae(rewards, values, dones, gamma=0.99, lam=0.95):
        T = rewards.shape[0]
        adv = torch.zeros_like(rewards)
        last = 0.0
        for t in reversed(range(T - 1)):
            nonterminal = 1.0 - dones[t + 1]
            delta = rewards[t] + gamma * values[t + 1] * nonterminal - values[t]
            last = delta + gamma * lam * nonterminal * last
            adv[t] = last
        return adv

    def train(model, optimizer, batch):
        loss = model(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss
    """
)


# ------------------------------------------------------------------------------ fixture writers
def write_run(root, branch, *, status="ok", seed=None, variant="rewrite", hotfix_of=None, started=None,
              points=(), events=(), sites=None, error_tail=None, headline=None, pid=None):
    """A run folder as the executor leaves it; ``points``: (name, step, value, time) tuples."""
    number, folder = runs.allocate_run(root, branch)
    started = time.time() - 100 if started is None else started
    record = {
        "branch": branch, "run": number, "commit": "0" * 40, "source_commit": None, "variant": variant,
        "script": "train.py", "args": [], "seed": seed, "pid": pid if pid is not None else os.getpid(),
        "pgid": None, "host": None, "started": started, "ended": None if status == "running" else started + 50,
        "wall_time": None if status == "running" else 50.0, "exit_status": None if status == "running" else (0 if status == "ok" else 1),
        "status": status, "signal": None, "hotfix_of": hotfix_of, "launcher": "local", "nproc": 1,
        "headline": headline or {}, "error_tail": error_tail or [],
    }
    runs.write_record(folder, record)
    append_points(folder, points)
    for kind, message, extra in events:
        runs.append_event(os.path.join(folder, runs.EVENTS), kind, message, **extra)
    if sites is not None:
        with open(os.path.join(folder, runs.SITES), "w") as fh:
            json.dump({"sites": sites}, fh)
    return folder


def append_points(folder, points, partial=None):
    with open(os.path.join(folder, runs.METRICS), "a") as fh:
        for name, step, value, stamp in points:
            value = value if math.isfinite(value) else str(value)
            fh.write(json.dumps({"name": name, "step": step, "value": value, "time": stamp}) + "\n")
        if partial:
            fh.write(partial)


def curve(name, n, started, scale=1.0, offset=0.0, every=1):
    return [(name, i * every, offset + scale * math.log1p(i), started + i * 0.5) for i in range(n)]


def make_project(tmp_path):
    """Four branches: run/0001 (one run, nan/inf, a failed hot-fixed run), run/0002 (three
    seeds), run/0003 (after a rollback to run/0001, hot-fix, never run), plus a running run."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text(TRAIN_V1)
    project, _ = Project.init(str(root))
    project.config.set_option("grad_clip", "max_norm", 1.0)
    first = project.commit_change(force=True).report.branch
    (root / "train.py").write_text(TRAIN_V1.replace("gamma=0.99", "gamma=0.98"))
    second = project.commit_change(force=True).report.branch
    project.rollback(first)
    third = project.commit_change(force=True).report.branch
    assert (first, second, third) == ("run/0001", "run/0002", "run/0003")
    root = str(root)
    now = time.time()
    pts = curve("episodic_return", 50, now - 100, every=100)
    pts[10] = ("episodic_return", 1000, float("nan"), pts[10][3])
    pts[20] = ("episodic_return", 2000, float("inf"), pts[20][3])
    pts += curve("losses/value_loss", 40, now - 100, scale=-0.1, offset=2.0)
    sites = [{"path": "train.py", "line": 7, "transform": "vectorize.recurrence", "vectorized": 90, "fallback": 10, "time_s": 0.25}]
    write_run(root, first, started=now - 100, points=pts, sites=sites, events=[("started", "run/0001#1 started", {}), ("ended", "run/0001#1 ok", {})],
              headline={"episodic_return_final": 3.5, "episodic_return_best": 3.9, "sps": 1200.0, "guard_pass_rate": 0.9})
    write_run(root, first, status="failed", started=now - 60, hotfix_of=None,
              error_tail=["Traceback (most recent call last):", '  File "train.py", line 9, in gae', "RuntimeError: boom"],
              events=[("failed", "run/0001#2 failed (exit 1)", {}), ("nonfinite", "non-finite losses/value_loss=nan at step 3", {"name": "losses/value_loss"})])
    for seed in (0, 1, 2):
        write_run(root, second, seed=seed, points=curve("episodic_return", 60, now - 100, scale=1 + seed * 0.2, every=100),
                  headline={"episodic_return_final": 4.0 + seed, "sps": 900.0 + seed, "guard_pass_rate": 1.0})
    runs.append_project_event(root, "save_blocked", "train.py:3: invalid syntax", file="train.py")
    runs.append_project_event(root, "rollback", "rolled back to run/0001", branch=first)
    return root


@pytest.fixture
def proj(tmp_path):
    return make_project(tmp_path)


@pytest.fixture
def live_pid():
    """A process that passes for a run's child (runs.is_alive looks for scalebox_cst in its cmdline)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "scalebox_cst.runtime.launch"])
    # until the child has exec'd, its cmdline is this process's (a fork): read then, the run
    # looked lost (a CI run under load did)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with open(f"/proc/{proc.pid}/cmdline", "rb") as fh:
                if b"scalebox_cst.runtime.launch" in fh.read():
                    break
        except OSError:  # no /proc: runs.is_alive trusts the pid there
            break
        time.sleep(0.01)
    yield proc.pid
    proc.kill()
    proc.wait()


# ------------------------------------------------------------------------------ series
@pytest.mark.parametrize("n", [1, 5, 1023, 1024, 1025, 5000, 70_001])
@pytest.mark.parametrize("batches", [1, 7])
def test_series_keeps_extremes_counts_and_order(n, batches):
    rng = np.random.default_rng(n + batches)
    x = np.arange(n, dtype=float) * 3
    v = rng.normal(size=n)
    v[rng.integers(0, n, size=max(1, n // 50))] = np.nan
    t = 1000 + x / 10
    s = Series()
    for part in np.array_split(np.arange(n), batches):
        s.extend(x[part].tolist(), t[part].tolist(), v[part].tolist())
    assert s.count == n
    finite = np.isfinite(v)
    assert s.nonfinite == int((~finite).sum())
    assert len(s.buckets) <= series_mod.CAPACITY
    out = s.points(1000)
    assert len(out["x"]) <= 1000 + 2
    assert out["x"] == sorted(out["x"])
    if finite.any():
        # the global minimum and maximum survive downsampling, at their own x
        assert min(out["y"]) == v[finite].min() and max(out["y"]) == v[finite].max()
        i = int(np.nanargmax(np.where(finite, v, -np.inf)))
        assert x[i] in out["x"]
        # every point drawn is a real point of the series
        real = dict(zip(x[finite].tolist(), v[finite].tolist()))
        assert all(real[a] == b for a, b in zip(out["x"], out["y"]))
    if n <= series_mod.CAPACITY and n < 500:
        assert out["x"] == x[finite].tolist()  # short series: exact
    summary = s.summary()
    assert summary["count"] == n and summary["last"]["x"] == x[-1]
    assert list(s.tail) == v[finite][-series_mod.TAIL:].tolist()


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.one_of(st.floats(-1e6, 1e6), st.sampled_from([math.nan, math.inf, -math.inf])), min_size=1, max_size=300),
    cuts=st.lists(st.integers(0, 300), max_size=6),
    capacity=st.integers(2, 16),
    points=st.integers(2, 40),
)
def test_series_against_the_points_themselves(values, cuts, capacity, points):
    """Any batching, any capacity: counts, extremes, the sum behind the means, real points only."""
    n = len(values)
    x = [float(i) for i in range(n)]
    s = Series(capacity=capacity)
    edges = sorted({0, n, *[c % (n + 1) for c in cuts]})
    for a, b in zip(edges, edges[1:]):
        s.extend(x[a:b], x[a:b], values[a:b])
    finite = [v for v in values if math.isfinite(v)]
    assert s.count == n and s.nonfinite == n - len(finite)
    assert len(s.buckets) <= capacity
    kept = s.all_buckets()
    assert kept[:, series_mod.N].sum() == n and kept[:, series_mod.NF].sum() == len(finite)
    assert kept[:, series_mod.SUM].sum() == pytest.approx(sum(finite), rel=1e-9, abs=1e-6)
    out = s.points(points)
    assert len(out["x"]) <= 2 * max(1, points // 2) and out["x"] == sorted(out["x"])
    assert all(values[int(a)] == b for a, b in zip(out["x"], out["y"]))
    if finite:
        assert min(out["y"]) == min(finite) and max(out["y"]) == max(finite)
        assert s.summary()["last_finite"] == finite[-1]
    else:
        assert out == {"x": [], "y": []}


def test_series_bucket_means_match_the_points_they_cover():
    x = np.arange(100_000, dtype=float)
    v = np.sin(x / 5000.0)
    s = Series()
    s.extend(x, x, v)
    mx, mean = s.means(200)
    assert len(mx) <= 200
    # each mean is the mean of a contiguous stretch around its x: close to the curve there
    assert np.max(np.abs(mean - np.sin(mx / 5000.0))) < 0.02
    assert s.nbytes < 400_000  # bounded whatever the length


def test_series_nonfinite_markers_and_time_axis():
    s = Series()
    s.extend([0, 1, 2, 3], [10.0, 11.0, 12.0, 13.0], [1.0, float("nan"), float("inf"), -float("inf")])
    assert [m[2] for m in s.markers] == ["nan", "inf", "-inf"]
    assert s.points(100, axis="time") == {"x": [10.0], "y": [1.0]}
    assert s.summary()["last"]["value"] == "-inf"


# ------------------------------------------------------------------------------ API unit
def test_run_listing_is_shared_for_a_moment_then_read_again(proj):
    m = Monitor(proj, refresh_interval=0.4)
    assert m.runs_ttl == 0.2
    before = len(m.runs("run/0003")["runs"])
    write_run(proj, "run/0003")
    assert len(m.runs("run/0003")["runs"]) == before  # the same poll: the same listing
    time.sleep(0.25)
    assert len(m.runs("run/0003")["runs"]) == before + 1


def test_branches_history_status_headline_and_marks(proj):
    m = Monitor(proj)
    data = m.branches()
    by = {b["name"]: b for b in data["branches"]}
    assert list(by) == ["run/0001", "run/0002", "run/0003"]
    one, two, three = by["run/0001"], by["run/0002"], by["run/0003"]
    # history: each branch names its source snapshot, rollback marked on the one after it
    assert one["source_index"] < two["source_index"] < three["source_index"]
    assert three["rollback_to"] == "run/0001" and one["rollback_to"] is None
    sources = {s["commit"]: s for s in data["sources"]}
    assert sources[three["source_commit"]]["message"].startswith("rollback to run/0001")
    # what was rewritten, from the stored report
    report = RunReport.from_json(Store.open(proj).report("run/0001"))
    assert one["counts"]["rewritten"] == report.counts()["rewritten"] > 0
    assert sum(one["transforms"].values()) == one["counts"]["rewritten"]
    assert "grad_clip" in one["transforms"]
    # status: the newest run's; headline stored at the end of the run
    assert [r["status"] for r in one["runs"]] == ["ok", "failed"]
    assert one["status"] == "failed"
    assert one["headline_run"] == "run/0001#1" and one["headline"]["sps"] == 1200.0  # the failed run has none
    assert two["headline_run"] == "run/0002#3" and two["headline"]["episodic_return_final"] == 6.0
    assert one["runs"][0]["headline"]["episodic_return_final"] == 3.5
    assert one["runs"][1]["error_tail"][-1] == "RuntimeError: boom"
    assert two["status"] == "ok" and [r["seed"] for r in two["runs"]] == [0, 1, 2]
    # a branch whose run never started
    assert three["status"] == "not run" and three["runs"] == [] and three["headline"] == {}
    json.dumps(data, allow_nan=False)


def test_hotfix_marked_from_the_run_record_or_the_project_event(proj):
    write_run(proj, "run/0003", hotfix_of="run/0001#2", points=curve("episodic_return", 5, time.time()))
    m = Monitor(proj, runs_ttl=0)
    by = {b["name"]: b for b in m.branches()["branches"]}
    assert by["run/0003"]["hotfix_of"] == "run/0001#2" and by["run/0002"]["hotfix_of"] is None
    # what scalebox_cst.hotfix writes when it makes a hot-fix branch
    runs.append_project_event(proj, "hotfix_created", "run/0002: grad norm spike", branch="run/0002", hotfix_of="run/0001#1", step=10)
    by = {b["name"]: b for b in m.branches()["branches"]}
    assert by["run/0002"]["hotfix_of"] == "run/0001#1"
    assert m.events()["events"][0]["kind"] == "hotfix_created"


def test_live_headline_reads_the_engines_series_not_the_scripts_tags(proj, live_pid):
    """Issue 20: a script's own grad_norm / episodic_return tag is its series, not the engine's."""
    now = time.time()
    engine = [("scalebox/" + n, s, v, t) for n, s, v, t in curve("episodic_return", 30, now)]
    mine = [("episodic_return", 1, 999.0, now), ("grad_norm", 1, 0.5, now), ("scalebox/grad_norm_preclip", 8, 3.0, now),
            ("scalebox/grad_norm_clipped", 8, 0.5, now)]
    write_run(proj, "run/0003", status="running", pid=live_pid, points=engine + mine)
    m = Monitor(proj, runs_ttl=0)
    head = {b["name"]: b for b in m.branches()["branches"]}["run/0003"]["runs"][0]["headline"]
    assert head["episodic_return_final"] == pytest.approx(np.mean([math.log1p(i) for i in range(20, 30)]))
    assert head["metric_return"] == "scalebox/episodic_return"
    assert (head["grad_norm_last"], head["grad_norm_metric"]) == (3.0, "scalebox/grad_norm_preclip")
    names = m.metric_names(run_ids=["run/0003#1"])["metrics"]  # every series under its own name
    assert {"episodic_return", "scalebox/episodic_return", "grad_norm", "scalebox/grad_norm_preclip"} <= set(names)
    workers = [("scalebox/workers/%d/episodic_return" % w, s, v + w, t) for w in (1, 2) for n, s, v, t in curve("x", 10, now)]
    write_run(proj, "run/0004", status="running", pid=live_pid, points=workers)
    head = {b["name"]: b for b in m.branches()["branches"]}["run/0004"]["runs"][0]["headline"]
    assert head["metric_return"] == "scalebox/workers/*/episodic_return" and head["episodes"] == 20


def test_live_and_final_steps_per_second_are_one_definition(proj, live_pid):
    """steps/s is the median of the later half of the SPS points (scalebox_cst.headlines), live and
    final alike: a live run showed its last point and jumped to the median when it ended."""
    now = time.time()
    values = [50.0, 900.0, 300.0, 310.0, 320.0, 5.0]  # the last point is not the later half's median
    folder = write_run(proj, "run/0003", status="running", pid=live_pid,
                       points=[("SPS", i, v, now + i) for i, v in enumerate(values)])
    run = {b["name"]: b for b in Monitor(proj, runs_ttl=0).branches()["branches"]}["run/0003"]["runs"][0]
    assert run["headline_live"]
    final = runs.headline({}, runs.read_series(folder))["sps"]
    assert run["headline"]["sps"] == final == 310.0


def test_engine_steps_per_second_is_the_later_halfs_steps_over_its_time(proj, live_pid):
    """Found by a newcomer (XinJingHao's Duel-DDQN: 50 updates every 50 env steps): the run did
    3247 env steps in 38 s, and its end line, log and compare said 25 steps/s, the median of the
    engine's SPS points, most of them slow (training between steps), few fast (evaluation). The
    engine's x counts the env steps: the headline is the later half's steps over its time, live
    (the monitor's tail) and final alike; a script's own SPS keeps the median (previous test)."""
    now = time.time()
    steps, t, points = 0, now, []
    for i, (n, dt) in enumerate([(50, 2.0), (50, 2.0), (900, 0.5), (50, 2.0), (50, 2.0), (900, 0.5)]):
        steps, t = steps + n, t + dt
        points.append(("scalebox/SPS", steps, n / dt, t))
    folder = write_run(proj, "run/0003", status="running", pid=live_pid, points=points)
    run = {b["name"]: b for b in Monitor(proj, runs_ttl=0).branches()["branches"]}["run/0003"]["runs"][0]
    final = runs.headline({}, runs.read_series(folder))["sps"]
    # the later half: points 3..5 (1000 steps) over the time from point 2 to point 5 (4.5 s)
    assert final == pytest.approx(1000 / 4.5) and run["headline"]["sps"] == pytest.approx(final)
    assert sorted(p[2] for p in points[3:])[1] == 25.0  # what the median of the rates said


def test_live_run_headline_and_lost_status(proj, live_pid):
    folder = write_run(proj, "run/0003", status="running", pid=live_pid, points=curve("episodic_return", 30, time.time()) + [("SPS", 0, 321.0, time.time())])
    m = Monitor(proj, runs_ttl=0)
    run = {b["name"]: b for b in m.branches()["branches"]}["run/0003"]["runs"][0]
    assert run["status"] == "running" and run["headline_live"]
    assert run["headline"]["episodic_return_final"] == pytest.approx(np.mean([math.log1p(i) for i in range(20, 30)]))
    assert run["headline"]["sps"] == 321.0
    # its process goes away without finishing the record: shown as lost (ended), not running
    record = json.load(open(os.path.join(folder, runs.RECORD)))
    record["pid"] = 2 ** 22 + 12345  # no such process
    runs.write_record(folder, record)
    run = {b["name"]: b for b in m.branches()["branches"]}["run/0003"]["runs"][0]
    assert run["status"] == "lost"


def test_runs_carry_their_profile_kept_or_read_on_while_live(proj, live_pid):
    """A finished run shows its record's profile; a live one its profile.jsonl, read on."""
    kept = {"samples": 50, "wall_s": 2.0, "method": "sampled at 25 Hz",
            "categories": [{"category": "env", "label": "environment step", "share": 0.75, "wall_s": 1.5},
                           {"category": "backward", "label": "backward", "share": 0.25, "wall_s": 0.5}],
            "lines": [{"path": "train.py", "line": 9, "code": "x = env.step(a)", "share": 0.75, "category": "env", "calls": 30,
                       "coverage": {"covered": False, "reason": "no transform matched this line"}}]}
    done = runs.list_runs(proj, "run/0002")[0]
    record = dict(done.record, profile=kept)
    runs.write_record(done.dir, record)
    live = write_run(proj, "run/0003", status="running", pid=live_pid)
    line = {"time": 1.0, "hz": 25.0, "cpu": True, "rows": [["train.py", 4, "backward", 3, 0.3, 0.3, 2]]}
    with open(os.path.join(live, "profile.jsonl"), "w") as fh:
        fh.write(json.dumps(line) + "\n")
    m = Monitor(proj, runs_ttl=0)
    by_branch = {b["name"]: b for b in m.branches()["branches"]}
    shown = next(r for r in by_branch["run/0002"]["runs"] if r["id"] == done.id)["profile"]
    assert [(c["category"], c["share"]) for c in shown["categories"]] == [("env", 0.75), ("backward", 0.25)]
    assert shown["lines"][0]["code"] == "x = env.step(a)" and shown["lines"][0]["coverage"] == "no transform matched this line"
    running = by_branch["run/0003"]["runs"][0]["profile"]
    assert running["categories"] == [{"category": "backward", "label": "backward", "share": 1.0}]
    with open(os.path.join(live, "profile.jsonl"), "a") as fh:
        fh.write(json.dumps(dict(line, rows=[["train.py", 7, "env", 3, 0.9, 0.9, 1]])) + "\n")
    running = {b["name"]: b for b in m.branches()["branches"]}["run/0003"]["runs"][0]["profile"]
    assert [(c["category"], c["share"]) for c in running["categories"]] == [("env", 0.75), ("backward", 0.25)]
    assert by_branch["run/0001"]["runs"][0]["profile"] is None  # a run without a profile
    # the run ends with its profile in the record: shown from there, its reader dropped
    runs.write_record(live, dict(json.load(open(os.path.join(live, runs.RECORD))), status="ok", profile=kept))
    running = {b["name"]: b for b in m.branches()["branches"]}["run/0003"]["runs"][0]["profile"]
    assert running["lines"][0]["code"] == "x = env.step(a)" and m._profiles == {}


def test_series_per_run_with_nonfinite_markers_and_seed_band(proj):
    m = Monitor(proj)
    one = m.series("episodic_return", ["run/0001"])
    (line,) = one["lines"]
    assert line["run"] == "run/0001#1" and line["count"] == 50 and line["nonfinite"] == 2
    assert {mk["value"] for mk in line["markers"]} == {"nan", "inf"}
    assert len(line["x"]) == 48 and all(math.isfinite(y) for y in line["y"])
    assert one["bands"] == []
    timed = m.series("episodic_return", ["run/0001"], axis="time")["lines"][0]
    assert timed["x"][0] == pytest.approx(0.0, abs=1e-6)  # seconds since the run started (its first point)
    two = m.series("episodic_return", ["run/0002"])
    assert len(two["lines"]) == 3
    (band,) = two["bands"]
    assert band["seeds"] == [0, 1, 2] and band["n"] == 3
    grid = np.array(band["x"])
    steps = np.arange(60) * 100.0
    expected = np.array([np.interp(grid, steps, (1 + s * 0.2) * np.log1p(np.arange(60))) for s in (0, 1, 2)])
    np.testing.assert_allclose(band["mean"], expected.mean(axis=0), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(band["lo"], expected.min(axis=0), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(band["hi"], expected.max(axis=0), rtol=1e-9, atol=1e-9)
    json.dumps(two, allow_nan=False)
    names = m.metric_names(["run/0001", "run/0002"])["metrics"]
    assert names["episodic_return"] == {"points": 50 + 180, "runs": 4, "nonfinite": 2}
    assert "losses/value_loss" in names
    with pytest.raises(ApiError):
        m.series("episodic_return", [])
    with pytest.raises(ApiError):
        m.series("episodic_return", ["run/0001"], axis="sideways")


def test_series_read_incrementally_while_a_run_writes(proj, live_pid):
    # a run still writing (live_pid): a lost run's cut last line is read as its last, damaged line
    folder = write_run(proj, "run/0003", status="running", pid=live_pid)
    m = Monitor(proj, runs_ttl=0)
    assert m.series("x", ["run/0003"])["lines"] == []
    now = time.time()
    append_points(folder, [("x", 0, 1.0, now), ("x", 1, 2.0, now)], partial='{"name": "x", "step": 2, "val')
    line = m.series("x", ["run/0003"])["lines"][0]
    assert line["y"] == [1.0, 2.0]  # the half-written line is not read yet
    append_points(folder, [], partial='ue": 3.0, "time": 1}\n')
    assert m.series("x", ["run/0003"])["lines"][0]["y"] == [1.0, 2.0, 3.0]
    mf = m._metrics[os.path.join(folder, runs.METRICS)]
    assert mf.offset == os.path.getsize(os.path.join(folder, runs.METRICS))
    # a malformed line is skipped, the rest of the chunk is kept
    append_points(folder, [], partial='not json\n{"name": "x", "step": 3, "value": 4.0, "time": 2}\n')
    assert m.series("x", ["run/0003"])["lines"][0]["y"] == [1.0, 2.0, 3.0, 4.0]
    # lines that parse but are no metric point (a word for a value, no name, a number for a
    # name, a list) are left out one by one; the good ones of the same chunk are kept
    append_points(folder, [], partial='{"name": "x", "step": 4, "value": "abc", "time": 3}\n{"step": 5, "value": 1}\n'
                  '{"name": 5, "value": 1}\n[1, 2]\n{"name": "x", "step": 6, "value": "-inf", "time": 4}\n'
                  '{"name": "x", "step": 7, "value": 5.0, "time": 5}\n')
    line = m.series("x", ["run/0003"])["lines"][0]
    assert line["y"] == [1.0, 2.0, 3.0, 4.0, 5.0] and line["nonfinite"] == 1 and line["count"] == 6


def test_writer_and_reader_at_once_lose_no_point(proj, live_pid):
    # a run still writing (live_pid): a lost run's cut last line is read as its last, damaged line
    folder = write_run(proj, "run/0003", status="running", pid=live_pid)
    m = Monitor(proj)
    total = 20_000
    done = threading.Event()

    def writer():
        path = os.path.join(folder, runs.METRICS)
        with open(path, "a") as fh:
            for i in range(total):
                line = json.dumps({"name": "v", "step": i, "value": float(i), "time": 1.0 + i}) + "\n"
                cut = random.randint(0, len(line))
                fh.write(line[:cut])
                fh.flush()
                fh.write(line[cut:])
                if i % 500 == 0:
                    fh.flush()
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    seen = 0
    while not done.is_set():
        lines = m.series("v", ["run/0003"])["lines"]
        if lines:
            assert lines[0]["count"] >= seen
            seen = lines[0]["count"]
    thread.join()
    line = m.series("v", ["run/0003"], points=5000)["lines"][0]
    assert line["count"] == total and line["summary"]["min"] == 0.0 and line["summary"]["max"] == total - 1


def test_file_replaced_or_truncated_is_read_again(proj):
    folder = write_run(proj, "run/0003", points=[("x", i, float(i), 1.0) for i in range(10)])
    m = Monitor(proj)
    assert m.series("x", ["run/0003"])["lines"][0]["count"] == 10
    path = os.path.join(folder, runs.METRICS)
    with open(path + ".new", "w") as fh:
        fh.write(json.dumps({"name": "x", "step": 0, "value": 7.0, "time": 1.0}) + "\n")
    os.replace(path + ".new", path)
    assert m.series("x", ["run/0003"])["lines"][0]["y"] == [7.0]


def test_diff_hunks_are_the_cli_diffs(proj):
    m = Monitor(proj)
    data = m.diff("run/0001")
    store = Store.open(proj)
    info = store.resolve("run/0001")
    report = RunReport.from_json(store.report("run/0001"))
    text = diffview.render(report, lambda p: store.read_file(info.source_commit, p), lambda p: store.read_file(info.commit, p))
    (f,) = data["files"]
    assert f["path"] == "train.py" and f["hunks"]
    # the same hunks, labels and lines as `scalebox diff`, rebuilt from the JSON
    rebuilt = []
    for hunk in f["hunks"]:
        rebuilt.append(f"@@ -{hunk['old_start']},{hunk['old_count']} +{hunk['new_start']},{hunk['new_count']} @@")
        rebuilt += [f"#  {s['transform']} [{s['exactness']}] line {s['line']}: {s['reason']}" for s in hunk["sites"]]
        if hunk["note"]:
            rebuilt.append("#  " + hunk["note"])
        rebuilt += [op + line for op, line in hunk["lines"]]
    start = text.splitlines().index("+++ b/train.py") + 1
    assert text.splitlines()[start:start + len(rebuilt)] == rebuilt
    labelled = {s["transform"] for h in f["hunks"] for s in h["sites"]}
    assert "grad_clip" in labelled
    assert all(s["action"] != "rewritten" for s in f["left_alone"])
    assert data["sites_measured"] == [{"path": "train.py", "line": 7, "transform": "vectorize.recurrence", "vectorized": 90, "fallback": 10, "time_s": 0.25, "runs": 1, "pass_rate": 0.9, "fallback_why": []}]
    with pytest.raises(ApiError) as err:
        m.diff("run/0099")
    assert err.value.status == 404


def test_events_newest_first_with_traceback(proj):
    events = Monitor(proj).events()["events"]
    kinds = [e["kind"] for e in events]
    assert {"started", "ended", "failed", "nonfinite", "save_blocked", "rollback"} <= set(kinds)
    times = [e["time"] for e in events]
    assert times == sorted(times, reverse=True)
    failed = next(e for e in events if e["kind"] == "failed")
    assert failed["run"] == "run/0001#2" and failed["error_tail"][-1] == "RuntimeError: boom"
    blocked = next(e for e in events if e["kind"] == "save_blocked")
    assert blocked["scope"] == "project" and "invalid syntax" in blocked["message"]
    assert len(Monitor(proj).events(limit=2)["events"]) == 2


def test_a_project_without_runs_and_a_folder_without_a_store(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    from scalebox_cst.store import StoreError

    with pytest.raises(StoreError):
        Monitor(str(root))
    Store.init(str(root))
    m = Monitor(str(root))
    assert m.branches()["branches"] == [] and m.events()["events"] == []


def test_metrics_cache_is_bounded_in_bytes(proj):
    m = Monitor(proj, cache_bytes=1)
    for branch in ("run/0001", "run/0002"):
        m.series("episodic_return", [branch])
    assert len(m._metrics) == 1
    # an evicted file is read again from its start: same answer
    assert m.series("episodic_return", ["run/0001"])["lines"][0]["count"] == 50


def test_scale_500_branches_and_a_million_point_run(tmp_path):
    """500 branches with runs, one of them a 1M-step run: the list and a series stay quick."""
    root = str(tmp_path / "big")
    os.makedirs(root)
    store = Store.init(root)
    source, _ = store.snapshot({"train.py": b"x = 1\n"}, "snapshot")
    report = {"branch": None, "commit": None, "source_commit": None, "backend": "cpu",
              "files": [{"path": "train.py", "status": "rewritten", "error": None,
                         "sites": [{"transform": "grad_clip", "line": 1, "end_line": 1, "action": "rewritten", "reason": "r", "exactness": "changes-semantics"}]}]}
    now = time.time()
    for i in range(500):
        name, _ = store.commit_rewrite(source, {"train.py": b"x = %d\n" % i}, "rewrite", "", report, "fp")
        write_run(root, name, points=curve("episodic_return", 20, now - 100), headline={"episodic_return_final": float(i)})
    big = write_run(root, "run/0500", status="ok")
    with open(os.path.join(big, runs.METRICS), "w") as fh:
        for i in range(1_000_000):
            fh.write('{"name": "episodic_return", "step": %d, "value": %r, "time": %r}\n' % (i, math.sin(i / 1e4), now + i / 1e3))
    m = Monitor(root)
    t0 = time.perf_counter()
    data = m.branches()
    first_list = time.perf_counter() - t0
    t0 = time.perf_counter()
    m.branches()
    again = time.perf_counter() - t0
    assert len(data["branches"]) == 500
    t0 = time.perf_counter()
    out = m.series("episodic_return", ["run/0500"])
    first_series = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = m.series("episodic_return", ["run/0500"])
    again_series = time.perf_counter() - t0
    line = next(l for l in out["lines"] if l["count"] == 1_000_000)
    assert len(line["x"]) <= 1002
    assert len(json.dumps(out)) < 200_000
    print(f"\nbranches: first {first_list:.3f}s, again {again:.3f}s; 1M-point series: first read {first_series:.2f}s, again {again_series:.4f}s")
    assert again < 2.0 and again_series < 0.5  # generous: two shared cores


# ------------------------------------------------------------------------------ HTTP
@pytest.fixture
def server(proj):
    srv = MonitorServer(Monitor(proj, refresh_interval=0.5, runs_ttl=0), port=0)
    srv.start_background()
    yield srv
    srv.shutdown()
    srv.server_close()


def get(server, path, headers=None):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("GET", path, headers=headers or {})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, dict(resp.getheaders()), body


def raw_get(server, path):
    """The bytes a GET on a connection of its own gets back until the server closes it (a 503 is
    closed at once; a reset after it counts as the end)."""
    import socket

    sock = socket.create_connection(server.server_address[:2], timeout=30)
    sock.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    reply = b""
    try:
        while chunk := sock.recv(1000):
            reply += chunk
    except ConnectionResetError:
        pass
    sock.close()
    return reply


def test_http_routes_answer_json(server):
    status, headers, body = get(server, "/api/project")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body)["refresh_interval"] == 0.5
    status, _, body = get(server, "/api/branches")
    assert [b["name"] for b in json.loads(body)["branches"]] == ["run/0001", "run/0002", "run/0003"]
    status, _, body = get(server, "/api/series?metric=episodic_return&branch=run/0001,run/0002&points=100")
    data = json.loads(body)
    assert status == 200 and len(data["lines"]) == 4 and len(data["bands"]) == 1
    status, _, body = get(server, "/api/series?metric=episodic_return&branch=run/0001&branch=run/0002&axis=time")
    assert status == 200 and len(json.loads(body)["lines"]) == 4
    status, _, body = get(server, "/api/series?metric=episodic_return&run=run/0002%232")
    assert [l["run"] for l in json.loads(body)["lines"]] == ["run/0002#2"]
    status, _, body = get(server, "/api/runs?branch=run/0002")
    assert [r["seed"] for r in json.loads(body)["runs"]] == [0, 1, 2]
    status, _, body = get(server, "/api/metrics?branch=run/0001")
    assert set(json.loads(body)["metrics"]) == {"episodic_return", "losses/value_loss"}
    status, _, body = get(server, "/api/diff?branch=run/0001")
    assert status == 200 and json.loads(body)["files"][0]["hunks"]
    status, _, body = get(server, "/api/sites?branch=run/0001")
    assert json.loads(body)["sites"][0]["pass_rate"] == 0.9
    status, _, body = get(server, "/api/events?limit=3")
    assert len(json.loads(body)["events"]) == 3


def test_http_errors_are_json_one_liners(server):
    for path, code in [("/api/series?branch=run/0001", 400), ("/api/series?metric=x", 400),
                       ("/api/series?metric=x&branch=run/0001&points=many", 400), ("/api/diff?branch=run/0042", 404),
                       ("/api/runs", 400)]:
        status, _, body = get(server, path)
        assert status == code, path
        assert json.loads(body)["error"]


def test_http_etag_gives_304_when_nothing_changed(server, proj):
    status, headers, _ = get(server, "/api/branches")
    etag = headers["ETag"]
    status, _, body = get(server, "/api/branches", {"If-None-Match": etag})
    assert status == 304 and body == b""
    write_run(proj, "run/0003", points=curve("episodic_return", 3, time.time()))
    status, headers, _ = get(server, "/api/branches", {"If-None-Match": etag})
    assert status == 200 and headers["ETag"] != etag


def test_http_serves_only_the_allow_list(server, proj):
    for path in STATIC:
        status, _, body = get(server, path)
        assert status == 200 and body, path
    status, headers, body = get(server, "/vendor/uPlot.iife.min.js")
    assert headers["Content-Type"].startswith("text/javascript") and b"uPlot" in body[:200]
    secret = os.path.join(proj, "train.py")
    for path in ["/../../../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/static/app.js", "/app.js/", "/vendor/",
                 "/vendor/../app.js", "/api/", "/api/branches/", "/api/nope", "/train.py", "/.scalebox/store.git/HEAD",
                 "//etc/passwd", "/" + secret, "/index.html%00", "/vendor/uPlot.LICENSE/../../api.py"]:
        status, _, body = get(server, path)
        assert status == 404, path
        assert body == b"not found\n"


def test_http_refuses_foreign_host_headers_on_loopback(server):
    port = server.server_address[1]
    assert get(server, "/api/project", {"Host": f"localhost:{port}"})[0] == 200
    assert get(server, "/api/project", {"Host": f"[::1]:{port}"})[0] == 200
    assert get(server, "/api/project", {"Host": f"evil.example:{port}"})[0] == 403


def test_http_host_check_stays_on_for_a_public_bind(proj):
    """--host 0.0.0.0 turned the Host check off: DNS rebinding could read diffs and tracebacks."""
    srv = MonitorServer(Monitor(proj), host="0.0.0.0", port=0, allow_hosts=["GPU-Box.lan"])
    srv.start_background()
    try:
        port = srv.server_address[1]
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", f"gpu-box.lan:{port}", "gpu-box.lan.", "GPU-BOX.LAN"):
            assert get(srv, "/api/project", {"Host": host})[0] == 200, host
        for host in (f"evil.example:{port}", f"127.0.0.1.evil.example:{port}", "10.20.30.40", ""):
            status, _, body = get(srv, "/api/project", {"Host": host})
            assert status == 403, host
        assert body.startswith(b"forbidden host") and b"--allow-host" in get(srv, "/", {"Host": "evil.example"})[2]
    finally:
        srv.shutdown()
        srv.server_close()


def test_host_check_names_and_addresses():
    from scalebox_cst.monitor.access import HostCheck, HostError, checked_name, exposure_warning

    wild = HostCheck("0.0.0.0")
    assert wild.allows("192.168.1.5:8080", "192.168.1.5")  # the address the connection came in on
    assert wild.allows("192.168.1.5", "::ffff:192.168.1.5")  # (as a "::" socket names it)
    assert not wild.allows("192.168.1.6:8080", "192.168.1.5")
    assert not wild.allows("rebound.example:8080", "192.168.1.5")
    lan = HostCheck("192.168.1.5", ["box", "10.0.0.7"])
    assert lan.allows("192.168.1.5:80", "192.168.1.5") and lan.allows("box") and lan.allows("10.0.0.7:1")
    assert lan.allows("localhost") and not lan.allows("192.168.1.6", "192.168.1.6")
    v6 = HostCheck("::")
    assert v6.allows("[fe80::1]:8080", "fe80::1") and not v6.allows("[fe80::2]:8080", "fe80::1")
    assert HostCheck("myhost").allows("myhost:8080") and not HostCheck("myhost").allows("other:8080")
    for bad in ("", "a b", "http://x", "x/y", "*"):
        with pytest.raises(HostError):
            checked_name(bad)
    assert checked_name("[::1]") == "::1"
    assert exposure_warning("127.0.0.1", 8080) is None and exposure_warning("::1", 8080) is None
    text = exposure_warning("0.0.0.0", 8080, ["box"])
    assert "8080" in text and "tracebacks" in text and "diffs" in text and "box" in text and "\n" not in text


def _handler_threads():
    return sum(1 for t in threading.enumerate() if "process_request_thread" in t.name)


def test_http_half_open_connections_hold_bounded_threads_for_bounded_time(proj):
    """600 half-open requests held 600 threads, for ever."""
    import select
    import socket

    srv = MonitorServer(Monitor(proj), port=0, max_connections=8, request_timeout=5.0)
    srv.start_background()
    socks = []
    try:
        for _ in range(60):
            sock = socket.create_connection(srv.server_address[:2], timeout=30)
            sock.sendall(b"GET /api/project HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never ends its head
            socks.append(sock)
        closed, waiting, deadline = [], list(socks), time.monotonic() + 4.0
        while len(closed) < 52 and time.monotonic() < deadline:  # the oldest make room for the newest
            for sock in select.select(waiting, [], [], 0.2)[0]:
                try:
                    closed.append(sock.recv(1000))
                except ConnectionResetError:
                    closed.append(b"")
                waiting.remove(sock)
        assert closed == [b""] * 52 and _handler_threads() <= 8  # closed unanswered
        assert waiting == socks[-8:]
        # a client that sends its request is answered at once, though every thread was taken
        status, _, body = get(srv, "/api/project")
        assert status == 200 and json.loads(body)["root"]
        assert _handler_threads() <= 8
        for sock in waiting:  # the rest: closed at their deadline (or to make room), no answer
            assert sock.recv(1000) == b""
    finally:
        for sock in socks:
            sock.close()
        srv.shutdown()
        srv.server_close()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads the server's CPU time from /proc")
def test_http_out_of_descriptors_answers_503_without_spinning(proj):
    """With ``ulimit -n 40`` and 120 clients, ``accept`` failed with EMFILE and the connection
    stayed in the backlog: the listening socket stayed readable and the monitor called ``accept``
    again at once, one core at 100% until a descriptor was free (the fourth fault campaign)."""
    import select
    import socket
    import subprocess
    import sys

    code = textwrap.dedent(f"""\
        import resource, sys
        from scalebox_cst.monitor.api import Monitor
        from scalebox_cst.monitor.server import MonitorServer
        resource.setrlimit(resource.RLIMIT_NOFILE, (40, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        srv = MonitorServer(Monitor({str(proj)!r}), port=0)
        print(srv.server_address[1], flush=True)
        srv.serve_forever()
        """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    socks = []
    try:
        port = int(child.stdout.readline())
        refused = 0
        for _ in range(120):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET /api/project HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # a head not ended
            socks.append(sock)
        time.sleep(1.0)

        def cpu() -> float:
            with open(f"/proc/{child.pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        before = cpu()
        time.sleep(2.0)
        assert cpu() - before < 0.5  # not spinning on accept
        for sock in select.select(socks, [], [], 0.5)[0]:
            try:
                refused += sock.recv(1000).startswith(b"HTTP/1.1 503")
            except OSError:
                pass
        assert refused  # those it could not take were told so
        for sock in socks:
            sock.close()
        socks = []
        time.sleep(0.5)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/api/project")
        assert conn.getresponse().status == 200  # and it serves again once descriptors are free
        conn.close()
    finally:
        for sock in socks:
            sock.close()
        child.kill()
        child.wait()


def test_http_busy_threads_answer_503_at_once(proj, monkeypatch):
    """Only when every thread is busy answering is a new connection turned away (503, closed)."""
    from scalebox_cst.monitor import server as server_mod

    gate, entered = threading.Event(), threading.Semaphore(0)

    def slow(m, q):
        entered.release()
        gate.wait(30)
        return {"ok": True}

    monkeypatch.setitem(server_mod.ROUTES, "/api/slow", slow)
    srv = MonitorServer(Monitor(proj), port=0, max_connections=2, request_timeout=30.0)
    srv.start_background()
    results = []
    busy = [threading.Thread(target=lambda: results.append(get(srv, "/api/slow")[0])) for _ in range(2)]
    try:
        for t in busy:
            t.start()
        for _ in busy:
            assert entered.acquire(timeout=30)
        reply = raw_get(srv, "/api/project")
        assert reply.startswith(b"HTTP/1.1 503 "), reply
        gate.set()
        for t in busy:
            t.join(30)
        assert results == [200, 200]
        assert get(srv, "/api/project")[0] == 200
    finally:
        gate.set()
        srv.shutdown()
        srv.server_close()


def test_http_a_trickled_request_ends_at_its_deadline(proj):
    """A client sending a byte at a time got a fresh socket timeout per byte: no deadline at all."""
    import socket

    srv = MonitorServer(Monitor(proj), port=0, request_timeout=1.0)
    srv.start_background()
    sock = socket.create_connection(srv.server_address[:2], timeout=30)
    try:
        request = b"GET /api/project HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"x" * 40 + b"\r\n\r\n"
        closed = False
        for byte in request:  # ~7 s in all; the server gives the whole head 1 s
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.1)
        if not closed:
            try:
                closed = sock.recv(1000) == b""
            except ConnectionResetError:
                closed = True
        assert closed
        # a kept-alive connection polls as the page does: answers, 304s, in time
        conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=30)
        conn.request("GET", "/api/branches")
        resp = conn.getresponse()
        etag = resp.getheader("ETag")
        assert resp.status == 200 and resp.read()
        for _ in range(3):
            conn.request("GET", "/api/branches", headers={"If-None-Match": etag})
            resp = conn.getresponse()
            assert resp.status == 304 and resp.read() == b""
        conn.close()
    finally:
        sock.close()
        srv.shutdown()
        srv.server_close()


def test_page_needs_nothing_from_the_network(server):
    _, _, html = get(server, "/")
    text = html.decode()
    assert "http://" not in text and "https://" not in text
    for ref in ("/vendor/uPlot.iife.min.js", "/vendor/uPlot.min.css", "/app.js", "/style.css"):
        assert ref in text and ref in STATIC
    _, _, js = get(server, "/app.js")
    assert b"http://" not in js and b"https://" not in js


def test_two_monitors_on_one_project(proj):
    a = MonitorServer(Monitor(proj), port=0)
    b = MonitorServer(Monitor(proj), port=0)
    for srv in (a, b):
        srv.start_background()
    try:
        bodies = [urllib.request.urlopen(srv.url + "api/branches", timeout=30).read() for srv in (a, b)]
        assert json.loads(bodies[0])["branches"] == json.loads(bodies[1])["branches"]
    finally:
        for srv in (a, b):
            srv.shutdown()
            srv.server_close()


def _stop_with_sigterm(proc) -> None:
    """SIGTERM stops the monitor with status 0; one that does not stop is killed (no process left)."""
    import signal

    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_monitor_serves_and_stops_on_sigterm(proj):
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "from scalebox_cst.cli import main; main()", "monitor", proj, "--web-port", "0", "--refresh-interval", "1"],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert "monitor of" in line and "http://127.0.0.1:" in line, line
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        data = json.loads(urllib.request.urlopen(url + "api/project", timeout=30).read())
        assert data["root"] == os.path.realpath(proj) or data["root"] == os.path.abspath(proj)
        assert data["refresh_interval"] == 1.0
    finally:
        _stop_with_sigterm(proc)



def test_an_interrupt_while_a_request_thread_starts_is_not_lost(proj, monkeypatch):
    """SIGTERM (the monitor's KeyboardInterrupt) in ``Thread.start``, after the new thread served
    its request and freed its slot: the interrupt reaches serve_forever's caller. The server freed
    the slot a second time, and the ValueError raised in its place was reported and served on:
    the monitor ran until a second SIGTERM (CI: a monitor alive 6 minutes after the first)."""
    import socket
    import socketserver

    real = socketserver.ThreadingMixIn.process_request
    started = []

    def start_then_interrupted(self, request, client_address):
        real(self, request, client_address)
        started.append(True)
        for t in threading.enumerate():  # the request thread ends (its slot freed) before the signal
            if "process_request_thread" in t.name:
                t.join(10)
        raise KeyboardInterrupt

    srv = MonitorServer(Monitor(proj), port=0, max_connections=2)
    monkeypatch.setattr(socketserver.ThreadingMixIn, "process_request", start_then_interrupted)
    client = socket.create_connection(srv.server_address[:2], timeout=10)
    try:
        client.sendall(b"GET /api/project HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        request, address = srv.get_request()
        with pytest.raises(KeyboardInterrupt):
            srv.process_request(request, address)
        assert started
        assert b"200 OK" in client.recv(65536)
        for _ in range(2):  # both slots free: the one the thread used was released once
            assert srv._slots.acquire(blocking=False)
        assert not srv._slots.acquire(blocking=False)
    finally:
        client.close()
        srv.server_close()


def test_cli_monitor_on_a_public_address_warns_and_checks_hosts(proj):
    import subprocess
    import sys

    cmd = [sys.executable, "-c", "from scalebox_cst.cli import main; main()", "monitor", proj, "--web-port", "0", "--host", "0.0.0.0", "--allow-host", "box.lan"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        line, warning = proc.stderr.readline(), proc.stderr.readline()
        port = int(line.split(" on http://0.0.0.0:", 1)[1].split("/", 1)[0])
        assert warning.startswith("scalebox: warning:") and f"port {port}" in warning and "anyone" in warning
        assert "source diffs" in warning and "tracebacks" in warning and "box.lan" in warning and "--allow-host" in warning
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for host, status in (("box.lan", 200), (f"localhost:{port}", 200), ("evil.example", 403)):
            conn.request("GET", "/api/project", headers={"Host": host})
            resp = conn.getresponse()
            resp.read()
            assert resp.status == status, host
        conn.close()
    finally:
        _stop_with_sigterm(proc)
    out = subprocess.run(cmd[:-1] + ["not a/name"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "--allow-host 'not a/name'" in out.stderr


def test_cli_monitor_one_line_errors(tmp_path, proj):
    import subprocess
    import sys

    bare = tmp_path / "bare"
    bare.mkdir()
    out = subprocess.run([sys.executable, "-c", "from scalebox_cst.cli import main; main()", "monitor", str(bare)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "scalebox init" in out.stderr
    srv = MonitorServer(Monitor(proj), port=0)
    try:
        port = srv.server_address[1]
        out = subprocess.run([sys.executable, "-c", "from scalebox_cst.cli import main; main()", "monitor", proj, "--web-port", str(port)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and out.stderr.count("\n") == 1 and "cannot listen" in out.stderr
    finally:
        srv.server_close()


def test_an_import_hook_session_is_a_branch_with_its_diff(project):
    """`python -m scalebox_cst train.py` commits a hook/<session> branch: listed, and diffed."""
    import subprocess
    import sys

    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("SCALEBOX_HOOK_SESSION", None)
    subprocess.run([sys.executable, "-m", "scalebox_cst", "train.py", "--steps", "1"], cwd=project, env=env, check=True, capture_output=True)
    m = Monitor(str(project))
    (hook,) = m.branches()["branches"]
    assert hook["kind"] == "hook" and hook["name"].startswith("hook/") and hook["commits"] >= 1
    assert hook["status"] == "not run"
    data = m.diff(hook["name"])
    (f,) = data["files"]
    assert f["path"] == "train.py"
    assert any(s["transform"] == "grad_clip" for h in f["hunks"] for s in h["sites"])
    assert any(op == "+" and "_scalebox_stabilize(optimizer" in line for h in f["hunks"] for op, line in h["lines"])


def _strict(body):
    """JSON as a browser's JSON.parse reads it: NaN and Infinity are not JSON."""
    def refuse(name):
        raise AssertionError(f"{name} in an answer")
    return json.loads(body, parse_constant=refuse)


@pytest.mark.parametrize("started", ["NaN", "Infinity", '"x"', "[1]", "true"])
def test_a_record_with_a_wrong_typed_number_reads_as_missing_everywhere(proj, started):
    folder = write_run(proj, "run/0003")
    path = os.path.join(folder, runs.RECORD)
    text = open(path).read()
    record = json.loads(text)
    text = text.replace(json.dumps(record["started"]), started, 1)
    assert started in text
    with open(path, "w") as fh:
        fh.write(text.replace(f'"wall_time": {json.dumps(record["wall_time"])}', '"wall_time": NaN'))
    assert runs.load_record(folder)["started"] is None and runs.load_record(folder)["wall_time"] is None
    srv = MonitorServer(Monitor(proj, refresh_interval=0.5, runs_ttl=0), port=0)
    srv.start_background()
    try:
        for route in ("/api/branches", "/api/runs?branch=run/0003"):
            status, _, body = get(srv, route)
            assert status == 200, (route, body)
            _strict(body)
    finally:
        srv.shutdown()
        srv.server_close()
    for args in (("log",), ("profile", "run/0003"), ("log", "--json")):
        proc = scalebox(*args, cwd=proj, check=False)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        assert proc.returncode in (0, 1) and len(proc.stderr.strip().splitlines()) <= 1, (args, proc.stderr)


def test_non_finite_values_are_strings_in_answers_and_refused_as_options(proj):
    srv = MonitorServer(Monitor(proj, refresh_interval=float("nan"), runs_ttl=0), port=0)
    srv.start_background()
    try:
        status, _, body = get(srv, "/api/project")
        assert status == 200 and _strict(body)["refresh_interval"] == "nan"
    finally:
        srv.shutdown()
        srv.server_close()
    for value in ("nan", "inf", "-inf", "1e9"):
        proc = scalebox("monitor", proj, "--refresh-interval", value, "--web-port", "0", check=False, timeout=20)
        assert proc.returncode == 2 and "Invalid value for '--refresh-interval'" in proc.stderr, (value, proc.stderr)


def test_a_sites_reasons_add_up_over_the_branchs_runs(proj):
    """The per-site table adds a site's rows over the branch's runs as a run's headline adds its
    sites (site_counts.totals): counts, time and the reasons why it fell back."""
    why = "per-step inputs of dtype float16: only float32 and float64 are vectorized"
    for whys in ([[why, 3], ["fewer than 2 steps", 1]], [[why, 2]]):
        write_run(proj, "run/0001", sites=[{"path": "train.py", "line": 7, "transform": "vectorize.recurrence",
                                            "vectorized": 1, "fallback": sum(n for _, n in whys), "time_s": 0.5,
                                            "fallback_why": whys}])
    [site] = [s for s in Monitor(proj).sites("run/0001")["sites"] if s["line"] == 7 and s["runs"] == 3]
    assert (site["vectorized"], site["fallback"], site["time_s"]) == (92, 16, 1.25)
    assert site["fallback_why"] == [[why, 5], ["fewer than 2 steps", 1]]


def test_http_replies_are_not_held_back_by_nagles_algorithm(server, monkeypatch):
    """A reply is two writes (headers, then body); with Nagle's algorithm on the connection, the
    body waited for the client's delayed ACK: ~44 ms per request on a kept-alive connection, the
    page's polls included (the leak campaign measured it; 0.4 ms with TCP_NODELAY)."""
    import socket

    from scalebox_cst.monitor import server as server_mod

    seen = []
    setup = server_mod.Handler.setup

    def recording(self):
        setup(self)
        seen.append(self.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    monkeypatch.setattr(server_mod.Handler, "setup", recording)
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        for path in ("/api/project", "/api/branches"):  # one kept-alive connection
            conn.request("GET", path)
            resp = conn.getresponse()
            assert resp.status == 200 and resp.read()
    finally:
        conn.close()
    assert len(seen) == 1 and seen[0] != 0


def test_live_headline_of_a_run_that_trains_in_workers_and_evaluates_in_its_own_process(proj, live_pid):
    """As a finished run's (runs.headline): BY571's IQN evaluates in the main process (few steps)
    and trains in a worker; the live return and steps/s are the worker's and every env's."""
    now = time.time() - 10
    own = [("scalebox/episodic_return", 9 * (i + 1), 9.0, now + 2 * i) for i in range(3)]
    sps = [("scalebox/SPS", 9, 18.0, now + 0.5), ("scalebox/SPS", 27, 7.0, now + 4)]
    work = [("scalebox/workers/1/episodic_return", 100 * i, 20.0 + i, now + 0.4 * i) for i in range(1, 11)]
    write_run(proj, "run/0005", status="running", pid=live_pid, points=own + sps + work)
    m = Monitor(proj, runs_ttl=0)
    head = {b["name"]: b for b in m.branches()["branches"]}["run/0005"]["runs"][0]["headline"]
    final = runs.headline({}, runs.read_series(runs.list_runs(proj, branch="run/0005")[0].dir))
    assert head["metric_return"] == final["metric_return"] == "scalebox/workers/*/episodic_return"
    assert head["sps"] == pytest.approx(final["sps"]) and head["sps"] > 100


def test_http_a_client_asking_again_at_once_is_not_told_busy(proj, monkeypatch):
    """A thread that has written its answer is on its way to free its slot: a new connection waits
    for it. CI saw a 503 for a client that had its answer and asked again at once (the thread had
    not yet come back to wait for a next request); made certain here by a slow way out."""
    from scalebox_cst.monitor import server as server_mod

    original = server_mod.Handler.handle_one_request

    def slow_way_out(self):
        original(self)
        if not self.close_connection:  # answered, on its way to wait for a next request
            time.sleep(0.3)

    monkeypatch.setattr(server_mod.Handler, "handle_one_request", slow_way_out)
    srv = MonitorServer(Monitor(proj), port=0, max_connections=1, request_timeout=30.0)
    srv.start_background()
    try:
        assert [get(srv, "/api/project")[0] for _ in range(3)] == [200, 200, 200]
    finally:
        srv.shutdown()
        srv.server_close()


def test_http_threads_stuck_writing_cost_one_wait_then_503s_at_once(proj, monkeypatch):
    """A thread writing its answer to a client that does not read is not working out an answer, so
    a new connection waits for it (as for a thread on its way out); once such a wait runs out, the
    next connections are told 503 at once until a slot is free, not after a second each."""
    import socket

    from scalebox_cst.monitor import server as server_mod

    asked = threading.Event()

    def big(m, q):
        asked.set()
        return {"x": "y" * (64 << 20)}

    monkeypatch.setitem(server_mod.ROUTES, "/api/big", big)
    srv = MonitorServer(Monitor(proj), port=0, max_connections=1, request_timeout=30.0)
    srv.start_background()
    reader = socket.create_connection(srv.server_address[:2], timeout=30)
    try:
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.sendall(b"GET /api/big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert asked.wait(30)
        deadline = time.monotonic() + 60
        while srv._answering and time.monotonic() < deadline:  # its answer made: it blocks writing it
            time.sleep(0.01)
        time.sleep(0.2)
        waits = []
        for _ in range(3):
            t0 = time.monotonic()
            reply = raw_get(srv, "/api/project")
            waits.append(time.monotonic() - t0)
            assert reply.startswith(b"HTTP/1.1 503 "), reply[:80]
        assert 0.9 < waits[0] < 10 and max(waits[1:]) < 0.5, waits
    finally:
        reader.close()
        srv.shutdown()
        srv.server_close()


def test_a_request_line_urllib_cannot_split_is_a_400_not_a_traceback(server, capfd):
    """``GET http://[::1/x``: urlsplit raised ValueError ("Invalid IPv6 URL") out of the handler,
    the client got no answer and the monitor's terminal a traceback per such request."""
    reply = raw_get(server, "http://[::1/x")
    assert reply.startswith(b"HTTP/1.0 400") or reply.startswith(b"HTTP/1.1 400"), reply[:80]
    assert get(server, "/api/project")[0] == 200
    assert "Traceback" not in capfd.readouterr().err
