"""Reading a run's profile (``profile.jsonl``, written by ``runtime.telemetry.profile``): where its
time went, per line of the user's code and per category, and whether a transform covers each hot line.

``build`` reduces the appended deltas to what ``record.json`` keeps under ``profile`` (the executor
calls it when a run ends; ``scalebox profile`` and the monitor call it on a live run too):

- ``categories``: per category its sampled wall and CPU seconds and its share of the wall time;
- ``lines``: the hottest lines (project path, the user's line number, the line's text from the
  user's original file in the store, share, dominant category, calls seen, and ``coverage``: the
  rewritten site whose span holds the line with its guard pass rate (sites.json), or the reason
  the stored report gives for a site that was not rewritten there, or that no transform matched);
- ``samples``, ``wall_s``, ``cpu_s``, ``hz``.

Shares are of the sampled wall time of the main thread (of every process that appended: the
ranks of a torchrun run add up). Time outside the project's lines (start-up, exit, the
launcher) is a line of its own, ``(outside the project)``.
"""
from __future__ import annotations

import functools
import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from scalebox_cst import jsonlines, runs, site_counts
from scalebox_cst.runtime.profile_categories import CATEGORIES  # the one table, shared with the sampler
from scalebox_cst.digits import ascii_digits


@functools.lru_cache(maxsize=None)
def counted() -> frozenset:
    """The transforms whose guards count passes and fallbacks per site (sites.json): their
    labels in ``runtime.telemetry.sites.GUARDS`` (``vectorize.reduction/elementwise`` names two).
    A site of another transform has no counts to show, whether or not its code ran (grad_clip's
    guard reports its interventions as events, not as passes). Read on first use: the host
    imports the telemetry package only for a line that needs it."""
    from scalebox_cst.runtime.telemetry.sites import GUARDS

    out = set()
    for helpers in GUARDS.values():
        for _, label in helpers.values():
            first, *more = label.split("/")
            family = first.rpartition(".")[0]
            out.update([first, *(f"{family}.{m}" for m in more)])
    return frozenset(out)


#: the line profile.jsonl gives code a rewrite added outside any site (runtime.telemetry.profile.ADDED)
ADDED = 0

FILE = "profile.jsonl"
TOP = 20
OUTSIDE = "(outside the project)"
_REPORTS_REF = "refs/notes/scalebox-reports"


class Reader:
    """profile.jsonl read on incrementally (the monitor keeps one per live run): only the
    complete lines appended since the last :meth:`refresh` are parsed."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, FILE)
        self.offset = 0
        self.rows: Dict[Tuple[str, int, str], List[float]] = {}
        self.meta: Dict[str, Any] = {"hz": None, "cpu": True, "damaged": {}}

    def refresh(self, ended: bool = False) -> "Reader":
        """Read on (``ended``: the run writes no more, so a cut last line is a damaged line;
        lines skipped are counted in ``meta["damaged"]``, scalebox_cst.jsonlines)."""
        # runs.read_lines: in bounded pieces; a line still being written waits for the next
        # refresh, and one longer than any profile line is passed over, not read whole again on
        # every poll (280 MB without a newline held `scalebox profile` at 312 MB, and the monitor
        # read it all every 2 s)
        damage = self.meta["damaged"]
        lines, self.offset = jsonlines.read_lines(self.path, self.offset, ended=ended, damage=damage)
        for raw in lines:
            self._add(raw, damage)
        return self

    def _add(self, raw: bytes, damage: jsonlines.Damage) -> None:
        items = jsonlines.parse([raw], self.path, damage)  # a damaged line (or one nested too deeply): counted
        if not items:
            return
        item = items[0]
        if not isinstance(item, dict):
            jsonlines.count(damage, self.path)
            return
        hz = item.get("hz")  # a rate or nothing: the text formats it (a damaged line held "x")
        if isinstance(hz, (int, float)) and not isinstance(hz, bool) and math.isfinite(hz) and hz > 0:
            self.meta["hz"] = hz
        self.meta["cpu"] = self.meta["cpu"] and bool(item.get("cpu", True))
        rows = item.get("rows")
        for row in rows if isinstance(rows, list) else ():
            try:
                p, line, category, n, wall, cpu, calls = row
                key = (str(p), int(line), str(category))
                values = [float(n), float(wall), float(cpu), float(calls)]
            except (TypeError, ValueError, OverflowError):
                continue
            if not all(math.isfinite(v) and v >= 0 for v in values):
                continue  # counts and seconds: an inf or a NaN would poison every sum (int(inf) raised)
            into = self.rows.setdefault(key, [0, 0.0, 0.0, 0])
            for k, v in enumerate(values):
                into[k] += v


def read_rows(directory: str, ended: bool = True) -> Tuple[Dict[Tuple[str, int, str], List[float]], Dict[str, Any]]:
    """Summed ``(path, line, category) -> [samples, wall_s, cpu_s, calls]`` and the sampling facts."""
    reader = Reader(directory).refresh(ended)
    return reader.rows, reader.meta


def summarize(directory: str, top: int = TOP, ended: bool = True) -> Optional[Dict[str, Any]]:
    """Categories and hottest lines of a run folder; None where it has no profile."""
    return reduce(*read_rows(directory, ended), top=top)


def reduce(rows: Dict[Tuple[str, int, str], List[float]], meta: Dict[str, Any], top: int = TOP) -> Optional[Dict[str, Any]]:
    """:func:`summarize` of rows already read."""
    if not rows:
        return None
    wall = sum(r[1] for r in rows.values()) or 1e-12
    by_category: Dict[str, List[float]] = {}
    by_line: Dict[Tuple[str, int], Dict[str, List[float]]] = {}
    for (path, line, category), r in rows.items():
        into = by_category.setdefault(category, [0, 0.0, 0.0])
        for k in range(3):
            into[k] += r[k]
        by_line.setdefault((path, line), {}).setdefault(category, [0, 0.0, 0.0, 0])
        for k in range(4):
            by_line[(path, line)][category][k] += r[k]
    order = list(CATEGORIES)
    categories = [
        {"category": c, "label": CATEGORIES.get(c, c), "samples": int(v[0]), "wall_s": round(v[1], 4),
         "cpu_s": round(v[2], 4), "share": round(v[1] / wall, 4)}
        for c, v in sorted(by_category.items(), key=lambda kv: (-kv[1][1], order.index(kv[0]) if kv[0] in order else 99))
    ]
    lines = []
    for (path, line), cats in by_line.items():
        total = [sum(v[k] for v in cats.values()) for k in range(4)]
        main = max(cats.items(), key=lambda kv: kv[1][1])[0]
        lines.append({
            "path": path or OUTSIDE, "line": line if path else None, "category": main,
            "categories": {c: round(v[1] / total[1], 3) if total[1] else 0.0 for c, v in cats.items()} if len(cats) > 1 else None,
            "share": round(total[1] / wall, 4), "wall_s": round(total[1], 4), "cpu_s": round(total[2], 4),
            "samples": int(total[0]), "calls": int(total[3]),
        })
    lines.sort(key=lambda d: -d["wall_s"])
    return {
        "method": f"sampled at {meta['hz']:g} Hz" if meta.get("hz") else "sampled",
        "hz": meta.get("hz"), "cpu_measured": meta["cpu"], "samples": int(sum(r[0] for r in rows.values())),
        "wall_s": round(sum(r[1] for r in rows.values()), 4), "cpu_s": round(sum(r[2] for r in rows.values()), 4),
        "categories": categories, "lines": lines[:top], "damaged": dict(meta.get("damaged") or {}),
    }


# ------------------------------------------------------------------------------- code and coverage


class _Store:
    """Read-only look-ups in the run's store: the user's original text and the site report."""

    def __init__(self, store_path: Optional[str], record: Dict[str, Any]) -> None:
        self.repo = None
        self.record = record
        self.texts: Dict[str, Optional[List[str]]] = {}
        self._report: Optional[Dict[str, List[Dict[str, Any]]]] = None
        if store_path and os.path.isdir(store_path):
            try:
                import pygit2

                from scalebox_cst.store import checked

                self.repo = pygit2.Repository(store_path)
                checked.install(self.repo, store_path)  # a truncated object: no text, not a hang
            except Exception:
                self.repo = None

    def line(self, path: str, line: int) -> Optional[str]:
        if path not in self.texts:
            self.texts[path] = None
            commit = self.record.get("source_commit") or self.record.get("commit")
            if self.repo is not None and commit:
                import pygit2

                from scalebox_cst.textlines import stripped_lines  # Python's line numbers

                try:
                    blob = self.repo[commit].peel(pygit2.Tree)[path]
                    self.texts[path] = stripped_lines(blob.data.decode("utf-8", "replace"))
                except (KeyError, ValueError, AttributeError, pygit2.GitError):
                    pass
        text = self.texts[path]
        return text[line - 1].strip() if text and 0 < line <= len(text) else None

    def original_of(self) -> Optional[str]:
        """The branch whose source snapshot an original run ran (None for a rewrite's run)."""
        return self.record.get("branch") if self.record.get("variant", "rewrite") == "original" else None

    def report(self) -> Dict[str, List[Dict[str, Any]]]:
        """The stored site report of the run's rewrite; for an original run, its branch's rewrite
        (the run ran none of it, but what a transform does or why it left a line is still what
        `scalebox profile` tells beside each hot line)."""
        if self._report is None:
            self._report = {}
            commit = self.record.get("commit")
            if self.repo is not None and self.original_of():
                from scalebox_cst.store.common import _reference  # (pygit2 keeps names looked up: interned)

                try:
                    ref = _reference(self.repo, f"refs/heads/{self.original_of()}")
                    commit = str(ref.peel().id) if ref is not None else None
                except (KeyError, ValueError, AttributeError):
                    commit = None
            if self.repo is not None and commit:
                try:
                    data = json.loads(self.repo.lookup_note(commit, _REPORTS_REF).message)
                    self._report = {f["path"]: list(f.get("sites") or ()) for f in data.get("files", [])}
                except (KeyError, ValueError, TypeError, AttributeError, RecursionError):
                    pass
        return self._report


def _span(path: str, site: Dict[str, Any]) -> str:
    """``train.py:20-24``, or ``train.py:16`` for a site of one line (not ``train.py:16-16``)."""
    end = site.get("end_line")
    return f"{path}:{site['line']}" + (f"-{end}" if end and end != site["line"] else "")


def coverage(path: str, line: int, sites: Sequence[Dict[str, Any]], report: Dict[str, List[Dict[str, Any]]],
             original_of: Optional[str] = None) -> Dict[str, Any]:
    """Whether a transform covers ``path:line``: the innermost rewritten site holding it with its
    guard counts, else the stored reason a site there was not rewritten, else none. For an
    original run (``original_of``: its branch) a rewritten site covers nothing the run ran: it is
    named as what that branch's rewrite does there."""
    def holds(lo: Any, hi: Any) -> bool:
        return isinstance(lo, int) and lo <= line <= (hi if isinstance(hi, int) else lo)

    ran = [s for s in sites if s.get("path") == path and holds(s.get("line"), s.get("end_line"))]
    if ran:
        s = min(ran, key=lambda s: (s.get("end_line") or s["line"]) - s["line"])
        passed, fell = site_counts.counts(s)
        return {"covered": True, "transform": s.get("transform"), "site": _span(path, s), "vectorized": passed, "fallback": fell,
                "pass_rate": round(passed / (passed + fell), 4) if passed + fell else None,
                "fallback_why": [[why, n] for why, n in site_counts.reasons(s)]}
    stored = [s for s in report.get(path, ()) if holds(s.get("line"), s.get("end_line"))]
    stored.sort(key=lambda s: s["end_line"] - s["line"])
    for s in stored:
        if s.get("action") == "rewritten" and original_of:
            return {"covered": False, "transform": s.get("transform"),
                    "reason": f"rewritten in {original_of}'s rewrite (this run ran your code as written)"}
        if s.get("action") == "rewritten":
            return {"covered": True, "transform": s.get("transform"), "site": _span(path, s),
                    "vectorized": 0, "fallback": 0, "pass_rate": None}
    if stored:
        s = stored[0]
        return {"covered": False, "transform": s.get("transform"), "reason": f"{s.get('action')}: {s.get('reason')}"}
    return {"covered": False, "reason": "no transform matched this line"}


#: the reason of start-up in the rewrite's support imports: they sit above the user's own, so they
#: load torch (~1.5 s) for the file; a short run showed it as half its time, as if the rewrite cost it
ADDED_IMPORTS = ("start-up in the rewrite's support imports: they run before your own imports and load the "
                 "libraries those would (torch), which the original pays at its own import lines")


def build(directory: str, record: Optional[Dict[str, Any]] = None, store_path: Optional[str] = None, top: int = TOP,
          ended: bool = True) -> Optional[Dict[str, Any]]:
    """:func:`summarize` with each hot line's text (the user's original file) and coverage."""
    out = summarize(directory, top, ended)
    if out is None:
        return None
    store = _Store(store_path, record or {})
    sites = runs.read_sites(directory)
    report = store.report()
    for row in out["lines"]:
        if row["line"] is None:
            row["code"] = None
            row["coverage"] = {"covered": False, "reason": "not a line of the project (imports, start-up, exit)"}
            continue
        if row["line"] == ADDED:
            row["code"] = None
            row["coverage"] = {"covered": False, "reason": ADDED_IMPORTS if row.get("category") == "imports" else
                               "code the rewrite added (support imports, helpers), not a line of yours"}
            continue
        row["code"] = store.line(row["path"], row["line"])
        if row.get("category") == "imports":
            row["coverage"] = {"covered": False, "reason": "start-up: modules imported once per process; no rewrite removes that"}
            continue
        row["coverage"] = coverage(row["path"], row["line"], sites, report, store.original_of())
    return out


def shares(profile: Optional[Dict[str, Any]]) -> Dict[str, float]:
    """category -> share of the run's sampled wall time."""
    return {c["category"]: float(c["share"]) for c in (profile or {}).get("categories", ())}


# ------------------------------------------------------------------------------- text


def _coverage_text(cov: Dict[str, Any]) -> str:
    if cov.get("covered"):
        rate = cov.get("pass_rate")
        if rate is not None:
            guard = f"guard passed {rate:.0%} ({cov['vectorized']}/{cov['vectorized'] + cov['fallback']})"
            whys = site_counts.reasons(cov)
            if whys and cov["fallback"]:
                guard += "; fell back: " + "; ".join(f"{why} ({n})" for why, n in whys)
        elif cov.get("transform") in counted():
            guard = "its guard did not run (no pass/fallback counts)"
        else:
            guard = "no pass/fallback counts for this transform"
        return f"{cov.get('transform')} site {cov.get('site')}, {guard}"
    return (f"{cov['transform']}: " if cov.get("transform") else "") + str(cov.get("reason"))


def pick(found: Sequence[runs.RunInfo], selector: Optional[str]) -> Optional[runs.RunInfo]:
    """The run ``selector`` names among ``found`` (all runs of the project): ``BRANCH#N``, or the
    newest run of ``BRANCH`` (already resolved by the caller), or with no selector the newest run."""
    if selector and "#" in selector:
        branch, _, number = selector.partition("#")
        if not ascii_digits(number):
            return None
        return next((r for r in found if r.branch == branch and r.run == int(number)), None)
    chosen = [r for r in found if not selector or r.branch == selector]
    return max(chosen, key=lambda r: (r.record.get("started") or 0, r.run), default=None)


def render(profile: Optional[Dict[str, Any]], title: str = "", lines: int = 10) -> str:
    if not profile:
        return f"{title + ': ' if title else ''}no profile recorded (a run with telemetry on writes profile.jsonl)\n"
    out = []
    cpu = f", main thread CPU {profile['cpu_s']:.1f}s" if profile.get("cpu_measured") else ""
    out.append(f"{title + ': ' if title else ''}{profile['samples']} samples ({profile['method']}), {profile['wall_s']:.1f}s sampled{cpu}")
    out.append("")
    out.append(f"{'category':<28} {'share':>6} {'wall s':>8} {'cpu s':>8}")
    for c in profile["categories"]:
        seconds = "".join(f" {c[k]:>8.2f}" if c.get(k) is not None else f" {'-':>8}" for k in ("wall_s", "cpu_s"))
        out.append(f"{c.get('label', c['category']):<28} {c['share']:>6.1%}{seconds}")
    out.append("")
    out.append("top lines")
    for row in profile["lines"][:lines]:
        where = row["path"] if row["line"] is None else f"{row['path']}:{row['line']}"
        if row["line"] == ADDED:
            where = f"{row['path']} (added by the rewrite)"
        label = CATEGORIES.get(row["category"], row["category"])
        out.append(f"{row['share']:>6.1%}  {where}  [{label}]  calls>={row.get('calls', '?')}")
        if row.get("code"):
            out.append(f"        {row['code']}")
        if row.get("coverage"):
            out.append(f"        transform: {_coverage_text(row['coverage'])}")
        if row.get("fallbacks"):  # scalebox_cst.fallbacks: operators this line ran on the CPU
            out.append("        CPU fallback: " + ", ".join(f"{f['op']} x{f['count']}" for f in row["fallbacks"]))
    damaged = jsonlines.note(profile.get("damaged"))
    if damaged:
        out.append(damaged)
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------- compare


def of_run(run: runs.RunInfo) -> Optional[Dict[str, Any]]:
    """A run's profile: what record.json keeps, else reduced from its folder (a live run)."""
    kept = run.record.get("profile")
    return kept if isinstance(kept, dict) and kept.get("categories") else summarize(run.dir, ended=run.status != "running")


def compare_shares(groups: Sequence[Tuple[str, Sequence[runs.RunInfo]]]) -> Optional[Dict[str, Any]]:
    """Per category, each group's mean share over its runs with a profile (None: no run has one)."""
    means, counts = [], []
    for _, group in groups:
        found = [shares(p) for p in (of_run(r) for r in group) if p]
        counts.append(len(found))
        means.append({c: sum(s.get(c, 0.0) for s in found) / len(found) for c in CATEGORIES} if found else {})
    if not any(counts):
        return None
    used = [c for c in CATEGORIES if any(m.get(c) for m in means)]
    return {
        "groups": [{"label": label, "runs": n} for (label, _), n in zip(groups, counts)],
        "categories": [{"category": c, "label": CATEGORIES[c], "shares": [m.get(c) if m else None for m in means]} for c in used],
    }


def render_shares(table: Optional[Dict[str, Any]]) -> str:
    if not table:
        return ""
    labels = [g["label"] for g in table["groups"]]
    width = max([8] + [len(l) for l in labels])
    out = ["", "time by category (share of sampled wall time, mean over runs; scalebox profile RUN for lines)"]
    out.append(f"  {'':<28}" + "".join(f"  {l:>{width}}" for l in labels))
    for row in table["categories"]:
        cells = "".join(f"  {('-' if s is None else f'{s:.1%}'):>{width}}" for s in row["shares"])
        out.append(f"  {row['label']:<28}{cells}")
    return "\n".join(out) + "\n"


def compact(profile: Optional[Dict[str, Any]], lines: int = 5) -> Optional[Dict[str, Any]]:
    """What the monitor shows per run: category shares and the few hottest lines."""
    if not profile:
        return None
    keep = ("path", "line", "code", "share", "category", "calls")
    return {
        "samples": profile.get("samples"), "wall_s": profile.get("wall_s"), "method": profile.get("method"),
        "categories": [{k: c.get(k) for k in ("category", "label", "share")} for c in profile.get("categories", ())],
        "lines": [{**{k: row.get(k) for k in keep}, "coverage": _coverage_text(row["coverage"]) if row.get("coverage") else None}
                  for row in profile.get("lines", ())[:lines]],
        "damaged": jsonlines.note(profile.get("damaged")),
    }
