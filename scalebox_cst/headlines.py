"""The headline metrics of a run, once: key, label, format, and how the value is computed.

Why one table: runs (``scalebox log``), compare, the CLI's run lines and the monitor each named
these numbers and said how to compute them, and they disagreed: the monitor showed a live run's
steps/s as its last point while a finished run's was the median of the second half of its points,
so the number jumped when the run ended. Every reader now takes the key, label, format and
reducer from here; a live value is the same reducer over the points the reader holds (the monitor
keeps the newest :data:`scalebox_cst.monitor.series.TAIL` finite points of a series), a final value
the same reducer over all of them.

The values (see :func:`scalebox_cst.runs.headline`):

- ``episodic_return_final``: mean of the last ``RETURN_WINDOW`` (10) finite episode returns.
- ``episodic_return_best``: the best mean of ``RETURN_WINDOW`` consecutive returns.
- ``sps``: steps per second over the later half of the run (the warm-up left out). From the
  engine's ``scalebox/SPS`` (x: the env steps so far, each value the rate since the report
  before): the steps of the later half over the time they took (:func:`steps_per_second`); the
  median of those points' rates was 25 steps/s for a DQN whose run did 86 (training bursts between
  env steps: most points are slow ones). From a script's own SPS series, whose x may count
  anything: the median of the later half of its values (one point is its own median).
- ``site_time_s``: sampled time in rewritten sites; ``guard_pass_rate``: vectorized / (vectorized
  + fallback) over every site; ``wall_time``; ``cpu_time_s``: user + system of the run's process
  and reaped children (its last point, written at exit).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Sequence, Tuple

from scalebox_cst import jsonlines, site_counts


def median(values: Sequence[float]) -> Optional[float]:
    if not values:
        return None
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def later_half_median(values: Sequence[float]) -> Optional[float]:
    """The median of the later half of ``values`` (the warm-up left out): steps/s, live and final."""
    values = list(values)
    return median(values[len(values) // 2:]) if values else None


def steps_per_second(points: Sequence[Tuple[float, float, float]], counts_steps: bool) -> Optional[float]:
    """steps/s from the finite points ``(x, time, value)`` of a rate series, live and final.

    ``counts_steps``: x is the steps so far (the engine's SPS), so the later half's steps over the
    time they took, from the point before it to the last (a run that trains between env steps has
    many slow points and few fast ones: their median understated what the run did, 25 for 86
    steps/s), the stretch at least :data:`MIN_WINDOW_S` long (widened towards the start, down to
    the run's start where the points span less). Otherwise, or where time did not advance, the
    median of the later half's values."""
    points = list(points)
    if counts_steps and len(points) >= 2:
        end, i = points[-1], len(points) // 2 - 1
        while i > 0 and end[1] - points[i][1] < MIN_WINDOW_S:
            i -= 1  # a later half of under a second: widened towards the start
        start = points[i]
        if end[1] - start[1] < MIN_WINDOW_S:
            start = _origin(points[0]) or start
        if end[1] > start[1] and end[0] >= start[0]:
            return (end[0] - start[0]) / (end[1] - start[1])
    return later_half_median([p[2] for p in points])


#: the shortest stretch of SPS points a rate is taken over. A run of a few seconds has one
#: periodic point and the one written at its exit, 0.26 s apart in a newcomer's DQN: two identical
#: seeded runs read 151 and 1471 steps/s from whatever that last quarter second held.
MIN_WINDOW_S = 1.0


def _origin(first: Tuple[float, float, float]) -> Optional[Tuple[float, float, float]]:
    """``(0 steps, the time the first point's rate was counted from)``: its rate is its steps over
    the time since the telemetry started, so a run too short for a window is measured from there
    (start-up included, the same for an original and its rewrite)."""
    steps, t, rate = first
    if rate > 0 and steps > 0:
        return (0.0, t - steps / rate, 0.0)
    return None


@dataclasses.dataclass(frozen=True)
class Headline:
    key: str  # the key in a run's headline (runs.headline, the monitor's JSON)
    label: str  # what compare and the docs call it
    fmt: str  # how the CLI prints it: a format string of one value
    higher_is_better: Optional[bool]  # compare's direction (None: neither)
    how: str  # how the value is computed, for the docs
    #: the reducer over a series' finite values, where the value comes from one series
    reduce: Optional[Callable[[Sequence[float]], Optional[float]]] = None


HEADLINES: Tuple[Headline, ...] = (
    Headline("episodic_return_final", "episodic return (final)", "return {:.4g}", True,
             "mean of the last 10 finite episode returns"),
    Headline("episodic_return_best", "episodic return (best)", "best {:.4g}", True,
             "best mean of 10 consecutive episode returns"),
    Headline("sps", "steps/s", "{:.0f} steps/s", True,
             "steps over time in the later half of the engine's SPS points (a script's own SPS: the median of its later half), live and final", later_half_median),
    Headline("site_time_s", "time in rewritten sites (s)", "sites {:.3g}s", False,
             "sampled time in the rewritten sites"),
    Headline("guard_pass_rate", "guard pass rate", "guards {:.0%}", None,
             "vectorized / (vectorized + fallback) over every site"),
    Headline("wall_time", "wall time (s)", "{:.1f}s", False, "the run's wall-clock time"),
    Headline("cpu_time_s", "CPU time, children included (s)", "cpu {:.3g}s", False,
             "user + system time of the run's process and reaped children"),
)
BY_KEY: Dict[str, Headline] = {h.key: h for h in HEADLINES}


def reduced(key: str, values: Sequence[float]) -> Optional[float]:
    """Headline ``key`` over one series' finite values (the same reducer live and final)."""
    reduce = BY_KEY[key].reduce
    if reduce is None:
        raise ValueError(f"headline {key} does not come from one series")
    return reduce(values)


def shown(key: str, value: float) -> str:
    """``value`` as the CLI prints headline ``key`` (``1234 steps/s``)."""
    return BY_KEY[key].fmt.format(value)


def end_line(record) -> str:
    """A finished run's one line (after ``scalebox: ``), as ``scalebox run`` and the watcher print it:
    its id, status and time, seed, return, steps/s and its guards' pass rate."""
    head = record.headline or {}
    parts = [f"{record.id}{' (original)' if record.variant == 'original' else ''} {record.status}"]
    if record.signal:
        parts[0] += f" ({record.signal})"
    elif record.status == "failed" and record.exit_status:  # the script's own code: 1 for a traceback
        parts[0] += f" (exit {record.exit_status})"
    parts[0] += f" in {record.wall_time:.1f}s"
    if record.status == "failed" and record.stop_reason:
        parts[0] += f": {record.stop_reason}"
    if record.seed is not None:
        parts.append(f"seed {record.seed}")
    if head.get("episodic_return_final") is not None:
        parts.append(f"return {head['episodic_return_final']:.4g} (best {head['episodic_return_best']:.4g})")
    if head.get("sps") is not None:
        parts.append(shown("sps", head["sps"]))
    guards = site_counts.guards_text(head.get("guard_pass_rate"), head.get("guard_fallback_why"))
    if guards is not None:
        parts.append(guards)
    damaged = jsonlines.note(head.get("damaged"))  # what the numbers above could not read
    if damaged:
        parts.append(damaged)
    return ", ".join(parts)
