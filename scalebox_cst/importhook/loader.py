"""The loader of a selected module: its cached or freshly committed rewrite, else the original."""
from __future__ import annotations

import _imp
import importlib.abc
import importlib.machinery
import importlib.util
import marshal
import types
from typing import TYPE_CHECKING, Dict, Optional

from scalebox_cst.importhook.cache import _Entry
from scalebox_cst.importhook.common import BRANCH_PREFIX
from scalebox_cst.importhook.session import _Root
from scalebox_cst.runtime.loader import (
    Origin,
    SourceBytesLoader,
    forget_source,
    import_machinery,
    install_excepthook,
    register_origin,
    register_source,
)

if TYPE_CHECKING:
    from scalebox_cst.importhook.finder import ImportHook


# ---------------------------------------------------------------------------- loader
class RewritingLoader(SourceBytesLoader):
    """Runs one selected module: its cached or freshly committed rewrite, else the original.

    A :class:`~scalebox_cst.runtime.loader.SourceBytesLoader` over the module's original bytes
    (``get_data``, ``is_package``, the real ``__file__``). The rewrite is decided when the module
    runs (importlib's ``exec_module`` looks ``get_code`` up) or its code or source is asked for:
    finding a spec, or making a module object from it (``importlib.util.module_from_spec``, as a
    lazy importer does), rewrites and commits nothing.
    """

    def __init__(self, hook: "ImportHook", root: _Root, spec, rel: str, data: bytes, entry: Optional[_Entry]) -> None:
        super().__init__(spec.name, spec.origin, data, spec.submodule_search_locations is not None)
        self.hook = hook
        self.root = root
        self.rel = rel
        self.original = spec.loader
        self._entry = entry
        #: whether the cache is to be looked in here: the finder could not (the pipeline
        #: fingerprint was not known without building the pipeline: _Root.known_fingerprint)
        self.look_up = False
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
        entry, original = self._entry, False
        if self.look_up:
            entry, original = self.hook._look_up(self.path, self.root, self.rel, self._source)
            self._entry = entry
        code = None
        if entry is not None and not self.root.committed(entry.meta):
            entry = None  # its commit is gone: rewritten and committed again before it runs
        if entry is not None:
            try:
                code = marshal.loads(entry.code_data)
            except (EOFError, ValueError, TypeError):
                code = None  # verified yet unreadable (another marshal version?): rewrite again
            if type(code) is not types.CodeType:
                entry = None
        if entry is not None:
            # compiled under the path of the import that wrote the entry: this import may reach the
            # file by another (a moved project, a link), and tracebacks, inspect and linecache go by
            # co_filename (CPython fixes its own cached code the same way)
            _imp._fix_co_filename(code, self.path)  # type: ignore[attr-defined]  # (not in typeshed)
            self._text, self._code = entry.text, code
            self.root.record_hit(self.rel, entry.meta, self.hook.session)
        elif not original:
            done = self.hook._cold(self.root, self.rel, self.path, self._source)
            if done is not None:
                self._text, self._code = done
        if self._text is None:
            forget_source(self.path)  # a rewrite an earlier import of the file registered is not what runs
        self._resolved = True

    # create_module: the default module (Loader's); exec_module: importlib's (see
    # SourceBytesLoader), which leaves the import's frames out.

    def get_source(self, fullname: str) -> str:
        self._resolve()
        return self._text if self._text is not None else super().get_source(fullname)

    @property
    def get_code(self):
        """The rewrite is decided here, when importlib's exec_module looks this up to run the
        module (not in create_module: ``module_from_spec`` alone must commit nothing). Where the
        original runs, its own loader's get_code is handed out, so it is called with no frame of
        ours between importlib's, and CPython cuts them all out of the traceback of a
        SyntaxError the module has, as for a plain import."""
        self._resolve()
        return self.original.get_code if self._text is None else self._served_code

    @import_machinery
    def _served_code(self, fullname: str):
        text = self._text
        assert text is not None  # handed out by get_code only where the rewrite runs
        register_source(self.path, text)
        _show_user_lines(self.path, self._source, text, self.hook.session.id)
        self.hook.served[fullname] = self.path  # (see Forgetter)
        return self._code


def _show_user_lines(path: str, original: bytes, text: str, session: str) -> None:
    """Tracebacks through a rewritten module name and quote the user's lines, frames in
    rewritten code marked (runtime.loader.Origin, built only when a traceback needs it); the
    default excepthook would quote the file on disk at the rewritten line numbers."""
    register_origin(path, lambda: Origin(importlib.util.decode_source(original), text, (), BRANCH_PREFIX + session))
    install_excepthook()


class Forgetter(importlib.abc.MetaPathFinder):
    """Put first on ``sys.meta_path`` by ``ImportHook.uninstall`` for the modules the hook ran
    rewritten: when one is imported or reloaded again, another loader (Python's own) runs its
    file, and the rewrite registered for that file (linecache, kept for ever, and the
    excepthook's map of its lines) is forgotten first. Only the hook's loader forgot it, and
    after uninstall a reload ran the user's file while its tracebacks and ``inspect`` quoted the
    rewrite at the file's line numbers. Finds nothing; one dict lookup per import, and it stays
    once emptied (taking a finder off ``sys.meta_path`` while an import walks it skips the next)."""

    def __init__(self) -> None:
        self.files: Dict[str, str] = {}  # module name -> file its rewrite was registered for

    def find_spec(self, fullname: str, path=None, target=None):
        filename = self.files.pop(fullname, None) if self.files else None
        if filename is not None:
            forget_source(filename)
        return None


FORGETTER = Forgetter()
