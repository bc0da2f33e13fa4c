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
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Sequence, Tuple

from scalebox_cst import intake
from scalebox_cst.config import CONFIG_FILE, DEFAULT_TOML, STATE_DIR, Config
from scalebox_cst.report import FileReport, RunReport
from scalebox_cst import tmpnames
from scalebox_cst.rollback import (
    JOURNAL_FILE,
    ROLLBACK_TRAILER,
    TMP_TAG,
    Replacer,
    RollbackResult,
    journal_path,
    journal_temporaries,
    locked,
    remove_quietly,
    write_new,
)
from scalebox_cst.store import Store, StoreError
from scalebox_cst.digits import ascii_digits

__all__ = ["ChangeResult", "JOURNAL_FILE", "Project", "RollbackResult", "report_text"]

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


class Project:
    """A project folder with its config and store. ``backend`` is the resolved rewrite target."""

    def __init__(self, root: str, config: Optional[Config] = None, backend: Optional[str] = None) -> None:
        self.root = os.path.realpath(root)
        if not os.path.isdir(self.root):
            raise StoreError(f"{root}: not a directory")
        self.config = config if config is not None else Config.load(self.root)
        self._backend = backend
        self._given_backend = backend
        self._store: Optional[Store] = None
        self._pipeline: Optional[Pipeline] = None
        #: one line per file the last scan left out (``path: why; not snapshotted``)
        self.skipped: List[str] = []

    def reload(self, config: Config) -> None:
        """Use ``config`` from now on (scalebox-watch, after its file changed): the pipeline and
        the backend it names are made again when next asked for."""
        self.config = config
        self._backend = self._given_backend
        self._pipeline = None

    # ------------------------------------------------------------------ set-up
    @classmethod
    def init(cls, root: str) -> Tuple["Project", bool]:
        """Create the store and a documented ``scalebox.toml`` (unless config exists). Idempotent."""
        root = os.path.realpath(root)
        wrote_config = False
        has_pyproject_table = False
        pyproject = os.path.join(root, "pyproject.toml")
        if os.path.lexists(pyproject):
            from scalebox_cst.config import MAX_CONFIG_BYTES
            from scalebox_cst.intake import NotRead, read_named

            try:  # a FIFO must not block init (Config.load then says why it is not read)
                has_pyproject_table = b"[tool.scalebox]" in read_named(pyproject, limit=MAX_CONFIG_BYTES)
            except NotRead:
                has_pyproject_table = True  # not replaced by a scalebox.toml of ours: its error is shown
        config_path = os.path.join(root, CONFIG_FILE)
        if not os.path.exists(config_path) and not has_pyproject_table:
            # whole or not at all: a kill mid-write must not leave a config that cannot be read,
            # and a config another process wrote meanwhile is never replaced
            tmp = tmpnames.sibling(config_path, tmpnames.writer_id(), TMP_TAG)
            try:
                write_new(tmp, DEFAULT_TOML.encode("utf-8"), None)
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
                remove_quietly(tmp)
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

    def store_gone(self) -> bool:
        """Whether the store this project opened was deleted since (``git clean -xdf``, ``rm -r
        .scalebox`` while a watcher runs); then it is forgotten, and the next change makes a new
        one (every write into the old one failed on a missing folder, one cryptic line a save)."""
        if self._store is None or os.path.isdir(os.path.join(self._store.path, "objects")):
            return False
        self._store = None  # (its libgit2 handles are let go with it)
        return True

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

            from scalebox_cst import calibration

            calibration.inject(self.root, self.config)  # the newest calibration run's ranges, as an option (fingerprinted)
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
        """The project's included files (relative ``/`` paths → bytes), in sorted order.

        Listed and read by :mod:`scalebox_cst.intake` (regular files within a size limit; links
        only to snapshotted files); ``self.skipped`` has one line per file left out, and why."""
        files, self.skipped = intake.scan(self.root, self.config)
        return files

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
            blob, key = Store.blob_id(data), Store.cache_key(path, data)
            hit = store.cache_get(key, fingerprint)
            if hit is not None:
                out_blob, report = hit
                try:
                    output = data if out_blob == blob else store.read_blob(out_blob)
                except StoreError:  # a damaged cached output: made again (the cache is only a cache)
                    output = None
                if output is not None:
                    from scalebox_cst.pipeline import FileResult

                    results[path] = FileResult(path, data, output, FileReport.from_json({**report, "path": path}))
                    continue
            result = self.pipeline.rewrite(path, data)
            results[path] = result
            if not result.bad_input:  # bad input is re-checked on every save: it is being edited
                cached = result.report.to_json()
                cached.pop("path")
                fresh.append((key, fingerprint, result.output, cached))
        store.cache_put_many(fresh)  # also puts back among the newest what was found in the cache's older half
        from scalebox_cst import fallbacks

        fallbacks.annotate(self.root, results)  # after the cache: the notes are of the last run, not of the file
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
        out_files = dict(files)
        for path, result in results.items():
            out_files[path] = result.output
        if not created and not force:
            for info in reversed(store.branches()):
                # reused only if it holds what would be committed now: a store that came with the
                # project can hold a branch of the same snapshot whose files are other code
                if (info.source_commit == source_commit and info.fingerprint == fingerprint
                        and store.holds_rewrite(info.commit, source_commit, out_files)):
                    if not store.vouched(info.commit):
                        store.vouch(info.commit)  # checked: the next run takes it without a rewrite
                    report.branch, report.commit = info.name, info.commit
                    return ChangeResult(report, False, outputs=self._outputs(results))
        summary = f"rewrite: {report.summary()}"
        branch, commit = store.commit_rewrite(
            source_commit, out_files, summary, report_text(report), report.to_json(), fingerprint
        )
        report.branch, report.commit = branch, commit
        return ChangeResult(report, True, outputs=self._outputs(results))

    def holds_own_rewrite(self, info) -> bool:
        """Whether run branch ``info``, whose snapshot the working tree still matches, holds what
        this engine writes for those files under the project's config. A store that came with the
        project can hold a branch of that snapshot whose files are other code; ``scalebox run``
        runs the newest branch of an unchanged tree. A branch this user's engine made or checked
        is vouched for (``Store.vouched``: no rewrite); any other is checked once, by rewriting
        the files (cached rewrites are signed), and vouched for where it holds them."""
        store = self.store
        if store.vouched(info.commit):
            return True
        files = self.scan()
        outputs = {path: result.output for path, result in self.rewrite_files(files).items()}
        if not store.holds_rewrite(info.commit, info.source_commit, {**files, **outputs}):
            return False
        try:
            store.vouch(info.commit)
        except (StoreError, OSError):  # a read-only store: checked again next time
            pass
        return True

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
        the project (such paths are reported as skipped). All or nothing, and no file saved during it is replaced: see :mod:`scalebox_cst.rollback`.
        """
        store = self.store
        with locked(self):
            replacer = Replacer(self)
            replacer.recover()
            label, source = self._rollback_source(target)
            return replacer.restore(store.files(source), {}, label, source)

    def undo(self) -> RollbackResult:
        """Revert the newest rollback on the source history: put back the files it replaced
        (its backup snapshot) and remove the files it created, where they are still as it
        wrote them. An undo is a rollback too (snapshotted first, undoable in turn)."""
        store = self.store
        with locked(self):
            replacer = Replacer(self)
            replacer.recover()
            found = store.last_source_trailer(ROLLBACK_TRAILER)
            if found is None:
                raise StoreError("no rollback to undo (the source history has none)")
            commit, value = found
            try:
                meta = json.loads(value)
                backup, label = str(meta["backup"]), str(meta["label"])
                created = [str(p) for p in meta.get("created", [])]
            except (ValueError, KeyError, TypeError, RecursionError):
                raise StoreError(f"the rollback record in snapshot {commit[:10]} is damaged; use `scalebox rollback SNAPSHOT`") from None
            after = store.files(commit)
            remove = {rel: after[rel] for rel in created if rel in after}
            return replacer.restore(store.files(backup), remove, _undo_label(label), backup)

    def recover(self) -> Optional[str]:
        """Finish a rollback that was killed while it replaced files (its journal is still under
        ``.scalebox/``), so no tree stays half-restored. Returns what was done, in one line."""
        if not os.path.exists(journal_path(self)) and not journal_temporaries(self):
            return None
        with locked(self):
            return Replacer(self).recover()

    def _rollback_source(self, target: str) -> Tuple[str, str]:
        """(label, source snapshot commit) for a run branch or a snapshot id."""
        store = self.store
        text = str(target).strip()
        is_run = text.startswith(("run/", "refs/heads/run/"))
        if is_run or ascii_digits(text):
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


def report_text(report: RunReport) -> str:
    """The site report as commit-message lines, one per site."""
    lines: List[str] = []
    for f in report.files:
        if f.status == "error":
            lines.append(f"error: {f.error}")
        for site in f.sites:
            lines.append(site.describe(f.path))
    return "\n".join(lines) if lines else "(no sites)"




_UNDO = "undo of rollback to "
_REDONE = " (redone)"


def _undo_label(label: str) -> str:
    """What an undo of the rollback labelled ``label`` restored: ``undo of rollback to run/0001``;
    an undo of that undo puts the rollback's files back, ``run/0001 (redone)`` (it read "undo of
    rollback to undo of rollback to run/0001", one level more at every undo)."""
    if label.startswith(_UNDO):
        inner = label[len(_UNDO):]
        return inner if inner.endswith(_REDONE) else inner + _REDONE
    return _UNDO + (label[:-len(_REDONE)] if label.endswith(_REDONE) else label)
