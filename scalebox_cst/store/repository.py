"""The ``Store`` itself: opening and creating the bare repository, and the layers it is made of."""
from __future__ import annotations

import os
import threading
import time
from typing import (
    Dict,
    Optional,
    Set,
    Tuple,
)

import pygit2

from scalebox_cst import statedir, tmpnames
from scalebox_cst.store import checked
from scalebox_cst.store.cache import _Cache, cache_key
from scalebox_cst.store.common import (
    _OPEN_FLAGS,
    LOCK_NAME,
    SIG_EMAIL,
    SIG_NAME,
    Raw,
    StoreError,
    _blob_raw,
    _Lru,
    _one_line,
)
from scalebox_cst.store.refs import _FileLock, _repair_head
from scalebox_cst.store.sessions import _Sessions
from scalebox_cst.store.snapshots import _Snapshots

# libgit2 keeps each commit and tree it parses in a process-wide object cache of up to 256 MB:
# a watcher, monitor or import hook that lives for days kept ~6 kB more per save for as long as
# it ran (1,500 saves: 35.7 -> 45.2 MB, still 44.7 MB after malloc_trim; without the cache 37.3
# MB, the bounded set of ids known stored). What the store reads again it keeps in its own
# bounded caches (_Lru of tree maps and files); reads measured no slower without it.
pygit2.settings.enable_caching(False)


class Store(_Snapshots, _Sessions, _Cache):
    """Source snapshots, run branches, their reports and the rewrite cache, in one bare repo."""

    def __init__(self, path: str) -> None:
        """Open the bare repository at *path* (``.../.scalebox/store.git``); prefer ``open``."""
        self.path = os.path.abspath(path)
        _check_folders(self.path)
        try:
            self.repo = pygit2.Repository(self.path, _OPEN_FLAGS)
        except (pygit2.GitError, OSError, KeyError) as exc:
            if os.path.isfile(os.path.join(self.path, "HEAD")):
                raise StoreError(f"the store at {self.path} cannot be opened: {_one_line(exc)}") from None
            raise StoreError(f"no store at {self.path}: run `scalebox init`") from None
        # Never let libgit2 hand us another repository (a parent's or the user's .git).
        if not self.repo.is_bare or os.path.realpath(self.repo.path) != os.path.realpath(self.path):
            raise StoreError(f"no store at {self.path}: run `scalebox init`")
        self.repo.set_ident(SIG_NAME, SIG_EMAIL)
        checked.install(self.repo, self.path)  # a truncated object is an error, not a hang
        self._lock = _FileLock(os.path.join(self.path, LOCK_NAME))
        self._lock_depth = 0
        self._mutex = threading.RLock()
        self._tree_maps: _Lru = _Lru(16)  # tree raw id -> {path: (mode, raw blob id)}
        self._files: _Lru = _Lru(4)  # tree raw id -> {path: bytes}
        self._branch_info: Dict[Raw, Tuple[Optional[str], str, int, Optional[str]]] = {}
        self._cache_mem: Dict[str, Dict[str, Tuple[str, str]]] = {}  # fp -> src -> (out, json)
        self._present: Set[Raw] = set()  # object ids known to be stored
        self._present_since = time.time()  # when they were last forgotten (objects._has)
        self._odb_handle: Optional[pygit2.Odb] = None
        self.cache_damaged: Dict[str, str] = {}  # pipeline fingerprint -> damage met (store.cache)
        self._cache_promote: Dict[str, Dict[Tuple[bytes, bytes], Tuple[Raw, Raw]]] = {}  # store.cache
        self._caches_bounded: Set[str] = set()  # store.cache
        self._writer_odb: Optional[pygit2.Odb] = None  # libgit2's plain one, for writes (store.checked)
        self._locked_since_ns = 0  # when this object took the write lock (stale-lock test)
        self._debris_checked = False

    # -- opening -------------------------------------------------------------------------------

    @staticmethod
    def store_path(project_dir: str) -> str:
        return os.path.join(os.path.abspath(project_dir), ".scalebox", "store.git")

    @classmethod
    def init(cls, project_dir: str) -> "Store":
        """Create ``.scalebox/`` (ignored by git) and the bare store; safe to repeat."""
        project_dir = os.path.abspath(project_dir)
        if not os.path.isdir(project_dir):
            raise StoreError(f"no such project folder: {project_dir}")
        box = os.path.join(project_dir, ".scalebox")
        path = cls.store_path(project_dir)
        _check_folders(path)
        try:
            os.makedirs(box, exist_ok=True)
            _ensure_gitignore(os.path.join(box, ".gitignore"))
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the store: {_one_line(exc)}") from None
        lock = _FileLock(os.path.join(path, LOCK_NAME))
        lock.acquire()
        try:
            if not os.path.isfile(os.path.join(path, "HEAD")):
                pygit2.init_repository(path, bare=True, initial_head="source")
            _repair_head(path)
            repo = pygit2.Repository(path, _OPEN_FLAGS)
            config = repo.config
            wanted = {
                "core.logAllRefUpdates": "always",
                "user.name": SIG_NAME,
                "user.email": SIG_EMAIL,
                "gc.auto": "0",
            }
            for key, value in wanted.items():
                current = config[key] if key in config else None
                if current != value:
                    config[key] = value
            repo.free()
        except (pygit2.GitError, OSError) as exc:
            raise StoreError(f"cannot set up the store at {path}: {_one_line(exc)}") from None
        finally:
            lock.release()
        return cls(path)

    @classmethod
    def open(cls, project_dir: str) -> "Store":
        """Open the store of *project_dir*; ``StoreError`` if it has none."""
        path = cls.store_path(project_dir)
        _check_folders(path)
        if not os.path.isfile(os.path.join(path, "HEAD")):
            raise StoreError(f"no store at {path}: run `scalebox init`")
        return cls(path)

    def close(self) -> None:
        """Release libgit2's file handles (the object stays usable: it reopens lazily)."""
        with self._mutex:
            self._odb_handle = self._writer_odb = None
            self.repo.free()  # drops its object database too: give it the checked one again
            checked.install(self.repo, self.path)

    # -- hashing -------------------------------------------------------------------------------

    @staticmethod
    def blob_id(data: bytes) -> str:
        """The git blob id of *data* (what ``pygit2.hash`` returns), without writing anything."""
        return _blob_raw(data).hex()

    @staticmethod
    def cache_key(path: str, data: bytes) -> str:
        """What the rewrite cache keys a project file by (:func:`store.cache.cache_key`)."""
        return cache_key(path, data)


def _ensure_gitignore(path: str) -> None:
    try:
        with open(path, "r", encoding="utf-8") as fh:
            if "*" in (line.strip() for line in fh):
                return
    except FileNotFoundError:
        pass
    tmpnames.write_replacing(path, b"*\n", tmpnames.sibling(path, tmpnames.writer_id(thread=True)))


def _check_folders(store_path: str) -> None:
    """``.scalebox`` and ``store.git`` must be folders: a file there is named, never opened; and
    neither they nor what the engine opens directly in them (locks, events, caches) may be a link
    to anything but a folder (a cloned tree can ship one: see scalebox_cst.statedir)."""
    for folder in (os.path.dirname(store_path), store_path):
        if os.path.islink(folder) and not os.path.isdir(folder):
            raise StoreError(str(statedir.LinkInState(folder)))
        if os.path.lexists(folder) and not os.path.isdir(folder):
            raise StoreError(f"{folder} is a file, not the store's folder: move it away, then run `scalebox init`")
    try:
        statedir.check_entries(os.path.dirname(store_path))
        statedir.check_entries(store_path)
    except statedir.LinkInState as exc:
        raise StoreError(str(exc)) from None
