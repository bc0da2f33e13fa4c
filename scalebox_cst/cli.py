"""Command line: a thin click layer over :class:`scalebox_cst.project.Project`.

Every error a user can cause (no store, unknown branch, bad config, bad path) is one line on
stderr and exit status 1 or 2; never a traceback.
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys
from typing import List, Optional, Sequence, Tuple

import click

from scalebox_cst import headlines
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


def _warn_skipped(project: Project) -> None:
    """One line per file the snapshot left out (a link out of the project, a FIFO, a name that is
    not UTF-8, ...: scalebox_cst.intake), so nothing is left out without a word."""
    for line in project.skipped:
        click.echo(f"scalebox: warning: {line}", err=True)


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
        except (ValueError, RecursionError):  # not JSON, or nested too deeply to read: a string
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
    from scalebox_cst.runtime.backend import probe

    info = probe()  # no torch import here (runtime.backend.probe)
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
    try:
        result = project.commit_change(select=select, force=True, message="scalebox rewrite")
    except (StoreError, OSError) as exc:  # disk full, read-only store: one line, nothing half-said
        _fail(str(exc))
    _warn_skipped(project)
    report = result.report
    failed = [f for f in report.files if f.status == "error"]
    if out:
        try:
            for rel, data in result.outputs.items():
                target = os.path.join(out, *rel.split("/"))
                os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
                with open(target, "wb") as fh:
                    fh.write(data)
        except OSError as exc:
            _fail(f"--out {out}: {exc.strerror or exc} ({exc.filename or out}); committed as {report.branch}")
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
def _tree_changes(project: Project, source_commit: Optional[str]) -> List[str]:
    """``M path`` / ``A path`` / ``D path`` for the working tree against a source snapshot."""
    current = project.scan()
    committed = project.store.files(source_commit) if source_commit else {}
    changes = [f"M {p}" for p in sorted(set(current) & set(committed)) if current[p] != committed[p]]
    changes += [f"A {p}" for p in sorted(set(current) - set(committed))]
    changes += [f"D {p}" for p in sorted(set(committed) - set(current))]
    return changes


def _config_changed(project: Project, info) -> bool:
    """Whether the pipeline (config, transforms, engine, backend) differs from the branch's."""
    try:
        return bool(info.fingerprint) and project.fingerprint != info.fingerprint  # no pipeline import
    except ConfigError:
        return False


_SEED_OPTION = re.compile(r"""["']--seed["']|\bseed\s*:\s*int\b""")


def _takes_seed_option(source: Optional[bytes]) -> bool:
    """A script takes ``--seed N`` if it declares the option (argparse, click: the literal
    "--seed"; tyro/simple-parsing dataclasses: a ``seed: int`` field, as CleanRL's Args)."""
    return bool(source) and bool(_SEED_OPTION.search(source.decode("utf-8", "replace")))


def _parse_seeds(text: Optional[str]) -> List[Optional[int]]:
    if not text:
        return [None]
    seeds: List[Optional[int]] = []
    for part in text.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-") if not part.startswith("-") else (part, "", "")
        try:
            seeds.extend(range(int(lo), int(hi) + 1) if dash else [int(part)])
        except ValueError:
            _fail(f"--seeds expects integers like 0,1,2 or 0-4, got {text!r}", 2)
    return seeds


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _SignalGate:
    """Signal handler for ``scalebox run``: raises :class:`_Interrupted` in the main thread, except
    while a run is being started (between the child's start and its being tracked), when the
    signal waits for :meth:`started`: a run is never started untracked, so never orphaned."""

    def __init__(self) -> None:
        self.starting = False
        self.pending: Optional[int] = None

    def __call__(self, signum, _frame) -> None:
        if self.starting:
            self.pending = signum
            return
        raise _Interrupted(signum)

    def starts(self) -> None:
        self.starting = True

    def started(self) -> None:
        self.starting = False
        if self.pending is not None:
            raise _Interrupted(self.pending)


def _describe_end(record) -> str:
    head = record.headline or {}
    parts = [f"{record.id}{' (original)' if record.variant == 'original' else ''} {record.status}"]
    if record.signal:
        parts[0] += f" ({record.signal})"
    parts[0] += f" in {record.wall_time:.1f}s"
    if record.seed is not None:
        parts.append(f"seed {record.seed}")
    if head.get("episodic_return_final") is not None:
        parts.append(f"return {head['episodic_return_final']:.4g} (best {head['episodic_return_best']:.4g})")
    if head.get("sps") is not None:
        parts.append(headlines.shown("sps", head["sps"]))
    if head.get("guard_pass_rate") is not None:
        parts.append(f"guards {head['guard_pass_rate'] * 100:.0f}%")
    return ", ".join(parts)


def _check_launcher(launcher, nproc, nnodes, rdzv_endpoint, rdzv_id, max_restarts, address, branches) -> str:
    """The launcher the options name (torchrun with --nproc), or a one-line error for a mix."""
    launcher = launcher or ("torchrun" if nproc else "local")
    torchrun_given = [n for n, v in (("--nproc", nproc), ("--nnodes", nnodes != "1"), ("--rdzv-endpoint", rdzv_endpoint),
                                     ("--rdzv-id", rdzv_id), ("--max-restarts", max_restarts)) if v]
    ray_given = [n for n, v in (("--address", address), ("--branches", branches)) if v]
    if launcher != "torchrun" and torchrun_given:
        _fail(f"{', '.join(torchrun_given)}: torchrun options (use --nproc N, not --launcher {launcher})", 2)
    if launcher != "ray" and ray_given:
        _fail(f"{', '.join(ray_given)}: options of --launcher ray", 2)
    if launcher == "torchrun" and nnodes != "1" and not rdzv_endpoint:
        _fail("--nnodes above 1 needs --rdzv-endpoint HOST:PORT (the same on every node)", 2)
    return launcher


def _run_on_ray(project, info, branches, script_rel, args, seeds, seed_list, variant, address, parallel) -> None:
    """--launcher ray: every (branch, seed) as a Ray task (scalebox_cst.raylaunch); exits."""
    from scalebox_cst import raylaunch
    from scalebox_cst.runtime.executor import RunRecord

    try:
        raylaunch.require_ray()
        infos = [project.store.resolve(b.strip()) for b in branches.split(",") if b.strip()] if branches else [info]
    except raylaunch.RayUnavailable as exc:
        _fail(str(exc))
    except StoreError as exc:
        _fail(str(exc))

    def seed_via_for(commit):
        return "option" if _takes_seed_option(project.store.read_file(commit, script_rel)) else "env"

    def backend_of(branch):
        try:
            return project.store.report(branch).get("backend")
        except StoreError:
            return None

    status = raylaunch.cli_run(
        project.root, project.store.path, infos, script_rel, args, seed_list, seed_via_for if seeds else (lambda c: None),
        backend_of, variant, address, parallel, echo=lambda text: click.echo(text, err=True),
        describe=lambda record: _describe_end(RunRecord.from_json(record)),
    )
    sys.exit(status)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
@click.option("--project", "project_dir", type=click.Path(file_okay=False, exists=True), help="Project root.")
@click.option("--original", is_flag=True, help="Run the branch's source snapshot itself, unrewritten (the baseline).")
@click.option("--seeds", help="One run per seed: 0,1,2 or 0-4 (passed as --seed N where the script has that option).")
@click.option("--parallel", type=click.IntRange(min=1), default=1, show_default=True, help="At most N runs at once.")
@click.option("--no-commit", is_flag=True, help="Run the newest branch even if the working tree has changed since.")
@click.option("--launcher", type=click.Choice(["local", "torchrun", "ray"]), help="local (default), torchrun (default with --nproc) or ray.")
@click.option("--nproc", type=click.IntRange(min=1), help="torchrun: processes (ranks) on this node.")
@click.option("--nnodes", default="1", show_default=True, help="torchrun: nodes (M, or MIN:MAX elastic).")
@click.option("--rdzv-endpoint", metavar="HOST:PORT", help="torchrun: rendezvous endpoint, the same on every node.")
@click.option("--rdzv-id", help="torchrun: rendezvous id, the same on every node (default: from the endpoint).")
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True, help="torchrun: restarts of the group after a failure.")
@click.option("--address", help="ray: the cluster to join (e.g. auto, HOST:6379, ray://HOST:10001); default: a local Ray instance.")
@click.option("--branches", help="ray: several branches at once, comma-separated (each with every seed).")
@click.option("--heal", is_flag=True, help="On instability, stop the run, commit a hot-fix branch and run it instead.")
@click.option("--locate-nan", is_flag=True, help="Rerun with isfinite checks at the first non-finite step: name the module.")
def run(argv: Tuple[str, ...], project_dir: Optional[str], original: bool, seeds: Optional[str], parallel: int, no_commit: bool,
        launcher: Optional[str], nproc: Optional[int], nnodes: str, rdzv_endpoint: Optional[str], rdzv_id: Optional[str],
        max_restarts: int, address: Optional[str], branches: Optional[str], heal: bool = False, locate_nan: bool = False) -> None:
    """Run SCRIPT from BRANCH (default: the newest): run [OPTIONS] [BRANCH] SCRIPT [-- ARGS].

    Every run is a new record (runs/<branch>/<NNNN>/); nothing is overwritten. Without BRANCH,
    a working tree that changed since the newest branch is committed first (a new branch).
    --nproc N runs it under torchrun (N ranks, one run); --launcher ray runs each (branch, seed)
    as a Ray task."""
    launcher = _check_launcher(launcher, nproc, nnodes, rdzv_endpoint, rdzv_id, max_restarts, address, branches)
    import time as _time

    project = _open_project(project_dir)
    args = list(argv)
    stale: Optional[List[str]] = None
    try:
        store = project.store
        if len(args) >= 2 and args[0] != "--" and not args[0].endswith(".py"):
            info = store.resolve(args.pop(0))
            stale = _tree_changes(project, info.source_commit) or None
            if stale:
                click.echo(f"scalebox: note: {info.name} differs from the working tree ({', '.join(stale[:5])}{', ...' if len(stale) > 5 else ''})", err=True)
        else:
            newest = store.newest_branch()
            info = store.resolve(newest) if newest else None
            changes = _tree_changes(project, info.source_commit) if info else ["A (everything)"]
            if info is not None and not changes and _config_changed(project, info):
                changes = ["config (pipeline fingerprint)"]
            if changes and not no_commit:
                result = project.commit_change(block_on_bad_input=True, message="scalebox run")
                _warn_skipped(project)
                if result.blocked:
                    for line in result.blocked:
                        click.echo(line, err=True)
                    if info is None:
                        _fail("the working tree does not parse and there is no branch to run")
                    stale = changes
                    click.echo(f"scalebox: working tree not committed (errors above); running the stale {info.name}", err=True)
                else:
                    info = store.resolve(result.branch)
                    if result.created:
                        from scalebox_cst.runs import append_project_event

                        append_project_event(project.root, "branch_created", f"{info.name}: {result.report.summary()}", branch=info.name, commit=info.commit)
                        click.echo(f"scalebox: working tree changed ({', '.join(changes[:5])}); committed {info.name}: {result.report.summary()}", err=True)
            elif changes and info is not None:
                stale = changes
                click.echo(f"scalebox: warning: running {info.name}, which differs from the working tree ({', '.join(changes[:5])})", err=True)
            elif info is None:
                _fail("no run branches yet: run `scalebox rewrite .` or `scalebox-watch` first")
    except StoreError as exc:
        _fail(str(exc))
    if not args or args[0] == "--":
        _fail("missing SCRIPT", 2)
    script = args.pop(0)
    if args and args[0] == "--":
        args.pop(0)
    script_rel = project.relpath(script)
    if script_rel.startswith(".."):
        _fail(f"{script} is outside the project {project.root}", 2)
    commit = info.source_commit if original else info.commit
    if commit is None:
        _fail(f"{info.name} has no source snapshot to run")
    if store.read_file(commit, script_rel) is None:  # before a run record is made for it
        _fail(f"{script_rel} is not in {info.name} (a typo, or a file scalebox.toml leaves out?)", 2)
    seed_list = _parse_seeds(seeds)
    seed_via = None
    if seeds:
        if any(a == "--seed" or a.startswith("--seed=") for a in args):
            _fail("--seeds and a --seed among the script's arguments: give one of them", 2)
        seed_via = "option" if _takes_seed_option(store.read_file(commit, script_rel)) else "env"
        if seed_via == "env":
            click.echo(f"scalebox: {script_rel} has no --seed option: seeding random, numpy and torch before it runs", err=True)
    from scalebox_cst.runtime.executor import Execution

    variant = "original" if original else "rewrite"
    if launcher == "ray":
        explicit = click.get_current_context().get_parameter_source("parallel") != click.core.ParameterSource.DEFAULT
        _run_on_ray(project, info, branches, script_rel, args, seeds, seed_list, variant, address, parallel if explicit else None)
    if launcher == "torchrun":
        import functools

        from scalebox_cst.runtime.distributed import TorchrunExecution

        Execution = functools.partial(  # noqa: N806 - the class the loop below starts
            TorchrunExecution, nproc=nproc or 1, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, max_restarts=max_restarts
        )
    what = "source snapshot (original)" if original else "rewrite"
    click.echo(f"scalebox: running {script_rel} from {info.name}'s {what} ({commit[:10]})"
               + (f", seeds {', '.join(str(s) for s in seed_list)}" if seeds else ""), err=True)
    if heal or locate_nan:  # scalebox_cst.hotfix owns these
        if heal and locate_nan or original or seeds or launcher != "local" or parallel > 1:
            _fail("--heal and --locate-nan each run one local rewrite: not with each other, --original, --seeds, "
                  "--parallel or a launcher", 2)
        from scalebox_cst import hotfix

        sys.exit(hotfix.cli_run(project, info.name, script_rel, args, heal=heal, locate_nan=locate_nan,
                                notice=lambda text: click.echo(text, err=True)))
    pending = list(seed_list)
    active: List[Execution] = []
    records = []
    gate = _SignalGate()
    handlers = {s: signal.signal(s, gate) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        try:
            while pending or active:
                while pending and len(active) < parallel:
                    seed = pending.pop(0)
                    run_args = [*args, "--seed", str(seed)] if seed_via == "option" else list(args)
                    gate.starts()
                    execution = Execution(
                        store.path, project.root, project.runs_dir, info.name, commit, script_rel, run_args,
                        echo=sys.stdout, source_commit=info.source_commit, variant=variant, seed=seed,
                        seed_via=seed_via, stale=stale, label_output=parallel > 1 and len(seed_list) > 1,
                        notice=lambda text: click.echo(text, err=True),
                    )
                    active.append(execution)
                    gate.started()
                    click.echo(f"scalebox: {execution.record.id} started (pid {execution.proc.pid})", err=True)
                if len(active) == 1 and not pending:
                    active[0].wait()
                for execution in list(active):
                    if execution.poll() is not None:
                        record = execution.wait()
                        records.append(record)
                        active.remove(execution)
                        click.echo(f"scalebox: {_describe_end(record)}; record in {execution.dir}", err=True)
                if active:
                    _time.sleep(0.1)
        except _Interrupted as exc:
            for s in handlers:
                signal.signal(s, signal.SIG_IGN)  # stopping takes up to two grace periods
            name = signal.Signals(exc.signum).name
            click.echo(f"scalebox: {name}: stopping {len(active)} run(s)", err=True)
            for execution in active:
                record = execution.stop(reason=f"{name} to scalebox run")
                click.echo(f"scalebox: {_describe_end(record)}; record in {execution.dir}", err=True)
            sys.exit(128 + exc.signum)
    finally:
        for s, previous in handlers.items():
            signal.signal(s, previous)
    if len(records) == 1:
        status = records[0].exit_status
        sys.exit(status if status and status > 0 else (0 if status == 0 else 1))
    sys.exit(0 if all(r.status == "ok" for r in records) else 1)


# ---------------------------------------------------------------------------- log
def _branch_changes(store, info, parent) -> dict:
    """What a branch changed since the branch before it: files, transforms, backend, config."""
    from collections import Counter

    try:
        report = store.report(info.name)
    except StoreError:
        report = {}
    counts = Counter(
        s["transform"] for f in report.get("files", []) for s in f.get("sites", []) if s.get("action") == "rewritten"
    )
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


def _run_line(entry: dict) -> str:
    head = entry.get("headline") or {}
    text = f"  #{entry['run']:<3} {entry.get('status', '?'):<8}"
    text += " original" if entry.get("variant") == "original" else " " * 9
    wall = entry.get("wall_time")
    if wall is None and entry.get("started"):
        end = entry.get("ended") or __import__("time").time()
        wall = end - entry["started"]
    text += f" {wall:7.1f}s" if wall is not None else "        -"
    if entry.get("seed") is not None:
        text += f" seed={entry['seed']}"
    text += f"  {entry.get('script', '?')}"
    if entry.get("args"):
        text += " " + " ".join(entry["args"])
    facts = []
    if head.get("episodic_return_final") is not None:
        facts.append(f"return {head['episodic_return_final']:.4g} (best {head['episodic_return_best']:.4g}, {head.get('episodes', 0)} ep)")
    if head.get("sps") is not None:
        facts.append(headlines.shown("sps", head["sps"]))
    if head.get("guard_pass_rate") is not None:
        facts.append(f"guards {head['guard_pass_rate'] * 100:.0f}%")
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
        facts.append(f"stopped: {entry['stop_reason']}")
    if entry.get("hotfix_of"):
        facts.append(f"hot-fix of {entry['hotfix_of']}")
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
def _select_runs(project: Project, selector: str) -> Tuple[str, list]:
    """BRANCH (its rewrite runs), BRANCH#N (one run), BRANCH:original or `original` (runs of the
    source snapshot of BRANCH, default the newest branch): (label, runs)."""
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
        info = store.resolve(text or (store.newest_branch() or "run/0001"))
        branch, source = info.name, info.source_commit
    found = runs.list_runs(project.root) if variant == "original" else runs.list_runs(project.root, branch)
    chosen = []
    for r in found:
        if r.variant != variant:
            continue
        if variant == "original" and (r.record.get("source_commit") != source and r.branch != branch):
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
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--project", "project_dir", type=click.Path(file_okay=False, exists=True), help="Project root.")
def compare(selectors: Tuple[str, ...], metrics: Tuple[str, ...], as_json: bool, project_dir: Optional[str]) -> None:
    """Compare branches, runs or the original: compare A B [C ...].

    Each of A, B, ... is BRANCH (its rewrite runs), BRANCH#N (one run), `original` (runs of the
    newest branch's source snapshot, `scalebox run --original`) or BRANCH:original. Per metric:
    the mean over runs with a 95% bootstrap interval when there are several (seeds), and whether
    each difference from A is within noise."""
    from scalebox_cst import compare as stats
    from scalebox_cst import runs

    if len(selectors) < 2:
        _fail("compare needs at least two of BRANCH, BRANCH#N, original", 2)
    project = _open_project(project_dir)
    try:
        groups = [_select_runs(project, s) for s in selectors]
    except StoreError as exc:
        _fail(str(exc))
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
    result = prof.build(run.dir, run.record, project.store.store_path(project.root), top=max(lines, prof.TOP))
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
        changes = _tree_changes(project, info.source_commit if info else None)
    except StoreError as exc:
        _fail(str(exc))
    config_changed = info is not None and _config_changed(project, info)
    running = [
        {"run": r.id, "pid": r.record.get("pid"), "variant": r.variant, "script": r.record.get("script"), "started": r.record.get("started")}
        for r in runs.list_runs(project.root) if r.status == "running"
    ]
    data = {
        "newest": newest,
        "commit": info.commit if info else None,
        "source_commit": info.source_commit if info else None,
        "clean": bool(info) and not changes and not config_changed,
        "changes": changes,
        "config_changed": config_changed,
        "running": running,
    }
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    if info is None:
        click.echo("no run branches yet: `scalebox rewrite .` or `scalebox run SCRIPT` commits the working tree")
    elif data["clean"]:
        click.echo(f"working tree matches {newest} ({info.commit[:10]})")
    else:
        click.echo(f"working tree differs from {newest} ({info.commit[:10]}); `scalebox run` commits it first:")
        for line in changes:
            click.echo(f"  {line}")
        if config_changed:
            click.echo("  config/pipeline changed (scalebox.toml, transforms or engine)")
    import time as _time

    for r in running:
        click.echo(f"running: {r['run']} {r['variant']} {r['script']} (pid {r['pid']}, {(_time.time() - (r['started'] or _time.time())):.0f}s)")


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
    from scalebox_cst.report import RunReport
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


# ---------------------------------------------------------------------------- monitor
def _interrupt(*_) -> None:
    raise KeyboardInterrupt


@cli.command()
@click.argument("directory", default=".", type=click.Path(file_okay=False, exists=True))
@click.option("--web-port", "port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="Port (0: any free one).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind; another than loopback exposes the page (a warning says to whom).")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME", help="Also answer requests naming NAME in their Host header (repeatable; loopback names and the bound address always are).")
@click.option("--refresh-interval", type=click.FloatRange(min=0.25), default=2.0, show_default=True, help="Seconds between the page's polls.")
@click.option("--verbose", is_flag=True, help="Log each request to stderr.")
def monitor(directory: str, port: int, host: str, allow_hosts: Tuple[str, ...], refresh_interval: float, verbose: bool) -> None:
    """Serve a live page of DIRECTORY's branches, curves, diffs and events (read-only)."""
    from scalebox_cst.monitor import Monitor, MonitorServer
    from scalebox_cst.monitor.access import HostError, checked_name, exposure_warning

    try:
        for name in allow_hosts:
            checked_name(name)
    except HostError as exc:
        _fail(str(exc))
    root = find_project_root(directory)
    try:
        data = Monitor(root, refresh_interval=refresh_interval)
    except StoreError as exc:
        _fail(str(exc))
    try:
        server = MonitorServer(data, host=host, port=port, verbose=verbose, allow_hosts=allow_hosts)
    except OSError as exc:
        import socket

        hint = "check --host" if isinstance(exc, socket.gaierror) else "try another --web-port"
        _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc} ({hint})")
    click.echo(f"scalebox: monitor of {data.root} on {server.url} (refresh {refresh_interval:g}s); Ctrl-C to stop", err=True)
    warning = exposure_warning(host, server.server_address[1], allow_hosts)
    if warning:
        click.echo(warning, err=True)
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
    for signum in (signal.SIGTERM, signal.SIGHUP):  # a closed terminal stops the run too
        signal.signal(signum, lambda *_: watcher.stop())
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
