"""Command line: a thin click layer over :class:`scalebox_cst.project.Project` and the run
supervisor (:mod:`scalebox_cst.runner.supervisor`), one module per command family.

Every error a user can cause (no store, unknown branch, bad config, bad path) is one line on
stderr and exit status 1 or 2; never a traceback. Entry points: ``scalebox`` (:func:`main`) and
``scalebox-watch`` (:func:`watch_main`).
"""
from __future__ import annotations

from scalebox_cst.cli import branches, history, monitor, rewrite, run, watch  # noqa: F401 (each adds its commands to cli)
from scalebox_cst.cli._common import CWD_GONE, _fail, cli, cwd_gone
from scalebox_cst.explore import command as _explore_command

cli.add_command(_explore_command.explore)

__all__ = ["cli", "main", "watch_main"]


def _one_line_without_a_cwd(command, prog_name: str) -> None:
    """``command`` run as click runs it; started in a folder deleted under the shell, the
    FileNotFoundError that any relative path (``.`` included) raises is one line, not a traceback
    (a command given only absolute paths still works there)."""
    try:
        command(prog_name=prog_name)
    except FileNotFoundError:
        if not cwd_gone():
            raise
        _fail(CWD_GONE)


def main() -> None:
    _one_line_without_a_cwd(cli, "scalebox")


def watch_main() -> None:
    _one_line_without_a_cwd(watch.watch_command, "scalebox-watch")
