"""``scalebox watch`` and ``scalebox-watch``: each save a branch, and the run restarted from it."""
from __future__ import annotations

import os
import signal
import sys
from typing import Optional, Tuple

import click

from scalebox_cst.cli._common import FiniteFloat, OneLineErrorsCommand, _fail, cli
from scalebox_cst.config import ConfigError
from scalebox_cst.project import Project
from scalebox_cst.runner import signals
from scalebox_cst.store import StoreError
from scalebox_cst.watcher import MAX_DEBOUNCE


# ---------------------------------------------------------------------------- watch
def _watch_options(func):
    func = click.argument("args", nargs=-1, type=click.UNPROCESSED)(func)
    func = click.option("--polling", is_flag=True, help="Poll the file system instead of OS events.")(func)
    func = click.option("--debounce", type=FiniteFloat(min=0, max=MAX_DEBOUNCE), default=0.03, show_default=True,
                        help=f"Quiet seconds that end a batch (0 to {MAX_DEBOUNCE:g}).")(func)
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
        if script is not None:
            script = project.relpath(os.path.join(directory, script) if not os.path.isabs(script) else script)
        watcher = Watcher(project, script, argv, debounce=debounce, polling=polling, echo=click.echo, run_output=sys.stdout)
        watcher.claim()  # a second watcher of the project stops here, before it says it watches
        click.echo(f"scalebox: watching {project.root} (backend {project.backend}); Ctrl-C to stop")
    except (ConfigError, StoreError) as exc:
        _fail(str(exc))
    # a closed terminal or SIGTERM ends the loop (the run is stopped below); Ctrl-C ends it too
    with signals.calling(lambda _signum: watcher.stop(), (signal.SIGTERM, signal.SIGHUP)):
        try:
            watcher.start()
            watcher.run_forever()
        except KeyboardInterrupt:
            pass
        except BrokenPipeError:  # whoever read the output went away (`| tee` killed, `| head`)
            _output_closed(watcher)
        finally:
            with signals.ignored():  # stopping the run takes up to two grace periods: a second Ctrl-C must not orphan it
                watcher.close()
    click.echo(watcher.summary())


def _output_closed(watcher) -> None:
    """The watcher's output went away: stop (saves from now on are not committed) and say so on
    stderr in one line, with the branches made, instead of ending without a word."""
    sys.stdout = open(os.devnull, "w")  # nothing more reaches the closed pipe (nor Python's exit flush)
    watcher.close()
    click.echo(f"{watcher.summary()}; stopped: its output was closed (broken pipe)", err=True)
    sys.exit(1)


@cli.command(context_settings={"ignore_unknown_options": True})
@_watch_options
def watch(directory, script, debounce, polling, args) -> None:
    """Watch DIRECTORY: each save makes a run branch and (re)starts --run SCRIPT from it."""
    _watch(directory, script, debounce, polling, args)


@click.command(cls=OneLineErrorsCommand, context_settings={"ignore_unknown_options": True, "help_option_names": ["-h", "--help"]})
@_watch_options
def watch_command(directory, script, debounce, polling, args) -> None:
    """Watch DIRECTORY: each save makes a run branch and (re)starts --run SCRIPT from it."""
    _watch(directory, script, debounce, polling, args)
