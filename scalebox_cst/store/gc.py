"""``scalebox gc``: the store's disk, compacted on the user's word only; nothing a user made is lost.

Every save writes a handful of small loose objects (each a file of its own: a 4 kB block on
most disks, ~83 kB of disk a save over 1,500 saves of a one-file project, 125 MB) and the
rewrite cache's superseded trees and commits (5.6 kB a save) that nothing reaches any more;
the store sets ``gc.auto = 0`` (libgit2 never collects, and git's own collection must not run
under a live writer). This pass:

1. takes the store's write lock (no ref of ours moves meanwhile) and walks what every ref and
   every reflog entry reaches (the reflogs of the rewrite caches excepted, and removed: a cache
   has no history worth keeping);
2. removes loose *trees and commits* that nothing reaches and that are older than the grace
   period (default 14 days: an object a concurrent writer just wrote is young), before it
   packs: that frees disk without taking any, so a full disk gets room. Blobs are never
   removed, only packed. A process names an id it knows stored without writing it again only
   within ``objects.PRESENT_TRUST_S`` (half an hour, under the shortest grace) of writing it or
   finding it stored, and finding a loose object freshens its time, as git does: so what a
   live writer names is young, and kept;
3. packs every loose object it keeps into one pack (``objects/pack``, written by libgit2 to a
   temporary name and renamed; a pack without its index is ignored), checks each is in the
   new pack, then removes the loose copies;
4. packs the refs (one ``packed-refs`` file instead of one file per run branch), and removes
   the reflogs that record nothing but their ref's creation at the commit it still names (each
   run branch kept one, a 4 kB block of disk for one line: 7 of the 15 MB left at 1,500
   branches); the ref itself keeps that commit, and a ref that moves later starts a new log.

Every step removes only what is elsewhere already (a packed copy) or what nothing reaches, one
file at a time: a kill at any point leaves a store whose every ref reads whole, and running it
again finishes the work. ``dry_run`` says what it would pack and free, and changes nothing
(nor takes the write lock: a read-only store can be asked).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import stat
import time
import zlib
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

import pygit2

from scalebox_cst.store.common import CACHE_PREFIX, StoreError
from scalebox_cst.store.refs import _RefFailures

GRACE_S = 14 * 86400
_ZERO = "0" * 40
_TMP_PACK = "pack_git2_"  # libgit2's indexer writes the pack under this name, then renames it
_LOOSE_LOCK = re.compile(r"failed to lock loose reference '([^']+)'")


@dataclasses.dataclass
class GcReport:
    loose: int = 0  # loose objects found
    loose_bytes: int = 0  # disk they take (blocks)
    packed: int = 0  # loose objects put into the new pack (their loose copies then removed)
    pruned: int = 0  # unreachable trees and commits removed
    pruned_bytes: int = 0
    kept_young: int = 0  # unreachable, younger than the grace period: kept
    kept_blobs: int = 0  # unreachable blobs: packed, never removed
    refs_packed: int = 0
    reflogs_removed: int = 0  # reflogs of one creation line at the ref's commit
    pack_bytes: int = 0  # disk the new pack and its index take
    dry_run: bool = False

    def line(self) -> str:
        mb = 1 << 20
        verb = "would" if self.dry_run else "did"
        freed = self.loose_bytes - self.pack_bytes
        return (f"scalebox gc ({'dry run' if self.dry_run else 'done'}): {self.loose} loose objects "
                f"({self.loose_bytes / mb:.1f} MB on disk); {verb} pack {self.packed}, remove {self.pruned} "
                f"unreachable trees/commits ({self.pruned_bytes / mb:.1f} MB), pack {self.refs_packed} refs, "
                f"remove {self.reflogs_removed} reflogs of their ref's creation only"
                + ("" if self.dry_run else f"; new pack {self.pack_bytes / mb:.1f} MB, {max(freed, 0) / mb:.1f} MB freed")
                + f"; kept {self.kept_young} unreachable younger than the grace period, {self.kept_blobs} unreachable blobs (packed)")


def _disk(st: os.stat_result) -> int:
    return getattr(st, "st_blocks", 0) * 512 or st.st_size


class _Ref(NamedTuple):
    name: str
    target: Any  # what it resolves to (an Oid)
    log: Optional[List[Any]]  # its reflog's entries; None for a cache's (no history kept) or an unreadable one


def _refs(repo: pygit2.Repository) -> List[_Ref]:
    """Every ref that resolves, with its reflog read once: what the pass keeps (:func:`_reachable`)
    and which logs it removes (:func:`_creation_only_logs`) are both read from it."""
    out = []
    for name in repo.references:
        ref = repo.references.get(name)
        if ref is None:
            continue
        try:
            target = ref.resolve().target
        except (pygit2.GitError, KeyError):
            continue  # a symbolic ref to nothing (HEAD before the first snapshot)
        log = None
        if not name.startswith(CACHE_PREFIX):
            try:
                log = list(ref.log())
            except (pygit2.GitError, KeyError):
                pass
        out.append(_Ref(name, target, log))
    return out


def _reachable(repo: pygit2.Repository, refs: Sequence[_Ref]) -> Set[bytes]:
    roots: List[pygit2.Oid] = []
    for ref in refs:
        if isinstance(ref.target, pygit2.Oid):
            roots.append(ref.target)
        for entry in ref.log or ():
            roots += [oid for oid in (entry.oid_old, entry.oid_new) if str(oid) != _ZERO]
    seen: Set[bytes] = set()
    stack = list(roots)
    while stack:
        oid = stack.pop()
        if oid.raw in seen:
            continue
        seen.add(oid.raw)
        obj = repo.get(oid)
        if obj is None:
            continue  # missing: the store's own checks say so; nothing to keep
        if isinstance(obj, pygit2.Commit):
            stack.append(obj.tree_id)
            stack.extend(obj.parent_ids)
        elif isinstance(obj, pygit2.Tree):
            stack.extend(entry.id for entry in obj if entry.filemode != 0o160000)  # not a submodule's commit
        elif isinstance(obj, pygit2.Tag):
            stack.append(obj.target)
    return seen


def _loose(objects: str) -> Dict[bytes, Tuple[str, os.stat_result]]:
    """The loose object files: regular files only (a FIFO planted as an object would block
    ``_kind``'s read, and the pass holds the store's lock), in fan-out folders that are folders
    of the store's own (:func:`_refuse_links` has refused a linked one)."""
    out: Dict[bytes, Tuple[str, os.stat_result]] = {}
    for folder in os.listdir(objects):
        if len(folder) != 2:
            continue
        path = os.path.join(objects, folder)
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                continue
            names = os.listdir(path)
        except OSError:
            continue
        for name in names:
            if len(name) != 38:
                continue
            try:
                raw = bytes.fromhex(folder + name)
                st = os.lstat(os.path.join(path, name))
            except (ValueError, OSError):
                continue
            if stat.S_ISREG(st.st_mode):
                out[raw] = (os.path.join(path, name), st)
    return out


def _refuse_links(store_path: str) -> None:
    """Raise :class:`StoreError` where a folder this pass removes files in is a symbolic link.
    ``.scalebox`` and ``store.git`` may be links (moved to a larger disk), but a shipped store can
    hold ``objects/pack -> ../../..`` or ``objects/02 -> ../../../.git/objects/02``: the pass
    removed every file older than an hour in the first (the project's own files), and packed
    the user's git objects away from their repository in the second (git fsck: missing blob)."""
    objects = os.path.join(store_path, "objects")
    folders = [objects, os.path.join(objects, "pack"), os.path.join(store_path, "logs")]
    logs = os.path.join(store_path, "logs")
    for part in CACHE_PREFIX.strip("/").split("/"):
        logs = os.path.join(logs, part)
        folders.append(logs)
    try:
        folders += [os.path.join(objects, n) for n in os.listdir(objects) if len(n) == 2]
    except OSError:
        pass
    refs = os.path.join(store_path, "refs")  # packing the refs removes the loose ref files
    branch_logs = os.path.join(store_path, "logs", "refs", "heads")  # and the branches' one-line reflogs go
    folders += [refs, os.path.join(store_path, "logs", "refs"), branch_logs]
    for tree in (refs, branch_logs):
        for top, dirs, _ in os.walk(tree):  # (links are not followed into)
            folders += [os.path.join(top, d) for d in dirs]
    for folder in folders:
        if os.path.islink(folder):
            raise StoreError(f"{folder} is a symbolic link; gc removes files only in the store's own "
                             "folders (put what it points to in its place, or remove the link)")


def collect(store, dry_run: bool = False, grace_s: float = GRACE_S) -> GcReport:
    """Pack and prune *store* as the module docstring says; what was done (or would be)."""
    report = GcReport(dry_run=dry_run)
    objects = os.path.join(store.path, "objects")
    # a dry run reads only: no write lock (a read-only store can be asked too)
    with store._mutex, (contextlib.nullcontext() if dry_run else store._locked()):
        _refuse_links(store.path)
        if not dry_run and not os.path.isdir(os.path.join(objects, "pack")):
            # git keeps no empty folder (a copied store may lack it); libgit2 looks for packs only in
            # the folder it found when it opened the store: made now, the pack written below was
            # not found by the ref packing ('object not found'), after every loose copy had gone
            os.makedirs(os.path.join(objects, "pack"))
            store.repo.free()
            store.close()
        repo = store.repo
        if not dry_run:
            _clear_debris(store.path)
        refs = _refs(repo)
        keep = _reachable(repo, refs)
        loose = _loose(objects)
        cutoff = time.time() - grace_s
        to_pack: List[bytes] = []
        prune: List[Tuple[bytes, str, os.stat_result]] = []
        for raw, (path, st) in loose.items():
            report.loose += 1
            report.loose_bytes += _disk(st)
            if raw in keep:
                to_pack.append(raw)
                continue
            kind = _kind(path)
            if kind not in (b"blob", b"tree", b"commit"):
                continue  # damaged (or a tag): left for the store's own repair (store.checked)
            if kind == b"blob":
                report.kept_blobs += 1
                to_pack.append(raw)
            elif st.st_mtime < cutoff:  # asked this way round: a nan grace (every comparison false) keeps
                prune.append((raw, path, st))
            else:
                report.kept_young += 1
        report.pruned = len(prune)
        report.pruned_bytes = sum(_disk(st) for _, _, st in prune)
        report.refs_packed = sum(1 for _ in _loose_refs(store.path))
        creations = _creation_only_logs(refs, store.path)
        report.reflogs_removed = len(creations)
        report.packed = len(to_pack)
        if dry_run:
            return report
        # What nothing reaches goes first: it frees disk without taking any (a pass run because
        # the disk is full packed first, failed there, and freed nothing).
        logs = os.path.join(store.path, "logs", *CACHE_PREFIX.strip("/").split("/"))
        for name in os.listdir(logs) if os.path.isdir(logs) else ():
            _remove(os.path.join(logs, name))  # the caches' reflogs: they would name what goes next
        for _, path, _ in prune:
            _remove(path)
        for path in creations:
            _remove(path)
        if to_pack:
            before = set(os.listdir(os.path.join(objects, "pack")))
            repo.pack(pack_delegate=lambda builder: [builder.add(pygit2.Oid(raw=raw)) for raw in to_pack])
            packs = pygit2.OdbBackendPack(objects)
            for name in set(os.listdir(os.path.join(objects, "pack"))) - before:
                st = os.lstat(os.path.join(objects, "pack", name))
                report.pack_bytes += _disk(st)
            for raw in to_pack:
                if packs.exists(pygit2.Oid(raw=raw)):  # the packed copy is there: the loose one goes
                    _remove(loose[raw][0])
                else:
                    report.packed -= 1
        _pack_refs(store)
    return report


def _pack_refs(store) -> None:
    """``compress_references`` under the store's write lock, past the ref locks a killed writer
    left: libgit2 takes ``packed-refs.lock`` and then each loose ref's ``<ref>.lock`` as it folds
    them in, so a pass killed there left one (``refs/heads/run/0239.lock``), and every later pass
    failed on it ('failed to lock loose reference'). A lock made before this pass took the
    write lock and unchanged since is a dead writer's and goes, as a ref update's does
    (refs._RefFailures); one a program outside scalebox holds is waited for, then named."""
    failures = _RefFailures(store, "packed-refs")
    while True:
        try:
            store.repo.compress_references()
            return
        except (pygit2.GitError, OSError) as exc:  # pygit2 raises a lock it cannot take as OSError
            named = _LOOSE_LOCK.search(str(exc))
            failures.refname = named.group(1) if named else "packed-refs"
            failures.handle(exc)  # raises what cannot be retried


def _creation_only_logs(refs: Sequence[_Ref], path: str) -> List[str]:
    """The reflog files of branches whose log is one line: their creation, at the commit the
    branch still names (what that line keeps, the branch keeps). A log that cannot be read, or
    that is not a plain file, is left alone."""
    found = []
    for ref in refs:
        if not ref.name.startswith("refs/heads/") or ref.log is None or len(ref.log) != 1:
            continue
        log = os.path.join(path, "logs", *ref.name.split("/"))
        if not os.path.isfile(log) or os.path.islink(log):
            continue
        entry = ref.log[0]
        if str(entry.oid_old) == _ZERO and entry.oid_new == ref.target:
            found.append(log)
    return found


def _loose_refs(path: str):
    refs = os.path.join(path, "refs")
    for folder, _, files in os.walk(refs):
        for name in files:
            if not name.endswith(".lock"):
                yield os.path.join(folder, name)


def _remove(path: str) -> None:
    """One file (never its fan-out folder: a concurrent writer may be about to rename into it)."""
    try:
        os.remove(path)
    except OSError:
        pass


def _kind(path: str) -> bytes:
    """A loose object's type from its header (``b"tree"``), b"" where it cannot be read."""
    try:
        with open(path, "rb") as fh:
            head = zlib.decompressobj().decompress(fh.read(512), 32)
    except (OSError, zlib.error):
        return b""
    return head.split(b" ", 1)[0] if b" " in head else b""


def _clear_debris(path: str) -> None:
    """What a killed pass leaves, removed under the store's write lock: libgit2's temporary pack
    files (``pack_git2_*``; nothing else there is ours to remove), whatever their age, since
    only a pass writes them and it holds that lock (a killed pass's file, as large as the store,
    stayed until a pass an hour later); and a packed-refs lock older than an hour (git makes
    one too, and a live one is younger)."""
    pack = os.path.join(path, "objects", "pack")
    for name in (os.listdir(pack) if os.path.isdir(pack) else ()):
        if name.startswith(_TMP_PACK):
            try:
                os.remove(os.path.join(pack, name))
            except OSError:
                pass
    lock = os.path.join(path, "packed-refs.lock")
    try:
        if os.lstat(lock).st_mtime < time.time() - 3600:
            os.remove(lock)
    except OSError:
        pass
