"""Host side of precision calibration (issue 24 part 1; the child's recorder is
scalebox_cst.runtime.precision): read a run's ``precision.json`` into record.json, and hand the
newest calibration run's ranges to the rewrite as the in-memory option ``[precision] calibration``
(``{"file:line": [max, min]}``), so they take part in the pipeline fingerprint: a new calibration
re-runs ``precision.autocast`` instead of serving a cached rewrite made without it.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

from scalebox_cst.intake import state_json

FILE = "precision.json"


def read(directory: str) -> Optional[Dict[str, Any]]:
    data = state_json(os.path.join(directory, FILE))
    return data if _ranges(data) is not None else None


def inject(project_root: str, config) -> bool:
    """Set ``[precision] calibration`` from the newest run that calibrated (fp16 mode only)."""
    if config.option("precision", "mode") != "fp16" or not config.transform_enabled("precision.autocast"):
        return False
    from scalebox_cst import runs

    found = [r for r in runs.list_runs(project_root) if _ranges(r.record.get("precision")) is not None]
    if not found:
        return False
    newest = _ranges(max(found, key=lambda r: r.record.get("started") or 0).record["precision"]) or []
    table = {f"{row['file']}:{row['line']}": [row.get("max"), row.get("min")] for row in newest
             if isinstance(row, dict) and isinstance(row.get("file"), str) and isinstance(row.get("line"), int)}
    config.set_option("precision", "calibration", table)
    return True


def _ranges(kept: Any) -> Optional[list]:
    """The rows of a record's ``precision`` as :func:`read` keeps them (a damaged record's: None)."""
    return kept["lines"] if isinstance(kept, dict) and isinstance(kept.get("lines"), list) else None
