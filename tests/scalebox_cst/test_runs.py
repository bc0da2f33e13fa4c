"""Run records (issue 10, host side): the reader library, compare's statistics, and the CLI's
run/log/compare/status/diff as a user drives them: runs never overwritten, --original, --seeds,
--parallel, signals that leave no process behind, tracebacks in the user's lines, TensorBoard.

Most scripts here import no torch, so a run costs about a second on a loaded machine.
"""
import json
import math
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import scalebox
import harness
from scalebox_cst import compare as stats
from scalebox_cst import runs

CLI = [sys.executable, "-c", "from scalebox_cst.cli import main; main()"]


# ----------------------------------------------------------------------------- reader library
def _line(name, step, value, t=1.0):
    return json.dumps({"name": name, "step": step, "value": value, "time": t}) + "\n"


def test_read_metrics_resumes_at_offsets_and_skips_a_partial_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(_line("a", 0, 1.5) + _line("b", 3, "nan") + '{"name": "a", "st')
    points, offset = runs.read_metrics(str(path))
    assert [(p.name, p.step) for p in points] == [("a", 0), ("b", 3)]
    assert points[0].value == 1.5 and math.isnan(points[1].value)
    assert offset == len((_line("a", 0, 1.5) + _line("b", 3, "nan")).encode())
    with open(path, "a") as fh:  # the writer finishes its line and adds more
        fh.write('ep": 1, "value": "inf", "time": 2}\n' + "not json\n" + _line("c", 2, "-inf"))
    more, offset2 = runs.read_metrics(str(path), offset)
    assert [(p.name, p.value) for p in more] == [("a", math.inf), ("c", -math.inf)]
    assert offset2 == path.stat().st_size
    assert runs.read_metrics(str(path), offset2) == ([], offset2)
    assert runs.read_metrics(str(tmp_path / "absent.jsonl"), 7) == ([], 7)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**6, 10**6)), min_size=1, max_size=20),
    cuts=st.lists(st.integers(0, 2000), max_size=6),
)
def test_reading_while_written_sees_each_point_once(tmp_path_factory, values, cuts):
    """However the writes are cut, a reader polling from its offset sees every point exactly once."""
    path = tmp_path_factory.mktemp("m") / "metrics.jsonl"
    text = "".join(
        _line("x", i, v if isinstance(v, int) or math.isfinite(v) else str(v)) for i, v in enumerate(values)
    ).encode()
    bounds = sorted({min(c, len(text)) for c in cuts} | {len(text)})
    seen, offset, written = [], 0, 0
    for bound in bounds:
        with open(path, "ab") as fh:
            fh.write(text[written:bound])
        written = bound
        points, offset = runs.read_metrics(str(path), offset)
        seen.extend(points)
    assert [p.step for p in seen] == list(range(len(values)))
    for p, v in zip(seen, values):
        assert (math.isnan(p.value) and math.isnan(v)) or p.value == float(v)


def test_events_reader_and_appender(tmp_path):
    path = str(tmp_path / "runs" / "events.jsonl")
    runs.append_event(path, "branch_created", "run/0002: 1 file(s)", branch="run/0002")
    runs.append_event(path, "save_blocked", "t.py:3: SyntaxError")
    events, offset = runs.read_events(path)
    assert [e["kind"] for e in events] == ["branch_created", "save_blocked"]
    assert events[0]["branch"] == "run/0002" and events[0]["time"] > 0
    assert runs.read_events(path, offset) == ([], offset)


def test_allocate_run_gives_each_caller_its_own_number(tmp_path):
    got = []
    threads = [threading.Thread(target=lambda: got.append(runs.allocate_run(str(tmp_path), "run/0001")[0])) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 17))
    assert runs.allocate_run(str(tmp_path), "run/0001")[0] == 17


def _record(tmp_path, branch, number, **fields):
    directory = runs.run_dir(str(tmp_path), branch, number)
    os.makedirs(directory, exist_ok=True)
    runs.write_record(directory, {"branch": branch, "run": number, "status": "running", **fields})
    return directory


def test_a_running_record_whose_process_is_gone_reads_as_lost(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _record(tmp_path, "run/0001", 1, pid=dead.pid, host=os.uname().nodename)
    # a live pid that is not a scalebox run (a reused pid) is not our run either
    _record(tmp_path, "run/0001", 2, pid=os.getpid(), host=os.uname().nodename)
    _record(tmp_path, "run/0001", 3, pid=dead.pid, status="ok", exit_status=0)
    _record(tmp_path, "run/0002", 1, pid=dead.pid, host="some-other-host")
    found = {r.id: r.status for r in runs.list_runs(str(tmp_path))}
    assert found == {"run/0001#1": "lost", "run/0001#2": "lost", "run/0001#3": "ok", "run/0002#1": "running"}
    assert [r.id for r in runs.list_runs(str(tmp_path), "run/0002")] == ["run/0002#1"]


@pytest.mark.parametrize("text", ['{"branch": "run/0001", "run": ', "[1, 2]", "\udcff", "fifo"])
def test_a_damaged_record_reads_as_lost_saying_so_and_log_shows_it(plain, text):
    """Found by the fifth fault campaign: a record.json cut short (or not an object) made its run
    vanish from ``log``, ``compare`` and the monitor ("no run run/0001#1")."""
    scalebox("run", "train.py", cwd=plain)
    (run,) = runs.list_runs(str(plain))
    if text == "fifo":
        os.remove(os.path.join(run.dir, runs.RECORD))
        os.mkfifo(os.path.join(run.dir, runs.RECORD))
    else:
        with open(os.path.join(run.dir, runs.RECORD), "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write(text)
    (damaged,) = runs.list_runs(str(plain))
    assert damaged.id == run.id and damaged.status == "lost"
    assert damaged.record["stop_reason"].startswith("its record.json is damaged (")
    out = scalebox("log", cwd=plain).stdout
    line = next(x for x in out.splitlines() if x.strip().startswith("#1"))
    assert "lost" in line and "its record.json is damaged" in line


def test_headline_windows_and_guard_rate():
    series = {
        "episodic_return": [runs.Point("episodic_return", i, float(v), 0.0) for i, v in enumerate(range(1, 21))],
        "SPS": [runs.Point("SPS", i, v, 0.0) for i, v in enumerate([10.0, 100.0, 200.0, 300.0])],
        "grad_norm": [runs.Point("grad_norm", 0, 1.0, 0.0), runs.Point("grad_norm", 1, math.nan, 0.0)],
    }
    sites = [{"vectorized": 9, "fallback": 1, "time_s": 0.5}, {"vectorized": 0, "fallback": 0, "time_s": 0.25}]
    head = runs.headline({"wall_time": 3.0}, series, sites)
    assert head["episodic_return_final"] == pytest.approx(sum(range(11, 21)) / 10)  # last 10 episodes
    assert head["episodic_return_best"] == head["episodic_return_final"]  # rising: the best window is the last
    assert head["episodes"] == 20 and head["sps"] == 250.0  # median of the second half (warm-up left out)
    assert head["guard_pass_rate"] == 0.9 and head["site_time_s"] == 0.75
    assert head["nonfinite"] == 1 and head["wall_time"] == 3.0
    assert head["site_samples"] is None  # sites written without sample counts: unknown, not zero
    falling = {"episodic_return": [runs.Point("episodic_return", i, float(-i), 0.0) for i in range(30)]}
    head = runs.headline({}, falling)
    assert head["episodic_return_best"] == pytest.approx(-4.5) and head["episodic_return_final"] == pytest.approx(-24.5)
    assert head["guard_pass_rate"] is None and head["sps"] is None


def _series(*items):
    out = {}
    for name, values in items:
        out[name] = [runs.Point(name, i, float(v), float(i)) for i, v in enumerate(values)]
    return out


def test_headline_reads_the_engines_series_and_names_the_scripts_own():
    """Issue 20: the script's own grad_norm / episodic_return / SPS tags shared a series with the
    engine's; the headline showed whichever came last."""
    series = _series(("scalebox/episodic_return", [10, 20]), ("episodic_return", [999, 999]),
                     ("SPS", [1, 1]), ("scalebox/grad_norm_clipped", [0.5, 0.5]), ("grad_norm", [0.5]))
    # the engine's x counts env steps: 100 a second
    series["scalebox/SPS"] = [runs.Point("scalebox/SPS", 100 * i, 100.0, float(i)) for i in (1, 2)]
    head = runs.headline({}, series)
    assert head["metric_return"] == "scalebox/episodic_return" and head["episodic_return_final"] == 15.0
    assert head["sps"] == 100.0 and head["metric_sps"] == "scalebox/SPS"
    # only the clipped norm is known: shown, and named as clipped; the script's tag is never read
    assert (head["grad_norm_last"], head["grad_norm_metric"]) == (0.5, "scalebox/grad_norm_clipped")
    series.update(_series(("scalebox/grad_norm_preclip", [3.0, 4.0]), ("scalebox/grad_norm", [2.0])))
    head = runs.headline({}, series)
    assert (head["grad_norm_last"], head["grad_norm_metric"]) == (4.0, "scalebox/grad_norm_preclip")
    assert runs.grad_norm_fact(head) == ["grad_norm_preclip=4"]
    # an original run with no guard: the script's grad_norm is not the engine's
    head = runs.headline({}, _series(("scalebox/wall_time", [1.0]), ("grad_norm", [0.5]), ("episodic_return", [7.0])))
    assert head["grad_norm_last"] is None and runs.grad_norm_fact(head) == []
    assert head["metric_return"] == "episodic_return"  # no env observed: the script's own, by its name
    # a record written before the namespace: its bare names were the engine's
    old = runs.headline({}, _series(("grad_norm", [1.5]), ("SPS", [5.0]), ("episodic_return", [1.0])))
    assert (old["grad_norm_last"], old["grad_norm_metric"], old["sps"], old["episodes"]) == (1.5, "grad_norm", 5.0, 1)
    # ... but not a run of today with telemetry off and no guard: its grad_norm is the script's
    assert runs.headline({"engine_prefix": "scalebox/"}, _series(("grad_norm", [1.5])))["grad_norm_last"] is None


def test_headline_return_of_envs_stepped_in_worker_processes():
    series = {
        "scalebox/workers/1/episodic_return": [runs.Point("scalebox/workers/1/episodic_return", 10, 1.0, 1.0),
                                               runs.Point("scalebox/workers/1/episodic_return", 20, 3.0, 3.0)],
        "scalebox/workers/2/episodic_return": [runs.Point("scalebox/workers/2/episodic_return", 10, 2.0, 2.0)],
        "scalebox/workers/2/losses/episodic_return": [runs.Point("x", 1, 50.0, 0.5)],  # not a worker's return
    }
    head = runs.headline({}, series)
    assert head["episodes"] == 3 and head["episodic_return_final"] == 2.0
    assert head["metric_return"] == "scalebox/workers/*/episodic_return"
    assert [p.value for p in runs.worker_series(series, "episodic_return")] == [1.0, 2.0, 3.0]  # time order
    # the run's own process stepped envs, more than its workers: that is the run's return
    series["scalebox/episodic_return"] = [runs.Point("scalebox/episodic_return", 500, 9.0, 0.0)]
    assert runs.headline({}, series)["episodic_return_final"] == 9.0
    assert stats.run_value({}, series, "episodic_return/x") is None
    assert stats.run_value({}, _series(("scalebox/losses/backward", [2.0, 4.0])), "losses/backward") == 3.0


def _fake_run(root, branch, started, wall, sps, cpu, load=0.5, variant="rewrite"):
    number, folder = runs.allocate_run(str(root), branch)
    record = {"branch": branch, "run": number, "status": "ok", "variant": variant, "started": started,
              "ended": started + wall, "wall_time": wall, "host": None, "load": {"runnable_mean": load, "cpus": 2}}
    runs.write_record(folder, record)
    with open(os.path.join(folder, runs.METRICS), "w") as fh:
        fh.write(_line("scalebox/SPS", 1, sps) + _line("scalebox/cpu_time_s", 2, cpu))
    return runs.RunInfo(branch, number, folder, runs.load_record(folder))


def test_compare_says_when_speed_rests_on_runs_that_shared_the_machine(tmp_path):
    """Issue 20: two seeds per side run in parallel on a loaded host gave steps/s -74.8% "lower
    (worse)"; such a difference is no speed measurement, and CPU time is compared beside it."""
    a = [_fake_run(tmp_path, "run/0001", 1000.0 + 100 * i, 10.0, 1000.0 + i, 9.0 + 0.1 * i, variant="original") for i in range(2)]
    b = [_fake_run(tmp_path, "run/0001", 2000.0, 30.0, 250.0 + i, 9.05 + 0.1 * i) for i in range(2)]  # side by side
    result = stats.compare([("original", a), ("run/0001", b)])
    (sps,) = [m for m in result["metrics"] if m["metric"] == "sps"]
    diff = sps["groups"][1]["vs_first"]
    assert diff["shared_machine"] and "(worse)" not in diff["text"] and "not a speed measurement: 2 of 4 runs" in diff["text"]
    (cpu,) = [m for m in result["metrics"] if m["metric"] == "cpu_time_s"]
    assert cpu["groups"][1]["vs_first"]["text"] == "within noise"
    assert set(result["groups"][1]["shared_machine"]) == {r.id for r in b} and not result["groups"][0]["shared_machine"]
    text = stats.render(result)
    assert f"2 of 2 shared the machine ({b[0].id}: 1 other run(s) at once;" in text and "CPU time, children included (s)" in text
    # sequential runs on a quiet host: the verdict stands; a loaded host alone is reason enough
    c = [_fake_run(tmp_path, "run/0002", 5000.0 + 100 * i, 30.0, 250.0 + i, 9.0) for i in range(2)]
    diff = next(m for m in stats.compare([("original", a), ("c", c)])["metrics"] if m["metric"] == "sps")["groups"][1]["vs_first"]
    assert diff["text"] == "lower (worse)" and "shared_machine" not in diff
    d = [_fake_run(tmp_path, "run/0003", 9000.0 + 100 * i, 30.0, 250.0 + i, 9.0, load=6.0) for i in range(2)]
    result = stats.compare([("original", a), ("d", d)])
    assert "host load 6.0 on 2 CPUs" in stats.render(result)


def test_compare_metric_names_the_users_own_series_before_a_headline_of_that_name(tmp_path):
    """A script printing ``episodic_return=`` / ``sps=`` keeps those series under their names, but
    ``compare --metric episodic_return`` (or ``sps``) read the engine's headline instead: the
    user's own series could not be compared at all. Without --metric the headline stays."""
    group = []
    for i, (own, engine) in enumerate(((10.0, 100.0), (20.0, 200.0))):
        run = _fake_run(tmp_path, "run/0001", 1000.0 + 100 * i, 10.0, 500.0, 9.0)
        with open(os.path.join(run.dir, runs.METRICS), "a") as fh:
            fh.write(_line("episodic_return", 3, own) + _line("scalebox/episodic_return", 3, engine) + _line("sps", 3, 7.0))
        group.append(run)
    named = stats.compare([("a", group[:1]), ("b", group[1:])], metrics=["episodic_return", "sps", "wall_time"])
    values = {m["metric"]: [g["values"] for g in m["groups"]] for m in named["metrics"]}
    assert values == {"episodic_return": [[10.0], [20.0]], "sps": [[7.0], [7.0]], "wall_time": [[10.0], [10.0]]}
    default = stats.compare([("a", group[:1]), ("b", group[1:])])
    values = {m["metric"]: [g["values"] for g in m["groups"]] for m in default["metrics"]}
    assert values["episodic_return"] == [[100.0], [200.0]] and values["sps"] == [[500.0], [500.0]]


def _seeded_runs(tmp_path, branch, seeds, start, returns):
    """Finished runs of ``branch``, one per seed, the i-th recording ``returns(i, seed)`` as its
    episode returns (steps 3, 4, ...)."""
    made = []
    for i, seed in enumerate(seeds):
        run = _fake_run(tmp_path, branch, start + 100 * i, 10.0, 500.0, 9.0)
        record = runs.load_record(run.dir)
        record["seed"] = seed
        runs.write_record(run.dir, record)
        with open(os.path.join(run.dir, runs.METRICS), "a") as fh:
            fh.write("".join(_line("scalebox/episodic_return", step, value) for step, value in enumerate(returns(i, seed), 3)))
        made.append(runs.RunInfo(branch, run.run, run.dir, runs.load_record(run.dir)))
    return made


def test_compare_says_when_every_seed_gave_the_same_run(tmp_path):
    """A script that seeds itself (``torch.manual_seed(1)``; a newcomer's runs of sweetice's PPO
    with --seeds 0,1) gives identical runs for every seed: each side's spread was 0 and a
    difference of returns read "higher (better)" with an interval of one point. Now the group is
    named as one sample and the verdict has no noise estimate; seeds that differ keep theirs."""
    def group(branch, returns, seeds, start):
        return _seeded_runs(tmp_path, branch, seeds, start, lambda i, seed: returns(i))

    blind = group("run/0001", lambda i: [10.0, 12.0], [0, 1, 2], 1000.0)
    other = group("run/0002", lambda i: [20.0 + i, 22.0 + i], [0, 1, 2], 5000.0)
    result = stats.compare([("run/0001", blind), ("run/0002", other)])
    assert result["groups"][0]["seed_blind"] == [0, 1, 2] and result["groups"][1]["seed_blind"] is None
    (ret,) = [m for m in result["metrics"] if m["metric"] == "episodic_return"]
    diff = ret["groups"][1]["vs_first"]
    assert diff["ci"] is None and diff["within_noise"] is None and "identical episode returns for every seed" in diff["text"]
    assert "seeds 0, 1, 2 gave identical episode returns" in stats.render(result)
    varied = group("run/0003", lambda i: [10.0 + i, 12.0], [0, 1, 2], 9000.0)
    result = stats.compare([("run/0003", varied), ("run/0002", other)])
    assert result["groups"][0]["seed_blind"] is None
    assert next(m for m in result["metrics"] if m["metric"] == "episodic_return")["groups"][1]["vs_first"]["ci"] is not None
    unseeded = group("run/0004", lambda i: [10.0, 12.0], [None, None], 12000.0)  # runs of one seed: nothing to say
    assert stats.compare([("run/0004", unseeded), ("run/0002", other)])["groups"][0]["seed_blind"] is None


def test_compare_gives_no_return_verdict_where_one_seed_gave_other_runs_and_runs_are_few(tmp_path):
    """Packt's cross-entropy CartPole draws its actions from numpy's global generator, which
    nothing seeded: two runs of seed 0 ended at 129.8 and 152.5, a rewrite's two at 101.8 and
    101.9, and the percentile bootstrap of two draws a side read "lower (worse)". Where runs of
    one seed (same arguments) differ, a return difference between groups of fewer than
    SEED_LOOSE_RUNS runs gets no verdict, and the group's header says why; CPU time keeps its
    verdict, and groups whose seeds fix their runs keep theirs."""
    def group(branch, finals, seeds, start):
        made = []
        for i, (final, seed) in enumerate(zip(finals, seeds)):
            run = _fake_run(tmp_path, branch, start + 100 * i, 10.0, 500.0, 9.0)
            record = runs.load_record(run.dir)
            record["seed"] = seed
            runs.write_record(run.dir, record)
            with open(os.path.join(run.dir, runs.METRICS), "a") as fh:
                fh.write(_line("scalebox/episodic_return", 3, final))
            made.append(runs.RunInfo(branch, run.run, run.dir, runs.load_record(run.dir)))
        return made

    loose = group("run/0001", [129.8, 152.5], [0, 0], 1000.0)
    rewrite = group("run/0002", [101.8, 101.9], [0, 0], 5000.0)
    result = stats.compare([("original", loose), ("run/0002", rewrite)])
    assert result["groups"][0]["seed_loose"]["runs"] == [r.id for r in loose]
    assert result["groups"][1]["seed_loose"] is not None  # 101.8 vs 101.9: they differ too
    (ret,) = [m for m in result["metrics"] if m["metric"] == "episodic_return"]
    diff = ret["groups"][1]["vs_first"]
    assert diff["within_noise"] is None and diff["text"].startswith("no verdict: runs of one seed differ"), diff
    text = stats.render(result)
    assert "runs of seed 0 differ" in text and "final return 129.8 vs 152.5" in text, text
    # seeds that each fix their run (one run a seed, or equal runs of a seed) keep the verdict
    fixed = group("run/0003", [129.8, 129.8, 152.5], [0, 0, 1], 9000.0)
    other = group("run/0004", [101.8, 101.8, 101.9], [0, 0, 1], 12000.0)
    result = stats.compare([("a", fixed), ("b", other)])
    assert result["groups"][0]["seed_loose"] is None and result["groups"][1]["seed_loose"] is None
    (ret,) = [m for m in result["metrics"] if m["metric"] == "episodic_return"]
    assert not ret["groups"][1]["vs_first"]["text"].startswith("no verdict"), ret
    # five runs a side: the bootstrap stands
    many = group("run/0005", [129.8, 152.5, 140.0, 150.0, 131.0], [0, 0, 0, 0, 0], 15000.0)
    more = group("run/0006", [101.8, 101.9, 99.0, 103.0, 100.0], [0, 0, 0, 0, 0], 20000.0)
    result = stats.compare([("a", many), ("b", more)])
    (ret,) = [m for m in result["metrics"] if m["metric"] == "episodic_return"]
    assert ret["groups"][1]["vs_first"]["text"].startswith("lower"), ret


def test_log_line_says_when_site_time_rests_on_no_sample():
    from scalebox_cst.cli.history import _run_line

    brief = runs.headline({}, {}, [{"vectorized": 5, "fallback": 0, "time_s": 0.0, "samples": 0}])
    seen = runs.headline({}, {}, [{"vectorized": 5, "fallback": 0, "time_s": 0.12, "samples": 3}])
    assert "sites below sampling" in _run_line({"run": 1, "headline": brief})
    assert "sites 0.12s" in _run_line({"run": 1, "headline": seen})


# ----------------------------------------------------------------------------- statistics
def test_bootstrap_interval_and_verdicts():
    same_a, same_b = [10.0, 12.0, 11.0, 9.0, 13.0], [11.0, 10.0, 12.5, 9.5, 12.0]
    ci = stats.bootstrap_ci(same_a)
    assert ci[0] < sum(same_a) / 5 < ci[1]
    assert stats.bootstrap_ci(same_a) == ci  # seeded: the same runs print the same interval
    assert stats.verdict(same_a, same_b)["text"] == "within noise"
    far = [v + 50 for v in same_a]
    v = stats.verdict(same_a, far, higher_is_better=True)
    assert v["within_noise"] is False and v["text"] == "higher (better)" and v["delta"] == pytest.approx(50)
    assert v["ci"][0] > 0
    assert stats.verdict(same_a, [1.0], True)["within_noise"] is None  # one run: no noise estimate
    assert "no noise estimate" in stats.verdict([1.0], [2.0])["text"]
    assert stats.verdict([3.0, 3.0], [3.0, 3.0])["text"] == "no difference"


def test_bootstrap_coverage_is_about_nominal():
    """Over many normal samples of 8, the 95% interval holds the true mean about 90-97% of the time
    (percentile bootstrap undercovers a little at small n)."""
    import numpy as np

    rng = np.random.default_rng(1)
    hits = sum(lo <= 0.0 <= hi for lo, hi in (stats.bootstrap_ci(rng.normal(0, 1, 8), resamples=1000, seed=i) for i in range(300)))
    assert 0.85 <= hits / 300 <= 0.98


# ----------------------------------------------------------------------------- CLI end to end
SEEDED = textwrap.dedent(
    """\
    import argparse, random
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base", type=float, default=BASE)
    args = parser.parse_args()
    random.seed(args.seed)
    for episode in range(12):
        print(f"global_step={episode * 10} episodic_return={args.base + random.gauss(0, 1):.4f} SPS=1000")
    """
)

NO_SEED_OPTION = textwrap.dedent(
    """\
    import random, time
    print(f"draw={random.random():.12f}")
    print(f"began={time.time():.3f}", flush=True)
    time.sleep(0.6)
    print(f"finished={time.time():.3f}")
    """
)


@pytest.fixture
def plain(tmp_path):
    root = tmp_path / "plain"
    root.mkdir()
    (root / "train.py").write_text(SEEDED.replace("BASE", "0.0"))
    (root / "noseed.py").write_text(NO_SEED_OPTION)
    (root / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n')
    scalebox("init", str(root))
    return root


def records(root, branch):
    return [r.record for r in runs.list_runs(str(root), branch)]


def test_runs_are_never_overwritten_and_seeds_reach_the_script(plain):
    scalebox("run", "train.py", cwd=plain)
    # run/0001 from here on: a commit of the engine mid-test must not make another branch
    scalebox("run", "run/0001", "train.py", "--", "--base", "5", cwd=plain)
    proc = scalebox("run", "--seeds", "0,1,2", "--parallel", "2", "run/0001", "train.py", cwd=plain)
    assert "[run/0001#3] global_step=0" in proc.stdout  # parallel output carries the run's name
    recs = records(plain, "run/0001")
    assert [r["run"] for r in recs] == [1, 2, 3, 4, 5]
    assert [r["seed"] for r in recs] == [None, None, 0, 1, 2]
    assert recs[1]["args"] == ["--base", "5"] and recs[2]["args"] == ["--seed", "0"] and recs[2]["seed_via"] == "option"
    logs = [(plain / ".scalebox" / "runs" / "run" / "0001" / f"{n:04d}" / "log.txt").read_text() for n in range(1, 6)]
    assert logs[0] == logs[2] != logs[3]  # seed 0 is the script's default; seed 1 draws otherwise
    assert "episodic_return=5." in logs[1] or "episodic_return=4." in logs[1]
    for r in recs:
        assert r["status"] == "ok" and r["exit_status"] == 0 and r["variant"] == "rewrite"
        assert r["headline"]["episodes"] == 12 and r["headline"]["sps"] == 1000
    # key=value lines became points, x = their global_step
    points, _ = runs.read_metrics(str(plain / ".scalebox" / "runs" / "run" / "0001" / "0003" / "metrics.jsonl"))
    assert [p.step for p in points if p.name == "episodic_return"] == list(range(0, 120, 10))


SPAWNED_WORKERS = textwrap.dedent(
    """\
    import multiprocessing as mp
    import gymnasium as gym

    def work(seed):
        env = gym.make("CartPole-v1")
        env.reset(seed=seed)
        env.action_space.seed(seed)
        done = 0
        while done < 3:
            _, r, term, trunc, _ = env.step(env.action_space.sample())
            if term or trunc:
                done += 1
                env.reset()

    if __name__ == "__main__":
        procs = [mp.get_context("CONTEXT").Process(target=work, args=(s,)) for s in (1, 2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        print("workers done")
    """
)


@pytest.mark.parametrize("context", ["spawn", "forkserver"])  # forkserver: SB3 SubprocVecEnv's default
def test_envs_stepped_in_spawned_workers_give_the_runs_return(plain, context):
    """Issue 20: with envs stepped in worker processes the run had no episodic_return at all
    (compare showed wall time only); spawned children now record theirs, per worker."""
    (plain / "workers.py").write_text(SPAWNED_WORKERS.replace("CONTEXT", context))
    scalebox("run", "workers.py", cwd=plain)
    (run,) = [r for r in runs.list_runs(str(plain)) if r.record.get("script") == "workers.py"]
    series = runs.read_series(run.dir)
    assert sorted(n for n in series if n.endswith("/episodic_return")) == [
        "scalebox/workers/1/episodic_return", "scalebox/workers/2/episodic_return"]
    head = runs.run_headline(run)
    assert head["episodes"] == 6 and head["metric_return"] == "scalebox/workers/*/episodic_return"
    out = scalebox("compare", f"{run.id}", f"{run.id}", cwd=plain).stdout
    assert "episodic return (final)" in out


def test_parallel_runs_at_most_n_at_once_and_env_seeding(plain):
    scalebox("rewrite", str(plain))
    scalebox("run", "--seeds", "0-2", "--parallel", "2", "run/0001", "noseed.py", cwd=plain)
    scalebox("run", "--seeds", "0", "run/0001", "noseed.py", cwd=plain)
    recs = records(plain, "run/0001")
    assert [r["seed_via"] for r in recs] == ["env"] * 4
    spans, draws = [], []
    for r in recs:
        series = runs.read_series(runs.run_dir(str(plain), "run/0001", r["run"]))
        spans.append((series["began"][0].value, series["finished"][0].value))
        draws.append(series["draw"][0].value)
    assert draws[0] == draws[3] and len(set(draws[:3])) == 3  # seeded by the launcher: reproducible
    for began, _ in spans[:3]:
        assert sum(1 for b, f in spans[:3] if b <= began < f) <= 2


def test_original_runs_the_source_snapshot(project):
    (project / "probe.py").write_text(
        "import torch\nmodel = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "model(torch.ones(1, 2)).sum().backward()\nopt.step()\n"
        "print('rewritten=' + str(int(any(k.startswith('_scalebox') for k in globals()))))\n"
    )
    (project / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n')
    scalebox("rewrite", str(project))
    scalebox("run", "probe.py", cwd=project)
    scalebox("run", "--original", "probe.py", cwd=project)
    rewrite, original = records(project, "run/0001")
    assert rewrite["variant"] == "rewrite" and original["variant"] == "original"
    assert original["commit"] == original["source_commit"] == rewrite["source_commit"] != rewrite["commit"]
    assert rewrite["metrics"]["rewritten"]["last"] == 1 and original["metrics"]["rewritten"]["last"] == 0
    out = scalebox("compare", "original", "run/0001", "--metric", "rewritten", cwd=project).stdout
    assert "original (run/0001): 1 run(s) run/0001#2" in out
    assert "one run on a side" in out


def _edit(root, base):
    (root / "train.py").write_text(SEEDED.replace("BASE", base))


def test_compare_original_finds_the_original_runs_of_the_same_files_under_another_snapshot(plain):
    """Found by a newcomer: ``run --original``, an edit, the edit undone, ``compare original
    run/0003`` said "original (run/0003): 0 run(s)" and compared nothing: the files were the
    ones the original ran, but committed again as another source snapshot, and the original
    runs were matched by the snapshot's commit id. Two snapshots of the same files share a tree."""
    scalebox("run", "--original", "--seeds", "0,1", "train.py", cwd=plain)  # run/0001's snapshot
    _edit(plain, "5.0")
    scalebox("run", "train.py", cwd=plain)  # run/0002: other files
    _edit(plain, "0.0")  # the edit undone: the same files as run/0001's, a new snapshot
    scalebox("run", "train.py", cwd=plain)
    assert records(plain, "run/0003")[0]["source_commit"] != records(plain, "run/0001")[0]["source_commit"]
    out = scalebox("compare", "original", "run/0003", cwd=plain).stdout
    assert "original (run/0003): 2 run(s) run/0001#1, run/0001#2 (seeds 0, 1)" in out
    assert "episodic return (final)" in out
    out = scalebox("compare", "run/0002:original", "run/0003", cwd=plain).stdout  # other files: none
    assert "original (run/0002): 0 run(s)" in out


def test_compare_original_is_the_original_of_the_branch_it_is_compared_with(plain):
    """A newcomer's Lizhi-sjtu PPO-discrete: `run --original` and `run` of run/0001, then an edit
    (or an engine upgrade) made run/0002; the README's `compare original run/0001` then compared
    run/0002's snapshot ("original (run/0002): 0 run(s)") with run/0001, every metric "-"."""
    scalebox("run", "--original", "--seeds", "0", "train.py", cwd=plain)
    scalebox("run", "--seeds", "0", "train.py", cwd=plain)
    _edit(plain, "5.0")
    scalebox("run", "--seeds", "0", "train.py", cwd=plain)  # run/0002
    out = scalebox("compare", "original", "run/0001", cwd=plain).stdout
    assert "original (run/0001): 1 run(s) run/0001#1 (seeds 0)" in out, out
    out = scalebox("compare", "original", "run/0001#2", cwd=plain).stdout
    assert "original (run/0001): 1 run(s)" in out, out
    out = scalebox("compare", "run/0002", "original", cwd=plain).stdout  # the first branch named
    assert "original (run/0002): 0 run(s)" in out, out


def test_compare_seeded_branches_says_what_is_noise(plain):
    scalebox("run", "--seeds", "0,1,2,3", "train.py", cwd=plain)  # run/0001: base 0
    _edit(plain, "0.0 + 0")  # run/0002: same numbers, another branch
    scalebox("run", "--seeds", "4,5,6,7", "train.py", cwd=plain)
    _edit(plain, "30.0")  # run/0003: clearly better
    scalebox("run", "--seeds", "0,1,2,3", "train.py", cwd=plain)
    out = scalebox("compare", "1", "run/0002", "run/0003", cwd=plain).stdout
    lines = out.splitlines()
    ret = lines.index("episodic return (final)")
    assert "run/0002" in lines[ret + 2] and "within noise" in lines[ret + 2]
    assert "run/0003" in lines[ret + 3] and "higher (better)" in lines[ret + 3]
    data = json.loads(scalebox("compare", "run/0001", "run/0003", "--json", cwd=plain).stdout)
    (ret_metric,) = [m for m in data["metrics"] if m["metric"] == "episodic_return"]
    a, b = ret_metric["groups"]
    assert a["n"] == b["n"] == 4 and a["ci"][0] < a["mean"] < a["ci"][1]
    assert b["vs_first"]["within_noise"] is False and 25 < b["vs_first"]["delta"] < 35
    assert data["groups"][0]["seeds"] == [0, 1, 2, 3]
    one = scalebox("compare", "run/0001#1", "run/0003#1", cwd=plain).stdout
    assert "no noise estimate" in one
    diff = scalebox("diff", "run/0002", "run/0003", cwd=plain).stdout
    assert '\n-parser.add_argument("--base", type=float, default=0.0 + 0)\n' in diff
    assert '\n+parser.add_argument("--base", type=float, default=30.0)\n' in diff
    assert "train.py | +1 -1" in scalebox("diff", "run/0002", "run/0003", "--stat", cwd=plain).stdout


def test_log_json_and_status(plain):
    scalebox("run", "--seeds", "0", "train.py", cwd=plain)
    assert scalebox("status", cwd=plain).stdout.startswith("working tree matches run/0001")
    _edit(plain, "3.0")
    (plain / "extra.py").write_text("X = 1\n")
    status = json.loads(scalebox("status", "--json", cwd=plain).stdout)
    assert status["clean"] is False and status["changes"] == ["M train.py", "A extra.py"]
    proc = scalebox("run", "train.py", cwd=plain)  # not silently stale: committed first, and said so
    assert "working tree changed (M train.py, A extra.py); committed run/0002" in proc.stderr
    assert json.loads(scalebox("status", "--json", cwd=plain).stdout)["clean"] is True
    (plain / "extra.py").write_text("X = (\n")  # a save that does not parse
    proc = scalebox("run", "train.py", cwd=plain)
    assert "extra.py:1" in proc.stderr and "running the stale run/0002" in proc.stderr
    entries = json.loads(scalebox("log", "--json", cwd=plain).stdout)
    assert [e["branch"] for e in entries] == ["run/0002", "run/0001"]
    newest = entries[0]
    assert newest["changes"]["parent"] == "run/0001"
    assert newest["changes"]["files"] == ["M train.py", "A extra.py"] and newest["changes"]["backend"] == "cpu"
    assert [r["run"] for r in newest["runs"]] == [1, 2] and newest["runs"][1]["stale"] == ["M extra.py"]
    run = entries[1]["runs"][0]
    assert run["seed"] == 0 and run["status"] == "ok" and run["script"] == "train.py" and run["wall_time"] > 0
    assert set(run["headline"]) >= {"episodic_return_final", "episodic_return_best", "sps", "guard_pass_rate"}
    text = scalebox("log", cwd=plain).stdout
    assert "files since run/0001: M train.py, A extra.py" in text
    assert "  #1   ok" in text and "seed=0  train.py --seed 0" in text and "1000 steps/s" in text


def test_run_after_a_rewrite_with_other_options_does_not_say_the_working_tree_changed(plain):
    """Found by a newcomer: `scalebox rewrite --fast .` then `scalebox run train.py` said "working
    tree changed (config (pipeline fingerprint)); committed run/0002": nothing had been edited;
    the newest branch held these files rewritten with other options than the run's. Now it says
    so, and how to run that branch; with --no-commit it is a note, not "differs from the working tree"."""
    scalebox("rewrite", "--fast", ".", cwd=plain)
    proc = scalebox("run", "--no-commit", "train.py", cwd=plain)
    assert "note: running run/0001, rewritten with other options than this run's (rewrite --fast" in proc.stderr
    assert "differs from the working tree" not in proc.stderr and "working tree changed" not in proc.stderr
    proc = scalebox("run", "train.py", cwd=plain)
    assert "working tree changed" not in proc.stderr
    assert ("scalebox: run/0001 holds these files rewritten with other options than this run's (rewrite --fast, "
            "--transform or --set, scalebox.toml, or the engine); committed run/0002: ") in proc.stderr
    assert "(`scalebox run run/0001 SCRIPT` runs run/0001 as it is)" in proc.stderr


def test_watcher_writes_project_events(plain):
    from scalebox_cst.project import Project
    from scalebox_cst.watcher import Watcher

    watcher = Watcher(Project(str(plain)), echo=lambda *_: None)
    watcher.handle_change()
    (plain / "train.py").write_text("x = (\n")
    watcher.handle_change()
    events, _ = runs.read_events(runs.project_events_path(str(plain)))
    assert [e["kind"] for e in events] == ["branch_created", "save_blocked"]
    assert events[0]["branch"] == "run/0001" and "train.py:1" in events[1]["message"]


# ----------------------------------------------------------------------------- signals
QUIET = textwrap.dedent(
    """\
    import subprocess, sys, time
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print(f"worker={worker.pid}", flush=True)
    time.sleep(60)
    """
)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _start_quiet(plain):
    (plain / "quiet.py").write_text(QUIET)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([*CLI, "run", "quiet.py"], cwd=plain, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("worker="), line + proc.stderr.read()
    (record,) = [r.record for r in runs.list_runs(str(plain))]
    return proc, record["pid"], int(line.split("=")[1])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_to_scalebox_run_stop_the_whole_run_and_finish_its_record(plain, sig):
    proc, child, worker = _start_quiet(plain)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig
    assert f"{signal.Signals(sig).name}: stopping 1 run(s)" in err
    assert not _alive(child) and not _alive(worker)
    (record,) = [r.record for r in runs.list_runs(str(plain))]
    assert record["status"] == "stopped" and record["stop_reason"] == f"{signal.Signals(sig).name} to scalebox run"
    assert record["wall_time"] < 30
    events, _ = runs.read_events(os.path.join(runs.run_dir(str(plain), "run/0001", 1), "events.jsonl"))
    assert [e["kind"] for e in events] == ["started", "stopping", "stopped"]


def _blocked(tid):
    """The set of signals thread ``tid`` of this process blocks (from /proc)."""
    with open(f"/proc/self/task/{tid}/status") as fh:
        mask = int(next(line for line in fh if line.startswith("SigBlk:")).split()[1], 16)
    return {s for s in signal.Signals if mask >> (s - 1) & 1}


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads thread masks from /proc")
def test_helper_threads_leave_stop_signals_to_the_main_thread():
    """The kernel gives a process's signal to any thread not blocking it; only the main thread
    runs Python handlers, and a main thread asleep in waitpid is not woken by another thread's
    signal. Every helper thread the engine starts blocks them; faults stay with their thread."""
    import threading

    from scalebox_cst.runtime import threads

    before = _blocked(threading.get_native_id())
    seen = {}
    ready = threading.Event()
    thread = threads.start_daemon(lambda: (seen.update(blocked=_blocked(threading.get_native_id())), ready.set()), "probe")
    assert ready.wait(10)
    thread.join(10)
    assert {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD} <= seen["blocked"]
    assert not {signal.SIGSEGV, signal.SIGFPE, signal.SIGBUS, signal.SIGABRT} & seen["blocked"]
    assert _blocked(threading.get_native_id()) == before  # the caller's own mask is as it was


def test_a_stop_signal_another_thread_took_still_ends_the_wait_for_a_run(plain):
    """A signal handled at C level in another thread (as when the kernel picks a torch or
    libgit2 thread) still runs the main thread's handler while it waits for the run."""
    import threading

    from scalebox_cst.project import Project
    from scalebox_cst.runner import execution as executor

    (plain / "slow.py").write_text("import time\ntime.sleep(30)\n")
    scalebox("rewrite", str(plain))
    project = Project(str(plain))
    info = project.store.resolve("run/0001")

    class Stop(Exception):
        pass

    def handler(*_):
        raise Stop

    previous = signal.signal(signal.SIGUSR1, handler)
    execution = executor.Execution(
        project.store.path, project.root, project.runs_dir, info.name, info.commit, "slow.py", [],
        source_commit=info.source_commit, notice=lambda _: None, tensorboard=False,
    )
    try:
        other = threading.Thread(target=lambda: (time.sleep(1.0), signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)))
        other.start()
        start = time.time()
        with pytest.raises(Stop):
            execution.wait()
        assert time.time() - start < 10
    finally:
        signal.signal(signal.SIGUSR1, previous)
        record = execution.stop(reason="test over")
    assert record.status == "stopped"


def test_timeout_of_scalebox_run_leaves_no_training_behind(plain):
    (plain / "quiet.py").write_text(QUIET)
    scalebox("rewrite", str(plain))
    start = time.time()
    subprocess.run(["timeout", "8", *CLI, "run", "quiet.py"], cwd=plain, capture_output=True, timeout=60)
    assert time.time() - start < 25
    (record,) = [r.record for r in runs.list_runs(str(plain))]
    assert record["status"] == "stopped" and not _alive(record["pid"])


def test_sigkill_of_scalebox_run_ends_the_run_and_the_record_reads_lost(plain):
    proc, child, worker = _start_quiet(plain)
    proc.kill()
    proc.wait()
    deadline = time.time() + 15
    while (_alive(child) or _alive(worker)) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(child) and not _alive(worker)
    (run,) = runs.list_runs(str(plain))
    assert run.status == "lost" and run.record["ended"] is not None
    assert "  #1   lost" in scalebox("log", cwd=plain).stdout


# ----------------------------------------------------------------------------- tracebacks
def test_traceback_origin_maps_lines_quotes_and_marks(tmp_path):
    from scalebox_cst.runtime import loader

    original = "def f(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / 0\n\nf([1])\n"
    rewritten = "import helper\ndef f(xs):\n    total = 0\n    total = helper.fast_sum(xs)\n    return total / 0\n\nf([1])\n"
    filename = str(tmp_path / "t.py")
    loader.register_source(filename, rewritten)
    loader.register_origin(filename, lambda: loader.Origin(original, rewritten, [(3, 4, "vectorize.reduction")], "run/0007"))
    namespace = {"helper": type("H", (), {"fast_sum": staticmethod(lambda xs: 1 / 0)})}
    try:
        harness.load(rewritten.replace("import helper\n", "\n"), filename=filename, namespace=namespace)
    except ZeroDivisionError:
        text = loader.format_exception(*sys.exc_info())
    assert f'File "{filename}", line 7, in <module>\n    f([1])\n' in text
    # the frame in the rewritten loop: the user's line 3 (its loop), marked, with what ran
    assert f'File "{filename}", line 3, in f  (run/0007, vectorize.reduction site)\n    for x in xs:\n    ran: total = helper.fast_sum(xs)\n' in text
    assert "ZeroDivisionError" in text


def test_traceback_of_a_run_names_the_users_lines_inside_a_site(project):
    (project / "t.py").write_text(
        "import torch\n"
        "model = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "model(torch.ones(1, 2)).sum().backward()\n"
        "opt.step()\n"
        "\n"
        "\n"
        "\n"
        "\n"
        "raise ValueError('on line 10')\n"
    )
    (project / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n')
    scalebox("rewrite", str(project))
    rewritten = scalebox("diff", cwd=project).stdout
    assert rewritten.count("\n+") >= 2  # an import and a call were inserted above line 10
    proc = scalebox("run", "t.py", cwd=project, check=False)
    assert proc.returncode == 1
    assert f'File "{os.path.realpath(project / "t.py")}", line 10, in <module>\n    raise ValueError(\'on line 10\')\n' in proc.stderr
    (record,) = records(project, "run/0001")
    assert record["status"] == "failed" and record["error_tail"][-1] == "ValueError: on line 10"


def test_user_lines_reach_replaced_showwarning_and_logging_imported_later(tmp_path):
    """In a fresh process: a program's own showwarning gets the user's line; logging, imported
    after the mapping was installed, is patched on import; a file not rewritten keeps its lines."""
    script = tmp_path / "check.py"
    script.write_text(textwrap.dedent(f"""\
        import sys, warnings
        from scalebox_cst.runtime import loader
        original = "import warnings\\nwarnings.warn('a')\\nLOG.warning('b')\\n"
        rewritten = "import warnings\\n\\n\\n\\nwarnings.warn('a')\\nLOG.warning('b')\\n"
        name = {str(tmp_path / "t.py")!r}
        loader.register_source(name, rewritten)
        loader.register_origin(name, lambda: loader.Origin(original, rewritten))
        loader.install_excepthook()
        assert "logging" not in sys.modules
        import logging
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        LOG = logging.getLogger("t")
        LOG.addHandler(handler)
        shown = []
        warnings.showwarning = lambda m, c, f, l, file=None, line=None: shown.append((f == name, l, line))
        exec(compile(rewritten, name, "exec"), {{"LOG": LOG}})
        warnings.warn("here")  # this file: not rewritten
        LOG.warning("here too")
        print(shown, [r.lineno for r in records])
        """))
    out = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[(True, 2, \"warnings.warn('a')\"), (False, 19, None)] [3, 20]"


def test_warnings_log_records_and_inspect_of_a_run_name_the_users_lines(project):
    """A warnings.warn on line 10 was reported as t.py:12 (two lines inserted above it)."""
    (project / "t.py").write_text(
        "import inspect, logging, warnings\n"
        "import torch\n"
        "logging.basicConfig(format='LOG %(filename)s:%(lineno)d %(message)s')\n"
        "model = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "model(torch.ones(1, 2)).sum().backward()\n"
        "opt.step()\n"
        "\n"
        "\n"
        "warnings.warn('warned on line 10')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    warnings.warn('recorded on line 13')\n"
        "print('RECORD', caught[0].lineno, repr(caught[0].line))\n"
        "logging.getLogger('t').warning('logged on line 15')\n"
        "here = inspect.stack()[0]\n"
        "print('INSPECT', here.lineno, here.code_context, inspect.getframeinfo(inspect.currentframe()).lineno)\n"
        "try:\n"
        "    1 / 0\n"
        "except ZeroDivisionError:\n"
        "    logging.getLogger('t').exception('caught')\n"
    )
    (project / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n')
    scalebox("rewrite", str(project))
    assert scalebox("diff", cwd=project).stdout.count("\n+") >= 2  # an import and a call were inserted above line 10
    proc = scalebox("run", "t.py", cwd=project)
    out, err = proc.stdout, proc.stderr  # warnings, log records and tracebacks go to stderr, as the script wrote them
    path = os.path.realpath(project / "t.py")
    assert f"{path}:10: UserWarning: warned on line 10\n  warnings.warn('warned on line 10')\n" in err
    assert "RECORD 13 \"warnings.warn('recorded on line 13')\"" in out
    assert "LOG t.py:15 logged on line 15" in err
    assert "INSPECT 16 ['here = inspect.stack()[0]\\n'] 17" in out
    assert f'File "{path}", line 19, in <module>\n    1 / 0\n' in err
    (record,) = records(project, "run/0001")
    assert record["status"] == "ok"


# ----------------------------------------------------------------------------- TensorBoard
def _event_tags(folder):
    """Scalar tags and steps in TFRecord event files (length, crc, Event proto, crc)."""
    from tensorboardX.proto import event_pb2

    found = {}
    for name in os.listdir(folder):
        data = open(os.path.join(folder, name), "rb").read()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                found.setdefault(value.tag, []).append(event.step)
    return found


def test_tensorboard_event_files_per_run_carry_branch_and_commit(plain):
    pytest.importorskip("tensorboardX")
    scalebox("run", "--seeds", "0,1", "train.py", cwd=plain)
    scalebox("run", "--original", "train.py", cwd=plain)
    base = plain / ".scalebox" / "tensorboard" / "run" / "0001"
    commit = records(plain, "run/0001")[0]["commit"]
    names = sorted(os.listdir(base))
    assert names[:2] == [f"0001-{commit[:8]}", f"0002-{commit[:8]}"] and names[2].endswith("-original")
    tags = _event_tags(base / names[0])
    assert tags["episodic_return"] == list(range(0, 120, 10)) and "SPS" in tags


def test_traceback_under_the_import_hook_quotes_the_users_line(project):
    """The default excepthook read the file on disk at the rewrite's line numbers (a blank line)."""
    (project / "t.py").write_text(
        "import torch\n"
        "model = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "model(torch.ones(1, 2)).sum().backward()\n"
        "opt.step()\n"
        "\n"
        "\n"
        "def f():\n"
        "    raise ValueError('on line 9')\n"
        "f()\n"
    )
    (project / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n')
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("SCALEBOX_HOOK_SESSION", None)
    for _ in range(2):  # rewritten, then served from the bytecode cache
        proc = subprocess.run([sys.executable, "-m", "scalebox_cst", "t.py"], cwd=project, env=env, capture_output=True, text=True, timeout=120)
        path = os.path.realpath(project / "t.py")
        assert proc.stderr.startswith("Traceback (most recent call last):\n" f'  File "{path}", line 10, in <module>\n    f()\n'), proc.stderr
        assert f'  File "{path}", line 9, in f\n    raise ValueError(\'on line 9\')\nValueError: on line 9\n' in proc.stderr
        assert os.path.join("scalebox_cst", "importhook") not in proc.stderr  # no frame of the hook


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signals_to_scalebox_watch_stop_its_run_and_finish_the_record(plain, sig):
    (plain / "quiet.py").write_text(QUIET)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from scalebox_cst.cli import watch_main; watch_main()", str(plain), "--run", "quiet.py"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    worker = None
    for line in proc.stdout:
        if line.startswith("worker="):
            worker = int(line.split("=")[1])
            break
    assert worker is not None
    (record,) = [r.record for r in runs.list_runs(str(plain))]
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=30)
    assert "branches made: run/0001" in rest
    assert not _alive(record["pid"]) and not _alive(worker)
    (record,) = [r.record for r in runs.list_runs(str(plain))]
    assert record["status"] == "stopped" and record["stop_reason"] == "scalebox-watch stopped"


def test_a_silent_run_says_it_is_still_running(plain, monkeypatch):
    from scalebox_cst.project import Project
    from scalebox_cst.runner import execution as executor

    (plain / "slow.py").write_text("import time\ntime.sleep(4)\nprint('first_step=1')\n")
    scalebox("rewrite", str(plain))
    project = Project(str(plain))
    info = project.store.resolve("run/0001")
    monkeypatch.setattr(executor, "QUIET_NOTICES", (1.5, 2.5))
    notes = []
    execution = executor.Execution(
        project.store.path, project.root, project.runs_dir, info.name, info.commit, "slow.py", [],
        source_commit=info.source_commit, notice=notes.append, tensorboard=False,
    )
    record = execution.wait(timeout=60)
    assert record.status == "ok" and record.metrics["first_step"]["last"] == 1
    assert len(notes) == 2 and all(n.startswith("scalebox: run/0001#1 still running (") for n in notes)
    assert "no output or metrics yet" in notes[0]


def test_event_extras_may_use_any_key_the_writers_name_their_own_arguments(tmp_path):
    """An event about a file carries ``path=`` (a save_blocked event does): extra keys never
    collide with the writers' own parameters."""
    events = tmp_path / "events.jsonl"
    runs.append_event(str(events), "save_blocked", "t.py:3: invalid syntax", path="t.py", kind_detail="syntax")
    runs.append_project_event(str(tmp_path), "save_blocked", "m", project_root="x", path="t.py")
    (first,), _ = runs.read_events(str(events))
    assert (first["kind"], first["path"]) == ("save_blocked", "t.py")
    (second,), _ = runs.read_events(runs.project_events_path(str(tmp_path)))
    assert (second["project_root"], second["path"]) == ("x", "t.py")


def test_a_live_pid_is_our_run_only_if_it_started_when_the_run_did(tmp_path):
    """A pid is reused: liveness compares the process's start (recorded at launch), not whether
    its command line happens to hold "scalebox_cst" (a path such as tests/scalebox_cst/ does)."""
    me = os.getpid()
    start = runs.process_start(me)
    if start is None:
        pytest.skip("no /proc here")
    _record(tmp_path, "run/0001", 1, pid=me, pid_start=start, host=os.uname().nodename)
    _record(tmp_path, "run/0001", 2, pid=me, pid_start=start - 1, host=os.uname().nodename)  # an earlier process
    with_path = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "/x/scalebox_cst/y"])
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "scalebox_cst.runtime.launch"])
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.time() + 30
        while runs._stat(zombie.pid) is not None and runs._stat(zombie.pid)[0] != b"Z" and time.time() < deadline:
            time.sleep(0.05)
        _record(tmp_path, "run/0001", 3, pid=with_path.pid, host=os.uname().nodename)  # old record, no start
        _record(tmp_path, "run/0001", 4, pid=launcher.pid, host=os.uname().nodename)
        _record(tmp_path, "run/0001", 5, pid=zombie.pid, pid_start=runs.process_start(zombie.pid), host=os.uname().nodename)
        found = {r.id: r.status for r in runs.list_runs(str(tmp_path))}
        assert found == {"run/0001#1": "running", "run/0001#2": "lost", "run/0001#3": "lost",
                         "run/0001#4": "running", "run/0001#5": "lost"}
    finally:
        for p in (with_path, launcher):
            p.kill()
            p.wait()
        zombie.wait()



def test_a_record_write_that_fails_leaves_no_temporary_file(tmp_path, monkeypatch):
    """A full disk mid-write left ``.record.json.NNN.tmp`` in the run folder for good."""
    runs.write_record(str(tmp_path), {"status": "running"})

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    from scalebox_cst import tmpnames

    monkeypatch.setattr(tmpnames.os, "write", full)  # the temporary is made, its write fails
    with pytest.raises(OSError):
        runs.write_record(str(tmp_path), {"status": "ok"})
    assert os.listdir(tmp_path) == ["record.json"]
    assert json.loads((tmp_path / "record.json").read_text()) == {"status": "running"}


@pytest.mark.parametrize("seeds, message", [
    ("-1", "scalebox: --seeds -1: a seed is from 0 to 4294967295, got -1"),
    ("99999999999999999999", "scalebox: --seeds 99999999999999999999: a seed is from 0 to 4294967295, got 99999999999999999999"),
    ("0-4294967296", "scalebox: --seeds 0-4294967296: a seed is from 0 to 4294967295, got 4294967296"),
    ("3-1", "scalebox: --seeds 3-1: an empty range (write the lower seed first)"),
])
def test_seeds_out_of_range_are_one_line_and_start_nothing(plain, seeds, message):
    """numpy refused such a seed in the child ("Seed must be between 0 and 2**32 - 1"), after
    the run had started; an empty range started nothing and exited 0."""
    proc = scalebox("run", "--seeds", seeds, "noseed.py", cwd=plain, check=False)
    assert proc.returncode == 2 and proc.stderr.strip() == message, proc.stderr
    assert runs.list_runs(str(plain)) == []


def test_an_unterminated_line_longer_than_any_point_is_passed_over_not_read_again(tmp_path):
    """A script writing megabytes without a newline into metrics.jsonl: the readers (scalebox run's
    recorder, compare, the monitor) read it once and go on from after it, in bounded pieces; it
    was read whole again on every poll (300 MB: `scalebox run` at 1.3 GB). Its rest, once its
    newline comes, is one malformed line; the points around it are kept."""
    from scalebox_cst.monitor.files import MetricsFile

    path = tmp_path / "metrics.jsonl"
    point = b'{"name": "loss", "step": %d, "value": 1.0, "time": 0.0}\n'
    garbage = b"x" * (runs.LONGEST_LINE + 5)
    path.write_bytes(point % 0 + garbage)
    points, offset = runs.read_metrics(str(path))
    assert [p.step for p in points] == [0] and offset == path.stat().st_size  # passed over
    with open(path, "ab") as fh:
        fh.write(b"more garbage\n" + point % 1)
    points, offset = runs.read_metrics(str(path), offset)
    assert [p.step for p in points] == [1] and offset == path.stat().st_size
    lines, end = runs.read_lines(str(path), 0, limit=10)  # the monitor's bounded reads: the first line only
    assert lines == [(point % 0).rstrip(b"\n")] and end == len(point % 0)
    short = tmp_path / "short.jsonl"
    short.write_bytes(point % 0 + b'{"name": "loss", "st')  # being written: left for the next call
    assert runs.read_lines(str(short), 0) == ([(point % 0).rstrip(b"\n")], len(point % 0))
    monitor = MetricsFile(str(path))  # the monitor's reader: both points, the garbage passed over
    monitor.refresh()
    assert monitor.offset == path.stat().st_size and sorted(monitor.series) == ["loss"]


def test_a_record_far_larger_than_any_written_reads_as_damaged_without_being_read_whole(tmp_path, monkeypatch):
    """A 300 MB record.json (a damaged or hostile run folder) held `scalebox log`, `status` and the
    monitor's every poll at 650 MB (the fourth fault campaign): past the limit it is damaged."""
    import json

    from scalebox_cst import calibration, fallbacks, intake

    monkeypatch.setattr(intake, "STATE_LIMIT", 1 << 16)
    folder = tmp_path / "run" / "0001" / "0001"
    folder.mkdir(parents=True)
    (folder / runs.RECORD).write_text(json.dumps({"status": "ok", "script": "train.py", "junk": "x" * (1 << 17)}))
    (folder / runs.SITES).write_text(json.dumps({"sites": [{"path": "t.py", "junk": "x" * (1 << 17)}]}))
    record = runs.load_record(str(folder))
    assert record["status"] == "lost" and "larger than" in record["stop_reason"] and "junk" not in record
    assert runs.read_sites(str(folder)) == []
    (folder / fallbacks.FILE).write_text(json.dumps({"fallbacks": [{"op": "aten::x", "count": 1, "junk": "x" * (1 << 17)}]}))
    (folder / calibration.FILE).write_text(json.dumps({"lines": [], "junk": "x" * (1 << 17)}))
    assert fallbacks.read(str(folder)) is None and calibration.read(str(folder)) is None
    (folder / runs.RECORD).write_text(json.dumps({"status": "ok", "script": "train.py", "wall_time": 1.0}))
    (folder / fallbacks.FILE).write_text(json.dumps({"fallbacks": [{"op": "aten::x", "count": 1}]}))
    (folder / calibration.FILE).write_text(json.dumps({"lines": []}))
    assert runs.load_record(str(folder))["status"] == "ok"
    assert fallbacks.read(str(folder)) == [{"op": "aten::x", "count": 1}] and calibration.read(str(folder)) == {"lines": []}


def test_a_damaged_calibration_record_feeds_no_range_and_breaks_no_rewrite(tmp_path):
    """The fp16 rewrite reads the newest calibration run's ranges from its record: a record whose
    ``precision`` rows lacked ``line`` (or whose ``lines`` was not a list) ended the rewrite in a
    KeyError/TypeError traceback; such rows are passed over, as calibration.read passes over the file."""
    import json

    from scalebox_cst import calibration
    from scalebox_cst.config import Config

    config = Config.from_dict({"transforms": ["precision.autocast"], "precision": {"mode": "fp16"}})
    for number, kept in enumerate([{"lines": 5}, {"lines": [{"file": "t.py"}, {"file": "t.py", "line": 3, "max": 7.0}]}], 1):
        folder = tmp_path / ".scalebox" / "runs" / "run" / "0001" / f"{number:04d}"
        folder.mkdir(parents=True)
        (folder / runs.RECORD).write_text(json.dumps({"status": "ok", "started": float(number), "precision": kept}))
    assert calibration.inject(str(tmp_path), config)
    assert config.option("precision", "calibration") == {"t.py:3": [7.0, None]}


def test_steps_per_second_of_a_short_run_is_no_quarter_second_window():
    """A run of a few seconds has one periodic SPS point and the one written at its exit: two
    identical seeded DQN runs (the newcomer's walkthrough) read 151 and 1471 steps/s from the
    0.26 s between them. The stretch is at least a second, widened towards the start, down to
    the run's start (the first point's rate counts from there)."""
    from scalebox_cst import headlines

    # 2,000 steps in the first 2 s (1,000/s), then 40 steps in the 0.26 s before exit (training)
    short = [(2000.0, 102.0, 1000.0), (2040.0, 102.26, 40 / 0.26)]
    assert headlines.steps_per_second(short, counts_steps=True) == pytest.approx(2040 / 2.26)
    # the later half alone would be under a second: widened to the point before it
    points = [(1000.0, 101.0, 1000.0), (2000.0, 102.0, 1000.0), (2500.0, 102.5, 1000.0), (2540.0, 102.8, 133.3)]
    assert headlines.steps_per_second(points, counts_steps=True) == pytest.approx(1540 / 1.8)
    # long enough: the later half, as before
    long = [(1000.0 * i, 100.0 + 2 * i, 500.0) for i in range(1, 7)]
    assert headlines.steps_per_second(long, counts_steps=True) == pytest.approx(3000 / 6.0)


def test_the_last_line_never_says_record_in_a_folder_whose_record_is_the_starts(tmp_path):
    """A disk that filled before a run's end: "record not written ...; it reads as lost", then
    the last line "ok ...; record in <folder>", where record.json still said "running" (the
    fault campaign's third list). The last line now says the record is the one from the start."""
    run = _fake_run(tmp_path, "run/0001", 1000.0, 10.0, 500.0, 9.0)
    assert runs.where_recorded(run.dir) == f"record in {run.dir}"
    record = runs.load_record(run.dir)
    record.update(status="running", pid=2 ** 22 + 7, ended=None)  # its process is gone
    runs.write_record(run.dir, record)
    said = runs.where_recorded(run.dir)
    assert "record in" in said and "from its start" in said and "reads as lost" in said, said
    os.remove(os.path.join(run.dir, runs.RECORD))
    assert runs.where_recorded(run.dir).startswith("no record in")


def test_headline_of_a_run_that_trains_in_workers_and_evaluates_in_its_own_process():
    """BY571's IQN steps its training env in SubprocVecEnv workers and an evaluation env in the
    main process: the 6 evaluation episodes (56 steps) were the run's return, and the main
    process's SPS (15 steps/s) its speed, beside 1,000 training steps in about 3 s."""
    def pts(name, rows):
        return [runs.Point(name, step, value, t) for step, value, t in rows]
    own = "scalebox/episodic_return"
    work = "scalebox/workers/1/episodic_return"
    series = {
        own: pts(own, [(9, 9.0, 0.5), (18, 9.0, 2.0), (27, 9.0, 4.0)]),
        "scalebox/SPS": pts("scalebox/SPS", [(9, 18.0, 0.5), (27, 7.0, 4.0)]),
        work: pts(work, [(100 * i, 20.0 + i, 0.4 * i) for i in range(1, 11)]),
    }
    head = runs.headline({}, series)
    assert head["metric_return"] == "scalebox/workers/*/episodic_return"
    assert head["episodes"] == 10 and head["episodic_return_final"] == 25.5
    assert head["sps"] == pytest.approx((1027 - 418) / 2.0)  # every env's steps over the later half (from 2 s to 4 s)
    # the run's own process stepped the most: its episodes and SPS stay the run's
    series[own] = pts(own, [(2000 * i, 50.0, 0.5 * i) for i in range(1, 9)])
    head = runs.headline({}, series)
    assert head["metric_return"] == own and head["episodic_return_final"] == 50.0


@pytest.mark.parametrize("declared, via", [
    ('p.add_argument("--seed", default=1, type=int)', "option"),
    ('p.add_argument("--seed", type=int, default=0, help="the seed")\np.add_argument("--seeded", action="store_true")', "option"),
    ("p.add_argument('--seed', default=False, type=bool)", "env"),  # sweetice's DDPG: a switch
    ('p.add_argument("--seed", action="store_true")', "env"),
    ('@click.option("--seed", is_flag=True)\ndef main(seed): pass', "env"),
    ("class Args:\n    seed: int = 1", "option"),  # tyro / simple-parsing
    ('p.add_argument("-seed", type=int, default=1)', "-seed"),  # BY571's IQN: -env, -frames, -seed
    ('p.add_argument("-seed", action="store_true")', "env"),
    ('name = "run-seed-3"', "env"),  # no option: a string that holds the word
    # words are no declaration: a helper's `seed: int`, a comment, another program's arguments
    ('p.add_argument("-seed", type=int, default=1)\ndef set_seed(seed: int): pass', "-seed"),
    ('p.add_argument("--random_seed", type=int)\ndef make_env(env_id, seed: int, idx): pass', "env"),
    ('# usage: train.py "--seed" 3\nsubprocess.run(["python", "eval.py", "--seed", "3"])', "env"),
    ("seed: int = 0", "env"),
    # and what reads the command line is one
    ("import typer\ndef main(seed: int = 0): pass\ntyper.run(main)", "option"),
    ("app = typer.Typer()\n@app.command()\ndef train(seed: int = 0): pass", "option"),
    ("import tyro\ndef main(seed: int = 0): pass\ntyro.cli(main)", "option"),
    ('seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 0', "option"),
])
def test_the_seed_option_a_script_takes_and_a_switch_that_is_none(declared, via):
    """sweetice's DDPG declares `--seed` with type=bool (seed with --random_seed 9527 or not):
    `--seeds 0,1` appended `--seed 0` and `--seed 1`, both True, and the two runs were one."""
    from scalebox_cst.runner import seedopt

    source = f"import argparse, click\np = argparse.ArgumentParser()\n{declared}\n".encode()
    assert (seedopt.seed_flag(source) or "env") == via.replace("option", "--seed")
    if via != "env":
        assert seedopt.without_seed([*["--lr", "3"], *seedopt.seed_args(seedopt.seed_flag(source), 4)], 4) == ["--lr", "3"]


def test_compare_says_when_each_shared_seed_gave_identical_returns(tmp_path):
    """A rewrite that changed no number (higgsfield's DDPG, ericyangyu's PPO: the same episode
    returns for each seed, bit for bit) read "+0 (+0.0%) [-112.5, +112.5], within noise", as if
    it might differ; and where the original had also run seeds 2 and 3, "+12.96 (+1.0%) ...
    within noise" without a word that the means were over other seeds. The verdict stands;
    beside it, what the seeds say."""
    def group(branch, returns, seeds, start):
        return _seeded_runs(tmp_path, branch, seeds, start, lambda i, seed: returns(seed))

    def text(first, other):
        result = stats.compare([("original", first), ("run/0002", other)])
        (ret,) = [m for m in result["metrics"] if m["metric"] == "episodic_return"]
        return ret["groups"][1]["vs_first"]["text"]

    same = group("run/0001", lambda s: [10.0 + s, 12.0 * s], [0, 1], 1000.0)
    rewrite = group("run/0002", lambda s: [10.0 + s, 12.0 * s], [0, 1], 5000.0)
    said = text(same, rewrite)
    assert "within noise; identical episode returns on each seed (0, 1)" in said, said
    more = group("run/0001", lambda s: [10.0 + s, 12.0 * s], [2, 3], 9000.0)
    said = text(same + more, rewrite)
    assert ("other seeds on the two sides (original: 0, 1, 2, 3; run/0002: 0, 1), so the means are over other "
            "seeds; on the seeds both ran (0, 1) the episode returns are identical") in said, said
    changed = group("run/0003", lambda s: [10.0 + s, 12.5 * s], [0, 1], 13000.0)
    assert "identical" not in text(same, changed) and "seeds" not in text(same, changed)
    assert "identical" not in text(same + more, changed) and "over other seeds" in text(same + more, changed)


def test_a_seed_option_of_a_parser_with_subcommands_goes_before_them(tmp_path):
    """argparse takes a top-level option only before the subcommand: `--seeds` appended `--seed 0`
    after `train --lr 1`, argparse refused it ("unrecognized arguments") and every seeded run of
    such a script failed. Options of a subcommand's own parser stay after it."""
    from scalebox_cst.runner import seedopt

    (tmp_path / "main.py").write_text(textwrap.dedent("""\
        import argparse, random
        parser = argparse.ArgumentParser()
        parser.add_argument("--seed", type=int, default=7)
        sub = parser.add_subparsers(dest="cmd", required=True)
        train = sub.add_parser("train")
        train.add_argument("--lr", type=float, default=0.1)
        args = parser.parse_args()
        random.seed(args.seed)
        print(f"cmd={args.cmd} seed={args.seed} lr={args.lr} draw={random.random():.6f}")
        """))
    scalebox("init", ".", cwd=tmp_path)
    scalebox("rewrite", ".", cwd=tmp_path)
    proc = scalebox("run", "--seeds", "0,1", "main.py", "--", "train", "--lr", "0.5", cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "cmd=train seed=0 lr=0.5" in proc.stdout and "cmd=train seed=1 lr=0.5" in proc.stdout, proc.stdout
    recs = records(tmp_path, "run/0001")
    assert [r["args"] for r in recs] == [["--seed", "0", "train", "--lr", "0.5"], ["--seed", "1", "train", "--lr", "0.5"]]
    assert all(seedopt.without_seed(r["args"], r["seed"]) == ["train", "--lr", "0.5"] for r in recs)
    # a --seed of the subcommand's own parser is given after it, as before
    own = b"import argparse\np = argparse.ArgumentParser()\ns = p.add_subparsers()\nt = s.add_parser('t')\nt.add_argument('--seed', type=int)\n"
    assert seedopt.seeded(own, ["t"], 3) == (["t", "--seed", "3"], "option")
