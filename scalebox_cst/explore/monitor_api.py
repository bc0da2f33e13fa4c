"""The monitor's study routes: ``/api/studies`` (names) and ``/api/study?name=S`` (the data the
report shows, read from the study's journal on each poll, so the page is live while it runs)."""
from __future__ import annotations

import os
import re
from typing import Any, Dict

from scalebox_cst.explore.study import ExploreError, load_study

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # \Z: $ matches before a last newline


def studies(root: str) -> Dict[str, Any]:
    base = os.path.join(root, ".scalebox", "explore")
    names = sorted(n for n in os.listdir(base) if _NAME.match(n) and os.path.isfile(os.path.join(base, n, "journal.log"))) if os.path.isdir(base) else []
    return {"studies": names}


def study(root: str, name: str) -> Dict[str, Any]:
    from scalebox_cst.monitor.api import ApiError
    from scalebox_cst.explore.report import study_data

    if not _NAME.match(name):
        raise ApiError(f"bad study name {name!r}")
    try:
        found = load_study(root, name)
    except ExploreError as exc:
        raise ApiError(str(exc), 501) from None
    if found is None:
        raise ApiError(f"no study {name}", 404)
    return study_data(found)
