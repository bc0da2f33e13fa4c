"""The monitor's branch row shows the rewrite's numbers, not a baseline run made after it.

``scalebox run --seeds 0`` then ``scalebox run --original --seeds 0`` on one branch: the row's
final return and steps/s were the original's (the newest run with numbers), unmarked, in the
row that stands for the rewrite. The row also shows the run's CPU time (the figure a rewrite
saves; the monitor showed none), with the branch's own ``--original`` runs to read it against.
"""
import time

from scalebox_cst import runs
from scalebox_cst.monitor.api import Monitor
from scalebox_cst.project import Project


def _run(root, branch, variant, started, final, sps, cpu=None, status="ok"):
    number, folder = runs.allocate_run(root, branch)
    runs.write_record(folder, {
        "branch": branch, "run": number, "commit": "0" * 40, "source_commit": None, "variant": variant,
        "script": "train.py", "args": [], "seed": 0, "pid": None, "pgid": None, "host": None,
        "started": started, "ended": started + 10, "wall_time": 10.0, "exit_status": 0, "status": status,
        "signal": None, "hotfix_of": None, "launcher": "local", "nproc": 1,
        "headline": {"episodic_return_final": final, "sps": sps, **({} if cpu is None else {"cpu_time_s": cpu})},
        "error_tail": [],
    })


def _two_branches(tmp_path):
    """A project whose train.py was committed twice: (its root, the two branches)."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text("print('hi')\n")
    project, _ = Project.init(str(root))
    first = project.commit_change(force=True).report.branch
    (root / "train.py").write_text("print('hi again')\n")
    return root, (first, project.commit_change(force=True).report.branch)


def test_branch_headline_is_the_newest_rewrite_runs_else_the_originals(tmp_path):
    root, (first, second) = _two_branches(tmp_path)
    now = time.time()
    _run(str(root), first, "rewrite", now - 100, 2.0, 900.0)
    _run(str(root), first, "original", now - 50, 1.0, 600.0)  # the baseline, run after
    _run(str(root), second, "original", now - 40, 5.0, 700.0)  # no rewrite run yet
    by = {b["name"]: b for b in Monitor(str(root)).branches()["branches"]}
    assert by[first]["headline_run"] == f"{first}#1" and by[first]["headline"]["sps"] == 900.0
    assert by[second]["headline_run"] == f"{second}#1" and by[second]["headline"]["episodic_return_final"] == 5.0


def test_branch_row_has_its_cpu_time_and_the_median_of_its_finished_original_runs(tmp_path):
    root, (branch, never) = _two_branches(tmp_path)
    now = time.time()
    _run(str(root), branch, "original", now - 300, 1.0, 600.0, cpu=4.8)
    _run(str(root), branch, "original", now - 250, 1.0, 600.0, cpu=5.2)
    _run(str(root), branch, "original", now - 200, 1.0, 600.0, cpu=0.4, status="failed")  # stopped early: no baseline
    _run(str(root), branch, "original", now - 190, 1.0, 600.0, cpu=6.0)
    _run(str(root), branch, "rewrite", now - 100, 1.0, 900.0, cpu=4.3)
    _run(str(root), never, "rewrite", now - 50, 1.0, 900.0)  # a record without CPU time (an older run)
    by = {b["name"]: b for b in Monitor(str(root)).branches()["branches"]}
    assert by[branch]["headline"]["cpu_time_s"] == 4.3
    assert by[branch]["original_cpu_time_s"] == 5.2 and by[branch]["original_runs"] == 3
    assert "cpu_time_s" not in by[never]["headline"]
    assert by[never]["original_cpu_time_s"] is None and by[never]["original_runs"] == 0
