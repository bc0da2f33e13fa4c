"""A file saved while a rollback or undo runs is never destroyed: the rollback compares each file
with its snapshot just before replacing it and stops (one line, nothing replaced, the edit kept);
a killed rollback that the next command finishes snapshots such an edit first. Deterministic:
the edit is made from a pause point (the journal write, a rename). Kills of a paused rollback in
real subprocesses are in test_faults.py."""
import json
import os

import pytest

from scalebox_cst import renameat
from scalebox_cst.project import JOURNAL_FILE, Project
from scalebox_cst.rollback import Replacer, tmp_name
from scalebox_cst.store import StoreError

from test_rollback import _debris, _tree, _two_states, hook_renames_into_place

EDIT = b"saved = 'during the rollback'\n"


def in_source_history(proj, rel, data):
    """Whether some snapshot on the store's source history holds ``rel`` with ``data``."""
    repo = proj.store.repo
    stack = [proj.store.source_tip()]
    seen = set()
    while stack:
        commit = stack.pop()
        if commit in seen:
            continue
        seen.add(commit)
        if proj.store.read_file(commit, rel) == data:
            return True
        stack.extend(str(p) for p in repo[commit].parent_ids)
    return False


@pytest.fixture(autouse=True, params=["renameat2", "os.replace"])
def rename_primitive(request, monkeypatch):
    """Each test runs with the atomic swap and with the fallback of systems without it."""
    if request.param == "os.replace":
        monkeypatch.setattr(renameat, "_renameat2", None)
    elif renameat._renameat2 is None:
        pytest.skip("renameat2 is not available here")
    return request.param


def _edit_when_journal(monkeypatch, phase, rel, root, data=EDIT):
    """Save ``rel`` right after the rollback writes its journal in ``phase``."""
    real = Replacer._write_journal
    made = []

    def write_journal(self, journal):
        real(self, journal)
        if journal["phase"] == phase and not made:
            (root / rel).write_bytes(data)
            made.append(rel)

    monkeypatch.setattr(Replacer, "_write_journal", write_journal)
    return made


@pytest.mark.parametrize("phase", ["prepare", "replace"])
@pytest.mark.parametrize("rel", ["pkg/m0.py", "pkg/m7.py", "only_a.py"])
def test_a_file_saved_once_the_journal_appears_stops_the_rollback(tmp_path, monkeypatch, phase, rel):
    root, proj, a, b, state_a, state_b = _two_states(tmp_path)
    if rel == "only_a.py":  # a file the rollback creates: the user made one meanwhile
        a, _ = proj.store.snapshot({**proj.scan(), rel: b"a = 0\n"}, "has only_a")
    made = _edit_when_journal(monkeypatch, phase, rel, root)
    with pytest.raises(StoreError) as info:
        Project(str(root)).rollback(a)
    assert made == [rel]
    message = str(info.value)
    assert "\n" not in message and f"{rel} was saved after the rollback snapshotted it" in message
    assert "nothing replaced" in message
    assert _tree(root) == {**state_b, rel: EDIT}  # nothing replaced, the edit kept
    assert not _debris(root)
    monkeypatch.undo()
    result = Project(str(root)).rollback(a)  # run again: the edit is snapshotted first
    assert in_source_history(proj, rel, EDIT) and result.backup_commit
    assert Project(str(root)).undo().restored and (root / rel).read_bytes() == EDIT


def test_undo_does_not_remove_a_created_file_saved_during_it(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "a.py").write_text("a = 1\n")
    (root / "new.py").write_text("n = 1\n")
    proj, _ = Project.init(str(root))
    first = proj.commit_change(force=True).branch
    (root / "new.py").unlink()
    (root / "a.py").write_text("a = 2\n")
    assert Project(str(root)).rollback(first).restored == ["a.py", "new.py"]  # it created new.py
    made = _edit_when_journal(monkeypatch, "replace", "new.py", root)
    with pytest.raises(StoreError) as info:
        Project(str(root)).undo()
    assert made and "new.py was saved after the rollback snapshotted it" in str(info.value)
    assert (root / "new.py").read_bytes() == EDIT and (root / "a.py").read_text() == "a = 1\n"
    assert not _debris(root)


@pytest.mark.parametrize("at", [0, 4, 10])
def test_a_save_between_two_renames_stops_and_puts_back(tmp_path, monkeypatch, at):
    """A save lands while file number ``at`` is renamed into place, into the next one (not
    replaced yet): the ``at + 1`` files replaced are put back. A second save, into a file
    already replaced, is the newest content: it stays."""
    root, proj, a, b, state_a, state_b = _two_states(tmp_path)
    calls = {"n": 0}
    order = sorted(f"pkg/m{i}.py" for i in range(12))  # the order files are renamed in
    pending = order[at + 1]

    def save(src, dst):
        if calls["n"] == at:
            (root / pending).write_bytes(EDIT)
            if at:
                (root / order[0]).write_bytes(b"newest = 1\n")
        calls["n"] += 1

    hook_renames_into_place(monkeypatch, save)
    with pytest.raises(StoreError) as info:
        Project(str(root)).rollback(a)
    assert f"{pending} was saved after the rollback snapshotted it" in str(info.value)
    expected = {**state_b, pending: EDIT}
    if at:
        expected[order[0]] = b"newest = 1\n"
    assert _tree(root) == expected
    assert not _debris(root)


def _killed_in_phase(root, proj, a, phase):
    """The state a kill -9 leaves once the journal is in ``phase`` and no file is renamed yet."""
    source = proj.store.resolve(a).source_commit
    target = proj.store.files(source)
    writes = [[rel, tmp_name(rel)] for rel in sorted(target) if (root / rel).read_bytes() != target[rel]]
    backup, _ = proj.store.snapshot(proj.scan(), "before")
    for rel, tmp in writes:
        (root / tmp).write_bytes(target[rel])
    journal = {"label": a, "source": source, "backup": backup, "write": writes, "remove": [], "created": [], "phase": phase}
    (root / ".scalebox" / JOURNAL_FILE).write_text(json.dumps(journal))
    return writes


def test_finishing_a_killed_rollback_snapshots_a_file_saved_since(tmp_path):
    root, proj, a, b, state_a, state_b = _two_states(tmp_path)
    _killed_in_phase(root, proj, a, "replace")
    (root / "pkg" / "m3.py").write_bytes(EDIT)  # saved after the kill, before the next command
    done = Project(str(root)).recover()
    assert done.startswith(f"finished an interrupted rollback to {a}") and "snapshotted first as" in done
    assert {k: v for k, v in _tree(root).items() if k != "only_b.py"} == state_a
    assert in_source_history(proj, "pkg/m3.py", EDIT)
    assert not _debris(root)


def test_putting_back_after_a_kill_keeps_a_file_saved_since(tmp_path):
    root, proj, a, b, state_a, state_b = _two_states(tmp_path)
    writes = _killed_in_phase(root, proj, a, "putback")
    for rel, tmp in writes[:3]:  # three were renamed in before the failure
        os.replace(root / tmp, root / rel)
    (root / writes[1][0]).write_bytes(EDIT)  # one of them saved again since
    (root / writes[5][0]).write_bytes(EDIT)  # and one never replaced
    assert "was reverted" in Project(str(root)).recover()
    assert _tree(root) == {**state_b, writes[1][0]: EDIT, writes[5][0]: EDIT}
    assert not _debris(root)


@pytest.mark.parametrize("rel", ["pkg/m5.py", "only_a.py"])
def test_a_save_between_the_check_and_the_rename_is_kept(tmp_path, monkeypatch, rel, rename_primitive):
    """The save lands in the last instant: after the file was compared with the snapshot, just
    before the new file is renamed over it (or, for a file the rollback creates, into its
    place). With renameat2 the swap makes the comparison and the replacement one step."""
    if rename_primitive == "os.replace":
        pytest.skip("without renameat2 this window remains (compare, then os.replace)")
    root, proj, a, b, state_a, state_b = _two_states(tmp_path)
    if rel == "only_a.py":
        a, _ = proj.store.snapshot({**proj.scan(), rel: b"a = 0\n"}, "has only_a")
    made = []

    def save(src, dst):
        if str(dst).endswith(rel.replace("/", os.sep)) and not made:
            (root / rel).write_bytes(EDIT)
            made.append(rel)

    hook_renames_into_place(monkeypatch, save)
    with pytest.raises(StoreError) as info:
        Project(str(root)).rollback(a)
    assert made == [rel]
    assert f"{rel} was saved after the rollback snapshotted it" in str(info.value)
    assert _tree(root) == {**state_b, rel: EDIT}  # nothing replaced, the edit kept
    assert not _debris(root)


def test_a_rollback_killed_just_after_a_swap_is_finished_forward(tmp_path, rename_primitive):
    """A kill between the swap and the removal of the file swapped out leaves the replaced
    file (the snapshot's content) at the temporary name: recovery removes it, it does not put
    it back over the new file, and takes no edit snapshot (nothing was saved)."""
    root, proj, a, b, state_a, state_b = _two_states(tmp_path)
    writes = _killed_in_phase(root, proj, a, "replace")
    rel, tmp = writes[2]
    before = (root / rel).read_bytes()
    os.replace(root / rel, root / "swap")  # the swap, by hand: new file in place, old one aside
    os.replace(root / tmp, root / rel)
    os.replace(root / "swap", root / tmp)
    assert (root / tmp).read_bytes() == before
    done = Project(str(root)).recover()
    assert done.startswith(f"finished an interrupted rollback to {a}") and "snapshotted first" not in done
    assert {k: v for k, v in _tree(root).items() if k != "only_b.py"} == state_a
    assert not _debris(root)
