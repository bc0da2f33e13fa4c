"""The rewrite store: a bare git repository at ``<project>/.scalebox/store.git``.

Every source snapshot and every rewrite is a commit, so what ran can always be shown, diffed and
restored with plain git. It is written with pygit2 plumbing only: no checkout, no working tree, and
the user's own ``.git``, index and files are never touched.

Layout (all inside the store)::

    refs/heads/source                      linear history of source snapshots
    refs/heads/run/NNNN                    one rewrite commit per run, parent = its snapshot
    refs/heads/hook/<session>              import hook: one commit per batch of modules, parent =
                                           the previous one (the first's: a snapshot)
    refs/notes/scalebox-reports            git note per rewrite commit: the JSON run report
    refs/scalebox/cache/<fingerprint>      rewrite cache: tree "ab/<38 hex>" -> rewritten blob,
                                           "ab/<38 hex>.json" -> file report (keyed by source blob)

Concurrency: libgit2 compares-and-swaps an existing ref under its lock file, but *creating* a ref
(``force=False``) checks for existence before taking that lock, so two writers can both "create"
the same ``run/NNNN`` and one branch is silently lost (measured: 9 of 1500 contested names with 4
processes). All ref updates therefore go through one advisory lock (``store.git/scalebox.lock``,
``flock``) held only around the ref update itself; objects are written before it is taken, and
updates of existing refs are still compare-and-swap, so a foreign writer cannot be overwritten.
A writer killed mid-update leaves libgit2's ``<ref>.lock``; the next writer removes it under the
write lock (see ``_RefFailures``) instead of failing forever.

Speed: trees are hashed in Python and written only when missing, and blobs already in the
previous snapshot are never rewritten (libgit2 "freshens" an existing object with a utime call,
~0.2 ms each here), so an unchanged snapshot writes nothing and a one-file change writes a handful
of objects.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import sys
import threading
import time
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Set,
    Tuple,
    Union,
)

import pygit2
from pygit2.enums import ObjectType, RepositoryOpenFlag

from scalebox_cst import tmpnames

__all__ = ["Store", "StoreError", "BranchInfo", "SessionInfo", "SessionFile", "SOURCE_REF", "REPORTS_REF", "RUN_PREFIX", "HOOK_PREFIX"]

SOURCE_REF = "refs/heads/source"
RUN_PREFIX = "refs/heads/run/"
HOOK_PREFIX = "refs/heads/hook/"
HOOK_MESSAGE = "import hook:"  # first words of every commit the import hook appends to a session
REPORTS_REF = "refs/notes/scalebox-reports"
CACHE_PREFIX = "refs/scalebox/cache/"
LOCK_NAME = "scalebox.lock"
SIG_NAME = "scalebox"
SIG_EMAIL = "scalebox@localhost"
TRAILER_SOURCE = "Scalebox-Source"
TRAILER_PIPELINE = "Scalebox-Pipeline"

MODE_FILE = 0o100644
MODE_EXEC = 0o100755
MODE_TREE = 0o040000

_LOCK_TIMEOUT_S = 60.0
_CACHE_MEM_ENTRIES = 50_000  # per pipeline, in the in-process memory layer
_OPEN_FLAGS = RepositoryOpenFlag.NO_SEARCH | RepositoryOpenFlag.NO_DOTGIT | RepositoryOpenFlag.BARE
_UPDATE_ATTEMPTS = 64
_LOCK_IN_MESSAGE = re.compile(r"failed to lock file '([^']+)'")
_STALE_LOCK_S = 0.5  # a ref lock older than this, made before we took the write lock: a dead writer's
_CLOCK_SLACK_NS = 50_000_000  # where the lock file cannot be touched: file times run on a coarser clock
_FOREIGN_LOCK_WAIT_S = 3.0
_TMP_OBJECT = "tmp_object_git2_"
_DEBRIS_AGE_S = 60.0
_HEX40 = re.compile(r"[0-9a-f]{40}\Z")
_RUN_FORMS = re.compile(r"(?:refs/heads/)?(?:run/)?(\d+)\Z")
_SAFE_KEY = re.compile(r"[A-Za-z0-9_-]{1,100}\Z")

# Raw 20-byte object ids are used internally; hex strings at the API.
Raw = bytes
FileValue = Union[bytes, str, pygit2.Oid]


class StoreError(Exception):
    """A store operation failed; the message is one line and says what to do."""


@dataclasses.dataclass(frozen=True)
class BranchInfo:
    """One run branch: the rewrite commit, the snapshot it was made from, and its pipeline."""

    name: str  # "run/0001"
    number: int
    commit: str
    source_commit: Optional[str]
    summary: str
    time: int  # commit time, seconds since the epoch
    fingerprint: Optional[str]


@dataclasses.dataclass(frozen=True)
class SessionFile:
    """One module an import-hook session committed: its rewrite's commit and its original's."""

    path: str
    commit: str  # the newest session commit that wrote this file
    source_commit: Optional[str]  # the snapshot holding the source that commit rewrote
    fingerprint: Optional[str]  # the pipeline that rewrote it
    message: str  # that commit's message (it lists the sites of the module it rewrote)


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """An import-hook session branch (``hook/<session>``) and the modules it rewrote."""

    name: str  # "hook/20250101-120000-4242"
    commit: str  # tip
    base: Optional[str]  # the snapshot the session's first commit started from
    commits: int  # the hook's commits on the branch
    files: Tuple[SessionFile, ...]  # by path


# ---------------------------------------------------------------------------------------------
# Object ids and tree encoding (git's own format, so ids match git byte for byte)


def _blob_raw(data: bytes) -> Raw:
    h = hashlib.sha1(b"blob %d\x00" % len(data))
    h.update(data)
    return h.digest()


def _tree_bytes(entries: Iterable[Tuple[bytes, int, Raw]]) -> bytes:
    """Serialise (name, mode, raw id) entries in git's order (a folder sorts as ``name/``)."""
    ordered = sorted(entries, key=lambda e: e[0] + b"/" if e[1] == MODE_TREE else e[0])
    return b"".join(b"%o %s\x00%s" % (mode, name, raw) for name, mode, raw in ordered)


def _tree_raw(body: bytes) -> Raw:
    h = hashlib.sha1(b"tree %d\x00" % len(body))
    h.update(body)
    return h.digest()


def _check_path(path: str) -> str:
    if not isinstance(path, str) or not path:
        raise StoreError(f"bad path {path!r}: expected a relative path with '/'")
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", "..") or "\x00" in part or part.lower() == ".git":
            raise StoreError(f"bad path {path!r}: expected a relative path with '/'")
    return path


# ---------------------------------------------------------------------------------------------
# The advisory write lock


class _FileLock:
    """An exclusive ``flock`` on a file, polled with a deadline (never held for long)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: Optional[int] = None

    def acquire(self, timeout: Optional[float] = None) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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


def _one_line(exc: BaseException) -> str:
    """An OS or libgit2 error as one line: its text, with the OS's reason where Python has one."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        return f"{exc.filename}: {exc.strerror}"
    return " ".join(str(exc).split()) or type(exc).__name__


def _synchronized(method: Callable) -> Callable:
    """Serialise a public method per Store object (pygit2 objects are not thread-safe).

    What the disk or libgit2 refuses (disk full, a read-only store, a damaged file) leaves as a
    one-line ``StoreError`` naming the store, never as a traceback from deep inside libgit2.
    """

    def wrapper(self: "Store", *args: Any, **kwargs: Any) -> Any:
        with self._mutex:
            try:
                return method(self, *args, **kwargs)
            except (pygit2.GitError, OSError) as exc:
                raise StoreError(f"store {self.path}: {_one_line(exc)}{_disk_note(self.path, str(exc))}") from None

    wrapper.__name__ = method.__name__
    wrapper.__qualname__ = method.__qualname__
    wrapper.__doc__ = method.__doc__
    return wrapper


class _Lru(collections.OrderedDict):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)

    def fetch(self, key: Any) -> Any:
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value


# ---------------------------------------------------------------------------------------------


class Store:
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
        self._lock = _FileLock(os.path.join(self.path, LOCK_NAME))
        self._lock_depth = 0
        self._mutex = threading.RLock()
        self._tree_maps: _Lru = _Lru(16)  # tree raw id -> {path: (mode, raw blob id)}
        self._files: _Lru = _Lru(4)  # tree raw id -> {path: bytes}
        self._branch_info: Dict[Raw, Tuple[Optional[str], str, int, Optional[str]]] = {}
        self._cache_mem: Dict[str, Dict[str, Tuple[str, str]]] = {}  # fp -> src -> (out, json)
        self._present: Set[Raw] = set()  # object ids known to be stored
        self._odb_handle: Optional[pygit2.Odb] = None
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
            self._odb_handle = None
            self.repo.free()

    # -- hashing -------------------------------------------------------------------------------

    @staticmethod
    def blob_id(data: bytes) -> str:
        """The git blob id of *data* (what ``pygit2.hash`` returns), without writing anything."""
        return _blob_raw(data).hex()

    # -- source snapshots ----------------------------------------------------------------------

    @_synchronized
    def source_tip(self) -> Optional[str]:
        raw = self._ref_raw(SOURCE_REF)
        return raw.hex() if raw else None

    @_synchronized
    def resolve_snapshot(self, text: str) -> str:
        """A commit of the source history named by its id or a prefix of it (4 hex digits or
        more, as ``scalebox rollback`` prints them); ``StoreError`` for anything else."""
        text = str(text).strip()
        if not re.fullmatch(r"[0-9a-fA-F]{4,40}", text):
            raise StoreError(f"unknown snapshot {text}")
        tip = self._ref_raw(SOURCE_REF)
        try:
            commit = self.repo.revparse_single(text.lower()).peel(pygit2.Commit).id
        except (KeyError, ValueError, pygit2.GitError):
            raise StoreError(f"unknown snapshot {text}") from None
        if tip is None or not (commit.raw == tip or self.repo.descendant_of(pygit2.Oid(raw=tip), commit)):
            raise StoreError(f"{text} is not a snapshot of the source history")
        return str(commit)

    @_synchronized
    def last_source_trailer(self, key: str, limit: int = 100_000) -> Optional[Tuple[str, str]]:
        """The newest commit of the source history (first parents) whose trailers hold *key*:
        ``(commit hex, value)``, or None."""
        raw = self._ref_raw(SOURCE_REF)
        for _ in range(limit):
            if raw is None:
                return None
            commit = self._commit_obj(raw)
            value = _trailers(commit.message).get(key)
            if value is not None:
                return raw.hex(), value
            raw = commit.parent_ids[0].raw if commit.parent_ids else None
        return None

    @_synchronized
    def snapshot(
        self, files: Mapping[str, bytes], message: str, executable: Iterable[str] = ()
    ) -> Tuple[str, bool]:
        """Commit the full set of project *files* on ``refs/heads/source``.

        Returns ``(commit hex, created)``; when the tree equals the tip's, nothing is written and
        the tip is returned with ``False``. Paths in *executable* get mode 100755.
        """
        exec_set = set(executable)
        entries: Dict[str, Tuple[int, Raw]] = {}
        for path, data in files.items():
            _check_path(path)
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise StoreError(f"snapshot {path}: contents must be bytes")
            entries[path] = (MODE_EXEC if path in exec_set else MODE_FILE, _blob_raw(bytes(data)))
        unknown = exec_set - entries.keys()
        if unknown:
            raise StoreError(f"executable path not in the snapshot: {sorted(unknown)[0]}")

        tip = self._ref_raw(SOURCE_REF)
        tip_map = self._tree_map(self._commit_obj(tip).tree_id.raw) if tip else {}
        if tip is not None and tip_map == entries:
            return tip.hex(), False
        for path, (_, raw) in entries.items():
            if not self._has(raw):
                self._write_blob(bytes(files[path]))
        tree = self._write_tree(entries)
        message = ((message or "").strip() or "snapshot") + "\n"
        sig = _signature()

        def build(current: Optional[Raw]) -> Optional[Raw]:
            if current is not None and self._commit_obj(current).tree_id.raw == tree:
                return None
            parents = [pygit2.Oid(raw=current)] if current else []
            return self.repo.create_commit(None, sig, sig, message, pygit2.Oid(raw=tree), parents).raw

        new, created = self._update_ref(SOURCE_REF, build, "snapshot: " + message.splitlines()[0])
        self._tree_maps.put(tree, entries)
        return new.hex(), created

    # -- run branches --------------------------------------------------------------------------

    @_synchronized
    def commit_rewrite(
        self,
        source_commit: str,
        files: Mapping[str, FileValue],
        summary: str,
        report_text: str,
        report_json: Mapping[str, Any],
        fingerprint: str,
    ) -> Tuple[str, str]:
        """Commit the rewritten project on a new branch ``run/NNNN`` whose parent is the snapshot.

        *files* maps relpath to rewritten bytes, or to the id of a blob already in the store (what
        ``cache_get`` returns); paths not given keep the snapshot's content, paths given keep the
        snapshot's mode. The message is *summary*, the site report, and the trailers
        ``Scalebox-Source`` / ``Scalebox-Pipeline``. *report_json* is kept as a note on the commit
        (keys ``branch``/``commit``/``source_commit`` that are present and None are filled in).
        Returns ``(branch name, commit hex)``.
        """
        fingerprint = str(fingerprint)
        if not fingerprint or any(c in fingerprint for c in "\r\n"):
            raise StoreError(f"bad pipeline fingerprint {fingerprint!r}")
        source = self._commit_obj(self._commit_raw(source_commit))
        base = self._tree_map(source.tree_id.raw)
        entries = dict(base)
        for path, value in files.items():
            _check_path(path)
            mode = base[path][0] if path in base else MODE_FILE
            if isinstance(value, (bytes, bytearray, memoryview)):
                data = bytes(value)
                raw = _blob_raw(data)
                if not self._has(raw):
                    self._write_blob(data)
            else:
                raw = self._existing_blob(value, path)
            entries[path] = (mode, raw)
        tree = self._write_tree(entries)
        self._tree_maps.put(tree, entries)

        summary_line = " ".join((summary or "").split()) or "rewrite"
        parts = [summary_line]
        text = (report_text or "").strip("\n")
        if text.strip():
            parts.append(text.rstrip())
        parts.append(f"{TRAILER_SOURCE}: {source.id}\n{TRAILER_PIPELINE}: {fingerprint}")
        message = "\n\n".join(parts) + "\n"
        sig = _signature()
        commit = self.repo.create_commit(None, sig, sig, message, pygit2.Oid(raw=tree), [source.id])
        commit_hex = str(commit)

        with self._locked():
            number = self._max_run_number() + 1
            failures = None
            for _ in range(_UPDATE_ATTEMPTS * 4):
                name = f"run/{number:04d}"
                refname = "refs/heads/" + name
                if self.repo.references.get(refname) is not None:
                    number += 1
                    continue
                if failures is None or failures.refname != refname:
                    failures = _RefFailures(self, refname)
                stored = dict(report_json)
                for key, value in (
                    ("branch", name),
                    ("commit", commit_hex),
                    ("source_commit", str(source.id)),
                ):
                    if key in stored and stored[key] is None:
                        stored[key] = value
                note = json.dumps(stored, sort_keys=True, indent=1, default=str) + "\n"
                self._put_notes(REPORTS_REF, {commit.raw: note.encode()}, f"report {name}")
                try:
                    self.repo.create_reference_direct(refname, commit, False, message=f"run: {summary_line}")
                except (pygit2.GitError, OSError, ValueError) as exc:
                    if self.repo.references.get(refname) is None:  # a lock or an error, not a clash
                        failures.handle(exc)
                    else:
                        number += 1
                    continue
                return name, commit_hex
        raise StoreError("could not create a run branch: every name tried was taken meanwhile")

    @_synchronized
    def other_branches(self, prefix: str = "hook/") -> List[Tuple[str, str, str, int, int]]:
        """Branches under ``refs/heads/<prefix>`` (the import hook's sessions), oldest first:
        (name, tip commit hex, tip summary line, tip time, number of commits on the branch)."""
        out = []
        for refname in self.repo.listall_references():
            if not refname.startswith("refs/heads/" + prefix):
                continue
            ref = self.repo.references.get(refname)
            if ref is None:
                continue
            tip = self.repo[ref.target]
            count = 0  # the hook's module commits, back to the snapshot the session started from
            commit = tip
            while commit is not None and commit.message.startswith(HOOK_MESSAGE):
                count += 1
                commit = commit.parents[0] if commit.parents else None
            out.append((refname[len("refs/heads/"):], str(tip.id), tip.message.split("\n", 1)[0], tip.commit_time, count))
        out.sort(key=lambda row: (row[3], row[0]))
        return out

    @_synchronized
    def resolve_session(self, branch: str) -> SessionInfo:
        """An import-hook session: ``hook/<session>``, ``refs/heads/hook/<session>``, the bare
        session id, or a prefix of it that names one session."""
        text = str(branch).strip().strip("/")
        if text.startswith("refs/heads/"):
            text = text[len("refs/heads/"):]
        tail = text[len("hook/"):] if text.startswith("hook/") else text
        names = [r[len(HOOK_PREFIX):] for r in self.repo.listall_references() if r.startswith(HOOK_PREFIX)]
        if tail not in names:
            matches = [n for n in names if tail and n.startswith(tail)]
            if len(matches) > 1:
                raise StoreError(f"ambiguous branch {branch}: {', '.join('hook/' + m for m in sorted(matches))}")
            if not matches:
                raise StoreError(f"unknown branch {branch}")
            tail = matches[0]
        ref = self.repo.references.get(HOOK_PREFIX + tail)
        if ref is None:
            raise StoreError(f"unknown branch hook/{tail}")
        tip = self._commit_obj(ref.target.raw)
        latest: Dict[str, SessionFile] = {}
        commits = 0
        base: Optional[str] = None
        commit: Optional[pygit2.Commit] = tip
        while commit is not None and commit.message.startswith(HOOK_MESSAGE):
            commits += 1
            parent = self._commit_obj(commit.parent_ids[0].raw) if commit.parent_ids else None
            trailers = _trailers(commit.message)
            mine = self._tree_map(commit.tree_id.raw)
            before = self._tree_map(parent.tree_id.raw) if parent is not None else {}
            for path, entry in mine.items():
                if before.get(path) != entry and path not in latest:
                    latest[path] = SessionFile(
                        path, str(commit.id), trailers.get(TRAILER_SOURCE), trailers.get(TRAILER_PIPELINE), commit.message
                    )
            base = str(parent.id) if parent is not None else None
            commit = parent
        return SessionInfo(
            "hook/" + tail, str(tip.id), base, commits, tuple(latest[p] for p in sorted(latest))
        )

    def resolve_any(self, branch: str) -> Union[BranchInfo, SessionInfo]:
        """A run branch (``run/0002``, ``2``...) or an import-hook session (see resolve_session)."""
        text = str(branch).strip()
        if _RUN_FORMS.match(text):
            return self.resolve(text)
        try:
            return self.resolve_session(text)
        except StoreError as exc:
            if str(exc).startswith("unknown branch"):
                raise StoreError(f"unknown branch {branch}: expected run/NNNN or hook/<session> (see `scalebox log`)") from None
            raise

    @_synchronized
    def commit_to_branch(
        self, branch: str, files: Mapping[str, FileValue], message: str, start: str
    ) -> Tuple[str, bool]:
        """Append a commit to ``refs/heads/<branch>``: the tip's tree with *files* replaced.

        *files* maps relpath to bytes or to the id of a blob already stored. A branch that does
        not exist yet starts from commit *start* (its tree, and itself as parent). When the tip
        already holds *files*, nothing is written. Concurrent writers (the import hook's worker
        processes) are safe: the ref moves by compare-and-swap and the commit is rebuilt on a
        tip that moved. Returns ``(tip commit hex, whether a commit was made)``.
        """
        branch = str(branch).strip("/")
        refname = "refs/heads/" + branch
        if not branch or branch == "source" or branch.startswith("run/") or "\n" in branch or ".." in branch:
            raise StoreError(f"bad branch name {branch!r} for commit_to_branch")
        blobs: Dict[str, Raw] = {}
        for path, value in files.items():
            _check_path(path)
            if isinstance(value, (bytes, bytearray, memoryview)):
                data = bytes(value)
                raw = _blob_raw(data)
                if not self._has(raw):
                    self._write_blob(data)
            else:
                raw = self._existing_blob(value, path)
            blobs[path] = raw
        start_raw = self._commit_raw(start)
        self._commit_obj(start_raw)
        text = (message or "commit").rstrip() + "\n"
        sig = _signature()

        def build(current: Optional[Raw]) -> Optional[Raw]:
            parent = current if current is not None else start_raw
            base = self._tree_map(self._commit_obj(parent).tree_id.raw)
            entries = dict(base)
            for path, raw in blobs.items():
                entries[path] = (base[path][0] if path in base else MODE_FILE, raw)
            if current is not None and entries == base:
                return None
            tree = self._write_tree(entries)
            self._tree_maps.put(tree, entries)
            return self.repo.create_commit(None, sig, sig, text, pygit2.Oid(raw=tree), [pygit2.Oid(raw=parent)]).raw

        new, created = self._update_ref(refname, build, f"{branch}: " + text.splitlines()[0])
        return new.hex(), created

    @_synchronized
    def branches(self) -> List[BranchInfo]:
        """Run branches, oldest to newest (by run number)."""
        return [self._info(name, number, raw) for number, name, raw in self._runs()]

    @_synchronized
    def newest_branch(self) -> Optional[str]:
        runs = self._runs()
        return runs[-1][1] if runs else None

    @_synchronized
    def resolve(self, branch: str) -> BranchInfo:
        """Accepts ``run/0002``, ``0002``, ``2``, ``refs/heads/run/0002``."""
        if isinstance(branch, BranchInfo):
            branch = branch.name
        m = _RUN_FORMS.match(str(branch).strip())
        if not m:
            raise StoreError(f"unknown branch {branch}: expected run/NNNN")
        number = int(m.group(1))
        name = f"run/{number:04d}"
        ref = self.repo.references.get("refs/heads/" + name)
        if ref is None:
            raise StoreError(f"unknown branch {name}")
        return self._info(name, number, ref.target.raw)

    def source_of(self, branch: str) -> str:
        """The source snapshot commit a run branch was rewritten from."""
        info = self.resolve(branch)
        if info.source_commit is None:
            raise StoreError(f"{info.name} has no source snapshot")
        return info.source_commit

    @_synchronized
    def report(self, branch: str) -> Dict[str, Any]:
        """The JSON report stored with a run branch."""
        info = self.resolve(branch)
        try:
            note = self.repo.lookup_note(info.commit, REPORTS_REF)
        except KeyError:
            raise StoreError(f"no report stored for {info.name}") from None
        try:
            return json.loads(note.message)
        except ValueError:
            raise StoreError(f"the report of {info.name} is not valid JSON") from None

    # -- reading commits -----------------------------------------------------------------------

    @_synchronized
    def files(self, commit: str) -> Dict[str, bytes]:
        """Every file of a commit's tree: relpath -> bytes."""
        tree = self._commit_obj(self._commit_raw(commit)).tree_id.raw
        cached = self._files.fetch(tree)
        if cached is None:
            repo = self.repo
            cached = {p: repo[pygit2.Oid(raw=raw)].data for p, (_, raw) in self._tree_map(tree).items()}
            self._files.put(tree, cached)
        return dict(cached)

    @_synchronized
    def read_file(self, commit: str, relpath: str) -> Optional[bytes]:
        tree = self._commit_obj(self._commit_raw(commit)).tree
        try:
            obj = tree[relpath.strip("/")]
        except (KeyError, ValueError):
            return None
        return obj.data if obj.type == ObjectType.BLOB else None

    @_synchronized
    def read_blob(self, blob_id: str) -> bytes:
        """The bytes of a blob (e.g. the rewritten blob ``cache_get`` returned)."""
        try:
            obj = self.repo[pygit2.Oid(hex=str(blob_id))]
        except (KeyError, ValueError):
            raise StoreError(f"unknown blob {blob_id}") from None
        if obj.type != ObjectType.BLOB:
            raise StoreError(f"{blob_id} is not a blob")
        return obj.data

    @_synchronized
    def tree_paths(self, commit: str) -> Set[str]:
        return set(self._tree_map(self._commit_obj(self._commit_raw(commit)).tree_id.raw))

    @_synchronized
    def executable_paths(self, commit: str) -> Set[str]:
        tree = self._commit_obj(self._commit_raw(commit)).tree_id.raw
        return {p for p, (mode, _) in self._tree_map(tree).items() if mode == MODE_EXEC}

    # -- rewrite cache -------------------------------------------------------------------------

    @_synchronized
    def cache_get(self, source_blob: str, fingerprint: str) -> Optional[Tuple[str, dict]]:
        """``(rewritten blob id, file report)`` for a source blob under a pipeline, or None."""
        hit = self._cache_lookup(str(source_blob), str(fingerprint), None)
        return (hit[0], json.loads(hit[1])) if hit else None

    @_synchronized
    def cache_get_many(
        self, source_blobs: Iterable[str], fingerprint: str
    ) -> Dict[str, Tuple[str, dict]]:
        """``cache_get`` for many blobs at once (the cache ref is read at most once)."""
        fingerprint = str(fingerprint)
        out: Dict[str, Tuple[str, dict]] = {}
        state: List[Any] = []  # lazily loaded cache tree, shared by the misses of this call
        for blob in source_blobs:
            hit = self._cache_lookup(str(blob), fingerprint, state)
            if hit:
                out[str(blob)] = (hit[0], json.loads(hit[1]))
        return out

    @_synchronized
    def cache_put(self, source_blob: str, fingerprint: str, output: FileValue, report: Mapping[str, Any]) -> str:
        """Remember the rewrite of *source_blob* under *fingerprint*; returns the output blob id."""
        return self._cache_put_many([(source_blob, fingerprint, output, report)])[0]

    @_synchronized
    def cache_put_many(self, entries: Iterable[Tuple[str, str, FileValue, Mapping[str, Any]]]) -> None:
        """Many ``(source_blob, fingerprint, output, report)`` at once: one ref update per pipeline."""
        self._cache_put_many(list(entries))

    # -- internals: refs and locking -----------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self._lock_depth == 0:
            self._lock.acquire()
            self._locked_since_ns = self._lock.stamp()
            if not self._debris_checked:
                try:
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
        ref = self.repo.references.get(refname)
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
                ref = self.repo.references.get(refname)
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

    def _runs(self) -> List[Tuple[int, str, Raw]]:
        out = []
        for refname in self.repo.listall_references():
            if refname.startswith(RUN_PREFIX):
                tail = refname[len(RUN_PREFIX):]
                if tail.isdigit():
                    ref = self.repo.references.get(refname)
                    if ref is not None:
                        out.append((int(tail), refname[len("refs/heads/"):], ref.target.raw))
        out.sort()
        return out

    def _max_run_number(self) -> int:
        numbers = [
            int(r[len(RUN_PREFIX):])
            for r in self.repo.listall_references()
            if r.startswith(RUN_PREFIX) and r[len(RUN_PREFIX):].isdigit()
        ]
        return max(numbers, default=0)

    def _info(self, name: str, number: int, raw: Raw) -> BranchInfo:
        parsed = self._branch_info.get(raw)
        if parsed is None:
            commit = self._commit_obj(raw)
            trailers = _trailers(commit.message)
            source = str(commit.parent_ids[0]) if commit.parent_ids else trailers.get(TRAILER_SOURCE)
            parsed = (source, commit.message.split("\n", 1)[0], commit.commit_time, trailers.get(TRAILER_PIPELINE))
            self._branch_info[raw] = parsed
        source, summary, when, fingerprint = parsed
        return BranchInfo(name, number, raw.hex(), source, summary, when, fingerprint)

    # -- internals: objects --------------------------------------------------------------------

    def _commit_obj(self, raw: Raw) -> pygit2.Commit:
        try:
            obj = self.repo[pygit2.Oid(raw=raw)]
        except KeyError:
            raise StoreError(f"unknown commit {raw.hex()}") from None
        if obj.type != ObjectType.COMMIT:
            raise StoreError(f"{raw.hex()} is not a commit")
        return obj

    def _commit_raw(self, commit: Union[str, pygit2.Oid]) -> Raw:
        """A commit given as a hex id, a run branch (``run/0002``, ``refs/heads/run/0002``) or any
        revision git understands (``source``, an abbreviated id)."""
        if isinstance(commit, pygit2.Oid):
            return commit.raw
        text = str(commit).strip()
        if _HEX40.match(text):
            return bytes.fromhex(text)
        if text.startswith(("run/", "refs/heads/run/")):
            return bytes.fromhex(self.resolve(text).commit)
        try:
            return self.repo.revparse_single(text).peel(pygit2.Commit).id.raw
        except (KeyError, ValueError, pygit2.GitError):
            raise StoreError(f"unknown commit {text}") from None

    def _existing_blob(self, value: Union[str, pygit2.Oid], path: str) -> Raw:
        try:
            oid = value if isinstance(value, pygit2.Oid) else pygit2.Oid(hex=str(value))
        except ValueError:
            raise StoreError(f"{path}: expected bytes or a blob id, got {value!r}") from None
        if not self._has(oid.raw):
            raise StoreError(f"{path}: blob {oid} is not in the store")
        return oid.raw

    def _tree_map(self, tree: Raw) -> Dict[str, Tuple[int, Raw]]:
        """Flatten a tree: relpath -> (mode, blob id). Memoised (trees never change)."""
        cached = self._tree_maps.fetch(tree)
        if cached is not None:
            return cached
        out: Dict[str, Tuple[int, Raw]] = {}
        stack = [("", self.repo[pygit2.Oid(raw=tree)])]
        while stack:
            prefix, obj = stack.pop()
            for entry in obj:
                if entry.filemode == MODE_TREE:
                    stack.append((prefix + entry.name + "/", self.repo[entry.id]))
                elif entry.filemode in (MODE_FILE, MODE_EXEC):
                    out[prefix + entry.name] = (entry.filemode, entry.id.raw)
        self._tree_maps.put(tree, out)
        self._mark_present(raw for _, raw in out.values())
        return out

    @property
    def _odb(self) -> pygit2.Odb:
        if self._odb_handle is None:
            self._odb_handle = self.repo.odb
        return self._odb_handle

    def _mark_present(self, raws: Iterable[Raw]) -> None:
        if len(self._present) > 200_000:
            self._present.clear()
        self._present.update(raws)

    def _has(self, raw: Raw) -> bool:
        """Whether an object is stored (``odb.exists``: no read, unlike ``oid in repo``)."""
        if raw in self._present:
            return True
        if pygit2.Oid(raw=raw) in self._odb:
            self._mark_present((raw,))
            return True
        return False

    def _write_blob(self, data: bytes) -> Raw:
        raw = self.repo.create_blob(data).raw
        self._mark_present((raw,))
        return raw

    def _write_tree(self, entries: Mapping[str, Tuple[int, Raw]]) -> Raw:
        """Write the nested trees for flat *entries*, skipping every tree already stored."""
        root: Dict[bytes, Any] = {}
        for path, (mode, raw) in entries.items():
            node = root
            parts = path.encode("utf-8").split(b"/")
            for part in parts[:-1]:
                child = node.setdefault(part, {})
                if not isinstance(child, dict):
                    raise StoreError(f"path {path} runs through the file {part.decode()}")
                node = child
            if isinstance(node.get(parts[-1]), dict):
                raise StoreError(f"path {path} is both a file and a folder")
            node[parts[-1]] = (mode, raw)
        return self._write_node(root)

    def _write_node(self, node: Dict[bytes, Any]) -> Raw:
        items = []
        for name, value in node.items():
            if isinstance(value, dict):
                items.append((name, MODE_TREE, self._write_node(value)))
            else:
                items.append((name, value[0], value[1]))
        return self._store_tree(items)

    def _store_tree(self, items: Iterable[Tuple[bytes, int, Raw]]) -> Raw:
        body = _tree_bytes(items)
        raw = _tree_raw(body)
        # libgit2 reports the empty tree as present even when it is not stored: write it anyway.
        if not body or not self._has(raw):
            written = self.repo.write(ObjectType.TREE, body)
            if written.raw != raw:  # pragma: no cover - would mean our encoding is wrong
                raise StoreError(f"tree encoding mismatch ({written} != {raw.hex()})")
            self._mark_present((raw,))
        return raw

    def _tree_items(self, raw: Optional[Raw]) -> Dict[bytes, Tuple[int, Raw]]:
        if raw is None:
            return {}
        return {e.name.encode("utf-8"): (e.filemode, e.id.raw) for e in self.repo[pygit2.Oid(raw=raw)]}

    def _put_fanout(
        self, ref_commit: Optional[Raw], additions: Mapping[bytes, Mapping[bytes, Raw]]
    ) -> Optional[Raw]:
        """The root tree of *ref_commit* with blobs added under two-hex-digit folders.

        *additions* maps folder name -> {entry name -> blob id}. None when nothing changes.
        """
        root_raw = self._commit_obj(ref_commit).tree_id.raw if ref_commit else None
        root = self._tree_items(root_raw)
        changed = False
        for folder, blobs in additions.items():
            sub_raw = root.get(folder, (None, None))[1]
            sub = self._tree_items(sub_raw)
            before = dict(sub)
            for name, raw in blobs.items():
                sub[name] = (MODE_FILE, raw)
            if sub != before:
                root[folder] = (MODE_TREE, self._store_tree((n, m, r) for n, (m, r) in sub.items()))
                changed = True
        if not changed:
            return None
        return self._store_tree((n, m, r) for n, (m, r) in root.items())

    def _put_notes(self, notes_ref: str, notes: Mapping[Raw, bytes], reflog: str) -> None:
        """Attach notes (annotated object id -> message) in one notes commit (git's layout)."""
        additions: Dict[bytes, Dict[bytes, Raw]] = {}
        for target, message in notes.items():
            blob = self._write_blob(message)
            hexid = target.hex().encode()
            additions.setdefault(hexid[:2], {})[hexid[2:]] = blob
        sig = _signature()

        def build(current: Optional[Raw]) -> Optional[Raw]:
            tree = self._put_fanout(current, additions)
            if tree is None:
                return None
            parents = [pygit2.Oid(raw=current)] if current else []
            return self.repo.create_commit(None, sig, sig, "Notes added by scalebox\n", pygit2.Oid(raw=tree), parents).raw

        self._update_ref(notes_ref, build, reflog)

    # -- internals: cache ----------------------------------------------------------------------

    def _cache_ref(self, fingerprint: str) -> str:
        key = fingerprint if _SAFE_KEY.match(fingerprint) else "h-" + hashlib.sha1(fingerprint.encode()).hexdigest()
        return CACHE_PREFIX + key

    def _cache_lookup(self, blob: str, fingerprint: str, state: Optional[List[Any]]) -> Optional[Tuple[str, str]]:
        mem = self._cache_mem.setdefault(fingerprint, {})
        hit = mem.get(blob)
        if hit is not None:
            return hit
        if not _HEX40.match(blob):
            raise StoreError(f"bad blob id {blob!r}")
        if state:
            tree = state[0]
        else:
            tip = self._ref_raw(self._cache_ref(fingerprint))
            tree = self._commit_obj(tip).tree if tip else None
            if state is not None:
                state.append(tree)
        if tree is None:
            return None
        try:
            out = tree[f"{blob[:2]}/{blob[2:]}"]
            rep = tree[f"{blob[:2]}/{blob[2:]}.json"]
        except KeyError:
            return None
        hit = (str(out.id), rep.data.decode("utf-8"))
        if len(mem) >= _CACHE_MEM_ENTRIES:
            mem.clear()  # the memory layer is only a front for the store: dropping it is safe
        mem[blob] = hit
        return hit

    def _cache_put_many(self, entries: List[Tuple[str, str, FileValue, Mapping[str, Any]]]) -> List[str]:
        results: List[str] = []
        by_fp: Dict[str, Dict[bytes, Dict[bytes, Raw]]] = {}
        remember: Dict[str, Dict[str, Tuple[str, str]]] = {}
        for entry in entries:
            try:
                source_blob, fingerprint, output, report = entry
            except (TypeError, ValueError):
                raise StoreError("cache entries are (source_blob, fingerprint, output, report)") from None
            source_blob, fingerprint = str(source_blob), str(fingerprint)
            if not _HEX40.match(source_blob):
                raise StoreError(f"bad blob id {source_blob!r}")
            if isinstance(output, (bytes, bytearray, memoryview)):
                data = bytes(output)
                out_raw = _blob_raw(data)
                if not self._has(out_raw):
                    self._write_blob(data)
            else:
                out_raw = self._existing_blob(output, source_blob)
            text = json.dumps(dict(report), sort_keys=True, separators=(",", ":"), default=str)
            results.append(out_raw.hex())
            if self._cache_mem.get(fingerprint, {}).get(source_blob) == (out_raw.hex(), text):
                continue  # already stored by this process
            rep_data = text.encode("utf-8")
            rep_raw = _blob_raw(rep_data)
            if not self._has(rep_raw):
                self._write_blob(rep_data)
            key = source_blob.encode()
            folder = by_fp.setdefault(fingerprint, {}).setdefault(key[:2], {})
            folder[key[2:]] = out_raw
            folder[key[2:] + b".json"] = rep_raw
            remember.setdefault(fingerprint, {})[source_blob] = (out_raw.hex(), text)
        sig = _signature()
        for fingerprint, additions in by_fp.items():
            count = sum(len(v) for v in additions.values()) // 2
            message = f"scalebox rewrite cache for pipeline {fingerprint}\n"

            def build(current: Optional[Raw], additions: Mapping = additions) -> Optional[Raw]:
                tree = self._put_fanout(current, additions)
                if tree is None:
                    return None
                return self.repo.create_commit(None, sig, sig, message, pygit2.Oid(raw=tree), []).raw

            self._update_ref(self._cache_ref(fingerprint), build, f"cache: {count} entries")
            mem = self._cache_mem.setdefault(fingerprint, {})
            if len(mem) >= _CACHE_MEM_ENTRIES:
                mem.clear()
            mem.update(remember[fingerprint])
        return results


# ---------------------------------------------------------------------------------------------


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

    def __init__(self, store: "Store", refname: str) -> None:
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


def _disk_note(path: str, text: str) -> str:
    """What to add to an error *text* when the store's disk is full: libgit2 does not always
    say so (an object write cut short surfaces later as a missing object)."""
    if "No space left" in text:
        return ""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return ""
    return " (No space left on device: the store's disk is full)" if st.f_bavail == 0 or st.f_favail == 0 else ""


def _remove_if_older(path: str, cutoff: float) -> None:
    try:
        if os.lstat(path).st_mtime < cutoff:
            os.remove(path)
    except OSError:
        pass


def _signature() -> pygit2.Signature:
    return pygit2.Signature(SIG_NAME, SIG_EMAIL)


def _trailers(message: str) -> Dict[str, str]:
    """Trailers of the last paragraph (``Key: value`` lines), as git interpret-trailers reads them."""
    paragraphs = [p for p in message.strip("\n").split("\n\n") if p.strip()]
    if not paragraphs:
        return {}
    out: Dict[str, str] = {}
    for line in paragraphs[-1].splitlines():
        key, sep, value = line.partition(": ")
        if sep and key and " " not in key:
            out[key] = value.strip()
    return out


def _ensure_gitignore(path: str) -> None:
    try:
        with open(path, "r", encoding="utf-8") as fh:
            if "*" in (line.strip() for line in fh):
                return
    except FileNotFoundError:
        pass
    tmp = tmpnames.sibling(path, tmpnames.writer_id(thread=True))
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("*\n")
    os.replace(tmp, path)


def _check_folders(store_path: str) -> None:
    """``.scalebox`` and ``store.git`` must be folders: a file there is named, never opened."""
    for folder in (os.path.dirname(store_path), store_path):
        if os.path.lexists(folder) and not os.path.isdir(folder):
            raise StoreError(f"{folder} is a file, not the store's folder: move it away, then run `scalebox init`")


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
    tmp = tmpnames.sibling(head, tmpnames.writer_id(), ".scalebox-tmp")
    with open(tmp, "wb") as fh:
        fh.write(_HEAD_TEXT)
    os.replace(tmp, head)
