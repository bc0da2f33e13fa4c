"""Refs and locking: the advisory write lock, compare-and-swap ref updates and what killed
writers leave behind.

Every ref update of the store goes through ``_Refs._update_ref`` under one ``flock``
(see the package docstring for why creating a ref needs it)."""
from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from typing import (
    Any,
    Callable,
    Dict,
    Iterator,
    Optional,
    Set,
    Tuple,
)

import pygit2

from scalebox_cst import statedir, tmpnames
from scalebox_cst.store import checked
from scalebox_cst.store.common import (
    Raw,
    StoreError,
    _disk_note,
    _Lru,
    _one_line,
    _reference,
)

_LOCK_TIMEOUT_S = 60.0
_LOCK_IN_MESSAGE = re.compile(r"failed to lock file '([^']+)'")
_STALE_LOCK_S = 0.5  # a ref lock older than this, made before we took the write lock: a dead writer's
_CLOCK_SLACK_NS = 50_000_000  # where the lock file cannot be touched: file times run on a coarser clock
_FOREIGN_LOCK_WAIT_S = 3.0
_TMP_OBJECT = "tmp_object_git2_"
_DEBRIS_AGE_S = 60.0

# ---------------------------------------------------------------------------------------------
# The advisory write lock


class _FileLock:
    """An exclusive ``flock`` on a file, polled with a deadline (never held for long)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: Optional[int] = None

    def acquire(self, timeout: Optional[float] = None) -> None:
        try:
            fd = statedir.open_in_place(self.path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise StoreError(f"cannot write to the store: {self.path}: {exc.strerror}") from None
        deadline = time.monotonic() + (_LOCK_TIMEOUT_S if timeout is None else timeout)
        delay = 0.0002
        while True:
            try:
                _lock_fd(fd)
                self._fd = fd
                return
            except BlockingIOError:
                pass
            except OSError:
                os.close(fd)
                raise
            if time.monotonic() > deadline:
                os.close(fd)
                raise StoreError(f"store is locked by another writer ({self.path}); try again")
            time.sleep(delay)
            delay = min(delay * 2, 0.005)

    def stamp(self) -> int:
        """Now, by the file system's clock (what lock files' mtimes are compared with): the
        held lock file is touched and its mtime read; the process clock less a margin when it
        cannot be."""
        try:
            os.utime(self._fd)
            return os.fstat(self._fd).st_mtime_ns
        except (OSError, TypeError, NotImplementedError):
            return time.time_ns() - _CLOCK_SLACK_NS

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                _unlock_fd(fd)
            finally:
                os.close(fd)


if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _lock_fd(fd: int) -> None:
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError as exc:
            raise BlockingIOError(str(exc)) from None

    def _unlock_fd(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _lock_fd(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock_fd(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _synchronized(method: Callable) -> Callable:
    """Serialise a public method per Store object (pygit2 objects are not thread-safe).

    What the disk or libgit2 refuses (disk full, a read-only store, a damaged file) leaves as a
    one-line ``StoreError`` naming the store, never as a traceback from deep inside libgit2.
    """

    def wrapper(self: "_Refs", *args: Any, **kwargs: Any) -> Any:
        with self._mutex:
            checked.forget()
            try:
                return method(self, *args, **kwargs)
            except (pygit2.GitError, OSError) as exc:
                text = checked.explain(exc) if isinstance(exc, pygit2.GitError) else _one_line(exc)
                raise StoreError(f"store {self.path}: {text}{_disk_note(self.path, str(exc))}") from None

    wrapper.__name__ = method.__name__
    wrapper.__qualname__ = method.__qualname__
    wrapper.__doc__ = method.__doc__
    return wrapper


class _Refs:
    """The bottom layer of ``Store``: the write lock and ref updates.

    The state every layer shares, set by ``Store.__init__``."""

    path: str
    repo: pygit2.Repository
    _lock: _FileLock
    _lock_depth: int
    _mutex: threading.RLock
    _tree_maps: _Lru  # tree raw id -> {path: (mode, raw blob id)}
    _files: _Lru  # tree raw id -> {path: bytes}
    _branch_info: Dict[Raw, Tuple[Optional[str], str, int, Optional[str]]]
    _cache_mem: Dict[str, Dict[str, Tuple[str, str]]]  # fp -> src -> (out, json)
    _present: Set[Raw]  # object ids known to be stored
    _present_since: float  # when they were last forgotten (objects._has)
    _odb_handle: Optional[pygit2.Odb]
    _writer_odb: Optional[pygit2.Odb]
    _locked_since_ns: int  # when this object took the write lock (stale-lock test)
    _debris_checked: bool

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self._lock_depth == 0:
            self._lock.acquire()
            try:  # anything raised (an interrupt too) before the body's try releases the lock here
                self._locked_since_ns = self._lock.stamp()
                if not self._debris_checked:
                    self._clear_debris()
            except BaseException:
                self._lock.release()
                raise
        self._lock_depth += 1
        try:
            yield
        finally:
            self._lock_depth -= 1
            if self._lock_depth == 0:
                self._lock.release()

    def _ref_raw(self, refname: str) -> Optional[Raw]:
        ref = _reference(self.repo, refname)
        return ref.target.raw if ref is not None else None

    def _update_ref(
        self, refname: str, build: Callable[[Optional[Raw]], Optional[Raw]], reflog: str
    ) -> Tuple[Raw, bool]:
        """Move *refname* to ``build(current tip)``; None from build means "nothing to do".

        Built optimistically outside the lock, checked under it, rebuilt if the tip moved; the ref
        itself moves by compare-and-swap, so even a writer that ignores our lock is never lost.
        """
        tip = self._ref_raw(refname)
        new = build(tip)
        with self._locked():
            failures = _RefFailures(self, refname)
            while True:
                ref = _reference(self.repo, refname)
                current = ref.target.raw if ref is not None else None
                if current != tip:
                    tip, new = current, build(current)
                if new is None or new == tip:
                    if tip is None:
                        raise StoreError(f"nothing to store under {refname}")
                    return tip, False
                try:
                    if ref is None:
                        self.repo.create_reference_direct(refname, pygit2.Oid(raw=new), False, message=reflog)
                    else:
                        ref.set_target(pygit2.Oid(raw=new), reflog)
                    return new, True
                except (pygit2.GitError, OSError, ValueError) as exc:
                    failures.handle(exc)  # raises what cannot be retried; a moved ref is re-read

    def _clear_debris(self) -> None:
        """What killed writers leave behind, cleared once per object under the write lock: a
        ``HEAD`` libgit2 cannot read (every logged ref update reads it) and temporary object
        files (libgit2 writes ``objects/tmp_object_git2_*`` and renames it into place: a kill
        in between leaves it). A temporary file younger than a minute may be a live writer's
        (objects are written outside the lock) and is left alone."""
        _repair_head(self.path)
        objects = os.path.join(self.path, "objects")
        cutoff = time.time() - _DEBRIS_AGE_S
        with os.scandir(objects) as it:  # libgit2 1.x writes them in objects/ itself
            for entry in it:
                if entry.name.startswith(_TMP_OBJECT):
                    _remove_if_older(entry.path, cutoff)
        self._debris_checked = True


class _RefFailures:
    """What to do after a ref update failed, decided under the store's write lock.

    libgit2 moves a ref by creating ``<ref>.lock`` (no pid in it), writing it, renaming it over
    the ref. Every writer of ours does that while holding the write lock, which we hold now, so
    a lock file made before our hold began (by the file system's clock) and left unchanged for
    half a second was left by a writer that was killed: it is removed and the update retried. One made during our hold belongs to a writer outside
    scalebox (git itself): we wait for it a little, then name the file. Without a lock file the
    ref moved under us (re-read and retry) or the disk refused (disk full, read-only): that is
    reported as it is, never as "busy".
    """

    def __init__(self, store: "_Refs", refname: str) -> None:
        self.store = store
        self.refname = refname
        self.deadline = time.monotonic() + _FOREIGN_LOCK_WAIT_S
        self.unexplained = 0

    def handle(self, exc: BaseException) -> None:
        text = _one_line(exc)
        named = _LOCK_IN_MESSAGE.search(str(exc))
        lock = named.group(1) if named else os.path.join(self.store.path, *self.refname.split("/")) + ".lock"
        inside = os.path.realpath(lock).startswith(os.path.join(os.path.realpath(self.store.path), ""))
        try:
            st = os.lstat(lock) if inside and lock.endswith(".lock") else None
        except OSError:
            st = None
        if st is not None:
            age_ns = time.time_ns() - st.st_mtime_ns
            made_before_us = st.st_mtime_ns <= self.store._locked_since_ns
            if made_before_us and age_ns > _STALE_LOCK_S * 1e9:
                try:
                    os.remove(lock)
                except FileNotFoundError:
                    pass
                except OSError as err:
                    raise StoreError(
                        f"could not update {self.refname}: {lock} was left by a killed writer and cannot be removed ({err.strerror})"
                    ) from None
                return
            if time.monotonic() > self.deadline:
                raise StoreError(
                    f"could not update {self.refname}: {lock} is held by another program (git?); if none is running, remove that file"
                )
            time.sleep(0.005)
            return
        if isinstance(exc, pygit2.AlreadyExistsError) or "does not match" in text or "already exists" in text:
            time.sleep(0.001)  # a foreign writer moved or made the ref: the caller re-reads it
            return
        self.unexplained += 1
        if self.unexplained >= 3:
            raise StoreError(f"could not update {self.refname}: {text}{_disk_note(self.store.path, text)}")
        time.sleep(0.002)


def _remove_if_older(path: str, cutoff: float) -> None:
    try:
        if os.lstat(path).st_mtime < cutoff:
            os.remove(path)
    except OSError:
        pass


_HEAD_TEXT = b"ref: refs/heads/source\n"


def _repair_head(path: str) -> None:
    """Put back a ``HEAD`` that is not a ref git can read (called under the write lock).

    libgit2 reads HEAD on every logged ref update, so a damaged HEAD blocks all writes; the
    store's HEAD names ``refs/heads/source`` and carries nothing else, so rewriting it loses
    nothing. A HEAD the user pointed at another ref or commit is kept.
    """
    head = os.path.join(path, "HEAD")
    try:
        with open(head, "rb") as fh:
            text = fh.read(4096)
    except FileNotFoundError:
        text = b""
    if re.fullmatch(rb"ref: refs/[^\x00-\x20~^:?*\[\\]+\n?|[0-9a-f]{40}\n?", text):
        return
    tmpnames.write_replacing(head, _HEAD_TEXT, tmpnames.sibling(head, tmpnames.writer_id(), ".scalebox-tmp"))
