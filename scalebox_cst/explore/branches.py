"""Every trial is a branch: the project's files with the trial's values, rewritten and committed.

A trial's commit is an ordinary run branch: its source snapshot is the user's files as they are
(nothing in the working tree changes), its rewrite is the usual pipeline's output of those files
with each tuned place's literal replaced, and each replaced literal is an ``explore.constant``
site (``changes-semantics``: ``LR 3e-4 -> 0.0012 (study S, trial 7)``) beside the transforms'
own, so ``scalebox diff`` labels the hunk. The pipeline fingerprint carries ``explore=S#7``: a
later plain ``scalebox run`` does not take the newest trial for the working tree's branch.

:func:`start_run` is the one place a trial's run is started (what ``scalebox run`` does for one
seed of a commit), so the run supervisor can take it over in one place.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from scalebox_cst.explore.places import Place, PlaceError, find_places, render, set_values
from scalebox_cst.report import CHANGES_SEMANTICS, REWRITTEN, FileReport, RunReport, Site

TRANSFORM = "explore.constant"
_LOCK = threading.Lock()  # trials committed from several threads (parallel: N) one at a time
_FOUND: Dict[Tuple[str, bytes], List[Place]] = {}  # (path, source) -> its places: a study's file is parsed once


def _places(path: str, source: bytes) -> List[Place]:
    key = (path, source)
    if key not in _FOUND:
        if len(_FOUND) > 64:
            _FOUND.clear()
        _FOUND[key] = find_places(path, source)
    return _FOUND[key]


def places_of(files: Dict[str, bytes], paths: Iterable[str]) -> List[Place]:
    """The tunable places of the given project files (a missing one: PlaceError)."""
    out: List[Place] = []
    for path in paths:
        if path not in files:
            raise PlaceError(f"{path}: not a file of the project's snapshot (a typo, or left out by scalebox.toml?)")
        out.extend(_places(path, files[path]))
    return out


def reason(place: Place, value: Any, label: str) -> str:
    """``LR 3e-4 -> 0.0012 (study S, trial 7)``: one breath."""
    return f"{place.name} {place.text} -> {render(value)} ({label})"


def commit_values(project, assignments: Sequence[Tuple[Place, Any]], label: str, tag: str, message: str) -> Tuple[str, str, RunReport]:
    """Commit a branch whose rewrite carries ``assignments`` (place, new value) on top of the usual
    rewrites; returns (branch, commit, report). The places are looked up again in the current
    files: one that moved or went away is a PlaceError naming it."""
    with _LOCK:
        store = project.ensure_store()
        files = project.scan()
        by_path: Dict[str, List[Tuple[Place, Any]]] = {}
        current = {}
        for place, value in assignments:
            if place.path not in current:
                current[place.path] = _places(place.path, files[place.path]) if place.path in files else []
            same = [p for p in current[place.path] if p.qualified == place.qualified and p.kind == place.kind]
            here = min(same, key=lambda p: abs(p.line - place.line), default=None) if len(same) > 1 else (same[0] if same else None)
            if here is None:
                raise PlaceError(f"places no longer in the code: {place.ref}")
            by_path.setdefault(place.path, []).append((here, value))
        edited = dict(files)
        for path, edits in by_path.items():
            edited[path] = set_values(files[path], edits)
        results = project.rewrite_files(edited)
        reports: List[FileReport] = []
        for path, result in results.items():
            rep = result.report
            sites = list(rep.sites)
            if path in by_path:
                sites += [Site(TRANSFORM, p.line, p.line, REWRITTEN, reason(p, v, label), CHANGES_SEMANTICS) for p, v in by_path[path]]
                sites.sort(key=lambda s: (s.line, s.transform))
                rep = FileReport(path, "rewritten" if rep.status != "error" else rep.status, rep.error, sites)
            reports.append(rep)
        report = RunReport(None, None, None, project.backend, reports)
        source_commit, _ = store.snapshot(files, message)
        report.source_commit = source_commit
        from scalebox_cst.project import report_text

        out_files = {path: r.output for path, r in results.items()}
        fingerprint = f"{project.pipeline.fingerprint} explore={tag}"
        branch, commit = store.commit_rewrite(source_commit, out_files, f"{message}: {report.summary()}",
                                              report_text(report), report.to_json(), fingerprint)
        report.branch, report.commit = branch, commit
        return branch, commit, report


def start_run(project, branch: str, commit: str, source_commit: Optional[str], script: str, args: Sequence[str],
              seed: Optional[int], tags: Dict[str, Any], echo=None, label_output: bool = False):
    """Start one run of ``script`` from ``commit`` as ``scalebox run BRANCH SCRIPT --seeds SEED`` does
    (``--seed N`` where the script takes it, else the launcher seeds the RNGs); returns the
    started run (``poll``/``wait``/``stop``, ``dir``, ``record``), held by the one run supervisor."""
    from scalebox_cst.runner import seedopt
    from scalebox_cst.runner.supervisor import RunSpec, RunSupervisor

    run_args, seed_via = seedopt.seeded(project.store.read_file(commit, script) if seed is not None else None, args, seed)
    supervisor = RunSupervisor.for_project(project, echo=echo, notice=lambda text: None, label_output=label_output)
    return supervisor.start(RunSpec(branch, commit, script, tuple(run_args), source_commit=source_commit,
                                    seed=seed, seed_via=seed_via, tags=tags))


def mark_pruned(execution, why: str) -> Dict[str, Any]:
    """Stop a run the pruner gave up on and record it ``pruned`` (not ``stopped``: nobody stopped it by hand)."""
    from scalebox_cst import runs

    record = execution.stop(reason=why, grace=1.0)
    record.status = "pruned"
    runs.write_record(execution.dir, record.to_json())
    runs.append_event(os.path.join(execution.dir, runs.EVENTS), "pruned", f"{record.id} pruned: {why}")
    return record.to_json()
