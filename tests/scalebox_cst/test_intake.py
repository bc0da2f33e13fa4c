"""What a snapshot reads of a project tree (scalebox_cst.intake): regular files within a size limit,
links only to files the snapshot takes anyway, never anything outside the project; every file left
out is named, with why. Shared by ``rewrite``, ``run``, the watcher and the import hook."""
import os

import pytest

from scalebox_cst import intake
from scalebox_cst.config import Config
from scalebox_cst.project import Project

from conftest import ROOT, scalebox

SECRET = b"SECRET-outside-the-project-7f3a\n"


@pytest.fixture
def tree(tmp_path):
    """A project next to a folder outside it that holds a secret."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_bytes(b"token = 1  # " + SECRET)
    (outside / "pkg").mkdir()
    (outside / "pkg" / "mod.py").write_bytes(b"x = 1  # " + SECRET)
    root = tmp_path / "proj"
    root.mkdir()
    (root / "a.py").write_text("x = 1\n")
    Project.init(str(root))
    return root, outside


def _all_store_bytes(root):
    """Every object in the store, as one blob of bytes (a leak shows up here, whatever ref holds it)."""
    store = Project(str(root)).store
    return b"".join(store.repo.odb.read(oid)[1] for oid in store.repo.odb)


def test_a_link_out_of_the_project_is_named_never_read_and_never_stored(tree):
    root, outside = tree
    (root / "passwd.py").symlink_to(outside / "secret.py")
    (root / "pkg").symlink_to(outside / "pkg", target_is_directory=True)
    project = Project(str(root), backend="cpu")
    result = project.commit_change()
    assert result.created
    files = project.store.files(result.report.source_commit)
    assert sorted(files) == ["a.py"]
    assert project.skipped == [
        f"passwd.py: a symbolic link to {outside / 'secret.py'}, outside the project (never read); not snapshotted"
    ]
    assert SECRET not in _all_store_bytes(root)


def test_links_inside_the_project_read_only_files_the_snapshot_takes(tree):
    root, _ = tree
    (root / "sub").mkdir()
    (root / "sub" / "b.py").write_text("y = 2\n")
    (root / "notes.txt").write_text("not python\n")
    (root / ".venv").mkdir()
    (root / ".venv" / "site.py").write_text("z = 3\n")
    (root / "alias.py").symlink_to("sub/b.py")  # to a snapshotted file: the same bytes
    (root / "chain.py").symlink_to("alias.py")
    (root / "notes.py").symlink_to("notes.txt")  # to a file the config leaves out
    (root / "venv_site.py").symlink_to(".venv/site.py")  # inside an excluded folder
    (root / "gone.py").symlink_to("missing.py")
    (root / "subdir").symlink_to("sub", target_is_directory=True)  # folders: never followed
    project = Project(str(root))
    files = project.scan()
    assert files == {"a.py": b"x = 1\n", "alias.py": b"y = 2\n", "chain.py": b"y = 2\n", "sub/b.py": b"y = 2\n"}
    assert project.skipped == [
        "gone.py: a broken symbolic link; not snapshotted",
        "notes.py: a symbolic link to notes.txt, which the config leaves out (never read); not snapshotted",
        "venv_site.py: a symbolic link to .venv/site.py, which the config leaves out (never read); not snapshotted",
    ]


def test_special_files_and_big_files_are_named_not_read(tree, monkeypatch):
    root, _ = tree
    os.mkfifo(root / "fifo.py")  # an open() without O_NONBLOCK waits for a writer forever
    (root / "zero.py").symlink_to("/dev/zero")  # read to the end: never ends
    (root / "big.py").write_bytes(b"#" * 2000 + b"\n")
    (root / "sub").mkdir()
    os.mkfifo(root / "sub" / "pipe.py")
    (root / "to_fifo.py").symlink_to("sub/pipe.py")
    monkeypatch.setattr(intake, "MAX_FILE_BYTES", 1000)
    project = Project(str(root))
    assert sorted(project.scan()) == ["a.py"]
    assert project.skipped == [
        "big.py: larger than 1000 bytes (2001 bytes); not snapshotted",
        "fifo.py: a FIFO, not a regular file; not snapshotted",
        "to_fifo.py: a FIFO, not a regular file; not snapshotted",
        "zero.py: a symbolic link to /dev/zero, outside the project (never read); not snapshotted",
        "sub/pipe.py: a FIFO, not a regular file; not snapshotted",
    ]


def test_a_file_swapped_for_a_fifo_after_its_lstat_is_not_read(tree, monkeypatch):
    root, _ = tree
    real_open = os.open
    swapped = []

    def racing_open(path, flags, *args, **kwargs):
        if path == "a.py" and not swapped:  # between intake's lstat and its open
            os.remove(root / "a.py")
            os.mkfifo(root / "a.py")
            swapped.append(path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", racing_open)
    project = Project(str(root))
    assert project.scan() == {}
    assert swapped and project.skipped == ["a.py: replaced while being read; not snapshotted"]


def test_a_file_that_grows_past_the_limit_while_read_is_not_read(tree, monkeypatch):
    root, _ = tree
    real_read = os.read

    def growing_read(fd, n):
        chunk = real_read(fd, n)
        return chunk + b"#" * 50 if chunk else chunk  # more than lstat said

    monkeypatch.setattr(os, "read", growing_read)
    with pytest.raises(intake.NotRead, match="larger than 40 bytes"):
        intake.read_project_file(str(root), "a.py", Config(), limit=40)


def test_the_ray_tree_and_the_served_commit_hold_only_the_project(tree):
    from scalebox_cst.raylaunch import RayJob, stage

    root, outside = tree
    (root / "passwd.py").symlink_to(outside / "secret.py")
    project = Project(str(root), backend="cpu")
    result = project.commit_change()
    # torchrun's ranks and local runs serve this commit's tree (runtime.launch._serve)
    assert sorted(project.store.files(result.report.commit)) == ["a.py"]
    dest = root.parent / "ray-stage"
    stage(project.store.path, [RayJob(result.branch, result.report.commit, "a.py", [])], str(dest))
    shipped = []
    for folder, _, names in os.walk(dest):
        for name in names:
            with open(os.path.join(folder, name), "rb") as fh:
                shipped.append(fh.read())
    assert shipped and not any(SECRET in data for data in shipped)


def test_rewrite_names_every_file_it_leaves_out(tree):
    root, outside = tree
    (root / "passwd.py").symlink_to(outside / "secret.py")
    (root / os.fsdecode(b"caf\xe9.py")).write_text("x = 2\n")
    os.mkfifo(root / "fifo.py")
    proc = scalebox("rewrite", ".", cwd=str(root), timeout=120, env={"PYTHONPATH": ROOT})
    assert proc.stderr.splitlines() == [
        "scalebox: warning: caf\\xe9.py: file name is not UTF-8; not snapshotted (rename it to include it)",
        "scalebox: warning: fifo.py: a FIFO, not a regular file; not snapshotted",
        f"scalebox: warning: passwd.py: a symbolic link to {outside / 'secret.py'}, outside the project (never read); not snapshotted",
    ]
    assert SECRET not in _all_store_bytes(root)


def test_the_engines_state_files_are_not_read_through_a_link(project, tmp_path):
    """A run folder's record.json and metrics.jsonl planted as links to files outside the project
    (a .scalebox/ that came with it): their fields were printed by `scalebox log` (`--json`: every
    key of the file) and served by the monitor (found by the fourth fault campaign). A link reads as
    a damaged record (the run is listed as lost, saying why) and as no metrics."""
    import json

    from scalebox_cst import runs
    from scalebox_cst.monitor.api import Monitor

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text(json.dumps({"status": "ok", "script": "SECRET-abc", "args": ["hunter2"], "auths": {"k": "v"}}))
    (outside / "m.jsonl").write_text(json.dumps({"name": "SECRET_METRIC", "value": 42, "step": 1}) + "\n")
    root = str(project)
    assert scalebox("init", ".", cwd=root, check=False).returncode == 0
    folder = os.path.join(runs.runs_root(root), "run", "0001", "0001")
    os.makedirs(folder)
    os.symlink(outside / "config.json", os.path.join(folder, runs.RECORD))
    os.symlink(outside / "m.jsonl", os.path.join(folder, runs.METRICS))
    with pytest.raises(intake.NotRegularFile):
        intake.open_regular(os.path.join(folder, runs.RECORD))
    (run,) = runs.list_runs(root)
    assert run.status == "lost" and "symbolic link" in run.record["stop_reason"] and "auths" not in run.record
    assert runs.read_metrics(os.path.join(folder, runs.METRICS))[0] == []
    served = json.dumps(Monitor(root, runs_ttl=0).runs("run/0001"))
    assert "SECRET" not in served and "hunter2" not in served
    for args in (("log",), ("log", "--json")):
        proc = scalebox(*args, cwd=root, check=False)
        assert proc.returncode == 0 and "SECRET" not in proc.stdout + proc.stderr and "hunter2" not in proc.stdout


@pytest.mark.parametrize("rel", ["../outside.txt", "a/../../outside.txt", "/tmp/outside.txt", "a//b", "./x", "a\\..\\x",
                                 "x\x00y", "", 7, "linked/escape.txt", "alink"])
def test_a_ray_workers_file_name_never_leads_out_of_the_run_folder(tmp_path, rel):
    """The host writes the files a Ray worker streams back (the run folder's new bytes) under the
    names the worker gives: the worker runs the user's script, which may put any name in its run
    folder. `..`, an absolute name, an empty or `.` component, NUL, a backslash, or a folder or
    file on the way that is a link out of the run folder are refused; nothing is written outside."""
    import types

    from scalebox_cst.raylaunch import RayJob, _HostRun

    run_dir, outside = tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir()
    outside.mkdir()
    (run_dir / "linked").symlink_to(outside)
    (outside / "target.txt").write_bytes(b"keep")
    (run_dir / "alink").symlink_to(outside / "target.txt")
    job = RayJob(branch="run/0001", commit="0" * 40, script="train.py", args=[], dir=str(run_dir))
    host = _HostRun(str(tmp_path), job, None, None, "")
    host._tb = types.SimpleNamespace(pump=lambda path: None)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    for kind in ("append", "replace"):
        host.apply({kind: {rel: b"data"}})
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert (outside / "target.txt").read_bytes() == b"keep" and list(outside.iterdir()) == [outside / "target.txt"]
    host.apply({"append": {"a/metrics.jsonl": b"x"}, "replace": {"b/sites.json": b"{}"}})  # plain names still land
    assert (run_dir / "a" / "metrics.jsonl").read_bytes() == b"x" and (run_dir / "b" / "sites.json").read_bytes() == b"{}"
