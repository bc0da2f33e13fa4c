"""Run a committed tree in a subprocess and keep its record: one run = (branch, run number).

The child is ``runtime.launch``, which serves the script and project modules from the commit
(the rewrite, or with ``variant="original"`` the source snapshot itself). Each run gets a new
folder ``runs/<branch>/<NNNN>/`` (never reused, never overwritten; layout in scalebox_cst.runs):
``record.json`` (rewritten atomically at start and end), ``log.txt`` and ``stderr.txt`` (the
child's stdout and stderr, each also echoed to the same stream here, as written: see
runtime.output), ``metrics.jsonl`` (the child's telemetry, plus the numeric ``key=value`` tokens
of its output, appended here as they arrive) and ``events.jsonl``. A thread tails
``metrics.jsonl`` into TensorBoard event files (scalebox_cst.tbevents) under
``.scalebox/tensorboard/``. A failed write to the run folder (a full disk) stops the recording
with one line; the run goes on and its record still ends.

The child has its own process group. ``stop()`` sends SIGINT to the group, then SIGTERM after a
grace period, then SIGKILL; when the child ends, whatever is left of the run is ended too: its
group (workers) and the processes that left it (runtime.lifeline). The child stops the run
itself if this process dies without stopping it, from its first instruction on.
"""
from __future__ import annotations

import collections
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any, Callable, Dict, List, Optional

from scalebox_cst import calibration, contention, fallbacks, runs
from scalebox_cst import limits as run_limits
from scalebox_cst.runner.record import RunRecord, clipped, error_tail, summarize
from scalebox_cst.runtime import keyvalue, lifeline, threads
from scalebox_cst.runtime.output import Console, Recorder, StreamPump
from scalebox_cst.runtime.launch import ENV_INFO, ENV_SEED
from scalebox_cst.runtime.metrics import ENV_FILE  # where the child's telemetry appends
from scalebox_cst.runtime.metrics import user as user_name

ENV_RUN_DIR = lifeline.ENV_RUN_DIR

#: key=value tokens that are the x of the others on their line, not metrics of their own
STEP_KEYS = keyvalue.STEP_KEYS
#: seconds without any output or metric after which the run says it is still alive
QUIET_NOTICES = (10.0, 30.0, 60.0, 120.0, 300.0)


def parse_metric_line(line: str) -> Dict[str, float]:
    """The numeric key=value tokens of a line of output (grammar: runtime.keyvalue), else {}."""
    return keyvalue.parse_line(line)


class _TensorBoard:
    """Tails metrics.jsonl into TensorBoard event files (scalebox_cst.tbevents: no tensorboardX,
    whose import costs the host torch's; a folder that cannot be made: nothing, said once).
    Writes are synchronous: a full disk raises OSError from :meth:`pump`, which the executor
    says in one line (nothing waits on a writer thread)."""

    warned = False

    def __init__(self, logdir: str, echo: Callable[[str], None]) -> None:
        from scalebox_cst.tbevents import ScalarWriter

        self.offset = 0
        self.writer = None
        try:
            self.writer = ScalarWriter(logdir)
        except OSError as exc:
            if not _TensorBoard.warned:
                _TensorBoard.warned = True
                echo(f"scalebox: no TensorBoard event files: cannot write {logdir} ({exc.strerror or exc})")

    def pump(self, path: str) -> int:
        points, self.offset = runs.read_metrics(path, self.offset)
        if self.writer is not None:
            try:
                self.writer.add((p.name, p.value, p.step, p.time or None) for p in points)
            except OSError:
                self.close()  # a full disk: no more writes (the caller says it once)
                raise
        return len(points)

    def close(self) -> None:
        writer, self.writer = self.writer, None
        if writer is not None:
            try:
                writer.close()
            except OSError:  # what a full disk kept in the buffer: lost with the recording
                pass


class RunStartError(OSError):
    """A run could not start (its folder or first record not written, its child not started):
    one line naming what failed and where; nothing of the run is left behind."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "the run could not start"


def _why(exc: BaseException, where: str) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename or where}: {exc.strerror}"
    if isinstance(exc, subprocess.SubprocessError):  # e.g. a limit the kernel refused in the child
        return f"the child process could not be started ({' '.join(str(exc).split())})"
    return " ".join(str(exc).split()) or type(exc).__name__


class Execution:
    """One subprocess running SCRIPT from a commit as a new run of BRANCH; ``stop()`` and
    ``wait()`` finish its record. ``runs_root`` is ``<project>/.scalebox/runs``. The child's
    stdout is echoed to ``echo``, its stderr to ``echo_err`` (default: ``sys.stderr`` when
    ``echo`` is ``sys.stdout``, else ``echo`` itself)."""

    def __init__(
        self,
        store_path: str,
        project_dir: str,
        runs_root: str,
        branch: str,
        commit: str,
        script: str,
        args: List[str],
        echo: Optional[IO[str]] = None,
        python: str = sys.executable,
        env: Optional[Dict[str, str]] = None,
        *,
        source_commit: Optional[str] = None,
        variant: str = "rewrite",
        seed: Optional[int] = None,
        seed_via: Optional[str] = None,
        hotfix_of: Optional[str] = None,
        stale: Optional[List[str]] = None,
        label_output: bool = False,
        notice: Optional[Callable[[str], None]] = None,
        tensorboard: bool = True,
        echo_err: Optional[IO[str]] = None,
        tags: Optional[Dict[str, Any]] = None,
    ) -> None:
        self.project_dir = os.path.realpath(project_dir)
        self.store_path = store_path
        self.limits = run_limits.plan(self.project_dir, os.environ if env is None else env, run_limits.cgroup_name())
        parent = os.path.join(runs_root, *branch.split("/"))
        try:
            self.run, self.dir = runs.allocate_in(parent)
        except OSError as exc:  # a full disk, a read-only project, a file where a folder goes
            self.limits.close()
            raise RunStartError(f"cannot start a run of {branch}: its folder cannot be made ({_why(exc, parent)})") from None
        try:
            self._start(store_path, project_dir, branch, commit, script, args, echo, python, env, source_commit, variant,
                        seed, seed_via, hotfix_of, stale, label_output, notice, tensorboard, echo_err, tags)
        except BaseException as exc:
            self._undo_start()
            if isinstance(exc, (OSError, subprocess.SubprocessError)):
                step, where = getattr(self, "_step", ("preparing it", self.dir))
                raise RunStartError(f"cannot start {branch}#{self.run}: {step} failed ({_why(exc, where)}); nothing kept") from None
            raise

    def _undo_start(self) -> None:
        """A run that could not start leaves nothing: its child ended, its folder removed."""
        proc = getattr(self, "proc", None)
        if proc is not None:  # started, but its first record could not be written
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
        recorder = getattr(self, "recorder", None)
        if recorder is not None:
            recorder.close()
        self.limits.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _start(self, store_path, project_dir, branch, commit, script, args, echo, python, env, source_commit, variant,
               seed, seed_via, hotfix_of, stale, label_output, notice, tensorboard, echo_err, tags) -> None:
        self.metrics_file = os.path.join(self.dir, runs.METRICS)
        self.events_file = os.path.join(self.dir, runs.EVENTS)
        self.echo = echo
        self.prefix = f"[{branch}#{self.run}] " if label_output else ""
        self.notice = notice or (lambda text: print(text, file=sys.stderr, flush=True))
        if echo_err is None:  # the child's stderr: to this process's stderr beside its stdout, else with it
            echo_err = sys.stderr if echo is not None and echo in (sys.stdout, sys.__stdout__) else echo
        self._consoles = (Console(echo, self.prefix), Console(echo_err, self.prefix))
        self.record = RunRecord(
            branch, commit, script, list(args), started=time.time(), run=self.run, source_commit=source_commit,
            variant=variant, seed=seed, seed_via=seed_via, hotfix_of=hotfix_of, stale=stale, tags=dict(tags or {}),
        )
        self._lock = threading.Lock()
        self._tail_lock = threading.Lock()
        self._finished = False
        self._stop_reason: Optional[str] = None
        self._tail: "collections.deque[List[Any]]" = collections.deque(maxlen=400)  # [stream, line, ended by \r]
        self._counters: Dict[str, int] = {}
        self._last_activity = time.time()
        self._load = contention.LoadSampler()  # sampled by the tailer thread, once a second
        child_env = dict(os.environ if env is None else env)
        child_env[ENV_FILE] = self.metrics_file
        child_env[ENV_RUN_DIR] = self.dir
        child_env[ENV_INFO] = json.dumps(
            {"branch": branch, "run": self.run, "variant": variant, "commit": commit, "source_commit": source_commit, "seed": seed}
        )
        child_env.pop(ENV_SEED, None)
        if seed is not None and seed_via in ("env", "option"):
            # with --seed N appended too: what the script seeds itself it seeds again after this;
            # what it leaves to the OS (numpy's global shuffle, an eval env's reset()) follows N
            child_env[ENV_SEED] = str(seed)
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        child_env[lifeline.ENV_PARENT] = str(os.getpid())
        child_env.update(self.limits.env)
        cmd = self.limits.prefix + self._command(python, store_path, commit, project_dir, script, list(args))
        self.record.limits = self.limits.enforced or None
        if self.limits.note():
            self.notice(f"scalebox: {branch}#{self.run}: {self.limits.note()}")
        self._step = ("opening its output files", self.dir)
        self.recorder = Recorder(self.dir, f"{branch}#{self.run}", self.notice)
        for name in (runs.LOG, runs.STDERR):
            self.recorder.open(name)
        self._step = (f"starting its process (under {self.limits.note()})" if self.limits.note() else "starting its process", python)
        self.proc = subprocess.Popen(
            cmd,
            cwd=project_dir,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,  # its own process group: we decide when it stops
            preexec_fn=self.limits.preexec(lifeline.preexec_for(os.getpid())),  # dies with this process, even in its start-up
        )
        self.limits.started(self.proc.pid)
        self.record.pid = self.record.pgid = self.proc.pid
        self.record.pid_start = runs.process_start(self.proc.pid)
        self._step = ("writing its record", os.path.join(self.dir, runs.RECORD))
        self._write_record()
        self._step = ("writing its events", self.events_file)
        runs.append_event(self.events_file, "started", f"{self.record.id} {variant} {script} {' '.join(args)}".rstrip(), pid=self.proc.pid)
        tb_dir = runs.tensorboard_dir(self.project_dir, branch, self.run, commit, variant)
        self._tb = _TensorBoard(tb_dir, self.notice) if tensorboard else None
        self._done = threading.Event()
        self._readers = [
            threads.start_daemon(self._pump, f"scalebox-{name}-{branch}#{self.run}", (index, stream, name))
            for index, (stream, name) in enumerate(((self.proc.stdout, runs.LOG), (self.proc.stderr, runs.STDERR)))
        ]
        self._tailer = threads.start_daemon(self._tail_metrics, f"scalebox-tail-{branch}#{self.run}")

    # ------------------------------------------------------------------ output and metrics
    def _pump(self, index: int, stream: IO[bytes], name: str) -> None:
        """One of the child's streams (0 stdout, 1 stderr) to its console and file, its logical
        lines to the metrics and the error tail (runtime.output)."""

        def activity() -> None:
            self._last_activity = time.time()

        def line(text: str, cr: bool) -> None:
            kept = clipped(text)  # the tail holds 400 lines: each as error_tail would keep it
            with self._tail_lock:
                last = self._tail[-1] if self._tail else None
                if last is not None and last[0] == index and last[2]:
                    self._tail[-1] = [index, kept, cr]  # a redrawn progress bar keeps one line
                else:
                    self._tail.append([index, kept, cr])
            self._line_metrics(text)

        try:
            StreamPump(stream.fileno(), self._consoles[index], self.recorder, name, line, activity).run()
        finally:
            stream.close()

    def _command(self, python: str, store_path: str, commit: str, project_dir: str, script: str, args: List[str]) -> List[str]:
        """The child's command line (runner.torchrun puts torchrun in front of its workers)."""
        return [python, "-m", "scalebox_cst.runtime.launch", store_path, commit, project_dir, script, *args]

    def _line_metrics(self, line: str) -> None:
        """The numeric key=value tokens of a line of output become metrics (torchrun: by rank)."""
        values = parse_metric_line(line)
        if values:
            self._append_key_values(values)

    def _append_key_values(self, values: Dict[str, float], path: Optional[str] = None, counters: Optional[Dict[str, int]] = None) -> None:
        """Numeric key=value tokens become metrics; a step/global_step/frame token (or a leading
        integer) is their x."""
        counters = self._counters if counters is None else counters
        x = next((values[k] for k in STEP_KEYS if k in values and math.isfinite(values[k])), None)
        now = round(time.time(), 3)
        lines = []
        for name, value in values.items():
            if name in STEP_KEYS:
                continue
            name = user_name(name)  # the script's names, never posing as the engine's scalebox/...
            count = counters.get(name, 0)
            counters[name] = count + 1
            step = int(x) if x is not None else count
            lines.append(json.dumps({"name": name, "step": step, "value": value if math.isfinite(value) else str(value), "time": now}))
        if lines:  # one write: whole lines beside the child's own appends
            self.recorder.append(path or self.metrics_file, ("\n".join(lines) + "\n").encode("utf-8"))

    def _tail_metrics(self) -> None:
        """TensorBoard from metrics.jsonl, and a word when a run is silent for long. After the
        run's end (``_done``) one last pump and the close, here: a stuck writer holds only this
        thread, never the record."""
        notices = list(QUIET_NOTICES)
        seen_metrics = False
        while not self._done.wait(1.0):
            self._load.sample()
            self.limits.poll()
            if self._pump_tensorboard():
                seen_metrics = True
                self._last_activity = time.time()
            quiet = time.time() - self._last_activity
            if notices and quiet >= notices[0]:
                while notices and quiet >= notices[0]:
                    notices.pop(0)
                what = "no new output or metrics" if seen_metrics or self._tail else "no output or metrics yet"
                self.notice(f"scalebox: {self.record.id} still running ({time.time() - self.record.started:.0f}s, {what} for {quiet:.0f}s)")
            elif quiet < 1.0:
                notices = [t for t in QUIET_NOTICES]
        self._pump_tensorboard()
        if self._tb is not None:
            try:
                self._tb.close()
            except OSError as exc:
                self.recorder.fail("TensorBoard", exc)

    def _pump_tensorboard(self) -> int:
        if self._tb is None or not self.recorder.ok:
            return 0
        try:
            return self._tb.pump(self.metrics_file)
        except OSError as exc:
            self.recorder.fail("TensorBoard", exc)
            return 0

    # ------------------------------------------------------------------ lifecycle
    def poll(self) -> Optional[int]:
        return self.proc.poll()

    def stop(self, grace: float = 3.0, reason: str = "stopped") -> RunRecord:
        """SIGINT to the process group, then SIGTERM, then SIGKILL; returns the finished record.

        Every stop is recorded alike: status ``stopped``, ``stop_reason``, ``stop_signals`` (what
        was sent); ``signal``/``exit_status`` say how the child ended. Before the first signal a
        ``stopping`` event with the reason goes to events.jsonl, where the child's KeyboardInterrupt
        handler reads why it is being stopped (runtime.loader)."""
        if self.proc.poll() is None:
            if self._stop_reason is None:
                self._stop_reason = reason
                if self.recorder.ok:
                    try:
                        runs.append_event(self.events_file, "stopping", reason)
                    except OSError as exc:
                        self.recorder.fail(runs.EVENTS, exc)
            for sig, wait_for in ((signal.SIGINT, grace), (signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                self.record.stop_signals = [*(self.record.stop_signals or []), sig.name]
                try:
                    self.proc.wait(timeout=wait_for)
                    break
                except subprocess.TimeoutExpired:
                    continue
        return self.wait()

    def _end_group(self) -> None:
        """Workers the child left in its process group (its own pid is the group id) end with it."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                return
            deadline = time.time() + 2.0
            while time.time() < deadline:
                try:
                    os.killpg(self.proc.pid, 0)
                except (ProcessLookupError, PermissionError):
                    return
                time.sleep(0.05)

    def wait(self, timeout: Optional[float] = None) -> RunRecord:
        if timeout is None:  # in slices: a signal another thread took still runs its handler soon (runtime.threads)
            while True:
                try:
                    status = self.proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    continue
        else:
            status = self.proc.wait(timeout=timeout)
        with self._lock:  # a signal raised in here leaves _finished False: the next call redoes it
            if not self._finished:
                self._finish(status)
                self._finished = True
        return self.record

    def _finish(self, status: int) -> None:
        self._end_group()
        escaped = lifeline.end_run_processes(self.dir)
        for reader in self._readers:
            reader.join(timeout=5.0)
        self._done.set()
        self._tailer.join(timeout=10.0)
        if self._tailer.is_alive():
            self.recorder.fail("TensorBoard", OSError("its event writer did not finish in 10s"))
        rec = self.record
        rec.exit_status = status
        rec.ended = time.time()
        rec.wall_time = round(rec.ended - rec.started, 3)
        if status < 0:
            try:
                rec.signal = signal.Signals(-status).name
            except ValueError:
                rec.signal = str(-status)
        if self._stop_reason is not None:
            rec.status, rec.stop_reason = "stopped", self._stop_reason
        else:
            rec.status = "ok" if status == 0 else "failed"
            with self._tail_lock:
                rec.stop_reason = self.limits.cause(status, [line for stream, line, _ in self._tail if stream == 1])
        self.limits.close()
        if rec.status == "failed":
            with self._tail_lock:
                rec.error_tail = error_tail([line for _, line, _ in self._tail],
                                            errors=[line for stream, line, _ in self._tail if stream == 1])
        rec.load = self._load.summary()
        series, damage = runs.read_series_counted(self.dir)  # the child is gone: a cut last line is damage
        rec.metrics = summarize(series)
        rec.headline = runs.headline(rec.to_json(), series, runs.read_sites(self.dir), damage)
        rec.profile = _profile(self.dir, rec.to_json(), self.store_path)
        rec.fallbacks = fallbacks.read(self.dir)
        rec.precision = calibration.read(self.dir)
        fallbacks.mark_profile(rec.profile, rec.fallbacks)
        rec.recording_error = self.recorder.error
        self.recorder.close()
        kind = {"ok": "ended", "failed": "failed", "stopped": "stopped"}[rec.status]
        if rec.status == "stopped":  # the same words however the child ended (exit_status, signal: in the extras)
            message = f"{rec.id} stopped after {rec.wall_time:.1f}s: {rec.stop_reason}"
        else:
            message = f"{rec.id} {rec.status} after {rec.wall_time:.1f}s (exit {status}{', ' + rec.signal if rec.signal else ''})"
            message += f": {rec.stop_reason}" if rec.stop_reason else ""
        try:  # on a full disk this may fail too: the record then reads "lost" (its process is gone)
            if escaped:
                runs.append_event(self.events_file, "escaped", f"{rec.id}: ended {len(escaped)} process(es) that had left its process group", pids=escaped)
            self._write_record()
            runs.append_event(self.events_file, kind, message, exit_status=status, signal=rec.signal, reason=rec.stop_reason)
        except OSError as exc:
            self.notice(f"scalebox: {rec.id}: record not written ({exc}); it reads as lost")

    def _write_record(self) -> None:
        runs.write_record(self.dir, self.record.to_json())


def _profile(directory: str, record: Dict[str, Any], store_path: str) -> Optional[Dict[str, Any]]:
    """The run's profile for record.json; a failure costs the profile, never the record."""
    from scalebox_cst import profile

    try:
        return profile.build(directory, record, store_path)
    except Exception as exc:
        print(f"scalebox: cannot read the profile of {directory}: {exc!r}", file=sys.stderr)
        return None
