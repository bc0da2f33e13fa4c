"""This process's session and the project folders it hooks: one ``hook/<session>`` branch per
store, the rewrite and commit of cold modules, the record of cache hits."""
from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
from typing import Dict, List, Optional, Tuple

from scalebox_cst import statedir, tmpnames
from scalebox_cst._version import __version__
from scalebox_cst.config import CONFIG_FILE, MAX_CONFIG_BYTES, STATE_DIR
from scalebox_cst.importhook.cache import _cache_key, _cache_tag, _clear_orphans, may_write
from scalebox_cst.importhook.common import (
    BRANCH_PREFIX,
    CACHE_DIR,
    ENV_SESSION,
    _blob_id,
    _log,
    read_own_file,
    say_once,
)
from scalebox_cst.importhook.fingerprint import _engine_stamps, _stamp
from scalebox_cst.intake import NotRead, read_regular
from scalebox_cst.oneline import error_line


# ---------------------------------------------------------------------------- session
class _Session:
    """This process's record in each project store: one ``hook/<session>`` branch per store.

    The session id comes from the environment when a parent process that installed the hook
    started this one, so its workers append to the parent's branch (retrying on stale parents).
    """

    def __init__(self) -> None:
        inherited = os.environ.get(ENV_SESSION)
        if inherited:
            self.id, self.owner = inherited, False
        else:
            import time

            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime())
            self.id, self.owner = f"{stamp}-{os.getpid()}", True
            os.environ[ENV_SESSION] = self.id
        self.branch = BRANCH_PREFIX + self.id
        self._flush_registered = False
        self.lock = threading.Lock()

    def register_flush(self) -> None:
        with self.lock:
            if self._flush_registered:
                return
            self._flush_registered = True
        atexit.register(_flush_all)


_SESSION: Optional[_Session] = None
_SESSION_LOCK = threading.Lock()
#: modules a hook has decided on (rewritten or not), so they are not reported as imported too early
_SEEN: set = set()
#: one per project folder and set of hook options, shared by the hooks of the process
_ROOTS: Dict[Tuple[str, str], "_Root"] = {}


def _session() -> _Session:
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is None:
            _SESSION = _Session()
        return _SESSION


def _flush_all() -> None:
    for root in list(_ROOTS.values()):
        try:
            root.flush()
        except Exception as exc:  # noqa: BLE001 - at exit there is nobody left to raise to
            _log().warning("scalebox: could not record the imported rewrites of %s: %s", root.root, error_line(exc))


class _Root:
    """One project folder: its fingerprint, bytecode cache, store and session branch."""

    def __init__(self, root: str, options: "_Options") -> None:
        self.root = root
        self.options = options
        self.state_dir = os.path.join(root, STATE_DIR)
        self.cache_dir = os.path.join(self.state_dir, CACHE_DIR)
        self.objects_dir = os.path.join(self.state_dir, "store.git", "objects")
        self.lock = threading.RLock()  # store writes, pipeline and lazy set-up, in this process
        self._fingerprint: Optional[str] = None
        self._project = None
        self._config = None  # the config read without the project (see config())
        self._store = None
        self._snapshot: Optional[str] = None  # this process's latest source snapshot in the store
        self._snapshot_blobs: Dict[str, str] = {}
        self._known_commits: set = set()
        #: modules served from the cache and not yet recorded on the session branch: rel → meta
        self.pending: Dict[str, Dict[str, str]] = {}
        self._tag = _cache_tag()
        self._cache_prefix = os.path.join(self.cache_dir, "")
        self._suffix: Optional[str] = None
        self._key: Optional[bytes] = None

    # ---------------------------------------------------------------- fingerprint
    def fingerprint(self) -> str:
        fp = self._fingerprint
        if fp is None:
            with self.lock:
                if self._fingerprint is None:
                    self._fingerprint = self._load_fingerprint()
                fp = self._fingerprint
        return fp

    def known_fingerprint(self) -> Optional[str]:
        """The pipeline fingerprint where it is known without building the pipeline (worked out
        already, or in its memo: two small files read), else None. What the finder asks: Python
        holds its import lock while a finder looks, and building the pipeline imports (torch,
        libcst); a module another thread was importing meanwhile (the finder waits for it) waited
        for that lock for its own imports, for ever. The loader works the fingerprint out."""
        if self._fingerprint is None and self.options.cache:
            value = self._memo_fingerprint()
            if value:
                self._fingerprint = value  # (two threads may both read it: the same value)
        return self._fingerprint

    def _fast_key(self) -> str:
        """A cheap key for what the pipeline fingerprint depends on (see ``Config.fingerprint``).

        Engine version, config file bytes, the hook's options, and what ``backend = "auto"``
        detection depends on (interpreter, host, device visibility). The transform modules'
        versions are checked by the stamps stored in the memo itself.
        """
        parts = [__version__.encode(), sys.prefix.encode(), os.uname().nodename.encode()]
        for var in (
            "CUDA_VISIBLE_DEVICES",
            "HIP_VISIBLE_DEVICES",
            "ASCEND_RT_VISIBLE_DEVICES",
            "ASCEND_VISIBLE_DEVICES",
            "TORCH_DEVICE_BACKEND_AUTOLOAD",
        ):
            parts.append(f"{var}={os.environ.get(var)}".encode())
        for name in (CONFIG_FILE, "pyproject.toml"):  # Config.load's order: the first found decides
            try:  # as Config.load reads it: a regular file (a FIFO would block the import)
                parts.append(read_regular(os.path.join(self.root, name), follow=True, limit=MAX_CONFIG_BYTES))
                break
            except NotRead:
                parts.append(b"-")
        parts.append(self.options.key.encode())
        return importlib.util.source_hash(b"\0".join(parts)).hex()

    def _memo_fingerprint(self) -> Optional[str]:
        """The fingerprint memo for the current config and transform modules, if there is one."""
        try:
            value, *stamps = read_own_file(self._memo_path()).decode("utf-8", "replace").split("\n")
        except OSError:
            return None
        if value and stamps and all(_stamp(line.split("\t", 1)[0]) == line for line in stamps):
            return value
        return None

    def _memo_path(self) -> str:
        return os.path.join(self.cache_dir, f"fingerprint-{self._fast_key()}")

    def _load_fingerprint(self) -> str:
        """The pipeline fingerprint, from a memo when the config and transform modules are as they were."""
        if self.options.cache:
            value = self._memo_fingerprint()
            if value:
                return value
        value = self.project().pipeline.fingerprint
        if self.options.cache and may_write():
            memo = self._memo_path()
            tmp = tmpnames.sibling(memo, tmpnames.writer_id(thread=True))
            try:
                stamps = _engine_stamps()
                statedir.makedirs(self.cache_dir)
                tmpnames.write_replacing(memo, "\n".join([value, *stamps]).encode("utf-8"), tmp)
                _clear_orphans(memo)
            except OSError as exc:
                say_once(("cache", exc.errno), "scalebox: cannot write %s (%s); continuing without it (said once for this cause)", memo, exc)
                try:
                    os.remove(tmp)
                except OSError:
                    pass
        return value

    def cache_key(self, create: bool) -> Optional[bytes]:
        """The key cache entries are verified with (see ``_read_entry``), read once per process."""
        key = self._key
        if key is None:
            key = self._key = _cache_key(os.path.join(self.state_dir, "store.git"), create)
        return key

    def cache_path(self, rel: str) -> str:
        """``.scalebox/pycache/<dirs>/<name>.<cache tag>-scalebox-<fingerprint>.pyc`` (a name over
        255 bytes keeps a prefix of ``<name>`` and its hash: :func:`tmpnames.fit`)."""
        suffix = self._suffix
        if suffix is None:
            suffix = self._suffix = f".{self._tag}-scalebox-{self.fingerprint()}.pyc"
        stem = rel[:-3] if rel.endswith(".py") else rel
        path = self._cache_prefix + (stem if os.sep == "/" else stem.replace("/", os.sep)) + suffix
        if 4 * (len(stem) - stem.rfind("/") - 1) + len(suffix) > tmpnames.NAME_MAX:  # maybe too long (bytes)
            folder, _, name = path.rpartition(os.sep)
            path = folder + os.sep + tmpnames.fit(name[: -len(suffix)], keep=suffix)
        return path

    # ---------------------------------------------------------------- project and store
    def project(self):
        """The :class:`~scalebox_cst.project.Project` (imported on first use: cold path only)."""
        if self._project is None:
            with self.lock:
                if self._project is None:
                    self._project = self.options.make_project(self.root)
        return self._project

    def committed_loose(self, meta: Dict[str, str]) -> Optional[bool]:
        """Whether a cache entry's rewrite is in the store, as far as a stat tells: True for a
        commit known or found as a loose object (the store writes loose objects and turns off
        auto-gc), False for no commit, None where only reading the store tells (a packed store).

        What the finder asks: Python holds its import lock while a finder looks, and reading the
        store takes the project lock, which a thread rewriting a module holds while it imports
        (the pipeline's and the store's first imports): each waited for the other's lock for ever.
        The loader asks :meth:`committed`, when the module runs, without the import lock."""
        commit = meta.get("commit", "")
        if len(commit) != 40 or commit in self._known_commits:
            return len(commit) == 40
        try:
            os.stat(f"{self.objects_dir}{os.sep}{commit[:2]}{os.sep}{commit[2:]}")
        except OSError:
            return None
        self._known_commits.add(commit)
        return True

    def committed(self, meta: Dict[str, str]) -> bool:
        """Whether a cache entry's rewrite is in the store, in the commit the entry names:
        :meth:`committed_loose`, failing that the store read and the blob at the path compared,
        once per commit and process (never where Python's import lock is held: see there)."""
        found = self.committed_loose(meta)
        if found is None:
            commit = meta["commit"]
            try:
                with self.lock:
                    data = self.store().read_file(commit, meta.get("rel", ""))
                found = data is not None and _blob_id(data) == meta.get("output_blob")
            except Exception:  # noqa: BLE001 - no store, unreadable store, unknown commit
                found = False
            if found:
                self._known_commits.add(commit)
        return found

    def config(self):
        """The project's config, read without building the project: what the finder asks (to
        classify a module reached through a link), where Python's import lock is held and the
        project lock is not to be waited for (see :meth:`committed_loose`)."""
        if self._project is not None:
            return self._project.config
        if self.options.config is not None:
            return self.options.config
        config = self._config
        if config is None:
            from scalebox_cst.config import Config  # (imported with the finder: find_project_root)

            config = self._config = Config.load(self.root)
        return config

    def store(self):
        """The project's store; opened without the pipeline (recording cache hits needs no libcst)."""
        if self._store is None:
            if self._project is not None:
                self._store = self._project.ensure_store()
            else:
                from scalebox_cst.store import Store

                self._store = Store.open(self.root)
        return self._store

    def rewrite(self, rel: str, data: bytes):
        """The pipeline's :class:`FileResult` for one module (the store's rewrite cache first)."""
        with self.lock:
            project = self.project()
            if not project.config.includes(rel):
                return None
            try:
                return project.rewrite_files({rel: data})[rel]
            except Exception as exc:  # noqa: BLE001 - the store's cache is an optimisation
                if type(exc).__name__ != "StoreError":
                    raise
                # No usable store: rewrite anyway; the commit will fail, and say so, only when
                # the module actually changes (an unchanged module needs no commit).
                return project.pipeline.rewrite(rel, data)

    def commit(self, rel: str, data: bytes, result, session: _Session) -> str:
        """Commit ``rel``'s rewrite, with any cache hits still unrecorded, on the session branch.

        Returns the commit, which holds the rewrite at ``rel``: it is committed before it runs.
        """
        from scalebox_cst.store import Store

        with self.lock:
            project = self.project()
            fingerprint = project.pipeline.fingerprint
            files = {rel: result.output}
            sources = {rel: Store.blob_id(data)}
            lines = [site.describe(rel) for site in result.report.sites]
            summary = f"import hook: {rel} ({result.report.status})"
            for prel, meta in self.pending.items():
                if prel not in files and meta.get("fingerprint") == fingerprint:
                    files[prel] = meta["output_blob"]
                    sources[prel] = meta["source_blob"]
                    lines.append(f"{prel}: rewrite served from the import cache (first committed in {meta['commit'][:10]})")
            commit = self._append(files, sources, summary, lines, fingerprint, session)
            self.pending.clear()
            return commit

    def record_hit(self, rel: str, meta: Dict[str, str], session: _Session) -> None:
        """A module served from the cache: its rewrite is in the store already (``meta['commit']``).

        The session branch hears of it lazily: a session's owner records cache hits with its next
        cold commit, at ``flush()``/``uninstall()`` and at exit (importing pygit2 and scanning the
        project would cost a warm import 50 times its own time); a worker process, whose exit
        handlers may never run, records them before the module runs.
        """
        with self.lock:
            self.pending[rel] = meta
        if session.owner:
            session.register_flush()
            return
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001 - the rewrite is committed; only this record failed
            why = error_line(exc)
            say_once(("record", why), "scalebox: could not record %s on %s: %s (said once for this cause)", rel, session.branch, why)

    def flush(self) -> None:
        with self.lock:
            pending = {rel: meta for rel, meta in self.pending.items() if meta.get("output_blob")}
            if not pending:
                self.pending.clear()
                return
            files = {rel: meta["output_blob"] for rel, meta in pending.items()}
            sources = {rel: meta["source_blob"] for rel, meta in pending.items()}
            fingerprint = next(iter(pending.values())).get("fingerprint", "")
            names = ", ".join(sorted(files))
            lines = [f"{rel}: rewrite served from the import cache (first committed in {meta['commit'][:10]})" for rel, meta in sorted(pending.items())]
            self._append(files, sources, f"import hook: {names} (cached)", lines, fingerprint, _session())
            self.pending.clear()

    def _append(self, files, sources: Dict[str, str], summary: str, lines: List[str], fingerprint: str, session: _Session) -> str:
        """Append one commit holding ``files`` to the session branch (created from a snapshot)."""
        store = self.store()
        start = self._snapshot_for(sources, session)
        trailers = f"Scalebox-Source: {start}\nScalebox-Pipeline: {fingerprint}\nScalebox-Session: {session.id}"
        message = "\n\n".join(p for p in (summary, "\n".join(lines), trailers) if p) + "\n"
        commit, _ = store.commit_to_branch(session.branch, files, message, start)
        return commit

    def _snapshot_for(self, sources: Dict[str, str], session: _Session) -> str:
        """A source snapshot holding the sources that ran (``rel`` → blob id).

        This process's last snapshot, else the store's ``source`` tip, when they hold them;
        otherwise a new snapshot of the project (which takes the pipeline's imports to scan).
        """
        if self._snapshot is not None and all(self._snapshot_blobs.get(r) == b for r, b in sources.items()):
            return self._snapshot
        store = self.store()
        tip = store.source_tip()
        if tip is not None:
            held = {rel: store.read_file(tip, rel) for rel in sources}
            if all(data is not None and _blob_id(data) == sources[rel] for rel, data in held.items()):
                self._snapshot, self._snapshot_blobs = tip, dict(sources)
                return tip
        files = self.project().scan()
        commit, _ = store.snapshot(files, f"import hook session {session.id}")
        self._snapshot = commit
        self._snapshot_blobs = {rel: _blob_id(data) for rel, data in files.items()}
        return commit


class _Options:
    """How a hook rewrites: config, backend, transforms; ``key`` names them for the fingerprint memo."""

    def __init__(self, config=None, backend: Optional[str] = None, transforms=None, cache: bool = True) -> None:
        self.config = config
        self.backend = backend
        self.transforms = list(transforms) if transforms is not None else None
        self.cache = cache
        parts = [f"backend={backend}"]
        if config is not None:
            import dataclasses
            import json

            data = {k: v for k, v in dataclasses.asdict(config).items() if k != "source"}
            parts.append("config=" + json.dumps(data, sort_keys=True, default=str))
        if self.transforms is not None:
            parts.append("transforms=" + ",".join(f"{type(t).__module__}.{type(t).__qualname__}:{t.id}:{t.version}" for t in self.transforms))
        self.key = "\n".join(parts)

    def make_project(self, root: str):
        from scalebox_cst.pipeline import Pipeline
        from scalebox_cst.project import Project

        project = Project(root, config=self.config, backend=self.backend)
        if self.transforms is not None:
            # Project builds its pipeline from the registry; a hook given its own transforms
            # (tests, plug-ins) runs exactly those, with the project's options.
            config = project.config.replace(transforms=[t.id for t in self.transforms], disabled=[])
            project._pipeline = Pipeline(config, project.backend, self.transforms)
        return project



def _after_fork_in_child() -> None:
    # A forked worker may never run exit handlers: it records cache hits before they run, and
    # reopens the store (locks held by other threads at fork time are fresh here).
    if _SESSION is not None:
        _SESSION.owner = False
        _SESSION.lock = threading.Lock()
    for root in _ROOTS.values():
        root.lock = threading.RLock()
        root._project = root._store = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
