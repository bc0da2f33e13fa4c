"""Import-hook sessions: ``hook/<session>`` branches the import hook appends to, one commit per
batch of modules."""
from __future__ import annotations

from typing import (
    Dict,
    List,
    Mapping,
    Optional,
    Tuple,
    Union,
)

import pygit2

from scalebox_cst.store.common import (
    _RUN_FORMS,
    HOOK_MESSAGE,
    HOOK_PREFIX,
    MODE_FILE,
    TRAILER_PIPELINE,
    TRAILER_SOURCE,
    BranchInfo,
    FileValue,
    Raw,
    SessionFile,
    SessionInfo,
    StoreError,
    _blob_raw,
    _check_path,
    _reference,
    _trailers,
)
from scalebox_cst.store.refs import _synchronized
from scalebox_cst.store.runs import _Runs


class _Sessions(_Runs):
    """Session branches over run branches (``resolve_any`` names either)."""

    @_synchronized
    def other_branches(self, prefix: str = "hook/") -> List[Tuple[str, str, str, int, int]]:
        """Branches under ``refs/heads/<prefix>`` (the import hook's sessions), oldest first:
        (name, tip commit hex, tip summary line, tip time, number of commits on the branch)."""
        out = []
        for refname in self.repo.listall_references():
            if not refname.startswith("refs/heads/" + prefix):
                continue
            ref = _reference(self.repo, refname)
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
        ref = _reference(self.repo, HOOK_PREFIX + tail)
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
            return self._write_commit(text, tree, [parent])

        new, created = self._update_ref(refname, build, f"{branch}: " + text.splitlines()[0])
        return new.hex(), created
