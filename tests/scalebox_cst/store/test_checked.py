"""A damaged store: object files cut short (a power loss, a bad disk), in random trials.

libgit2 1.9 loops forever inflating a loose object whose zlib stream ends early (libgit2 issue
7342): every command that read one hung, ``scalebox log`` included. Each trial cuts one object
of a small store at a random length and runs commands in subprocesses with a time limit: each
ends, with no traceback and at most one line, which names the damaged file; the user's files
are unchanged. ``SCALEBOX_FAULT_TRIALS`` sets the trials (CI: a few), as in test_faults.py.
"""
import os
import random
import shutil
import subprocess
import sys

import pygit2
import pytest

from scalebox_cst.store import Store, StoreError, checked

from conftest import HELPERS_PY, ROOT, TRAIN_PY

TRIALS = int(os.environ.get("SCALEBOX_FAULT_TRIALS", "4"))
CLI = [sys.executable, "-c", "from scalebox_cst.cli import main; main()"]
COMMANDS = [["log"], ["status"], ["diff"], ["rewrite", "."], ["rollback", "run/0001"]]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}


def _scalebox(root, *args, timeout=60):
    try:
        return subprocess.run([*CLI, *args], cwd=root, capture_output=True, text=True, env=_env(), timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def _loose(root):
    objects = os.path.join(root, ".scalebox", "store.git", "objects")
    return sorted(os.path.join(d, f) for d, _, files in os.walk(objects) for f in files if len(f) == 38)


def _read_by_every_command(root):
    """The object files of the newest branch and of the newest snapshot (each command reads them)."""
    listed = subprocess.run(
        ["git", "--git-dir", os.path.join(root, ".scalebox", "store.git"), "rev-list", "--objects", "--no-walk", "run/0002", "source"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    hexids = [w for w in listed if len(w) == 40]
    return sorted(os.path.join(root, ".scalebox", "store.git", "objects", h[:2], h[2:]) for h in hexids)


def _cut(path, length):
    with open(path, "rb") as fh:
        data = fh.read()
    os.chmod(path, 0o644)
    with open(path, "wb") as fh:
        fh.write(data[:length])


@pytest.fixture(scope="module")
def two_branches(tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged") / "base"
    root.mkdir()
    (root / "train.py").write_text(TRAIN_PY)
    (root / "helpers.py").write_text(HELPERS_PY)
    assert _scalebox(root, "rewrite", ".").returncode == 0
    (root / "helpers.py").write_text(HELPERS_PY + "\nEXTRA = 1\n")
    assert _scalebox(root, "rewrite", ".").returncode == 0
    return root


def test_a_truncated_object_is_one_line_naming_it_never_a_hang(two_branches, tmp_path):
    rng = random.Random(23)
    objects = _loose(two_branches)
    failures = []
    for trial in range(TRIALS * 2):
        root = tmp_path / f"t{trial}"
        shutil.copytree(two_branches, root, symlinks=True)
        victim = rng.choice(_read_by_every_command(root))
        size = os.path.getsize(victim)
        _cut(victim, rng.randint(2, size * 2 // 3))  # inside the zlib stream: libgit2 looped
        files = {n: (root / n).read_bytes() for n in ("train.py", "helpers.py")}
        command = COMMANDS[trial % len(COMMANDS)]
        proc = _scalebox(root, *command, timeout=30)
        name = f"{command} with {os.path.relpath(victim, root)} cut"
        if proc is None:
            failures.append(f"{name}: hung")
            continue
        lines = proc.stderr.splitlines()
        if "Traceback" in proc.stderr or len(lines) > 1:
            failures.append(f"{name}: {proc.stderr[-500:]}")
        elif proc.returncode and not ("damaged object file" in proc.stderr and os.path.basename(victim) in proc.stderr):
            failures.append(f"{name}: {proc.stderr}")
        if command[0] != "rollback" and files != {n: (root / n).read_bytes() for n in files}:
            failures.append(f"{name}: the user's files changed")
    assert len(objects) > 10 and not failures, "\n".join(failures)


def test_the_store_reads_a_truncated_object_as_an_error_and_writes_as_before(tmp_path):
    """In process: each kind of object (blob, tree, commit) cut short is a one-line StoreError;
    the commits the store now encodes itself are the ones libgit2 reads back (and git fsck)."""
    store = Store.init(str(tmp_path))
    tip, _ = store.snapshot({"a.py": b"x = 1\n" * 50, "pkg/b.py": b"y = 2\n" * 50}, "base")
    branch, _ = store.commit_rewrite(tip, {"a.py": b"x = 3\n" * 50}, "r", "", {"n": 1}, "fp")
    info = store.resolve(branch)
    assert store.read_file(info.commit, "a.py") == b"x = 3\n" * 50 and info.source_commit == tip
    assert store.repo[info.commit].parent_ids[0] == pygit2.Oid(hex=tip)
    fsck = subprocess.run(["git", "--git-dir", store.path, "fsck", "--strict"], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    store.close()
    commit = store.repo[info.commit]
    victims = {"commit": info.commit, "tree": str(commit.tree_id), "blob": str(commit.tree["a.py"].id)}
    for kind, hexid in victims.items():
        root = tmp_path / kind
        shutil.copytree(tmp_path / ".scalebox", root / ".scalebox")
        _cut(os.path.join(root, ".scalebox", "store.git", "objects", hexid[:2], hexid[2:]), 12)
        with pytest.raises(StoreError) as info_:
            Store.open(str(root)).read_file(info.commit, "a.py")
        text = str(info_.value)
        assert "damaged object file" in text and hexid[2:] in text and "\n" not in text, text


def test_read_loose_checks_the_whole_stream(tmp_path):
    import zlib

    objects = tmp_path / "objects"
    (objects / "ab").mkdir(parents=True)
    whole = zlib.compress(b"blob 5\0hello")
    for name, data, ok in [("c" * 38, whole, True), ("d" * 38, whole[:-3], False),
                           ("e" * 38, zlib.compress(b"blob 9\0hello"), False), ("f" * 38, b"junk", False)]:
        (objects / "ab" / name).write_bytes(data)
        if ok:
            assert checked.read_loose(str(objects), "ab" + name) == (3, b"hello")
        else:
            with pytest.raises(checked.DamagedObject):
                checked.read_loose(str(objects), "ab" + name)
    with pytest.raises(KeyError):
        checked.read_loose(str(objects), "ab" + "0" * 38)


@pytest.mark.parametrize("ref, command", [("run/0002", ["log"]), ("run/0002", ["rollback", "run/0002"]),
                                          ("source", ["rewrite", "."])])
def test_a_branch_pointing_to_a_missing_commit_is_named(two_branches, tmp_path, ref, command):
    """A ref file whose commit is not in the store said "unknown commit 1234..." and named no
    branch; the one line now names the branch, says the store is damaged and how to go on."""
    root = tmp_path / "p"
    shutil.copytree(two_branches, root, symlinks=True)
    with open(root / ".scalebox" / "store.git" / "refs" / "heads" / ref, "w") as fh:
        fh.write("1234567890" * 4 + "\n")
    files = {n: (root / n).read_bytes() for n in ("train.py", "helpers.py")}
    proc = _scalebox(root, *command)
    assert proc is not None and proc.returncode != 0 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert f"branch {ref} points to commit 123456789012, which is not in the store: the store is damaged" in line, line
    assert files == {n: (root / n).read_bytes() for n in files}


def _git(root, *args):
    return subprocess.run(["git", "--git-dir", os.path.join(root, ".scalebox", "store.git"), *args],
                          capture_output=True, text=True)


@pytest.mark.parametrize("victim", ["cache tree", "cached output"])
def test_a_damaged_cache_is_made_again_and_a_damaged_output_healed(two_branches, tmp_path, victim):
    """The rewrite cache can always be made again: its damage stopped every rewrite with an
    error. A damaged cache now reads as empty (a new one is written), and an output blob found
    damaged is written whole again when the file is rewritten (the old file set aside), which
    also mends the earlier branches that hold it."""
    root = tmp_path / "p"
    shutil.copytree(two_branches, root, symlinks=True)
    cache = next(line.split()[-1] for line in _git(root, "for-each-ref").stdout.splitlines() if "refs/scalebox/cache/" in line)
    if victim == "cache tree":
        hexid = _git(root, "rev-parse", cache + "^{tree}").stdout.strip()
    else:  # train.py's output on the newest branch: differs from its source
        hexid = _git(root, "rev-parse", "run/0002:train.py").stdout.strip()
        assert hexid != _git(root, "rev-parse", "source:train.py").stdout.strip()
    _cut(os.path.join(root, ".scalebox", "store.git", "objects", hexid[:2], hexid[2:]), 20)
    (root / "helpers.py").write_text(HELPERS_PY + "\nEXTRA = 2\n")
    proc = _scalebox(root, "rewrite", ".")
    assert proc is not None and proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    if victim == "cached output":
        assert (root / ".scalebox" / "store.git" / "damaged" / hexid).exists()
        fsck = _git(root, "fsck", "--strict")
        assert fsck.returncode == 0, fsck.stdout + fsck.stderr
        assert _git(root, "cat-file", "-p", "run/0002:train.py").returncode == 0
    assert _git(root, "cat-file", "-p", "run/0003:train.py").returncode == 0


def test_the_checked_object_database_lists_every_object(two_branches):
    """``for oid in repo.odb`` recursed through the checked backend until a RecursionError (pygit2's
    iteration of a Python backend calls back into it): it lists what git lists."""
    store = Store.open(str(two_branches))
    listed = {str(oid) for oid in store.repo.odb}
    git = subprocess.run(["git", "--git-dir", store.path, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert listed == set(git) and len(listed) > 10
