"""A user's project: its files, config, rewrite store and runs: the engine's Python API.

``Project.commit_change()`` is one change event: snapshot the project's Python files, rewrite
what changed (cached by source blob id and pipeline fingerprint), commit both to the store on a
new ``run/NNNN`` branch, *before* anything runs. The CLI, the watcher and the import hook are thin
layers over this class.
"""
from __future__ import annotations

import dataclasses
import json
import os
import stat
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Sequence, Tuple

from scalebox_cst.config import CONFIG_FILE, DEFAULT_TOML, STATE_DIR, Config
from scalebox_cst.report import FileReport, RunReport
from scalebox_cst.store import Store, StoreError, _FileLock

if TYPE_CHECKING:  # the pipeline imports libcst and every transform: only commands that rewrite load it
    from scalebox_cst.pipeline import FileResult, Pipeline

@dataclasses.dataclass
class ChangeResult:
    """The outcome of one change event."""

    report: RunReport
    created: bool  # a new branch was made (False: nothing changed, or bad input blocked it)
    blocked: List[str] = dataclasses.field(default_factory=list)  # one-line errors that blocked it
    outputs: Dict[str, bytes] = dataclasses.field(default_factory=dict)  # rewritten files by path

    @property
    def branch(self) -> Optional[str]:
        return self.report.branch


@dataclasses.dataclass
class RollbackResult:
    branch: str  # what was restored: run/NNNN, a snapshot id, or "undo of ..."
    restored: List[str]
    unchanged: List[str]
    left_in_place: List[str]  # current files the snapshot did not have (not deleted)
    backup_commit: str  # snapshot of the files as they were before the rollback
    skipped: List[Tuple[str, str]] = dataclasses.field(default_factory=list)  # (path, why): never written
    removed: List[str] = dataclasses.field(default_factory=list)  # undo: files the rollback had created
    commit: Optional[str] = None  # the snapshot of the tree after the rollback


#: the rollback journal under .scalebox/: present only while a rollback is replacing files
JOURNAL_FILE = "rollback-journal.json"
ROLLBACK_LOCK = "rollback.lock"
#: trailer of the snapshot a rollback ends with: what ``undo`` needs to revert it (JSON, one line)
ROLLBACK_TRAILER = "Scalebox-Rollback"
_TMP_TAG = ".scalebox-tmp"


class Project:
    """A project folder with its config and store. ``backend`` is the resolved rewrite target."""

    def __init__(self, root: str, config: Optional[Config] = None, backend: Optional[str] = None) -> None:
        self.root = os.path.realpath(root)
        if not os.path.isdir(self.root):
            raise StoreError(f"{root}: not a directory")
        self.config = config if config is not None else Config.load(self.root)
        self._backend = backend
        self._store: Optional[Store] = None
        self._pipeline: Optional[Pipeline] = None

    # ------------------------------------------------------------------ set-up
    @classmethod
    def init(cls, root: str) -> Tuple["Project", bool]:
        """Create the store and a documented ``scalebox.toml`` (unless config exists). Idempotent."""
        root = os.path.realpath(root)
        wrote_config = False
        has_pyproject_table = False
        pyproject = os.path.join(root, "pyproject.toml")
        if os.path.isfile(pyproject):
            with open(pyproject, encoding="utf-8", errors="replace") as fh:
                has_pyproject_table = "[tool.scalebox]" in fh.read()
        config_path = os.path.join(root, CONFIG_FILE)
        if not os.path.exists(config_path) and not has_pyproject_table:
            # whole or not at all: a kill mid-write must not leave a config that cannot be read,
            # and a config another process wrote meanwhile is never replaced
            tmp = f"{config_path}.{os.getpid()}{_TMP_TAG}"
            try:
                _write_new(tmp, DEFAULT_TOML.encode("utf-8"), None)
                try:
                    os.link(tmp, config_path)
                except FileExistsError:
                    raise
                except (OSError, NotImplementedError):
                    os.replace(tmp, config_path)  # no hard links here: still never a partial file
                wrote_config = True
            except FileExistsError:
                pass
            except OSError as exc:
                raise StoreError(f"cannot write {config_path}: {exc.strerror}") from None
            finally:
                _remove_quietly(tmp)
        project = cls(root)
        project._store = Store.init(root)
        return project, wrote_config

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store.open(self.root)
        return self._store

    def ensure_store(self) -> Store:
        if self._store is None:
            self._store = Store.init(self.root)
        return self._store

    @property
    def state_dir(self) -> str:
        return os.path.join(self.root, STATE_DIR)

    @property
    def runs_dir(self) -> str:
        return os.path.join(self.state_dir, "runs")

    @property
    def backend(self) -> str:
        if self._backend is None:
            from scalebox_cst.runtime.backend import resolve

            self._backend = resolve(self.config.backend).name
        return self._backend

    @property
    def pipeline(self) -> Pipeline:
        if self._pipeline is None:
            from scalebox_cst.catalog import transform_versions
            from scalebox_cst.pipeline import Pipeline

            self._pipeline = Pipeline(self.config, self.backend)
            transform_versions()  # kept for the next status or run (catalog)
        return self._pipeline

    @property
    def fingerprint(self) -> str:
        """``pipeline.fingerprint``, without importing the pipeline where it is not built yet
        (scalebox_cst.catalog); ConfigError for an unknown transform id, as the pipeline's."""
        if self._pipeline is not None:
            return self._pipeline.fingerprint
        from scalebox_cst.catalog import transform_versions

        versions = transform_versions()
        self.config.check_transforms(list(versions))
        enabled = {tid: version for tid, version in versions.items() if self.config.transform_enabled(tid)}
        return self.config.fingerprint(enabled, self.backend)

    # ------------------------------------------------------------------ files
    def relpath(self, path: str) -> str:
        return os.path.relpath(os.path.realpath(path), self.root).replace(os.sep, "/")

    def scan(self) -> Dict[str, bytes]:
        """The project's included files (relative ``/`` paths → bytes), in sorted order."""
        files: Dict[str, bytes] = {}
        #: one line per file left out because its name is not UTF-8 (the store keeps UTF-8 paths)
        self.skipped_names: List[str] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            reldir = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            reldir = "" if reldir == "." else reldir
            dirnames[:] = sorted(
                d for d in dirnames if not self.config.excludes_dir(f"{reldir}/{d}" if reldir else d)
            )
            for name in sorted(filenames):
                rel = f"{reldir}/{name}" if reldir else name
                if not self.config.includes(rel):
                    continue
                if not _utf8_name(rel):
                    shown = os.fsencode(rel).decode("utf-8", errors="backslashreplace")
                    self.skipped_names.append(f"{shown}: file name is not UTF-8; not snapshotted (rename it to include it)")
                    continue
                try:
                    with open(os.path.join(dirpath, name), "rb") as fh:
                        files[rel] = fh.read()
                except OSError:
                    continue  # vanished between listing and reading (an editor's temp file)
        return dict(sorted(files.items()))

    # ------------------------------------------------------------------ change events
    def rewrite_files(self, files: Dict[str, bytes], select: Optional[Iterable[str]] = None) -> Dict[str, FileResult]:
        """Rewrite ``files`` (or only the ``select``-ed paths), using the store's cache."""
        store = self.ensure_store()
        fingerprint = self.pipeline.fingerprint
        wanted = set(files) if select is None else set(select) & set(files)
        results: Dict[str, FileResult] = {}
        fresh: List[Tuple[str, str, bytes, dict]] = []
        for path in sorted(wanted):
            data = files[path]
            blob = Store.blob_id(data)
            hit = store.cache_get(blob, fingerprint)
            if hit is not None:
                out_blob, report = hit
                output = data if out_blob == blob else store.read_blob(out_blob)
                from scalebox_cst.pipeline import FileResult

                results[path] = FileResult(path, data, output, FileReport.from_json({**report, "path": path}))
                continue
            result = self.pipeline.rewrite(path, data)
            results[path] = result
            if not result.bad_input:  # bad input is re-checked on every save: it is being edited
                cached = result.report.to_json()
                cached.pop("path")
                fresh.append((blob, fingerprint, result.output, cached))
        if fresh:
            store.cache_put_many(fresh)
        return results

    def commit_change(
        self,
        select: Optional[Sequence[str]] = None,
        block_on_bad_input: bool = False,
        force: bool = False,
        message: str = "snapshot",
    ) -> ChangeResult:
        """Snapshot, rewrite, commit a new run branch. See the module docstring.

        ``select``: rewrite only these project paths (others are carried as they are).
        ``block_on_bad_input``: a changed file that does not parse blocks the branch (watch mode).
        ``force``: make a new branch even when an identical one exists.
        """
        store = self.ensure_store()
        self.recover()  # never snapshot a tree a killed rollback left half-restored
        files = self.scan()
        results = self.rewrite_files(files, select)
        report = RunReport(None, None, None, self.backend, [r.report for r in results.values()])
        tip = store.source_tip()
        if block_on_bad_input and tip and any(r.bad_input for r in results.values()):
            blocked = [
                r.report.error or ""
                for path, r in results.items()
                if r.bad_input and store.read_file(tip, path) != files[path]
            ]
            if blocked:
                return ChangeResult(report, False, blocked)
        source_commit, created = store.snapshot(files, message)
        report.source_commit = source_commit
        fingerprint = self.pipeline.fingerprint
        if not created and not force:
            for info in reversed(store.branches()):
                if info.source_commit == source_commit and info.fingerprint == fingerprint:
                    report.branch, report.commit = info.name, info.commit
                    return ChangeResult(report, False, outputs=self._outputs(results))
        out_files = dict(files)
        for path, result in results.items():
            out_files[path] = result.output
        summary = f"rewrite: {report.summary()}"
        branch, commit = store.commit_rewrite(
            source_commit, out_files, summary, report_text(report), report.to_json(), fingerprint
        )
        report.branch, report.commit = branch, commit
        return ChangeResult(report, True, outputs=self._outputs(results))

    @staticmethod
    def _outputs(results: Dict[str, FileResult]) -> Dict[str, bytes]:
        return {path: r.output for path, r in results.items()}

    # ------------------------------------------------------------------ rollback
    def rollback(self, target: str) -> RollbackResult:
        """Restore the files of ``target``'s source snapshot, after snapshotting the current ones.

        ``target`` is a run branch (``run/0001``) or a snapshot id on the source history (the
        id a rollback prints for the files it replaced, so a rollback can itself be rolled
        back). Nothing is lost: the current files are committed first, files the snapshot does
        not have are left in place, and nothing is written through a symbolic link or outside
        the project (such paths are reported as skipped). All or nothing: see ``_restore``.
        """
        store = self.store
        with self._rollback_lock():
            self._recover_locked()
            label, source = self._rollback_source(target)
            return self._restore(store.files(source), {}, label, source)

    def undo(self) -> RollbackResult:
        """Revert the newest rollback on the source history: put back the files it replaced
        (its backup snapshot) and remove the files it created, where they are still as it
        wrote them. An undo is a rollback too (snapshotted first, undoable in turn)."""
        store = self.store
        with self._rollback_lock():
            self._recover_locked()
            found = store.last_source_trailer(ROLLBACK_TRAILER)
            if found is None:
                raise StoreError("no rollback to undo (the source history has none)")
            commit, value = found
            try:
                meta = json.loads(value)
                backup, label = str(meta["backup"]), str(meta["label"])
                created = [str(p) for p in meta.get("created", [])]
            except (ValueError, KeyError, TypeError):
                raise StoreError(f"the rollback record in snapshot {commit[:10]} is damaged; use `scalebox rollback SNAPSHOT`") from None
            after = store.files(commit)
            remove = {rel: after[rel] for rel in created if rel in after}
            return self._restore(store.files(backup), remove, f"undo of rollback to {label}", backup)

    def recover(self) -> Optional[str]:
        """Finish a rollback that was killed while it replaced files (its journal is still under
        ``.scalebox/``), so no tree stays half-restored. Returns what was done, in one line."""
        if not os.path.exists(self._journal_path()):
            return None
        with self._rollback_lock():
            return self._recover_locked()

    # ---------------------------------------------------------------- rollback internals
    def _journal_path(self) -> str:
        return os.path.join(self.state_dir, JOURNAL_FILE)

    def _rollback_lock(self):
        """Rollbacks, undos and recoveries of one project run one at a time (across processes)."""
        import contextlib

        if not os.path.isdir(self.state_dir):
            raise StoreError(f"no store at {Store.store_path(self.root)}: run `scalebox init`")

        @contextlib.contextmanager
        def held():
            lock = _FileLock(os.path.join(self.state_dir, ROLLBACK_LOCK))
            lock.acquire()
            try:
                yield
            finally:
                lock.release()

        return held()

    def _rollback_source(self, target: str) -> Tuple[str, str]:
        """(label, source snapshot commit) for a run branch or a snapshot id."""
        store = self.store
        text = str(target).strip()
        is_run = text.startswith(("run/", "refs/heads/run/"))
        if is_run or text.isdigit():
            try:
                info = store.resolve(text)
            except StoreError:
                if is_run:
                    raise
            else:
                if info.source_commit is None:
                    raise StoreError(f"{info.name} has no source snapshot")
                return info.name, info.source_commit
        try:
            commit = store.resolve_snapshot(text)
        except StoreError:
            raise StoreError(
                f"unknown branch or snapshot {text}: expected run/NNNN or a snapshot id that `scalebox rollback` printed"
            ) from None
        return f"snapshot {commit[:10]}", commit

    def _unsafe(self, rel: str) -> Optional[str]:
        """Why ``rel`` must not be written by a rollback (a symlink on the way, a folder or file
        in the way), or None. Every folder above it is a real folder inside the project."""
        parts = rel.split("/")
        path = self.root
        for i, part in enumerate(parts):
            path = os.path.join(path, part)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                return None  # the rest is created, as real folders, inside the project
            except OSError as exc:
                return f"cannot be inspected ({exc.strerror})"
            shown = "/".join(parts[: i + 1])
            if stat.S_ISLNK(st.st_mode):
                if i == len(parts) - 1:
                    return "it is a symbolic link (kept as a link; rollback does not write through links)"
                return f"{shown} is a symbolic link (rollback does not write through links)"
            if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
                return f"{shown} is a file, not a folder"
            if i == len(parts) - 1 and not stat.S_ISREG(st.st_mode):
                return "a folder or special file is in the way"
        return None

    def _restore(self, target: Dict[str, bytes], remove: Dict[str, bytes], label: str, source: str) -> RollbackResult:
        """Lay ``target`` over the tree (and remove ``remove``'s files where they still hold those
        bytes) all or nothing: the current files are snapshotted, every new file is written in
        full beside its destination, a journal records the plan, then each is renamed into
        place. A failure before the renames removes the temporary files; one during them puts
        back what was replaced; a kill is finished by the next command (``recover``)."""
        store = self.store
        current = self.scan()
        restored, unchanged, skipped, removing = [], [], [], []
        for rel, data in sorted(target.items()):
            why = self._unsafe(rel)
            if why is not None:
                if current.get(rel) != data:
                    skipped.append((rel, why))
                continue
            if current.get(rel) == data:
                unchanged.append(rel)
            else:
                restored.append(rel)
        for rel, data in sorted(remove.items()):
            if rel not in target and current.get(rel) == data and self._unsafe(rel) is None:
                removing.append(rel)
        backup, _ = store.snapshot(current, f"before rollback to {label}")
        created = [rel for rel in restored if rel not in current]
        left = sorted(set(current) - set(target) - set(removing))
        if restored or removing:
            journal = {
                "label": label,
                "source": source,
                "backup": backup,
                "write": [[rel, self._tmp_name(rel)] for rel in restored],
                "remove": [[rel, self._tmp_name(rel)] for rel in removing],
                "created": created,
                "phase": "prepare",
            }
            self._replace_files(journal, target, current)
        final = {rel: data for rel, data in current.items() if rel not in removing}
        final.update((rel, target[rel]) for rel in restored)
        commit = self._record(label, source, backup, created, final)
        return RollbackResult(label, restored, unchanged, left, backup, skipped, removing, commit)

    def _tmp_name(self, rel: str) -> str:
        folder, _, name = rel.rpartition("/")
        return (folder + "/" if folder else "") + f".{name}.{os.getpid()}{_TMP_TAG}"

    def _abs(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/"))

    def _record(self, label: str, source: str, backup: str, created: List[str], final: Dict[str, bytes]) -> str:
        """The snapshot a rollback ends with; its trailer lets ``undo`` revert it. Then the
        journal goes: the rollback is complete."""
        meta = json.dumps({"label": label, "source": source, "backup": backup, "created": created}, sort_keys=True)
        message = f"rollback to {label} (previous files: {backup[:10]})\n\n{ROLLBACK_TRAILER}: {meta}"
        try:
            commit, _ = self.store.snapshot(final, message)
        except StoreError as exc:
            raise StoreError(f"the files of {label} are in place, but the store could not record it ({exc}); the next scalebox command records it") from None
        try:
            os.remove(self._journal_path())
        except FileNotFoundError:
            pass
        return commit

    def _write_journal(self, journal: dict) -> None:
        path = self._journal_path()
        tmp = f"{path}.{os.getpid()}{_TMP_TAG}"
        data = json.dumps(journal, sort_keys=True).encode("utf-8")
        try:
            _write_new(tmp, data, None)
            os.replace(tmp, path)
            _fsync_dir(os.path.dirname(path))
        except BaseException:
            _remove_quietly(tmp)
            raise

    def _replace_files(self, journal: dict, target: Dict[str, bytes], current: Dict[str, bytes]) -> None:
        label = journal["label"]
        made_dirs: List[str] = []
        written: List[str] = []
        try:
            self._write_journal(journal)
            for rel, tmp in journal["write"]:
                path = self._abs(rel)
                folder = os.path.dirname(path)
                missing = []
                while not os.path.lexists(folder):
                    missing.append(folder)
                    folder = os.path.dirname(folder)
                for folder in reversed(missing):
                    os.mkdir(folder)
                    made_dirs.append(folder)
                try:
                    mode = os.lstat(path).st_mode & 0o7777
                except FileNotFoundError:
                    mode = None
                written.append(tmp)
                _write_new(self._abs(tmp), target[rel], mode)
            for folder in {os.path.dirname(self._abs(rel)) for rel, _ in journal["write"]}:
                _fsync_dir(folder)
            journal["phase"] = "replace"
            self._write_journal(journal)
        except BaseException as exc:
            for tmp in written:
                _remove_quietly(self._abs(tmp))
            for folder in reversed(made_dirs):
                try:
                    os.rmdir(folder)
                except OSError:
                    pass
            _remove_quietly(self._journal_path())
            if not isinstance(exc, Exception):
                raise
            raise StoreError(
                f"rollback to {label} stopped before any file was replaced ({_why(exc)}); nothing changed"
            ) from None

        done: List[Tuple[str, str, str]] = []  # (kind, rel, tmp)
        try:
            for rel, tmp in journal["remove"]:
                os.replace(self._abs(rel), self._abs(tmp))  # kept aside until the end
                done.append(("remove", rel, tmp))
            for rel, tmp in journal["write"]:
                if self._unsafe(rel) is not None:
                    raise StoreError(f"{rel} changed into a link or folder during the rollback")
                os.replace(self._abs(tmp), self._abs(rel))
                done.append(("write", rel, tmp))
        except BaseException as exc:
            failed = self._put_back(done, journal, current)
            if not isinstance(exc, Exception):
                raise
            if failed:
                raise StoreError(
                    f"rollback to {label} failed ({_why(exc)}) and {len(failed)} file(s) could not be put back "
                    f"(first: {failed[0]}); the previous files are in snapshot {journal['backup'][:10]}"
                ) from None
            raise StoreError(
                f"rollback to {label} failed ({_why(exc)}); the {len(done)} file(s) already replaced were put back, nothing changed"
            ) from None
        for rel, tmp in journal["remove"]:
            _remove_quietly(self._abs(tmp))

    def _put_back(self, done: List[Tuple[str, str, str]], journal: dict, current: Dict[str, bytes]) -> List[str]:
        """Undo the renames of a failed rollback; returns the paths that could not be put back."""
        failed = []
        journal["phase"] = "putback"  # a kill from here on is reverted by the next command
        try:
            self._write_journal(journal)
        except OSError:
            pass  # then a kill now would be finished forward instead: still all or nothing
        for _, tmp in journal["write"]:
            _remove_quietly(self._abs(tmp))  # not renamed: frees their space for the put-back
        for kind, rel, tmp in reversed(done):
            try:
                if kind == "remove":
                    os.replace(self._abs(tmp), self._abs(rel))
                elif rel in current:
                    path = self._abs(rel)
                    back = self._abs(self._tmp_name(rel))
                    _write_new(back, current[rel], os.lstat(path).st_mode & 0o7777)
                    os.replace(back, path)
                else:
                    os.remove(self._abs(rel))
            except OSError:
                failed.append(rel)
        if not failed:
            _remove_quietly(self._journal_path())
        return failed

    def _recover_locked(self) -> Optional[str]:
        path = self._journal_path()
        try:
            with open(path, "rb") as fh:
                journal = json.loads(fh.read().decode("utf-8"))
            label = str(journal["label"])
            writes = [(str(r), str(t)) for r, t in journal["write"]]
            removes = [(str(r), str(t)) for r, t in journal["remove"]]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"the rollback journal {path} is unreadable ({_why(exc)}); remove it to go on") from None
        for rel, tmp in writes + removes:
            for name in (rel, tmp):
                if self._unsafe(name) is not None:
                    raise StoreError(f"the rollback journal {path} names {name}, which is not a plain file in the project; remove the journal to go on")
        if journal.get("phase") == "putback":
            # killed while putting back a failed rollback: finish putting back
            old = self.store.files(str(journal["backup"]))
            for rel, tmp in removes:
                if os.path.lexists(self._abs(tmp)):
                    os.replace(self._abs(tmp), self._abs(rel))
            for rel, tmp in writes:
                _remove_quietly(self._abs(tmp))
                target = self._abs(rel)
                if rel not in old:
                    _remove_quietly(target)
                    continue
                try:
                    with open(target, "rb") as fh:
                        same = fh.read() == old[rel]
                    mode = os.lstat(target).st_mode & 0o7777
                except FileNotFoundError:
                    same, mode = False, None
                if not same:
                    _write_new(self._abs(tmp), old[rel], mode)
                    os.replace(self._abs(tmp), target)
            _remove_quietly(path)
            return f"an interrupted rollback to {label} was reverted (it had failed and was putting files back)"
        if journal.get("phase") != "replace":
            # killed while the new files were being written: none replaced anything yet
            for _, tmp in writes:
                _remove_quietly(self._abs(tmp))
            _remove_quietly(path)
            return f"an interrupted rollback to {label} was undone (it had replaced no file yet)"
        pending = 0
        for rel, tmp in removes:
            if os.path.lexists(self._abs(rel)) and not os.path.lexists(self._abs(tmp)):
                os.replace(self._abs(rel), self._abs(tmp))
            _remove_quietly(self._abs(tmp))
        for rel, tmp in writes:
            if os.path.lexists(self._abs(tmp)):
                os.replace(self._abs(tmp), self._abs(rel))  # written in full and synced before "replace"
                pending += 1
        self._record(label, str(journal["source"]), str(journal["backup"]), list(journal.get("created", [])), self.scan())
        return f"finished an interrupted rollback to {label} ({pending} of {len(writes)} file(s) were still to be replaced)"



def _utf8_name(rel: str) -> bool:
    """Whether a scanned name (decoded by ``os.fsdecode``, undecodable bytes as surrogates) is UTF-8."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def report_text(report: RunReport) -> str:
    """The site report as commit-message lines, one per site."""
    lines: List[str] = []
    for f in report.files:
        if f.status == "error":
            lines.append(f"error: {f.error}")
        for site in f.sites:
            lines.append(site.describe(f.path))
    return "\n".join(lines) if lines else "(no sites)"


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return " ".join(str(exc).split()) or type(exc).__name__


def _write_new(path: str, data: bytes, mode: Optional[int]) -> None:
    """Write a new file in full and sync it (a partial file is removed). No link is followed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o666)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        _remove_quietly(path)
        raise


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
