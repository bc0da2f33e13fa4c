"""The engine's part of the fingerprint memo: the files the rewrites come from.

The import hook keeps the pipeline fingerprint in a memo checked by these files' sizes and
mtimes (no libcst, no hashing on a warm import). An edited module anywhere in the engine's code
(a transform's subpackage included) must invalidate it, or the bytecode cache serves the old
rewrite: the files are ``config.engine_files``, the same list the fingerprint's digest reads."""
from __future__ import annotations

import os
from typing import List

from scalebox_cst.config import engine_files


def _engine_stamps() -> List[str]:
    """``path<TAB>size<TAB>mtime_ns`` for every file and folder of ``engine_files``.

    Called on a fingerprint miss only (the registry is imported by then)."""
    folders, files = engine_files()
    return [_stamp(p) for p in [*folders, *(path for path, _ in files)]]


def _stamp(path: str) -> str:
    try:
        st = os.stat(path)
        return f"{path}\t{st.st_size}\t{st.st_mtime_ns}"
    except OSError:
        return f"{path}\t-\t-"
