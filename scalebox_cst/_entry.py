"""The console scripts (``scalebox``, ``scalebox-watch``): Ctrl-C while the command's modules
load (click, pygit2, the engine: the first tenths of a second) ends it with one line and status
130, not a ``KeyboardInterrupt`` traceback from inside an import. Once loaded, the commands
handle SIGINT themselves.

The handler is installed by this module's first statements, with only ``os``, ``sys`` and ``_signal``
(the C module under ``signal``; all three are in ``sys.modules`` before any script runs, so importing
them runs nothing): importing the engine's signal helpers first left a window of several
milliseconds (``threading``...) in which Ctrl-C was a traceback, and ``import signal`` itself,
which is not loaded at start-up, one of about a millisecond (``enum``).

The handler stays until the command's own code starts (:class:`Commanding`, entered by the click
group's ``invoke``): click parses the arguments and finds the command after the modules are
loaded, and a Ctrl-C there (CI hit it 0.12 s in) was click's ``Aborted!`` and status 1. After
the command, while click closes its context and exits, Ctrl-C is one line and 130 too."""
import os
import sys

import _signal


def _quit_while_starting(signum, _frame) -> None:  # pragma: no cover - ends the process
    try:
        os.write(2, b"scalebox: interrupted while starting; nothing was done\n")
    finally:
        os._exit(128 + signum)


def _quit_when_done(signum, _frame) -> None:  # pragma: no cover - ends the process
    """After the command: what it printed is flushed, then the process ends at once (an exception
    raised here could land in an atexit callback, a traceback of its own)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # closed, broken, or busy in the write this signal interrupted
            pass
    try:
        os.write(2, b"scalebox: interrupted\n")
    finally:
        os._exit(128 + signum)


def _swap(current, new) -> bool:
    """Install ``new`` as the SIGINT handler where ``current`` is the one installed."""
    try:
        if _signal.getsignal(_signal.SIGINT) is current:
            _signal.signal(_signal.SIGINT, new)
            return True
    except ValueError:  # not the main thread: nothing to install
        pass
    return False


class Commanding:
    """Entered around the command's own code: Ctrl-C is ``KeyboardInterrupt`` inside (each
    command, or the group's one line, handles it), and one line and 130 after it. Outside the
    console scripts (click's test runner, ``python -m``) the handler was never ours: nothing
    changes."""

    def __enter__(self) -> "Commanding":
        self.ours = _swap(_quit_while_starting, _signal.default_int_handler)
        return self

    def __exit__(self, *exc) -> None:
        if self.ours:
            _swap(_signal.default_int_handler, _quit_when_done)  # a command that left its own keeps it


def _load():
    """``scalebox_cst.cli``, loaded with Ctrl-C ending the process (an ignored SIGINT stays so);
    the handler stays until the command starts (:class:`Commanding`)."""
    mine = _swap(_signal.default_int_handler, _quit_while_starting)
    try:
        from scalebox_cst import cli
    except BaseException:
        if mine:
            _swap(_quit_while_starting, _signal.default_int_handler)
        raise
    return cli


def main() -> None:
    _load().main()


def watch_main() -> None:
    _load().watch_main()
