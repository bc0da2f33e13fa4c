"""The store's names, records and git object encoding, shared by every part of the store.

Kept apart so that the lock, the object writer and the public layers read one set of ref
names and one error type."""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import re
import sys
from typing import (
    Any,
    Dict,
    Iterable,
    Optional,
    Tuple,
    Union,
)

import pygit2
from pygit2.enums import RepositoryOpenFlag

SOURCE_REF = "refs/heads/source"
RUN_PREFIX = "refs/heads/run/"
HOOK_PREFIX = "refs/heads/hook/"
HOOK_MESSAGE = "import hook:"  # first words of every commit the import hook appends to a session
REPORTS_REF = "refs/notes/scalebox-reports"
#: run commits this user's engine made or checked, each noted with its HMAC under the user's key
#: (scalebox_cst.userkey): ``scalebox run`` takes such a branch for an unchanged tree as it is
VOUCHED_REF = "refs/notes/scalebox-vouched"
CACHE_PREFIX = "refs/scalebox/cache/"
LOCK_NAME = "scalebox.lock"
SIG_NAME = "scalebox"
SIG_EMAIL = "scalebox@localhost"
TRAILER_SOURCE = "Scalebox-Source"
TRAILER_PIPELINE = "Scalebox-Pipeline"

MODE_FILE = 0o100644
MODE_EXEC = 0o100755
MODE_TREE = 0o040000

_CACHE_MEM_ENTRIES = 4096  # per pipeline, in the in-process memory layer (50,000: ~12 MB of one-file reports, more for big files)
_OPEN_FLAGS = RepositoryOpenFlag.NO_SEARCH | RepositoryOpenFlag.NO_DOTGIT | RepositoryOpenFlag.BARE
_UPDATE_ATTEMPTS = 64
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


def _reference(repo: pygit2.Repository, refname: str) -> Optional[pygit2.Reference]:
    """``repo.references.get(refname)``, without its leak: pygit2 1.21's ``lookup_reference``
    keeps one reference to the name string it is given, never released, so every lookup by a
    freshly made name kept that string for the life of the process (``Store.branches()`` kept
    one per branch per call: a monitor polled by the page grew ~11 kB a second with 176
    branches). The name is interned: each distinct ref name is then kept once, not per call."""
    return repo.references.get(sys.intern(refname))


def _tree_get(tree: Any, path: str, scan_leaf: bool = False) -> Any:
    """``tree[path]`` (the object at a ``/`` path), KeyError where there is none, without its
    leak: pygit2 1.21 keeps the name string of every lookup that misses, never released (the
    rewrite cache missed once per new file version: one ~100 B string kept a save by a watcher,
    monitor or import hook, for the life of the process). Folder names are interned (a miss then
    keeps one reference to a string kept anyway); with ``scan_leaf`` the last name is found by
    iterating its folder (names that are never the same twice: the cache's entries)."""
    parts = path.split("/")
    obj = tree
    for i, part in enumerate(parts):
        if not isinstance(obj, pygit2.Tree):
            raise KeyError(path)
        if scan_leaf and i == len(parts) - 1:
            found = next((entry for entry in obj if entry.name == part), None)
            if found is None:
                raise KeyError(path)
            return found
        obj = obj[sys.intern(part)]
    return obj


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

def _one_line(exc: BaseException) -> str:
    """An OS or libgit2 error as one line: its text, with the OS's reason where Python has one."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        return f"{exc.filename}: {exc.strerror}"
    return " ".join(str(exc).split()) or type(exc).__name__


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
