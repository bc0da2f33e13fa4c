"""What happened: ``scalebox log`` (branches and their runs), ``compare``, ``profile`` and ``status``."""
from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional, Tuple

import click

from scalebox_cst import headlines, jsonlines, site_counts
from scalebox_cst.cli._common import _config_changed, _fail, _open_project, _tree_changes, _warn_skipped, cli
from scalebox_cst.project import Project
from scalebox_cst.report import ReportError, RunReport
from scalebox_cst.store import StoreError


# ---------------------------------------------------------------------------- log
def _branch_changes(store, info, parent) -> dict:
    """What a branch changed since the branch before it: files, transforms, backend, config."""
    from collections import Counter

    try:
        report = store.report(info.name)
        counts = Counter(RunReport.from_json(report).rewritten_counts())
    except (StoreError, ReportError):
        report, counts = {}, Counter()
    files_now = store.files(info.source_commit) if info.source_commit else {}
    if parent is not None and parent.source_commit:
        files_before = store.files(parent.source_commit)
        changed = [f"M {p}" for p in sorted(set(files_now) & set(files_before)) if files_now[p] != files_before[p]]
        changed += [f"A {p}" for p in sorted(set(files_now) - set(files_before))]
        changed += [f"D {p}" for p in sorted(set(files_before) - set(files_now))]
    else:
        changed = [f"A {p}" for p in sorted(files_now)]
    backend = report.get("backend")
    parent_backend = None
    if parent is not None:
        try:
            parent_backend = store.report(parent.name).get("backend")
        except StoreError:
            pass
    return {
        "parent": parent.name if parent is not None else None,
        "files": changed,
        "transforms": dict(sorted(counts.items())),
        "backend": backend,
        "backend_changed": parent is not None and parent_backend != backend,
        "config_changed": parent is not None and parent.fingerprint != info.fingerprint,
        "fingerprint": info.fingerprint,
        "hotfix_of": report.get("hotfix_of"),  # scalebox_cst.hotfix: "run/0002#1"
        "hotfix": report.get("hotfix"),
    }


def _run_entry(run_info) -> dict:
    from scalebox_cst import runs

    record = dict(run_info.record)
    head = record.get("headline") or {}
    if record.get("status") in ("running", "lost") or not head:
        head = runs.run_headline(run_info)
    record["headline"] = head
    record["id"] = run_info.id
    record["dir"] = run_info.dir
    return record


def _numbers(head: Any) -> Dict[str, Any]:
    """The headline with values of the wrong type dropped (a damaged record.json): missing, not a crash."""
    if not isinstance(head, dict):
        return {}
    return {k: v for k, v in head.items() if not (k in NUMERIC_HEADLINE and (isinstance(v, bool) or not isinstance(v, (int, float))))}


NUMERIC_HEADLINE = ("episodic_return_final", "episodic_return_best", "episodes", "sps", "guard_pass_rate", "site_time_s")


def _run_line(entry: dict) -> str:
    head = _numbers(entry.get("headline"))
    text = f"  #{entry['run']:<3} {entry.get('status', '?'):<8}"
    text += " original" if entry.get("variant") == "original" else " " * 9
    wall = entry.get("wall_time")
    if wall is None and entry.get("started"):
        end = entry.get("ended") or __import__("time").time()
        wall = end - entry["started"]
    text += f" {wall:7.1f}s" if wall is not None else "        -"
    if entry.get("seed") is not None:
        text += f" seed={entry['seed']}"
    if (entry.get("tags") or {}).get("study") is not None:  # scalebox explore's runs
        text += f" study={entry['tags']['study']} trial={entry['tags'].get('trial')}"
    text += f"  {entry.get('script', '?')}"
    if entry.get("args"):
        text += " " + " ".join(entry["args"])
    facts = []
    code = entry.get("exit_status")
    if entry.get("status") == "failed" and type(code) is int and code and not entry.get("signal"):
        facts.append(f"exit {code}")  # the script's own code, as `scalebox run` says it
    if head.get("episodic_return_final") is not None:
        best = head.get("episodic_return_best")
        facts.append(f"return {head['episodic_return_final']:.4g} (best {'?' if best is None else format(best, '.4g')}, "
                     f"{head.get('episodes', 0)} ep)")
    if head.get("sps") is not None:
        facts.append(headlines.shown("sps", head["sps"]))
    guards = site_counts.guards_text(head.get("guard_pass_rate"), head.get("guard_fallback_why"))
    if guards is not None:
        facts.append(guards)
    if head.get("site_time_s") is not None:
        # sampled time: with no sample at all the sites were too brief to see, which is not "0 s"
        facts.append(f"sites {head['site_time_s']:.3g}s" if head.get("site_samples") != 0 else "sites below sampling")
    last = head.get("last") or {}
    if head.get("episodic_return_final") is None:
        for key in ("final_return", "episode_return", "loss"):
            value = last.get(key)
            if isinstance(value, (int, float)):
                facts.append(f"{key}={value:.4g}")
    from scalebox_cst.runs import grad_norm_fact

    facts.extend(grad_norm_fact(head))
    if entry.get("stop_reason"):
        facts.append(f"{'stopped' if entry.get('status') != 'failed' else 'failed'}: {entry['stop_reason']}")
    from scalebox_cst import fallbacks

    said = fallbacks.fact(entry.get("fallbacks") or (fallbacks.read(entry["dir"]) if entry.get("status") == "running" and entry.get("dir") else None))
    if said:
        facts.append(said)
    if entry.get("hotfix_of"):
        facts.append(f"hot-fix of {entry['hotfix_of']}")
    damaged = jsonlines.note(head.get("damaged"))  # the numbers above rest on the readable lines
    if damaged:
        facts.append(damaged)
    if facts:
        text += "  | " + ", ".join(facts)
    return text


@cli.command()
@click.option("--project", "project_dir", type=click.Path(file_okay=False, exists=True), help="Project root.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output: everything shown, and more.")
def log(project_dir: Optional[str], as_json: bool) -> None:
    """Branches, newest first: what each changed since its parent, and each of its runs."""
    import time as _time

    from scalebox_cst import runs

    project = _open_project(project_dir)
    try:
        store = project.store
        branches = store.branches()
        sessions = store.other_branches("hook/")
        by_branch: dict = {}
        for run_info in runs.list_runs(project.root):
            by_branch.setdefault(run_info.branch, []).append(_run_entry(run_info))
        entries = []
        for index in range(len(branches) - 1, -1, -1):
            info = branches[index]
            entries.append({
                "branch": info.name,
                "commit": info.commit,
                "source_commit": info.source_commit,
                "summary": info.summary,
                "time": info.time,
                "changes": _branch_changes(store, info, branches[index - 1] if index else None),
                "runs": by_branch.get(info.name, []),
            })
    except StoreError as exc:
        _fail(str(exc))
    session_entries = [
        {"branch": name, "commit": commit, "summary": summary, "time": stamp, "commits": count, "runs": by_branch.get(name, [])}
        for name, commit, summary, stamp, count in reversed(sessions)
    ]
    if as_json:
        click.echo(json.dumps(runs.json_safe(entries + session_entries), indent=2, default=str))
        return
    if not entries and not session_entries:
        click.echo("no run branches yet")
    for entry in entries:
        when = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(entry["time"]))
        click.echo(f"{entry['branch']}  {entry['commit'][:10]}  {when}  {entry['summary'].removeprefix('rewrite: ')}")
        ch = entry["changes"]
        files = ch["files"]
        shown = ", ".join(files[:6]) + (f", ... ({len(files)} files)" if len(files) > 6 else "")
        since = f"since {ch['parent']}" if ch["parent"] else "first branch"
        parts = [f"files {since}: {shown or 'none'}"]
        if ch["transforms"]:
            parts.append("transforms: " + ", ".join(f"{t} x{n}" for t, n in ch["transforms"].items()))
        parts.append(f"backend {ch['backend']}" + (" (changed)" if ch["backend_changed"] else ""))
        if ch["config_changed"]:
            parts.append("config/pipeline changed")
        click.echo("  " + "; ".join(parts))
        if ch.get("hotfix_of"):
            fix = ch.get("hotfix") or {}
            click.echo(f"  HOT-FIX of {ch['hotfix_of']} (step {fix.get('step')}, {fix.get('signal')}): "
                       f"fixed clip max_norm={fix.get('max_norm')}, non-finite steps skipped; keep it or roll back")
        if not entry["runs"]:
            click.echo("  (not run)")
        for run_entry in entry["runs"]:
            click.echo(_run_line(run_entry))
    for entry in session_entries:
        when = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(entry["time"]))
        click.echo(f"{entry['branch']}  {entry['commit'][:10]}  {when}  import-hook session: {entry['commits']} module commit(s), last: {entry['summary']}")
        for run_entry in entry["runs"]:
            click.echo(_run_line(run_entry))




# ---------------------------------------------------------------------------- compare
def _select_runs(project: Project, selector: str, beside: Optional[str] = None) -> Tuple[str, list]:
    """BRANCH (its rewrite runs), BRANCH#N (one run), BRANCH:original or `original` (runs of the
    source snapshot of BRANCH, default ``beside`` (the branch it is compared with), else the newest
    branch, or of any snapshot of the same files: an edit undone commits them again): (label, runs)."""
    from scalebox_cst import runs

    store = project.store
    text = selector.strip()
    number = None
    variant = "rewrite"
    if text == "original" or text.endswith(":original"):
        variant = "original"
        text = text[: -len(":original")] if text.endswith(":original") else ""
    if "#" in text:
        text, _, raw = text.partition("#")
        try:
            number = int(raw)
        except ValueError:
            _fail(f"bad run {selector!r}: expected BRANCH#N, e.g. run/0003#2", 2)
    if text.startswith("hook/"):
        branch, source = text, None
    else:
        info = store.resolve(text or beside or (store.newest_branch() or "run/0001"))
        branch, source = info.name, info.source_commit
    found = runs.list_runs(project.root) if variant == "original" else runs.list_runs(project.root, branch)
    chosen = []
    trees: Dict[str, Optional[str]] = {}  # source commit -> its tree: snapshots of the same files are one original

    def same_files(commit) -> bool:
        if not source or not isinstance(commit, str):
            return False
        if commit == source:
            return True
        for c in (source, commit):
            if c not in trees:
                trees[c] = store.tree_of(c)
        return trees[source] is not None and trees[source] == trees[commit]

    for r in found:
        if r.variant != variant:
            continue
        if variant == "original" and r.branch != branch and not same_files(r.record.get("source_commit")):
            continue
        if number is not None and (r.branch != branch or r.run != number):
            continue
        chosen.append(r)
    if number is not None and not chosen:
        _fail(f"no run {branch}#{number}", 1)
    label = f"{branch}#{number}" if number is not None else branch
    if variant == "original":
        label = f"original ({branch})" if number is None else f"{label} original"
    return label, chosen


@cli.command()
@click.argument("selectors", nargs=-1, required=True)
@click.option("--metric", "metrics", multiple=True, help="Compare this metric (a series name or episodic_return, sps, ...); repeatable.")
@click.option("--args", "script_args", metavar="TEXT", help="Only runs started with these script arguments "
              "(shell words; the --seed N of --seeds aside), e.g. --args '--episodes 80'.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--project", "project_dir", type=click.Path(file_okay=False, exists=True), help="Project root.")
def compare(selectors: Tuple[str, ...], metrics: Tuple[str, ...], script_args: Optional[str], as_json: bool,
            project_dir: Optional[str]) -> None:
    """Compare branches, runs or the original: compare A B [C ...].

    Each of A, B, ... is BRANCH (its rewrite runs), BRANCH#N (one run), `original` (runs of the
    source snapshot of the first branch named beside it, else of the newest branch, `scalebox run
    --original`) or BRANCH:original. Per metric:
    the mean over runs with a 95% bootstrap interval when there are several (seeds), and whether
    each difference from A is within noise."""
    from scalebox_cst import compare as stats
    from scalebox_cst import runs

    if len(selectors) < 2:
        _fail("compare needs at least two of BRANCH, BRANCH#N, original", 2)
    project = _open_project(project_dir)
    try:
        # a bare `original` is the original of the branch it is compared with (`compare original
        # run/0001` after an edit made run/0002 compared run/0002's snapshot, with no runs)
        named = [s.strip().partition("#")[0] for s in selectors if s.strip() != "original"
                 and not s.strip().endswith(":original") and not s.strip().startswith("hook/")]
        groups = [_select_runs(project, s, named[0] if named else None) for s in selectors]
    except StoreError as exc:
        _fail(str(exc))
    if script_args is not None:
        try:
            groups = stats.with_args(groups, script_args)
        except ValueError as exc:  # shlex: an unclosed quote
            _fail(f"--args {script_args!r}: {exc}", 2)
    result = stats.compare(groups, metrics)
    if as_json:
        click.echo(json.dumps(runs.json_safe(result), indent=2))
        return
    click.echo(stats.render(result), nl=False)


@cli.command("profile")
@click.argument("run_id", metavar="[RUN]", required=False)
@click.option("--lines", default=10, show_default=True, help="How many of the hottest lines to show.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--project", "project_dir", type=click.Path(file_okay=False, exists=True), help="Project root.")
def profile_command(run_id: Optional[str], lines: int, as_json: bool, project_dir: Optional[str]) -> None:
    """Where a run's time went (RUN: BRANCH#N or BRANCH; default the newest run): time per
    category, the hottest lines of the user's code, and whether a transform covers each."""
    from scalebox_cst import profile as prof
    from scalebox_cst import runs

    project = _open_project(project_dir)
    selector = run_id
    if run_id and not run_id.startswith("hook/"):
        branch, sep, number = run_id.partition("#")
        try:
            selector = project.store.resolve(branch).name + sep + number
        except StoreError as exc:
            _fail(str(exc))
    run = prof.pick(runs.list_runs(project.root), selector)
    if run is None:
        _fail(f"no run {run_id}" if run_id else "no run yet (scalebox run SCRIPT)")
    result = prof.build(run.dir, run.record, project.store.store_path(project.root), top=max(lines, prof.TOP),
                        ended=run.status != "running")
    from scalebox_cst import fallbacks

    fallbacks.mark_profile(result, run.record.get("fallbacks") or fallbacks.read(run.dir))
    if as_json:
        click.echo(json.dumps(runs.json_safe({"run": run.id, "profile": result}), indent=2))
        return
    click.echo(prof.render(result, run.id, lines), nl=False)




# ---------------------------------------------------------------------------- status
@cli.command()
@click.option("--project", "project_dir", type=click.Path(file_okay=False, exists=True), help="Project root.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(project_dir: Optional[str], as_json: bool) -> None:
    """Whether the working tree differs from the newest branch, and which runs are running."""
    from scalebox_cst import runs

    project = _open_project(project_dir)
    try:
        newest = project.store.newest_branch()
        info = project.store.resolve(newest) if newest else None
        current = project.scan()
        changes = _tree_changes(project, info.source_commit if info else None, current)
        # after a rollback (or an undo) the files are the newest snapshot's, which no branch is
        # rewritten from yet: say so, not only that they differ from the newest branch
        tip = project.store.source_tip()
        at_tip = bool(changes) and tip is not None and tip != (info.source_commit if info else None) \
            and not _tree_changes(project, tip, current)
        tip_title = project.store.snapshot_title(tip) if at_tip and tip is not None else None
    except StoreError as exc:
        _fail(str(exc))
    _warn_skipped(project)  # a file the snapshot leaves out is not "matched" without a word
    config_changed = info is not None and _config_changed(project, info)
    running: List[Dict[str, Any]] = [
        {"run": r.id, "pid": r.record.get("pid"), "variant": r.variant, "script": r.record.get("script"), "started": r.record.get("started")}
        for r in runs.list_runs(project.root) if r.status == "running"
    ]
    data = {
        "newest": newest,
        "commit": info.commit if info else None,
        "source_commit": info.source_commit if info else None,
        "clean": bool(info) and not changes and not config_changed,
        "changes": changes,
        "matches_snapshot": tip if at_tip else None,
        "config_changed": config_changed,
        "running": running,
        "skipped": list(project.skipped),
    }
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    if info is None:
        click.echo("no run branches yet: `scalebox rewrite .` or `scalebox run SCRIPT` commits the working tree")
    elif data["clean"]:
        click.echo(f"working tree matches {newest} ({info.commit[:10]})")
    else:
        if at_tip and tip is not None:
            title = re.sub(r" \(previous files: [0-9a-f]+\)$", "", tip_title or "")
            click.echo(f"working tree matches snapshot {tip[:10]} ({title}); no branch is rewritten from it yet")
        click.echo(f"working tree differs from {newest} ({info.commit[:10]}); `scalebox run` commits it first:")
        for line in changes:
            click.echo(f"  {line}")
        if config_changed:
            click.echo("  config/pipeline changed (scalebox.toml, transforms or engine)")
    for r in running:
        click.echo(f"running: {r['run']} {r['variant']} {r['script']} (pid {r['pid']}, {_running_for(r['started'])})")


def _running_for(started: Any) -> str:
    """``12s`` since a run's start; a start later than now (a record from a host whose clock is
    ahead, or a damaged one: ``1e308`` read as ``-1e+308s``) is not turned into a negative age."""
    import time as _time

    now = _time.time()
    if not isinstance(started, (int, float)) or started > now + 60:
        return "start time unknown"
    return f"{max(0.0, now - started):.0f}s"
