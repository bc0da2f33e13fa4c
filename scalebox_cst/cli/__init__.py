"""Command line: a thin click layer over :class:`scalebox_cst.project.Project` and the run
supervisor (:mod:`scalebox_cst.runner.supervisor`), one module per command family.

Every error a user can cause (no store, unknown branch, bad config, bad path) is one line on
stderr and exit status 1 or 2; never a traceback. Entry points: ``scalebox`` (:func:`main`) and
``scalebox-watch`` (:func:`watch_main`).
"""
from __future__ import annotations

from scalebox_cst.cli import branches, history, monitor, rewrite, run, watch  # noqa: F401 (each adds its commands to cli)
from scalebox_cst.cli._common import cli
from scalebox_cst.explore import command as _explore_command

cli.add_command(_explore_command.explore)

__all__ = ["cli", "main", "watch_main"]


def main() -> None:
    cli(prog_name="scalebox")


def watch_main() -> None:
    watch.watch_command(prog_name="scalebox-watch")
