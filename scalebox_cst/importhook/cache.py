"""The bytecode cache in ``.scalebox/pycache/``: one hash-checked, MAC-signed file per (module,
fingerprint), read on a warm import without libcst or pygit2.

Bounded in bytes (:data:`LIMIT_BYTES`, all fingerprints and modules together), least recently
used first: a hit touches its entry's mtime, and after every ``LIMIT_BYTES / 8`` bytes a process
writes (and on its first write) the folder is swept, the oldest entries removed until it holds
three quarters of the limit. Each pipeline fingerprint (a config edit, an engine upgrade) wrote
a whole new set of entries and each config edit a fingerprint memo, never removed (measured: 20
modules of 90 lines, each config +223 kB, 6 configs 1.34 MB). An entry removed under a reader is
a miss: the module is rewritten and the entry made again."""
from __future__ import annotations

import hmac as _hmac
import marshal
import os
import re
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

from scalebox_cst import digits, statedir, tmpnames, userkey
from scalebox_cst.importhook.common import _FORMAT, read_own_file, say_once


def may_write() -> bool:
    """Whether the cache may be written now: not under ``python -B`` (``PYTHONDONTWRITEBYTECODE``,
    ``sys.dont_write_bytecode``), asked at each write as CPython's own bytecode cache asks it
    (``SourceLoader.get_code``). Such a process still reads the entries already there; it writes
    no entry and no fingerprint memo, and does not even touch an entry it reads (a read-only or
    shared checkout, a container's image: nothing of the project's changes)."""
    return not sys.dont_write_bytecode


def _cache_tag() -> str:
    tag = sys.implementation.cache_tag or "python"
    return f"{tag}.opt-{sys.flags.optimize}" if sys.flags.optimize else tag



class _Entry:
    """One bytecode cache file: what the pipeline decided for one (source, fingerprint)."""

    __slots__ = ("meta", "text", "code_data")

    def __init__(self, meta: Dict[str, str], text: str, code_data: bytes) -> None:
        self.meta = meta
        self.text = text
        self.code_data = code_data

    @property
    def kind(self) -> str:
        return self.meta.get("kind", "")


def _read_entry(path: str, source_hash: bytes, key: Optional[bytes]) -> Optional[_Entry]:
    """The entry at ``path`` if it was written for source with ``source_hash`` by this store's
    cold path, else None (then the module is rewritten again and the entry replaced).

    Layout: magic + b"SBX3" | source hash (8) | MAC (32) | meta length (4) | ``key=value`` lines |
    text length (4) | rewritten text (UTF-8) | marshalled code object. The MAC is HMAC-SHA256,
    keyed by this user's cache key (``_cache_key``), over everything but itself: a truncated or cut
    entry, random or empty code, or code planted by anything without that key (a ``.scalebox``
    that came with the project) fails it before ``marshal`` sees a byte. (About 1.3 us per kB
    here: a warm import stays near plain cost.)
    """
    if key is None:
        return None
    try:
        data = read_own_file(path)
    except OSError:
        return None
    try:
        if len(data) < 60 or data[:8] != _FORMAT or data[8:16] != source_hash:
            return None
        if not _hmac.compare_digest(data[16:48], _mac(key, data[:16], data[48:])):
            return None
        meta_end = 52 + int.from_bytes(data[48:52], "little")
        meta = {}
        for line in data[52:meta_end].decode("utf-8").split("\n"):
            name, _, value = line.partition("=")
            meta[name] = value
        text_end = meta_end + 4 + int.from_bytes(data[meta_end : meta_end + 4], "little")
        if text_end > len(data):
            return None
        return _Entry(meta, data[meta_end + 4 : text_end].decode("utf-8"), data[text_end:])
    except (ValueError, UnicodeDecodeError):
        return None


def _mac(key: bytes, head: bytes, body: bytes) -> bytes:
    return _hmac.digest(key, head + body, "sha256")


def _write_entry(path: str, source_hash: bytes, key: Optional[bytes], meta: Dict[str, str], text: str = "", code=None) -> int:
    """Write a cache file atomically (temp file + ``os.replace``); errors are logged, not raised.
    Without a cache key (no store to keep it in) nothing is written: the entry could not be
    verified when read; nor under ``python -B`` (:func:`may_write`). Returns the bytes written
    (0: none)."""
    if key is None or not may_write():
        return 0
    head = "\n".join(f"{k}={' '.join(str(v).splitlines())}" for k, v in sorted(meta.items())).encode("utf-8")
    body = text.encode("utf-8")
    rest = b"".join(
        (
            len(head).to_bytes(4, "little"),
            head,
            len(body).to_bytes(4, "little"),
            body,
            marshal.dumps(code) if code is not None else b"",
        )
    )
    start = _FORMAT + source_hash
    payload = start + _mac(key, start, rest) + rest
    tmp = tmpnames.sibling(path, tmpnames.writer_id(thread=True))
    try:
        statedir.makedirs(os.path.dirname(path))
        tmpnames.write_replacing(path, payload, tmp)
    except OSError as exc:
        say_once(("cache", exc.errno), "scalebox: cannot write the import cache file %s (%s); continuing without it "
                 "(said once for this cause)", path, exc)
        try:
            os.remove(tmp)
        except OSError:
            pass
        return 0
    _clear_orphans(path)
    return len(payload)


def _clear_orphans(path: str) -> None:
    """Remove temporary siblings of ``path`` that killed writers left (older than a minute)."""
    import time

    folder, _, name = path.rpartition(os.sep)
    prefix = tmpnames.stem(name) + "."  # as tmpnames.sibling names them
    cutoff = time.time() - 60.0
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if entry.name.startswith(prefix) and entry.name.endswith(".tmp"):
                    try:
                        if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                            os.remove(entry.path)
                    except OSError:
                        pass
    except OSError:
        pass


def _cache_key(store_dir: str, create: bool) -> Optional[bytes]:
    """The key cache entries are signed with: this user's key (``userkey``, kept outside every
    project, so a ``.scalebox/pycache`` that came with the project never verifies), narrowed to
    this cache; None when there is no store (nothing is cached then) or no key can be had."""
    if not os.path.isdir(store_dir):
        return None
    secret = userkey.key_for(b"scalebox import cache", create)
    if secret is None and create:
        say_once(("cache key",), "scalebox: no folder of this user's can hold the cache key (%s); continuing without "
                 "the import cache", " or ".join(userkey.folders()))
    return secret


def _limit_bytes() -> int:
    return max(1, int(digits.setting("SCALEBOX_IMPORT_CACHE_MB", 256, 0, 1 << 20) * (1 << 20)))


#: the names this cache writes: an entry (``cache_path``: ``-scalebox-<fingerprint>.pyc`` kept whole
#: however long the module's name), a fingerprint memo, and a writer's temporary of either
#: (``tmpnames.sibling``: the name, or its ``~<hash>`` stem, then ``.<pid>[-<thread>].tmp``)
_ENTRY_NAME = re.compile(r"(?:.*-scalebox-[0-9a-f]{16}\.pyc|fingerprint-[0-9a-f]{16})\Z", re.S)
_TEMP_NAME = re.compile(r"(?:.*-scalebox-[0-9a-f]{16}\.pyc|fingerprint-[0-9a-f]{16}|.*~[0-9a-f]{16})\.\d+(?:-\d+)?\.tmp\Z", re.S)


#: the most bytes ``.scalebox/pycache/`` keeps (``$SCALEBOX_IMPORT_CACHE_MB``, default 256 MB)
LIMIT_BYTES = _limit_bytes()
_WRITTEN: Dict[str, int] = {}  # cache folder -> bytes this process wrote since it last swept it
_WRITTEN_LOCK = threading.Lock()


def touch(path: str) -> None:
    """Mark an entry used (its mtime is its place in the least-recently-used order). The time is
    the precise clock's: the kernel stamps a write with a coarse one (a tick of up to 10 ms
    behind), so an entry touched and then passed by a write in the same tick stays the newer."""
    if not may_write():
        return  # its place in the order is left as it was
    now = time.time_ns()
    try:
        os.utime(path, ns=(now, now))
    except OSError:  # a read-only project: the order is then the order of writes
        pass


def note_written(folder: str, nbytes: int, limit: Optional[int] = None) -> None:
    """Count bytes written into the cache ``folder``; sweep it on the first write of this process
    and after every eighth of the limit written since."""
    limit = LIMIT_BYTES if limit is None else limit
    with _WRITTEN_LOCK:
        since = _WRITTEN.get(folder)
        if since is not None and since + nbytes < limit // 8:
            _WRITTEN[folder] = since + nbytes
            return
        _WRITTEN[folder] = 0
    sweep(folder, limit)


def sweep(folder: str, limit: Optional[int] = None) -> int:
    """Remove the least recently used entries (and fingerprint memos) of the cache ``folder``
    until it holds at most three quarters of ``limit`` bytes, if it holds more than ``limit``;
    temporary files killed writers left (older than a minute) always go. Returns bytes freed.
    Each removal is one ``unlink`` of a whole file: a kill at any point leaves entries that are
    each whole or gone, and a concurrent reader of a removed entry reads a miss.

    Only files of the cache's own names are counted and removed: ``pycache`` may be a link to a
    folder (statedir allows it, for a larger disk), and a project that came with
    ``.scalebox/pycache -> ../data`` had the oldest files of ``data/`` removed, every one of
    them once the folder held more than the limit."""
    limit = LIMIT_BYTES if limit is None else limit
    found: List[Tuple[float, int, str]] = []
    total = freed = 0
    stale = time.time() - 60.0
    for dirpath, _dirs, files in os.walk(folder):  # links are not followed into
        for name in files:
            path = os.path.join(dirpath, name)
            temporary = bool(_TEMP_NAME.match(name))
            if not temporary and not _ENTRY_NAME.match(name):
                continue  # not the cache's: never counted, never removed
            try:
                st = os.lstat(path)
                if temporary and st.st_mtime < stale:
                    os.remove(path)
                    freed += st.st_size
                    continue
            except OSError:
                continue
            found.append((st.st_mtime, st.st_size, path))
            total += st.st_size
    if total <= limit:
        return freed
    found.sort()
    for _mtime, size, path in found:
        if total <= limit * 3 // 4:
            break
        try:
            os.remove(path)
        except OSError:
            continue
        total -= size
        freed += size
    return freed
