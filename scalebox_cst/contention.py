"""Whether a run's speed can be trusted: did it share the machine with other work?

Wall time and steps/s measure the machine as much as the code: two seeds run side by side on a
loaded two-core host made a rewrite look 75% slower than its original, while sequential reruns
showed no difference. So each run records what it competed with, and ``compare`` says so:

- :class:`LoadSampler` (the executor, once a second while the run runs): the host's runnable
  tasks (``/proc/loadavg``'s 4th field, the instantaneous count, less the sampler itself; the
  1-minute load average where there is no /proc) → record.json ``load``: ``{"runnable_mean",
  "loadavg_1m_mean", "cpus", "samples"}``;
- telemetry's ``scalebox/cpu_time_s``: CPU time of the run's process and its reaped children
  (user + system), which other work on the machine hardly changes (the headline's ``cpu_time_s``)
  where torch runs one intra-op thread (with more, they spin while a sibling waits for a core:
  compare then gives CPU time no better/worse either);
- :func:`shared_machine`: why a run's wall time is not a speed measurement: other scalebox runs of
  the project overlapping it on the same host, or on average more runnable tasks on the host (the
  run's own included) than CPUs, by :data:`TOLERANCE` (a run that alone wants more cores than
  there are is flagged too: its speed then depends on the scheduler as well).
"""
from __future__ import annotations

import os
import socket
from typing import Any, Dict, List, Optional, Sequence

#: other runnable work above the CPUs the run left idle, in cores, that counts as contention
TOLERANCE = 0.5


def runnable_now() -> Optional[float]:
    """Runnable tasks on the host now, less this reader (Linux), else the 1-minute load average."""
    try:
        with open("/proc/loadavg", encoding="ascii") as fh:
            running = fh.read().split()[3].split("/")[0]
        return max(0.0, float(running) - 1.0)
    except (OSError, IndexError, ValueError):
        return None


class LoadSampler:
    """Means of the host's load while a run runs (``sample()`` about once a second)."""

    def __init__(self) -> None:
        self.runnable: List[float] = []
        self.loadavg: List[float] = []
        self.sample()

    def sample(self) -> None:
        value = runnable_now()
        if value is not None:
            self.runnable.append(value)
        try:
            self.loadavg.append(os.getloadavg()[0])
        except (OSError, AttributeError):
            pass

    def summary(self) -> Optional[Dict[str, Any]]:
        if not self.runnable and not self.loadavg:
            return None
        mean = lambda v: round(sum(v) / len(v), 3) if v else None  # noqa: E731
        return {"runnable_mean": mean(self.runnable), "loadavg_1m_mean": mean(self.loadavg),
                "cpus": os.cpu_count() or 1, "samples": max(len(self.runnable), len(self.loadavg))}


def _interval(record: Dict[str, Any]):
    start, end = record.get("started"), record.get("ended")
    if not isinstance(start, (int, float)) or not isinstance(end, (int, float)):
        return None
    return float(start), float(end)


def overlapping(run: Any, others: Sequence[Any]) -> List[Any]:
    """The runs of ``others`` (runs.RunInfo) that ran on the same host while ``run`` ran."""
    span = _interval(run.record)
    if span is None:
        return []
    host = run.record.get("host") or socket.gethostname()
    found = []
    for other in others:
        if other.dir == run.dir or (other.record.get("host") or socket.gethostname()) != host:
            continue
        o = _interval(other.record)
        if o is not None and o[0] < span[1] and span[0] < o[1]:
            found.append(other)
    return found


def shared_machine(run: Any, others: Sequence[Any]) -> Optional[str]:
    """Why ``run``'s wall time is not a speed measurement, or None when nothing says so."""
    reasons = []
    overlap = overlapping(run, others)
    if overlap:
        reasons.append(f"{len(overlap)} other run(s) at once")
    load = run.record.get("load")
    if isinstance(load, dict):
        demand = load.get("runnable_mean")
        if demand is None:
            demand = load.get("loadavg_1m_mean")
        cpus = float(load.get("cpus") or os.cpu_count() or 1)
        if isinstance(demand, (int, float)) and demand > cpus + TOLERANCE:
            reasons.append(f"host load {demand:.1f} on {cpus:.0f} CPUs")
    return "; ".join(reasons) or None
