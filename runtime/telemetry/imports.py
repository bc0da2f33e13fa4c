"""Run a callback right after a named module is imported (or now, if it already is).

Telemetry patches gymnasium, SummaryWriter, torch and the guard helpers only once the script
imports them, so a script that never imports tensorboard pays nothing for its capture and the
child never imports a heavy package the script does not use. The finder sits first on
``sys.meta_path``, asks the finders after it for the spec, and wraps only the watched modules'
loaders; every other import goes by untouched. A watch is used up when the module is executed,
not when its spec is found: ``importlib.util.find_spec("torch")`` before ``import torch`` (the
launcher's seeding, libraries probing for optional packages) finds a spec nobody loads.
"""
from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import Callable, Dict, List

from scalebox_cst.runtime.loader import import_machinery

Callback = Callable[[object], None]

_watch: Dict[str, List[Callback]] = {}
_busy = threading.local()


def when_imported(name: str, callback: Callback) -> None:
    """``callback(module)`` once ``name`` is imported: immediately if it already is."""
    module = sys.modules.get(name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
        _call(callback, module)
        return
    _watch.setdefault(name, []).append(callback)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def _call(callback: Callback, module: object) -> None:
    try:
        callback(module)
    except Exception as exc:  # telemetry never breaks an import of the user's
        print(f"scalebox: telemetry could not attach to {getattr(module, '__name__', module)}: {exc!r}", file=sys.stderr)


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the callbacks watching its name (attribute reads go to the
    real loader)."""

    def __init__(self, loader, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def __getattr__(self, name):
        return getattr(self._loader, name)


#: ``_Loader.exec_module``'s source, compiled under a file name of the import machinery's. A
#: module's ``warnings.warn(..., stacklevel=2)`` at import names the line that imports it: Python
#: counts the stack levels past the frames of files named like ``importlib._bootstrap``
#: (warnings._is_internal_frame). A frame of this file among them was counted: the warning named
#: this file, and a DeprecationWarning (shown when it names ``__main__``) was hidden in every run
#: of a script importing a watched library (gym, gymnasium, torch, tensorboard) that warns so.
#: Tracebacks leave it out as the engine's import machinery (runtime.loader.import_machinery).
_EXEC_MODULE = """
def exec_module(self, module):
    spec = module.__spec__
    if spec is not None:
        spec.loader = self._loader  # what the module reports as its loader: the real one
    module.__loader__ = self._loader
    self._loader.exec_module(module)
    for callback in _watch.pop(self._name, ()):
        _call(callback, module)
"""
_MACHINERY_FILE = "<frozen importlib._bootstrap (scalebox_cst.runtime.telemetry.imports)>"
_namespace: Dict[str, object] = {"_watch": _watch, "_call": _call}
exec(compile(_EXEC_MODULE, _MACHINERY_FILE, "exec"), _namespace)
_Loader.exec_module = import_machinery(_namespace["exec_module"])  # type: ignore[method-assign]


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        callbacks = _watch.get(fullname)
        if not callbacks or getattr(_busy, "on", False):
            return None
        _busy.on = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            _busy.on = False
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, fullname)
        return spec


_FINDER = _Finder()
