"""Render a run branch as a review diff: original → rewrite, each hunk labelled with its sites.

A hunk's label lists the sites whose source lines it covers (transform, exactness, reason);
skipped candidates and warnings follow each file, so a user sees what was left alone and why;
sites that name a ``kind`` (such as things that cannot be migrated to NPU) are grouped by it.

An import-hook session (``hook/<session>``) has no report note: :func:`session_report` rebuilds
one from the store, each module's sites from the rewrite cache entry of the source and pipeline
its commit names (else from the site lines of that commit's message).
"""
from __future__ import annotations

import json
import re
from typing import Callable, Dict, List, Optional, Tuple

import click

from scalebox_cst import linediff, sourcefile
from scalebox_cst.report import ACTIONS, REWRITTEN, FileReport, RunReport, Site
from scalebox_cst.textlines import stripped_lines

STYLES = {
    "header": dict(bold=True),
    "hunk": dict(fg="cyan"),
    "label": dict(fg="magenta"),
    "add": dict(fg="green"),
    "del": dict(fg="red"),
    "note": dict(fg="yellow"),
}


def _style(text: str, kind: str, color: bool) -> str:
    return click.style(text, **STYLES[kind]) if color else text


def _lines(data: Optional[bytes]) -> List[str]:
    if data is None:
        return []
    # Lines as Python numbers them: str.splitlines would also split at form feeds.
    return stripped_lines(sourcefile.decode_for_display(data))


def _labels(sites: List[Site], lo: int, hi: int) -> List[Site]:
    """Rewritten sites whose source span [line, end_line] touches old lines [lo, hi] (1-based)."""
    return [s for s in sites if s.action == REWRITTEN and s.line <= hi and s.end_line >= lo]


def file_hunks(report: FileReport, old: Optional[bytes], new: Optional[bytes]) -> List[dict]:
    """The hunks of one file as data (what :func:`render_file` prints; the monitor serves them).

    Each: ``{"old_start", "old_count", "new_start", "new_count", "sites": [rewritten sites
    covering it], "note": None or why it has none, "lines": [[" "|"-"|"+", text], ...]}``.
    """
    hunks: List[dict] = []
    a, b = _lines(old), _lines(new)
    for group in linediff.grouped(linediff.opcodes(a, b), 3):
        i1, i2 = group[0][1], group[-1][2]
        j1, j2 = group[0][3], group[-1][4]
        # Old lines each change touches, 1-based; a pure insertion touches the line above it.
        changed_old = [(x, y) if y > x else (max(x - 1, 0), x + 1) for tag, x, y, _, _ in group if tag != "equal"]
        lo = min(x for x, _ in changed_old) + 1
        hi = max(y for _, y in changed_old)
        labels = _labels(report.sites, lo, hi)
        note = None
        if not labels:
            if any(s.action == REWRITTEN for s in report.sites):
                note = "support code for the sites in this file (imports)"
            else:
                note = "no site report is stored for this change"
        lines: List[List[str]] = []
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                lines.extend([" ", line] for line in a[x1:x2])
                continue
            lines.extend(["-", line] for line in a[x1:x2])
            lines.extend(["+", line] for line in b[y1:y2])
        hunks.append({
            "old_start": i1 + 1, "old_count": i2 - i1, "new_start": j1 + 1, "new_count": j2 - j1,
            "sites": labels, "note": note, "lines": lines,
        })
    return hunks


def site_label(site: Site, told: set) -> str:
    """A hunk's label line for ``site``: its reason on the first hunk of the file that covers it,
    a short reference on later ones (a site spanning several hunks is explained once)."""
    key = (site.transform, site.line, site.end_line, site.reason)
    if key in told:
        return f"#  {site.transform} line {site.line} (continued; reason above)"
    told.add(key)
    return f"#  {site.transform} [{site.exactness}] line {site.line}: {site.reason}"


def detail_lines(site: Site) -> List[str]:
    """``scalebox diff --details``: the site's details (the contracts of the guards it names and
    what did not fit its reason) as indented JSON comment lines; none without details."""
    if not site.details:
        return []
    return ["#    " + line for line in json.dumps(site.details, indent=2, ensure_ascii=False).splitlines()]


def render_file(report: FileReport, old: Optional[bytes], new: Optional[bytes], color: bool,
                details: bool = False) -> List[str]:
    out: List[str] = []
    out.append(_style(f"--- a/{report.path}", "header", color))
    out.append(_style(f"+++ b/{report.path}", "header", color))
    kinds = {" ": None, "-": "del", "+": "add"}
    told: set = set()  # sites whose reason an earlier hunk printed
    for hunk in file_hunks(report, old, new):
        head = f"@@ -{hunk['old_start']},{hunk['old_count']} +{hunk['new_start']},{hunk['new_count']} @@"
        out.append(_style(head, "hunk", color))
        for site in hunk["sites"]:
            fresh = (site.transform, site.line, site.end_line, site.reason) not in told
            out.append(_style(site_label(site, told), "label", color))
            if details and fresh:
                out.extend(_style(line, "label", color) for line in detail_lines(site))
        if hunk["note"]:
            out.append(_style(f"#  {hunk['note']}", "label", color))
        for op, line in hunk["lines"]:
            kind = kinds[op]
            out.append(op + line if kind is None else _style(op + line, kind, color))
    return out


def render_notes(report: FileReport, color: bool, details: bool = False) -> List[str]:
    out: List[str] = []
    if report.error:
        out.append(_style(f"error: {report.error}", "note", color))
    plain = [s for s in report.sites if s.action != REWRITTEN and not s.kind]
    for site in plain:
        out.append(_style(f"{site.action}: {site.describe(report.path)}", "note", color))
        if details:
            out.extend(_style(line, "note", color) for line in detail_lines(site))
    grouped: Dict[str, List[Site]] = {}
    for site in report.sites:
        if site.kind:
            grouped.setdefault(site.kind, []).append(site)
    for kind in sorted(grouped):
        out.append(_style(f"{kind}:", "note", color))
        out.extend(_style(f"  {s.describe(report.path)}", "note", color) for s in grouped[kind])
    return out


def render(
    report: RunReport,
    read_old,
    read_new,
    color: bool = False,
    details: bool = False,
) -> str:
    """The whole review diff. ``read_old``/``read_new``: path → bytes (None if absent);
    ``details``: each site's details (JSON) under its label."""
    out: List[str] = [_style(f"{report.branch} {report.commit or ''}  (source {report.source_commit or ''})", "header", color)]
    for f in report.files:
        old, new = read_old(f.path), read_new(f.path)
        if old != new:
            out.extend(render_file(f, old, new, color, details))
        notes = render_notes(f, color, details)
        if notes:
            if old == new:
                out.append(_style(f"=== {f.path} (unchanged)", "header", color))
            out.extend(notes)
    return "\n".join(out) + "\n"


def render_stat(report: RunReport, read_old, read_new) -> str:
    rows: List[Tuple[str, int, int, int, int]] = []
    for f in report.files:
        a, b = _lines(read_old(f.path)), _lines(read_new(f.path))
        added = removed = 0
        for tag, i1, i2, j1, j2 in linediff.opcodes(a, b):
            if tag != "equal":
                removed += i2 - i1
                added += j2 - j1
        rewritten = sum(1 for s in f.sites if s.action == REWRITTEN)
        other = len(f.sites) - rewritten
        if added or removed or f.sites or f.error:
            rows.append((f.path, added, removed, rewritten, other))
    if not rows:
        return f"{report.branch}: no changes\n"
    width = max(len(r[0]) for r in rows)
    lines = [
        f" {path.ljust(width)} | +{added} -{removed} | {rw} rewritten, {other} skipped/warned"
        for path, added, removed, rw, other in rows
    ]
    total_add = sum(r[1] for r in rows)
    total_del = sum(r[2] for r in rows)
    lines.append(f" {len(rows)} file(s), +{total_add} -{total_del}; {report.summary()}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- import-hook sessions
# Site.describe(path): "path:LINE[-END]: TRANSFORM ACTION[ [EXACTNESS]]: REASON"
_SITE_LINE = re.compile(
    r"(?P<path>.+?):(?P<line>\d+)(?:-(?P<end>\d+))?: (?P<transform>\S+) (?P<action>%s)"
    r"(?: \[(?P<exactness>[a-z-]+)\])?: (?P<reason>.*)\Z" % "|".join(ACTIONS)
)


def sites_from_message(message: str, path: str) -> List[Site]:
    """The sites a hook commit's message lists for ``path`` (one ``Site.describe`` line each)."""
    sites = []
    for line in message.splitlines():
        match = _SITE_LINE.match(line)
        if match is None or match.group("path") != path:
            continue
        try:
            sites.append(
                Site(
                    match.group("transform"),
                    int(match.group("line")),
                    int(match.group("end") or match.group("line")),
                    match.group("action"),
                    match.group("reason"),
                    match.group("exactness"),
                )
            )
        except ValueError:  # an exactness or action this version does not know
            continue
    return sites


def session_report(store, session) -> Tuple[RunReport, Callable[[str], Optional[bytes]], Callable[[str], Optional[bytes]]]:
    """``(report, read_old, read_new)`` for an import-hook session (a ``store.SessionInfo``).

    Each module the session committed is diffed from the snapshot its commit names to the
    session's tip. Its sites come from the store's rewrite cache for that source and pipeline when
    the cached rewrite is the one committed, else from the commit message's site lines.
    """
    from scalebox_cst.store import Store

    old: Dict[str, Optional[bytes]] = {}
    files: List[FileReport] = []
    sources: List[str] = []
    for f in session.files:
        before = store.read_file(f.source_commit, f.path) if f.source_commit else None
        after = store.read_file(session.commit, f.path)
        old[f.path] = before
        if f.source_commit and f.source_commit not in sources:
            sources.append(f.source_commit)
        report = None
        if before is not None and f.fingerprint:
            hit = store.cache_get(Store.cache_key(f.path, before), f.fingerprint)
            if hit is not None and after is not None and hit[0] == Store.blob_id(after):
                report = FileReport.from_json({**hit[1], "path": f.path})
        if report is None:
            report = FileReport(f.path, "rewritten", sites=sites_from_message(f.message, f.path))
        files.append(report)
    report = RunReport(session.name, session.commit, ", ".join(sources) or session.base, backend="", files=files)
    return report, old.get, lambda path: store.read_file(session.commit, path)
