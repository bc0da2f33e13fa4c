"""Rewrite a project's modules as they are imported; every rewrite is committed before it runs.

``install_import_hook(packages=[...])`` puts a finder first on ``sys.meta_path``. It bails out on
the top-level name, so torch, numpy and the standard library cost one set lookup. A selected
module goes through the watcher's pipeline and store (``Project``), and runs through the
executor's loader (``runtime.loader``), its rewritten source registered for tracebacks and
``inspect``. A warm import reads a hash-checked bytecode file from ``.scalebox/pycache/`` and
imports neither libcst nor pygit2: that keeps it near the cost of a plain cached import.
"""
from __future__ import annotations

import _imp
import atexit
import hmac as _hmac
import builtins
import importlib.abc
import importlib.machinery
import importlib.util
import marshal
import os
import sys
import threading
import types
import warnings
from io import FileIO as _FileIO  # unbuffered: one fstat and one read per file
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from scalebox_cst import tmpnames
from scalebox_cst._version import __version__
from scalebox_cst.config import CONFIG_FILE, MAX_CONFIG_BYTES, STATE_DIR, find_project_root
from scalebox_cst.intake import NotRead, read_module, read_regular
from scalebox_cst.runtime.loader import Origin, SourceBytesLoader, install_excepthook, register_origin, register_source

# The names below mirror scalebox_cst.project / scalebox_cst.config; importing those here would
# pull libcst and pygit2 into every hooked process (≈180 ms) before anything is known to be cold.
CACHE_DIR = "pycache"
BRANCH_PREFIX = "hook/"

#: set in the environment of a process that installs the hook; children that install it too
#: (spawn workers, DataLoader workers) join the same session and commit to the same branch
ENV_SESSION = "SCALEBOX_HOOK_SESSION"
#: how ``python -m scalebox_cst`` ran its script, so spawn children re-run it rewritten
ENV_MAIN = "SCALEBOX_HOOK_MAIN"
#: the module multiprocessing re-runs as ``__mp_main__`` in spawn children (see _spawn_main.py)
SPAWN_MAIN = "scalebox_cst._spawn_main"

_FORMAT = importlib.util.MAGIC_NUMBER + b"SBX2"
CACHE_KEY_FILE = "scalebox-cache.key"
_REWRITTEN, _ORIGINAL = "rewritten", "original"
#: never hooked: the engine itself (its cold path imports it) and the interpreter's own modules
_NEVER = frozenset({"scalebox_cst", "__main__", "__mp_main__"})


_BUILTIN_FINDERS = (importlib.machinery.BuiltinImporter, importlib.machinery.FrozenImporter)


class ScaleboxImportWarning(UserWarning):
    """A selected module ran unrewritten (pipeline error, store error, imported too early)."""


# ---------------------------------------------------------------------------- helpers
def _cache_tag() -> str:
    tag = sys.implementation.cache_tag or "python"
    return f"{tag}.opt-{sys.flags.optimize}" if sys.flags.optimize else tag


def _log():
    import logging

    return logging.getLogger(__name__)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


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

    Layout: magic + b"SBX2" | source hash (8) | MAC (32) | meta length (4) | ``key=value`` lines |
    text length (4) | rewritten text (UTF-8) | marshalled code object. The MAC is HMAC-SHA256,
    keyed by the store's cache key, over everything but itself: a truncated or cut entry, random
    or empty code, or code planted by anything that cannot read the store fails it before
    ``marshal`` sees a byte. (About 1.3 us per kB here: a warm import stays near plain cost.)
    """
    if key is None:
        return None
    try:
        with _FileIO(path) as fh:
            data = fh.readall()
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


def _write_entry(path: str, source_hash: bytes, key: Optional[bytes], meta: Dict[str, str], text: str = "", code=None) -> None:
    """Write a cache file atomically (temp file + ``os.replace``); errors are logged, not raised.
    Without a cache key (no store to keep it in) nothing is written: the entry could not be
    verified when read."""
    if key is None:
        return
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
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(payload)
        os.replace(tmp, path)
    except OSError as exc:
        _log().warning("scalebox: cannot write the import cache file %s (%s); continuing without it", path, exc)
        try:
            os.remove(tmp)
        except OSError:
            pass
        return
    _clear_orphans(path)


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
    """The store's key for cache entries (32 random bytes in ``store.git/scalebox-cache.key``),
    made on first use by ``create``; None when there is no store or the key is unreadable."""
    path = os.path.join(store_dir, CACHE_KEY_FILE)
    try:
        with _FileIO(path) as fh:
            key = fh.readall()
        if len(key) == 32:
            return key
        if not create:
            return None
        os.remove(path)  # damaged: a new key only makes the old entries miss
    except FileNotFoundError:
        if not create or not os.path.isdir(store_dir):
            return None
    except OSError:
        return None
    tmp = tmpnames.sibling(path, tmpnames.writer_id(thread=True))
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, os.urandom(32))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # never replaces a key another process made meanwhile
        except FileExistsError:
            pass
        finally:
            os.remove(tmp)
        with _FileIO(path) as fh:
            key = fh.readall()
        return key if len(key) == 32 else None
    except OSError as exc:
        _log().warning("scalebox: cannot make the import cache key %s (%s); continuing without the cache", path, exc)
        return None


def _transforms_stamps() -> List[str]:
    """``path<TAB>size<TAB>mtime_ns`` for the transform modules and their folder.

    Their versions are part of the pipeline fingerprint; the folder's mtime catches a module
    added or removed. Called on a fingerprint miss only (the registry is imported by then).
    """
    module = sys.modules.get("scalebox_cst.transforms")
    folders = list(getattr(module, "__path__", None) or [])
    if not folders:
        spec = importlib.util.find_spec("scalebox_cst.transforms")
        folders = list(spec.submodule_search_locations or []) if spec else []
    paths: List[str] = []
    for folder in folders:
        paths.append(folder)
        with os.scandir(folder) as it:
            paths.extend(sorted(e.path for e in it if e.name.endswith(".py")))
    return [_stamp(p) for p in paths]


def _stamp(path: str) -> str:
    try:
        st = os.stat(path)
        return f"{path}\t{st.st_size}\t{st.st_mtime_ns}"
    except OSError:
        return f"{path}\t-\t-"


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
            _log().warning("scalebox: could not record the imported rewrites of %s: %s", root.root, _one_line(exc))


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
            with open(self._memo_path(), "rb") as fh:  # binary: a text codec lookup is an import
                value, *stamps = fh.read().decode("utf-8", "replace").split("\n")
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
        if self.options.cache:
            memo = self._memo_path()
            tmp = tmpnames.sibling(memo, tmpnames.writer_id(thread=True))
            try:
                stamps = _transforms_stamps()
                os.makedirs(self.cache_dir, exist_ok=True)
                with open(tmp, "wb") as fh:
                    fh.write("\n".join([value, *stamps]).encode("utf-8"))
                os.replace(tmp, memo)
                _clear_orphans(memo)
            except OSError as exc:
                _log().warning("scalebox: cannot write %s (%s); continuing without it", memo, exc)
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

    def committed(self, meta: Dict[str, str]) -> bool:
        """Whether a cache entry's rewrite is in the store, in the commit the entry names.

        A stat of the commit's loose object (the store writes loose objects and turns off
        auto-gc); failing that (a packed store), the store is read and the blob at the path
        compared, once per commit and process.
        """
        commit = meta.get("commit", "")
        if len(commit) != 40 or commit in self._known_commits:
            return len(commit) == 40
        try:
            os.stat(f"{self.objects_dir}{os.sep}{commit[:2]}{os.sep}{commit[2:]}")
            found = True
        except OSError:
            found = False
        if not found:
            try:
                with self.lock:
                    data = self.store().read_file(commit, meta.get("rel", ""))
                found = data is not None and _blob_id(data) == meta.get("output_blob")
            except Exception:  # noqa: BLE001 - no store, unreadable store, unknown commit
                found = False
        if found:
            self._known_commits.add(commit)
        return found

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
            _log().warning("scalebox: could not record %s on %s: %s", rel, session.branch, _one_line(exc))

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


# ---------------------------------------------------------------------------- loader
class RewritingLoader(SourceBytesLoader):
    """Runs one selected module: its cached or freshly committed rewrite, else the original.

    A :class:`~scalebox_cst.runtime.loader.SourceBytesLoader` over the module's original bytes
    (``get_data``, ``is_package``, the real ``__file__``); the rewrite is decided on first use,
    so finding a spec commits nothing.
    """

    def __init__(self, hook: "ImportHook", root: _Root, spec, rel: str, data: bytes, entry: Optional[_Entry]) -> None:
        super().__init__(spec.name, spec.origin, data, spec.submodule_search_locations is not None)
        self.hook = hook
        self.root = root
        self.rel = rel
        self.original = spec.loader
        self._entry = entry
        self._resolved = False
        self._text: Optional[str] = None  # rewritten source; None: the original runs
        self._code = None

    @property
    def rewritten(self) -> bool:
        self._resolve()
        return self._text is not None

    def _resolve(self) -> None:
        if self._resolved:
            return
        with self.root.lock:  # the import holds the module's lock; inspect may ask from elsewhere
            if not self._resolved:
                self._resolve_once()

    def _resolve_once(self) -> None:
        entry = self._entry
        code = None
        if entry is not None:
            try:
                code = marshal.loads(entry.code_data)
            except (EOFError, ValueError, TypeError):
                code = None  # verified yet unreadable (another marshal version?): rewrite again
            if type(code) is not types.CodeType:
                entry = None
        if entry is not None:
            self._text, self._code = entry.text, code
            self.root.record_hit(self.rel, entry.meta, self.hook.session)
        else:
            done = self.hook._cold(self.root, self.rel, self.path, self._source)
            if done is not None:
                self._text, self._code = done
        self._resolved = True

    def get_source(self, fullname: str) -> str:
        self._resolve()
        return self._text if self._text is not None else super().get_source(fullname)

    def get_code(self, fullname: str):
        self._resolve()
        if self._text is None:
            return self.original.get_code(fullname)
        register_source(self.path, self._text)
        _show_user_lines(self.path, self._source, self._text, self.hook.session.id)
        return self._code

    def exec_module(self, module) -> None:
        exec(self.get_code(module.__name__), module.__dict__)


def _show_user_lines(path: str, original: bytes, text: str, session: str) -> None:
    """Tracebacks through a rewritten module name and quote the user's lines, frames in
    rewritten code marked (runtime.loader.Origin, built only when a traceback needs it); the
    default excepthook would quote the file on disk at the rewritten line numbers."""
    register_origin(path, lambda: Origin(importlib.util.decode_source(original), text, (), BRANCH_PREFIX + session))
    install_excepthook()


# ---------------------------------------------------------------------------- finder
class ImportHook(importlib.abc.MetaPathFinder):
    """The finder ``install_import_hook`` returns; ``uninstall()`` or use it as a context manager."""

    def __init__(self, names: Iterable[str], default_root: str, options: _Options) -> None:
        names = [n for n in names if n.partition(".")[0] not in _NEVER]
        #: top-level names: the only thing looked at for an import that is not selected
        self.names = frozenset(n.partition(".")[0] for n in names)
        # dotted selections ("agents.policies") narrow their top-level name to those subtrees
        dotted = [n for n in names if "." in n and n.partition(".")[0] not in names]
        self._subtrees = tuple(dict.fromkeys(dotted)) or None
        self.default_root = os.path.realpath(default_root)
        self._root_prefix = os.path.join(self.default_root, "")
        self.options = options
        self.session = _session()
        self._dirs: Dict[str, Optional[Tuple[_Root, str]]] = {}
        self._plain_dirs: Dict[str, bool] = {}  # intake.read_module's cache
        self._local = threading.local()
        self._warned: set = set()
        self._warn_lock = threading.Lock()

    # ---------------------------------------------------------------- public
    def install(self) -> "ImportHook":
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)
        return self

    def prepare(self) -> None:
        """Per-process set-up done once at install: the project's pipeline fingerprint, if its memo
        is valid (reading two small files), so the first selected import does not pay for it. A
        missing memo is left to the first import that needs it (it takes the pipeline)."""
        state = self._root_state(self.default_root)
        if self.options.cache and state._fingerprint is None:
            with state.lock:
                if state._fingerprint is None:
                    state._fingerprint = state._memo_fingerprint()

    def uninstall(self) -> None:
        """Take the hook off ``sys.meta_path`` and record what it ran; imported modules stay."""
        while self in sys.meta_path:
            sys.meta_path.remove(self)
        self.flush()

    def flush(self) -> None:
        """Record the modules served from the cache on this process's session branch now."""
        for root in {id(r): r for r in (v[0] for v in list(self._dirs.values()) if v)}.values():
            try:
                root.flush()
            except Exception as exc:  # noqa: BLE001 - the modules ran; only their record failed
                warnings.warn(
                    f"scalebox: could not record the cached rewrites that ran in {root.root}: {_one_line(exc)}",
                    ScaleboxImportWarning,
                    stacklevel=2,
                )

    def is_live(self) -> bool:
        """Whether imports reach the hook: on ``sys.meta_path`` ahead of the PathFinder."""
        meta = sys.meta_path
        if self not in meta:
            return False
        finders = [i for i, f in enumerate(meta) if f is importlib.machinery.PathFinder]
        return not finders or meta.index(self) < finders[0]

    @property
    def branch(self) -> str:
        """The session branch rewrites are committed to (``hook/<session>``), in each store."""
        return self.session.branch

    def __enter__(self) -> "ImportHook":
        return self

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def __repr__(self) -> str:
        return f"<ImportHook {sorted(self.names)} project={self.default_root}>"

    # ---------------------------------------------------------------- finding
    def find_spec(self, fullname: str, path=None, target=None):
        if fullname.partition(".")[0] not in self.names:
            return None  # torch, numpy, the standard library: nothing else is looked at
        if self._subtrees is not None and not self._selected(fullname):
            return None
        local = self._local
        if getattr(local, "busy", False):
            return None  # our own lookups and the cold path's imports take the plain route
        local.busy = True
        try:
            spec = self._find_next(fullname, path, target)
        finally:
            local.busy = False
        # Another hook's loader (pytest's assertion rewriting, a zip importer, an extension
        # module) keeps the module: two rewriters cannot share one source.
        if spec is None or type(spec.loader) is not importlib.machinery.SourceFileLoader or not spec.origin:
            return spec
        try:
            located = self._locate(fullname, spec.origin)
            if located is None:
                return spec
            return self._hooked_spec(spec, *located)
        except Exception as exc:  # noqa: BLE001 - never break an import
            self._warn(spec.origin, f"the import hook failed ({_one_line(exc)})")
            return spec

    def _selected(self, fullname: str) -> bool:
        top = fullname.partition(".")[0]
        narrowed = [p for p in self._subtrees if p.partition(".")[0] == top]
        if not narrowed:
            return True  # selected as a whole
        return any(fullname == p or fullname.startswith(p + ".") for p in narrowed)

    def _find_next(self, fullname: str, path, target):
        """The spec the finders after this one would give (what the import would use without us)."""
        meta = sys.meta_path
        try:
            start = meta.index(self) + 1
        except ValueError:
            start = 0
        skip_builtin = fullname not in sys.builtin_module_names and not _imp.is_frozen(fullname)
        for finder in meta[start:]:
            if finder is self or (skip_builtin and finder in _BUILTIN_FINDERS):
                continue  # a project module is neither built in nor frozen: skip their lookups
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def _locate(self, fullname: str, origin: str) -> Optional[Tuple[_Root, str]]:
        folder, _, base = origin.rpartition(os.sep)
        if not base.endswith(".py"):
            return None
        try:
            hit = self._dirs[folder]
        except KeyError:
            hit = self._dirs[folder] = self._place(fullname, origin, folder)
        if hit is None:
            return None
        return hit[0], hit[1] + base

    def _place(self, fullname: str, origin: str, folder: str) -> Optional[Tuple[_Root, str]]:
        """The project a folder of modules belongs to and the folder's ``/`` prefix in it."""
        root = self.default_root
        if folder == root:
            return self._root_state(root), ""
        if folder.startswith(self._root_prefix) and os.sep + "." not in folder[len(root) :]:
            # plainly inside the project: no realpath (several lstat calls) needed
            return self._root_state(root), folder[len(self._root_prefix) :].replace(os.sep, "/") + "/"
        real = os.path.realpath(folder)
        rel = os.path.relpath(real, root)
        if rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
            # A named package outside the caller's project: the project around that package.
            top = real
            depth = fullname.count(".") + (1 if os.path.basename(origin) == "__init__.py" else 0)
            for _ in range(depth):
                top = os.path.dirname(top)
            root = os.path.realpath(find_project_root(top))
            rel = os.path.relpath(real, root)
            if rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
                return None
        prefix = "" if rel == os.curdir else rel.replace(os.sep, "/") + "/"
        return self._root_state(root), prefix

    def _root_state(self, root: str) -> _Root:
        key = (root, self.options.key)
        with _SESSION_LOCK:
            state = _ROOTS.get(key)
            if state is None:
                state = _ROOTS[key] = _Root(root, self.options)
            return state

    def _hooked_spec(self, spec, root: _Root, rel: str):
        _SEEN.add(spec.name)
        data = self._read(spec, root, rel)
        if data is None:
            return spec  # not a file the project snapshots: Python imports it as it would
        if len(data) < 64 and not data.strip():
            return spec  # an empty module (most ``__init__.py``): nothing to rewrite, nothing to read
        entry = None
        if self.options.cache:
            cache_path = root.cache_path(rel)
            entry = _read_entry(cache_path, importlib.util.source_hash(data), root.cache_key(create=False))
            if entry is not None:
                if entry.kind == _ORIGINAL:
                    if entry.meta.get("error"):
                        self._warn(spec.origin, entry.meta["error"])
                    return spec
                if entry.kind != _REWRITTEN or not root.committed(entry.meta):
                    entry = None
            spec.cached = cache_path
        spec.loader = RewritingLoader(self, root, spec, rel, data, entry)
        return spec

    def _read(self, spec, root: _Root, rel: str) -> Optional[bytes]:
        """The module's bytes as a snapshot reads them (``intake.read_module``), else None and a
        warning: what the hook commits never holds the bytes of a file outside the project."""
        try:
            return read_module(spec.origin, root.root, rel, lambda: root.project().config, self._plain_dirs)
        except NotRead as exc:
            if not exc.gone:
                self._warn(spec.origin, f"{rel}: {exc}; not rewritten")
            return None

    # ---------------------------------------------------------------- the cold path
    def _cold(self, root: _Root, rel: str, filename: str, data: bytes) -> Optional[Tuple[str, object]]:
        """Rewrite, compile, commit, cache. Returns (text, code), or None: the original runs."""
        local = self._local
        local.busy = True
        try:
            return self._cold_unguarded(root, rel, filename, data)
        except Exception as exc:  # noqa: BLE001 - never break an import
            self._warn(filename, f"left unrewritten: {_one_line(exc)}")
            return None
        finally:
            local.busy = False

    def _cold_unguarded(self, root: _Root, rel: str, filename: str, data: bytes):
        source_hash = importlib.util.source_hash(data)
        meta = {"rel": rel, "fingerprint": root.fingerprint()}
        result = root.rewrite(rel, data)
        if result is None:  # excluded by the project's config
            self._cache(root, rel, source_hash, {**meta, "kind": _ORIGINAL, "why": "excluded"})
            return None
        if result.report.status == "error":
            message = result.report.error or "the pipeline failed"
            self._warn(filename, message)
            if not result.bad_input:
                self._cache(root, rel, source_hash, {**meta, "kind": _ORIGINAL, "error": message})
            return None
        if not result.changed:
            self._cache(root, rel, source_hash, {**meta, "kind": _ORIGINAL})
            return None
        text = importlib.util.decode_source(result.output)
        code = compile(text, filename, "exec", dont_inherit=True)
        try:
            commit = root.commit(rel, data, result, self.session)  # before it runs
        except Exception as exc:  # noqa: BLE001
            self._warn(filename, f"the rewrite could not be committed ({_one_line(exc)}); the original runs")
            return None
        meta.update(kind=_REWRITTEN, commit=commit, source_blob=_blob_id(data), output_blob=_blob_id(result.output))
        self._cache(root, rel, source_hash, meta, text, code)
        return text, code

    def _cache(self, root: _Root, rel: str, source_hash: bytes, meta, text: str = "", code=None) -> None:
        if self.options.cache:
            _write_entry(root.cache_path(rel), source_hash, root.cache_key(create=True), meta, text, code)

    # ---------------------------------------------------------------- messages
    def _warn(self, filename: str, message: str) -> None:
        """One warning per file and message per process, located at the module's file."""
        key = (filename, message)
        with self._warn_lock:
            if key in self._warned:
                return
            self._warned.add(key)
        warnings.warn_explicit(f"scalebox: {filename}: {message}", ScaleboxImportWarning, filename, 1)

    def warn_early_imports(self, stacklevel: int = 3) -> List[str]:
        """Warn, naming them, about selected modules that were imported before the hook."""
        early = []
        for name, module in list(sys.modules.items()):
            if name in _SEEN or name.partition(".")[0] not in self.names:
                continue
            if self._subtrees is not None and not self._selected(name):
                continue
            if type(getattr(getattr(module, "__spec__", None), "loader", None)) is not importlib.machinery.SourceFileLoader:
                continue  # rewritten already, or another hook's (pytest's conftest): not ours to warn about
            origin = getattr(module, "__file__", None)
            if isinstance(origin, str) and origin.endswith(".py"):
                try:
                    if self._locate(name, origin) is not None:
                        early.append(name)
                except Exception:  # noqa: BLE001
                    continue
        if early:
            early.sort()
            warnings.warn(
                "scalebox: imported before the import hook was installed, so they run unrewritten: " + ", ".join(early),
                ScaleboxImportWarning,
                stacklevel=stacklevel,
            )
        return early


def _blob_id(data: bytes) -> str:
    """The git blob id of ``data`` (``Store.blob_id``, without importing pygit2)."""
    import hashlib

    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# ---------------------------------------------------------------------------- installing
def _project_names(folders: Iterable[str]) -> List[str]:
    """Top-level module and package names found directly in ``folders`` (not the stdlib's)."""
    taken = set(sys.stdlib_module_names) | set(sys.builtin_module_names) | _NEVER
    names = set()
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                continue
            try:
                if name.endswith(".py") and entry.is_file():
                    name = name[:-3]
                elif not entry.is_dir() or name == "__pycache__":
                    continue  # a folder: a package, or a namespace package of project modules
            except OSError:
                continue
            if name.isidentifier() and name not in taken:
                names.add(name)
    return sorted(names)


def _within(path: str, root: str) -> bool:
    rel = os.path.relpath(path, root)
    return not (rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel))


def install_import_hook(
    packages: Sequence[str] = (),
    *,
    project: Optional[str] = None,
    config=None,
    backend: Optional[str] = None,
    transforms=None,
    cache: bool = True,
) -> ImportHook:
    """Rewrite ``packages`` (top-level names) as they are imported; ``()``: the caller's project.

    ``project``: the project folder (default: found from the calling script's ``__file__``, else
    the working directory). ``config``/``backend``/``transforms`` override the project's
    (``transforms``: Transform instances instead of the registry). ``cache=False`` skips the
    bytecode cache in ``.scalebox/pycache/`` (the store's rewrite cache still applies).
    Returns the installed :class:`ImportHook`; ``hook.uninstall()`` or ``with`` removes it.
    """
    if isinstance(packages, str):
        packages = [packages]
    if project is None:
        caller = sys._getframe(1).f_globals.get("__file__")
        start = os.path.dirname(os.path.abspath(caller)) if isinstance(caller, str) else os.getcwd()
        project = find_project_root(start)
    root = os.path.realpath(project)
    if packages:
        names = list(packages)
    else:
        folders = [root] + [
            os.path.realpath(p or os.getcwd()) for p in sys.path if isinstance(p, str) and _within(os.path.realpath(p or os.getcwd()), root)
        ]
        names = _project_names(dict.fromkeys(folders))
    hook = ImportHook(names, root, _Options(config, backend, transforms, cache))
    hook.prepare()
    hook.install()
    if not hook.is_live():
        warnings.warn(f"scalebox: the import hook is not ahead of the PathFinder on sys.meta_path: {sys.meta_path!r}", ScaleboxImportWarning, stacklevel=2)
    hook.warn_early_imports(stacklevel=3)
    return hook


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


# ---------------------------------------------------------------------------- scripts
def script_code(hook: ImportHook, path: str):
    """The code to run for a script file under the hook: its committed rewrite, else the original."""
    path = os.path.abspath(path)
    with open(path, "rb") as fh:
        data = fh.read()
    located = None
    try:
        located = hook._locate("__main__", path)
    except Exception as exc:  # noqa: BLE001
        hook._warn(path, f"the import hook failed ({_one_line(exc)})")
    if located is not None:
        root, rel = located
        spec = importlib.machinery.ModuleSpec("__main__", importlib.machinery.SourceFileLoader("__main__", path), origin=path)
        spec.has_location = True
        try:
            hooked = hook._hooked_spec(spec, root, rel)
        except Exception as exc:  # noqa: BLE001
            hook._warn(path, f"the import hook failed ({_one_line(exc)})")
            hooked = spec
        loader = hooked.loader
        if isinstance(loader, RewritingLoader) and loader.rewritten:
            return loader.get_code("__main__")
    return compile(data, path, "exec", dont_inherit=True)


def run_script(script: str, args: Sequence[str], packages: Sequence[str] = (), project: Optional[str] = None, backend: Optional[str] = None, cache: bool = True) -> None:
    """Run ``script`` as ``__main__`` with the hook on (``python -m scalebox_cst``)."""
    import json
    import types

    path = os.path.abspath(script)
    if not os.path.isfile(path):
        sys.stderr.write(f"scalebox: {script}: no such file\n")
        raise SystemExit(2)
    root = os.path.realpath(project) if project else find_project_root(path)
    sys.argv[:] = [script, *args]
    sys.path[0] = os.path.dirname(path)
    os.environ[ENV_MAIN] = json.dumps(
        {"script": path, "packages": list(packages), "project": root, "backend": backend, "cache": cache}
    )
    hook = install_import_hook(packages, project=root, backend=backend, cache=cache)
    main = types.ModuleType("__main__")
    # The spec names _spawn_main: multiprocessing's spawn children re-run the script through it.
    main.__dict__.update(
        __file__=path,
        __cached__=None,
        __builtins__=builtins,
        __spec__=importlib.machinery.ModuleSpec(SPAWN_MAIN, None, origin=path),
    )
    sys.modules["__main__"] = main
    code = script_code(hook, path)
    exec(code, main.__dict__)


def _run_spawned_main(namespace: dict) -> None:
    """Body of ``scalebox_cst._spawn_main`` run as ``__mp_main__`` in a spawn child."""
    import json

    try:
        settings = json.loads(os.environ.get(ENV_MAIN, ""))
    except ValueError:
        return
    path = settings["script"]
    hook = install_import_hook(
        settings.get("packages") or (), project=settings["project"], backend=settings.get("backend"), cache=settings.get("cache", True)
    )
    namespace.update(__file__=path, __cached__=None, __package__=None)
    exec(script_code(hook, path), namespace)

