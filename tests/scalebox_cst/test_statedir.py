"""Links to files planted in ``.scalebox/`` (a cloned tree can ship them: git stores symbolic
links) are never written through: found by the fifth fault campaign, where ``scalebox watch``
truncated a file outside the project to write its pid, and the project's events were appended to
another. A link to a folder (``.scalebox/runs`` moved to a larger disk) is followed."""
from __future__ import annotations

import errno
import io
import os

import pytest

from conftest import scalebox
from scalebox_cst import statedir
from scalebox_cst.project import Project
from scalebox_cst.store import StoreError

TRAIN = "import torch\nopt = torch.optim.Adam([torch.zeros(2, requires_grad=True)])\nprint('trained')\n"


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text(TRAIN)
    scalebox("init", ".", cwd=root)
    victim = tmp_path / "victim.txt"
    victim.write_text("PRECIOUS\n")
    return root, victim


@pytest.mark.parametrize("planted, to", [(".scalebox/watch.lock", "victim"), (".scalebox/store.git/scalebox.lock", "victim"),
                                         (".scalebox/runs", "missing")])
def test_a_link_where_the_engine_writes_stops_every_command_in_one_line_and_its_target_is_untouched(tree, planted, to):
    root, victim = tree
    target = victim if to == "victim" else victim.parent / "missing"
    (root / planted).parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(root / planted):  # the store's lock file, made by init
        os.remove(root / planted)
    os.symlink(target, root / planted)
    for args in (("rewrite", "."), ("log",), ("run", "train.py")):
        proc = scalebox(*args, cwd=root, check=False)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert lines[-1] == (f"scalebox: {root / planted}: a symbolic link (to {target}) inside the engine's folder "
                             ".scalebox/, which writes only files of its own (a link to a folder is followed): remove it"), \
            (args, proc.stderr)
    assert victim.read_text() == "PRECIOUS\n" and not target.parent.joinpath("missing").exists()


def test_the_watcher_never_truncates_a_planted_lock_target(tree):
    from scalebox_cst.watcher import Watcher

    root, victim = tree
    os.symlink(victim, root / ".scalebox" / "watch.lock")
    with pytest.raises(StoreError, match="watch.lock: a symbolic link"):
        watcher = Watcher(Project(str(root), backend="cpu"), None, (), echo=lambda m: None, run_output=io.StringIO())
        watcher.start()
        watcher.close()
    assert victim.read_text() == "PRECIOUS\n"


def test_runs_moved_to_another_disk_and_linked_back_are_followed(tree, tmp_path):
    root, _ = tree
    scalebox("rewrite", ".", cwd=root)
    elsewhere = tmp_path / "big-disk" / "runs"
    elsewhere.mkdir(parents=True)
    runs = root / ".scalebox" / "runs"
    if runs.exists():
        os.rename(runs, elsewhere / "old")
    os.symlink(elsewhere, runs)
    proc = scalebox("run", "train.py", cwd=root)
    assert "trained" in proc.stdout and (elsewhere / "run" / "0001" / "0001" / "record.json").is_file(), proc.stderr


def test_a_planted_events_file_is_not_appended_to_and_the_run_goes_on(tree):
    root, victim = tree
    (root / ".scalebox" / "runs").mkdir(exist_ok=True)
    os.symlink(victim, root / ".scalebox" / "runs" / "events.jsonl")
    proc = scalebox("run", "train.py", cwd=root, check=False)
    assert proc.returncode == 0 and "trained" in proc.stdout, proc.stderr
    assert "scalebox: warning: project event not recorded" in proc.stderr and "events.jsonl" in proc.stderr
    assert victim.read_text() == "PRECIOUS\n"


def test_check_folder_and_open_in_place(tmp_path):
    state = tmp_path / "p" / ".scalebox"
    (state / "runs").mkdir(parents=True)
    statedir.check_folder(str(state / "runs" / "run" / "0001"))  # not made yet: fine
    os.symlink(tmp_path / "nowhere", state / "runs" / "run")
    with pytest.raises(statedir.LinkInState) as exc:
        statedir.makedirs(str(state / "runs" / "run" / "0001"))
    assert exc.value.errno == errno.ELOOP and exc.value.filename == str(state / "runs" / "run")
    assert not (tmp_path / "nowhere").exists()
    os.remove(state / "runs" / "run")
    os.symlink(tmp_path, state / "runs" / "run")  # a folder: followed
    statedir.makedirs(str(state / "runs" / "run" / "0001"))
    assert (tmp_path / "0001").is_dir()
    os.symlink(tmp_path / "target", state / "lock")
    with pytest.raises(statedir.LinkInState):
        statedir.open_in_place(str(state / "lock"), os.O_RDWR | os.O_CREAT)
    assert not (tmp_path / "target").exists()
    statedir.check_folder(str(tmp_path / "elsewhere"))  # not under a .scalebox: the user's
