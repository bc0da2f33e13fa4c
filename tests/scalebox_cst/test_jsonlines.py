"""Damaged lines of a run's JSON-lines files are counted and said, never skipped silently
(scalebox_cst.jsonlines): a run whose metrics.jsonl was cut by kill -9, a full disk or a stray
non-JSON line showed its numbers as if nothing was missing. A cut last line of a run still
running is being written, not damage."""
from __future__ import annotations

import json

from scalebox_cst import jsonlines, profile, runs
from scalebox_cst.monitor.files import EventsFile, MetricsFile
from conftest import scalebox

POINT = '{"name": "loss", "step": %d, "value": 1.5, "time": 1.0}\n'


def _damaged_metrics(path):
    """Two points, a non-JSON line, a JSON line that is no point, and a cut last line."""
    path.write_text(POINT % 0 + "not json at all\n" + '{"step": 3}\n' + POINT % 1 + '{"name": "loss", "st')


def test_readers_count_damaged_lines_and_a_cut_last_line_only_once_the_writer_ended(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _damaged_metrics(path)
    damage = {}
    points, offset = runs.read_metrics(str(path), damage=damage)
    assert [p.step for p in points] == [0, 1] and damage == {"metrics.jsonl": 2}  # the cut line: being written
    assert offset < path.stat().st_size
    damage = {}
    points, offset = runs.read_metrics(str(path), ended=True, damage=damage)
    assert [p.step for p in points] == [0, 1] and damage == {"metrics.jsonl": 3} and offset == path.stat().st_size
    assert jsonlines.note(damage) == "metrics.jsonl: 3 damaged lines skipped"
    assert jsonlines.note({"events.jsonl": 1}) == "events.jsonl: 1 damaged line skipped"
    assert jsonlines.note({}) is None and jsonlines.note("x") is None
    # a whole last line without its newline, of a run that ended: a point, not damage
    whole = tmp_path / "whole" / "metrics.jsonl"
    whole.parent.mkdir()
    whole.write_text(POINT % 0 + (POINT % 1).rstrip("\n"))
    damage = {}
    assert len(runs.read_metrics(str(whole), ended=True, damage=damage)[0]) == 2 and damage == {}
    # the run's headline, as `scalebox log` computes it: running (cut line not counted), lost (counted)
    (tmp_path / "events.jsonl").write_text('{"kind": "started", "message": "m"}\n[1, 2]\n')
    running = runs.RunInfo("run/0001", 1, str(tmp_path), {"status": "running"})
    lost = runs.RunInfo("run/0001", 1, str(tmp_path), {"status": "lost"})
    assert runs.run_headline(running)["damaged"] == {"metrics.jsonl": 2, "events.jsonl": 1}
    assert runs.run_headline(lost)["damaged"] == {"metrics.jsonl": 3, "events.jsonl": 1}
    # the monitor's incremental readers: the same counts, the cut line once the run ended
    monitor = MetricsFile(str(path))
    monitor.refresh()
    assert monitor.damage == {"metrics.jsonl": 2} and monitor.series["loss"].count == 2
    monitor.refresh(ended=True)
    assert monitor.damage == {"metrics.jsonl": 3}
    events = EventsFile(str(tmp_path / "events.jsonl"))
    events.refresh()
    assert events.damage == {"events.jsonl": 1} and len(events.events) == 1


def test_profile_reader_counts_its_damaged_lines_and_says_so(tmp_path):
    good = {"hz": 25.0, "cpu": True, "rows": [["train.py", 4, "backward", 3, 0.3, 0.2, 2]]}
    (tmp_path / profile.FILE).write_text(json.dumps(good) + "\n" + "garbage\n" + '{"hz": 25.0, "ro')
    live = profile.summarize(str(tmp_path), ended=False)
    assert live["damaged"] == {"profile.jsonl": 1}
    ended = profile.summarize(str(tmp_path))
    assert ended["damaged"] == {"profile.jsonl": 2}
    assert "profile.jsonl: 2 damaged lines skipped" in profile.render(ended)
    assert profile.compact(ended)["damaged"] == "profile.jsonl: 2 damaged lines skipped"


SCRIPT = """\
import os
for i in range(3):
    print(f'step={i} reward={i}', flush=True)
with open(os.environ['SCALEBOX_METRICS_FILE'], 'a') as fh:  # what a full disk, a stray writer, kill -9 leave
    fh.write('not json\\n{"name": "reward", "value": "many"}\\n{"name": "reward", "st')
"""


def test_a_run_with_damaged_metrics_says_so_at_its_end_in_log_and_in_compare(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    scalebox("init", ".", cwd=tmp_path)
    proc = scalebox("run", "train.py", cwd=tmp_path)
    said = "metrics.jsonl: 3 damaged lines skipped"
    end = proc.stderr.strip().splitlines()[-1]
    assert said in end, proc.stderr[-800:]
    run_dir = next((tmp_path / ".scalebox" / "runs").glob("run/*/*"))
    record = json.loads((run_dir / "record.json").read_text())
    assert record["headline"]["damaged"] == {"metrics.jsonl": 3}
    log = scalebox("log", cwd=tmp_path).stdout
    assert log.count(said) == 1, log
    compared = scalebox("compare", "run/0001", "run/0001", cwd=tmp_path).stdout
    assert f"run/0001#1: {said}" in compared, compared
    assert json.loads(scalebox("compare", "run/0001", "run/0001", "--json", cwd=tmp_path).stdout)["groups"][0]["damaged"] \
        == {"run/0001#1": said}
    from scalebox_cst.monitor.api import Monitor

    assert Monitor(str(tmp_path)).runs("run/0001")["runs"][0]["damaged"] == said  # the web monitor's data
    with open(run_dir / "events.jsonl", "a") as fh:
        fh.write("garbage\n")
    assert Monitor(str(tmp_path)).events()["damaged"] == ["run/0001#1: events.jsonl: 1 damaged line skipped"]
