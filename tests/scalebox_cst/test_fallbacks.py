"""NPU CPU-fallback operators mapped to the user's lines (issue 24 part 2), with the test stand-in
tests/fake_torch_npu, which warns in torch_npu's own words once per operator (its FALLBACK_OPS)."""
from __future__ import annotations

import json
import os
import textwrap

from scalebox_cst import fallbacks, profile, runs
from scalebox_cst.project import Project

from conftest import HERE, scalebox

FAKE = os.path.join(HERE, "fake_torch_npu")
SCRIPT = textwrap.dedent(
    """\
    import torch
    import torch_npu
    from helpers import shift

    x = torch.arange(8, device="npu")
    for step in range(7):
        y = torch.bitwise_left_shift(x, x)
    for step in range(3):
        z = shift(x)
    print("done", int(y.sum()), int(z.sum()))
    """
)
HELPER = "def shift(x):\n    return x.bitwise_left_shift(x)\n"
LOOP_LINE, HELPER_LINE = 7, 2


def _env():
    return {"PYTHONPATH": os.pathsep.join(p for p in (FAKE, os.environ.get("PYTHONPATH")) if p)}


def _project(project, backend="cpu"):
    (project / "train.py").write_text(SCRIPT)
    (project / "helpers.py").write_text(HELPER)
    (project / "scalebox.toml").write_text(f'backend = "{backend}"\ntransforms = ["grad_clip"]\n')
    scalebox("rewrite", str(project), env=_env())
    return project


def test_each_fallback_is_counted_at_its_line_in_the_project(project):
    _project(project)
    proc = scalebox("run", "train.py", cwd=project, env=_env())
    [run] = runs.list_runs(str(project))
    rows = {(r["op"], r["file"], r["line"]): r["count"] for r in run.record["fallbacks"]}
    op = "aten::bitwise_left_shift.Tensor_out"
    # every call, not the one warning: the loop's 7 at its line, the helper's 3 at the helper's line
    assert rows == {(op, "train.py", LOOP_LINE): 7, (op, "helpers.py", HELPER_LINE): 3}, proc.stderr
    events = [json.loads(line) for line in open(os.path.join(run.dir, runs.EVENTS), encoding="utf-8")]
    first = [e for e in events if e["kind"] == "fallback"]
    assert [(e["file"], e["line"]) for e in first] == [("train.py", LOOP_LINE), ("helpers.py", HELPER_LINE)]
    assert proc.stderr.count("CAUTION: The operator") == 1  # printed as torch_npu prints it: once
    log = scalebox("log", cwd=project).stdout
    assert f"CPU fallbacks: {op} x7 at train.py:{LOOP_LINE}, {op} x3 at helpers.py:{HELPER_LINE}" in log


def test_counting_can_be_switched_off_leaving_the_warning_count(project):
    _project(project)
    scalebox("run", "train.py", cwd=project, env={**_env(), "SCALEBOX_FALLBACK_COUNT": "0"})
    [run] = runs.list_runs(str(project))
    assert [(r["line"], r["count"]) for r in run.record["fallbacks"]] == [(LOOP_LINE, 1)]


def test_compare_shows_counts_per_branch(project):
    _project(project)
    scalebox("run", "train.py", cwd=project, env=_env())
    (project / "train.py").write_text(SCRIPT.replace("range(7)", "range(2)"))
    scalebox("rewrite", str(project), env=_env())
    scalebox("run", "run/0002", "train.py", cwd=project, env=_env())
    out = scalebox("compare", "run/0001", "run/0002", cwd=project).stdout
    assert "CPU fallbacks (calls per run)" in out
    assert f"aten::bitwise_left_shift.Tensor_out at train.py:{LOOP_LINE}: run/0001 7, run/0002 2" in out


def test_profile_names_fallback_lines_among_hot_lines():
    prof = {"lines": [{"path": "train.py", "line": 7, "share": 0.5, "category": "model", "calls": 3},
                      {"path": "train.py", "line": 9, "share": 0.2, "category": "model", "calls": 1}],
            "categories": [], "samples": 10, "method": "sampled", "wall_s": 1.0}
    fallbacks.mark_profile(prof, [{"op": "aten::x", "file": "train.py", "line": 7, "count": 12}])
    assert prof["lines"][0]["fallbacks"] == [{"op": "aten::x", "count": 12}] and "fallbacks" not in prof["lines"][1]
    assert "CPU fallback: aten::x x12" in profile.render(prof)


def test_next_rewrite_names_the_npu_kernel_of_a_fallback_at_its_site(project):
    """A run recorded aten::gelu on the CPU at the F.gelu line: the next rewrite's gelu site says
    the device table's fused_op.gelu is its NPU kernel; a site on another line is not told."""
    (project / "train.py").write_text("import torch\nimport torch.nn.functional as F\nx = torch.ones(3)\ny = F.gelu(x)\nz = F.gelu(y)\n")
    (project / "scalebox.toml").write_text('backend = "npu"\ntransforms = ["device.*"]\n')
    proj = Project(str(project))
    number, directory = runs.allocate_in(os.path.join(proj.runs_dir, "run", "0001"))
    runs.write_record(directory, {"branch": "run/0001", "run": number, "status": "ok", "started": 1.0,
                                  "fallbacks": [{"op": "aten::gelu", "file": "train.py", "line": 4, "count": 40}]})
    report = json.loads(scalebox("rewrite", str(project), "--json", env=_env()).stdout)
    sites = [s for f in report["files"] if f["path"] == "train.py" for s in f["sites"] if s["transform"] == "device.fused_op"]
    told = [s["line"] for s in sites if "aten::gelu fell back to the CPU 40x on line 4" in s["reason"]]
    assert told == [4] and "fused_op.gelu" in next(s["reason"] for s in sites if s["line"] == 4)
    assert len(sites) == 2
