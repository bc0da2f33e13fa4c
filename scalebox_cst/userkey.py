"""This user's secret, kept outside every project: what the engine's caches are signed with.

Why: a project can arrive with its ``.scalebox/`` (a repository that committed it, an archive, a
shared disk). Its store could hold a rewrite-cache entry, or the import hook's cache a file, that
maps the source the user reviewed to other code, and ``scalebox run`` or a hooked import would
run that code. A key kept in the store itself proves nothing: it ships with the entries. This
key lives in the engine's per-user cache folder (``runtime.backend.cache_dir``:
``$SCALEBOX_CACHE_DIR``, else ``$XDG_CACHE_HOME/scalebox_cst``) and never in a project, so an
entry another user or machine wrote fails its check and reads as a miss: the rewrite is made
again from the source (a cache is only a cache).

Where the cache folder cannot be made or written (no home, a read-only home), a folder of this
user's own in the temporary directory (``scalebox-<uid>``, mode 0700, checked to be ours and
closed to others) takes its place; where neither works there is no key, and the caches are
neither read nor written. Imports only the standard library, ``intake`` and (when first asked)
``runtime.backend``: the import hook's warm path reads it.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import stat
import tempfile
import threading
import time
from typing import Dict, Optional, Tuple

from scalebox_cst import tmpnames
from scalebox_cst.intake import open_regular

FILE_NAME = "cache.key"
_KEY_BYTES = 32
_LOCK = threading.Lock()
_KEYS: Dict[str, bytes] = {}  # folder -> key, read once per process
_DERIVED: Dict[Tuple[bytes, bytes], bytes] = {}  # (key, purpose) -> the key for that purpose


class _Unusable(OSError):
    """A folder that is not this user's alone (a link, another owner, open to others)."""


def folders() -> list:
    """Where the key is looked for, in order: the user's cache folder, then a private one in the
    temporary directory."""
    return [path for path, _ in _places()]


def _places() -> list:
    """``(folder, shared)`` in order; ``shared``: in a place other users can write (checked)."""
    from scalebox_cst.runtime.backend import cache_dir  # the engine's per-user cache folder

    uid = os.getuid() if hasattr(os, "getuid") else 0
    return [(cache_dir(), False), (os.path.join(tempfile.gettempdir(), f"scalebox-{uid}"), True)]


def key(create: bool = True) -> Optional[bytes]:
    """The user's 32-byte key, made on first use when ``create``; None when no folder of
    :func:`folders` can hold one."""
    for folder, shared in _places():
        with _LOCK:
            known = _KEYS.get(folder)
        if known is not None:
            return known
        try:
            found = _read_or_make(folder, shared, create)
        except OSError:
            continue
        if found is not None:
            with _LOCK:
                _KEYS[folder] = found
            return found
    return None


def key_for(purpose: bytes, create: bool = True) -> Optional[bytes]:
    """The user's key narrowed to one use (the rewrite cache, the import cache), so that an entry
    of one can never pass for another's; derived once per process."""
    secret = key(create)
    if secret is None:
        return None
    with _LOCK:
        derived = _DERIVED.get((secret, purpose))
    if derived is None:
        derived = sign(secret, purpose)
        with _LOCK:
            _DERIVED[(secret, purpose)] = derived
    return derived


def sign(secret: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of ``parts``, each length-prefixed (no two part lists sign alike)."""
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(len(part).to_bytes(8, "little"))
        mac.update(part)
    return mac.digest()


def verify(secret: bytes, tag: bytes, *parts: bytes) -> bool:
    return hmac.compare_digest(tag, sign(secret, *parts))


def forget() -> None:
    """Drop the keys read in this process (tests that move the cache folder)."""
    with _LOCK:
        _KEYS.clear()
        _DERIVED.clear()


def _read_or_make(folder: str, shared: bool, create: bool) -> Optional[bytes]:
    """The key in ``folder``, made there when missing or damaged and ``create`` (None otherwise).

    Made or repaired under a lock on the folder: a damaged key was removed by whoever read it,
    and a process that read it before another had replaced it removed the new key instead, so
    processes started together went on with different keys (each signing what the others read
    as misses). Under the lock the key is read again first; only a key still damaged is removed.
    """
    path = os.path.join(folder, FILE_NAME)
    try:
        _check_private(folder, shared)
        return _read(path)
    except (FileNotFoundError, _Damaged):  # none yet, or a damaged one (made again below)
        pass
    if not create:
        return None
    os.makedirs(folder, mode=0o700, exist_ok=True)
    _check_private(folder, shared)
    with _FolderLock(folder):
        try:
            return _read(path)  # made or repaired by another process meanwhile
        except FileNotFoundError:
            pass
        except _Damaged:
            os.remove(path)  # still the damaged one: no process that takes this lock replaced it
        tmp = tmpnames.sibling(path, tmpnames.writer_id(thread=True))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                os.write(fd, os.urandom(_KEY_BYTES))
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)  # never replaces a key another process made meanwhile
            except FileExistsError:
                pass
        finally:
            os.remove(tmp)
        return _read(path)


class _Damaged(OSError):
    """A key file of the wrong length (cut short by a crash, written by hand)."""


def _read(path: str) -> bytes:
    """The key in ``path``; one of the wrong length raises :class:`_Damaged` (it is made again:
    only the cache entries signed with it are lost, and they are made again too)."""
    with open_regular(path, "rb", follow=True, buffering=0) as fh:  # the user's own folder: their links
        data = fh.read(_KEY_BYTES + 1)
    if len(data) == _KEY_BYTES:
        return data
    raise _Damaged(f"{path}: {len(data)} bytes, not {_KEY_BYTES}")


class _FolderLock:
    """An exclusive ``flock`` on the key's folder while the key is made or repaired. Where the
    folder cannot be locked (no ``fcntl``, a file system without locks) or a holder keeps it
    past a few seconds (a stopped process), the key is made unlocked, as it was before."""

    WAIT_S = 5.0

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.fd: Optional[int] = None

    def __enter__(self) -> "_FolderLock":
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            return self
        try:
            self.fd = os.open(self.folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return self
        deadline = time.monotonic() + self.WAIT_S
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return self
                time.sleep(0.005)
            except OSError:
                return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the folder's descriptor releases the lock


def _check_private(folder: str, shared: bool) -> None:
    """Refuse a folder in a shared place (the temporary directory) that another user could have
    made or could write: a key they planted would let them sign entries."""
    if not shared:
        return
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise _Unusable(f"{folder}: not a folder")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise _Unusable(f"{folder}: owned by another user")
    if info.st_mode & 0o077:
        raise _Unusable(f"{folder}: open to other users")
