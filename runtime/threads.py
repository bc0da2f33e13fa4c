"""Start helper threads that never take a process's signals.

Only the main thread runs Python signal handlers. When the kernel hands a process-directed
signal (SIGTERM from ``kill``, SIGINT from a terminal, SIGHUP) to another thread, the C-level
handler only sets a flag: a main thread blocked in a system call (``waitpid``, ``sleep``, a
read) is not woken and the handler runs when that call ends by itself, perhaps minutes later.
Threads started here block those signals (a new thread inherits its creator's mask, so the
mask is set around ``start()`` and nothing can arrive in between), so the kernel delivers them
to the main thread, whose blocked call then returns EINTR and runs the handler at once. Faults
a thread raises itself (SIGSEGV, SIGFPE, ...) are left unblocked: they go to the faulting
thread and ``faulthandler`` must see them.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

_SYNCHRONOUS = {
    getattr(signal, name) for name in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS", "SIGABRT", "SIGPIPE",
                                       "SIGKILL", "SIGSTOP") if hasattr(signal, name)
}


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """Every asynchronous signal blocked in this thread meanwhile (a thread started then
    inherits the mask); nothing where the platform has no ``pthread_sigmask``."""
    if not hasattr(signal, "pthread_sigmask"):  # not POSIX: the kernel does not pick threads
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.valid_signals()) - _SYNCHRONOUS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def start(thread: threading.Thread) -> threading.Thread:
    """``thread.start()`` with every asynchronous signal blocked in the new thread."""
    with _signals_blocked():
        thread.start()
    return thread


def start_unwaited(target, args=()) -> bool:
    """``target(*args)`` in a new thread with asynchronous signals blocked (as :func:`start`), but
    without ``threading.Thread.start``'s wait for the thread to say it runs: that wait has no time
    limit, and a thread the system made whose first allocation fails never says so (a process at
    its RLIMIT_DATA: ``scalebox run --memory 16m`` hung for ever, found by a test-order shuffle).
    The caller learns that it runs from the thread itself. False where no thread could be made."""
    import _thread

    with _signals_blocked():
        try:
            _thread.start_new_thread(target, tuple(args))
        except (RuntimeError, MemoryError):  # "can't start new thread"
            return False
    return True


def start_daemon(target, name: str, args=()) -> threading.Thread:
    """A daemon thread running ``target(*args)``, started with :func:`start`."""
    return start(threading.Thread(target=target, name=name, args=args, daemon=True))
