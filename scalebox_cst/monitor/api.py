"""What the monitor serves, as JSON-ready data read from a project's files (nothing is written).

One :class:`Monitor` per served project. It reads what the CLI reads: the store (branches, their
reports, source snapshots, diffs) and the run records under ``.scalebox/runs/`` through
:mod:`scalebox_cst.runs`. So a monitor shows a finished project's history as well as a live one,
and several monitors can read one project at once.

Everything immutable is cached by commit id (reports, diffs, snapshot messages). Append-only
files are read incrementally from the byte offset reached last time, per file, and reset when a
file shrinks or is replaced: metrics into bounded :class:`~scalebox_cst.monitor.series.Series`
(so a million-step run costs the same to draw as a short one), events into short deques. The
metrics cache is bounded in bytes; a file evicted from it is read again from its start.
The incremental readers of those files are in :mod:`scalebox_cst.monitor.files`.
"""
from __future__ import annotations

import collections
import heapq
import math
import os
import re
import statistics
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from scalebox_cst import diffview, fallbacks, headlines, jsonlines, profile, runs, site_counts
from scalebox_cst.monitor.files import EventsFile, MetricsFile
from scalebox_cst.monitor.series import Series, json_number
from scalebox_cst.report import REWRITTEN, ReportError, RunReport
from scalebox_cst.store import BranchInfo, Store, StoreError

#: estimated bytes of series kept in memory, all files together
CACHE_BYTES = 256 << 20
#: points a series is drawn with unless the request asks for fewer
DEFAULT_POINTS = 1000
MAX_POINTS = 5000
#: grid points of a seed band (mean, min and max over a branch's seeded runs)
BAND_POINTS = 400
#: events files kept read, least recently used dropped first (more while one answer needs more)
EVENTS_FILES = 256
#: seconds an event's time may exceed its file's mtime (a coarse file-system clock)
_MTIME_SLACK = 2.0
#: headline numbers shown per run (keys of runs.headline)
HEADLINE_KEYS = ("episodic_return_final", "episodic_return_best", "episodes", "metric_return", "sps", "guard_pass_rate", "guard_fallback_why", "site_time_s", "grad_norm_last", "grad_norm_metric", "nonfinite", "wall_time", "cpu_time_s")

_ROLLBACK = re.compile(r"rollback to (\S+)")


class ApiError(Exception):
    """A request the API cannot answer; ``status`` is the HTTP status (400 or 404)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return json_number(value)
    return value


# ------------------------------------------------------------------------------ the monitor
class Monitor:
    """The API's data for one project; every public method returns JSON-ready data."""

    def __init__(self, root: str, refresh_interval: float = 2.0, cache_bytes: int = CACHE_BYTES, runs_ttl: Optional[float] = None) -> None:
        self.root = os.path.abspath(root)
        self.refresh_interval = refresh_interval
        self.cache_bytes = cache_bytes
        # One poll of the page asks for branches, events and a series per chart within moments;
        # they share one listing of the run folders (a walk and a record read per run) instead
        # of one each. Never older than half a refresh interval (at most a second).
        self.runs_ttl = min(1.0, refresh_interval / 2) if runs_ttl is None else runs_ttl
        self._runs_cache: Tuple[float, List[runs.RunInfo]] = (-math.inf, [])
        self.store = Store.open(self.root)  # StoreError: not a project
        self._store_lock = threading.RLock()  # one reader of the store at a time
        self._lock = threading.Lock()
        self._reports: Dict[str, Dict[str, Any]] = {}  # commit -> report JSON
        self._diffs: "collections.OrderedDict[str, Dict[str, Any]]" = collections.OrderedDict()
        self._snapshots: Dict[str, Tuple[int, str, int]] = {}  # commit -> (index, message, time)
        self._snapshot_tip: Optional[str] = None
        self._metrics: "collections.OrderedDict[str, MetricsFile]" = collections.OrderedDict()
        # path -> its reader: the project's and those of the runs whose events were shown last,
        # not one per run ever seen (+5.6 kB per run of three events, for the life of the monitor)
        self._events: "collections.OrderedDict[str, EventsFile]" = collections.OrderedDict()
        self._profiles: Dict[str, profile.Reader] = {}  # run folder -> its live profile, read on

    def close(self) -> None:
        with self._store_lock:
            self.store.close()

    # ---------------------------------------------------------------- project
    def project(self) -> Dict[str, Any]:
        from scalebox_cst._version import __version__

        return {
            "root": self.root,
            "name": os.path.basename(self.root),
            "refresh_interval": self.refresh_interval,
            "version": __version__,
            "time": time.time(),
        }

    # ---------------------------------------------------------------- branches
    def _report(self, info: BranchInfo) -> Dict[str, Any]:
        cached = self._reports.get(info.commit)
        if cached is None:
            try:
                cached = self.store.report(info.name)
            except StoreError:
                cached = {}
            self._reports[info.commit] = cached
        return cached

    def _snapshot_history(self) -> Dict[str, Tuple[int, str, int]]:
        """Source snapshot commit -> (1-based index on the source history, message, time)."""
        tip = self.store.source_tip()
        if tip != self._snapshot_tip:
            import pygit2

            found: Dict[str, Tuple[int, str, int]] = {}
            if tip is not None:
                walk = list(self.store.repo.walk(pygit2.Oid(hex=tip), pygit2.enums.SortMode.TOPOLOGICAL | pygit2.enums.SortMode.REVERSE))
                for i, commit in enumerate(walk, 1):
                    found[str(commit.id)] = (i, commit.message.strip().split("\n", 1)[0], commit.commit_time)
            self._snapshots, self._snapshot_tip = found, tip
        return self._snapshots

    def _runs(self, branch: Optional[str] = None) -> List[runs.RunInfo]:
        with self._lock:
            stamp, found = self._runs_cache
            if time.monotonic() - stamp >= self.runs_ttl:
                found = runs.list_runs(self.root)
                self._runs_cache = (time.monotonic(), found)
                listed = {run.dir for run in found}
                for gone in [d for d in self._profiles if d not in listed]:  # a run folder removed
                    del self._profiles[gone]
        return found if branch is None else [r for r in found if r.branch == branch]

    def _run_json(self, run: runs.RunInfo) -> Dict[str, Any]:
        rec = run.record
        headline = dict(rec.get("headline") or {})
        # A run still writing (or one that died without finishing its record) has no stored
        # headline yet: it is computed from the bounded series, read on incrementally.
        live = run.status == "running" or (run.status == "lost" and not headline)
        if live:
            headline.update(self._live_headline(run))
        return {
            "id": run.id,
            "branch": run.branch,
            "run": run.run,
            "status": run.status,
            "variant": run.variant,
            "seed": rec.get("seed"),
            "script": rec.get("script"),
            "args": rec.get("args") or [],
            "started": rec.get("started"),
            "ended": rec.get("ended"),
            "wall_time": rec.get("wall_time"),
            "exit_status": rec.get("exit_status"),
            "signal": rec.get("signal"),
            "hotfix_of": rec.get("hotfix_of"),
            "launcher": rec.get("launcher"),
            "nproc": rec.get("nproc"),
            "headline": {k: _finite_or_none(headline.get(k)) for k in HEADLINE_KEYS if headline.get(k) is not None},
            "headline_live": live,
            # its numbers rest on the readable lines: "metrics.jsonl: 2 damaged lines skipped"
            "damaged": jsonlines.note(headline.get("damaged")),
            "error_tail": rec.get("error_tail") or [],
            "stop_reason": rec.get("stop_reason"),
            "limits": rec.get("limits"),
            "fallbacks": rec.get("fallbacks") or (fallbacks.read(run.dir) if live else None),
            "profile": self._profile(run, live),
        }

    def _profile(self, run: runs.RunInfo, live: bool) -> Optional[Dict[str, Any]]:
        """Where the run's time went (scalebox_cst.profile): its record's, or, live, read on."""
        kept = run.record.get("profile")
        if not live or isinstance(kept, dict):
            if run.dir in self._profiles:  # the run has ended: its reader goes
                with self._lock:
                    self._profiles.pop(run.dir, None)
            return profile.compact(kept if isinstance(kept, dict) else None)
        with self._lock:  # the few new lines since the last poll (a live run appends every 10 s)
            reader = self._profiles.get(run.dir)
            if reader is None:
                reader = self._profiles[run.dir] = profile.Reader(run.dir)
            reader.refresh()
            return profile.compact(profile.reduce(reader.rows, reader.meta, top=5))

    def _live_headline(self, run: runs.RunInfo) -> Dict[str, Any]:
        """Headline numbers of a run still writing, from the bounded series (no full re-read)."""
        mf = self._metrics_file(run)
        out: Dict[str, Any] = {}
        own = mf.series.get(runs.RETURN_NAMES[0])
        workers = [s for key, s in mf.series.items() if runs.is_worker_series(key, "episodic_return") and s.tail]
        # as a finished run's (runs.headline): the workers' episodes where they stepped more;
        # (env steps so far, time) of each source's episodes
        sources = [[(x, t) for x, t, _ in own.tail_points] if own is not None else [],
                   *[[(x, t) for x, t, _ in w.tail_points] for w in workers]]
        in_workers = runs.workers_stepped_most(sources[0], sources[1:])
        for name in runs.RETURN_NAMES:
            s = mf.series.get(name)
            if s is not None and s.tail and not (in_workers and name == runs.RETURN_NAMES[0]):
                out["episodic_return_final"] = sum(s.tail) / len(s.tail)
                out["episodes"] = s.count
                out["metric_return"] = name
                break
            if name == runs.RETURN_NAMES[0]:  # the engine's, stepped in worker processes
                if workers:
                    tails = [v for s in workers for v in s.tail]
                    out["episodic_return_final"] = sum(tails) / len(tails)
                    out["episodes"] = sum(s.count for s in workers)
                    out["metric_return"] = runs.WORKERS + "*/episodic_return"
                    break
        sps_from = None
        for name in runs.SPS_NAMES:
            s = mf.series.get(name)
            if s is not None and s.tail:
                # as a finished run's, over the tail; the engine's x counts env steps
                out["sps"] = headlines.steps_per_second(list(s.tail_points), counts_steps=name == runs.SPS_NAMES[0])
                sps_from = name
                break
        if in_workers and sps_from in (None, runs.SPS_NAMES[0]):
            out["sps"] = headlines.steps_per_second(runs.env_step_points(sources), counts_steps=True)
        legacy = runs.is_legacy(mf.series, run.record)
        for name in runs.GRAD_NORM_NAMES + ((runs.LEGACY_GRAD_NORM,) if legacy else ()):
            grad = mf.series.get(name)
            if grad is not None and grad.last is not None:
                out["grad_norm_last"] = json_number(grad.last[2])
                out["grad_norm_metric"] = name
                break
        out["nonfinite"] = sum(s.nonfinite for s in mf.series.values())
        out["damaged"] = dict(mf.damage)
        passed, fell, whys = site_counts.totals(runs.read_sites(run.dir))
        if passed + fell:
            out["guard_pass_rate"] = passed / (passed + fell)
            out["guard_fallback_why"] = [[why, n] for why, n in whys]
        return out

    def branches(self) -> Dict[str, Any]:
        """Every branch (run and import-hook) oldest first, its snapshot, runs and rewrite counts."""
        with self._store_lock:
            infos = self.store.branches()
            sessions = self.store.other_branches("hook/")
            snapshots = self._snapshot_history()
            reports = {info.name: self._report(info) for info in infos}
            if len(self._reports) > len(infos):  # a branch the store no longer has: its report goes
                shown = {info.commit for info in infos}
                self._reports = {commit: r for commit, r in self._reports.items() if commit in shown}
        by_branch: Dict[str, List[runs.RunInfo]] = {}
        for run in self._runs():
            by_branch.setdefault(run.branch, []).append(run)
        hotfix_events = {}
        for event in self._project_events():
            if event.get("kind") == "hotfix_created" and isinstance(event.get("branch"), str):
                hotfix_events[event["branch"]] = event.get("hotfix_of") or event.get("of") or event.get("message")
        out: List[Dict[str, Any]] = []
        sources_used: Dict[str, Dict[str, Any]] = {}

        def source_json(commit: Optional[str]) -> Optional[Dict[str, Any]]:
            if not commit:
                return None
            if commit not in sources_used:
                index, message, stamp = snapshots.get(commit, (None, "", None))
                match = _ROLLBACK.match(message)
                sources_used[commit] = {
                    "commit": commit, "index": index, "message": message, "time": stamp,
                    "rollback_to": match.group(1) if match else None,
                }
            return sources_used[commit]

        for info in infos:
            try:
                report = RunReport.from_json(reports[info.name]) if reports[info.name] else None
            except ReportError:
                report = None
            source = source_json(info.source_commit)
            # a hot-fix branch says so in its report, in the project's events and in its runs
            hotfix = hotfix_events.get(info.name) or reports[info.name].get("hotfix_of")
            out.append(self._branch_json(
                info.name, "run", info.number, info.commit, info.source_commit, info.time, info.summary,
                report, by_branch.pop(info.name, []), source, hotfix if isinstance(hotfix, str) else None,
            ))
        for name, commit, summary, stamp, count in sessions:
            out.append(self._branch_json(name, "hook", None, commit, None, stamp, summary, None, by_branch.pop(name, []), None, None, commits=count))
        for name, found in sorted(by_branch.items()):  # runs of a branch the store no longer has
            out.append(self._branch_json(name, "runs-only", None, None, None, None, "", None, found, None, None))
        return {"branches": out, "sources": list(sources_used.values())}

    def _branch_json(self, name, kind, number, commit, source_commit, stamp, summary, report, found, source, hotfix_event, commits=None) -> Dict[str, Any]:
        counts = {"rewritten": 0, "skipped": 0, "warning": 0, "errors": 0}
        transforms: Dict[str, int] = {}
        files: List[str] = []
        if report is not None:
            counts.update(report.counts())
            for f in report.files:
                if f.status == "rewritten":
                    files.append(f.path)
                for s in f.sites:
                    if s.action == REWRITTEN:
                        transforms[s.transform] = transforms.get(s.transform, 0) + 1
        run_rows = [self._run_json(r) for r in found]
        hotfix_of = hotfix_event or next((r["hotfix_of"] for r in run_rows if r["hotfix_of"]), None)
        newest = max(run_rows, key=lambda r: (r["started"] or 0, r["run"]), default=None)
        # the headline of the newest run that has numbers (a run that failed at once has none), a
        # rewrite's before any original's: a baseline run last put its numbers in the rewrite's row
        numbered = [r for r in run_rows if r["headline"]]
        numbered = [r for r in numbered if r["variant"] != "original"] or numbered
        shown = max(numbered, key=lambda r: (r["started"] or 0, r["run"]), default=newest)
        # the branch's own baseline (`scalebox run --original`): what its CPU time is read against
        originals = [r["headline"]["cpu_time_s"] for r in run_rows if r["variant"] == "original"
                     and r["status"] == "ok" and isinstance(r["headline"].get("cpu_time_s"), (int, float))]
        return {
            "name": name,
            "kind": kind,
            "number": number,
            "commit": commit,
            "source_commit": source_commit,
            "source_index": source["index"] if source else None,
            "rollback_to": source["rollback_to"] if source else None,
            "hotfix_of": hotfix_of,
            "time": stamp,
            "summary": summary,
            "counts": counts,
            "transforms": transforms,
            "files": files,
            "commits": commits,
            "status": newest["status"] if newest else "not run",
            "headline": shown["headline"] if shown else {},
            "headline_run": shown["id"] if shown else None,
            "original_cpu_time_s": statistics.median(originals) if originals else None,
            "original_runs": len(originals),
            "runs": run_rows,
        }

    # ---------------------------------------------------------------- runs
    def runs(self, branch: str) -> Dict[str, Any]:
        found = self._runs(branch)
        return {"branch": branch, "runs": [self._run_json(r) for r in found]}

    def _metrics_file(self, run: runs.RunInfo) -> MetricsFile:
        path = os.path.join(run.dir, runs.METRICS)
        with self._lock:
            mf = self._metrics.get(path)
            if mf is None:
                mf = self._metrics[path] = MetricsFile(path)
            self._metrics.move_to_end(path)
        mf.refresh(ended=run.status != "running")  # a running run's cut last line is being written
        with self._lock:  # keep the newest files within the byte budget (never the one in use)
            total = sum(m.nbytes for m in self._metrics.values())
            while total > self.cache_bytes and len(self._metrics) > 1:
                _, old = self._metrics.popitem(last=False)
                total -= old.nbytes
        return mf

    def _select(self, branches: Sequence[str], run_ids: Sequence[str]) -> List[runs.RunInfo]:
        if not branches and not run_ids:
            raise ApiError("name a branch (branch=run/0001) or a run (run=run/0001#1)")
        wanted_runs = set(run_ids)
        wanted_branches = set(branches) | {r.rpartition("#")[0] for r in run_ids}
        found = []
        for name in sorted(wanted_branches):
            for run in self._runs(name):
                if name in branches or run.id in wanted_runs:
                    found.append(run)
        return found

    def metric_names(self, branches: Sequence[str] = (), run_ids: Sequence[str] = ()) -> Dict[str, Any]:
        """The metrics the selected runs recorded: name -> number of points, runs that have it."""
        names: Dict[str, Dict[str, Any]] = {}
        for run in self._select(branches, run_ids):
            mf = self._metrics_file(run)
            for name, s in mf.series.items():
                entry = names.setdefault(name, {"points": 0, "runs": 0, "nonfinite": 0})
                entry["points"] += s.count
                entry["runs"] += 1
                entry["nonfinite"] += s.nonfinite
        return {"metrics": names}

    def series(self, metric: str, branches: Sequence[str] = (), run_ids: Sequence[str] = (), axis: str = "step", points: int = DEFAULT_POINTS) -> Dict[str, Any]:
        """One metric of the selected runs, each downsampled to about ``points`` points.

        ``axis``: ``step`` (the metric's own x: environment steps for episodic return) or
        ``time`` (seconds since the run started). Runs of one branch and variant that carry
        different seeds also get a ``band``: their mean with min and max on a common grid.
        """
        if axis not in ("step", "time"):
            raise ApiError("axis must be step or time")
        points = max(10, min(int(points), MAX_POINTS))
        lines: List[Dict[str, Any]] = []
        groups: Dict[Tuple[str, str], List[Tuple[runs.RunInfo, Series, float]]] = {}
        for run in self._select(branches, run_ids):
            mf = self._metrics_file(run)
            s = mf.series.get(metric)
            if s is None:
                continue
            origin = 0.0
            if axis == "time":
                started = run.record.get("started")
                origin = float(started) if isinstance(started, (int, float)) else (mf.first_time or 0.0)
            data = s.points(points, axis)
            if origin:
                data["x"] = [x - origin for x in data["x"]]
            markers = [{"x": (mt if axis == "time" else mx) - origin, "value": kind} for mx, mt, kind in s.markers]
            lines.append({
                "run": run.id, "branch": run.branch, "variant": run.variant, "seed": run.record.get("seed"),
                "status": run.status, "x": data["x"], "y": data["y"], "count": s.count,
                "nonfinite": s.nonfinite, "markers": markers, "summary": s.summary(),
            })
            if run.record.get("seed") is not None:
                groups.setdefault((run.branch, run.variant), []).append((run, s, origin))
        bands = []
        for (branch, variant), members in sorted(groups.items()):
            seeds = {m[0].record.get("seed") for m in members}
            if len(seeds) < 2:
                continue
            band = _band(members, axis)
            if band is not None:
                bands.append({"branch": branch, "variant": variant, "runs": [m[0].id for m in members], "seeds": sorted(seeds), **band})
        return {"metric": metric, "axis": axis, "lines": lines, "bands": bands}

    # ---------------------------------------------------------------- diff and sites
    def diff(self, branch: str) -> Dict[str, Any]:
        """The labelled hunks of ``scalebox diff BRANCH``, skipped candidates, site telemetry."""
        with self._store_lock:
            try:
                info = self.store.resolve_any(branch)
            except StoreError as exc:
                raise ApiError(str(exc), 404) from None
            key = info.commit
            cached = self._diffs.get(key)
            if cached is None:
                cached = self._diff_json(info)
                self._diffs[key] = cached
                while len(self._diffs) > 64:
                    self._diffs.popitem(last=False)
            self._diffs.move_to_end(key)
        return {**cached, "sites_measured": self.sites(info.name)["sites"]}

    def _diff_json(self, info) -> Dict[str, Any]:
        store = self.store
        if isinstance(info, BranchInfo):
            try:
                report = RunReport.from_json(store.report(info.name))
            except (StoreError, ReportError):
                report = RunReport(info.name, info.commit, info.source_commit, backend="")
            report.branch, report.commit, report.source_commit = info.name, info.commit, info.source_commit

            def read_old(path):
                return store.read_file(info.source_commit, path) if info.source_commit else None

            def read_new(path):
                return store.read_file(info.commit, path)

        else:
            report, read_old, read_new = diffview.session_report(store, info)
        files = []
        for f in report.files:
            old, new = read_old(f.path), read_new(f.path)
            hunks = diffview.file_hunks(f, old, new) if old != new else []
            for hunk in hunks:
                hunk["sites"] = [s.to_json() for s in hunk["sites"]]
            others = [s for s in f.sites if s.action != REWRITTEN]
            if not hunks and not others and not f.error:
                continue
            files.append({
                "path": f.path,
                "status": f.status,
                "error": f.error,
                "hunks": hunks,
                "rewritten": [s.to_json() for s in f.sites if s.action == REWRITTEN],
                "left_alone": [s.to_json() for s in others],
            })
        return {
            "branch": report.branch, "commit": report.commit, "source_commit": report.source_commit,
            "backend": report.backend, "summary": report.summary(), "files": files,
        }

    def sites(self, branch: str) -> Dict[str, Any]:
        """Per site, over the branch's runs: guard pass rate (vectorized / all) and time spent."""
        rows: Dict[Tuple[str, int, str], List[Dict[str, Any]]] = {}  # a site's rows, one per run
        for run in self._runs(branch):
            for site in runs.read_sites(run.dir):
                try:
                    key = (str(site.get("path")), int(site.get("line") or 0), str(site.get("transform")))
                except (TypeError, ValueError, OverflowError):  # a line of Infinity
                    continue
                rows.setdefault(key, []).append(site)
        out = []
        for (path, line, transform), group in sorted(rows.items(), key=lambda kv: kv[0][:2]):
            vec, fall, whys = site_counts.totals(group)  # added up as a run's headline adds its sites
            out.append({"path": path, "line": line, "transform": transform, "vectorized": vec, "fallback": fall,
                        "time_s": sum(site_counts.seconds(s) for s in group), "runs": len(group),
                        "pass_rate": site_counts.pass_rate(vec, fall), "fallback_why": [[w, n] for w, n in whys]})
        return {"branch": branch, "sites": out}

    # ---------------------------------------------------------------- events
    def _events_file(self, path: str, keep: Optional[int] = None) -> EventsFile:
        keep = EVENTS_FILES if keep is None else keep
        with self._lock:
            ef = self._events.get(path)
            if ef is None:
                ef = self._events[path] = EventsFile(path)
            self._events.move_to_end(path)
            while len(self._events) > keep:
                self._events.popitem(last=False)
        ef.refresh()
        return ef

    def _project_events(self) -> List[Dict[str, Any]]:
        return list(self._events_file(runs.project_events_path(self.root)).events)

    def events(self, limit: int = 100, since: float = 0.0) -> Dict[str, Any]:
        """The newest events of the project and of every run, newest first.

        A run's ``failed`` event carries the run's last traceback lines (``error_tail``).
        """
        limit = max(1, min(int(limit), 1000))
        project = self._events_file(runs.project_events_path(self.root))
        found: List[Dict[str, Any]] = [{**e, "scope": "project"} for e in project.events]
        damaged = [said for said in [jsonlines.note(project.damage)] if said]  # lines the files read skipped
        found = [e for e in found if _event_time(e) > since]
        # Runs newest first by their events file's mtime (no event of a file is newer than it, within
        # a coarse clock's slack); a file whose newest event could not be among the ``limit`` newest
        # found so far is not read, so only the few runs shown are held, not every run ever seen.
        candidates = []
        for run in self._runs():
            path = os.path.join(run.dir, runs.EVENTS)
            try:
                newest = os.stat(path).st_mtime + _MTIME_SLACK
            except OSError:
                continue  # no events file: no events
            if newest > since:
                candidates.append((newest, run, path))
        candidates.sort(key=lambda c: c[0], reverse=True)
        shown: List[float] = []  # the newest ``limit`` event times so far, oldest at [0]
        for read, (newest, run, path) in enumerate(candidates):
            if len(shown) >= limit and newest < shown[0]:
                break
            ef = self._events_file(path, keep=max(EVENTS_FILES, read + 2))
            if ef.damage:
                damaged.append(f"{run.id}: {jsonlines.note(ef.damage)}")
            for event in ef.events:
                item = {**event, "scope": "run", "run": run.id, "branch": run.branch}
                stamp = _event_time(item)
                if stamp <= since:
                    continue
                if item.get("kind") == "failed" and not item.get("error_tail"):
                    item["error_tail"] = run.record.get("error_tail") or []
                found.append(item)
                if len(shown) < limit:
                    heapq.heappush(shown, stamp)
                elif stamp > shown[0]:
                    heapq.heapreplace(shown, stamp)
        found.sort(key=_event_time, reverse=True)
        return {"events": runs.json_safe(found[:limit]), "damaged": damaged}


def _event_time(event: Dict[str, Any]) -> float:
    stamp = event.get("time")
    return float(stamp) if isinstance(stamp, (int, float)) and math.isfinite(stamp) else 0.0


def _band(members: List[Tuple[runs.RunInfo, Series, float]], axis: str) -> Optional[Dict[str, Any]]:
    """Mean, min and max of several runs' series on the x range they all cover."""
    curves = []
    for _, series, origin in members:
        x, y = series.means(BAND_POINTS, axis)
        if len(x) == 0:
            continue
        curves.append((x - origin, y))
    if len(curves) < 2:
        return None
    lo = max(float(c[0][0]) for c in curves)
    hi = min(float(c[0][-1]) for c in curves)
    if not hi > lo:
        return None
    grid = np.linspace(lo, hi, BAND_POINTS)
    stack = np.vstack([np.interp(grid, x, y) for x, y in curves])
    return {
        "x": grid.tolist(),
        "mean": stack.mean(axis=0).tolist(),
        "lo": stack.min(axis=0).tolist(),
        "hi": stack.max(axis=0).tolist(),
        "n": len(curves),
    }


def names_from_query(values: Iterable[str]) -> List[str]:
    """``branch=a&branch=b`` and ``branch=a,b`` alike."""
    out: List[str] = []
    for value in values:
        out.extend(v for v in value.split(",") if v)
    return out
