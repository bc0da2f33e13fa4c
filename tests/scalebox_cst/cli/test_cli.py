"""The CLI end to end, as a user runs it: init, rewrite, run, log, diff, rollback."""
import json
import re
import time
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
    assert site["action"] == "rewritten" and site["exactness"] == "exact-until-intervention"
    assert site["line"] == 17  # optimizer.step()
    assert files["helpers.py"]["status"] == "unchanged"
    # the user's file is untouched; the store is a normal git repository
    assert "clip" not in (project / "train.py").read_text()
    log = git("--git-dir", str(project / ".scalebox" / "store.git"), "log", "--all", "--format=%s", cwd=project)
    assert b"rewrite:" in log
    shown = git("--git-dir", str(project / ".scalebox" / "store.git"), "show", "run/0001:train.py", cwd=project)
    assert b"_scalebox_stabilize(optimizer, site='train.py:17')" in shown


def test_rewrite_out_writes_files_and_transform_filters(project, tmp_path):
    out_dir = tmp_path / "out"
    res = scalebox("rewrite", str(project / "train.py"), "--out", str(out_dir), "--backend", "cpu", "--set", "grad_clip.mode=fixed", "--set", "grad_clip.max_norm=0.5")
    assert "run/0001" in res.stdout
    assert "max_norm=0.5" in (out_dir / "train.py").read_text()
    report = json.loads(scalebox("rewrite", str(project), "--json", "--no-transform", "grad_clip", "--backend", "cpu").stdout)
    assert report["branch"] == "run/0002"
    assert all(f["status"] == "unchanged" for f in report["files"])


def test_syntax_error_file_is_reported_in_one_line_and_carried(project):
    (project / "broken.py").write_text("def f(:\n")
    proc = scalebox("rewrite", str(project), "--backend", "cpu", check=False)
    assert "broken.py:1: SyntaxError" in proc.stderr
    assert proc.returncode == 1 and "Traceback" not in proc.stderr  # committed, but not a success
    shown = git("--git-dir", str(project / ".scalebox" / "store.git"), "show", "run/0001:broken.py", cwd=project)
    assert shown == b"def f(:\n"


def test_run_executes_the_committed_rewrite_and_records_it(project):
    scalebox("rewrite", str(project), "--backend", "cpu")
    # change the user's helper after the commit: the run must still use the committed one
    (project / "helpers.py").write_text("raise SystemExit('served from disk, not the commit')\n")
    proc = scalebox("run", "run/0001", "train.py", "--", "--steps", "2", cwd=project)
    assert "step=1" in proc.stdout and "final_return=1.5" in proc.stdout
    assert "note: run/0001 differs from the working tree (M helpers.py)" in proc.stderr
    run_dir = project / ".scalebox" / "runs" / "run" / "0001" / "0001"  # branch run/0001, run 1
    record = json.loads((run_dir / "record.json").read_text())
    assert record["exit_status"] == 0 and record["wall_time"] > 0 and record["status"] == "ok"
    assert record["branch"] == "run/0001" and record["run"] == 1 and record["variant"] == "rewrite"
    # the inserted guard recorded its norm: the maximum per window of 8 steps, a partial one at exit
    assert record["metrics"]["scalebox/grad_norm"]["count"] == 1 and record["metrics"]["scalebox/grad_norm"]["last"] > 0
    assert record["metrics"]["loss"]["count"] == 2
    assert "step=0" in (run_dir / "log.txt").read_text()
    log = scalebox("log", cwd=project).stdout
    assert log.startswith("run/0001") and " ok " in log and "grad_norm=" in log


def test_a_failed_run_says_the_scripts_exit_status(project):
    """``run --seeds 0,1`` of a script that exits 3 exits 1 (some run failed) and said only
    "failed in 0.3s" per run, and ``scalebox log`` only "failed": the script's own code was lost."""
    (project / "quits.py").write_text("import sys\nsys.exit(3)\n")
    scalebox("init", str(project))
    proc = scalebox("run", "--seeds", "0,1", "quits.py", cwd=project, check=False)
    assert proc.returncode == 1
    ends = [ln for ln in proc.stderr.splitlines() if " failed" in ln]
    assert len(ends) == 2 and all(" failed (exit 3) in " in ln for ln in ends), proc.stderr
    runs = [ln for ln in scalebox("log", cwd=project).stdout.splitlines() if ln.startswith("  #")]
    assert len(runs) == 2 and all(ln.endswith("| exit 3") for ln in runs), runs


def test_run_of_a_script_the_branch_lacks_is_a_one_line_error_and_makes_no_run(project):
    """A typo in SCRIPT started a run that failed in its launcher, leaving a failed run in the log."""
    scalebox("rewrite", str(project), "--backend", "cpu")
    for args in (("train_typo.py",), ("--original", "train_typo.py"), ("run/0001", "train_typo.py"), ("--seeds", "0,1", "train_typo.py")):
        proc = scalebox("run", *args, cwd=project, check=False)
        assert proc.returncode == 2 and proc.stderr.strip() == "scalebox: train_typo.py is not in run/0001 (no such file)"
    assert not (project / ".scalebox" / "runs" / "run" / "0001").exists()


def test_run_of_a_script_no_snapshot_takes_says_why_on_one_line(project):
    """``scalebox run $'tab\\there.py'`` blamed "a typo, or a file scalebox.toml leaves out?" (the
    fourth fault campaign), and printed the tab itself: the line now names the file's own case."""
    (project / "tab\there.py").write_text("print('x')\n")
    (project / "skip").mkdir()
    (project / "skip" / "t.py").write_text("print('x')\n")
    (project / "scalebox.toml").write_text('exclude = ["skip/**"]\n')
    scalebox("rewrite", str(project), "--backend", "cpu", check=False)
    for script, why in (("tab\there.py", "tab\\there.py is not in run/0001 (its file name holds a control character (\\t), "
                                          "and no snapshot takes such a file: rename it)"),
                        ("skip/t.py", "skip/t.py is not in run/0001 (scalebox.toml leaves it out)")):
        proc = scalebox("run", "--no-commit", script, cwd=project, check=False)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == "scalebox: " + why, proc.stderr


def test_rewrite_of_a_file_no_snapshot_takes_says_why_and_fails_when_it_is_all_it_was_given(project):
    """``scalebox rewrite skip/t.py`` of a file scalebox.toml leaves out committed a branch of the
    other files, said nothing of the file named and exited 0 (the fourth fault campaign)."""
    (project / "skip").mkdir()
    (project / "skip" / "t.py").write_text("print('x')\n")
    (project / "scalebox.toml").write_text('exclude = ["skip/**"]\n')
    line = "scalebox: skip/t.py: scalebox.toml leaves it out; not rewritten"
    alone = scalebox("rewrite", "skip/t.py", "--backend", "cpu", cwd=project, check=False)
    assert alone.returncode == 1 and line in alone.stderr.splitlines(), alone.stderr
    beside = scalebox("rewrite", "skip/t.py", "train.py", "--backend", "cpu", cwd=project, check=False)
    assert beside.returncode == 0 and line in beside.stderr.splitlines(), beside.stderr
    folder = scalebox("rewrite", ".", "--backend", "cpu", cwd=project, check=False)  # a folder: its files, as the config says
    assert folder.returncode == 0 and "skip/t.py" not in folder.stderr


def test_run_traceback_shows_rewritten_lines(project):
    (project / "train.py").write_text(
        (project / "train.py").read_text() + "raise RuntimeError('boom')\n"
    )
    scalebox("rewrite", str(project), "--backend", "cpu")
    proc = scalebox("run", "run/0001", "train.py", cwd=project, check=False)
    assert proc.returncode != 0
    # the rewrite inserted one import and one clip line (the raise ran on line 22): the
    # traceback names the user's line 20 and quotes it
    assert f'File "{os.path.realpath(project / "train.py")}", line 20, in <module>\n' in proc.stderr  # the script's stderr
    assert "raise RuntimeError('boom')" in proc.stderr and "Traceback" not in proc.stdout


def test_a_project_file_run_by_path_keeps_its_own_line_numbers(project):
    """``runpy.run_path`` of a project file reads it from the working tree (the original), not
    the served rewrite: its traceback lines were mapped through the rewrite's line map anyway
    (line 18 for the user's 20) and the profile put its samples on the wrong lines."""
    (project / "train.py").write_text((project / "train.py").read_text() + "raise RuntimeError('boom')\n")
    (project / "by_path.py").write_text(
        "import os, runpy\n"
        "runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'train.py'), run_name='__main__')\n")
    scalebox("rewrite", str(project), "--backend", "cpu")
    proc = scalebox("run", "run/0001", "by_path.py", cwd=project, check=False)
    assert proc.returncode != 0
    assert f'File "{os.path.realpath(project / "train.py")}", line 20, in <module>\n' in proc.stderr, proc.stderr
    assert "raise RuntimeError('boom')" in proc.stderr


def test_run_traceback_and_diff_count_lines_as_python_does_with_form_feeds(project):
    """Page breaks (\\f) do not end lines: tracebacks quote, and diffs number, the lines that ran."""
    source = (project / "train.py").read_text()
    paged = source.replace("parser = argparse", "\f\nparser = argparse").replace("torch.manual_seed", "\ftorch.manual_seed")
    (project / "train.py").write_text(paged + "\f\nraise RuntimeError('boom')\n")
    scalebox("rewrite", str(project), "--backend", "cpu")
    proc = scalebox("run", "run/0001", "train.py", cwd=project, check=False)
    # the user's file has one extra "\f" line: the raise is on line 22 (24 in the rewrite)
    assert f'File "{os.path.realpath(project / "train.py")}", line 22' in proc.stderr
    lines = proc.stderr.splitlines()
    assert "raise RuntimeError('boom')" in lines[lines.index("RuntimeError: boom") - 1]
    diff = scalebox("diff", cwd=project).stdout
    assert "@@ -15,6 +16,7 @@" in diff and "grad_clip [exact-until-intervention] line 18" in diff


def test_diff_labels_hunks_and_stat(project):
    scalebox("rewrite", str(project), "--backend", "cpu")
    diff = scalebox("diff", "run/0001", cwd=project).stdout
    assert "+from scalebox_cst.runtime.stabilizer import stabilize as _scalebox_stabilize" in diff
    assert "+    _scalebox_stabilize(optimizer, site='train.py:17')" in diff
    assert "grad_clip [exact-until-intervention] line 17" in diff
    assert "\x1b[" not in diff  # plain when piped
    colored = scalebox("diff", "--color", cwd=project).stdout
    assert "\x1b[" in colored
    stat = scalebox("diff", "--stat", cwd=project).stdout
    assert "train.py" in stat and "1 rewritten" in stat


def test_diff_gives_each_sites_reason_once_across_its_hunks():
    """A site whose rewrite lands in three hunks had its reason printed three times."""
    from scalebox_cst import diffview
    from scalebox_cst.report import FileReport, Site

    old = "".join(f"x{i} = {i}\n" for i in range(1, 41)).encode()
    new = old.replace(b"x3 = 3", b"x3 = 30").replace(b"x20 = 20", b"x20 = 200").replace(b"x37 = 37", b"x37 = 370")
    loop = Site("vectorize.loop", 2, 38, "rewritten", "the loop is batched over its rows", "exact")
    near = Site("grad_clip", 37, 37, "rewritten", "clip before the step", "exact-until-intervention")
    text = "\n".join(diffview.render_file(FileReport("m.py", "rewritten", sites=[loop, near]), old, new, color=False))
    assert text.count("@@ -") == 3
    assert text.count("the loop is batched over its rows") == 1
    assert text.index("the loop is batched over its rows") < text.index("x3 = 30")
    assert text.count("#  vectorize.loop line 2 (continued; reason above)") == 2
    assert text.count("clip before the step") == 1  # another site in a later hunk is told in full


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
        (("diff", "hook/20990101-000000-1"), "unknown branch hook/20990101-000000-1: expected run/NNNN or hook/<session>"),
        (("diff", "no-such-branch"), "unknown branch no-such-branch"),
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


def test_diff_shows_an_import_hook_session_like_a_run_branch(project):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("SCALEBOX_HOOK_SESSION", None)
    subprocess.run(
        [sys.executable, "-m", "scalebox_cst", "train.py", "--steps", "1"], cwd=project, env=env, check=True, capture_output=True
    )
    (entry,) = json.loads(scalebox("log", "--json", cwd=project).stdout)
    name = entry["branch"]
    assert name.startswith("hook/")
    for form in (name, name[len("hook/"):], "refs/heads/" + name, name[: len("hook/") + 12]):
        diff = scalebox("diff", form, cwd=project).stdout
        assert diff.startswith(f"{name} {entry['commit']}")
        assert "+from scalebox_cst.runtime.stabilizer import stabilize as _scalebox_stabilize" in diff
        assert "+    _scalebox_stabilize(optimizer, site='train.py:17')" in diff
        assert "grad_clip [exact-until-intervention] line 17" in diff
    assert scalebox("diff", cwd=project).stdout == diff  # no run branch: the newest session
    stat = scalebox("diff", "--stat", name, cwd=project).stdout
    assert stat.splitlines()[0].split() == ["train.py", "|", "+2", "-0", "|", "1", "rewritten,", "0", "skipped/warned"]
    assert "helpers.py" not in stat  # imported, but nothing to rewrite: not committed


def test_diff_of_a_session_spanning_commits_and_snapshots(project):
    """Two hook commits, the second after its module changed on disk (a new snapshot): each file is
    diffed against the source its own commit rewrote; sites come from the commit messages when the
    rewrite cache has no entry for them."""
    from scalebox_cst.store import Store, StoreError

    store = Store.init(str(project))
    first_src = {"train.py": b"a = 1\n", "helpers.py": b"h = 1\n"}
    snap1, _ = store.snapshot(first_src, "import hook session s")
    trailers = "Scalebox-Source: {}\nScalebox-Pipeline: fp\nScalebox-Session: s"
    store.commit_to_branch(
        "hook/s",
        {"train.py": b"import x\na = 1\nclip()\n"},
        "import hook: train.py (rewritten)\n\ntrain.py:1: grad_clip rewritten [changes-semantics]: clip after a\n"
        "train.py:1: vectorize.reduction skipped: not a loop\n\n" + trailers.format(snap1),
        snap1,
    )
    snap2, _ = store.snapshot({**first_src, "helpers.py": b"h = 2\nh += 1\n"}, "import hook session s")
    tip, _ = store.commit_to_branch(
        "hook/s",
        {"helpers.py": b"h = 2\nh = h + 1\n"},
        "import hook: helpers.py (rewritten)\n\nhelpers.py:2: vectorize.elementwise rewritten [exact]: augmented add\n\n"
        + trailers.format(snap2),
        snap2,
    )
    session = store.resolve_session("s")
    assert (session.name, session.commit, session.base, session.commits) == ("hook/s", tip, snap1, 2)
    assert [(f.path, f.source_commit) for f in session.files] == [("helpers.py", snap2), ("train.py", snap1)]
    for other in ("s-1", "s-2"):
        store.commit_to_branch("hook/" + other, {"train.py": b"b = 1\n"}, "import hook: train.py (rewritten)", snap1)
    assert store.resolve_session("s").name == "hook/s"  # an exact name beats longer names it prefixes
    assert store.resolve_session("hook/s-2").name == "hook/s-2"
    with pytest.raises(StoreError, match="ambiguous branch s-: hook/s-1, hook/s-2"):
        store.resolve_session("s-")
    store.close()
    diff = scalebox("diff", "hook/s", cwd=project).stdout
    assert f"(source {snap2}, {snap1})" in diff.splitlines()[0]
    helpers = diff[diff.index("--- a/helpers.py"): diff.index("--- a/train.py")]
    assert "-h += 1\n+h = h + 1" in helpers and "-h = 1" not in helpers  # against the second snapshot
    assert "vectorize.elementwise [exact] line 2: augmented add" in helpers
    train = diff[diff.index("--- a/train.py"):]
    assert "grad_clip [changes-semantics] line 1: clip after a" in train
    assert "skipped: train.py:1: vectorize.reduction skipped: not a loop" in train
    stat = scalebox("diff", "--stat", "s", cwd=project).stdout
    assert "helpers.py | +1 -1 | 1 rewritten, 0 skipped/warned" in stat
    assert "train.py   | +2 -0 | 1 rewritten, 1 skipped/warned" in stat


# ---------------------------------------------------------------------------- bad input (issue 9, items 11-12)
@pytest.mark.parametrize(
    "args, message",
    [
        (["--transform", "no_such"], "--transform no_such: unknown transform 'no_such'"),
        (["--transform", "grad_clp"], "did you mean 'grad_clip'?"),
        (["--no-transform", "vectorize.recurence"], "did you mean 'vectorize.recurrence'?"),
        (["--set", "grad_clip.max_nrom=0.5"], "unknown option grad_clip.max_nrom (did you mean 'max_norm'?)"),
        (["--set", "grad_clp.max_norm=0.5"], "unknown option table [grad_clp] (did you mean 'grad_clip'?)"),
        (["--set", "grad_clip.max_norm=NaN"], "grad_clip.max_norm must be a positive number, got nan"),
        (["--set", "vectorize.target_update.allow_lerp=yes"], "allow_lerp must be true or false, got 'yes'"),
    ],
)
def test_rewrite_rejects_unknown_ids_options_and_bad_values_before_anything_runs(project, args, message):
    proc = scalebox("rewrite", str(project), "--backend", "cpu", *args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (project / ".scalebox").exists()  # nothing was written


def test_set_accepts_a_dotted_section(project, tmp_path):
    scalebox("rewrite", str(project), "--backend", "cpu", "--set", "vectorize.recurrence.reassociate=false")


@pytest.mark.parametrize(
    "toml, message",
    [
        ('transforms = ["grad_clip", "vectorise.*"]\n', "unknown transform 'vectorise.*' (did you mean 'vectorize.*'?)"),
        ("[grad_clip]\nmax_nrom = 0.5\n", "did you mean 'max_norm'?"),
        ("[grad_clip]\nmax_norm = nan\n", "max_norm must be a positive number, got nan"),
        ('[vectorize.target_update]\nallow_lerp = "yes"\n', "allow_lerp must be true or false"),
        (b'# caf\xe9\ntransforms = ["grad_clip"]\n', "scalebox.toml:1: not UTF-8 (byte 0xe9)"),
    ],
)
def test_rewrite_with_a_bad_scalebox_toml_is_one_line(project, toml, message):
    path = project / "scalebox.toml"
    path.write_bytes(toml if isinstance(toml, bytes) else toml.encode())
    proc = scalebox("rewrite", str(project), "--backend", "cpu", check=False)
    assert proc.returncode in (1, 2) and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (project / ".scalebox").exists()


def test_rewrite_out_that_cannot_be_written_is_one_line(project, tmp_path):
    blocker = tmp_path / "out"
    blocker.write_text("a file where the folder should be\n")
    proc = scalebox("rewrite", str(project), "--backend", "cpu", "--out", str(blocker / "sub"), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("scalebox: --out ") and "committed as run/0001" in proc.stderr


def test_rewrite_out_never_writes_through_links_nor_over_the_project(project, tmp_path):
    """--out refused a link nowhere: a link in DIR (file or folder) was written through, and
    ``--out .`` replaced the user's train.py with its rewrite."""
    scalebox("init", str(project))
    victim, elsewhere = tmp_path / "victim", tmp_path / "elsewhere"
    victim.write_text("mine\n")
    elsewhere.mkdir()
    (project / "pkg").mkdir()
    (project / "pkg" / "mod.py").write_text("x = 1\n")
    (project / "pkg" / "train.py").write_text("y = 2\n")  # --out pkg would replace it
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim, out / "train.py")
    od2 = tmp_path / "od2"
    od2.mkdir()
    os.symlink(elsewhere, od2 / "pkg")
    before = (project / "train.py").read_bytes()
    for where in (out, od2):
        proc = scalebox("rewrite", str(project), "--backend", "cpu", "--out", str(where), check=False)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith("scalebox: --out ") and "symbolic link" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert victim.read_text() == "mine\n" and os.listdir(elsewhere) == []
    assert os.path.islink(out / "train.py")
    for where in (project, project / ".scalebox" / "out", tmp_path, project / "pkg"):
        proc = scalebox("rewrite", str(project), "--backend", "cpu", "--out", str(where), check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
        assert proc.stderr.startswith("scalebox: --out "), proc.stderr
    assert (project / "train.py").read_bytes() == before and (project / "pkg" / "train.py").read_text() == "y = 2\n"
    assert not (project / ".scalebox" / "out").exists() and not (project / "pkg" / "pkg").exists()
    good = tmp_path / "good"
    scalebox("rewrite", str(project), "--backend", "cpu", "--out", str(good))
    assert sorted(os.listdir(good)) == ["helpers.py", "pkg", "train.py"] and sorted(os.listdir(good / "pkg")) == ["mod.py", "train.py"]


def test_status_names_the_files_the_snapshot_leaves_out(project):
    """`status` said "working tree matches run/0001" for a tree holding a file the snapshot leaves
    out (a name with a tab, not UTF-8) and edited since, without a word, where `rewrite` and `run`
    warn (found by the fourth fault campaign): it warns as they do, and lists them in --json."""
    root = str(project)
    assert scalebox("init", ".", cwd=root, check=False).returncode == 0
    (project / "tab\there.py").write_text("x = 1\n")
    assert scalebox("rewrite", "train.py", cwd=root, check=False).returncode == 0
    (project / "tab\there.py").write_text("x = 2\n")
    proc = scalebox("status", cwd=root, check=False)
    assert proc.returncode == 0 and "matches run/0001" in proc.stdout
    assert "warning: tab\\there.py: file name holds a control character" in proc.stderr
    data = json.loads(scalebox("status", "--json", cwd=root, check=False).stdout)
    assert any(line.startswith("tab\\there.py:") for line in data["skipped"])


def test_status_gives_no_negative_age_to_a_run_started_after_now(project):
    """A running record of another host whose start lies ahead (its clock, or a damaged record:
    ``started: 1e308``) was listed as running for ``-1e+308s``."""
    from scalebox_cst import runs

    root = str(project)
    scalebox("init", ".", cwd=root)
    for number, started in ((1, 1e308), (2, time.time() - 30)):
        folder = runs.run_dir(root, "run/0001", number)
        os.makedirs(folder)
        runs.write_record(folder, {"branch": "run/0001", "run": number, "status": "running", "pid": 4242,
                                   "host": "another-host", "started": started, "script": "train.py", "variant": "rewrite"})
    out = scalebox("status", cwd=root).stdout
    assert "running: run/0001#1 rewrite train.py (pid 4242, start time unknown)" in out
    assert re.search(r"running: run/0001#2 rewrite train\.py \(pid 4242, 3\ds\)", out) and "-" not in out.split("running:")[1]


def test_status_after_a_rollback_names_the_snapshot_the_files_match(project):
    """After `rollback run/0001`, `status` said only that the tree differs from the newest branch
    (run/0002), not that the files are the rollback's snapshot, rewritten into no branch yet (the
    newcomer's walkthrough). An undo brings back run/0002's files: it matches that branch again."""
    root = str(project)
    scalebox("init", ".", cwd=root)
    scalebox("rewrite", "train.py", cwd=root)
    first = (project / "train.py").read_text()
    (project / "train.py").write_text(first + "\nprint('second version')\n")
    scalebox("rewrite", "train.py", cwd=root)
    scalebox("rollback", "run/0001", cwd=root)
    out = scalebox("status", cwd=root).stdout
    snapshot = re.search(r"working tree matches snapshot ([0-9a-f]{10}) \(rollback to run/0001\); no branch is rewritten from it yet\n", out)
    assert snapshot, out
    assert "working tree differs from run/0002" in out and "M train.py" in out
    data = json.loads(scalebox("status", "--json", cwd=root).stdout)
    assert data["matches_snapshot"].startswith(snapshot.group(1)) and not data["clean"]
    (project / "train.py").write_text(first + "\nprint('edited after the rollback')\n")
    assert "matches snapshot" not in scalebox("status", cwd=root).stdout  # an edit since: no longer the snapshot's files
    (project / "train.py").write_text(first)
    scalebox("undo", cwd=root)
    out = scalebox("status", cwd=root).stdout
    assert out.startswith("working tree matches run/0002") and "snapshot" not in out
    assert json.loads(scalebox("status", "--json", cwd=root).stdout)["matches_snapshot"] is None


def test_rewrite_without_paths_says_how_to_name_them(project):
    """`scalebox rewrite` alone said "missing PATHS (or --tuned-config FILE)": a newcomer who had
    only seen the README's `--tuned-config` form did not learn to name the files (the newcomer's
    walkthrough). One line, exit 2, nothing committed."""
    root = str(project)
    scalebox("init", ".", cwd=root)
    proc = scalebox("rewrite", cwd=root, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "scalebox: missing PATHS: name the files or folders to rewrite (`scalebox rewrite .` for the whole project), "
        "or --tuned-config FILE"]
    assert "no run branches yet" in scalebox("status", cwd=root).stdout
