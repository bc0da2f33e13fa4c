"""A run's record.json with a structured field of the wrong shape (edited by hand, damaged,
written by a hostile tool) reads as missing in that field; the other runs and the rest of that
run stay readable in ``log``, ``compare``, ``profile`` and the monitor.

Found by the fourth fault campaign: one record with ``"fallbacks": 5`` (or ``"x"``, ``[1]``,
``{"a": 1}``), a ``profile`` whose categories were not rows, or ``args`` holding a number, made
``scalebox log``, ``compare`` and ``profile`` end in a TypeError traceback and the monitor answer
500 for ``/api/branches`` and ``/api/runs`` (the whole project's page)."""
from __future__ import annotations

import json
import os

from scalebox_cst import recordtypes, runs
from scalebox_cst.monitor.api import Monitor

from conftest import scalebox

GOOD_PROFILE = {
    "method": "sampled at 25 Hz", "hz": 25.0, "cpu_measured": True, "samples": 10, "wall_s": 1.0, "cpu_s": 0.5,
    "categories": [{"category": "other", "label": "other", "samples": 10, "wall_s": 1.0, "cpu_s": 0.5, "share": 1.0}],
    "lines": [{"path": "train.py", "line": 3, "category": "other", "categories": None, "share": 1.0, "wall_s": 1.0,
               "cpu_s": 0.5, "samples": 10, "calls": 2}],
}
HOSTILE = [
    ("fallbacks", 5), ("fallbacks", "x"), ("fallbacks", [1]), ("fallbacks", {"a": 1}), ("fallbacks", [{"op": 1}]),
    ("fallbacks", [{"op": "a", "count": "b"}]), ("fallbacks", [{"op": "a", "count": 3, "file": 5}]),
    ("profile", 5), ("profile", {"categories": 5}), ("profile", {"categories": {"x": "y"}}),
    ("profile", {**GOOD_PROFILE, "categories": [{"category": "x"}]}), ("profile", {**GOOD_PROFILE, "lines": [{"path": 1}]}),
    ("profile", {**GOOD_PROFILE, "lines": [{**GOOD_PROFILE["lines"][0], "coverage": 5}]}),
    ("profile", {**GOOD_PROFILE, "lines": [{**GOOD_PROFILE["lines"][0], "coverage": {"covered": True, "pass_rate": 0.5}}]}),
    ("args", [1]), ("args", [{"op": 1}]), ("args", "x"), ("error_tail", [1, None]), ("limits", 5), ("tags", [1]),
]


def _record(folder: str, key: str, value) -> None:
    os.makedirs(folder)
    record = {"status": "ok", "run": int(folder[-4:]), "branch": "run/0001", "script": "train.py", "args": ["--x", "1"],
              "started": 1.0e9, "ended": 1.0e9 + 3, "wall_time": 3.0, "exit_status": 0, "variant": "rewrite",
              "headline": {}, "profile": GOOD_PROFILE, key: value}
    with open(os.path.join(folder, runs.RECORD), "w") as fh:
        json.dump(record, fh)
    with open(os.path.join(folder, runs.METRICS), "w") as fh:
        fh.write(json.dumps({"name": "losses/loss", "value": 0.5, "step": 1}) + "\n")


def test_a_kept_profile_of_the_shape_reduce_makes_is_kept():
    record = {"profile": json.loads(json.dumps(GOOD_PROFILE)), "fallbacks": [{"op": "aten::gelu", "count": 3, "file": "t.py", "line": 2}]}
    recordtypes.typed(record)
    assert record["profile"] == GOOD_PROFILE and record["fallbacks"] == [{"op": "aten::gelu", "count": 3, "file": "t.py", "line": 2}]


def test_hostile_record_fields_read_as_missing_in_every_reader(project):
    root = str(project)
    assert scalebox("init", ".", cwd=root, check=False).returncode == 0
    assert scalebox("rewrite", "train.py", cwd=root, check=False).returncode == 0
    base = os.path.join(runs.runs_root(root), "run", "0001")
    for number, (key, value) in enumerate(HOSTILE, start=1):
        _record(os.path.join(base, f"{number:04d}"), key, value)
    found = runs.list_runs(root)
    assert len(found) == len(HOSTILE)
    for info, (key, _) in zip(found, HOSTILE):
        assert isinstance(info.record.get("args", []), list) and all(isinstance(a, str) for a in info.record.get("args", []))
        assert recordtypes.profile_shape(info.record.get("profile"))
        assert all(recordtypes.fallback_row(r) for r in info.record.get("fallbacks") or [])
    monitor = Monitor(root, runs_ttl=0)
    assert [b["name"] for b in monitor.branches()["branches"]] == ["run/0001"]
    assert len(monitor.runs("run/0001")["runs"]) == len(HOSTILE)
    for args in (("log",), ("compare", "run/0001#1", "run/0001#8"), ("profile", "run/0001#8"), ("profile", "run/0001#1")):
        proc = scalebox(*args, cwd=root, check=False)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr[-1500:])
