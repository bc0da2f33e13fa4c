"""A store whose notes refs or rewrite cache are damaged or hostile (a ``.scalebox/`` that came
with a project, a crash, a hand edit): a notes ref pointing at a blob or a missing object, a
fan-out folder that is a blob, a cache entry whose file is a folder. Every such store still takes
new branches, reads its cache as misses and answers in StoreError (one line), never with a
pygit2 ``AttributeError``/``TypeError`` traceback; and a branch that was made is never reported
as a failure because the note that vouches for it could not be written.

Found by the fourth fault campaign: a cache entry whose ``.json`` was a folder failed
``scalebox rewrite`` with ``AttributeError: '_pygit2.Tree' object has no attribute 'data'``, a
cache fan-out folder that was a blob with ``TypeError: '_pygit2.Blob' object is not iterable``;
``refs/notes/scalebox-vouched`` (or ``-reports``) at a blob or a missing object refused every
new branch for good (``... is not a commit``), and with the vouched ref damaged the branch was
made and the command still ended 1."""
from __future__ import annotations

import os

import pygit2
import pytest

from scalebox_cst.store import Store, StoreError
from scalebox_cst.store.common import CACHE_PREFIX, REPORTS_REF, VOUCHED_REF

FP = "0123456789abcdef"
MISSING = "1234567890123456789012345678901234567890"


def _rewrite(store: Store, files: dict, changed: dict):
    tip, _ = store.snapshot(files, "snap")
    return store.commit_rewrite(tip, changed, "rewrite", "a.py:1: t rewritten", {"files": []}, FP)


def _fanout_blob(repo: pygit2.Repository, ref: str) -> None:
    """The ref's first two-hex folder replaced by a blob (a notes or cache tree damaged)."""
    tip = repo.references[ref].peel(pygit2.Commit)
    builder = repo.TreeBuilder(tip.tree)
    first = next(iter(tip.tree)).name
    builder.insert(first, repo.create_blob(b"not a folder\n"), pygit2.GIT_FILEMODE_BLOB)
    sig = pygit2.Signature("t", "t@t")
    commit = repo.create_commit(None, sig, sig, "damaged\n", builder.write(), [])
    repo.references[ref].set_target(commit)


def _entry_file_is_a_folder(repo: pygit2.Repository, ref: str) -> None:
    """Each cache entry's report file (``xx/<id>.json``) replaced by an empty folder."""
    tip = repo.references[ref].peel(pygit2.Commit)
    root = repo.TreeBuilder(tip.tree)
    empty = repo.TreeBuilder().write()
    for folder in tip.tree:
        sub = repo.TreeBuilder(folder)
        for entry in folder:
            if entry.name.endswith(".json"):
                sub.insert(entry.name, empty, pygit2.GIT_FILEMODE_TREE)
        root.insert(folder.name, sub.write(), pygit2.GIT_FILEMODE_TREE)
    sig = pygit2.Signature("t", "t@t")
    repo.references[ref].set_target(repo.create_commit(None, sig, sig, "damaged\n", root.write(), []))


def _point(repo: pygit2.Repository, ref: str, target: str) -> None:
    if target == "blob":
        repo.references[ref].set_target(repo.create_blob(b"hi\n"))
    else:  # a loose ref file naming an object the store does not have
        with open(os.path.join(repo.path, *ref.split("/")), "w") as fh:
            fh.write(MISSING + "\n")


DAMAGES = ["vouched_blob", "vouched_missing", "reports_blob", "reports_missing",
           "vouched_fanout_blob", "reports_fanout_blob", "cache_fanout_blob", "cache_entry_folder"]


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_notes_and_cache_take_new_branches_and_read_as_misses(tmp_path, damage):
    store = Store.init(str(tmp_path))
    files = {"a.py": b"x = 1\n"}
    _rewrite(store, files, {"a.py": b"x = 2\n"})
    store.cache_put(_blob(store, b"x = 1\n"), FP, b"x = 2\n", {"sites": []})
    cache_ref = CACHE_PREFIX + FP
    which, _, how = damage.partition("_")
    ref = {"vouched": VOUCHED_REF, "reports": REPORTS_REF, "cache": cache_ref}[which]
    repo = pygit2.Repository(store.path)  # git's own writer: the store's refuses other writes
    if how in ("blob", "missing"):
        _point(repo, ref, how)
    elif how == "fanout_blob":
        _fanout_blob(repo, ref)
    else:
        _entry_file_is_a_folder(repo, ref)
    store = Store(store.path)  # a fresh reader: nothing of the first one's memory
    # a damaged cache reads as a miss and takes a new entry
    hit = store.cache_get(_blob(store, b"x = 1\n"), FP)
    assert hit is None if which == "cache" else hit[0] == _blob(store, b"x = 2\n")
    store.cache_put(_blob(store, b"x = 1\n"), FP, b"x = 3\n", {"sites": []})
    assert store.cache_get(_blob(store, b"x = 1\n"), FP)[0] == _blob(store, b"x = 3\n")
    # a new branch is made, reported and vouched for
    name, commit = _rewrite(store, {"a.py": b"x = 5\n"}, {"a.py": b"x = 6\n"})
    assert store.report(name)["files"] == []
    assert store.vouched(commit)
    # the first branch's report: there, or a one-line StoreError where the damage took it
    try:
        store.report("run/0001")
    except StoreError as exc:
        assert "\n" not in str(exc)


def _blob(store: Store, data: bytes) -> str:
    return str(pygit2.hash(data))


def test_a_branch_made_is_not_a_failure_when_its_vouch_cannot_be_written(tmp_path, monkeypatch):
    """A full disk as the vouch note is written: the branch exists, so commit_rewrite returns it
    (the branch is checked again and vouched for when it next runs)."""
    store = Store.init(str(tmp_path))

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "_vouch", full)
    name, commit = _rewrite(store, {"a.py": b"x = 1\n"}, {"a.py": b"x = 2\n"})
    assert store.resolve(name).commit == commit and not store.vouched(commit)
