"""Reading, undoing and compacting branches: ``scalebox diff``, ``rollback``, ``undo`` and ``gc``."""
from __future__ import annotations

import sys
from typing import List, Optional

import click

from scalebox_cst.cli._common import FiniteFloat, _fail, _open_project, cli
from scalebox_cst.store import Store, StoreError


# ---------------------------------------------------------------------------- diff
def _source_diff(store, old, new, stat: bool, color: bool) -> str:
    """The source change between two branches' snapshots (what the user edited), as a unified
    diff or, with ``stat``, one line per file."""
    import difflib

    before = store.files(old.source_commit) if old.source_commit else {}
    after = store.files(new.source_commit) if new.source_commit else {}
    out: List[str] = []
    totals = [0, 0, 0]
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path), after.get(path)
        if a == b:
            continue
        a_lines = a.decode("utf-8", "replace").splitlines(True) if a is not None else []
        b_lines = b.decode("utf-8", "replace").splitlines(True) if b is not None else []
        lines = list(difflib.unified_diff(
            a_lines, b_lines, f"a/{path}" if a is not None else "/dev/null", f"b/{path}" if b is not None else "/dev/null",
        ))
        added = sum(1 for line in lines[2:] if line.startswith("+"))
        removed = sum(1 for line in lines[2:] if line.startswith("-"))
        totals[0] += 1
        totals[1] += added
        totals[2] += removed
        if stat:
            out.append(f" {path} | +{added} -{removed}\n")
            continue
        for line in lines:
            if not line.endswith("\n"):
                line += "\n\\ No newline at end of file\n"
            if color and line.startswith(("+++", "---")):
                line = click.style(line, bold=True)
            elif color and line.startswith("+"):
                line = click.style(line, fg="green")
            elif color and line.startswith("-"):
                line = click.style(line, fg="red")
            elif color and line.startswith("@@"):
                line = click.style(line, fg="cyan")
            out.append(line)
    if not totals[0]:
        return f"no source change between {old.name} and {new.name}\n"
    if stat:
        out.append(f" {totals[0]} file(s) changed, +{totals[1]} -{totals[2]} ({old.name} -> {new.name})\n")
    return "".join(out)


@cli.command()
@click.argument("branch", required=False)
@click.argument("other", required=False)
@click.option("--stat", is_flag=True, help="Per-file summary instead of the diff.")
@click.option("--details", is_flag=True, help="Under each site, its details (JSON): the run-time guards' contracts.")
@click.option("--color/--no-color", default=None, help="Colour (default: only on a terminal).")
@click.option("--project", "project_dir", type=click.Path(file_okay=False, exists=True), help="Project root.")
def diff(branch: Optional[str], other: Optional[str], stat: bool, details: bool, color: Optional[bool],
         project_dir: Optional[str]) -> None:
    """Show BRANCH as original -> rewrite, hunks labelled with transform and reason;
    `diff A B`: the source change (what was edited) from branch A to branch B.

    BRANCH is a run branch (run/0002, 2) or an import-hook session as `scalebox log` lists it
    (hook/<session>, or the session id); default: the newest run branch, else the newest session.
    """
    from scalebox_cst import diffview
    from scalebox_cst.report import ReportError, RunReport
    from scalebox_cst.store import BranchInfo

    project = _open_project(project_dir)
    if other is not None:
        try:
            old, new = project.store.resolve(branch), project.store.resolve(other)
            use_color = sys.stdout.isatty() if color is None else color
            click.echo(_source_diff(project.store, old, new, stat, use_color), nl=False, color=use_color)
        except StoreError as exc:
            _fail(str(exc))
        return
    try:
        store = project.store
        name = branch or store.newest_branch()
        if name is None:
            sessions = store.other_branches("hook/")
            if not sessions:
                _fail("no run branches or import-hook sessions yet")
            name = sessions[-1][0]
        info = store.resolve_any(name)
        if isinstance(info, BranchInfo):
            try:
                report = RunReport.from_json(store.report(info.name))
            except ReportError as exc:
                _fail(f"the report of {info.name} cannot be read: {exc}")
            report.branch, report.commit, report.source_commit = info.name, info.commit, info.source_commit
            source_commit = info.source_commit

            def read_old(path):
                return store.read_file(source_commit, path)

            def read_new(path):
                return store.read_file(info.commit, path)

        else:
            report, read_old, read_new = diffview.session_report(store, info)
    except StoreError as exc:
        _fail(str(exc))

    if stat:
        click.echo(diffview.render_stat(report, read_old, read_new), nl=False)
        return
    use_color = sys.stdout.isatty() if color is None else color
    click.echo(diffview.render(report, read_old, read_new, color=use_color, details=details), nl=False, color=use_color)




# ---------------------------------------------------------------------------- rollback
@cli.command()
@click.argument("branch")
@click.option("--project", "project_dir", type=click.Path(file_okay=False, exists=True), help="Project root.")
def rollback(branch: str, project_dir: Optional[str]) -> None:
    """Restore the files of BRANCH's source snapshot (current files are snapshotted first).

    BRANCH is a run branch (run/0001) or a snapshot id a rollback printed, so a rollback can be
    rolled back; `scalebox undo` reverts the last one. All files are replaced, or none.
    """
    project = _open_project(project_dir)
    try:
        result = project.rollback(branch)
    except (StoreError, OSError) as exc:
        _fail(str(exc))
    _echo_rollback(result, f"rolled back to {result.branch}")


@cli.command()
@click.option("--project", "project_dir", type=click.Path(file_okay=False, exists=True), help="Project root.")
def undo(project_dir: Optional[str]) -> None:
    """Revert the last rollback: its replaced files come back, the files it created go (where
    unchanged since). Current files are snapshotted first; an undo can be undone in turn."""
    project = _open_project(project_dir)
    try:
        result = project.undo()
    except (StoreError, OSError) as exc:
        _fail(str(exc))
    _echo_rollback(result, f"done: {result.branch}")


def _echo_rollback(result, last_line: str) -> None:
    click.echo(f"snapshotted current files as {result.backup_commit[:10]} (on the store's source history)")
    for rel in result.restored:
        click.echo(f"restored {rel}")
    for rel in result.removed:
        click.echo(f"removed {rel} (the undone rollback had created it)")
    if not result.restored and not result.removed:
        click.echo(f"nothing to restore: files already match {result.branch}")
    for rel, why in result.skipped:
        click.echo(f"skipped {rel}: {why}")
    for rel in result.left_in_place:
        click.echo(f"left in place (not in {result.branch}): {rel}")
    click.echo(last_line)


# ---------------------------------------------------------------------------- gc
@cli.command("gc")
@click.option("--dry-run", is_flag=True, help="Say what would be packed and freed; change nothing.")
@click.option("--grace-days", type=FiniteFloat(min=1 / 24), default=14.0, show_default=True,
              help="Unreachable trees and commits younger than this are kept (a writer's in flight; at least an hour).")
@click.option("--project", "project_dir", type=click.Path(file_okay=False, exists=True), help="Project root.")
def gc_command(dry_run: bool, grace_days: float, project_dir: Optional[str]) -> None:
    """Compact the store: pack its loose objects and refs, remove what nothing reaches (the
    rewrite cache's superseded trees). Every branch, snapshot, report and run is kept; safe to
    interrupt and to run beside a watcher (it holds the store's write lock while it works)."""
    from scalebox_cst.store.gc import collect

    project = _open_project(project_dir)
    try:
        report = collect(Store.open(project.root), dry_run=dry_run, grace_s=grace_days * 86400)
    except (StoreError, OSError) as exc:
        _fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - libgit2's errors, as one line
        _fail(f"scalebox gc: {' '.join(str(exc).split())}")
    click.echo(report.line())
