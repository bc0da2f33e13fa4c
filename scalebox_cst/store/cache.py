"""The rewrite cache: ``refs/scalebox/cache/<fingerprint>`` maps a source file (:func:`cache_key`:
its path and bytes) to its rewritten blob and file report, one entry per user (:func:`entry_path`), fronted by an in-process memory
layer.

Each entry is signed with this user's key (:mod:`scalebox_cst.userkey`, kept outside every
project): the report blob is ``sbx-signed <HMAC>\n<report JSON>``, the HMAC over the pipeline
fingerprint, the source blob id, the output blob id and the report. A store that came with the
project (a committed ``.scalebox/``, an archive) could otherwise map the source the user reviewed
to other code that ``scalebox run`` would run; its entries fail the check, read as misses, and
are made again from the source and replaced. Without a key nothing is cached.

Bounded, least recently used first, in two generations: the root of a cache's tree holds the
newest entries, ``old/`` the generation before. When a put would take the newest past
:data:`CACHE_GENERATION` entries (counted in the cache commit's ``Scalebox-Cache-Entries``
trailer), the newest become ``old/`` and the generation before them is dropped; an entry found
in ``old/`` is put back among the newest with the next put of this process (``Project``
puts after every rewrite, even of nothing new). Only the :data:`CACHES_KEPT` pipelines written
most recently keep a cache; another pipeline's ref (a config edit, an engine upgrade) is deleted
with its reflog. Before, every save added one entry for good and every pipeline kept its cache
(300 saves: 301 entries, and one reflog line per save)."""
from __future__ import annotations

import hashlib
import json
import os
from typing import (
    Any,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Set,
    Tuple,
)


import pygit2
from pygit2.enums import ObjectType

from scalebox_cst.store.common import (
    _CACHE_MEM_ENTRIES,
    MODE_TREE,
    _trailers,
    _HEX40,
    _SAFE_KEY,
    CACHE_PREFIX,
    FileValue,
    Raw,
    StoreError,
    _blob_raw,
    _tree_get,
)
from scalebox_cst import userkey
from scalebox_cst.store.objects import _Objects
from scalebox_cst.store.refs import _synchronized


#: entries of the newest generation of a pipeline's cache (a cache holds at most twice this, or
#: one generation plus the largest batch put at once: a whole project's first rewrite)
CACHE_GENERATION = 2048
#: pipelines whose caches are kept, those written most recently
CACHES_KEPT = 4
_OLD = b"old"  # the generation before, a folder beside the two-hex-digit ones
_ENTRIES_TRAILER = "Scalebox-Cache-Entries"


class _Cache(_Objects):
    """Cache reads and writes (one ref update per pipeline per batch). A damaged cache (a
    truncated object, a missing tree) reads as empty and is replaced by the next put."""

    cache_damaged: Dict[str, str]  # fingerprint -> what was wrong with its cache (set per store)
    _cache_promote: Dict[str, Dict[Tuple[bytes, bytes], Tuple[Raw, Raw]]]  # fp -> hits in old/, put back next
    _caches_bounded: Set[str]  # pipelines whose put has looked at the other pipelines' caches

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

    def _cache_damage(self, fingerprint: str, exc: BaseException) -> None:
        """A cache whose objects are damaged is dropped, not an error: every entry can be made
        again, and the next put starts a new cache (``cache_damaged`` says which, for a note)."""
        self._cache_mem.pop(fingerprint, None)
        self.cache_damaged.setdefault(fingerprint, " ".join(str(exc).split())[:200])

    def _cache_mem_of(self, fingerprint: str) -> Dict[str, Tuple[str, str]]:
        """The memory layer of one pipeline's cache; those of the :data:`CACHES_KEPT` pipelines
        used last are kept (each config edit of a watcher's life made another, kept for good)."""
        mem = self._cache_mem.pop(fingerprint, None)
        if mem is None:
            mem = {}
            while len(self._cache_mem) >= CACHES_KEPT:
                self._cache_mem.pop(next(iter(self._cache_mem)))
        self._cache_mem[fingerprint] = mem  # last in order: used last
        return mem

    def _cache_ref(self, fingerprint: str) -> str:
        key = fingerprint if _SAFE_KEY.match(fingerprint) else "h-" + hashlib.sha1(fingerprint.encode()).hexdigest()
        return CACHE_PREFIX + key

    def _cache_lookup(self, blob: str, fingerprint: str, state: Optional[List[Any]]) -> Optional[Tuple[str, str]]:
        mem = self._cache_mem_of(fingerprint)
        hit = mem.get(blob)
        if hit is not None:
            return hit
        if not _HEX40.match(blob):
            raise StoreError(f"bad blob id {blob!r}")
        if state:
            tree = state[0]
        else:
            tip = self._ref_raw(self._cache_ref(fingerprint))
            try:
                tree = self._commit_obj(tip).tree if tip else None
            except (pygit2.GitError, StoreError) as exc:  # damaged: the cache is rebuilt, never needed
                self._cache_damage(fingerprint, exc)
                tree = None
            if state is not None:
                state.append(tree)
        secret = userkey.key_for(_PURPOSE) if tree is not None else None
        if secret is None:
            return None
        try:
            name = entry_path(secret, blob)
            try:
                out, signed, older = _tree_get(tree, name, True), _tree_get(tree, name + ".json", True), False
            except KeyError:
                old = _OLD.decode() + "/" + name
                out, signed, older = _tree_get(tree, old, True), _tree_get(tree, old + ".json", True), True
            if out.type != ObjectType.BLOB or signed.type != ObjectType.BLOB:
                raise KeyError(blob)  # a folder (or a link) where an entry's file was: no entry
            report = _signed_report(secret, fingerprint, blob, str(out.id), signed.data)
            if report is None:
                return None  # not signed with this user's key: made again (and replaced)
            hit = (str(out.id), report.decode("utf-8"))
            if not self._has(out.id.raw):
                return None  # the rewritten blob itself is gone: rewrite again
            if older:  # used again: back among the newest with this process's next put
                folder_name, _, leaf = name.encode().partition(b"/")
                self._cache_promote.setdefault(fingerprint, {})[(folder_name, leaf)] = (out.id.raw, signed.id.raw)
        except KeyError:
            return None
        except (pygit2.GitError, UnicodeDecodeError) as exc:
            self._cache_damage(fingerprint, exc)
            return None
        if len(mem) >= _CACHE_MEM_ENTRIES:
            mem.clear()  # the memory layer is only a front for the store: dropping it is safe
        mem[blob] = hit
        return hit

    def _cache_put_many(self, entries: List[Tuple[str, str, FileValue, Mapping[str, Any]]]) -> List[str]:
        results: List[str] = []
        if not entries and not self._cache_promote:
            return results
        by_fp: Dict[str, Dict[bytes, Dict[bytes, Raw]]] = {}
        remember: Dict[str, Dict[str, Tuple[str, str]]] = {}
        secret = userkey.key_for(_PURPOSE)
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
            if secret is None or self._cache_mem.get(fingerprint, {}).get(source_blob) == (out_raw.hex(), text):
                continue  # no key to sign it with, or already stored by this process
            rep_data = _sign_report(secret, fingerprint, source_blob, out_raw.hex(), text.encode("utf-8"))
            rep_raw = _blob_raw(rep_data)
            if not self._has(rep_raw):
                self._write_blob(rep_data)
            folder_name, _, name = entry_path(secret, source_blob).encode().partition(b"/")
            folder = by_fp.setdefault(fingerprint, {}).setdefault(folder_name, {})
            folder[name] = out_raw
            folder[name + b".json"] = rep_raw
            remember.setdefault(fingerprint, {})[source_blob] = (out_raw.hex(), text)
        for fingerprint, promoted in self._cache_promote.items():  # hits in the generation before
            for (folder_name, name), (out_raw, rep_raw) in promoted.items():
                folder = by_fp.setdefault(fingerprint, {}).setdefault(folder_name, {})
                if name not in folder:
                    folder[name], folder[name + b".json"] = out_raw, rep_raw
        self._cache_promote.clear()
        for fingerprint, additions in by_fp.items():
            count = sum(len(v) for v in additions.values()) // 2
            rotated: List[bool] = []

            def build(current: Optional[Raw], additions: Mapping = additions, fp: str = fingerprint,
                      count: int = count, rotated: List[bool] = rotated) -> Optional[Raw]:
                try:
                    made = self._cache_tree(None if fp in self.cache_damaged else current, additions, count)
                except (pygit2.GitError, StoreError) as exc:  # its tree is damaged: a new cache
                    self._cache_damage(fp, exc)
                    made = self._cache_tree(None, additions, count)
                if made is None:
                    return None
                tree, entries, rotated[:] = made[0], made[1], [made[2]]
                message = f"scalebox rewrite cache for pipeline {fp}\n\n{_ENTRIES_TRAILER}: {entries}\n"
                return self._write_commit(message, tree, [])

            self._update_ref(self._cache_ref(fingerprint), build, f"cache: {count} entries")
            self._bound_caches(fingerprint, rotated == [True])
            mem = self._cache_mem_of(fingerprint)
            if len(mem) >= _CACHE_MEM_ENTRIES:
                mem.clear()
            mem.update(remember.get(fingerprint, {}))
        return results

    def _cache_tree(self, current: Optional[Raw], additions: Mapping[bytes, Mapping[bytes, Raw]],
                    count: int) -> Optional[Tuple[Raw, int, bool]]:
        """(root tree, entries of its newest generation, whether the generations turned) for the
        cache at commit *current* with *additions* (``count`` entries) put; None: no change."""
        newest = 0
        if current is not None:
            commit = self._commit_obj(current)
            try:
                newest = int(_trailers(commit.message).get(_ENTRIES_TRAILER, ""))
            except ValueError:  # a cache from before the trailer: counted once
                root = self._tree_items(commit.tree_id.raw)
                newest = sum(len(self._tree_items(raw)) for name, (mode, raw) in root.items()
                             if name != _OLD and mode == MODE_TREE) // 2
        if current is None or newest + count <= CACHE_GENERATION:
            tree = self._put_fanout(current, additions)
            return None if tree is None else (tree, newest + count, False)
        root = self._tree_items(self._commit_obj(current).tree_id.raw)
        before = [(name, mode, raw) for name, (mode, raw) in root.items() if name != _OLD]
        fresh = self._put_fanout(None, additions)
        if fresh is None:
            return None
        items = self._tree_items(fresh)
        if before:
            items[_OLD] = (MODE_TREE, self._store_tree(before))
        return self._store_tree((n, m, r) for n, (m, r) in items.items()), count, True

    def _bound_caches(self, fingerprint: str, rotated: bool) -> None:
        """Delete the caches of all but the :data:`CACHES_KEPT` pipelines written most recently
        (never *fingerprint*'s), and *fingerprint*'s reflog when its generations turned (one line
        per put, kept by ``core.logAllRefUpdates``; a cache has no history worth keeping)."""
        mine = self._cache_ref(fingerprint)
        if not rotated and fingerprint in self._caches_bounded:
            return  # the other pipelines' caches are looked at once per pipeline a store object puts to
        self._caches_bounded.add(fingerprint)
        with self._locked():
            if rotated:
                try:
                    os.remove(os.path.join(self.path, "logs", *mine.split("/")))
                except OSError:
                    pass
            names = [n for n in self.repo.references if n.startswith(CACHE_PREFIX) and n != mine]
            if len(names) < CACHES_KEPT:
                return
            stamped = []
            for name in names:
                try:
                    stamped.append((self._commit_obj(self._ref_raw(name) or b"").commit_time, name))
                except (StoreError, pygit2.GitError, ValueError):
                    stamped.append((0, name))  # damaged: first to go
            for _, name in sorted(stamped, reverse=True)[CACHES_KEPT - 1:]:
                try:
                    self.repo.references.delete(name)
                except (KeyError, pygit2.GitError):
                    pass


def cache_key(path: str, data: bytes) -> str:
    """The id the rewrite cache keys a project file by: its bytes *and its path*, 40 hex digits
    as a blob id. A rewrite names the file it was made for (``site='pkg1/u.py:8'``, which guard
    events, ``sites.json``, the profile and ``SCALEBOX_LOCATE_NAN`` go by), so two files of the
    same bytes (a copied ``utils.py``) have two rewrites: keyed by the blob alone, the second
    file was served the first's (``pkg2/u.py`` guarded as ``pkg1/u.py:8``)."""
    return hashlib.sha1(b"scalebox rewrite cache\0" + path.encode("utf-8", "surrogateescape") + b"\0" + data).hexdigest()


_SIGNED = b"sbx-signed "
_PURPOSE = b"scalebox rewrite cache"


def entry_path(secret: bytes, blob: str) -> str:
    """Where a source blob's entry lies in a cache tree: ``ab/<38 hex>~<user>``, ``<user>`` 8 hex
    digits derived from this user's key. Two users of one store (a shared project folder) each
    keep their own entry for a file: one name for both made each user's run replace the other's
    entry, a miss every time for both."""
    return f"{blob[:2]}/{blob[2:]}~{userkey.sign(secret, b'cache entry names')[:4].hex()}"


def _sign_report(secret: bytes, fingerprint: str, source_blob: str, out_blob: str, report: bytes) -> bytes:
    tag = userkey.sign(secret, fingerprint.encode(), source_blob.encode(), out_blob.encode(), report)
    return _SIGNED + tag.hex().encode() + b"\n" + report


def _signed_report(secret: bytes, fingerprint: str, source_blob: str, out_blob: str, data: bytes) -> Optional[bytes]:
    """The report in a cache entry's report blob if this user's key signed it with these ids."""
    head, newline, report = data.partition(b"\n")
    if not newline or not head.startswith(_SIGNED):
        return None
    try:
        tag = bytes.fromhex(head[len(_SIGNED):].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not userkey.verify(secret, tag, fingerprint.encode(), source_blob.encode(), out_blob.encode(), report):
        return None
    return report
