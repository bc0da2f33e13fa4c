"""Host side of the NPU CPU-fallback counts (issue 24 part 2; the child's capture is
scalebox_cst.runtime.telemetry.fallbacks): read a run's ``fallbacks.json`` into record.json, say
them in `scalebox log`, `scalebox compare` and `scalebox profile`, and tell the next rewrite where
the device table has an NPU kernel for an operator that fell back on a line it rewrites.

A row is ``{"op": "aten::gelu", "file": "train.py", "line": 12, "count": 340}``: ``count`` calls of
the operator ran on the CPU from that line of the user's (the innermost frame in the project).
"""
from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from scalebox_cst.intake import state_json

FILE = "fallbacks.json"

#: aten operator (without overload) -> the device table's entry that emits its NPU kernel
EQUIVALENTS: Dict[str, str] = {
    "aten::gelu": "fused_op.gelu",
    "aten::gelu_backward": "fused_op.gelu",
    "aten::rms_norm": "fused_op.rms-norm",
    "aten::_fused_rms_norm": "fused_op.rms-norm",
    "aten::_foreach_norm": "optimizer.clip-foreach",
}


def read(directory: str) -> Optional[List[Dict[str, Any]]]:
    """A run's fallbacks, most frequent first; None where the run recorded none."""
    data = state_json(os.path.join(directory, FILE))
    rows = data.get("fallbacks") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        return None
    keep = [r for r in rows or () if isinstance(r, dict) and isinstance(r.get("op"), str) and isinstance(r.get("count"), int)]
    return sorted(keep, key=lambda r: (-r["count"], r["op"], r.get("file") or "", r.get("line") or 0)) or None


def where(row: Dict[str, Any]) -> str:
    return f"{row['file']}:{row['line']}" if row.get("file") else "outside the project"


def fact(rows: Optional[Sequence[Dict[str, Any]]], limit: int = 2) -> Optional[str]:
    """``CPU fallbacks: aten::gelu x340 at train.py:12, ...`` for a run's line, else None."""
    if not rows:
        return None
    shown = ", ".join(f"{r['op']} x{r['count']} at {where(r)}" for r in rows[:limit])
    more = f" (+{len(rows) - limit} more)" if len(rows) > limit else ""
    return f"CPU fallbacks: {shown}{more}"


def per_group(groups: Sequence[Tuple[str, Sequence[Any]]]) -> Optional[Dict[str, Any]]:
    """For `scalebox compare`: per (op, line), the calls per run of each group (mean), or None."""
    table: Dict[Tuple[str, str, int], Dict[str, float]] = {}
    for label, group in groups:
        for run in group:
            for row in run.record.get("fallbacks") or ():
                key = (row["op"], row.get("file") or "", row.get("line") or 0)
                table.setdefault(key, {})
                table[key][label] = table[key].get(label, 0) + row["count"] / max(len(group), 1)
    if not table:
        return None
    labels = [label for label, _ in groups]
    rows = [{"op": op, "file": f, "line": line, "per_run": {lab: round(counts.get(lab, 0.0), 3) for lab in labels}}
            for (op, f, line), counts in sorted(table.items(), key=lambda kv: -max(kv[1].values()))]
    return {"labels": labels, "rows": rows}


def render_groups(table: Optional[Dict[str, Any]]) -> str:
    if not table:
        return ""
    lines = ["", "CPU fallbacks (calls per run)"]
    for row in table["rows"]:
        counts = ", ".join(f"{lab} {row['per_run'][lab]:g}" for lab in table["labels"])
        lines.append(f"  {row['op']} at {where(row)}: {counts}")
    return "\n".join(lines) + "\n"


def mark_profile(profile: Optional[Dict[str, Any]], rows: Optional[Iterable[Dict[str, Any]]]) -> None:
    """Each hot line of ``profile`` that ran a fallback gets ``fallbacks: [{op, count}]``."""
    by_line: Dict[Tuple[Optional[str], Optional[int]], List[Dict[str, Any]]] = {}
    for row in rows or ():
        by_line.setdefault((row.get("file"), row.get("line")), []).append({"op": row["op"], "count": row["count"]})
    for hot in (profile or {}).get("lines", ()):
        found = by_line.get((hot.get("path"), hot.get("line")))
        if found:
            hot["fallbacks"] = found


def equivalent(op: str) -> Optional[Tuple[str, str]]:
    """(swap id, what it emits) of the device table's NPU kernel for ``op``, else None."""
    swap_id = EQUIVALENTS.get(op.split(".")[0])
    if swap_id is None:
        return None
    from scalebox_cst.transforms.device.table import TABLE

    entry = next((e for e in TABLE if e.id == swap_id), None)
    if entry is None:
        return None
    return swap_id, entry.reason.split(":")[0].split(" for ")[0]


def newest(project_root: str) -> List[Dict[str, Any]]:
    """The fallbacks of the project's newest run that recorded any (the last thing measured)."""
    from scalebox_cst import runs

    found = [r for r in runs.list_runs(project_root) if r.record.get("fallbacks")]
    if not found:
        return []
    last = max(found, key=lambda r: r.record.get("started") or 0)
    return list(last.record["fallbacks"])


def annotate(project_root: str, results: Dict[str, Any]) -> int:
    """Site reasons of ``results`` (path -> pipeline FileResult) on a line where the newest run
    ran an operator on the CPU that the device table has an NPU kernel for say so; returns how
    many sites were told."""
    import dataclasses

    told = 0
    for row in newest(project_root):
        file = row.get("file")
        result = results.get(file) if file is not None else None
        known = equivalent(row["op"]) if result is not None else None
        if result is None or known is None:
            continue
        swap_id, what = known
        note = f"; last run: {row['op']} fell back to the CPU {row['count']}x on line {row['line']}, the device table's {swap_id} ({what}) is its NPU kernel"
        sites = result.report.sites
        for i, site in enumerate(sites):
            if site.line <= row["line"] <= site.end_line and note not in site.reason:
                sites[i] = dataclasses.replace(site, reason=site.reason + note)
                told += 1
    return told
