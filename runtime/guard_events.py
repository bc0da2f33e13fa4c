"""The gradient guard's events (runtime/stabilizer.py): the run's events.jsonl lines it writes,
and the names of the parameters it reports. Apart from the guard because they are the part of it
that is neither per-step nor numeric: read only on the rare steps that intervene.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Dict, List, Optional

import torch

from scalebox_cst import statedir
from scalebox_cst.runtime import metrics
from scalebox_cst.runtime.grad_norms import stored_values

EVENTS_ENV = "SCALEBOX_EVENTS_FILE"
MAX_EVENTS = 1000  # per kind and run: a run that intervenes every step must not fill the disk


class _Events:
    """Append-only events.jsonl of the run (beside metrics.jsonl unless $SCALEBOX_EVENTS_FILE)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Dict[str, int] = {}
        self.memory: List[Dict[str, Any]] = []  # kept when no file is configured (tests, plain runs)

    def path(self) -> Optional[str]:
        path = os.environ.get(EVENTS_ENV)
        if path:
            return path
        metrics_file = os.environ.get(metrics.ENV_FILE)
        return os.path.join(os.path.dirname(metrics_file), "events.jsonl") if metrics_file else None

    def emit(self, kind: str, message: str, **extra: Any) -> None:
        with self.lock:
            n = self.counts.get(kind, 0) + 1
            self.counts[kind] = n
            if n > MAX_EVENTS:
                return
            item = {"time": round(time.time(), 3), "kind": kind, "message": message, **extra}
            path = self.path()
            if path is None:
                self.memory.append(item)
                return
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | statedir.NOFOLLOW, 0o644)
                with os.fdopen(fd, "a", encoding="utf-8") as fh:  # never through a link
                    fh.write(json.dumps(item, default=str) + "\n")
            except OSError as exc:  # telemetry never breaks a training run
                print(f"scalebox: cannot write events to {path}: {exc}", file=sys.stderr)


events = _Events()


def live_modules() -> List[torch.nn.Module]:
    """Every live ``nn.Module``, by its type only: ``isinstance`` falls back to an object's
    ``__class__``, which a dead ``weakref.proxy`` answers with ReferenceError (torch.compile's
    dynamo leaves such proxies about) and a lazy module proxy with an import: the first
    non-finite gradient's report then crashed the training run it was to keep going."""
    import gc

    return [m for m in gc.get_objects() if issubclass(type(m), torch.nn.Module)]


def parameter_names(params: List[torch.Tensor]) -> List[str]:
    """``actor.fc1.weight``-style names for parameters, found among live modules (rare path only)."""
    wanted = {id(p): i for i, p in enumerate(params)}
    names: List[Optional[str]] = [None] * len(params)
    modules = live_modules()
    children = {id(c) for m in modules for c in m.children()}
    for root in modules:
        if id(root) in children:
            continue
        for name, p in root.named_parameters(remove_duplicate=False):
            i = wanted.get(id(p))
            if i is not None and names[i] is None:
                names[i] = f"{type(root).__name__}.{name}"
    return [n or f"param[{tuple(p.shape)}]" for n, p in zip(names, params)]


def report_nonfinite(guard: Any, step: int, value: float, params: List[torch.Tensor]) -> None:
    """The first non-finite gradient of ``guard``'s optimizer: one stderr line and a ``nonfinite``
    event naming the parameters whose gradients hold it (once per guard)."""
    if guard.reported_nonfinite:
        return
    guard.reported_nonfinite = True
    bad = [i for i, p in enumerate(params) if p.grad is not None and not bool(torch.isfinite(stored_values(p.grad)).all())]
    names = parameter_names([params[i] for i in bad])
    where = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    msg = f"first non-finite gradient at {guard.site} step {step}: {where or 'norm overflow'}"
    print(f"scalebox: {msg}", file=sys.stderr)
    events.emit("nonfinite", msg, site=guard.site, step=step, value=str(value), what="grad", params=names)
