"""Run metrics: rewritten code and telemetry record values here; the executor keeps them per run.

``record(name, value, step=None)`` is cheap on accelerators: tensor values are kept as tensors and
turned into numbers in batches (one device-to-host transfer per device per flush, never one per
step). Points go to the JSON-lines file named by ``$SCALEBOX_METRICS_FILE`` (one
``{"name", "step", "value", "time"}`` object per line, appended whole, so another process can
read the file while it grows), else they stay in the in-memory summary only.

A flush happens every :data:`FLUSH_EVERY` points, or, once telemetry runs, on its thread about
every two seconds (readers see a live run; the training thread then never waits for a device
transfer), and at exit. The conversion runs outside the lock ``record`` takes, so a flush on
another thread never makes the training thread wait for the device. Non-finite values are written as the strings "nan"/"inf"/"-inf" and announced once
per metric (stderr and a ``nonfinite`` event in the run's events.jsonl).
"""
from __future__ import annotations

import atexit
import json
import math
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from scalebox_cst import statedir, tmpnames  # a run folder's files: never written through a link

ENV_FILE = "SCALEBOX_METRICS_FILE"
#: namespace of every series the engine itself observes or computes (telemetry, guard, clip):
#: they never share a series with a script's own tag of the same name (a SummaryWriter
#: ``grad_norm``, a printed ``episodic_return=``), whose names are the script's
ENGINE = "scalebox/"
#: a child process of the run (a multiprocessing worker) records under ENGINE + WORKERS + id + "/"
WORKERS = "workers/"
#: events of the run; default: events.jsonl beside the metrics file (docs/runs.md)
ENV_EVENTS = "SCALEBOX_EVENTS_FILE"
FLUSH_EVERY = 64
#: a child process of the run (no telemetry thread) flushes points at most this old
CHILD_FLUSH_S = 2.0
#: with a background flusher (telemetry's thread), the recording thread flushes only this late
BACKGROUND_CAP = 100_000

_lock = threading.Lock()  # guards _pending and _steps (held for an append only)
_write_lock = threading.Lock()  # orders flushes: conversion, summary and file writes
_pending: List[Tuple[str, Any, int, float]] = []
_steps: Dict[str, int] = {}
_after_flush: List[Callable[[], None]] = []
_flush_at = FLUSH_EVERY


class Stats:
    """Running count, last, min, max, mean (of finite values) and non-finite count per metric."""

    def __init__(self) -> None:
        self.data: Dict[str, Dict[str, float]] = {}

    def add(self, name: str, value: float) -> None:
        s = self.data.setdefault(
            name, {"count": 0, "last": math.nan, "min": math.inf, "max": -math.inf, "mean": 0.0, "nonfinite": 0}
        )
        s["count"] += 1
        s["last"] = value
        if math.isfinite(value):
            s["mean"] += (value - s["mean"]) / (s["count"] - s["nonfinite"])
            s["min"], s["max"] = min(s["min"], value), max(s["max"], value)
        else:
            s["nonfinite"] += 1


_summary = Stats()
_prefix: Optional[str] = ENGINE  # None in a child process until its worker id is known
_child = False  # a child process of the run: no telemetry thread flushes for it


def engine(name: str) -> str:
    """The series name for the engine's own metric ``name``: ``scalebox/name`` in the run's
    process, ``scalebox/workers/<id>/name`` in a child of it (its multiprocessing identity,
    ``1``, ``2.1``..., or ``pid<N>`` for a bare fork), so workers never interleave with it."""
    return (_prefix or _worker_prefix()) + name


def user(name: str) -> str:
    """A script's own tag as a series name: kept, unless it would pose as the engine's
    (``scalebox/...`` becomes ``user/scalebox/...``)."""
    return "user/" + name if name.startswith(ENGINE) else name


def _worker_prefix() -> str:
    global _prefix
    ident = None
    process = sys.modules.get("multiprocessing.process")
    if process is not None:
        try:
            ident = ".".join(str(i) for i in process.current_process()._identity) or None
        except Exception:
            ident = None
    _prefix = f"{ENGINE}{WORKERS}{ident or f'pid{os.getpid()}'}/"
    return _prefix


def in_worker() -> None:
    """This process is a child of the run (a spawned or forkserver worker): its engine series are
    its own, and its points are flushed as the worker ends (forkserver workers leave by
    ``os._exit``: no atexit)."""
    global _prefix, _flush_at, _child
    _prefix = None
    _flush_at = FLUSH_EVERY
    _child = True
    _flush_when_worker_ends()


_warned_nonfinite: set = set()


def record(name: str, value: Any, step: Optional[int] = None, rare: bool = False) -> None:
    """Record one value of metric ``name`` (a number or a 0-d tensor) at ``step``.

    ``step`` is the metric's own x (env steps for episode statistics, the user's global_step for
    SummaryWriter scalars); None counts points of ``name`` 0, 1, 2, ...
    ``rare``: a point that comes seldom (an episode's end): a child process writes it at once,
    as nothing else may flush it before the child is ended (see :func:`_forget_in_child`).
    """
    with _lock:
        if step is None:
            step = _steps.get(name, 0)
            _steps[name] = step + 1
        now = time.time()
        _pending.append((name, value, int(step), now))
        full = len(_pending) >= _flush_at or (_child and (rare or now - _pending[0][3] >= CHILD_FLUSH_S))
    if full:
        flush()


def flush() -> None:
    """Write pending points now (the calling thread does the one device transfer per device)."""
    global _pending
    with _write_lock:
        with _lock:
            batch, _pending = _pending, []
        if batch:
            _write(batch)
        for callback in list(_after_flush):
            try:
                callback()
            except Exception as exc:  # telemetry never breaks a training run
                print(f"scalebox: telemetry flush hook failed: {exc!r}", file=sys.stderr)


def background_flush(on: bool) -> None:
    """Another thread flushes regularly (telemetry): ``record`` then leaves the device transfer
    to it and flushes itself only past :data:`BACKGROUND_CAP` pending points."""
    global _flush_at
    _flush_at = BACKGROUND_CAP if on else FLUSH_EVERY


def after_flush(callback: Callable[[], None]) -> None:
    """Call ``callback()`` after each flush (telemetry writes sites.json there)."""
    if callback not in _after_flush:
        _after_flush.append(callback)


def summary() -> Dict[str, Dict[str, float]]:
    """Per metric: count, last, min, max, mean and non-finite count (after a flush)."""
    flush()
    return {k: dict(v) for k, v in _summary.data.items()}


def run_file(name: str) -> Optional[str]:
    """Path of the run's file ``name`` (beside the metrics file), or None outside a recorded run."""
    path = os.environ.get(ENV_FILE)
    return os.path.join(os.path.dirname(path), name) if path else None


def append_event(kind: str, message: str, /, **extra: Any) -> None:
    """One line in the run's events.jsonl (docs/runs.md); nothing outside a recorded run."""
    path = os.environ.get(ENV_EVENTS) or run_file("events.jsonl")
    if not path:
        return
    item = {"time": round(time.time(), 3), "kind": kind, "message": message, **extra}
    try:
        append_text(path, json.dumps(item, default=str) + "\n")
    except OSError as exc:
        print(f"scalebox: cannot write events to {path}: {exc}", file=sys.stderr)


def append_text(path: str, text: str) -> None:
    """Append ``text`` (whole lines) in one write on an O_APPEND descriptor: other writers of the
    same file (the executor, forked children) never split a line."""
    data = text.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | statedir.NOFOLLOW, 0o644)
    try:
        tmpnames.write_all(fd, data)
    finally:
        os.close(fd)


def _to_floats(values: List[Any]) -> List[float]:
    """Numbers for a batch of values; tensors cross to the host once per device, not once each."""
    by_device: Dict[Any, List[int]] = {}
    for i, v in enumerate(values):
        if hasattr(v, "detach"):
            by_device.setdefault(v.device, []).append(i)
    out: List[Any] = list(values)
    if by_device:
        import torch

        for indices in by_device.values():
            stacked = torch.stack([values[i].detach().reshape(()).float() for i in indices])
            for i, number in zip(indices, stacked.cpu().tolist()):
                out[i] = number
    floats = []
    for v in out:
        try:
            floats.append(float(v))
        except (TypeError, ValueError, OverflowError):  # a caller's odd value (10**400 too) costs that point, not the batch
            floats.append(math.nan)
    return floats


def _write(batch: List[Tuple[str, Any, int, float]]) -> None:
    values = _to_floats([v for _, v, _, _ in batch])
    lines = []
    for (name, _, step, stamp), value in zip(batch, values):
        _summary.add(name, value)
        if not math.isfinite(value) and name not in _warned_nonfinite:
            _warned_nonfinite.add(name)
            print(f"scalebox: non-finite {name}={value} at step {step}", file=sys.stderr)
            append_event("nonfinite", f"non-finite {name}={value} at step {step}", name=name, step=step, value=str(value))
        lines.append(json.dumps({"name": name, "step": step, "value": value if math.isfinite(value) else str(value), "time": round(stamp, 3)}))
    path = os.environ.get(ENV_FILE)
    if path:
        try:
            append_text(path, "\n".join(lines) + "\n")
        except OSError as exc:  # metrics must never break a training run
            print(f"scalebox: cannot write metrics to {path}: {exc}", file=sys.stderr)


def _forget_in_child() -> None:
    """A forked child starts with the parent's unflushed points: writing them again would count
    them twice, so it drops them (and keeps its own from then on, under its worker's names: see
    :func:`engine`). No telemetry thread runs there: it flushes every :data:`FLUSH_EVERY` points,
    when its oldest pending point is :data:`CHILD_FLUSH_S` old, at once for a ``rare`` point (an
    episode's end), and as a multiprocessing worker ends (which leaves by ``os._exit``: no
    atexit). A daemon worker nobody closed (BY571's IQN never closes its SubprocVecEnv) is ended
    by SIGTERM as the script exits, with no finalizer: its episodes were lost (64 of 82 recorded,
    the final return the last ones'), as the age rule read ``_prefix`` (set at the first point)
    and never applied. No SIGTERM handler is installed in the user's workers: a Python handler
    runs only when the main thread comes back to Python, so a worker blocked in C would no longer
    end, and multiprocessing's exit joins the workers it terminates (a hang)."""
    global _pending, _lock, _write_lock, _flush_at, _prefix, _child
    _pending = []
    _flush_at = FLUSH_EVERY
    _prefix = None
    _child = True
    _lock = threading.Lock()
    _write_lock = threading.Lock()
    _steps.clear()
    _flush_when_worker_ends()


def _flush_when_worker_ends() -> None:
    util = sys.modules.get("multiprocessing.util")
    if util is not None:  # registered after the fork, before Process._bootstrap clears finalizers
        util.register_after_fork(_ENDS, lambda _: util.Finalize(None, flush, exitpriority=-100))


class _Ends:
    """A weakly referenceable anchor for multiprocessing's after-fork registry."""


_ENDS = _Ends()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(flush)
