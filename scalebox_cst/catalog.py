"""The transforms' ids and versions without importing the transforms.

A pipeline's fingerprint names the enabled transforms and their versions (``Config.fingerprint``).
``scalebox status`` and ``scalebox run`` need that fingerprint to tell whether the newest branch
is still current, and importing the transforms for it (libcst and every family) costs a few
tenths of a second of CPU each time. The versions are a function of the transform modules'
source, whose digest is already part of the fingerprint (``config.engine_digest``: 3 ms), so
the registry's ``{id: version}`` is cached in the user's cache under that digest and the engine
version: edited, added or upgraded transform code is another key.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Dict

from scalebox_cst import statedir, tmpnames
from scalebox_cst._version import __version__
from scalebox_cst.config import engine_digest


def transform_versions() -> Dict[str, str]:
    """``{id: version}`` of every registered transform, in registry order."""
    live = sys.modules.get("scalebox_cst.transforms")
    if live is not None:  # imported already: its answer costs nothing (and sees any patching)
        found = live.versions()
        path = _path()
        if not os.path.exists(path):  # a rewrite leaves the answer for the next status or run
            _write(path, found)
        return found
    path = _path()
    from scalebox_cst.intake import NotRead
    from scalebox_cst.runtime.backend import read_cached

    try:
        pairs = json.loads(read_cached(path))
        if isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in pairs):
            return dict(pairs)
    except (NotRead, ValueError):
        pass
    from scalebox_cst.transforms import versions

    found = versions()
    _write(path, found)
    return found


def _path() -> str:
    from scalebox_cst.runtime.backend import cache_dir

    return os.path.join(cache_dir(), f"transforms-{__version__}-{engine_digest()}.json")


def _write(path: str, found: Dict[str, str]) -> None:
    try:
        statedir.makedirs(os.path.dirname(path))
        text = json.dumps([[k, v] for k, v in found.items()])
        tmpnames.write_replacing(path, text.encode("utf-8"), tmpnames.sibling(path, tmpnames.writer_id()))
        from scalebox_cst.runtime.backend import keep_newest

        keep_newest(path)  # one file per engine digest: the 8 used last are kept
    except (OSError, TypeError):  # a read-only home (or a version JSON cannot hold): imported again next time
        pass
