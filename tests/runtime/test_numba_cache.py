"""runtime/numba_cache.py: numba's disk cache goes to a folder only this user can write, and the
folders other installs of the engine left there are bounded.

numba's index files are pickles loaded back: a cache folder another user can write is code that
user runs in the training process. The temporary-directory fallback was shared by all users in
target_update.py (``/tmp/scalebox_cst-numba``), and neither loader checked who owned the folder.
"""
import os
import subprocess
import sys
import time

import pytest

from scalebox_cst.runtime import numba_cache


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process that has not chosen yet, with its cache home and temporary directory in tmp_path."""
    monkeypatch.setattr(numba_cache, "_chosen", [])
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.delenv("SCALEBOX_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    monkeypatch.setattr(numba_cache.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    os.makedirs(tmp_path / "tmp")
    return tmp_path


def test_the_users_cache_folder_is_made_private_and_set(fresh):
    d = numba_cache.directory()
    assert d == str(fresh / "home-cache" / "scalebox_cst" / "numba")
    assert os.environ["NUMBA_CACHE_DIR"] == d
    assert os.stat(d).st_mode & 0o077 == 0
    assert numba_cache.directory() == d  # once a process


def test_a_folder_others_can_write_is_never_used(fresh):
    """A cache folder writable by others is someone else's way into the training process. The
    user's own folder in their cache is closed (an older release made it under the umask); a link
    there is refused, and the per-user fallback taken."""
    mine = fresh / "home-cache" / "scalebox_cst" / "numba"
    os.makedirs(mine)
    os.chmod(mine, 0o777)
    assert numba_cache.directory() == str(mine)
    assert os.stat(mine).st_mode & 0o077 == 0


def test_a_link_in_the_users_cache_is_refused(fresh):
    os.makedirs(fresh / "home-cache" / "scalebox_cst")
    os.makedirs(fresh / "elsewhere")
    os.symlink(fresh / "elsewhere", fresh / "home-cache" / "scalebox_cst" / "numba")
    d = numba_cache.directory()
    assert d == str(fresh / "tmp" / f"scalebox_cst-numba-{os.getuid()}")
    assert os.stat(d).st_mode & 0o077 == 0


def test_a_fallback_open_to_others_is_refused(fresh):
    (fresh / "home-cache").write_text("not a folder")
    shared = fresh / "tmp" / f"scalebox_cst-numba-{os.getuid()}"
    os.makedirs(shared)
    os.chmod(shared, 0o777)
    assert numba_cache.directory() is None


def test_a_planted_fallback_is_refused_too(fresh):
    """Where ~/.cache cannot hold the folder (here: a file in its place), the per-user folder in
    the temporary directory is next; one planted there beforehand (a link to a folder the planter
    writes) is not used, and numba goes without a disk cache."""
    (fresh / "home-cache").write_text("not a folder")
    target = fresh / "elsewhere"
    os.makedirs(target)
    os.symlink(target, fresh / "tmp" / f"scalebox_cst-numba-{os.getuid()}")
    assert numba_cache.directory() is None
    assert "NUMBA_CACHE_DIR" not in os.environ
    assert os.listdir(target) == []


def test_a_folder_the_user_set_is_theirs(fresh, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(fresh / "mine"))
    assert numba_cache.directory() == str(fresh / "mine")
    assert not os.path.exists(fresh / "mine")  # neither made nor pruned


def test_other_installs_folders_are_bounded(tmp_path):
    """Each install (a venv, a clone, a CI checkout) gets a numba folder of its own, ~2 MB: the
    KEEP newest stay, older ones unused for STALE_S go; this install's own is touched, and names
    numba does not make (or links) are never touched."""
    now = time.time()
    own = numba_cache.own_folder()
    os.makedirs(tmp_path / own)
    os.utime(tmp_path / own, (now - 100 * 86400,) * 2)
    names = []
    for i in range(12):
        name = f"runtime_{i:040x}"
        os.makedirs(tmp_path / name)
        age = (30 + i) * 86400 if i >= 2 else 3600  # two young ones, ten stale
        os.utime(tmp_path / name, (now - age,) * 2)
        names.append(name)
    os.makedirs(tmp_path / "notes")
    os.utime(tmp_path / "notes", (now - 400 * 86400,) * 2)
    os.symlink(tmp_path / "notes", tmp_path / f"link_{'a' * 40}")
    removed = numba_cache.prune(str(tmp_path), own, now)
    left = set(os.listdir(tmp_path))
    assert own in left and os.stat(tmp_path / own).st_mtime >= now - 1
    assert sorted(removed) == sorted(names[8:12])  # the 8 newest others are kept, old or not
    assert left == {own, "notes", f"link_{'a' * 40}", *names[:8]}
    young = numba_cache.prune(str(tmp_path), own, now + 60)
    assert young == []


def test_the_own_folder_is_the_one_numba_writes(tmp_path):
    """The name numba gives this install's folder, checked against numba itself where installed."""
    pytest.importorskip("numba")
    code = ("import os, sys; os.environ['NUMBA_CACHE_DIR'] = sys.argv[1]; "
            "from scalebox_cst.runtime import _target_update_cpu")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=300)
    assert numba_cache.own_folder() in os.listdir(tmp_path)


@pytest.mark.parametrize("loader", ["target_update", "recurrence"])
def test_both_loaders_take_the_checked_folder(fresh, monkeypatch, loader):
    """Each kernel loader chose its folder its own way before (target_update's fallback was one
    /tmp folder for every user, and neither looked at who owned the folder)."""
    pytest.importorskip("numba")
    from scalebox_cst.runtime import target_update
    from scalebox_cst.runtime.recurrence import backends

    os.makedirs(fresh / "home-cache" / "scalebox_cst")
    os.makedirs(fresh / "elsewhere")
    os.symlink(fresh / "elsewhere", fresh / "home-cache" / "scalebox_cst" / "numba")
    if loader == "target_update":
        monkeypatch.setattr(target_update, "_numba", None)
        target_update._load_numba()
    else:
        monkeypatch.setattr(backends, "_numba_mod", None)
        backends._load_numba()
    assert os.environ.get("NUMBA_CACHE_DIR") == str(fresh / "tmp" / f"scalebox_cst-numba-{os.getuid()}")


def test_a_relative_cache_setting_is_made_absolute(fresh, monkeypatch):
    """numba joins $NUMBA_CACHE_DIR to the cwd at each compile (and so does a worker started in
    another folder): a relative SCALEBOX_CACHE_DIR, checked in one folder, was written in
    whichever folder the script had moved to (hydra's run folder, a shared /tmp), never checked."""
    monkeypatch.chdir(fresh)
    monkeypatch.setenv("SCALEBOX_CACHE_DIR", "rel-cache")
    d = numba_cache.directory()
    assert d == str(fresh / "rel-cache" / "numba") and os.environ["NUMBA_CACHE_DIR"] == d
    assert os.stat(d).st_mode & 0o077 == 0


def test_a_folder_under_one_others_can_write_is_refused(fresh):
    """A release made ~/.cache/scalebox_cst under umask 002: its numba/ was closed, but a group
    member could still rename it away and put a folder of their own (with their pickles) in its
    place while the training ran, after the check. The per-user fallback is taken."""
    parent = fresh / "home-cache" / "scalebox_cst"
    os.makedirs(parent)
    os.chmod(parent, 0o775)
    d = numba_cache.directory()
    assert d == str(fresh / "tmp" / f"scalebox_cst-numba-{os.getuid()}")
