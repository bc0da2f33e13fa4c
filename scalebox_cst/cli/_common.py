"""What every command shares: one-line errors (never a traceback), opening the project, the
``--set`` parser, the working tree against a branch, and the click group the commands join."""
from __future__ import annotations

import json
import math
import os
import sys
from typing import Dict, List, NoReturn, Optional, Sequence

import click

from scalebox_cst.intake import shown_name
from scalebox_cst.config import Config, ConfigError, find_project_root
from scalebox_cst.project import Project
from scalebox_cst.store import StoreError


class FiniteFloat(click.FloatRange):
    """A float option in a range that refuses nan and inf (click's FloatRange lets them through:
    every comparison with nan is false, and an open end takes inf), and digits of other scripts
    (``float('١٤')`` is 14.0: a number no one typed meaning it, as digits.setting refuses)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.isascii():
            self.fail(f"{shown_name(repr(value))} is not a number in ASCII digits.", param, ctx)
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


def _fail(message: str, code: int = 1) -> NoReturn:
    """One line on stderr: a control or bidi character (a path or name the user gave) is escaped."""
    click.echo(f"scalebox: {shown_name(message)}", err=True)
    sys.exit(code)


def say(text: str) -> None:
    """A notice on stderr that a closed or broken stderr never stops (``scalebox run x.py 2>&1 |
    head``: whoever read it went away). A run goes on to its end and its record, as it does when
    its own output meets the closed pipe (runtime.output.Console); click's EPIPE exit here ended
    ``scalebox run`` at its next notice, its child killed with it and its record left ``lost``."""
    try:
        click.echo(text, err=True)
    except (OSError, ValueError):  # EPIPE, a full disk under a redirect, a closed stream
        pass


#: the one line for a command started in a folder that was deleted (or moved away) under the shell
CWD_GONE = "the current folder no longer exists (deleted or moved away); cd into an existing folder and run it again"


def cwd_gone() -> bool:
    """Whether the process's current folder is gone (``os.getcwd()`` fails): every relative
    path, ``.`` included, then raises FileNotFoundError from deep inside a command."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False


def _open_project(project_dir: Optional[str], start: str = ".", config: Optional[Config] = None) -> Project:
    root = project_dir or find_project_root(start)
    try:
        project = Project(root, config=config)
        done = project.recover()  # a rollback killed half-way is finished before anything else
    except (ConfigError, StoreError) as exc:
        _fail(str(exc))
    if done:
        click.echo(f"scalebox: {done}", err=True)
    return project


def why_not_snapshotted(project: Project, path: str, rel: str, otherwise: Optional[str] = None) -> Optional[str]:
    """Why the file ``path`` (``rel`` in the project) is in no snapshot, for the line that says so
    (``run`` refusing a script, ``rewrite`` of a file named that it cannot take): the file's own
    case (a name with a tab was blamed on "a typo, or scalebox.toml"); ``otherwise`` where the
    file has none (the scan's own warning, ``_warn_skipped``, names a file too large)."""
    from scalebox_cst.intake import name_problem, snapshotted

    problem = name_problem(rel)
    if problem:
        return f"its {problem}, and no snapshot takes such a file: rename it"
    if not os.path.lexists(path):
        return "no such file"
    if not snapshotted(project.config, rel):
        return "scalebox.toml leaves it out"
    if os.path.islink(path) or not os.path.isfile(path):
        return "not a regular file of the project (a link out of it, a folder or a FIFO is never snapshotted)"
    return otherwise


def _warn_skipped(project: Project) -> None:
    """One line per file the snapshot left out (a link out of the project, a FIFO, a name that is
    not UTF-8, ...: scalebox_cst.intake), so nothing is left out without a word."""
    for line in project.skipped:
        say(f"scalebox: warning: {line}")


class OneLineErrorsCommand(click.Command):
    """A store error that escapes a command (disk full, read-only or damaged store) is one line;
    so is Ctrl-C that reaches no handler of the command's own (``rewrite``, ``log``, ``run``
    before its run starts), with status 130 as for ``run`` and ``watch``, not click's
    ``Aborted!`` and 1. (Store writes are atomic: an interrupted command left nothing half done.)
    Before and after ``invoke`` the console script's own SIGINT handler answers (scalebox_cst._entry)."""

    def invoke(self, ctx: click.Context):
        from scalebox_cst._entry import Commanding

        with Commanding():
            try:
                return super().invoke(ctx)
            except StoreError as exc:
                _fail(str(exc))
            except KeyboardInterrupt:
                _fail("interrupted", 130)


class _OneLineErrors(OneLineErrorsCommand, click.Group):
    """The ``scalebox`` group: its ``invoke`` (the subcommand's whole run) is the one-line one."""


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


def _tree_changes(project: Project, source_commit: Optional[str], current: Optional[Dict[str, bytes]] = None) -> List[str]:
    """``M path`` / ``A path`` / ``D path`` for the working tree (``current``: its scan, where the
    caller has one) against a source snapshot."""
    current = project.scan() if current is None else current
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


def _load_config(project_dir: Optional[str]) -> Config:
    try:
        return Config.load(project_dir or find_project_root("."))
    except ConfigError as exc:
        _fail(str(exc))
        raise  # unreachable


_FAST_HELP = 'The opt-in reassociated tier ([accelerate] level = "reassociated"): guarded torch.compile of module methods; logged .item() numbers read after their loop; on CPU, Adam built fused and Categorical as a leaner subclass, small nets on one intra-op thread.'


def _fast(config: Config, fast: bool) -> Config:
    """``--fast``: the level that also runs accelerate.* (and the transform, if the list left it out)."""
    if fast:
        config.set_option("accelerate", "level", "reassociated")
        for tid in ("accelerate.compile", "accelerate.defer_sync", "accelerate.fused_optim",
                    "accelerate.fast_categorical", "accelerate.threads"):
            if not config.transform_enabled(tid):
                config.transforms = [*config.transforms, tid]
                config.disabled = [d for d in config.disabled if d not in ("accelerate.*", tid, "accelerate")]
    return config
