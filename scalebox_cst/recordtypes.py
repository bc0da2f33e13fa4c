"""The types a run's ``record.json`` fields are read as (``runs.load_record``, the one reader).

A record edited by hand, damaged, or written by a hostile tool can hold any JSON in any field.
Every field a reader uses is checked here, once, as the record is read: a value of the wrong
type reads as missing (a number, a text), as empty (a list, a mapping), or loses the rows that
are not of the documented shape (``fallbacks``), so that ``scalebox log``, ``compare``,
``profile`` and the monitor show the rest of the project instead of a traceback or a 500 for
every branch (one record with ``"fallbacks": 5`` took ``log``, ``compare`` and the monitor's
``/api/branches`` and ``/api/runs`` down: the fourth fault campaign). Standard library only.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional

#: record.json's number fields (scalebox_cst.runner.record.RunRecord): floats, then integers
FLOATS = ("started", "ended", "wall_time")
INTS = ("seed", "pid", "pgid", "pid_start", "exit_status")
TEXTS = ("status", "signal", "stop_reason", "hotfix_of", "script", "branch", "variant", "commit", "source_commit",
         "launcher", "seed_via", "host", "engine_prefix")
#: mappings whose values readers look up by name
MAPPINGS = ("headline", "metrics", "tags")
#: lists of text (a command line, a traceback's last lines)
TEXT_LISTS = ("error_tail", "args")


def typed(record: Dict[str, Any]) -> None:
    """Make ``record``'s fields the types readers expect, in place (see the module's doc)."""
    for key in FLOATS:
        if record.get(key) is not None and not _finite(record[key]):
            record[key] = None
    for key in INTS:
        if record.get(key) is not None and not _int(record[key]):
            record[key] = None
    for key in TEXTS:
        if key in record and record[key] is not None and not isinstance(record[key], str):
            record[key] = None
    if record.get("status") is None and "status" in record:
        del record["status"]  # read as running (then lost, when its process is gone)
    for key in ("run", "nproc"):
        if key in record and not _int(record[key]):
            record[key] = 0 if key == "run" else 1
    for key in MAPPINGS:
        if key in record and not isinstance(record[key], dict):
            record[key] = {}
    for key in TEXT_LISTS:
        if key in record:
            value = record[key]
            record[key] = [v for v in value if isinstance(v, str)] if isinstance(value, list) else []
    if "limits" in record and not isinstance(record["limits"], dict):
        record["limits"] = None
    if "fallbacks" in record:
        rows = record["fallbacks"]
        record["fallbacks"] = ([r for r in rows if fallback_row(r)] or None) if isinstance(rows, list) else None
    if "profile" in record and not profile_shape(record["profile"]):
        record["profile"] = None  # readers reduce the run's profile.jsonl instead


def fallback_row(row: Any) -> bool:
    """``{op, count, file?, line?}`` as ``fallbacks.json`` holds them."""
    return (isinstance(row, dict) and isinstance(row.get("op"), str) and _int(row.get("count"))
            and (row.get("file") is None or isinstance(row["file"], str))
            and (row.get("line") is None or _int(row["line"])))


def profile_shape(profile: Optional[Any]) -> bool:
    """Whether a kept profile is what ``profile.reduce`` makes: the keys and numbers
    ``profile.render``, ``compare`` and the monitor read (None: no profile, fine)."""
    if profile is None:
        return True
    if not (isinstance(profile, dict) and isinstance(profile.get("method"), str)
            and _finite(profile.get("samples")) and _finite(profile.get("wall_s"))
            and _finite(profile.get("cpu_s", 0)) and (not profile.get("cpu_measured") or _finite(profile.get("cpu_s")))
            and (profile.get("hz") is None or _finite(profile["hz"]))
            and isinstance(profile.get("categories"), list) and isinstance(profile.get("lines", []), list)):
        return False
    for c in profile["categories"]:
        if not (isinstance(c, dict) and isinstance(c.get("category"), str) and isinstance(c.get("label", ""), str)
                and _finite(c.get("share")) and all(_finite(c.get(k, 0)) for k in ("wall_s", "cpu_s", "samples"))):
            return False
    for row in profile.get("lines", []):
        if not (isinstance(row, dict) and isinstance(row.get("path"), str) and isinstance(row.get("category"), str)
                and "line" in row and (row["line"] is None or _int(row["line"]))
                and _finite(row.get("share")) and all(_finite(row.get(k, 0)) for k in ("calls", "wall_s", "cpu_s", "samples"))
                and (row.get("categories") is None
                     or (isinstance(row["categories"], dict) and all(_finite(v) for v in row["categories"].values())))
                and (row.get("fallbacks") is None
                     or (isinstance(row["fallbacks"], list) and all(fallback_row(f) for f in row["fallbacks"])))
                and (row.get("code") is None or isinstance(row["code"], str)) and _coverage(row.get("coverage"))):
            return False
    return True


def _coverage(cov: Any) -> bool:
    """A profile line's ``coverage`` as ``profile.coverage`` makes it (``_coverage_text`` reads it)."""
    if not cov:
        return True
    if not isinstance(cov, dict) or not (cov.get("transform") is None or isinstance(cov["transform"], str)):
        return False
    if cov.get("covered") and cov.get("pass_rate") is not None:
        return _finite(cov["pass_rate"]) and _int(cov.get("vectorized")) and _int(cov.get("fallback"))
    return True


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
