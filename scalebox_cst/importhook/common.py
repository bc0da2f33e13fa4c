"""Names the parts of the import hook share: environment variables, the branch prefix, the
warning it gives, and small helpers that import nothing heavy."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util

from scalebox_cst.intake import open_regular

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

#: SBX3: entries before it may hold another file's rewrite (the store's rewrite cache served a file
#: of the same bytes elsewhere its rewrite, site names included: store.cache.cache_key)
_FORMAT = importlib.util.MAGIC_NUMBER + b"SBX3"
_REWRITTEN, _ORIGINAL = "rewritten", "original"
#: never hooked: the engine itself (its cold path imports it) and the interpreter's own modules
_NEVER = frozenset({"scalebox_cst", "__main__", "__mp_main__"})


_BUILTIN_FINDERS = (importlib.machinery.BuiltinImporter, importlib.machinery.FrozenImporter)


class ScaleboxImportWarning(UserWarning):
    """A selected module ran unrewritten (pipeline error, store error, imported too early)."""


def _log():
    import logging

    return logging.getLogger("scalebox_cst.importhook")



#: causes already said (see :func:`say_once`)
_SAID: set = set()


def say_once(key: object, message: str, *args: object) -> None:
    """A warning through the hook's logger once per process for ``key``: one cause (a read-only
    or full cache folder or store) is one line, however many modules meet it after the first.
    (``set.add`` is atomic: two threads may at worst both say it.)"""
    if key in _SAID:
        return
    _SAID.add(key)
    _log().warning(message, *args)


def read_own_file(path: str) -> bytes:
    """The bytes of one of the hook's own files (a cache entry, the fingerprint memo) if it is a
    regular file; OSError otherwise (``intake.NotRegularFile`` for a FIFO or the like, which a
    plain ``open`` would block on for ever, hanging every import of the project)."""
    with open_regular(path, "rb", buffering=0) as fh:  # unbuffered: one fstat and one read, as FileIO
        return fh.readall()


def _blob_id(data: bytes) -> str:
    """The git blob id of ``data`` (``Store.blob_id``, without importing pygit2)."""
    import hashlib

    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
