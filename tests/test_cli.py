"""The CLI end to end, as a user runs it: init, rewrite, run, log, diff, rollback."""
import json
import os
import subprocess
import sys

import pytest

from conftest import scalebox


def git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=True).stdout


def test_init_creates_store_config_and_reports_backend(project):
    out = scalebox("init", str(project)).stdout
    assert (project / ".scalebox" / "store.git").is_dir()
    assert (project / ".scalebox" / ".gitignore").read_text().strip() == "*"
    assert (project / "scalebox.toml").is_file()
    assert "backend: cpu" in out


def test_rewrite_json_schema_and_commit(project):
    scalebox("init", str(project))
    report = json.loads(scalebox("rewrite", str(project), "--json", "--backend", "cpu").stdout)
    assert set(report) == {"branch", "commit", "source_commit", "backend", "files"}
    assert report["branch"] == "run/0001" and report["backend"] == "cpu"
    files = {f["path"]: f for f in report["files"]}
    assert set(files) == {"train.py", "helpers.py"}
    train = files["train.py"]
    assert train["status"] == "rewritten" and train["error"] is None
    site = next(s for s in train["sites"] if s["transform"] == "grad_clip")
    assert set(site) >= {"transform", "line", "end_line", "action", "reason", "exactness"}
    assert site["action"] == "rewritten" and site["exactness"] == "changes-semantics"
    assert site["line"] == 17  # optimizer.step()
    assert files["helpers.py"]["status"] == "unchanged"
    # the user's file is untouched; the store is a normal git repository
    assert "clip" not in (project / "train.py").read_text()
    log = git("--git-dir", str(project / ".scalebox" / "store.git"), "log", "--all", "--format=%s", cwd=project)
    assert b"rewrite:" in log
    shown = git("--git-dir", str(project / ".scalebox" / "store.git"), "show", "run/0001:train.py", cwd=project)
    assert b"_scalebox_clip_grad_norm(optimizer, max_norm=1.0)" in shown


def test_rewrite_out_writes_files_and_transform_filters(project, tmp_path):
    out_dir = tmp_path / "out"
    res = scalebox("rewrite", str(project / "train.py"), "--out", str(out_dir), "--backend", "cpu", "--set", "grad_clip.max_norm=0.5")
    assert "run/0001" in res.stdout
    assert "max_norm=0.5" in (out_dir / "train.py").read_text()
    report = json.loads(scalebox("rewrite", str(project), "--json", "--no-transform", "grad_clip", "--backend", "cpu").stdout)
    assert report["branch"] == "run/0002"
    assert all(f["status"] == "unchanged" for f in report["files"])


def test_syntax_error_file_is_reported_in_one_line_and_carried(project):
    (project / "broken.py").write_text("def f(:\n")
    proc = scalebox("rewrite", str(project), "--backend", "cpu")
    assert "broken.py:1: SyntaxError" in proc.stderr
    shown = git("--git-dir", str(project / ".scalebox" / "store.git"), "show", "run/0001:broken.py", cwd=project)
    assert shown == b"def f(:\n"


def test_run_executes_the_committed_rewrite_and_records_it(project):
    scalebox("rewrite", str(project), "--backend", "cpu")
    # change the user's helper after the commit: the run must still use the committed one
    (project / "helpers.py").write_text("raise SystemExit('served from disk, not the commit')\n")
    proc = scalebox("run", "train.py", "--", "--steps", "2", cwd=project)
    assert "step=1" in proc.stdout and "final_return=1.5" in proc.stdout
    record = json.loads((project / ".scalebox" / "runs" / "run" / "0001" / "record.json").read_text())
    assert record["exit_status"] == 0 and record["wall_time"] > 0
    assert record["metrics"]["grad_norm"]["count"] == 2  # the inserted clip recorded its norm
    assert record["metrics"]["loss"]["count"] == 2
    assert "step=0" in (project / ".scalebox" / "runs" / "run" / "0001" / "log.txt").read_text()
    log = scalebox("log", cwd=project).stdout
    assert log.startswith("run/0001") and "ok" in log and "grad_norm=" in log


def test_run_traceback_shows_rewritten_lines(project):
    (project / "train.py").write_text(
        (project / "train.py").read_text() + "raise RuntimeError('boom')\n"
    )
    scalebox("rewrite", str(project), "--backend", "cpu")
    proc = scalebox("run", "run/0001", "train.py", cwd=project, check=False)
    assert proc.returncode != 0
    # the rewrite inserted one import and one clip line: the raise moved from line 20 to 22
    assert f'File "{os.path.realpath(project / "train.py")}", line 22' in proc.stdout
    assert "raise RuntimeError('boom')" in proc.stdout


def test_diff_labels_hunks_and_stat(project):
    scalebox("rewrite", str(project), "--backend", "cpu")
    diff = scalebox("diff", "run/0001", cwd=project).stdout
    assert "+from scalebox_cst.runtime.clip import clip_grad_norm as _scalebox_clip_grad_norm" in diff
    assert "+    _scalebox_clip_grad_norm(optimizer, max_norm=1.0)" in diff
    assert "grad_clip [changes-semantics] line 17" in diff
    assert "\x1b[" not in diff  # plain when piped
    colored = scalebox("diff", "--color", cwd=project).stdout
    assert "\x1b[" in colored
    stat = scalebox("diff", "--stat", cwd=project).stdout
    assert "train.py" in stat and "1 rewritten" in stat


def test_rollback_restores_and_loses_nothing(project):
    scalebox("rewrite", str(project), "--backend", "cpu")
    original = (project / "train.py").read_text()
    (project / "train.py").write_text(original + "# second version\n")
    (project / "new_module.py").write_text("X = 1\n")
    scalebox("rewrite", str(project), "--backend", "cpu")
    (project / "train.py").write_text(original + "# unsaved third version\n")
    out = scalebox("rollback", "run/0001", cwd=project).stdout
    assert "restored train.py" in out
    assert "left in place (not in run/0001): new_module.py" in out
    assert (project / "train.py").read_text() == original
    assert (project / "new_module.py").exists()
    # the third version was snapshotted before the rollback: it is in the source history
    log = git("--git-dir", str(project / ".scalebox" / "store.git"), "log", "-p", "source", cwd=project)
    assert b"# unsaved third version" in log


@pytest.mark.parametrize(
    "args, message",
    [
        (("rollback", "run/0042"), "unknown branch"),
        (("diff", "run/0042"), "unknown branch"),
    ],
)
def test_unknown_branch_is_a_clear_error(project, args, message):
    scalebox("rewrite", str(project), "--backend", "cpu")
    proc = scalebox(*args, cwd=project, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_missing_store_is_a_clear_error(tmp_path):
    for args in (("log",), ("rollback", "run/0001"), ("diff",)):
        proc = scalebox(*args, cwd=tmp_path, check=False)
        assert proc.returncode != 0 and "scalebox init" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_user_git_repo_untouched(project):
    git("init", "-q", cwd=project)
    git("-c", "user.email=a@b", "-c", "user.name=a", "add", "train.py", "helpers.py", cwd=project)
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "x", cwd=project)
    (project / "helpers.py").write_text(open(project / "helpers.py").read() + "# dirty\n")
    before_status = git("status", "--porcelain", cwd=project)
    before_index = (project / ".git" / "index").read_bytes()
    scalebox("init", str(project))
    (project / "scalebox.toml").unlink()  # init's only file in the tree; it is the user's to keep
    scalebox("rewrite", str(project), "--backend", "cpu")
    scalebox("run", "train.py", "--", "--steps", "1", cwd=project)
    scalebox("rollback", "run/0001", cwd=project)
    assert git("status", "--porcelain", cwd=project) == before_status
    assert (project / ".git" / "index").read_bytes() == before_index


def test_log_lists_import_hook_sessions(project):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(
        [sys.executable, "-m", "scalebox_cst", "train.py", "--steps", "1"], cwd=project, env=env, check=True, capture_output=True
    )
    log = scalebox("log", cwd=project).stdout
    assert log.startswith("hook/") and "import-hook session" in log
    entries = json.loads(scalebox("log", "--json", cwd=project).stdout)
    assert entries[0]["branch"].startswith("hook/") and entries[0]["commits"] >= 1
