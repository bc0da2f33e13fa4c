"""``scalebox gc``: the store compacted on the user's word, nothing a user made lost, whatever
kills it and whoever writes beside it."""
import os
import shutil
import subprocess
import sys
import time

import pytest

from scalebox_cst.store import Store, gc

OLD = time.time() - 30 * 86400
SAVES = 30


def _save(store, i, fp="fp"):
    files = {"train.py": b"import torch\nstep = %d\n" % i, "lib/util.py": b"X = %d\n" % (i % 3)}
    source, _ = store.snapshot(files, f"save {i}")
    out = {path: data + b"# rewritten\n" for path, data in files.items()}
    store.commit_rewrite(source, out, "rewrite", f"save {i}", {"files": [{"path": "train.py", "i": i}]}, fp)
    store.cache_put_many([(Store.blob_id(data), fp, out[path], {"status": "rewritten", "i": i}) for path, data in files.items()])


def _contents(root):
    """Every branch's files and report, and the source history: what a user made."""
    store = Store.open(root)
    found = {b.name: (store.files(b.commit), store.report(b.name)) for b in store.branches()}
    found["source"] = store.files(store.source_tip())
    store.close()
    return found


def _loose(root):
    objects = os.path.join(root, ".scalebox", "store.git", "objects")
    return [os.path.join(objects, d, f) for d in os.listdir(objects) if len(d) == 2 for f in os.listdir(os.path.join(objects, d))]


def _age_everything(root):
    for path in _loose(root):
        os.utime(path, (OLD, OLD))


def _fsck(root):
    if shutil.which("git") is None:
        return
    proc = subprocess.run(["git", "--git-dir", os.path.join(root, ".scalebox", "store.git"), "fsck", "--no-dangling"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "error" not in proc.stderr.lower(), proc.stderr


@pytest.fixture
def made(tmp_path):
    root = str(tmp_path / "proj")
    os.makedirs(root)
    store = Store.init(root)
    for i in range(SAVES):
        _save(store, i)
    store.close()
    _age_everything(root)
    return root, _contents(root)


def test_dry_run_changes_nothing_and_gc_keeps_everything_a_user_made(made):
    root, before = made
    loose = sorted(_loose(root))
    report = gc.collect(Store.open(root), dry_run=True)
    assert sorted(_loose(root)) == loose  # nothing changed
    assert report.pruned > 0 and report.packed > 0 and "would pack" in report.line()
    report = gc.collect(Store.open(root))
    assert _loose(root) == [] and _contents(root) == before
    assert report.pruned > 0 and report.pack_bytes < report.loose_bytes
    _fsck(root)
    store = Store.open(root)  # and the store goes on: a new save, the cache hits
    _save(store, SAVES)
    assert store.cache_get(Store.blob_id(b"import torch\nstep = 3\n"), "fp") is not None


@pytest.mark.parametrize("removals", [0, 7, 200])
def test_a_gc_killed_at_any_point_leaves_every_branch_whole(made, removals):
    """Killed (os._exit: no clean-up) at its first removal (before the pack), after a few
    and after many: every branch reads as before, and a second pass finishes the work."""
    root, before = made
    child = (
        "import os, sys\n"
        "from scalebox_cst.store import Store, gc\n"
        "count, real = [0], gc._remove\n"
        "def dying(path):\n"
        "    count[0] += 1\n"
        f"    if count[0] > {removals}:\n"
        "        os._exit(9)\n"
        "    real(path)\n"
        "gc._remove = dying\n"
        f"gc.collect(Store.open({root!r}), grace_s=0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    assert _contents(root) == before
    gc.collect(Store.open(root), grace_s=0)
    assert _loose(root) == [] and _contents(root) == before
    _fsck(root)


def test_gc_beside_a_writer(made):
    """A writer commits saves while gc runs twice: the writer's branches and everything before
    are whole (its objects are younger than the grace period, and refs move under the lock)."""
    root, before = made
    writer = (  # _save's saves, in another process
        "from scalebox_cst.store import Store\n"
        f"store = Store.open({root!r})\n"
        f"for i in range({SAVES}, {SAVES + 25}):\n"
        "    files = {'train.py': b'import torch\\nstep = %d\\n' % i, 'lib/util.py': b'X = %d\\n' % (i % 3)}\n"
        "    source, _ = store.snapshot(files, f'save {i}')\n"
        "    out = {p: d + b'# rewritten\\n' for p, d in files.items()}\n"
        "    store.commit_rewrite(source, out, 'rewrite', f'save {i}', {'files': [{'path': 'train.py', 'i': i}]}, 'fp2')\n"
        "    store.cache_put_many([(Store.blob_id(d), 'fp2', out[p], {'status': 'rewritten'}) for p, d in files.items()])\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", writer], stderr=subprocess.PIPE, text=True)
    try:
        while proc.poll() is None:
            gc.collect(Store.open(root))
    finally:
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    gc.collect(Store.open(root))
    after = _contents(root)
    assert {k: v for k, v in after.items() if k in before and k != "source"} == {k: v for k, v in before.items() if k != "source"}
    assert len(after) == len(before) + 25
    _fsck(root)


def test_reflogs_of_a_creation_only_go_and_moved_branches_keep_theirs(made):
    """Each run branch kept a one-line reflog (its creation): a 4 kB block of disk a branch, 7 of
    the 15 MB left after gc at 1,500 branches. Those go; a log that says more (a branch that
    moved) stays, and so do the commits it names."""
    root, before = made
    store = Store.open(root)
    logs = os.path.join(store.path, "logs", "refs", "heads")
    branches = [b.name for b in store.branches()]
    assert all(os.path.isfile(os.path.join(logs, *name.split("/"))) for name in branches)
    moved = branches[0]
    first = store.repo.references.get(f"refs/heads/{moved}").target
    other = store.repo.references.get(f"refs/heads/{branches[1]}").target
    store.repo.references.get(f"refs/heads/{moved}").set_target(other, "moved")
    store.close()
    report = gc.collect(Store.open(root), dry_run=True)
    assert report.reflogs_removed == len(branches) - 1 and "reflogs" in report.line()
    assert all(os.path.isfile(os.path.join(logs, *name.split("/"))) for name in branches)
    report = gc.collect(Store.open(root))
    assert report.reflogs_removed == len(branches) - 1
    left = [name for name in branches if os.path.isfile(os.path.join(logs, *name.split("/")))]
    assert left == [moved]
    store = Store.open(root)
    assert store.repo.get(first) is not None  # what the moved branch's log names is kept
    store.repo.references.get(f"refs/heads/{moved}").set_target(first, "back")
    store.close()
    assert _contents(root) == before
    _fsck(root)


def test_a_process_alive_past_the_grace_period_writes_again_what_gc_removed(made):
    # the store's set of ids known stored was trusted for good: a watcher alive past the grace
    # period named a cache tree gc had removed without writing it again (git fsck: broken link)
    from scalebox_cst.store import objects
    from scalebox_cst.store.common import MODE_FILE

    root, _ = made
    alive = Store.open(root)  # a long-lived process
    blob = alive._write_blob(b"entry\n")
    items = [(b"x.json", MODE_FILE, blob)]
    tree = alive._store_tree(items)  # a cache tree nothing reaches once its cache moved on
    path = os.path.join(root, ".scalebox", "store.git", "objects", tree.hex()[:2], tree.hex()[2:])
    alive._present_since = time.time() - 2 * objects.PRESENT_TRUST_S  # an hour and more later...
    os.utime(path, (OLD, OLD))
    gc.collect(Store.open(root), grace_s=3600)  # ...gc removes it
    assert not os.path.exists(path)
    assert alive._store_tree(items) == tree
    assert alive.repo.get(tree.hex()) is not None  # written again, not named from memory
    # and one found stored (old, unreachable) is freshened, so gc keeps what was just named
    os.utime(path, (OLD, OLD))
    fresh = Store.open(root)
    assert fresh._store_tree(items) == tree
    gc.collect(Store.open(root), grace_s=3600)
    assert fresh.repo.get(tree.hex()) is not None


def test_a_killed_pass_s_temporary_pack_goes_at_the_next_pass(made):
    # a pass killed while libgit2 wrote its pack left objects/pack/pack_git2_*, as large as the
    # store; only a pass writes one, under the write lock it holds, yet the next pass removed it
    # only once it was an hour old
    root, before = made
    pack = os.path.join(root, ".scalebox", "store.git", "objects", "pack")
    os.makedirs(pack, exist_ok=True)
    left = os.path.join(pack, "pack_git2_4f2a9c")
    with open(left, "wb") as fh:
        fh.write(os.urandom(1 << 16))
    mine = os.path.join(pack, "notes.txt")  # anything else there is not the pass's to remove
    with open(mine, "w") as fh:
        fh.write("kept\n")
    gc.collect(Store.open(root))
    assert not os.path.exists(left) and os.path.exists(mine)
    assert _contents(root) == before
    _fsck(root)


def test_ids_known_stored_are_not_trusted_past_a_suspend(made, monkeypatch):
    # the trust in ids known stored ran on the monotonic clock, which stands still while the
    # machine sleeps; gc ages objects by the wall clock: a laptop suspended past the grace period
    # woke with every id still trusted, gc (another process) removed them, and the process named
    # them again without writing them (git fsck: broken link)
    from scalebox_cst.store.common import MODE_FILE

    root, _ = made
    alive = Store.open(root)
    blob = alive._write_blob(b"suspended\n")
    items = [(b"z.json", MODE_FILE, blob)]
    tree = alive._store_tree(items)
    path = os.path.join(root, ".scalebox", "store.git", "objects", tree.hex()[:2], tree.hex()[2:])
    woke = time.time() + 2 * 3600  # two hours asleep: the wall clock moved on, the monotonic one did not
    monkeypatch.setattr(time, "time", lambda: woke)
    gc.collect(Store.open(root), grace_s=3600)
    assert not os.path.exists(path)
    assert alive._store_tree(items) == tree
    assert alive.repo.get(tree.hex()) is not None  # written again, not named from memory
