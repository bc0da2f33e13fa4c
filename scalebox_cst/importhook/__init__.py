"""Rewrite a project's modules as they are imported; every rewrite is committed before it runs.

``install_import_hook(packages=[...])`` puts a finder first on ``sys.meta_path``. It bails out on
the top-level name, so torch, numpy and the standard library cost one set lookup. A selected
module goes through the watcher's pipeline and store (``Project``), and runs through the
executor's loader (``runtime.loader``), its rewritten source registered for tracebacks and
``inspect``. A warm import reads a hash-checked bytecode file from ``.scalebox/pycache/`` and
imports neither libcst nor pygit2: that keeps it near the cost of a plain cached import.

Parts: ``finder`` (the meta path finder), ``loader``, ``cache`` (the bytecode cache),
``fingerprint`` (the engine files a rewrite depends on), ``session`` (the session branch and
the project folders), ``install`` (installing, running a script).
"""
from __future__ import annotations

from scalebox_cst.importhook.common import (
    BRANCH_PREFIX,
    CACHE_DIR,
    ENV_MAIN,
    ENV_SESSION,
    SPAWN_MAIN,
    ScaleboxImportWarning,
)
from scalebox_cst.importhook.finder import ImportHook
from scalebox_cst.importhook.install import install_import_hook, run_script, script_code
from scalebox_cst.importhook.loader import RewritingLoader

__all__ = [
    "BRANCH_PREFIX", "CACHE_DIR", "ENV_MAIN", "ENV_SESSION", "SPAWN_MAIN", "ImportHook",
    "RewritingLoader", "ScaleboxImportWarning", "install_import_hook", "run_script", "script_code",
]
