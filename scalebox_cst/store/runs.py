"""Run branches: one rewrite commit per run (``run/NNNN``), its JSON report as a git note, and
reading any commit's files back."""
from __future__ import annotations

import json
from typing import (
    Any,
    Dict,
    List,
    Mapping,
    Optional,
    Set,
    Tuple,
    Union,
)

import pygit2
from pygit2.enums import ObjectType

from scalebox_cst.store.common import (
    _HEX40,
    _RUN_FORMS,
    _UPDATE_ATTEMPTS,
    MODE_EXEC,
    MODE_FILE,
    REPORTS_REF,
    VOUCHED_REF,
    RUN_PREFIX,
    TRAILER_PIPELINE,
    TRAILER_SOURCE,
    BranchInfo,
    FileValue,
    Raw,
    StoreError,
    _blob_raw,
    _tree_get,
    _check_path,
    _reference,
    _trailers,
)
from scalebox_cst import userkey
from scalebox_cst.store.objects import _Objects
from scalebox_cst.store.refs import _RefFailures, _synchronized
from scalebox_cst.digits import ascii_digits


class _Runs(_Objects):
    """Run branches and reading commits (a commit may be named by its run branch)."""

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
        commit = pygit2.Oid(raw=self._write_commit(message, tree, [source.id.raw]))
        commit_hex = str(commit)

        with self._locked():
            number = self._max_run_number() + 1
            failures = None
            for _ in range(_UPDATE_ATTEMPTS * 4):
                name = f"run/{number:04d}"
                refname = "refs/heads/" + name
                if _reference(self.repo, refname) is not None:
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
                    if _reference(self.repo, refname) is None:  # a lock or an error, not a clash
                        failures.handle(exc)
                    else:
                        number += 1
                    continue
                try:  # the branch is made: a vouch that fails (a full disk) is checked again later
                    self._vouch(commit.raw)
                except (StoreError, OSError, pygit2.GitError):
                    pass
                return name, commit_hex
        raise StoreError("could not create a run branch: every name tried was taken meanwhile")


    @_synchronized
    def vouch(self, commit: str) -> None:
        """Note ``commit`` as one this user's engine made, or checked to hold its rewrite."""
        self._vouch(self._commit_raw(commit))

    def _vouch(self, raw: Raw) -> None:
        secret = userkey.key()
        if secret is not None:
            tag = userkey.sign(secret, b"scalebox run commit", raw)
            self._put_notes(VOUCHED_REF, {raw: tag.hex().encode() + b"\n"}, f"vouch {raw.hex()[:10]}")

    @_synchronized
    def vouched(self, commit: str) -> bool:
        """Whether this user's engine made ``commit`` or checked it (:meth:`vouch`): a store that
        came with the project holds branches nobody here made, whose files may be other code."""
        secret = userkey.key(create=False)
        if secret is None:
            return False
        raw = self._commit_raw(commit)
        try:
            tag = bytes.fromhex(self.repo.lookup_note(raw.hex(), VOUCHED_REF).message.strip())
        except (KeyError, ValueError, pygit2.GitError):
            return False
        return userkey.verify(secret, tag, b"scalebox run commit", raw)

    @_synchronized
    def holds_rewrite(self, commit: str, source_commit: str, files: Mapping[str, bytes]) -> bool:
        """Whether ``commit``'s files are what ``commit_rewrite(source_commit, files, ...)`` would
        write (paths, contents and modes), so that an existing branch can stand for a new one."""
        base = self._tree_map(self._commit_obj(self._commit_raw(source_commit)).tree_id.raw)
        want = dict(base)
        for path, data in files.items():
            want[path] = (base[path][0] if path in base else MODE_FILE, _blob_raw(bytes(data)))
        return self._tree_map(self._commit_obj(self._commit_raw(commit)).tree_id.raw) == want

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
        ref = _reference(self.repo, "refs/heads/" + name)
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
        except pygit2.GitError as exc:  # the notes ref points at a missing object or a blob
            raise StoreError(f"no report stored for {info.name} (the store's reports cannot be read: {exc})") from None
        try:
            data = json.loads(note.message)
        except (ValueError, RecursionError):
            raise StoreError(f"the report of {info.name} is not valid JSON") from None
        if not isinstance(data, dict):  # every reader asks it .get(...)
            raise StoreError(f"the report of {info.name} is not a JSON object")
        return data

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
            obj = _tree_get(tree, relpath.strip("/"), scan_leaf=True)  # (pygit2's own lookup keeps every name it misses)
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
    def tree_of(self, commit: str) -> Optional[str]:
        """The hex id of a commit's tree (two snapshots of the same files share it), None where
        the commit is not in the store."""
        try:
            return self._commit_obj(self._commit_raw(commit)).tree_id.raw.hex()
        except (StoreError, KeyError, ValueError):
            return None

    @_synchronized
    def executable_paths(self, commit: str) -> Set[str]:
        tree = self._commit_obj(self._commit_raw(commit)).tree_id.raw
        return {p for p, (mode, _) in self._tree_map(tree).items() if mode == MODE_EXEC}

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
            ref = _reference(self.repo, text) or _reference(self.repo, "refs/heads/" + text)
            if ref is not None and isinstance(ref.target, pygit2.Oid):
                self._ref_commit(text, ref.target.raw)  # raises: the branch's commit is missing
            raise StoreError(f"unknown commit {text}") from None

    def _runs(self) -> List[Tuple[int, str, Raw]]:
        out = []
        for refname in self.repo.listall_references():
            if refname.startswith(RUN_PREFIX):
                tail = refname[len(RUN_PREFIX):]
                if ascii_digits(tail):
                    ref = _reference(self.repo, refname)
                    if ref is not None:
                        out.append((int(tail), refname[len("refs/heads/"):], ref.target.raw))
        out.sort()
        return out

    def _max_run_number(self) -> int:
        numbers = [
            int(r[len(RUN_PREFIX):])
            for r in self.repo.listall_references()
            if r.startswith(RUN_PREFIX) and ascii_digits(r[len(RUN_PREFIX):])
        ]
        return max(numbers, default=0)

    def _info(self, name: str, number: int, raw: Raw) -> BranchInfo:
        parsed = self._branch_info.get(raw)
        if parsed is None:
            commit = self._ref_commit(name, raw)
            trailers = _trailers(commit.message)
            source = str(commit.parent_ids[0]) if commit.parent_ids else trailers.get(TRAILER_SOURCE)
            parsed = (source, commit.message.split("\n", 1)[0], commit.commit_time, trailers.get(TRAILER_PIPELINE))
            self._branch_info[raw] = parsed
        source, summary, when, fingerprint = parsed
        return BranchInfo(name, number, raw.hex(), source, summary, when, fingerprint)
