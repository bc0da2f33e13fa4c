"""A run's processes end with the run, and with the ``scalebox run`` that started it.

Two holes this closes (both measured, issue 19):

* **The child's start-up.** The child (``runtime.launch``, or torchrun for ``--nproc``) used to
  learn of its parent's death from a thread it started only after importing pygit2, the loader
  and telemetry (torch for torchrun): a SIGKILL to ``scalebox run`` in those first seconds left
  the child running. Now the executor's ``preexec_fn`` (:func:`preexec_for`, in the forked child
  before ``exec``) sets ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` and re-checks ``getppid()`` (the
  parent may have died between ``fork`` and ``prctl``), so the kernel kills the child from its
  first instruction on. The child's entry point calls :func:`hold` before importing anything
  heavy: it starts the watch thread that ends the whole run (the child's process group and the
  processes below) and only then clears the death signal, which would otherwise kill the child
  before it could stop its workers.

* **Processes that leave the process group.** A daemon that calls ``setsid`` (or
  ``start_new_session=True``, a double fork) is out of the run's process group, which is what
  ``stop()`` signals. Every process of a run inherits ``SCALEBOX_RUN_DIR`` (the run's folder,
  unique) in its environment, and ``/proc/<pid>/environ`` keeps the environment a process
  started with, so :func:`run_processes` finds them all wherever they were reparented; the
  executor ends them when the run ends (:func:`end_run_processes`), and so does the watch
  thread when ``scalebox run`` is killed.

What still escapes (README): a process started with an environment without ``SCALEBOX_RUN_DIR``
(``env={}``), or one of another user; without ``/proc`` or ``prctl`` (macOS) only the process
group is ended.

This module is imported by the child before anything else: standard library only, no torch.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Callable, Iterable, List, Optional

#: the run's folder; every process of the run inherits it (set by the executor)
ENV_RUN_DIR = "SCALEBOX_RUN_DIR"
#: the pid of the ``scalebox run`` (executor) process, for its own child only (popped by :func:`hold`)
ENV_PARENT = "SCALEBOX_PARENT_PID"

_PR_SET_PDEATHSIG = 1
_prctl_fn = None


def _prctl() -> Optional[Callable[..., int]]:
    """libc's ``prctl`` (Linux), else None."""
    global _prctl_fn
    if _prctl_fn is None:
        _prctl_fn = False
        if os.uname().sysname == "Linux":
            try:
                import ctypes

                _prctl_fn = ctypes.CDLL(None, use_errno=True).prctl
            except (OSError, AttributeError):
                pass
    return _prctl_fn or None


def _set_death_signal(sig: int) -> bool:
    prctl = _prctl()
    if prctl is None:
        return False
    import ctypes

    return prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(sig), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0


def preexec_for(parent: int) -> Optional[Callable[[], None]]:
    """``preexec_fn`` for the run's child: SIGKILL when ``parent`` dies, from before ``exec``.
    None where there is no ``prctl`` (the child's watch thread is then the only guard)."""
    if _prctl() is None:
        return None
    import ctypes  # loaded here, in the parent: the forked child only calls

    prctl = _prctl()
    args = (ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))

    def preexec() -> None:
        # a child inherits the signal mask of the thread that forks it: a run started from a
        # thread that blocks SIGINT/SIGTERM (runtime.threads) would never see a graceful stop
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_SETMASK, ())
        # SIGINT ignored until hold() handles it: a stop in the interpreter's start-up would
        # otherwise print a KeyboardInterrupt traceback from whatever it was importing
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        prctl(_PR_SET_PDEATHSIG, *args)
        if os.getppid() != parent:  # died between fork and prctl: the signal will never come
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


#: seconds :func:`hold` waits for its watch thread to say it runs (microseconds, unless the
#: process has no memory left to start it)
START_WAIT = 5.0


def hold(grace: float, interval: float = 0.25) -> bool:
    """In the executor's own child, first thing: watch the executor; once it is gone, end the
    run (:func:`end_all`), also when this process exits first (its script's next print to the
    dead executor's pipe raises BrokenPipeError: measured, the workers were left). Then clear the death signal :func:`preexec_for` set. False (nothing
    done) in any other process, e.g. a worker, which inherits no :data:`ENV_PARENT`."""
    raw = os.environ.pop(ENV_PARENT, None)
    if not raw:
        return False
    parent = int(raw)
    run_dir = os.environ.get(ENV_RUN_DIR)
    signal.signal(signal.SIGINT, stopped_in_start_up)
    if stop_reason():  # asked to stop while SIGINT was still ignored
        stopped_in_start_up(signal.SIGINT, None)

    import threading

    running = threading.Event()

    def watch() -> None:
        running.set()
        while os.getppid() == parent:
            time.sleep(interval)
        # nothing is written: stdout and stderr are pipes to the dead parent
        end_all(run_dir, grace)

    def at_exit() -> None:  # e.g. a print to the dead parent's pipe raised first (BrokenPipeError)
        if os.getppid() != parent:
            end_all(run_dir, grace)

    import atexit

    from scalebox_cst.runtime import threads

    atexit.register(at_exit)
    # the watch thread (or at_exit) ends the run from now on, workers and all; a thread that
    # never says it runs (no memory to start it, under --memory) leaves the death signal set:
    # the kernel still ends this process with its parent
    if threads.start_unwaited(watch) and running.wait(START_WAIT):
        _set_death_signal(0)
    return True


def stopped_in_start_up(signum, frame) -> None:
    """SIGINT before the script runs (the launcher sets Python's own handler back then): the
    same one line as a KeyboardInterrupt in the script, and the same end (death by SIGINT)."""
    import sys

    why = stop_reason()
    try:
        print(f"scalebox: run stopped: {why}" if why else "scalebox: run interrupted (KeyboardInterrupt)", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def stop_reason() -> Optional[str]:
    """The reason of the executor's ``stopping`` event when it is the run's last event (the
    executor writes it before its first stop signal), else None."""
    import json

    folder = os.environ.get(ENV_RUN_DIR)
    if not folder:
        return None
    try:
        with open(os.path.join(folder, "events.jsonl"), "rb") as fh:
            last = json.loads(fh.read().rstrip(b"\n").rsplit(b"\n", 1)[-1])
    except (OSError, ValueError, IndexError, RecursionError):
        return None
    if isinstance(last, dict) and last.get("kind") == "stopping":
        return str(last.get("message") or "") or None
    return None


def end_all(run_dir: Optional[str], grace: float) -> None:
    """From inside the run, its executor gone: SIGTERM to every other process of the run (its
    process group, and those that left it), SIGKILL to what is left after ``grace``, then SIGKILL
    to the group, this process last. Not SIGTERM to the group at once: this process would die
    of it while its main thread, all signals blocked inside ``fork_exec``, starts a worker the
    group signal no longer reaches (measured: the worker survived); SIGKILL cannot be blocked,
    and a fork in progress when it is pending is undone."""
    group = os.getpgrp()
    signalled = set()
    deadline = time.time() + grace
    while True:
        others = set(_members(run_dir, group))
        for pid in others - signalled:
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        signalled |= others
        if not others or time.time() >= deadline:
            break
        time.sleep(0.05)
    for pid in _members(run_dir, group):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass


def _members(run_dir: Optional[str], group: int) -> List[int]:
    """Live processes of the run but this one: in ``group``, or naming ``run_dir`` (:func:`run_processes`)."""
    found = set(run_processes(run_dir)) if run_dir else set()
    try:
        names = os.listdir("/proc")
    except OSError:
        names = []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == group:
            found.add(int(name))
    found.discard(os.getpid())
    return sorted(found)


def run_processes(run_dir: str, exclude: Iterable[int] = ()) -> List[int]:
    """Pids of the live processes (of this user) whose starting environment names ``run_dir`` or
    a folder inside it (a torchrun rank other than 0 names its own ``ranks/<k>``, and so do the
    processes it starts)."""
    marker = f"{ENV_RUN_DIR}={run_dir}".encode()
    inside = marker.rstrip(b"/") + b"/"
    skip = set(exclude) | {os.getpid()}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    found = []
    for name in names:
        if not name.isdigit() or int(name) in skip:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:  # gone, or another user's
            continue
        if any(entry == marker or entry.startswith(inside) for entry in environ.split(b"\0")):
            found.append(int(name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def end_processes(pids: Iterable[int], grace: float) -> List[int]:
    """SIGTERM, then SIGKILL after ``grace`` seconds to those still alive; returns the pids signalled."""
    pids = list(pids)
    sent = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            sent.append(pid)
        except OSError:
            pass
    deadline = time.time() + grace
    while sent and time.time() < deadline and any(_alive(p) for p in sent):
        time.sleep(0.05)
    for pid in sent:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return sent


def end_run_processes(run_dir: str, grace: float = 2.0) -> List[int]:
    """On the executor's side, after the run's child ended: whatever of the run still lives
    (processes that left its group: daemons). Returns their pids (none: an empty list)."""
    return end_processes(run_processes(run_dir), grace)
