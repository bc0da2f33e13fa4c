"""The host's stop signals, handled in one place for every way a run is supervised.

SIGINT (Ctrl-C), SIGTERM (a scheduler, ``kill``) and SIGHUP (a closed terminal) all mean "stop the
run(s) and record why". Two ways to hear them: :func:`raising` turns each into
:class:`Interrupted` in the main thread (``scalebox run``, ``--heal``, ``--locate-nan``), except while
a run is being started, when the signal waits until the run is tracked: a run is never started
untracked, so never orphaned; :func:`calling` hands the signal to a callback (the watcher's loop,
Ray's stop event). :func:`ignored` holds them off while runs are stopped (that takes up to two
grace periods; a second Ctrl-C must not orphan a child). Handlers are installed from the main
thread only (Python's rule); elsewhere these are no-ops, and the caller's own loop decides.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from types import FrameType
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Union

#: the signals that stop supervised runs
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """A stop signal reached the supervising process; ``signum`` says which (``str()``: its name,
    as a KeyboardInterrupt the code between says why it stopped)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class Gate:
    """The handler :func:`raising` installs: raises :class:`Interrupted`, except between
    :meth:`starts` and :meth:`started`, when the signal is kept and raised at :meth:`started`."""

    def __init__(self) -> None:
        self.depth = 0
        self.pending: Optional[int] = None

    def __call__(self, signum, _frame) -> None:
        if self.depth:
            self.pending = signum
            return
        raise Interrupted(signum)

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """A run is being started: a signal now waits until it is tracked (the block's end)."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        if not self.depth and self.pending is not None:
            signum, self.pending = self.pending, None
            raise Interrupted(signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


#: what signal.signal installs and returns (None: a handler not installed from Python)
_Handler = Union[Callable[[int, Optional[FrameType]], Any], int, signal.Handlers, None]


@contextlib.contextmanager
def _installed(handler, signums: Sequence[int]) -> Iterator[None]:
    if not _main_thread():
        yield
        return
    previous: Dict[int, _Handler] = {}
    try:
        for s in signums:
            previous[s] = signal.signal(s, handler)
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old if old is not None else signal.SIG_DFL)


@contextlib.contextmanager
def raising(gate: Gate, signums: Sequence[int] = STOP_SIGNALS) -> Iterator[Gate]:
    """Within the block the stop signals raise :class:`Interrupted` through ``gate``."""
    with _installed(gate, signums):
        yield gate


@contextlib.contextmanager
def calling(on_signal: Callable[[int], None], signums: Sequence[int] = STOP_SIGNALS) -> Iterator[None]:
    """Within the block the stop signals call ``on_signal(signum)`` (no exception)."""
    with _installed(lambda signum, _frame: on_signal(signum), signums):
        yield


@contextlib.contextmanager
def ignored(signums: Sequence[int] = STOP_SIGNALS) -> Iterator[None]:
    """Within the block the stop signals are ignored (runs being stopped finish their records)."""
    with _installed(signal.SIG_IGN, signums):
        yield
