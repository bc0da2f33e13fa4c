"""A run's record: what ``record.json`` holds, and what the end of a run adds to it (the metrics'
summary, the traceback that ended it). Plain data, shared by every launcher (local, torchrun, Ray)."""
from __future__ import annotations

import dataclasses
import math
import socket
from typing import Any, Dict, List, Optional

from scalebox_cst import runs


def engine_build() -> str:
    """``VERSION+DIGEST`` of the engine that launched a run: its seeding, telemetry and launcher
    are part of what a run measured, so ``compare`` says when the runs it pools were made by
    different builds (an upgrade between the original's runs and the rewrite's)."""
    from scalebox_cst.config import __version__, engine_digest

    return f"{__version__}+{engine_digest()[:8]}"


@dataclasses.dataclass
class RunRecord:
    """What ``record.json`` holds (see scalebox_cst.runs and the README for every key)."""

    branch: str
    commit: str
    script: str
    args: List[str]
    started: float
    run: int = 0
    source_commit: Optional[str] = None
    variant: str = "rewrite"  # or "original": the source snapshot itself, unrewritten
    seed: Optional[int] = None
    seed_via: Optional[str] = None  # "option" (--seed N appended) or "env" (launcher seeds RNGs)
    pid: Optional[int] = None
    pgid: Optional[int] = None
    pid_start: Optional[int] = None  # the child's start in clock ticks since boot: a reused pid is not this run
    host: str = dataclasses.field(default_factory=socket.gethostname)
    ended: Optional[float] = None
    wall_time: Optional[float] = None
    exit_status: Optional[int] = None
    status: str = "running"  # running | ok | failed | stopped | pruned (readers add "lost")
    signal: Optional[str] = None  # the signal that ended the child, if one did
    stop_reason: Optional[str] = None
    stop_signals: Optional[List[str]] = None  # what stop() sent, in order (SIGINT; SIGTERM, SIGKILL past the grace)
    hotfix_of: Optional[str] = None  # "run/0002#1"
    launcher: str = "local"
    nproc: int = 1
    stale: Optional[List[str]] = None  # files of the working tree that differed from the commit
    load: Optional[Dict[str, Any]] = None  # the host's load while it ran (scalebox_cst.contention)
    engine_prefix: str = runs.ENGINE  # the engine's series are named so (records before it: bare names)
    headline: Dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: Dict[str, Dict[str, Any]] = dataclasses.field(default_factory=dict)
    profile: Optional[Dict[str, Any]] = None  # where the time went (scalebox_cst.profile.build)
    error_tail: List[str] = dataclasses.field(default_factory=list)
    recording_error: Optional[str] = None  # why the run folder stopped being written (a full disk)
    tags: Dict[str, Any] = dataclasses.field(default_factory=dict)  # who started it: {"study": S, "trial": 7}
    limits: Optional[Dict[str, str]] = None  # what is enforced, and how (scalebox_cst.limits)
    fallbacks: Optional[List[Dict[str, Any]]] = None  # operators run on the CPU, per line (scalebox_cst.fallbacks)
    precision: Optional[Dict[str, Any]] = None  # module ranges of a calibration run (scalebox_cst.calibration)
    engine: Optional[str] = dataclasses.field(default_factory=lambda: engine_build())  # the build that launched it

    @property
    def stopped(self) -> bool:
        return self.status == "stopped"

    @property
    def id(self) -> str:
        return f"{self.branch}#{self.run}"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "RunRecord":
        fields = {f.name for f in dataclasses.fields(cls)}
        kept = {k: v for k, v in data.items() if k in fields}
        kept.setdefault("engine", None)  # a record from before builds were recorded: not this build's
        return cls(**kept)


def summarize(series: Dict[str, List[runs.Point]]) -> Dict[str, Dict[str, Any]]:
    """Per metric: count, last, min, max, mean of the finite values, non-finite count."""
    out: Dict[str, Dict[str, Any]] = {}
    for name, points in series.items():
        values = [p.value for p in points]
        good = [v for v in values if math.isfinite(v)]
        out[name] = {
            "count": len(values),
            "last": values[-1] if values else None,
            "min": min(good) if good else None,
            "max": max(good) if good else None,
            "mean": sum(good) / len(good) if good else None,
            "nonfinite": len(values) - len(good),
        }
    return out


#: the most characters of one output line a run's tail keeps (its start and its end): a script
#: printing megabytes without a newline made the host hold 400 lines of 1 MiB each (the tail's
#: length; 450 MB, twice that for undecodable bytes) and wrote 44 MB of them into record.json
TAIL_LINE_CHARS = 4000


def clipped(line: str, limit: int = TAIL_LINE_CHARS) -> str:
    """``line`` as a run's tail keeps it: at most ``limit`` characters, its start and end with
    what was cut said in between (a traceback's lines are far shorter and pass unchanged)."""
    if len(line) <= limit:
        return line
    mark = f" [... {len(line)} characters, the middle cut ...] "
    half = max(0, (limit - len(mark)) // 2)
    return f"{line[:half]}{mark}{line[-half:] if half else ''}"  # within limit: clipping twice changes nothing


def error_tail(lines: List[str], limit: int = 30, errors: Optional[List[str]] = None) -> List[str]:
    """The last traceback in ``errors`` (the stderr lines), else in ``lines`` (the output as it
    arrived), else the end of ``lines``, at most ``limit`` lines, each :func:`clipped`. stdout
    and stderr are read by two threads, so stdout lines printed before a traceback can arrive
    after it: a traceback is taken from stderr alone when stderr has one."""
    for source in ([errors] if errors else []) + [lines]:
        source = [clipped(line.rstrip("\n")) for line in source]
        for i in range(len(source) - 1, -1, -1):
            if source[i].startswith("Traceback (most recent call last)"):
                return source[i:][-limit:]
    lines = [clipped(line.rstrip("\n")) for line in lines[-min(limit, 10):]]
    return lines
