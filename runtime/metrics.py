"""Run metrics: rewritten code records values here; the executor keeps them per branch.

``record(name, value)`` is cheap on accelerators: tensor values are kept as tensors and turned
into numbers in batches (one device sync per flush, not per step). Values go to the JSON-lines
file named by ``$SCALEBOX_METRICS_FILE`` when the executor set it, else they stay in memory.
"""
from __future__ import annotations

import atexit
import json
import math
import os
import sys
import threading
import time
from typing import Any, Dict, List, Tuple

ENV_FILE = "SCALEBOX_METRICS_FILE"
FLUSH_EVERY = 64

_lock = threading.Lock()
_pending: List[Tuple[str, Any, int, float]] = []
_steps: Dict[str, int] = {}


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
_warned_nonfinite: set = set()


def record(name: str, value: Any) -> None:
    """Record one value of metric ``name`` (a number or a 0-d tensor)."""
    with _lock:
        step = _steps.get(name, 0)
        _steps[name] = step + 1
        _pending.append((name, value, step, time.time()))
        if len(_pending) >= FLUSH_EVERY:
            _flush_locked()


def flush() -> None:
    with _lock:
        _flush_locked()


def summary() -> Dict[str, Dict[str, float]]:
    """Per metric: count, last, min, max, mean and non-finite count (after a flush)."""
    flush()
    return {k: dict(v) for k, v in _summary.data.items()}


def _to_floats(values: List[Any]) -> List[float]:
    """Numbers for a batch of values; tensors cross to the host once per device, not once each."""
    by_device: Dict[Any, List[int]] = {}
    for i, v in enumerate(values):
        if hasattr(v, "detach"):
            by_device.setdefault(v.device, []).append(i)
    if not by_device:
        return [float(v) for v in values]
    import torch

    out: List[Any] = list(values)
    for indices in by_device.values():
        stacked = torch.stack([values[i].detach().reshape(()).float() for i in indices])
        for i, number in zip(indices, stacked.cpu().tolist()):
            out[i] = number
    return [float(v) for v in out]


def _flush_locked() -> None:
    global _pending
    if not _pending:
        return
    batch, _pending = _pending, []
    values = _to_floats([v for _, v, _, _ in batch])
    lines = []
    for (name, _, step, stamp), value in zip(batch, values):
        _summary.add(name, value)
        if not math.isfinite(value):
            if name not in _warned_nonfinite:
                _warned_nonfinite.add(name)
                print(f"scalebox: non-finite {name}={value} at step {step}", file=sys.stderr)
        lines.append(json.dumps({"name": name, "step": step, "value": value if math.isfinite(value) else str(value), "time": round(stamp, 3)}))
    path = os.environ.get(ENV_FILE)
    if path:
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write("\n".join(lines) + "\n")
        except OSError as exc:  # metrics must never break a training run
            print(f"scalebox: cannot write metrics to {path}: {exc}", file=sys.stderr)


atexit.register(flush)
