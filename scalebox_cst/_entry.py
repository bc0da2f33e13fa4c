"""The console scripts (``scalebox``, ``scalebox-watch``): Ctrl-C while the command's modules
load (click, pygit2, the engine: the first tenths of a second) ends it with one line and status
130, not a ``KeyboardInterrupt`` traceback from inside an import. Once loaded, the commands
handle SIGINT themselves.

The handler is installed by this module's first statements, with only ``os`` and ``_signal``
(the C module under ``signal``; both are in ``sys.modules`` before any script runs, so importing
them runs nothing): importing the engine's signal helpers first left a window of several
milliseconds (``threading``...) in which Ctrl-C was a traceback, and ``import signal`` itself,
which is not loaded at start-up, one of about a millisecond (``enum``)."""
import os

import _signal


def _quit_while_starting(signum, _frame) -> None:  # pragma: no cover - ends the process
    try:
        os.write(2, b"scalebox: interrupted while starting; nothing was done\n")
    finally:
        os._exit(128 + signum)


def _load():
    """``scalebox_cst.cli``, loaded with Ctrl-C ending the process (an ignored SIGINT stays so)."""
    try:
        mine = _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler
        if mine:
            _signal.signal(_signal.SIGINT, _quit_while_starting)
    except ValueError:  # not the main thread: nothing to install
        mine = False
    try:
        from scalebox_cst import cli
    finally:
        if mine:
            _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    return cli


def main() -> None:
    _load().main()


def watch_main() -> None:
    _load().watch_main()
