"""A run's sites.json rows read as numbers: each site's guard counts and why it fell back.

Why one reader: ``scalebox run``'s end line, ``log``, ``compare``, ``profile`` and the monitor
each summed the rows' ``vectorized`` / ``fallback`` with ``int(...)`` of whatever the file held
(a damaged or planted row raised there), and a pass rate alone said nothing a user could act on:
``guards 0%`` for a GAE fed float16 tensors read the same as for one too short to pay. The run's
telemetry (scalebox_cst.runtime.telemetry.sites) now writes each site's most frequent reasons
(``fallback_why``: ``[[reason, count], ...]``, from runtime/guard_reasons.py); here they are read
back, checked, escaped for one line, and added up over a run's sites.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .intake import shown_name

#: reasons shown per site and per run; a longer reason is cut (a planted file may hold anything)
SHOWN, MAX_CHARS = 3, 160


def count(value: Any) -> int:
    """A non-negative count, else 0 (a bool, a float or a string is no count)."""
    return value if type(value) is int and value >= 0 else 0


def counts(site: Dict[str, Any]) -> Tuple[int, int]:
    """``(vectorized, fallback)`` of one row."""
    return count(site.get("vectorized")), count(site.get("fallback"))


def seconds(site: Dict[str, Any]) -> float:
    """The row's sampled time in the site, 0.0 where it is not a finite number of seconds."""
    value = site.get("time_s")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return 0.0


def reasons(site: Dict[str, Any]) -> List[Tuple[str, int]]:
    """The row's ``fallback_why`` as ``(reason, count)`` pairs (one line each), most frequent
    first; malformed entries are dropped."""
    rows = site.get("fallback_why")
    out: List[Tuple[str, int]] = []
    for row in rows if isinstance(rows, list) else ():
        if isinstance(row, list) and len(row) == 2 and isinstance(row[0], str) and count(row[1]) > 0:
            why = shown_name(" ".join(row[0].split()))
            out.append((why[:MAX_CHARS - 3] + "..." if len(why) > MAX_CHARS else why, row[1]))
    return sorted(out, key=lambda r: (-r[1], r[0]))[:SHOWN]


def totals(sites: Iterable[Dict[str, Any]]) -> Tuple[int, int, List[Tuple[str, int]]]:
    """Over a run's rows: vectorized, fallback, and the reasons added up (most frequent first)."""
    passed = fell = 0
    whys: Dict[str, int] = {}
    for site in sites:
        vec, fall = counts(site)
        passed, fell = passed + vec, fell + fall
        for why, n in reasons(site):
            whys[why] = whys.get(why, 0) + n
    return passed, fell, sorted(whys.items(), key=lambda r: (-r[1], r[0]))[:SHOWN]


def pass_rate(passed: int, fell: int) -> Optional[float]:
    return passed / (passed + fell) if passed + fell else None


def guards_text(rate: Optional[float], whys: Any) -> Optional[str]:
    """``guards 67%`` with, where some evaluations fell back, why: ``guards 67% (fell back: 3x
    per-step inputs of dtype float16 ...; 2x fewer than 2 steps)``; None without a rate.
    ``whys`` as in a headline's ``guard_fallback_why`` (checked again: a record is read from disk)."""
    if not isinstance(rate, (int, float)) or not math.isfinite(rate):
        return None
    text = f"guards {rate * 100:.0f}%"
    top = reasons({"fallback_why": whys})
    if top and rate < 1:
        text += " (fell back: " + "; ".join(f"{n}x {why}" for why, n in top) + ")"
    return text
