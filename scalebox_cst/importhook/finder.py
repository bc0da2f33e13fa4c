"""The finder on ``sys.meta_path``: picks the selected modules and hands them to the loader."""
from __future__ import annotations

import _imp
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
import warnings
from ast import PyCF_ONLY_AST
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from scalebox_cst.config import find_project_root
from scalebox_cst.importhook.cache import _Entry, _read_entry, _write_entry, may_write, note_written, touch
from scalebox_cst.importhook.common import (
    _BUILTIN_FINDERS,
    _NEVER,
    _ORIGINAL,
    _REWRITTEN,
    ScaleboxImportWarning,
    _blob_id,
)
from scalebox_cst.importhook.loader import FORGETTER, RewritingLoader
from scalebox_cst.importhook.session import (
    _ROOTS,
    _SEEN,
    _SESSION_LOCK,
    _Options,
    _Root,
    _session,
)
from scalebox_cst.intake import NotRead, read_module, shown_name
from scalebox_cst.oneline import error_line


# ---------------------------------------------------------------------------- finder
class ImportHook(importlib.abc.MetaPathFinder):
    """The finder ``install_import_hook`` returns; ``uninstall()`` or use it as a context manager."""

    def __init__(
        self, names: Iterable[str], default_root: str, options: _Options, rescan: Optional[Callable[[], Iterable[str]]] = None
    ) -> None:
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
        #: the project's names again, for a selection by project (``packages=()``): a folder of the
        #: project put on sys.path after install (``sys.path.insert(0, "src")``) adds its modules
        self._rescan = rescan
        self._path_seen = list(sys.path)
        #: modules this hook ran rewritten (name -> file): forgotten by the next import after uninstall
        self.served: Dict[str, str] = {}

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
        """Take the hook off ``sys.meta_path`` and record what it ran; imported modules stay, and
        run their rewrites until they are imported or reloaded again (loader.Forgetter)."""
        while self in sys.meta_path:
            sys.meta_path.remove(self)
        if self.served:
            FORGETTER.files.update(self.served)
            self.served.clear()
            if FORGETTER not in sys.meta_path:
                sys.meta_path.insert(0, FORGETTER)
        self.flush()

    def flush(self) -> None:
        """Record the modules served from the cache on this process's session branch now."""
        for root in {id(r): r for r in (v[0] for v in list(self._dirs.values()) if v)}.values():
            try:
                root.flush()
            except Exception as exc:  # noqa: BLE001 - the modules ran; only their record failed
                warnings.warn(
                    f"scalebox: could not record the cached rewrites that ran in {root.root}: {error_line(exc)}",
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
            if self._rescan is None or "." in fullname or sys.path == self._path_seen or not self._newly_selected(fullname):
                return None  # torch, numpy, the standard library: nothing else is looked at
        if self._subtrees is not None and not self._selected(fullname):
            return None
        local = self._local
        if getattr(local, "busy", False):
            return None  # our own lookups and the cold path's imports take the plain route
        # Busy until the spec is made: placing the module may build the project, its pipeline and
        # fingerprint, and what they import (backend detection looks torch up) is plain too.
        local.busy = True
        try:
            spec = self._find_next(fullname, path, target)
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
                self._warn(spec.origin, f"the import hook failed ({error_line(exc)})")
                return spec
        finally:
            local.busy = False

    def _newly_selected(self, top: str) -> bool:
        """Whether ``top`` is a module of the project once sys.path, changed since last looked at,
        is read again (top-level imports only, and only after a change: a list comparison)."""
        self._path_seen = list(sys.path)
        assert self._rescan is not None
        try:
            found = [n for n in self._rescan() if n not in _NEVER]
        except Exception:  # noqa: BLE001 - never break an import
            return False
        self.names = self.names | frozenset(found)
        return top in self.names

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
        later = False
        if self.options.cache:
            if root.known_fingerprint() is None:
                later = True  # the loader looks, when the module runs (see _Root.known_fingerprint)
            else:
                entry, original = self._look_up(spec.origin, root, rel, data)
                if original:
                    return spec
                spec.cached = root.cache_path(rel)
        spec.loader = RewritingLoader(self, root, spec, rel, data, entry)
        spec.loader.look_up = later
        return spec

    def _look_up(self, origin: str, root: _Root, rel: str, data: bytes) -> Tuple[Optional[_Entry], bool]:
        """The module's cache entry, if it holds a rewrite whose commit is not known to be gone,
        and whether the entry says the original runs (warning again of a pipeline error)."""
        cache_path = root.cache_path(rel)
        entry = _read_entry(cache_path, importlib.util.source_hash(data), root.cache_key(create=False))
        if entry is not None and entry.meta.get("rel") != rel:
            entry = None  # written for another module of the same bytes (its name reached through a folder link)
        if entry is None:
            return None, False
        touch(cache_path)  # used: last in the cache's eviction order
        if entry.kind == _ORIGINAL:
            if entry.meta.get("error"):
                self._warn(origin, entry.meta["error"])
            return None, True
        if entry.kind != _REWRITTEN or root.committed_loose(entry.meta) is False:
            return None, False  # (a packed store is read when the module runs: the loader asks)
        return entry, False

    def _read(self, spec, root: _Root, rel: str) -> Optional[bytes]:
        """The module's bytes as a snapshot reads them (``intake.read_module``), else None and a
        warning: what the hook commits never holds the bytes of a file outside the project."""
        try:
            return read_module(spec.origin, root.root, rel, root.config, self._plain_dirs)
        except NotRead as exc:
            if not exc.gone:  # the name as a snapshot's note shows it: escaped, on one line
                self._warn(shown_name(spec.origin), f"{shown_name(rel)}: {exc}; not rewritten")
            return None

    # ---------------------------------------------------------------- the cold path
    def _cold(self, root: _Root, rel: str, filename: str, data: bytes) -> Optional[Tuple[str, object]]:
        """Rewrite, compile, commit, cache. Returns (text, code), or None: the original runs."""
        local = self._local
        local.busy = True
        try:
            return self._cold_unguarded(root, rel, filename, data)
        except Exception as exc:  # noqa: BLE001 - never break an import
            self._warn(filename, f"left unrewritten: {error_line(exc)}")
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
            if not (result.bad_input and _python_refuses(data, filename)):
                self._warn(filename, message)  # (where Python refuses the file, its own error says it all)
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
            why = error_line(exc)  # one cause (a read-only or full store) is said once, not once per module
            self._warn(filename, f"the rewrite could not be committed ({why}); the original runs, as for every later "
                                 "module this stops (said once)", once=("commit", why))
            return None
        meta.update(kind=_REWRITTEN, commit=commit, source_blob=_blob_id(data), output_blob=_blob_id(result.output))
        self._cache(root, rel, source_hash, meta, text, code)
        return text, code

    def _cache(self, root: _Root, rel: str, source_hash: bytes, meta, text: str = "", code=None) -> None:
        if self.options.cache and may_write():  # (under python -B not even the user's key is made)
            written = _write_entry(root.cache_path(rel), source_hash, root.cache_key(create=True), meta, text, code)
            if written:
                note_written(root.cache_dir, written)  # the cache is bounded (importhook.cache.LIMIT_BYTES)

    # ---------------------------------------------------------------- messages
    def _warn(self, filename: str, message: str, once: Optional[object] = None) -> None:
        """One warning per file and message per process (per ``once`` key where given: one
        cause, whatever the file), located at the module's file."""
        key = once if once is not None else (filename, message)
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


def _python_refuses(data: bytes, filename: str) -> bool:
    """Whether Python's own compile of ``data`` fails, as the import that follows will: then the
    module's error is Python's to report, and a warning of ours before it only said it twice."""
    try:
        compile(data, filename, "exec", flags=PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return True
    return False
