"""``scalebox run``: pick (or commit) the branch, then hand the run(s) to the supervisor
(scalebox_cst.runner.supervisor), torchrun, Ray or the hot-fix loop."""
from __future__ import annotations

import json
import os
import sys
import time
from typing import List, Optional, Tuple

import click

from scalebox_cst import headlines, runs
from scalebox_cst.intake import shown_name
from scalebox_cst.cli._common import why_not_snapshotted, _FAST_HELP, _config_changed, _fail, _fast, _load_config, _open_project, _tree_changes, _warn_skipped, cli, say
from scalebox_cst.runner import seedopt
from scalebox_cst.store import StoreError


def _parse_seeds(text: Optional[str]) -> List[Optional[int]]:
    if not text:
        return [None]
    from scalebox_cst.options import SEED_LIMIT, seed_ok

    seeds: List[Optional[int]] = []
    for part in text.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-") if not part.startswith("-") else (part, "", "")
        try:
            ends = [int(lo), int(hi)] if dash else [int(part)]
        except ValueError:
            _fail(f"--seeds expects integers like 0,1,2 or 0-4, got {text!r}", 2)
        bad = [n for n in ends if not seed_ok(n)]
        if bad:  # numpy refused it in the child, after the run had started
            _fail(f"--seeds {part}: a seed is from 0 to {SEED_LIMIT - 1}, got {bad[0]}", 2)
        if dash and ends[1] < ends[0]:
            _fail(f"--seeds {part}: an empty range (write the lower seed first)", 2)
        seeds.extend(range(ends[0], ends[-1] + 1))
    return seeds


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


def _set_limits(project, memory, cpus, device_memory, priority, no_network) -> None:
    """The run's limits (scalebox_cst.limits): checked now (one line), passed on in the environment
    so that hot-fixes, torchrun ranks and Ray tasks started from here inherit them."""
    from scalebox_cst import limits

    try:
        table = limits.cli_limits(memory, cpus, device_memory, priority, no_network)
        if table:
            os.environ[limits.ENV] = json.dumps(table)
        if not limits.resolve(project.root).network:
            limits.require_netns()
    except limits.LimitError as exc:
        _fail(str(exc), 2)


def _run_on_ray(project, info, branches, script_rel, args, seeds, seed_list, variant, address, parallel) -> None:
    """--launcher ray: every (branch, seed) as a Ray task (scalebox_cst.raylaunch); exits."""
    from scalebox_cst import raylaunch
    from scalebox_cst.runner.record import RunRecord

    try:
        raylaunch.require_ray()
        infos = [project.store.resolve(b.strip()) for b in branches.split(",") if b.strip()] if branches else [info]
    except raylaunch.RayUnavailable as exc:
        _fail(str(exc))
    except StoreError as exc:
        _fail(str(exc))

    def seed_via_for(commit):
        source = project.store.read_file(commit, script_rel)
        flag = seedopt.seed_flag(source)
        return (flag, seedopt.seed_first(source, flag)) if flag else ("env", False)

    def backend_of(branch):
        try:
            return project.store.report(branch).get("backend")
        except StoreError:
            return None

    try:
        status = raylaunch.cli_run(
            project.root, project.store.path, infos, script_rel, args, seed_list, seed_via_for if seeds else (lambda c: (None, False)),
            backend_of, variant, address, parallel, echo=say,
            describe=lambda record: headlines.end_line(RunRecord.from_json(record)),
        )
    except raylaunch.RayStartError as exc:
        _fail(str(exc))
    sys.exit(status)


#: what makes a branch's pipeline fingerprint differ from the project's with the same files
_OTHER_PIPELINE = "rewrite --fast, --transform or --set, scalebox.toml, or the engine"


def _branch_to_run(project, args: List[str], no_commit: bool):
    """The branch ``run`` runs (popped from ``args`` if named; else the newest, after committing a
    changed working tree unless ``no_commit``) and the working tree's changes it lacks (or None)."""
    store = project.store
    stale: Optional[List[str]] = None
    try:
        if len(args) >= 2 and args[0] != "--" and not args[0].endswith(".py"):
            info = store.resolve(args.pop(0))
            stale = _tree_changes(project, info.source_commit) or None
            if stale:
                say(f"scalebox: note: {info.name} differs from the working tree ({', '.join(stale[:5])}{', ...' if len(stale) > 5 else ''})")
        else:
            newest = store.newest_branch()
            info = store.resolve(newest) if newest else None
            changes = _tree_changes(project, info.source_commit) if info else ["A (everything)"]
            pipeline_only = False  # the files are the newest branch's; its rewrite options are not the project's
            if info is not None and not changes and _config_changed(project, info):
                changes, pipeline_only = ["config (pipeline fingerprint)"], True
            foreign = None  # the newest branch, where it is not this engine's rewrite of its snapshot
            if info is not None and not changes and info.source_commit and not project.holds_own_rewrite(info):
                foreign, changes = info.name, [f"{info.name}'s files"]
                if no_commit:
                    _fail(f"{foreign} does not hold this engine's rewrite of its snapshot (a store that came with the "
                          "project?); run without --no-commit to commit one, or name the branch to run it as it is")
            if changes and not no_commit:
                result = project.commit_change(block_on_bad_input=True, message="scalebox run")
                _warn_skipped(project)
                if result.blocked:
                    for line in result.blocked:
                        say(line)
                    if info is None or foreign is not None:
                        _fail("the working tree does not parse and there is no branch to run")
                    stale = changes
                    say(f"scalebox: working tree not committed (errors above); running the stale {info.name}")
                else:
                    info = store.resolve(result.branch)
                    if result.created:
                        from scalebox_cst.runs import append_project_event

                        try:  # the monitor's timeline only: a full disk or a planted link must not stop the run
                            append_project_event(project.root, "branch_created", f"{info.name}: {result.report.summary()}", branch=info.name, commit=info.commit)
                        except OSError as exc:
                            say(f"scalebox: warning: project event not recorded ({exc.filename}: {exc.strerror or exc})")
                    if foreign is not None:
                        say(f"scalebox: {foreign} does not hold this engine's rewrite of its snapshot (a store that "
                            f"came with the project?); running {info.name}, which does")
                    elif result.created and pipeline_only:  # not "working tree changed": it did not
                        say(f"scalebox: {newest} holds these files rewritten with other options than this run's ({_OTHER_PIPELINE}); "
                            f"committed {info.name}: {result.report.summary()} (`scalebox run {newest} SCRIPT` runs {newest} as it is)")
                    elif result.created:
                        say(f"scalebox: working tree changed ({', '.join(changes[:5])}); committed {info.name}: {result.report.summary()}")
            elif changes and info is not None and pipeline_only:
                say(f"scalebox: note: running {info.name}, rewritten with other options than this run's ({_OTHER_PIPELINE})")
            elif changes and info is not None:
                stale = changes
                say(f"scalebox: warning: running {info.name}, which differs from the working tree ({', '.join(changes[:5])})")
            elif info is None:
                _fail("no run branches yet: run `scalebox rewrite .` or `scalebox-watch` first")
    except StoreError as exc:
        _fail(str(exc))
    return info, stale


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
@click.option("--memory", metavar="SIZE", help="Limit the run's memory (4g, 300m); also [run] memory.")
@click.option("--cpus", type=float, help="Limit the run to N cores' worth of CPU; also [run] cpus.")
@click.option("--device-memory", metavar="SIZE", help="Limit each process's GPU/NPU memory (16g); also [run] device_memory.")
@click.option("--priority", type=click.Choice(["low", "normal", "high"]), help="CPU priority of the run; also [run] priority.")
@click.option("--no-network", is_flag=True, help="No network for the run (a network namespace); also [run] network = false.")
@click.option("--fast", is_flag=True, help=_FAST_HELP + " A tree committed for the run is rewritten so.")
@click.option("--calibrate-precision", is_flag=True, help="Record module activation ranges over the first [precision] calibrate_steps (20) steps, for precision.autocast fp16 (with --original: fp32 ranges on your lines).")
def run(argv: Tuple[str, ...], project_dir: Optional[str], original: bool, seeds: Optional[str], parallel: int, no_commit: bool,
        launcher: Optional[str], nproc: Optional[int], nnodes: str, rdzv_endpoint: Optional[str], rdzv_id: Optional[str],
        max_restarts: int, address: Optional[str], branches: Optional[str], heal: bool = False, locate_nan: bool = False,
        memory: Optional[str] = None, cpus: Optional[float] = None, device_memory: Optional[str] = None,
        priority: Optional[str] = None, no_network: bool = False, calibrate_precision: bool = False, fast: bool = False) -> None:
    """Run SCRIPT from BRANCH (default: the newest): run [OPTIONS] [BRANCH] SCRIPT [-- ARGS].

    Every run is a new record (runs/<branch>/<NNNN>/); nothing is overwritten. Without BRANCH,
    a working tree that changed since the newest branch is committed first (a new branch).
    --nproc N runs it under torchrun (N ranks, one run); --launcher ray runs each (branch, seed)
    as a Ray task."""
    launcher = _check_launcher(launcher, nproc, nnodes, rdzv_endpoint, rdzv_id, max_restarts, address, branches)
    seed_list = _parse_seeds(seeds)  # before anything is committed or started
    project = _open_project(project_dir, config=_fast(_load_config(project_dir), True) if fast else None)
    _set_limits(project, memory, cpus, device_memory, priority, no_network)
    if calibrate_precision:  # scalebox_cst.runtime.precision, in the child
        os.environ["SCALEBOX_CALIBRATE_PRECISION"] = str(int(project.config.option("precision", "calibrate_steps", 20)))
    args = list(argv)
    info, stale = _branch_to_run(project, args, no_commit)
    store = project.store
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
        why = why_not_snapshotted(project, script, script_rel, "saved after that snapshot? `scalebox rewrite` takes it in")
        _fail(f"{shown_name(script_rel)} is not in {info.name} ({why})", 2)
    seed_via = flag = None
    first = False
    if seeds:
        source = store.read_file(commit, script_rel)
        flag = seedopt.seed_flag(source)
        first = flag is not None and seedopt.seed_first(source, flag)
        given = next((a.split("=")[0] for a in args if a.split("=")[0] in ("--seed", flag or "--seed")), None)
        if given:
            _fail(f"--seeds and a {given} among the script's arguments: give one of them", 2)
        seed_via = "option" if flag else "env"
        switch = seedopt.seed_switch(source.decode("utf-8", "replace")) if source else None
        if seed_via == "env" and switch:
            say(f"scalebox: {script_rel}'s --seed is a switch ({switch}), not a seed: not given; seeding random, numpy, "
                "torch and unseeded gymnasium envs before it runs")
        elif seed_via == "env":
            say(f"scalebox: {script_rel} has no --seed option: seeding random, numpy, torch and unseeded gymnasium envs before it runs")
    variant = "original" if original else "rewrite"
    if launcher == "ray":
        explicit = click.get_current_context().get_parameter_source("parallel") != click.core.ParameterSource.DEFAULT
        _run_on_ray(project, info, branches, script_rel, args, seeds, seed_list, variant, address, parallel if explicit else None)
    what = "source snapshot (original)" if original else "rewrite"
    say(f"scalebox: running {script_rel} from {info.name}'s {what} ({commit[:10]})"
        + (f", seeds {', '.join(str(s) for s in seed_list)}" if seeds else ""))
    if heal or locate_nan:  # scalebox_cst.hotfix owns these
        if heal and locate_nan or original or seeds or launcher != "local" or parallel > 1:
            _fail("--heal and --locate-nan each run one local rewrite: not with each other, --original, --seeds, "
                  "--parallel or a launcher", 2)
        from scalebox_cst import hotfix

        sys.exit(hotfix.cli_run(project, info.name, script_rel, args, heal=heal, locate_nan=locate_nan,
                                notice=say))
    from scalebox_cst.runner.supervisor import RunSpec, RunSupervisor

    torchrun = dict(nproc=nproc or 1, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id,
                    max_restarts=max_restarts) if launcher == "torchrun" else None
    supervisor = RunSupervisor.for_project(project, echo=sys.stdout, notice=_notice, torchrun=torchrun,
                                           label_output=parallel > 1 and len(seed_list) > 1)
    specs = [
        RunSpec.from_branch(info, script_rel, seedopt.with_seed(args, flag, seed, first) if flag and seed is not None else args,
                            original=original, seed=seed, seed_via=seed_via, stale=tuple(stale) if stale else None)
        for seed in seed_list
    ]
    _run_all(supervisor, specs, parallel)


_notice = say  # the runs' notices: a broken stderr never stops them


def _run_all(supervisor, specs, parallel: int) -> None:
    """Start ``specs`` (at most ``parallel`` at once), report each end, exit with the status. A
    stop signal stops every run still going (their records say why) and exits 128 + signal."""
    from scalebox_cst.runner import signals
    from scalebox_cst.runner.execution import RunStartError

    pending = list(specs)
    records = []

    def ended(run, record) -> None:
        records.append(record)
        _notice(f"scalebox: {headlines.end_line(record)}; {runs.where_recorded(run.dir)}")

    with supervisor.signals():
        try:
            while pending or supervisor.active:
                while pending and len(supervisor.active) < parallel:
                    try:
                        run = supervisor.start(pending.pop(0))
                    except RunStartError as exc:  # its folder or first record cannot be written: one line
                        with signals.ignored():
                            supervisor.stop_all("scalebox run: another run could not start", each=ended)
                        _fail(str(exc))
                    _notice(f"scalebox: {run.record.id} started (pid {run.proc.pid})")
                if len(supervisor.active) == 1 and not pending:
                    supervisor.wait(supervisor.active[0])
                for run, record in supervisor.ended():
                    ended(run, record)
                if supervisor.active:
                    time.sleep(0.1)
        except signals.Interrupted as exc:
            with signals.ignored():  # stopping takes up to two grace periods
                _notice(f"scalebox: {exc.name}: stopping {len(supervisor.active)} run(s)")
                supervisor.stop_all(f"{exc.name} to scalebox run", each=lambda run, record: _notice(
                    f"scalebox: {headlines.end_line(record)}; {runs.where_recorded(run.dir)}"))
            sys.exit(128 + exc.signum)
    if len(records) == 1:
        status = records[0].exit_status
        sys.exit(status if status and status > 0 else (0 if status == 0 else 1))
    sys.exit(0 if all(r.status == "ok" for r in records) else 1)
