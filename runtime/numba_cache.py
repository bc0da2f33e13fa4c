"""Where numba keeps the runtime's compiled kernels: one folder, owned by the user, bounded.

The recurrence and target-update kernels (``_recurrence_cpu``, ``_target_update_cpu``) are
``@njit(cache=True)``: numba writes them under ``$NUMBA_CACHE_DIR``, in a folder it names after
the directory holding the source and a hash of its full path (``runtime_<sha1>``). Two things
follow, and this module answers both for the two loaders (recurrence/backends.py and
target_update.py, which chose the folder each in their own way before):

* every install of the engine (a new virtual environment, a clone, a CI checkout) gets a folder
  of its own, ~2 MB, never removed: 26 of them on a development machine. The folder of this
  install is touched at each first load; those of other installs not used for
  ``STALE_S`` seconds (7 days) are removed, newest ``KEEP`` kept whatever their age;
* numba's index files are pickles, read back at load: a folder someone else can write is code
  they can run in the user's training. The folder is ``numba`` in the engine's per-user cache
  (``runtime.backend.cache_dir``: ``$SCALEBOX_CACHE_DIR``, else ``~/.cache/scalebox_cst``), or,
  where that cannot be made, one per user in the temporary directory, made ``0700`` and used only
  where it is the user's own and no one else can write it (target_update's was one folder for
  all users). A link in either place is refused.

``$NUMBA_CACHE_DIR``, where the user set it, is theirs: used as it is, never pruned.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
import tempfile
import time
from typing import List, Optional, Tuple

from .backend import cache_dir

#: folders of other installs kept whatever their age (the newest first)
KEEP = 8
#: a folder of another install not used for this long is removed (7 days)
STALE_S = 7 * 86400
_chosen: List[Optional[str]] = []  # the folder this process chose (once), or [None]


def _private(path: str, shared: bool) -> bool:
    """Whether ``path`` is a real directory of this user's that no one else may write. One in the
    user's own cache folder that is open to the group (made by a release before this one, under
    umask 002) is closed instead; one in a shared place (the temporary directory) is refused."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        return False
    if not _ancestors_closed(path):
        return False
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        if shared:
            return False
        try:
            os.chmod(path, 0o700)
        except OSError:
            return False
    return os.access(path, os.W_OK)


def _ancestors_closed(path: str) -> bool:
    """Whether no one but this user and root can rename a folder above ``path`` (and so put a
    folder of their own in its place after it was checked: numba reads its index pickles there at
    each compile, long after the check). Each folder above it, as named and as it really is, is
    owned by the user or root and open to no one else's writes, or sticky (``/tmp``). An older
    release made ``~/.cache/scalebox_cst`` under umask 002: a group member could swap its
    ``numba`` for their own while a training ran."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    for start in {os.path.abspath(path), os.path.realpath(path)}:
        folder = os.path.dirname(start)
        while True:
            try:
                st = os.stat(folder)
            except OSError:
                return False
            if uid is not None and st.st_uid not in (0, uid):
                return False
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
                return False
            parent = os.path.dirname(folder)
            if parent == folder:
                break
            folder = parent
    return True


def _candidates() -> List[Tuple[str, bool]]:
    """``(folder, shared)`` in order: in the engine's per-user cache, then in the temporary directory."""
    try:
        user = str(os.getuid())
    except AttributeError:  # pragma: no cover - windows
        user = os.environ.get("USERNAME", "user")
    # absolute: numba joins $NUMBA_CACHE_DIR to the cwd at each compile, and a relative
    # $SCALEBOX_CACHE_DIR followed a script's chdir (hydra's run folder, /tmp) to a folder never checked
    return [(os.path.abspath(os.path.join(cache_dir(), "numba")), False),
            (os.path.join(tempfile.gettempdir(), "scalebox_cst-numba-" + user), True)]


def directory() -> Optional[str]:
    """The folder for ``$NUMBA_CACHE_DIR``, set in the environment (and numba's config, where
    numba was imported first), or None when numba must go without a disk cache. Once a process."""
    if _chosen:
        return _chosen[0]
    given = os.environ.get("NUMBA_CACHE_DIR")
    if given:
        _chosen.append(given)
        return given
    found = None
    for d, shared in _candidates():
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
        except OSError:
            continue
        if _private(d, shared):
            found = d
            break
    _chosen.append(found)
    if found is None:
        return None
    os.environ["NUMBA_CACHE_DIR"] = found
    cfg = sys.modules.get("numba.core.config")
    if cfg is not None:  # numba was imported before us
        cfg.reload_config()
    try:
        prune(found, own_folder())
    except OSError:
        pass  # a cache that cannot be tidied still works
    return found


def own_folder() -> str:
    """The name numba gives this install's folder (``numba.core.caching._UserProvidedCacheLocator``:
    the source directory's name, an underscore, the sha1 of its full path)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return f"{os.path.basename(here)}_{hashlib.sha1(here.encode()).hexdigest()}"


def prune(cache: str, own: str, now: Optional[float] = None) -> List[str]:
    """Touch ``own`` under ``cache``; remove the folders of other installs unused for STALE_S,
    except the KEEP newest. Returns the names removed. Only folders named as numba names them
    (``<name>_<40 hex digits>``) and that are real directories are looked at."""
    now = time.time() if now is None else now
    mine = os.path.join(cache, own)
    if os.path.isdir(mine) and not os.path.islink(mine):
        os.utime(mine, (now, now))
    others = []
    for entry in os.scandir(cache):
        name = entry.name
        stem, _, digest = name.rpartition("_")
        if name == own or not stem or len(digest) != 40 or any(c not in "0123456789abcdef" for c in digest):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            others.append((st.st_mtime, name))
    others.sort(reverse=True)
    removed = []
    for mtime, name in others[KEEP:]:
        if now - mtime >= STALE_S:
            shutil.rmtree(os.path.join(cache, name), ignore_errors=True)
            removed.append(name)
    return removed
