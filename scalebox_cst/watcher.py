"""Watch a project folder; each batch of saves becomes a branch and (re)starts the run.

One recursive watchdog observer on the folder (not on files: editors save by writing a temp file
and renaming it over the original, so a move counts as a write of its destination). Events are
debounced into batches; the content hash in ``Project.commit_change`` decides whether anything
changed, so reads, touches and the engine's own state writes (``.scalebox/``) create no branch.
"""
from __future__ import annotations

import os
import math
import queue
import re
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Set

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserverVFS

from scalebox_cst import headlines, statedir
from scalebox_cst.project import STATE_DIR, ChangeResult, Project
from scalebox_cst.report import RunReport
from scalebox_cst.runtime import threads
from scalebox_cst.store import StoreError

if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    fcntl = None
else:
    import fcntl

if TYPE_CHECKING:
    from scalebox_cst.hotfix import WatchHealer

#: the files a project's config is read from (scalebox_cst.config.Config.load)
_CONFIG_FILES = ("scalebox.toml", "pyproject.toml")
# Events that never mean "content may have changed".
_IGNORED_EVENTS = {"opened", "closed_no_write"}
#: the longest quiet time that ends a batch (``--debounce``), seconds
MAX_DEBOUNCE = 300.0
#: how often a wait for events looks whether the watcher was asked to stop, seconds
_STOP_CHECK = 0.1
#: under .scalebox/: held (flock) by the one watcher of the project, holds its pid
WATCH_LOCK = "watch.lock"


class AlreadyWatched(StoreError):
    """Another watcher holds the project's watch lock: two would commit every save twice (and
    with ``--run`` train twice at once)."""


def _watch_lock(project: Project) -> Optional[int]:
    """Take the project's watch lock (released by the kernel when its holder dies: a killed
    watcher leaves nothing stale); returns its fd, or None where ``.scalebox/`` cannot be
    written (then the store refuses each save itself, in one line)."""
    path = os.path.join(project.state_dir, WATCH_LOCK)
    try:
        fd = statedir.open_in_place(path, os.O_RDWR | os.O_CREAT)  # never truncates a link's target
    except statedir.LinkInState as exc:
        raise StoreError(str(exc)) from None
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.read(fd, 32).decode("ascii", "replace").strip()
        except OSError:
            holder = ""
        os.close(fd)
        who = f" (pid {holder})" if holder.isdigit() else ""
        raise AlreadyWatched(f"{project.root} is already watched by another scalebox watch{who}; "
                             "stop that one first (one watcher per project)") from None
    except OSError:
        os.close(fd)
        return None  # a file system without locks: watch unguarded, as before
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:
        pass  # the lock holds without the pid; the refusal then names no pid
    return fd


def _blocking(lines: List[str]) -> str:
    """What still blocks branches, in a few words: the files the error lines name (``b.py:1:
    SyntaxError ...``), else the first line's start."""
    files = list(dict.fromkeys(line.split(":", 1)[0] for line in lines if re.match(r"[^\s:]+\.py:\d+:", line)))
    if files:
        shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        return f"{shown} still {'has an error' if len(files) == 1 else 'have errors'}"
    first = lines[0].removeprefix("scalebox: ")
    return f"still {first[:60]}{'...' if len(first) > 60 else ''}"


def _project_event(project: Project, kind: str, message: str, **extra) -> None:
    """runs/events.jsonl (scalebox_cst.runs): what the monitor shows between runs."""
    from scalebox_cst.runs import append_project_event

    try:
        append_project_event(project.root, kind, message, **extra)
    except OSError:
        pass  # a full disk must not stop the watcher


class _ChangeStat:
    """A file's ``os.stat`` as the polling observer compares it: its "mtime" is the pair (mtime,
    ctime). Watchdog's polling sees a file as modified only where its mtime or size changed, so a
    save of the same size that kept or set back the mtime (``touch -d``, an editor or copy that
    preserves it, a clock set back, a coarse clock) was never seen; the ctime is the kernel's,
    set on every write and on every change of the mtime, and cannot be set back by a program."""

    __slots__ = ("_st",)

    def __init__(self, st: os.stat_result) -> None:
        self._st = st

    def __getattr__(self, name: str):
        return getattr(self._st, name)

    @property
    def st_mtime(self):
        return (self._st.st_mtime_ns, self._st.st_ctime_ns)


def _change_stat(path) -> _ChangeStat:
    return _ChangeStat(os.stat(path))


def _polling_observer() -> PollingObserverVFS:
    return PollingObserverVFS(stat=_change_stat, listdir=os.scandir, polling_interval=0.2)


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: "Watcher") -> None:
        self.watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in _IGNORED_EVENTS:
            return
        if event.is_directory and event.event_type == "modified":
            return  # a folder's entries changed: the files' own events say which
        paths = [event.src_path]
        if event.event_type == "moved":
            paths = [getattr(event, "dest_path", "")]  # the source of a move no longer has content
            if not event.is_directory:
                paths.append(event.src_path)  # deleted under its old name
        for path in paths:
            if isinstance(path, bytes):
                path = os.fsdecode(path)
            if path:
                self.watcher.notify(path, event.is_directory)


class Watcher:
    """Turns file events into change events; optionally keeps one run going from the newest branch."""

    def __init__(
        self,
        project: Project,
        script: Optional[str] = None,
        args: Sequence[str] = (),
        debounce: float = 0.03,
        polling: bool = False,
        echo: Callable[[str], None] = print,
        run_output=None,
        grace: float = 3.0,
    ) -> None:
        if not (isinstance(debounce, (int, float)) and math.isfinite(debounce) and 0 <= debounce <= MAX_DEBOUNCE):
            raise ValueError(f"debounce must be a number of seconds from 0 to {MAX_DEBOUNCE:g}, got {debounce!r}")
        self.project = project
        self.script = script
        self.args = list(args)
        self.debounce = debounce
        self.echo = echo
        self.run_output = run_output
        self.grace = grace
        self.polling = polling
        self.events: "queue.Queue[str]" = queue.Queue()
        self._supervisor = None  # made on the first start (a project without a store yet has no runs)
        self._healer: Optional[WatchHealer] = None
        self.branches: List[str] = []
        self.blocked = 0
        self.started_once = False
        self._last_blocked: List[str] = []
        self._warned: Set[str] = set()
        self._stop = threading.Event()
        self._observer = None
        self._lock_fd: Optional[int] = None
        self._config_text = self._config_files()  # what the config said when the project loaded it

    @property
    def supervisor(self):
        """The :class:`~scalebox_cst.runner.supervisor.RunSupervisor` of the watched runs."""
        if self._supervisor is None:
            from scalebox_cst.runner.supervisor import RunSupervisor

            self._supervisor = RunSupervisor.for_project(self.project, echo=self.run_output, grace=self.grace)
        return self._supervisor

    @property
    def execution(self):
        """The run the watcher keeps going (None between runs)."""
        return self._supervisor.current if self._supervisor is not None else None

    # -------------------------------------------------------------- events
    def relevant(self, path: str, is_directory: bool = False) -> bool:
        # A string slice, not realpath(): the store writes many files under .scalebox/ while a
        # change is being committed, and their events must not compete with it for the GIL.
        root = self.project.root + os.sep
        if path.startswith(root):
            rel = path[len(root):].replace(os.sep, "/")
        else:
            try:
                rel = self.project.relpath(path)
            except ValueError:
                return False
        if rel.startswith("..") or rel == ".":
            return False
        if rel in _CONFIG_FILES:
            return True  # a config edit is a change of its own: the next branch uses it
        if is_directory:
            # A folder moved, created or deleted: its files may have changed.
            parts = rel.split("/")
            return not any(self.project.config.excludes_dir("/".join(parts[: i + 1])) for i in range(len(parts)))
        return self.project.config.includes(rel)

    def notify(self, path: str, is_directory: bool = False) -> None:
        if self.relevant(path, is_directory):
            self.events.put(path)

    def _get(self, timeout: float) -> Optional[str]:
        """One event within ``timeout`` seconds, else None; waited in slices, so that a stop
        (SIGTERM, SIGHUP) is seen within ``_STOP_CHECK`` seconds whatever the debounce."""
        deadline = time.monotonic() + timeout
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                return self.events.get(timeout=min(left, _STOP_CHECK))
            except queue.Empty:
                pass
        return None

    def _next_batch(self, timeout: float) -> Set[str]:
        """Wait for one event, then gather until ``debounce`` seconds pass with no new event.
        Empty when the watcher was stopped meanwhile: a batch cut short is not committed."""
        first = self._get(timeout)
        if first is None:
            return set()
        batch = {first}
        while True:
            event = self._get(self.debounce)
            if event is None:
                return set() if self._stop.is_set() else batch
            batch.add(event)

    # -------------------------------------------------------------- change handling
    def _config_files(self) -> List[Optional[bytes]]:
        """The bytes of each file a config is read from (None where it is absent or unreadable)."""
        from scalebox_cst.config import MAX_CONFIG_BYTES
        from scalebox_cst.intake import NotRead, read_regular

        out: List[Optional[bytes]] = []
        for name in _CONFIG_FILES:
            path = os.path.join(self.project.root, name)
            try:  # a config replaced by a FIFO must not block the watcher (Config.load says why)
                out.append(read_regular(path, limit=MAX_CONFIG_BYTES, follow=True))
            except NotRead as exc:
                out.append(None if not os.path.lexists(path) else f"\0not read: {exc}".encode())
        return out

    def reload_config(self) -> None:
        """Read the config again where its file changed since it was read: later branches are
        rewritten with it (its fingerprint is part of what makes a branch). A config that does
        not load is one line, and the last good one stays in use until the file is fixed."""
        text = self._config_files()
        if text == self._config_text:
            return
        self._config_text = text
        from scalebox_cst.config import Config, ConfigError

        try:
            config = Config.load(self.project.root)
        except (ConfigError, OSError, ValueError) as exc:
            self.echo(f"scalebox: {' '.join(str(exc).split())}; the config loaded before stays in use")
            return
        self.project.reload(config)
        try:
            self.project.pipeline.progress = self.echo
        except Exception as exc:  # an unknown transform id, a backend this machine lacks
            self.echo(f"scalebox: {' '.join(str(exc).split())}; saves are not committed until the config is fixed")
            return
        self.echo(f"scalebox: {config.source or 'config'} changed: the next branches use it (backend {self.project.backend})")

    def handle_change(self, force: bool = False) -> ChangeResult:
        """One change event. Nothing the store, the file system or a file can do stops the
        watcher: an error is one line (said once while it lasts) and no branch is made."""
        self.reload_config()
        if self.project.store_gone():
            self.echo(f"scalebox: the store {os.path.join(STATE_DIR, 'store.git')} was deleted while watching: a new one "
                      "is made for this change (the branches and runs the old one held are gone with it)")
        try:
            result = self.project.commit_change(block_on_bad_input=True, force=force, message="save")
        except Exception as exc:  # StoreError, ConfigError, OSError, ...; the next save retries
            result = ChangeResult(RunReport(None, None, None, "", []), False, [_one_line(exc)])
        for line in getattr(self.project, "skipped", ()):
            if line not in self._warned:
                self._warned.add(line)
                self.echo(f"scalebox: warning: {line}")
        if result.blocked:
            if result.blocked != self._last_blocked:  # say it once per distinct error
                self.blocked += 1
                _project_event(self.project, "save_blocked", result.blocked[0], errors=result.blocked)
                for line in result.blocked:
                    self.echo(line)
                if self.execution is not None:
                    self.echo("scalebox: previous run keeps going")
            else:  # another save while the same errors last: one short line, not silence
                self.echo(f"scalebox: no branch for this save: {_blocking(result.blocked)} (said above)")
            self._last_blocked = result.blocked
            return result
        self._last_blocked = []
        for f in result.report.files:
            if f.status == "error":
                self.echo(f.error or f"{f.path}: error")
        if result.created:
            self.branches.append(result.branch)
            _project_event(self.project, "branch_created", f"{result.branch}: {result.report.summary()}", branch=result.branch, commit=result.report.commit)
            self.echo(f"scalebox: {result.branch} {result.report.commit[:10]}: {result.report.summary()}")
            self.start_run(result.branch, result.report.commit)
        elif self.execution is None and self.script and not self.started_once:
            self.start_run(result.branch, result.report.commit)
        return result

    def start_run(self, branch: str, commit: str) -> None:
        if not self.script:
            return
        self.stop_run(f"a save restarted it from {branch}")
        from scalebox_cst.runner.supervisor import RunSpec

        self.echo(f"scalebox: running {self.script} from {branch}")
        self.started_once = True
        try:
            spec = RunSpec(branch, commit, self.script, tuple(self.args), source_commit=self.project.store.resolve(branch).source_commit)
            self.supervisor.start(spec)
        except Exception as exc:  # the run could not start (store, disk): the next save retries
            self.echo(_one_line(exc, f"{self.script} not started from {branch}"))

    def stop_run(self, reason: str = "scalebox-watch stopped") -> None:
        if self.execution is not None:
            record = self.supervisor.stop(self.execution, reason=reason)
            self.echo(f"scalebox: {record.id} {record.status} after {record.wall_time:.1f}s"
                      + (f": {record.stop_reason}" if record.stop_reason else ""))

    # -------------------------------------------------------------- lifecycle
    def start(self) -> "Watcher":
        """Begin observing, then commit the current state (and start the run).

        In that order: a save made while the initial snapshot is taken is an event the next
        batch handles (the observer's watches are in place once ``start`` returns); observing
        after the snapshot would miss it until the next save. A second watcher of the same
        project raises :class:`AlreadyWatched` before it observes anything."""
        self.claim()
        try:
            self.project.pipeline.progress = self.echo  # a rewrite of several seconds says so
        except Exception:
            pass  # a bad config: handle_change says what is wrong
        observer = _polling_observer() if self.polling else Observer()
        observer.schedule(_Handler(self), self.project.root, recursive=True)
        threads.start(observer)  # its threads leave SIGTERM/SIGINT to the main thread
        self._observer = observer
        self.handle_change()
        return self

    def claim(self) -> "Watcher":
        """Become the project's one watcher (:func:`_watch_lock`) or raise :class:`AlreadyWatched`;
        :meth:`close` lets go."""
        if fcntl is not None and self._lock_fd is None:
            self._lock_fd = _watch_lock(self.project)
        return self

    def reap_run(self) -> None:
        """Finish the record of a run that ended by itself (the next save starts a new one)."""
        if self.script and self.execution is not None:  # an unstable run becomes a hot-fix (scalebox_cst.hotfix)
            self._heal()
        if self.execution is not None and self.execution.poll() is not None:
            record = self.supervisor.reap(self.execution)
            self.echo(f"scalebox: {headlines.end_line(record)}")

    def _heal(self) -> None:
        """The hot-fix policy on the run (one healer per watcher); it never stops the watcher."""
        try:
            if self._healer is None:
                from scalebox_cst.hotfix import WatchHealer

                self._healer = WatchHealer(self.project, self.supervisor, self.script, self.args, self.echo)
            self._healer.check()
        except Exception as exc:
            self.echo(f"scalebox: hot-fix check failed: {type(exc).__name__}: {exc}")

    def process_pending(self, timeout: float = 0.5) -> Optional[ChangeResult]:
        self.reap_run()
        batch = self._next_batch(timeout)
        if not batch or self._stop.is_set():
            return None
        return self.handle_change()

    def run_forever(self) -> None:
        """Process batches until :meth:`stop`; the caller closes (Ctrl-C propagates to it)."""
        while not self._stop.is_set():
            self.process_pending(timeout=0.5)

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
        self.stop_run()
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # releases the watch lock

    def summary(self) -> str:
        made = ", ".join(self.branches) if self.branches else "none"
        text = f"scalebox: watched {self.project.root}; branches made: {made}"
        if self.blocked:
            text += f"; {self.blocked} save(s) blocked by errors"
        return text


def _one_line(exc: BaseException, outcome: str = "this change was not committed") -> str:
    """One line for an error that stopped a change event (a traceback would only say where)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    kind = "" if type(exc).__name__ in ("StoreError", "ConfigError") else f"{type(exc).__name__}: "
    return f"scalebox: {kind}{text}; {outcome}, still watching"
