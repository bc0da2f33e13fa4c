"""The user's signing key and the caches it guards: a ``.scalebox/`` that came with a project
(a repository that committed it, an archive, a shared disk) never decides what code runs.

A store's rewrite cache maps a source blob to the code ``scalebox run`` runs, and the import
hook's cache maps a module's source to a code object: entries are signed with a key kept in the
user's cache folder, so entries another user (or machine) wrote read as misses and are made
again from the source."""
from __future__ import annotations

import marshal
import os
import stat
import subprocess
import sys
import tempfile
import textwrap

import pytest

from scalebox_cst import userkey
from scalebox_cst.importhook import cache as hook_cache
from scalebox_cst.project import Project
from scalebox_cst.store import Store
from scalebox_cst.store.cache import entry_path

import harness
from conftest import HELPERS_PY, ROOT, TRAIN_PY, scalebox
from importhook_project import proj  # noqa: F401 (the fixture)


@pytest.fixture
def as_user(monkeypatch):
    """``as_user(folder)``: this process signs as the user whose cache folder is ``folder``
    (the keys read so far are forgotten on each switch and at the end)."""

    def switch(folder) -> None:
        monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
        userkey.forget()

    yield switch
    userkey.forget()


def _env(cache_home) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALEBOX_HOOK")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=ROOT, XDG_CACHE_HOME=str(cache_home))
    return env


# --- the key -----------------------------------------------------------------------------------


def test_the_key_is_made_once_in_the_users_cache_folder_and_kept(tmp_path, as_user):
    as_user(tmp_path / "cache")
    first = userkey.key()
    path = tmp_path / "cache" / "scalebox_cst" / userkey.FILE_NAME
    assert first is not None and len(first) == 32 and path.read_bytes() == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    userkey.forget()
    assert userkey.key() == first  # read again, not made again
    as_user(tmp_path / "other")
    assert userkey.key() != first


def test_a_damaged_key_is_replaced(tmp_path, as_user, monkeypatch):
    monkeypatch.setattr(userkey, "_places", lambda: [(str(tmp_path / "cache" / "scalebox_cst"), False)])
    folder = tmp_path / "cache" / "scalebox_cst"
    folder.mkdir(parents=True)
    (folder / userkey.FILE_NAME).write_bytes(b"short")
    as_user(tmp_path / "cache")
    assert userkey.key(create=False) is None
    made = userkey.key()
    assert made is not None and (folder / userkey.FILE_NAME).read_bytes() == made


def test_without_a_usable_cache_folder_a_private_one_in_the_temporary_directory_is_used(tmp_path, as_user, monkeypatch):
    (tmp_path / "not-a-folder").write_text("")  # no home cache can be made below a file (even as root)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    as_user(tmp_path / "not-a-folder")
    got = userkey.key()
    private = tmp_path / "tmp" / f"scalebox-{os.getuid()}"
    assert got is not None and (private / userkey.FILE_NAME).read_bytes() == got
    assert stat.S_IMODE(private.stat().st_mode) & 0o077 == 0


def test_a_shared_temporary_folder_open_to_others_or_a_link_is_never_used(tmp_path, as_user, monkeypatch):
    """Another user could have made ``/tmp/scalebox-<uid>`` first and planted a key there."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    private = tmp_path / "tmp" / f"scalebox-{os.getuid()}"
    monkeypatch.setattr(userkey, "_places", lambda: [(str(private), True)])
    private.mkdir(mode=0o777)
    private.chmod(0o777)
    (private / userkey.FILE_NAME).write_bytes(b"k" * 32)
    assert userkey.key() is None
    private.chmod(0o700)
    (private / userkey.FILE_NAME).unlink()
    private.rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    private.symlink_to(tmp_path / "elsewhere")
    assert userkey.key() is None
    assert not (tmp_path / "elsewhere" / userkey.FILE_NAME).exists()


# --- the rewrite cache -------------------------------------------------------------------------


def test_a_rewrite_cache_entry_another_user_signed_is_a_miss_and_is_replaced(tmp_path, project, as_user):
    blob = Store.blob_id(b"x = 1\n")
    as_user(tmp_path / "them")
    Store.init(str(project))
    Store.open(str(project)).cache_put(blob, "fp", b"planted()\n", {"status": "rewritten"})
    assert Store.open(str(project)).cache_get(blob, "fp") == (Store.blob_id(b"planted()\n"), {"status": "rewritten"})
    as_user(tmp_path / "me")
    mine = Store.open(str(project))
    assert mine.cache_get(blob, "fp") is None
    mine.cache_put(blob, "fp", b"x = 1\n", {"status": "unchanged"})
    assert Store.open(str(project)).cache_get(blob, "fp") == (blob, {"status": "unchanged"})


def test_two_users_of_one_store_each_keep_their_cache_entry_for_a_file(tmp_path, project, as_user):
    """A project folder shared by two users: each user's entry for the same file had one name, so
    each put replaced the other's, and every rewrite of either user missed."""
    blob = Store.blob_id(b"x = 1\n")
    Store.init(str(project))
    for who, out in (("a", b"A = 1\n"), ("b", b"B = 1\n")):
        as_user(tmp_path / who)
        Store.open(str(project)).cache_put(blob, "fp", out, {"status": "rewritten", "by": who})
    for who, out in (("a", b"A = 1\n"), ("b", b"B = 1\n"), ("a", b"A = 1\n")):
        as_user(tmp_path / who)
        assert Store.open(str(project)).cache_get(blob, "fp") == (Store.blob_id(out), {"status": "rewritten", "by": who})


def test_a_rewrite_cache_entry_is_signed_for_its_own_ids(tmp_path, project, as_user):
    """An entry's report moved to another source blob (or beside another output) fails."""
    import pygit2

    as_user(tmp_path / "me")
    store = Store.init(str(project))
    a, b = Store.blob_id(b"a\n"), Store.blob_id(b"b\n")
    store.cache_put(a, "fp", b"A()\n", {"status": "rewritten"})
    store.cache_put(b, "fp", b"b\n", {"status": "unchanged"})
    repo = pygit2.Repository(Store.store_path(str(project)))  # plain git, as anyone who ships a store
    ref = repo.references["refs/scalebox/cache/fp"]
    tree = repo[ref.target].tree
    # b's entry now names a's rewritten output (its report blob, signed for b, kept)
    secret = userkey.key_for(b"scalebox rewrite cache")
    outer = repo.TreeBuilder(tree)
    folder = repo.TreeBuilder(tree[b[:2]])
    folder.insert(entry_path(secret, b).split("/")[1], tree[entry_path(secret, a)].id, pygit2.GIT_FILEMODE_BLOB)
    outer.insert(b[:2], folder.write(), pygit2.GIT_FILEMODE_TREE)
    commit = repo.create_commit(None, repo.default_signature, repo.default_signature, "tampered", outer.write(), [])
    ref.set_target(commit)
    fresh = Store.open(str(project))
    assert fresh.cache_get(b, "fp") is None
    assert fresh.cache_get(a, "fp") == (Store.blob_id(b"A()\n"), {"status": "rewritten"})


def test_without_a_key_nothing_is_cached(tmp_path, project, monkeypatch):
    monkeypatch.setattr(userkey, "key", lambda create=True: None)
    store = Store.init(str(project))
    blob = Store.blob_id(b"x\n")
    assert store.cache_put(blob, "fp", b"y\n", {}) == Store.blob_id(b"y\n")
    assert store.read_blob(Store.blob_id(b"y\n")) == b"y\n"  # the output is stored all the same
    assert Store.open(str(project)).cache_get(blob, "fp") is None
    assert store.repo.references.get("refs/scalebox/cache/fp") is None


def test_scalebox_run_of_a_project_that_came_with_a_planted_store_runs_the_users_code(tmp_path, project, as_user):
    """The shipper's own cache maps train.py to other code; whoever runs the project runs train.py."""
    (project / "train.py").write_text(TRAIN_PY)
    (project / "helpers.py").write_text(HELPERS_PY)
    as_user(tmp_path / "shipper")
    shipped = Project(str(project))
    data = (project / "train.py").read_bytes()
    real = shipped.pipeline.rewrite("train.py", data)
    report = real.report.to_json()
    report.pop("path")
    planted = b'print("PLANTED: not the code you read")\n'
    shipped.ensure_store().cache_put(Store.cache_key("train.py", data), shipped.pipeline.fingerprint, planted, report)
    # the shipper's own runs would take it (the entry is well formed and signed by them)
    assert Project(str(project)).rewrite_files({"train.py": data})["train.py"].output == planted
    proc = scalebox("run", "train.py", "--", "--steps", "2", cwd=project, env={"XDG_CACHE_HOME": str(tmp_path / "user")}, timeout=300)
    assert "PLANTED" not in proc.stdout and "final_return=1.5" in proc.stdout


# --- the import hook's cache -------------------------------------------------------------------

CHECK = textwrap.dedent(
    """\
    import scalebox_cst
    scalebox_cst.install_import_hook(["{pkg}"])
    import {pkg}.ppo as ppo
    print("planted", getattr(ppo, "PLANTED", False))
    """
)


def test_an_import_cache_that_came_with_the_project_never_runs_its_code(tmp_path, proj, as_user):  # noqa: F811
    root, pkg = proj
    script = root / "check.py"
    script.write_text(CHECK.format(pkg=pkg))
    shipper, user = tmp_path / "shipper", tmp_path / "user"

    def run(home):
        proc = subprocess.run([sys.executable, str(script)], cwd=root, env=_env(home), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()[-1]

    assert run(shipper) == "False"
    (entry,) = (root / ".scalebox" / "pycache").rglob("ppo.*.pyc")
    good = entry.read_bytes()
    meta_end = 52 + int.from_bytes(good[48:52], "little")
    text_end = meta_end + 4 + int.from_bytes(good[meta_end : meta_end + 4], "little")
    start, middle = good[:16], good[48:text_end]
    planted = marshal.dumps(harness.compiled("PLANTED = True\n", str(root / pkg / "ppo.py")))
    as_user(shipper)
    key = hook_cache._cache_key(str(root / ".scalebox" / "store.git"), create=False)
    entry.write_bytes(start + hook_cache._mac(key, start, middle + planted) + middle + planted)
    assert run(shipper) == "True"  # well formed: the shipper's own key verifies it
    entry.write_bytes(start + hook_cache._mac(key, start, middle + planted) + middle + planted)
    assert run(user) == "False"
    assert b"PLANTED" not in entry.read_bytes()  # replaced by the user's own entry


# --- run branches --------------------------------------------------------------------------------


def test_a_shipped_branch_of_the_same_snapshot_is_reused_only_if_it_holds_the_users_rewrite(tmp_path, project, as_user):
    """``scalebox run`` reuses the newest branch of an unchanged snapshot: the shipper's branch
    of that snapshot with other code in it is not that branch."""
    as_user(tmp_path / "shipper")
    shipped, _ = Project.init(str(project))
    made = shipped.commit_change()
    store = shipped.store
    source = made.report.source_commit
    planted = b'print("PLANTED: not the code you read")\n'
    store.commit_rewrite(source, {"train.py": planted}, "rewrite", "", {}, shipped.pipeline.fingerprint)
    as_user(tmp_path / "user")
    again = Project(str(project)).commit_change()
    assert again.report.branch not in ("run/0002",) and store.read_file(again.report.commit, "train.py") != planted
    user_env = {"XDG_CACHE_HOME": str(tmp_path / "user")}
    proc = scalebox("run", "train.py", "--", "--steps", "2", cwd=project, env=user_env, timeout=300)
    assert "PLANTED" not in proc.stdout and "final_return=1.5" in proc.stdout
    assert "run/0002 does not hold this engine's rewrite" in proc.stderr
    refused = scalebox("run", "--no-commit", "train.py", cwd=project, env=user_env, check=False, timeout=300)
    assert refused.returncode != 0 and "PLANTED" not in refused.stdout
    assert "run/0002 does not hold" in refused.stderr and "Traceback" not in refused.stderr
    # and the user's own unchanged snapshot still reuses its branch (no new branch per run)
    assert Project(str(project)).commit_change().report.branch == again.report.branch


def test_a_branch_another_user_made_is_checked_once_then_taken_as_it_is(tmp_path, project, as_user):
    """A branch that holds this engine's rewrite of its snapshot, made by someone else (or by an
    engine before branches were vouched for): the first run checks it and notes it, no new
    branch; later runs take it with no rewrite (and no import of libcst)."""
    as_user(tmp_path / "them")
    theirs, _ = Project.init(str(project))
    made = theirs.commit_change()
    me = tmp_path / "me"
    as_user(me)
    assert not Store.open(str(project)).vouched(made.report.commit)
    proc = scalebox("run", "train.py", "--", "--steps", "1", cwd=project, env={"XDG_CACHE_HOME": str(me)}, timeout=300)
    assert "does not hold" not in proc.stderr and f"{made.report.branch}#1" in proc.stderr, proc.stderr
    assert Store.open(str(project)).vouched(made.report.commit)
    assert [b.name for b in Store.open(str(project)).branches()] == [made.report.branch]
    code = ("import sys, runpy; sys.argv = ['scalebox', 'run', 'train.py', '--', '--steps', '1']\n"
            "from scalebox_cst.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('LIBCST', 'libcst' in sys.modules, file=sys.stderr)")
    again = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "XDG_CACHE_HOME": str(me), "OMP_NUM_THREADS": "1"})
    assert "LIBCST False" in again.stderr, again.stderr


def test_a_relative_cache_home_is_ignored_so_the_key_never_lands_in_a_project(tmp_path, monkeypatch):
    """XDG_CACHE_HOME=cache (relative) followed the current folder: run from a project, the
    user's key was made inside it, and a tree shipped with it signed entries for whoever ran it."""
    from scalebox_cst.runtime.backend import cache_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", "cache")
    monkeypatch.delenv("SCALEBOX_CACHE_DIR", raising=False)
    assert cache_dir() == str(tmp_path / "home" / ".cache" / "scalebox_cst")
