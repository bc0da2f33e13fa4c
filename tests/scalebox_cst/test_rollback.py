"""Rollback loses nothing and writes nothing outside the project: symbolic links, all-or-nothing
replacement (disk full, a failing rename), the journal a killed rollback leaves, snapshot ids
and undo. Kills in real subprocesses are in test_faults.py."""
import errno
import json
import os

import pytest

from scalebox_cst import project as project_module
from scalebox_cst import renameat
from scalebox_cst.project import JOURNAL_FILE, Project
from scalebox_cst.rollback import tmp_name
from scalebox_cst.store import StoreError

from conftest import scalebox


def _tree(root):
    """Every file under root but .scalebox: relpath -> bytes (links are reported as links)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".scalebox"]
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            out[rel] = ("link", os.readlink(path)) if os.path.islink(path) else open(path, "rb").read()
    return out


def hook_renames_into_place(monkeypatch, before):
    """Call ``before(src, dst)`` ahead of each rename of a rollback's new file into place,
    whichever primitive does it (``os.replace``, or a ``renameat2`` swap / no-replace rename)."""

    def hooked(real):
        def rename(src, dst):
            if str(src).endswith(".scalebox-tmp") and not str(dst).endswith(".scalebox-tmp") and JOURNAL_FILE not in str(dst):
                before(src, dst)
            return real(src, dst)

        return rename

    monkeypatch.setattr(os, "replace", hooked(os.replace))
    monkeypatch.setattr(renameat, "exchange", hooked(renameat.exchange))
    monkeypatch.setattr(renameat, "noreplace", hooked(renameat.noreplace))


def _two_states(tmp_path, n=12):
    """A project with branches run/0001 (state A) and run/0002 (state B), B on disk."""
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    proj, _ = Project.init(str(root))
    for i in range(n):
        (root / "pkg" / f"m{i}.py").write_text(f"A = {i}\n")
    a = proj.commit_change(force=True).branch
    state_a = _tree(root)
    for i in range(n):
        (root / "pkg" / f"m{i}.py").write_text(f"B = {i}\n" * 50)
    (root / "only_b.py").write_text("b = 1\n")
    b = proj.commit_change(force=True).branch
    return root, proj, a, b, state_a, _tree(root)


def _debris(root):
    return [p for p in _tree(root) if p.endswith(".scalebox-tmp")] + [
        p for p in os.listdir(root / ".scalebox") if p == JOURNAL_FILE or p.endswith(".scalebox-tmp")
    ]


def test_rollback_never_writes_through_a_folder_link_to_outside(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "proj"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "x.py").write_text("x = 'old'\n")
    proj, _ = Project.init(str(root))
    first = proj.commit_change(force=True).branch
    # the folder becomes a link to a folder outside the project holding a file of that name
    (root / "sub" / "x.py").unlink()
    (root / "sub").rmdir()
    (outside / "x.py").write_text("precious = True\n")
    os.symlink(outside, root / "sub")
    result = Project(str(root)).rollback(first)
    assert (outside / "x.py").read_text() == "precious = True\n"
    assert os.path.islink(root / "sub")
    assert [rel for rel, _ in result.skipped] == ["sub/x.py"] and "symbolic link" in result.skipped[0][1]
    assert not _debris(root)


def test_a_symlinked_file_stays_a_link_and_its_target_is_untouched(tmp_path):
    outside = tmp_path / "shared.py"
    outside.write_text("v = 1\n")
    root = tmp_path / "proj"
    (root / "lib").mkdir(parents=True)
    (root / "a.py").write_text("a = 1\n")
    (root / "lib" / "inner.py").write_text("w = 1\n")
    os.symlink(outside, root / "linked.py")  # out of the project: never snapshotted (scalebox_cst.intake)
    os.symlink("lib/inner.py", root / "alias.py")  # to a project file: snapshotted with its bytes
    proj, _ = Project.init(str(root))
    first = proj.commit_change(force=True).branch
    assert "linked.py" not in proj.store.files(proj.store.resolve(first).source_commit)
    outside.write_text("v = 2\n")
    (root / "a.py").write_text("a = 2\n")
    (root / "lib" / "inner.py").write_text("w = 2\n")
    out = scalebox("rollback", first, cwd=root).stdout
    assert os.path.islink(root / "linked.py") and os.readlink(root / "linked.py") == str(outside)
    assert os.path.islink(root / "alias.py") and os.readlink(root / "alias.py") == "lib/inner.py"
    assert outside.read_text() == "v = 2\n"
    assert (root / "a.py").read_text() == "a = 1\n" and (root / "lib" / "inner.py").read_text() == "w = 1\n"
    assert "skipped alias.py: it is a symbolic link" in out


def test_rollback_through_a_file_in_the_way_is_skipped(tmp_path):
    root = tmp_path / "proj"
    (root / "d").mkdir(parents=True)
    (root / "d" / "m.py").write_text("m = 1\n")
    proj, _ = Project.init(str(root))
    first = proj.commit_change(force=True).branch
    (root / "d" / "m.py").unlink()
    (root / "d").rmdir()
    (root / "d").write_text("now a file\n")
    result = Project(str(root)).rollback(first)
    assert result.skipped == [("d/m.py", "d is a file, not a folder")]
    assert (root / "d").read_text() == "now a file\n"


def test_disk_full_while_writing_leaves_the_tree_fully_old(tmp_path, monkeypatch):
    root, proj, a, b, state_a, state_b = _two_states(tmp_path)
    Project(str(root)).rollback(a)  # state A on disk (only_b.py left in place); B's files are larger
    state_a_on_disk = _tree(root)
    budget = {"left": 2000}  # bytes the disk still takes: the journal and a few of B's files
    real_write = os.write

    def write(fd, data):
        if budget["left"] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = real_write(fd, bytes(data)[: budget["left"]])
        budget["left"] -= n
        return n

    monkeypatch.setattr(project_module.os, "write", write)
    with pytest.raises(StoreError) as info:
        Project(str(root)).rollback(b)
    assert budget["left"] == 0  # some files were written in part
    message = str(info.value)
    assert "\n" not in message and "No space left on device" in message and "nothing changed" in message
    assert _tree(root) == state_a_on_disk
    assert not _debris(root)
    monkeypatch.setattr(project_module.os, "write", real_write)
    Project(str(root)).rollback(b)  # and it works once there is space
    assert _tree(root) == state_b


@pytest.mark.parametrize("fail_at", [0, 3, 11])
def test_a_failing_rename_puts_back_what_was_replaced(tmp_path, monkeypatch, fail_at):
    root, proj, a, b, state_a, state_b = _two_states(tmp_path)
    calls = {"n": 0}

    def fail(src, dst):  # the rename of new file number fail_at fails, once
        calls["n"] += 1
        if calls["n"] == fail_at + 1:
            raise OSError(errno.EIO, "Input/output error", dst)

    hook_renames_into_place(monkeypatch, fail)
    with pytest.raises(StoreError) as info:
        Project(str(root)).rollback(a)
    assert f"the {fail_at} file(s) already replaced were put back" in str(info.value)
    assert _tree(root) == state_b
    assert not _debris(root)


def test_snapshot_id_printed_by_rollback_and_undo(tmp_path):
    root, proj, a, b, state_a, state_b = _two_states(tmp_path)
    (root / "pkg" / "m0.py").write_text("edited after run/0002\n")
    edited = _tree(root)
    out = scalebox("rollback", a, cwd=root).stdout
    backup = out.split("snapshotted current files as ", 1)[1].split()[0]
    assert {k: v for k, v in _tree(root).items() if k != "only_b.py"} == state_a
    scalebox("rollback", backup, cwd=root)  # the id it printed restores the files it replaced
    assert _tree(root) == edited
    undone = scalebox("undo", cwd=root).stdout  # reverts that rollback: state A again
    assert {k: v for k, v in _tree(root).items() if k != "only_b.py"} == state_a
    assert undone.splitlines()[-1] == f"done: undo of rollback to snapshot {backup}"
    redone = scalebox("undo", cwd=root).stdout  # an undo is a rollback: undoing it redoes
    assert _tree(root) == edited
    # it said "undo of rollback to undo of rollback to <id>", one level more at every undo
    assert redone.splitlines()[-1] == f"done: snapshot {backup} (redone)"
    assert scalebox("undo", cwd=root).stdout.splitlines()[-1] == f"done: undo of rollback to snapshot {backup}"


def test_undo_removes_the_files_the_rollback_created_unless_edited_since(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "a.py").write_text("a = 1\n")
    (root / "gone.py").write_text("g = 1\n")
    (root / "kept.py").write_text("k = 1\n")
    proj, _ = Project.init(str(root))
    first = proj.commit_change(force=True).branch
    (root / "gone.py").unlink()
    (root / "kept.py").unlink()
    (root / "a.py").write_text("a = 2\n")
    result = Project(str(root)).rollback(first)
    assert sorted(result.restored) == ["a.py", "gone.py", "kept.py"]
    (root / "kept.py").write_text("k = 'edited after the rollback'\n")
    undone = Project(str(root)).undo()
    assert undone.removed == ["gone.py"]
    assert not (root / "gone.py").exists() and (root / "kept.py").exists()
    assert (root / "a.py").read_text() == "a = 2\n"


def test_undo_without_a_rollback_is_a_one_line_error(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "a.py").write_text("a = 1\n")
    scalebox("init", str(root))
    proc = scalebox("undo", cwd=root, check=False)
    assert proc.returncode == 1 and proc.stderr.strip() == "scalebox: no rollback to undo (the source history has none)"


@pytest.mark.parametrize("renamed", [0, 5, 12])
def test_the_next_command_finishes_a_rollback_killed_while_renaming(tmp_path, renamed):
    """The state a kill -9 leaves between two renames, made by hand: the journal says every new
    file is written; some are renamed. The next command renames the rest (fully new)."""
    root, proj, a, b, state_a, state_b = _two_states(tmp_path)
    target = proj.store.files(proj.store.resolve(a).source_commit)
    writes = [[rel, tmp_name(rel)] for rel in sorted(target) if (root / rel).read_bytes() != target[rel]]
    backup, _ = proj.store.snapshot(proj.scan(), "before")
    for i, (rel, tmp) in enumerate(writes):
        (root / tmp).write_bytes(target[rel])
        if i < renamed:
            os.replace(root / tmp, root / rel)
    journal = {"label": a, "source": proj.store.resolve(a).source_commit, "backup": backup,
               "write": writes, "remove": [], "created": [], "phase": "replace"}
    (root / ".scalebox" / JOURNAL_FILE).write_text(json.dumps(journal))
    proc = scalebox("log", cwd=root)
    assert f"finished an interrupted rollback to {a}" in proc.stderr
    assert {k: v for k, v in _tree(root).items() if k != "only_b.py"} == state_a
    assert not _debris(root)
    # recorded with its trailer, so undo reverts it
    Project(str(root)).undo()
    assert _tree(root) == state_b


def test_the_next_command_reverts_a_rollback_killed_while_writing(tmp_path):
    root, proj, a, b, state_a, state_b = _two_states(tmp_path)
    writes = [["pkg/m0.py", tmp_name("pkg/m0.py")], ["pkg/m1.py", tmp_name("pkg/m1.py")]]
    (root / writes[0][1]).write_bytes(b"A = 0\n")
    (root / writes[1][1]).write_bytes(b"A = ")  # cut short by the kill
    journal = {"label": a, "source": "0" * 40, "backup": "0" * 40, "write": writes, "remove": [], "created": [], "phase": "prepare"}
    (root / ".scalebox" / JOURNAL_FILE).write_text(json.dumps(journal))
    assert "was undone (it had replaced no file yet)" in Project(str(root)).recover()
    assert _tree(root) == state_b and not _debris(root)


def test_a_damaged_journal_is_named_in_one_line(tmp_path):
    root, proj, a, b, state_a, state_b = _two_states(tmp_path, n=2)
    (root / ".scalebox" / JOURNAL_FILE).write_text("{not json")
    proc = scalebox("rollback", a, cwd=root, check=False)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and JOURNAL_FILE in proc.stderr
    assert _tree(root) == state_b


def test_unknown_rollback_target_is_one_line(tmp_path):
    root, proj, a, b, state_a, state_b = _two_states(tmp_path, n=2)
    for target in ("run/0042", "deadbeef", "not-a-thing"):
        proc = scalebox("rollback", target, cwd=root, check=False)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
        assert "unknown" in proc.stderr
    # a run commit is not a snapshot: rollback only restores source snapshots
    run_commit = proj.store.resolve(b).commit
    proc = scalebox("rollback", run_commit[:12], cwd=root, check=False)
    assert proc.returncode == 1 and "unknown branch or snapshot" in proc.stderr
    assert _tree(root) == state_b


def test_a_journal_temporary_left_by_a_kill_is_removed_by_the_next_command(tmp_path):
    """A rollback killed while writing its journal left ``rollback-journal.json.NNN.scalebox-tmp``
    under .scalebox for good (recovery looked only for the journal itself)."""
    root, proj, a, b, state_a, state_b = _two_states(tmp_path, n=2)
    left = root / ".scalebox" / f"{JOURNAL_FILE}.4242424.scalebox-tmp"
    left.write_text('{"label": "run/0001", "write": [')  # cut short by the kill
    other = root / ".scalebox" / "unrelated.scalebox-tmp"
    other.write_text("not ours to remove")
    proc = scalebox("status", cwd=root)
    assert "Traceback" not in proc.stderr
    assert not left.exists() and other.exists() and _tree(root) == state_b
