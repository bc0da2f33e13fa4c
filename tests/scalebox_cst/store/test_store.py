"""Tests for the rewrite store: plumbing-only writes, the user's repo untouched, concurrent writers
(threads and processes) losing nothing, and a result plain git can read."""
from __future__ import annotations

import gc
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

import pygit2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scalebox_cst.store.refs as store_refs
from scalebox_cst.store import (
    CACHE_PREFIX,
    LOCK_NAME,
    REPORTS_REF,
    SOURCE_REF,
    BranchInfo,
    Store,
    StoreError,
)

FP = "0123456789abcdef"
FP2 = "fedcba9876543210"


def git_env(home) -> dict:
    env = dict(os.environ)
    for key in list(env):
        if key.startswith("GIT_"):
            del env[key]
    env.update(
        HOME=str(home),
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME="user",
        GIT_AUTHOR_EMAIL="user@example.com",
        GIT_COMMITTER_NAME="user",
        GIT_COMMITTER_EMAIL="user@example.com",
    )
    return env


def git(*args, cwd=None, env=None, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["git", *args], cwd=cwd, env=env or git_env(cwd or os.getcwd()), capture_output=True, text=True
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return proc


def store_git(store: Store, *args, check=True) -> subprocess.CompletedProcess:
    return git("--git-dir", store.path, *args, cwd=os.path.dirname(store.path), check=check)


def assert_fsck_clean(store: Store) -> None:
    proc = store_git(store, "fsck", "--strict", "--no-progress", "--no-dangling", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for word in ("error", "missing", "broken", "bad", "warning"):
        assert word not in out.lower(), out


def source_history(store: Store) -> list:
    """refs/heads/source newest..oldest, asserting it is linear."""
    out = []
    commit = store.repo[pygit2.Oid(hex=store.source_tip())]
    while True:
        assert len(commit.parent_ids) <= 1, "source history must be linear"
        out.append(str(commit.id))
        if not commit.parent_ids:
            return out
        commit = store.repo[commit.parent_ids[0]]


@pytest.fixture
def project(tmp_path):
    path = tmp_path / "proj"
    path.mkdir()
    return str(path)


@pytest.fixture
def store(project):
    return Store.init(project)


def rewrite_one(store: Store, files: dict, changed: dict, summary="rewrite", fp=FP, report=None):
    tip, _ = store.snapshot(files, "snap")
    return tip, store.commit_rewrite(tip, changed, summary, "a.py:1: t rewritten", report or {"files": []}, fp)


# --- init / open ---------------------------------------------------------------------------------


def test_init_creates_bare_store_and_gitignore(project):
    store = Store.init(project)
    box = os.path.join(project, ".scalebox")
    assert store.path == os.path.join(box, "store.git")
    with open(os.path.join(box, ".gitignore")) as fh:
        assert fh.read() == "*\n"
    repo = pygit2.Repository(store.path)
    assert repo.is_bare
    assert repo.config["core.logAllRefUpdates"] == "always"
    assert store.source_tip() is None and store.branches() == [] and store.newest_branch() is None
    # HEAD names the snapshot branch, so a plain `git log` in the store shows snapshots
    assert store_git(store, "symbolic-ref", "HEAD").stdout.strip() == SOURCE_REF

    tip, _ = store.snapshot({"a.py": b"x = 1\n"}, "first")
    again = Store.init(project)  # idempotent: nothing reset
    assert again.source_tip() == tip
    with open(os.path.join(box, ".gitignore")) as fh:
        assert fh.read() == "*\n"
    assert Store.open(project).source_tip() == tip


def test_open_without_store_is_a_clear_error_and_never_finds_the_users_git(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    git("init", "-q", str(user), cwd=str(tmp_path))
    with pytest.raises(StoreError, match=r"no store at .*: run `scalebox init`") as info:
        Store.open(str(user))
    assert "\n" not in str(info.value)
    # even opening a missing store path inside the user's repo must not walk up to its .git
    (user / ".scalebox").mkdir()
    with pytest.raises(StoreError, match="no store"):
        Store(str(user / ".scalebox" / "store.git"))
    with pytest.raises(StoreError, match="no store"):
        Store(str(user / ".scalebox"))
    with pytest.raises(StoreError, match="no store"):
        Store(str(user))  # the user's project folder, whose .git is a repository: refused


def test_users_git_repo_is_untouched(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    env = git_env(tmp_path)
    git("init", "-q", cwd=str(user), env=env)
    (user / "train.py").write_text("import torch\nx = 1\n")
    (user / "notes.txt").write_text("untracked\n")
    git("add", "train.py", cwd=str(user), env=env)
    git("commit", "-q", "-m", "user commit", cwd=str(user), env=env)
    (user / "train.py").write_text("import torch\nx = 2\n")  # a dirty working tree, as users have

    def state():
        status = git("--no-optional-locks", "status", "--porcelain", "--untracked-files=all",
                     cwd=str(user), env=env).stdout
        dot_git = {}
        for root, _dirs, names in os.walk(user / ".git"):
            for name in names:
                full = os.path.join(root, name)
                with open(full, "rb") as fh:
                    dot_git[os.path.relpath(full, user)] = fh.read()
        tree = {}
        for name in os.listdir(user):
            if name not in (".git", ".scalebox"):
                tree[name] = (user / name).read_bytes()
        return status, dot_git, tree

    before = state()
    assert b"" != before[1][os.path.join(".git", "index")]

    store = Store.init(str(user))
    files = {"train.py": (user / "train.py").read_bytes(), "notes.txt": (user / "notes.txt").read_bytes()}
    tip, _ = store.snapshot(files, "snapshot")
    branch, commit = store.commit_rewrite(tip, {"train.py": b"import torch\nx = 3\n"}, "r", "", {}, FP)
    store.cache_put(Store.blob_id(files["train.py"]), FP, b"import torch\nx = 3\n", {"status": "rewritten"})
    store.snapshot({"train.py": b"changed in store only\n"}, "second")

    after = state()
    assert after == before  # status, every byte under .git (index included), the user's files
    assert ".scalebox" not in after[0]
    assert store.read_file(commit, "train.py") == b"import torch\nx = 3\n"


# --- snapshots -----------------------------------------------------------------------------------


def test_snapshot_dedup_and_parents(store):
    files = {"a.py": b"a = 1\n", "b.py": b"b = 2\n"}
    c1, created = store.snapshot(files, "first")
    assert created and store.source_tip() == c1
    assert store.snapshot(dict(reversed(list(files.items()))), "same again") == (c1, False)
    assert store.snapshot({k: bytearray(v) for k, v in files.items()}, "same as bytearray") == (c1, False)

    c2, created = store.snapshot({**files, "a.py": b"a = 2\n"}, "second")
    assert created and c2 != c1
    assert [str(p) for p in store.repo[pygit2.Oid(hex=c2)].parent_ids] == [c1]
    c3, created = store.snapshot(files, "back to the first content")  # a revert is a new snapshot
    assert created and store.repo[pygit2.Oid(hex=c3)].tree_id == store.repo[pygit2.Oid(hex=c1)].tree_id
    assert source_history(store) == [c3, c2, c1]
    assert store.files(c2) == {"a.py": b"a = 2\n", "b.py": b"b = 2\n"}
    reflog = [e.message for e in store.repo.references[SOURCE_REF].log()]
    assert len(reflog) == 3 and all(m.startswith("snapshot:") for m in reflog)


def test_nested_paths_and_modes(store):
    files = {
        "train.py": b"print('hi')\n",
        "pkg/__init__.py": b"",
        "pkg/models/mlp.py": b"class MLP: pass\n",
        "pkg/models/deep/x.py": b"x = 1\n",
        "pkg/models.py": b"# a file next to a folder of a similar name\n",
        "pkg-data/a.txt": b"a\n",
        "scripts/run.sh": b"#!/bin/sh\necho hi\n",
    }
    tip, _ = store.snapshot(files, "nested", executable=["scripts/run.sh"])
    assert store.files(tip) == files
    assert store.tree_paths(tip) == set(files)
    assert store.executable_paths(tip) == {"scripts/run.sh"}
    assert store.read_file(tip, "pkg/models/deep/x.py") == b"x = 1\n"
    assert store.read_file(tip, "pkg/models") is None  # a folder is not a file
    assert store.read_file(tip, "nope.py") is None
    listing = store_git(store, "ls-tree", "-r", tip).stdout.splitlines()
    modes = {line.split("\t")[1]: line.split()[0] for line in listing}
    assert modes == {p: ("100755" if p == "scripts/run.sh" else "100644") for p in files}
    assert store_git(store, "show", f"{tip}:pkg/models/mlp.py").stdout == "class MLP: pass\n"
    # the same content as an executable is a different tree
    tip2, created = store.snapshot(files, "not executable any more")
    assert created and store.executable_paths(tip2) == set()
    assert_fsck_clean(store)


@pytest.mark.parametrize(
    "bad", ["../evil.py", "/abs.py", "a//b.py", "./a.py", "a/./b.py", ".git/config", "pkg/.GIT/x", "", "a/"]
)
def test_bad_paths_are_refused(store, bad):
    with pytest.raises(StoreError, match="bad path"):
        store.snapshot({bad: b"x"}, "bad")


def test_file_and_folder_clash_is_refused(store):
    with pytest.raises(StoreError, match="a/b"):
        store.snapshot({"a": b"file", "a/b": b"inside"}, "clash")
    with pytest.raises(StoreError, match="executable path not in the snapshot"):
        store.snapshot({"a.py": b""}, "x", executable=["b.py"])


NAME = st.text(alphabet="ab.-_Z0é ", min_size=1, max_size=4).filter(lambda s: s not in (".", "..") and s.lower() != ".git")


@st.composite
def file_sets(draw):
    paths = draw(st.lists(st.lists(NAME, min_size=1, max_size=3).map("/".join), min_size=0, max_size=12, unique=True))
    # drop paths that would be both a file and a folder
    keep = [p for p in paths if not any(q.startswith(p + "/") for q in paths)]
    contents = draw(st.lists(st.binary(max_size=20), min_size=len(keep), max_size=len(keep)))
    execs = draw(st.sets(st.sampled_from(keep))) if keep else set()
    return dict(zip(keep, contents)), execs


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory):
    return Store.init(str(tmp_path_factory.mktemp("shared")))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(file_sets())
def test_tree_ids_match_libgit2(shared_store, case):
    """Our hand-hashed trees are byte-identical to what libgit2's index writes."""
    files, execs = case
    tip, _ = shared_store.snapshot(files, "prop", executable=execs)
    index = pygit2.Index()
    for path, data in files.items():
        assert Store.blob_id(data) == str(pygit2.hash(data))
        mode = pygit2.GIT_FILEMODE_BLOB_EXECUTABLE if path in execs else pygit2.GIT_FILEMODE_BLOB
        index.add(pygit2.IndexEntry(path, pygit2.hash(data), mode))
    expected = index.write_tree(shared_store.repo)
    assert shared_store.repo[pygit2.Oid(hex=tip)].tree_id == expected
    assert shared_store.files(tip) == files
    assert shared_store.executable_paths(tip) == execs


# --- run branches --------------------------------------------------------------------------------


def test_commit_rewrite_tree_trailers_and_numbering(store):
    files = {"a.py": b"a = 1\n", "pkg/b.py": b"b = 1\n"}
    tip, (b1, c1) = rewrite_one(store, files, {"a.py": b"a = 10\n"}, summary="first rewrite")
    assert b1 == "run/0001"
    commit = store.repo[pygit2.Oid(hex=c1)]
    assert [str(p) for p in commit.parent_ids] == [tip]
    assert store.files(c1) == {"a.py": b"a = 10\n", "pkg/b.py": b"b = 1\n"}  # overlay on the snapshot
    assert commit.message == (
        "first rewrite\n\na.py:1: t rewritten\n\n"
        f"Scalebox-Source: {tip}\nScalebox-Pipeline: {FP}\n"
    )
    assert commit.author.name == "scalebox" and commit.author.email == "scalebox@localhost"
    assert commit.committer.name == "scalebox"
    # git itself parses the trailers
    body = store_git(store, "log", "-1", "--format=%B", b1).stdout
    parsed = subprocess.run(["git", "interpret-trailers", "--parse"], input=body, capture_output=True,
                            text=True, check=True).stdout.splitlines()
    assert parsed == [f"Scalebox-Source: {tip}", f"Scalebox-Pipeline: {FP}"]

    _, (b2, _) = rewrite_one(store, {**files, "a.py": b"a = 2\n"}, {"a.py": b"a = 20\n"})
    _, (b3, c3) = rewrite_one(store, files, {}, summary="multi\nline   summary")
    assert (b2, b3) == ("run/0002", "run/0003")
    infos = store.branches()
    assert [i.name for i in infos] == ["run/0001", "run/0002", "run/0003"]
    assert [i.number for i in infos] == [1, 2, 3]
    assert infos[2].summary == "multi line summary"
    assert infos[2].fingerprint == FP and infos[2].commit == c3
    assert store.files(c3) == files
    assert all(isinstance(i.time, int) and i.time > 0 for i in infos)
    assert store.newest_branch() == "run/0003"

    # numbering is 1 + the highest existing number, never reusing or overwriting
    store_git(store, "update-ref", "-d", "refs/heads/run/0003")
    _, (b4, _) = rewrite_one(store, files, {"a.py": b"a = 4\n"})
    assert b4 == "run/0003"
    store_git(store, "update-ref", "refs/heads/run/0009", c1)
    _, (b5, _) = rewrite_one(store, files, {"a.py": b"a = 5\n"})
    assert b5 == "run/0010"
    assert store.resolve("run/0009").commit == c1  # the existing ref was not touched
    assert_fsck_clean(store)


def test_commit_rewrite_accepts_blob_ids_and_keeps_modes(store):
    files = {"a.py": b"a = 1\n", "tool.sh": b"#!/bin/sh\n"}
    tip, _ = store.snapshot(files, "s", executable=["tool.sh"])
    out = store.cache_put(Store.blob_id(files["a.py"]), FP, b"a = 100\n", {"status": "rewritten"})
    branch, commit = store.commit_rewrite(tip, {"a.py": out, "tool.sh": b"#!/bin/sh\necho\n"}, "s", "", {}, FP)
    assert store.files(commit) == {"a.py": b"a = 100\n", "tool.sh": b"#!/bin/sh\necho\n"}
    assert store.executable_paths(commit) == {"tool.sh"}
    assert store.read_blob(out) == b"a = 100\n"
    with pytest.raises(StoreError, match="not in the store"):
        store.commit_rewrite(tip, {"a.py": "0" * 40}, "s", "", {}, FP)
    with pytest.raises(StoreError, match="unknown commit"):
        store.commit_rewrite("1" * 40, {}, "s", "", {}, FP)
    with pytest.raises(StoreError, match="fingerprint"):
        store.commit_rewrite(tip, {}, "s", "", {}, "two\nlines")
    assert [b.name for b in store.branches()] == [branch]  # failed calls created no branch


def test_report_round_trip(store):
    report = {
        "branch": None,
        "commit": None,
        "source_commit": None,
        "backend": "cpu",
        "files": [{"path": "a.py", "status": "rewritten", "error": None,
                   "sites": [{"transform": "grad_clip", "line": 3, "end_line": 4, "action": "rewritten",
                              "reason": "clip inserted — ünïcode", "exactness": "changes-semantics"}]}],
    }
    tip, (branch, commit) = rewrite_one(store, {"a.py": b"x\n"}, {"a.py": b"y\n"}, report=report)
    got = store.report(branch)
    assert got == {**report, "branch": branch, "commit": commit, "source_commit": tip}
    assert store.report("1") == got
    _, (b2, _) = rewrite_one(store, {"a.py": b"z\n"}, {}, report={"custom": [1, 2, {"k": None}]})
    assert store.report(b2) == {"custom": [1, 2, {"k": None}]}  # absent keys are not invented
    assert store.report(branch) == got  # the second note did not disturb the first
    # plain git reads the same report
    shown = store_git(store, "notes", "--ref=" + REPORTS_REF.split("/")[-1], "show", branch).stdout
    assert json.loads(shown) == got
    store_git(store, "update-ref", "refs/heads/run/0005", commit)  # a branch without its own note
    store_git(store, "update-ref", "refs/heads/run/0006", tip)
    with pytest.raises(StoreError, match="no report stored for run/0006"):
        store.report("6")


def test_resolve_forms_and_unknown(store):
    for k in range(2):
        rewrite_one(store, {"a.py": b"%d\n" % k}, {"a.py": b"r%d\n" % k})
    want = store.resolve("run/0002")
    assert isinstance(want, BranchInfo) and want.name == "run/0002"
    for form in ("0002", "2", "refs/heads/run/0002", " run/0002 ", "run/2", want):
        assert store.resolve(form) == want
    with pytest.raises(StoreError, match=r"^unknown branch run/0042$"):
        store.resolve("run/0042")
    with pytest.raises(StoreError, match="unknown branch"):
        store.resolve("42")
    with pytest.raises(StoreError, match="expected run/NNNN"):
        store.resolve("feature/x")
    # commit-taking methods also accept branch names
    assert store.files("run/0002") == store.files(want.commit)
    assert store.files("source") == store.files(store.source_tip())
    with pytest.raises(StoreError, match="unknown commit"):
        store.files("no-such-thing")


def test_rollback_primitives(store):
    original = {"train.py": b"lr = 1e-3\n", "pkg/m.py": b"m\n"}
    a, (branch, _) = rewrite_one(store, original, {"train.py": b"lr = 1e-3  # rewritten\n"})
    b, _ = store.snapshot({"train.py": b"lr = 5e-4\n"}, "user edited and deleted pkg/m.py")
    assert store.source_of(branch) == a == store.resolve(branch).source_commit
    assert store.files(store.source_of(branch)) == original
    # the project layer's rollback: snapshot current files first, then restore the old ones,
    # which is itself an appended snapshot (the ref never moves backwards)
    c, created = store.snapshot(store.files(store.source_of(branch)), f"rollback to {branch}")
    assert created and source_history(store) == [c, b, a]


# --- the cache -----------------------------------------------------------------------------------


def test_cache_hit_miss_and_fingerprint(store, project):
    src = b"for t in range(T): adv[t] = ...\n"
    blob = Store.blob_id(src)
    assert blob == str(pygit2.hash(src))
    assert store.cache_get(blob, FP) is None
    report = {"status": "rewritten", "error": None, "sites": [{"line": 1, "reason": "vectorized"}]}
    out = store.cache_put(blob, FP, b"adv = scan(...)\n", report)
    assert out == Store.blob_id(b"adv = scan(...)\n")
    hit = store.cache_get(blob, FP)
    assert hit == (out, report)
    hit[1]["sites"].append("mutated by a caller")  # callers get their own copy
    assert store.cache_get(blob, FP) == (out, report)
    assert store.cache_get(blob, FP2) is None  # another pipeline: a miss
    fresh = Store.open(project)  # it lives in the store, not in memory
    assert fresh.cache_get(blob, FP) == (out, report)
    assert fresh.cache_get(blob, FP2) is None
    assert fresh.read_blob(out) == b"adv = scan(...)\n"
    # a second writer's entry becomes visible to the first store on its next miss
    other = Store.open(project)
    blob2 = Store.blob_id(b"second file\n")
    assert store.cache_get(blob2, FP) is None
    other.cache_put(blob2, FP, b"second out\n", {"status": "unchanged"})
    assert store.cache_get(blob2, FP) == (Store.blob_id(b"second out\n"), {"status": "unchanged"})
    assert store.repo.references.get(CACHE_PREFIX + FP) is not None
    with pytest.raises(StoreError, match="bad blob id"):
        store.cache_get("nothex", FP)


def test_cache_put_many_is_one_update_and_survives_gc(store, project):
    sources = [b"source %d\n" % i for i in range(120)]
    entries = [(Store.blob_id(s), FP, s.upper(), {"status": "rewritten", "i": i}) for i, s in enumerate(sources)]
    entries.append((Store.blob_id(b"other\n"), FP2, b"OTHER\n", {"status": "unchanged"}))
    store.cache_put_many(entries)
    log = [e.message for e in store.repo.references[CACHE_PREFIX + FP].log()]
    assert log == ["cache: 120 entries"]  # one ref update for 120 entries
    store.cache_put_many(entries[:10])  # already there: no new update
    assert len(list(store.repo.references[CACHE_PREFIX + FP].log())) == 1
    # the rewritten blobs are reachable, so git's own garbage collection keeps them
    store_git(store, "gc", "--prune=now", "--quiet")
    assert_fsck_clean(store)
    fresh = Store.open(project)
    got = fresh.cache_get_many([e[0] for e in entries] + [Store.blob_id(b"absent")], FP)
    assert len(got) == 120
    for i, s in enumerate(sources):
        out, report = got[Store.blob_id(s)]
        assert fresh.read_blob(out) == s.upper() and report == {"status": "rewritten", "i": i}
    assert fresh.cache_get(Store.blob_id(b"other\n"), FP2)[1] == {"status": "unchanged"}
    assert fresh.cache_get(Store.blob_id(b"other\n"), FP) is None


def test_cache_survives_an_unsafe_fingerprint(store, project):
    fp = "pipeline with spaces/and..dots.lock"
    blob = Store.blob_id(b"x")
    store.cache_put(blob, fp, b"y", {})
    assert Store.open(project).cache_get(blob, fp) == (Store.blob_id(b"y"), {})


# --- git CLI sees a normal repository ------------------------------------------------------------


def test_git_cli_reads_the_store(store):
    files = {"train.py": b"x = 1\n", "pkg/m.py": b"m = 1\n"}
    tip, (branch, commit) = rewrite_one(store, files, {"train.py": b"x = 1  # rewritten\n"}, summary="run one")
    store.cache_put(Store.blob_id(b"x = 1\n"), FP, b"x = 1  # rewritten\n", {"status": "rewritten"})
    log = store_git(store, "log", "--all", "--format=%H %s").stdout
    assert f"{commit} run one" in log and f"{tip} snap" in log
    shown = store_git(store, "show", branch).stdout
    assert "+x = 1  # rewritten" in shown and "Scalebox-Pipeline: " + FP in shown
    assert store_git(store, "show", f"{branch}:train.py").stdout == "x = 1  # rewritten\n"
    assert store_git(store, "log", "--format=%H").stdout.split() == [tip]  # HEAD is the source branch
    assert store_git(store, "rev-parse", f"{branch}^").stdout.strip() == tip
    reflog = store_git(store, "reflog", "show", "--format=%gs", branch).stdout
    assert "run: run one" in reflog  # logAllRefUpdates=always: run branches have reflogs
    assert_fsck_clean(store)


# --- concurrent writers --------------------------------------------------------------------------

ITERATIONS = 6


def _writer(project: str, wid: str, start, results=None, shared: Store = None):
    store = shared or Store.open(project)
    if results is None:
        results = []
    start.wait(60)  # a barrier: every writer begins at the same moment
    began = time.time()
    for k in range(ITERATIONS):
        files = {
            "common/shared.py": b"shared = 1\n",
            f"workers/{wid}.py": f"worker = {wid!r}; step = {k}\n".encode(),
        }
        tip, created = store.snapshot(files, f"{wid} step {k}")
        out = f"worker = {wid!r}; step = {k}  # rewritten\n".encode()
        branch, commit = store.commit_rewrite(
            tip, {f"workers/{wid}.py": out}, f"{wid} {k}", "", {"branch": None, "wid": wid, "k": k}, FP
        )
        store.cache_put(Store.blob_id(files[f"workers/{wid}.py"]), FP, out, {"wid": wid, "k": k})
        results.append((wid, k, tip, created, branch, commit))
    return results, (began, time.time())


def _process_writer(project: str, wid: str, start, queue) -> None:
    try:
        queue.put(("ok", _writer(project, wid, start)))
    except BaseException as exc:  # report, never hang the parent
        queue.put(("error", f"{wid}: {type(exc).__name__}: {exc}"))


def test_concurrent_threads_and_processes_lose_nothing(project):
    Store.init(project)
    n_procs, n_threads = 3, 4
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(n_procs + n_threads + 1)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_process_writer, args=(project, f"p{i}", start, queue)) for i in range(n_procs)]
    for p in procs:
        p.start()
    results: list = []
    windows: list = []
    errors: list = []
    shared = Store.open(project)  # two threads share one Store object, two open their own

    def run_thread(wid, use_shared):
        try:
            mine, window = _writer(project, wid, start, None, shared if use_shared else None)
            results.extend(mine)
            windows.append(window)
        except BaseException as exc:
            errors.append(f"{wid}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=run_thread, args=(f"t{i}", i < 2)) for i in range(n_threads)]
    for t in threads:
        t.start()
    start.wait(60)
    for _ in procs:
        status, payload = queue.get(timeout=120)
        if status == "error":
            errors.append(payload)
        else:
            results.extend(payload[0])
            windows.append(payload[1])
    for t in threads:
        t.join(120)
    for p in procs:
        p.join(60)
    assert not errors, errors
    assert len(results) == (n_procs + n_threads) * ITERATIONS
    # the writers really ran at the same time (all windows share a common instant)
    assert max(w[0] for w in windows) < min(w[1] for w in windows)

    store = Store.open(project)
    branches = [r[4] for r in results]
    assert len(set(branches)) == len(branches)  # every branch exactly once
    assert sorted(int(b.split("/")[1]) for b in branches) == list(range(1, len(branches) + 1))
    infos = {b.name: b for b in store.branches()}
    assert set(infos) == set(branches)
    history = source_history(store)  # linear
    assert len(history) == len(set(history)) == len(results)  # each snapshot unique, none lost
    for wid, k, tip, created, branch, commit in results:
        assert created and tip in history
        assert infos[branch].commit == commit and infos[branch].source_commit == tip
        report = store.report(branch)
        assert (report["wid"], report["k"], report["branch"]) == (wid, k, branch)
        files = store.files(commit)
        assert files[f"workers/{wid}.py"].endswith(b"# rewritten\n")
        hit = store.cache_get(Store.blob_id(f"worker = {wid!r}; step = {k}\n".encode()), FP)
        assert hit is not None and hit[1] == {"wid": wid, "k": k}
    for entry in store.repo.references[SOURCE_REF].log():
        assert entry.committer.name == "scalebox"
    assert_fsck_clean(store)
    assert not os.path.exists(os.path.join(store.path, "refs", "heads", "source.lock"))


def _hold_store_lock(store: Store):
    fd = os.open(os.path.join(store.path, LOCK_NAME), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


@pytest.mark.skipif(fcntl is None, reason="POSIX flock")
@pytest.mark.parametrize("operation", ["snapshot", "commit_rewrite", "cache_put", "first_snapshot"])
def test_every_ref_update_waits_for_the_store_lock(project, operation):
    """libgit2 creates refs check-then-lock, so ref updates must be serialised by our lock:
    while another process holds it, no ref may move."""
    store = Store.init(project)
    if operation != "first_snapshot":
        tip, _ = store.snapshot({"a.py": b"1\n"}, "base")
    calls = {
        "first_snapshot": lambda: store.snapshot({"a.py": b"1\n"}, "first"),
        "snapshot": lambda: store.snapshot({"a.py": b"2\n"}, "second"),
        "commit_rewrite": lambda: store.commit_rewrite(tip, {"a.py": b"r\n"}, "r", "", {}, FP),
        "cache_put": lambda: store.cache_put(Store.blob_id(b"1\n"), FP, b"r\n", {}),
    }
    refs_before = {r: str(store.repo.references[r].target) for r in store.repo.listall_references()}
    fd = _hold_store_lock(store)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (calls[operation](), done.set()))
    try:
        worker.start()
        assert not done.wait(0.4), "a ref was updated without the store lock"
        refs_now = {r: str(store.repo.references[r].target) for r in store.repo.listall_references()}
        assert refs_now == refs_before
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    assert done.wait(10)
    worker.join()
    refs_after = {r: str(store.repo.references[r].target) for r in store.repo.listall_references()}
    assert refs_after != refs_before  # and the update went through once the lock was free


def test_a_stuck_lock_is_a_clear_error(project, monkeypatch):
    store = Store.init(project)
    monkeypatch.setattr(store_refs, "_LOCK_TIMEOUT_S", 0.2)
    fd = _hold_store_lock(store)
    try:
        with pytest.raises(StoreError, match="store is locked by another writer"):
            store.snapshot({"a.py": b"1\n"}, "x")
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    assert store.snapshot({"a.py": b"1\n"}, "x")[1]  # and works once it is free


# ---------------------------------------------------------------------------- damaged or odd stores
def _cli(root, *args):
    from conftest import scalebox

    return scalebox(*args, cwd=root, check=False)


@pytest.mark.parametrize("damage", ["scalebox_is_a_file", "store_is_a_file", "garbage_head"])
def test_odd_stores_give_one_line_errors_or_are_repaired(project, damage):
    """``.scalebox`` or ``store.git`` being a file is named in one line by every command; a HEAD
    git cannot read (it blocks every logged ref update) is put back by the next writer."""
    import shutil
    from pathlib import Path

    root = Path(project)
    (root / "a.py").write_text("a = 1\n")
    assert _cli(root, "init", ".").returncode == 0
    assert _cli(root, "rewrite", ".").returncode == 0
    box = root / ".scalebox"
    if damage == "scalebox_is_a_file":
        shutil.rmtree(box)
        box.write_text("not a folder\n")
    elif damage == "store_is_a_file":
        shutil.rmtree(box / "store.git")
        (box / "store.git").write_text("not a folder\n")
    else:
        (box / "store.git" / "HEAD").write_bytes(b"\x00\xffgarbage")
    for args in (("init", "."), ("rewrite", "."), ("log",), ("diff",), ("rollback", "run/0001"), ("undo",)):
        proc = _cli(root, *args)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        if damage == "garbage_head":
            assert args == ("undo",) or proc.returncode == 0, (args, proc.stderr)
        else:
            assert proc.returncode == 1 and proc.stderr.count("\n") == 1, (args, proc.stderr)
            assert "is a file, not the store's folder" in proc.stderr, (args, proc.stderr)
    if damage == "garbage_head":
        assert (box / "store.git" / "HEAD").read_bytes() == b"ref: refs/heads/source\n"


def _ro_mount_available():
    import shutil
    import subprocess

    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount --bind /tmp /mnt && mount -o remount,bind,ro /mnt && echo ok"], capture_output=True, text=True)
    return probe.stdout.strip() == "ok"


@pytest.mark.skipif(not _ro_mount_available(), reason="needs unshare -rm for a read-only bind mount")
def test_a_read_only_store_reads_and_refuses_writes_in_one_line(project):
    import subprocess

    import sys
    from pathlib import Path

    from conftest import ROOT

    root = Path(project)
    (root / "helpers.py").write_text("helper = 1\n")
    assert _cli(root, "init", ".").returncode == 0
    assert _cli(root, "rewrite", ".").returncode == 0
    (root / "helpers.py").write_text("changed = True\n")
    store = root / ".scalebox"
    lines = []
    for args in (["log"], ["diff", "--stat"], ["rewrite", "."], ["rollback", "run/0001"]):
        cmd = f'mount --bind "{store}" "{store}" && mount -o remount,bind,ro "{store}" && exec "{sys.executable}" -c "from scalebox_cst.cli import main; main()" ' + " ".join(args)
        proc = subprocess.run(["unshare", "-rm", "sh", "-c", cmd], cwd=root, capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}, timeout=120)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        lines.append((args[0], proc.returncode, proc.stderr.strip()))
    assert [rc for _, rc, _ in lines[:2]] == [0, 0]  # reading works
    for name, rc, err in lines[2:]:
        assert rc == 1 and err.count("\n") == 0 and "Read-only file system" in err, (name, err)
    assert (root / "helpers.py").read_text() == "changed = True\n"  # the refused rollback changed nothing


def test_a_long_lived_store_keeps_no_parsed_object_per_save(store):
    """libgit2 keeps each commit and tree it parses in a process-wide cache of up to 256 MB: a
    watcher's or monitor's store grew with every save for as long as it ran (~6 kB a save,
    still there after malloc_trim). The store keeps no such cache (its own caches are bounded)."""
    base = {"a.py": b"x = 0\n", "pkg/b.py": b"y = 1\n"}
    rewrite_one(store, base, {"a.py": b"x = 0  # r\n"})
    before = pygit2.settings.cached_memory[0]
    for i in range(30):
        files = {**base, "a.py": b"x = %d\n" % i}
        _, (branch, commit) = rewrite_one(store, files, {"a.py": b"x = %d  # r\n" % i})
        assert store.files(commit)["a.py"] == b"x = %d  # r\n" % i
        store.branches()
        store.report(branch)
    assert pygit2.settings.cached_memory[0] <= before


def test_listing_branches_keeps_nothing_per_call(store):
    """pygit2 1.21's ``lookup_reference`` keeps the name string it is given for ever: listing
    the branches kept one string per branch per call (a monitor polled by its page grew without
    end). Ref names are looked up interned (``store.common._reference``)."""
    for i in range(20):
        rewrite_one(store, {"a.py": b"x = %d\n" % i}, {"a.py": b"x = %d  # r\n" % i})
    for _ in range(3):
        assert len(store.branches()) == 20
    gc.collect()
    before = sys.getallocatedblocks()
    for _ in range(30):
        store.branches()
        store.newest_branch()
        store.resolve("run/0007")
    gc.collect()
    assert sys.getallocatedblocks() - before < 30  # was 20 names x 30 calls and more
