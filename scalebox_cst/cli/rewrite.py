"""``scalebox init`` and ``scalebox rewrite``: make the store, rewrite files (and show the report)."""
from __future__ import annotations

import json
import os
import sys
from typing import List, Tuple

import click

from scalebox_cst.cli._common import _FAST_HELP, _fail, _fast, _load_config, _open_project, _parse_set, _warn_skipped, cli, say, why_not_snapshotted
from scalebox_cst.intake import shown_name
from scalebox_cst.config import BACKENDS, ConfigError, find_project_root
from scalebox_cst.project import Project
from scalebox_cst.store import StoreError


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
@click.argument("paths", nargs=-1, type=click.Path(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report.")
@click.option("--tuned-config", type=click.Path(dir_okay=False), help="A branch whose code carries optimal_params.json's values (scalebox explore).")
@click.option("--out", type=click.Path(file_okay=False), help="Also write the rewritten files to this folder.")
@click.option("--transform", "only", multiple=True, help="Run only these transforms (id or glob); repeatable.")
@click.option("--no-transform", "without", multiple=True, help="Do not run these transforms; repeatable.")
@click.option("--backend", type=click.Choice(BACKENDS), help="Target backend for device.* transforms.")
@click.option("--project", "project_dir", type=click.Path(file_okay=False, exists=True), help="Project root.")
@click.option("--allow-precision-change", is_flag=True, help="Let device.precision turn float64 into float32 (NPU).")
@click.option("--set", "settings", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a config option.")
@click.option("--fast", is_flag=True, help=_FAST_HELP)
def rewrite(paths, as_json, out, only, without, backend, project_dir, allow_precision_change, settings, tuned_config=None, fast=False) -> None:
    """Rewrite PATHS once and commit the result to a new run branch."""
    if tuned_config:
        from scalebox_cst.explore import command as explore_command

        return explore_command.rewrite_tuned(tuned_config, project_dir)
    if not paths:
        _fail("missing PATHS: name the files or folders to rewrite (`scalebox rewrite .` for the whole project), "
              "or --tuned-config FILE", 2)
    root = project_dir or find_project_root(paths[0])
    config = _load_config(root)
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
    _fast(config, fast)
    _parse_set(settings, config)
    project = _open_project(root, config=config)
    select: List[str] = []
    named: List[Tuple[str, str]] = []  # (path, rel) of each file named, not found in a folder named
    for path in paths:
        rel = project.relpath(path)
        if rel.startswith(".."):
            _fail(f"{path} is outside the project {project.root} (use --project)", 2)
        if os.path.isdir(path):
            select.extend(p for p in project.scan() if rel in (".", "") or p.startswith(rel.rstrip("/") + "/"))
        else:
            select.append(rel)
            named.append((path, rel))
    if out:
        from scalebox_cst.outdir import refusal

        problem = refusal(out, project.root, project.state_dir, set(select))
        if problem:
            _fail(f"--out {problem}", 2)
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
    taken = {f.path for f in report.files}
    left = [(path, rel) for path, rel in named if rel not in taken]
    for path, rel in left:  # a file named that no snapshot holds: said, not rewritten without a word
        why = why_not_snapshotted(project, path, rel)
        if why:
            say(f"scalebox: {shown_name(rel)}: {why}; not rewritten")
    nothing = bool(left) and len(left) == len(named) == len(paths)  # the user's every file, none taken
    if out:
        from scalebox_cst.outdir import OutError, write_tree

        try:
            write_tree(out, result.outputs)
        except OutError as exc:
            _fail(f"--out {exc}; committed as {report.branch}")
        except OSError as exc:
            _fail(f"--out {out}: {exc.strerror or exc} ({exc.filename or out}); committed as {report.branch}")
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
        sys.exit(1 if failed or nothing else 0)
    for f in report.files:
        if f.status == "error":
            click.echo(f.error, err=True)
        for site in f.sites:
            click.echo(site.describe(f.path))
    assert report.commit is not None  # commit_change without block_on_bad_input always commits
    click.echo(f"{report.branch} {report.commit[:10]}: {report.summary()} (backend {report.backend})")
    if out:
        click.echo(f"rewritten files written to {out}")
    if failed:  # committed (carried unchanged), but the user asked for a rewrite and did not get it
        click.echo(f"scalebox: {len(failed)} file(s) could not be rewritten", err=True)
        sys.exit(1)
    if nothing:
        sys.exit(1)
