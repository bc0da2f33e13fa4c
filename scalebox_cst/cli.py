"""Command line: a thin click layer over :class:`scalebox_cst.project.Project`.

Every error a user can cause (no store, unknown branch, bad config, bad path) is one line on
stderr and exit status 1 or 2; never a traceback.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from typing import List, Optional, Sequence, Tuple

import click

from scalebox_cst.config import BACKENDS, Config, ConfigError, find_project_root
from scalebox_cst.project import Project
from scalebox_cst.store import StoreError


def _fail(message: str, code: int = 1) -> None:
    click.echo(f"scalebox: {message}", err=True)
    sys.exit(code)


def _open_project(project_dir: Optional[str], start: str = ".", config: Optional[Config] = None) -> Project:
    root = project_dir or find_project_root(start)
    try:
        project = Project(root, config=config)
        done = project.recover()  # a rollback killed half-way is finished before anything else
    except (ConfigError, StoreError) as exc:
        _fail(str(exc))
        raise  # unreachable
    if done:
        click.echo(f"scalebox: {done}", err=True)
    return project


class _OneLineErrors(click.Group):
    """A store error that escapes a command (disk full, read-only or damaged store) is one line."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except StoreError as exc:
            _fail(str(exc))


def _parse_set(values: Sequence[str], config: Config) -> None:
    """``--set SECTION.KEY=VALUE`` (VALUE read as JSON, else a string), checked like the config
    file: the section may itself hold dots (``vectorize.recurrence.reassociate=false``)."""
    from scalebox_cst.config import option_error

    for item in values:
        key, sep, raw = item.partition("=")
        section, dot, name = key.strip().rpartition(".")
        if not sep or not dot or not section or not name:
            _fail(f"--set expects SECTION.KEY=VALUE, got {item!r}", 2)
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        problem = option_error(section, name, value)
        if problem:
            _fail(f"--set {item}: {problem}", 2)
        config.set_option(section, name, value)


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="scalebox_cst")
def cli() -> None:
    """Rewrite PyTorch RL code into faster, stabler code; every rewrite is committed before it runs."""


# ---------------------------------------------------------------------------- init
@cli.command()
@click.argument("directory", default=".", type=click.Path(file_okay=False))
def init(directory: str) -> None:
    """Create the rewrite store (.scalebox/) and a documented scalebox.toml in DIRECTORY."""
    os.makedirs(directory, exist_ok=True)
    try:
        project, wrote = Project.init(directory)
    except (ConfigError, StoreError) as exc:
        _fail(str(exc))
    from scalebox_cst.runtime.backend import detect

    info = detect()
    click.echo(f"store: {project.store.path}")
    click.echo(f"config: {os.path.join(project.root, 'scalebox.toml') if wrote else (project.config.source or 'defaults')}")
    for note in info.notes:
        click.echo(f"note: {note}")
    click.echo(f"backend: {info.describe()}")


# ---------------------------------------------------------------------------- rewrite
@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report.")
@click.option("--out", type=click.Path(file_okay=False), help="Also write the rewritten files to this folder.")
@click.option("--transform", "only", multiple=True, help="Run only these transforms (id or glob); repeatable.")
@click.option("--no-transform", "without", multiple=True, help="Do not run these transforms; repeatable.")
@click.option("--backend", type=click.Choice(BACKENDS), help="Target backend for device.* transforms.")
@click.option("--project", "project_dir", type=click.Path(file_okay=False, exists=True), help="Project root.")
@click.option("--allow-precision-change", is_flag=True, help="Let device.precision turn float64 into float32 (NPU).")
@click.option("--set", "settings", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a config option.")
def rewrite(paths, as_json, out, only, without, backend, project_dir, allow_precision_change, settings) -> None:
    """Rewrite PATHS once and commit the result to a new run branch."""
    root = project_dir or find_project_root(paths[0])
    try:
        config = Config.load(root)
    except ConfigError as exc:
        _fail(str(exc))
    from scalebox_cst.config import transform_pattern_error
    from scalebox_cst.transforms import transform_ids

    for flag, patterns in (("--transform", only), ("--no-transform", without)):
        for pattern in patterns:
            problem = transform_pattern_error(pattern, transform_ids())
            if problem:
                _fail(f"{flag} {pattern}: {problem}", 2)
    if only:
        config.transforms = list(only)
    if without:
        config.disabled = [*config.disabled, *without]
    if backend:
        config.backend = backend
    if allow_precision_change:
        config.set_option("device", "allow_precision_change", True)
    _parse_set(settings, config)
    project = _open_project(root, config=config)
    select: List[str] = []
    for path in paths:
        rel = project.relpath(path)
        if rel.startswith(".."):
            _fail(f"{path} is outside the project {project.root} (use --project)", 2)
        if os.path.isdir(path):
            select.extend(p for p in project.scan() if rel in (".", "") or p.startswith(rel.rstrip("/") + "/"))
        else:
            select.append(rel)
    try:
        project.pipeline.progress = lambda line: click.echo(line, err=True)  # checks transform ids too
    except ConfigError as exc:
        _fail(str(exc))
    result = project.commit_change(select=select, force=True, message="scalebox rewrite")
    report = result.report
    failed = [f for f in report.files if f.status == "error"]
    if out:
        for rel, data in result.outputs.items():
            target = os.path.join(out, *rel.split("/"))
            os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
            with open(target, "wb") as fh:
                fh.write(data)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
        sys.exit(1 if failed else 0)
    for f in report.files:
        if f.status == "error":
            click.echo(f.error, err=True)
        for site in f.sites:
            click.echo(site.describe(f.path))
    click.echo(f"{report.branch} {report.commit[:10]}: {report.summary()} (backend {report.backend})")
    if out:
        click.echo(f"rewritten files written to {out}")
    if failed:  # committed (carried unchanged), but the user asked for a rewrite and did not get it
        click.echo(f"scalebox: {len(failed)} file(s) could not be rewritten", err=True)
        sys.exit(1)


# ---------------------------------------------------------------------------- run
@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
@click.option("--project", "project_dir", type=click.Path(file_okay=False, exists=True), help="Project root.")
def run(argv: Tuple[str, ...], project_dir: Optional[str]) -> None:
    """Run SCRIPT from BRANCH's rewrite commit (default: the newest): run [BRANCH] SCRIPT [-- ARGS]."""
    project = _open_project(project_dir)
    args = list(argv)
    try:
        store = project.store
        if len(args) >= 2 and args[0] != "--" and not args[0].endswith(".py"):
            info = store.resolve(args.pop(0))
        else:
            newest = store.newest_branch()
            if newest is None:
                _fail("no run branches yet: run `scalebox rewrite .` or `scalebox-watch` first")
            info = store.resolve(newest)
    except StoreError as exc:
        _fail(str(exc))
    if not args or args[0] == "--":
        _fail("missing SCRIPT", 2)
    script = args.pop(0)
    if args and args[0] == "--":
        args.pop(0)
    script_rel = project.relpath(script)
    from scalebox_cst.runtime.executor import Execution

    click.echo(f"scalebox: running {script_rel} from {info.name} ({info.commit[:10]})", err=True)
    execution = Execution(store.path, project.root, project.runs_dir, info.name, info.commit, script_rel, args, echo=sys.stdout)
    try:
        record = execution.wait()
    except KeyboardInterrupt:
        record = execution.stop()
    click.echo(f"scalebox: {info.name} {record.status} in {record.wall_time:.2f}s; record in {execution.dir}", err=True)
    sys.exit(record.exit_status if record.exit_status and record.exit_status > 0 else (0 if record.exit_status == 0 else 1))


# ---------------------------------------------------------------------------- log
@cli.command()
@click.option("--project", "project_dir", type=click.Path(file_okay=False, exists=True), help="Project root.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def log(project_dir: Optional[str], as_json: bool) -> None:
    """List run branches, newest first, with their sites and run status."""
    from scalebox_cst.runtime.executor import load_record

    project = _open_project(project_dir)
    try:
        branches = project.store.branches()
        sessions = project.store.other_branches("hook/")
    except StoreError as exc:
        _fail(str(exc))
    rows = []
    for info in reversed(branches):
        record = load_record(project.runs_dir, info.name)
        rows.append((info, record))
    if as_json:
        click.echo(json.dumps([
            {
                "branch": i.name,
                "commit": i.commit,
                "source_commit": i.source_commit,
                "summary": i.summary,
                "time": i.time,
                "run": r.to_json() if r else None,
            }
            for i, r in rows
        ] + [
            {"branch": name, "commit": commit, "summary": summary, "time": stamp, "commits": count}
            for name, commit, summary, stamp, count in reversed(sessions)
        ], indent=2, default=str))
        return
    if not rows and not sessions:
        click.echo("no run branches yet")
    import time as _time

    for info, record in rows:
        when = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(info.time))
        run_text = "not run"
        if record is not None:
            run_text = record.status
            if record.wall_time is not None:
                run_text += f" {record.wall_time:.1f}s"
            for key in ("final_return", "episode_return", "grad_norm"):
                if key in record.metrics:
                    run_text += f" {key}={record.metrics[key]['last']:.4g}"
        click.echo(f"{info.name}  {info.commit[:10]}  {when}  {info.summary.removeprefix('rewrite: ')}  [{run_text}]")
    for name, commit, summary, stamp, count in reversed(sessions):
        when = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(stamp))
        click.echo(f"{name}  {commit[:10]}  {when}  import-hook session: {count} module commit(s), last: {summary}")


# ---------------------------------------------------------------------------- diff
@cli.command()
@click.argument("branch", required=False)
@click.option("--stat", is_flag=True, help="Per-file summary instead of the diff.")
@click.option("--color/--no-color", default=None, help="Colour (default: only on a terminal).")
@click.option("--project", "project_dir", type=click.Path(file_okay=False, exists=True), help="Project root.")
def diff(branch: Optional[str], stat: bool, color: Optional[bool], project_dir: Optional[str]) -> None:
    """Show BRANCH as original -> rewrite, hunks labelled with transform and reason.

    BRANCH is a run branch (run/0002, 2) or an import-hook session as `scalebox log` lists it
    (hook/<session>, or the session id); default: the newest run branch, else the newest session.
    """
    from scalebox_cst import diffview
    from scalebox_cst.report import RunReport
    from scalebox_cst.store import BranchInfo

    project = _open_project(project_dir)
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
            report = RunReport.from_json(store.report(info.name))
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
    click.echo(diffview.render(report, read_old, read_new, color=use_color), nl=False, color=use_color)


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


# ---------------------------------------------------------------------------- monitor
def _interrupt(*_) -> None:
    raise KeyboardInterrupt


@cli.command()
@click.argument("directory", default=".", type=click.Path(file_okay=False, exists=True))
@click.option("--web-port", "port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="Port (0: any free one).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind; another than loopback exposes the page.")
@click.option("--refresh-interval", type=click.FloatRange(min=0.25), default=2.0, show_default=True, help="Seconds between the page's polls.")
@click.option("--verbose", is_flag=True, help="Log each request to stderr.")
def monitor(directory: str, port: int, host: str, refresh_interval: float, verbose: bool) -> None:
    """Serve a live page of DIRECTORY's branches, curves, diffs and events (read-only)."""
    from scalebox_cst.monitor import Monitor, MonitorServer

    root = find_project_root(directory)
    try:
        data = Monitor(root, refresh_interval=refresh_interval)
    except StoreError as exc:
        _fail(str(exc))
    try:
        server = MonitorServer(data, host=host, port=port, verbose=verbose)
    except OSError as exc:
        _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc} (try another --web-port)")
    click.echo(f"scalebox: monitor of {data.root} on {server.url} (refresh {refresh_interval:g}s); Ctrl-C to stop", err=True)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        data.close()


# ---------------------------------------------------------------------------- watch
def _watch_options(func):
    func = click.argument("args", nargs=-1, type=click.UNPROCESSED)(func)
    func = click.option("--polling", is_flag=True, help="Poll the file system instead of OS events.")(func)
    func = click.option("--debounce", type=float, default=0.03, show_default=True, help="Quiet seconds that end a batch.")(func)
    func = click.option("--run", "script", help="Script to (re)start from each new branch.")(func)
    func = click.argument("directory", type=click.Path(file_okay=False, exists=True))(func)
    return func


def _watch(directory: str, script: Optional[str], debounce: float, polling: bool, args: Tuple[str, ...]) -> None:
    from scalebox_cst.watcher import Watcher

    argv = list(args)
    if argv and argv[0] == "--":
        argv.pop(0)
    try:
        project, _ = Project.init(directory) if not os.path.isdir(os.path.join(directory, ".scalebox")) else (Project(directory), False)
        project.ensure_store()
        click.echo(f"scalebox: watching {project.root} (backend {project.backend}); Ctrl-C to stop")
    except (ConfigError, StoreError) as exc:
        _fail(str(exc))
    if script is not None:
        script = project.relpath(os.path.join(directory, script) if not os.path.isabs(script) else script)
    watcher = Watcher(project, script, argv, debounce=debounce, polling=polling, echo=click.echo, run_output=sys.stdout)
    signal.signal(signal.SIGTERM, lambda *_: watcher.stop())
    try:
        watcher.start()
        watcher.run_forever()
    except KeyboardInterrupt:
        pass
    finally:
        # Stopping the run takes up to two grace periods; a second Ctrl-C must not orphan it.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        watcher.close()
    click.echo(watcher.summary())


@cli.command(context_settings={"ignore_unknown_options": True})
@_watch_options
def watch(directory, script, debounce, polling, args) -> None:
    """Watch DIRECTORY: each save makes a run branch and (re)starts --run SCRIPT from it."""
    _watch(directory, script, debounce, polling, args)


@click.command(context_settings={"ignore_unknown_options": True, "help_option_names": ["-h", "--help"]})
@_watch_options
def watch_command(directory, script, debounce, polling, args) -> None:
    """Watch DIRECTORY: each save makes a run branch and (re)starts --run SCRIPT from it."""
    _watch(directory, script, debounce, polling, args)


def main() -> None:
    cli(prog_name="scalebox")


def watch_main() -> None:
    watch_command(prog_name="scalebox-watch")
