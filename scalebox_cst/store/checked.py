"""Loose objects read whole before libgit2 sees them: a truncated one is an error, not a hang.

libgit2 (1.9, as bundled with pygit2 1.21) loops forever when it inflates a loose object whose
zlib stream ends early (libgit2 issue 7342): a store file cut short by a power loss or a damaged
disk hung every command that read it, `scalebox log` included, and ``create_commit`` hung on a
truncated tree or parent. :func:`install` replaces libgit2's loose backend for reads: each loose
object is inflated with Python's zlib, the stream must end and the header's length hold, and
libgit2 gets the bytes; a short or damaged file is a ``GitError`` naming it (the store's one
line). Packed objects are still libgit2's. Writes go to libgit2's plain object database
(:func:`writer`), commits included: the store encodes them itself, so that libgit2 never
reads a tree or parent back to check it. An object found damaged is not taken as stored: when
the store has its bytes again (a file rewritten anew), the damaged file is set aside
(``store.git/damaged/``) and the object written whole (:func:`set_aside`).
"""
from __future__ import annotations

import os
import threading
import zlib
from typing import Dict, Set, Tuple

import pygit2

from pygit2.enums import ObjectType

from scalebox_cst import statedir

_TYPES = {b"commit": ObjectType.COMMIT, b"tree": ObjectType.TREE, b"blob": ObjectType.BLOB, b"tag": ObjectType.TAG}


class DamagedObject(pygit2.GitError):
    """A loose object file that does not hold a whole object (libgit2 would hang on some)."""


_last = threading.local()  # the newest damage this thread met (see explain)


def forget() -> None:
    """A store operation begins: no damage met yet."""
    _last.damage = None


def explain(exc: BaseException) -> str:
    """The one line for a libgit2 error of a store operation: the damaged object it met, if it
    met one. pygit2 raises our exception where libgit2 called us directly, but where libgit2
    read the object for itself (a tree path lookup, a commit's parent) it raises its own
    (``no error``, ``invalid argument: 'commit'``): the damage is then the reason."""
    damage = getattr(_last, "damage", None)
    _last.damage = None
    return damage or " ".join(str(exc).split())


#: objects directory -> ids of the loose objects found damaged there (this process)
_FOUND: Dict[str, Set[str]] = {}


def any_damaged() -> bool:
    """Whether any object was found damaged (the usual answer, no: a dictionary's truth)."""
    return bool(_FOUND)


def damaged_ids(objects: str) -> Set[str]:
    """The ids of the loose objects under ``objects`` found damaged so far (read, not cached)."""
    return _FOUND.get(os.path.realpath(objects), set())


def set_aside(objects: str, hexid: str) -> None:
    """Move a damaged loose object out of the way (to ``damaged/`` beside ``objects``) so that the
    object can be written again whole: libgit2 only touches an object file that exists."""
    path = os.path.join(objects, hexid[:2], hexid[2:])
    keep = os.path.join(os.path.dirname(os.path.abspath(objects)), "damaged")
    statedir.makedirs(keep)
    try:
        os.replace(path, os.path.join(keep, hexid))
    except FileNotFoundError:
        pass
    _FOUND.get(os.path.realpath(objects), set()).discard(hexid)


def _damaged(path: str, why: str) -> DamagedObject:
    folder, name = os.path.split(path)
    objects, fan = os.path.split(folder)
    _FOUND.setdefault(os.path.realpath(objects), set()).add(fan + name)
    _last.damage = (
        f"damaged object file {path} ({why}): the store is corrupt; restore .scalebox/store.git"
        " from a backup, or move it away and run `scalebox init`"
    )
    return DamagedObject(_last.damage)


def read_loose(objects: str, hexid: str) -> Tuple[int, bytes]:
    """The type and body of loose object *hexid*; ``KeyError`` when it is not a loose file."""
    path = os.path.join(objects, hexid[:2], hexid[2:])
    try:
        with open(path, "rb") as fh:
            packed = fh.read()
    except (FileNotFoundError, NotADirectoryError):
        raise KeyError(hexid) from None
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(packed)
    except zlib.error as exc:
        raise _damaged(path, f"zlib: {exc}") from None
    if not inflater.eof:
        raise _damaged(path, f"truncated at {len(packed)} bytes")
    head, nul, body = raw.partition(b"\0")
    kind, _, size = head.partition(b" ")
    if not nul or kind not in _TYPES or not size.isdigit() or int(size) != len(body):
        raise _damaged(path, "bad header")
    return int(_TYPES[kind]), body


class _CheckedLoose(pygit2.OdbBackend):
    """The loose objects: read whole-checked, written by libgit2's own loose writer. What is not
    a loose file raises ``KeyError`` (not found: libgit2 asks the pack backend next)."""

    def __init__(self, objects: str) -> None:
        super().__init__()
        self.objects = objects

    def _names(self, prefix: str):
        try:
            return [prefix[:2] + n for n in os.listdir(os.path.join(self.objects, prefix[:2])) if n.startswith(prefix[2:])]
        except OSError:
            return []

    def _one(self, prefix: str) -> str:
        names = self._names(str(prefix).lower())
        if len(names) > 1:
            raise ValueError(f"ambiguous object id prefix {prefix}")
        if not names:
            raise KeyError(prefix)
        return names[0]

    def read_cb(self, oid):
        return read_loose(self.objects, str(oid))

    def read_header_cb(self, oid):
        kind, body = read_loose(self.objects, str(oid))
        return kind, len(body)

    def read_prefix_cb(self, prefix):
        hexid = self._one(prefix)
        kind, body = read_loose(self.objects, hexid)
        return kind, body, pygit2.Oid(hex=hexid)

    def exists_cb(self, oid):
        hexid = str(oid)
        return os.path.isfile(os.path.join(self.objects, hexid[:2], hexid[2:]))

    def exists_prefix_cb(self, prefix):
        return pygit2.Oid(hex=self._one(prefix))

    def refresh_cb(self):
        pass

    def __iter__(self):
        """Every loose object's id (``for oid in repo.odb``): pygit2's own iteration of a Python
        backend calls back into this one (it recursed until a RecursionError)."""
        try:
            fans = sorted(os.listdir(self.objects))
        except OSError:
            return
        for fan in fans:
            if len(fan) != 2:
                continue
            try:
                names = sorted(os.listdir(os.path.join(self.objects, fan)))
            except OSError:
                continue
            for name in names:
                if len(name) == 38:
                    try:
                        yield pygit2.Oid(hex=fan + name)
                    except ValueError:
                        continue

    def write_cb(self, oid, data, kind):
        # libgit2 hands a write to the first backend that has one (this one), and its retry of a
        # failed write leaves pygit2 with an error pending: the store writes through writer()
        raise pygit2.GitError(f"object {oid}: the store writes objects through its own writer")

def writer(store_path: str) -> pygit2.Odb:
    """libgit2's own object database of the store, for writes only: a write reads nothing (an
    object already stored is only touched), so no damaged object is ever inflated by it."""
    return pygit2.Odb(os.path.join(store_path, "objects"))


def install(repo: pygit2.Repository, store_path: str) -> None:
    """Give *repo* an object database whose loose objects are read through the check."""
    objects = os.path.join(store_path, "objects")
    odb = pygit2.Odb()
    odb.add_backend(_CheckedLoose(objects), 2)
    odb.add_backend(pygit2.OdbBackendPack(objects), 1)
    repo.set_odb(odb)
