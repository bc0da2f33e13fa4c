"""``scalebox explore``: list the tunable places, run a study, resume it; and the apply step of
``scalebox rewrite --tuned-config optimal_params.json``. Every error a user can cause is one
line (a failing script's traceback follows its line)."""
from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any, Dict, List, NoReturn, Optional, Tuple

import click



def _fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"scalebox: {message}", err=True)
    sys.exit(code)


def _project(project_dir: Optional[str], start: str):
    from scalebox_cst.config import ConfigError, find_project_root
    from scalebox_cst.project import Project
    from scalebox_cst.store import StoreError

    try:
        return Project(project_dir or find_project_root(start))
    except (ConfigError, StoreError) as exc:
        _fail(str(exc))


def _list(script: str, as_json: bool) -> None:
    from scalebox_cst.explore.places import PlaceError, find_places

    from scalebox_cst.intake import NotRead, read_named

    try:
        source = read_named(script)
    except NotRead as exc:
        _fail(f"{script}: {exc}; not read", 2)
    try:
        places = find_places(script, source)
    except PlaceError as exc:
        _fail(str(exc), 2)
    if as_json:
        click.echo(json.dumps([p.to_json() for p in places], indent=2))
        return
    if not places:
        click.echo(f"{script}: no tunable places (module constants, argparse defaults, config fields, numeric call keywords)")
        return
    width = max(len(p.qualified) for p in places)
    where = max(len(p.where) for p in places)
    for p in places:
        click.echo(f"{p.qualified:<{width}}  {p.where:<{where}}  {p.text:<12}  {p.kind}")


@click.command("explore")
@click.argument("script", required=False, type=click.Path())
@click.option("--list", "list_only", is_flag=True, help="List SCRIPT's tunable places: name, file:line, value, kind.")
@click.option("-c", "--config", "config_path", type=click.Path(), help="The study: explore.yaml (or .toml).")
@click.option("--resume", is_flag=True, help="Go on with the stored study (after an interruption or kill).")
@click.option("--sampler-seed", type=int, help="Seed Optuna's sampler (a reproducible study).")
@click.option("--json", "as_json", is_flag=True, help="--list as JSON.")
@click.option("--project", "project_dir", type=click.Path(file_okay=False, exists=True), help="Project root.")
def explore(script: Optional[str], list_only: bool, config_path: Optional[str], resume: bool, sampler_seed: Optional[int],
            as_json: bool, project_dir: Optional[str]) -> None:
    """Tune hyper-parameters where they live in the code; every trial is a committed branch.

    scalebox explore --list train.py; scalebox explore -c explore.yaml [--resume]"""
    if list_only:
        if not script:
            _fail("--list needs SCRIPT", 2)
        _list(script, as_json)
        return
    if not config_path:
        _fail("give -c explore.yaml (or --list SCRIPT)", 2)
    if script:
        _fail("SCRIPT goes in the config (script:), or use --list SCRIPT", 2)
    from scalebox_cst.explore import config as cfg
    from scalebox_cst.explore import report
    from scalebox_cst.explore.branches import places_of
    from scalebox_cst.explore.places import PlaceError
    from scalebox_cst.explore.study import ExploreError, Study, disk_error, require_optuna
    from scalebox_cst.cli._common import say

    try:
        config = cfg.load(config_path)
    except cfg.ExploreConfigError as exc:
        _fail(str(exc), 2)
    try:
        require_optuna()
    except ExploreError as exc:
        _fail(str(exc))
    project = _project(project_dir, os.path.dirname(os.path.abspath(config_path)))
    base = os.path.dirname(config.path)
    script_rel = project.relpath(os.path.join(base, config.script))
    if script_rel.startswith(".."):
        _fail(f"{os.path.basename(config.path)}: script: {config.script} is outside the project {project.root}", 2)
    if config.launcher == "ray":
        from scalebox_cst import raylaunch

        try:
            raylaunch.require_ray()
        except raylaunch.RayUnavailable as exc:
            _fail(str(exc))
    config.script = script_rel
    files = project.scan()
    paths = [script_rel] + [project.relpath(os.path.join(base, f)) for f in config.files]
    try:
        bound = cfg.bind(config, places_of(files, paths))
    except (cfg.ExploreConfigError, PlaceError) as exc:
        _fail(str(exc), 2)
    try:
        study = Study(project, config, bound, resume, echo=say, sampler_seed=sampler_seed)
    except ExploreError as exc:
        _fail(str(exc))
    click.echo(f"scalebox: study {config.study}: {config.trials} trials of {script_rel}, {config.direction} {config.metric}; "
               f"storage {os.path.relpath(study.dir, project.root)}", err=True)
    error = None
    stopped = 0  # the stop signal that ended the study: the exit status is 128 + it, as for ``run``

    from scalebox_cst.runner import signals

    try:  # SIGTERM/SIGHUP stop the runs, record the trials interrupted, write the report
        with signals.raising(signals.Gate(), (signal.SIGTERM, signal.SIGHUP)):
            study.run()
    except ExploreError as exc:
        error = str(exc)
    except KeyboardInterrupt as exc:
        stopped = exc.signum if isinstance(exc, signals.Interrupted) else signal.SIGINT
        error = "interrupted; go on with --resume"
    except OSError as exc:  # a full disk while the main thread wrote the journal
        error = disk_error(exc, study.dir)
    finally:
        written: Optional[Dict[str, Optional[str]]]
        try:
            written = report.write(study.study, study.dir)
        except OSError as exc:
            written = None
            click.echo(f"scalebox: report not written: {exc.filename or study.dir}: {exc.strerror or exc}", err=True)
        except ExploreError as exc:
            written = None
            click.echo(f"scalebox: report not written: {exc}", err=True)
    if written is None:
        _fail(error or "the report could not be written", 128 + stopped if stopped else 1)
    click.echo(f"report: {written['report']}")
    if written["optimal"]:
        best = json.load(open(written["optimal"], encoding="utf-8"))
        click.echo(f"best: trial {best['trial']} ({best['branch']}) {config.metric} {best['value']:.6g}: "
                   + ", ".join(f"{k}={v}" for k, v in best["params"].items()))
        try:
            shown = os.path.relpath(written["optimal"])
        except (OSError, ValueError):  # the current folder is gone, or another drive's
            shown = written["optimal"]
        click.echo(f"optimal params: {written['optimal']} (apply: scalebox rewrite --tuned-config {shown})")
    if error:
        _fail(error, 128 + stopped if stopped else 1)


def _assignments(data: Any, files, name: str) -> List:
    """(place, value) per entry of optimal_params.json, each place found again in the current
    code by its qualified name and kind (the nearest line); those gone: one PlaceError naming them."""
    from scalebox_cst.explore.places import PlaceError, find_places, render

    if not isinstance(data, dict) or not isinstance(data.get("places"), dict) or not isinstance(data.get("params"), dict):
        raise PlaceError(f"{name}: not an optimal_params.json (expects params and places)")
    out, missing = [], []
    cache = {}
    for key, info in data["places"].items():
        try:
            path, qualified, kind, line = info["path"], info["qualified"], info["kind"], int(info["line"])
        except (KeyError, TypeError, ValueError):
            raise PlaceError(f"{name}: places.{key}: expects path, line, qualified, kind") from None
        if key not in data["params"]:
            raise PlaceError(f"{name}: places.{key}: no value under params")
        if path not in cache:
            cache[path] = find_places(path, files[path]) if path in files else []
        same = [p for p in cache[path] if p.qualified == qualified and p.kind == kind]
        if not same:
            missing.append(f"{path}:{line}:{info.get('name', key)}")
            continue
        try:
            render(data["params"][key])  # a value no literal writes (NaN, a list): before anything is committed
        except PlaceError as exc:
            raise PlaceError(f"{name}: params.{key}: {exc}") from None
        out.append((min(same, key=lambda p: abs(p.line - line)), data["params"][key]))
    if missing:
        raise PlaceError(f"{name}: places no longer in the code: {', '.join(missing)}")
    return out


def apply_tuned(project, path: str):
    """``scalebox rewrite --tuned-config``: commit a branch whose *source* carries the tuned values
    (so ``scalebox rollback BRANCH`` puts them in your files) rewritten as usual; returns
    (base branch, tuned branch, [(place, value)]). The working tree is committed first as the base."""
    from scalebox_cst.project import report_text
    from scalebox_cst.explore.places import PlaceError, set_values
    from scalebox_cst.report import RunReport

    from scalebox_cst.config import MAX_CONFIG_BYTES
    from scalebox_cst.intake import NotRead, read_named

    name = os.path.basename(path)
    try:
        data = json.loads(read_named(path, limit=MAX_CONFIG_BYTES).decode("utf-8"))
    except NotRead as exc:
        raise PlaceError(f"{path}: {exc}; not read") from None
    except RecursionError:
        raise PlaceError(f"{name}: values nested too deeply to read") from None
    except ValueError as exc:
        raise PlaceError(f"{name}: not JSON ({exc})") from None
    files = project.scan()
    edits = _assignments(data, files, name)  # its one-line errors before the base branch is committed
    base = project.commit_change(message="scalebox rewrite --tuned-config (base)")
    tuned = dict(files)
    by_path: Dict[str, List[Tuple[Any, Any]]] = {}
    for place, value in edits:
        by_path.setdefault(place.path, []).append((place, value))
    for p, e in by_path.items():
        tuned[p] = set_values(files[p], e)
    store = project.store
    label = f"tuned by study {data.get('study')}, trial {data.get('trial')}"
    changes = "; ".join(f"{p.name} {p.text} -> {v!r}" for p, v in edits)
    source_commit, _ = store.snapshot(tuned, f"scalebox rewrite --tuned-config {name}: {changes}")
    results = project.rewrite_files(tuned)
    report = RunReport(None, None, source_commit, project.backend, [r.report for r in results.values()])
    branch, commit = store.commit_rewrite(source_commit, {p: r.output for p, r in results.items()},
                                          f"{label}: {changes}", report_text(report), report.to_json(), project.pipeline.fingerprint)
    return base.report.branch, branch, edits


def rewrite_tuned(path: str, project_dir: Optional[str]) -> None:
    """The CLI side of ``scalebox rewrite --tuned-config FILE``: the branch, what changed, how to review and keep it."""
    from scalebox_cst.explore.places import PlaceError
    from scalebox_cst.store import StoreError

    project = _project(project_dir, ".")
    try:
        base, branch, edits = apply_tuned(project, path)
    except PlaceError as exc:
        _fail(str(exc), 2)
    except (StoreError, OSError) as exc:
        _fail(str(exc))
    for place, value in edits:
        click.echo(f"{place.where}: {place.name} {place.text} -> {value!r}")
    click.echo(f"{branch}: tuned values from {os.path.basename(path)} (base {base})")
    click.echo(f"review: scalebox diff {base} {branch}; keep: scalebox rollback {branch}")
