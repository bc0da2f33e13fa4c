"""Git objects: blobs and trees hashed in Python and written only when missing, trees read
back as flat path maps, notes in git's fan-out layout."""
from __future__ import annotations

import hashlib
import os
import time

from typing import (
    Any,
    Dict,
    Iterable,
    Mapping,
    Optional,
    Tuple,
    Union,
)

import pygit2
from pygit2.enums import ObjectType

from scalebox_cst.store.common import (
    MODE_EXEC,
    MODE_FILE,
    MODE_TREE,
    Raw,
    StoreError,
    _signature,
    _tree_bytes,
    _tree_raw,
)
from scalebox_cst.store import checked
from scalebox_cst.store.refs import _Refs


#: how long ids known stored are trusted without asking the object database again: under the
#: shortest grace period gc takes (``--grace-days`` 1/24), see :meth:`_Objects._has`
PRESENT_TRUST_S = 1800.0


class _Objects(_Refs):
    """Object reading and writing over the ref layer (memoised: objects never change)."""

    def _commit_obj(self, raw: Raw) -> pygit2.Commit:
        try:
            obj = self.repo[pygit2.Oid(raw=raw)]
        except KeyError:
            raise StoreError(f"unknown commit {raw.hex()}") from None
        if obj.type != ObjectType.COMMIT:
            raise StoreError(f"{raw.hex()} is not a commit")
        return obj

    def _ref_commit(self, name: str, raw: Raw) -> pygit2.Commit:
        """The commit branch ``name`` points to; a missing one is the store's damage, said so
        with the branch named (not "unknown commit" and a hex id)."""
        if not self._has(raw):
            short = name.rsplit("refs/heads/", 1)[-1]
            fix = ("restore .scalebox/store.git from a backup, or move it away and run `scalebox init`" if short == "source"
                   else f"drop the branch: git --git-dir .scalebox/store.git branch -D {short}; or restore "
                   ".scalebox/store.git from a backup")
            raise StoreError(f"branch {short} points to commit {raw.hex()[:12]}, which is not in the store: "
                             f"the store is damaged ({fix})")
        return self._commit_obj(raw)

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
        """Whether an object is stored (``odb.exists``: no read, unlike ``oid in repo``); one found
        damaged is not (store.checked: written again, it is whole).

        A loose object found is freshened (its time set to now, as git does), and the ids known
        stored are forgotten every :data:`PRESENT_TRUST_S`: gc removes unreachable trees and commits
        older than its grace period, so an id trusted from memory is one written or freshened
        less than a grace period ago, which gc keeps. Trusted for good, a process alive past the
        grace period named a cache tree gc had removed without writing it again (a broken link)."""
        if checked.any_damaged() and raw.hex() in checked.damaged_ids(self._objects_dir):
            self._present.discard(raw)
            return False
        now = time.time()  # gc ages objects by the wall clock: a suspend (monotonic stands still) ages them too
        if not 0 <= now - self._present_since <= PRESENT_TRUST_S:  # (or the clock set back)
            self._present.clear()
            self._present_since = now
        if raw in self._present:
            return True
        if pygit2.Oid(raw=raw) in self._odb:
            hexid = raw.hex()
            try:
                os.utime(os.path.join(self._objects_dir, hexid[:2], hexid[2:]))
            except OSError:  # packed (gc removes no packed object), or a read-only store
                pass
            self._mark_present((raw,))
            return True
        return False

    def _write_object(self, kind: int, body: bytes) -> Raw:
        """Write one object through libgit2's plain object database (store.checked.writer); a
        damaged file of the same object is set aside first (libgit2 would only touch it)."""
        if self._writer_odb is None:
            self._writer_odb = checked.writer(self.path)
        damaged = checked.damaged_ids(self._objects_dir)
        if damaged:
            names = {int(ObjectType.BLOB): b"blob", int(ObjectType.TREE): b"tree", int(ObjectType.COMMIT): b"commit"}
            name = names.get(int(kind), b"tag")
            hexid = hashlib.sha1(b"%s %d\0" % (name, len(body)) + body).hexdigest()
            if hexid in damaged:
                checked.set_aside(self._objects_dir, hexid)
        return self._writer_odb.write(kind, body).raw

    @property
    def _objects_dir(self) -> str:
        return os.path.join(self.path, "objects")

    def _write_blob(self, data: bytes) -> Raw:
        raw = self._write_object(ObjectType.BLOB, data)
        self._mark_present((raw,))
        return raw

    def _write_commit(self, message: str, tree: Raw, parents: Iterable[Raw]) -> Raw:
        """A commit as libgit2 encodes it, written without reading its tree or parents back
        (libgit2's check of them would inflate a damaged object: store.checked)."""
        sig = _signature()
        sign = "-" if sig.offset < 0 else "+"
        who = f"{sig.name} <{sig.email}> {sig.time} {sign}{abs(sig.offset) // 60:02d}{abs(sig.offset) % 60:02d}"
        head = [f"tree {tree.hex()}"] + [f"parent {p.hex()}" for p in parents] + [f"author {who}", f"committer {who}"]
        return self._write_object(ObjectType.COMMIT, ("\n".join(head) + "\n\n" + message).encode("utf-8"))

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
            written = self._write_object(ObjectType.TREE, body)
            if written != raw:  # pragma: no cover - would mean our encoding is wrong
                raise StoreError(f"tree encoding mismatch ({written.hex()} != {raw.hex()})")
            self._mark_present((raw,))
        return raw

    def _tree_items(self, raw: Optional[Raw]) -> Dict[bytes, Tuple[int, Raw]]:
        if raw is None:
            return {}
        obj = self.repo.get(pygit2.Oid(raw=raw))
        if obj is None or obj.type != ObjectType.TREE:  # missing, or a blob where a folder was
            raise StoreError(f"{raw.hex()} is not a tree")
        return {e.name.encode("utf-8"): (e.filemode, e.id.raw) for e in obj}

    def _readable_commit(self, raw: Optional[Raw]) -> Optional[Raw]:
        """``raw`` if it is a commit whose root tree can be read, else None."""
        try:
            if raw is not None:
                self._tree_items(self._commit_obj(raw).tree_id.raw)
                return raw
        except (StoreError, pygit2.GitError):
            pass
        return None

    def _put_fanout(
        self, ref_commit: Optional[Raw], additions: Mapping[bytes, Mapping[bytes, Raw]]
    ) -> Optional[Raw]:
        """The root tree of *ref_commit* with blobs added under two-hex-digit folders.

        *additions* maps folder name -> {entry name -> blob id}. None when nothing changes.
        A damaged *ref_commit* (missing, not a commit, its tree gone) raises StoreError; a
        folder that cannot be read (a blob in its place, a missing tree) is made anew: what it
        held could not be read through the ref anyway.
        """
        root_raw = self._commit_obj(ref_commit).tree_id.raw if ref_commit else None
        root = self._tree_items(root_raw)
        changed = False
        for folder, blobs in additions.items():
            sub_mode, sub_raw = root.get(folder, (None, None))
            try:
                sub = self._tree_items(sub_raw) if sub_mode in (None, MODE_TREE) else {}
            except (StoreError, pygit2.GitError):
                sub = {}
            if sub_mode not in (None, MODE_TREE):
                root.pop(folder)
                changed = True
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

        def build(current: Optional[Raw]) -> Optional[Raw]:
            # A notes ref whose tip cannot be read (missing, not a commit: a damaged or hostile
            # store) starts a new history: the notes under it could not be read anyway, and
            # refusing would refuse every branch from then on. The old tip is named in the message.
            base = self._readable_commit(current)
            message = "Notes added by scalebox\n"
            if current is not None and base is None:
                message += f"\nThe notes history at {current.hex()} could not be read; started anew.\n"
            tree = self._put_fanout(base, additions)
            if tree is None:
                return None
            return self._write_commit(message, tree, [base] if base else [])

        self._update_ref(notes_ref, build, reflog)
