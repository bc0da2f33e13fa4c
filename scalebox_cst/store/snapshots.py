"""Source snapshots: the linear history ``refs/heads/source`` of the project's files."""
from __future__ import annotations

import re
from typing import (
    Dict,
    Iterable,
    Mapping,
    Optional,
    Tuple,
)

import pygit2

from scalebox_cst.store.common import (
    MODE_EXEC,
    MODE_FILE,
    SOURCE_REF,
    Raw,
    StoreError,
    _blob_raw,
    _check_path,
    _trailers,
)
from scalebox_cst.store.objects import _Objects
from scalebox_cst.store.refs import _synchronized


class _Snapshots(_Objects):
    """Committing and finding snapshots of the user's source."""

    @_synchronized
    def source_tip(self) -> Optional[str]:
        raw = self._ref_raw(SOURCE_REF)
        return raw.hex() if raw else None

    @_synchronized
    def snapshot_title(self, commit: str) -> str:
        """The first line of a snapshot's message (``rollback to run/0001 (previous files: ...)``)."""
        return self._ref_commit("source", bytes.fromhex(commit)).message.strip().split("\n", 1)[0]

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
            commit = self._ref_commit("source", raw)
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
        tip_map = self._tree_map(self._ref_commit("source", tip).tree_id.raw) if tip else {}
        if tip is not None and tip_map == entries:
            return tip.hex(), False
        for path, (_, raw) in entries.items():
            if not self._has(raw):
                self._write_blob(bytes(files[path]))
        tree = self._write_tree(entries)
        message = ((message or "").strip() or "snapshot") + "\n"

        def build(current: Optional[Raw]) -> Optional[Raw]:
            if current is not None and self._commit_obj(current).tree_id.raw == tree:
                return None
            return self._write_commit(message, tree, [current] if current else [])

        new, created = self._update_ref(SOURCE_REF, build, "snapshot: " + message.splitlines()[0])
        self._tree_maps.put(tree, entries)
        return new.hex(), created
