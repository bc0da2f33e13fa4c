"""A metric series kept at bounded size: min/max buckets that absorb appended points.

A run of a million steps cannot be sent to a browser point by point, nor kept in memory for
every run a monitor has looked at. Each series is a list of at most ``CAPACITY`` buckets; each
bucket summarises consecutive points (count, first/last x and time, the minimum and the maximum
with where they occurred, the sum of finite values). When the list is full, neighbouring buckets
merge pairwise and new buckets hold twice as many points, so memory stays fixed while a run
appends, and a series is drawn from its buckets in time independent of its length. Short series
(fewer points than ``CAPACITY``) are kept exactly, one point per bucket.

Non-finite values (NaN, inf) are counted and their positions kept (the newest ``MARKERS``), never
folded into minima or means; the page marks them instead of drawing them.
"""
from __future__ import annotations

import collections
import math
from typing import Any, Deque, Dict, Optional, Sequence, Tuple

import numpy as np

from scalebox_cst.runs import RETURN_WINDOW

CAPACITY = 1024  # buckets per series; at most this many are kept, half after each merge
MARKERS = 200  # non-finite points remembered per series (the newest)
TAIL = RETURN_WINDOW  # newest finite values kept exactly (a live run's "final" value)

# Bucket columns.
N, NF, X0, X1, T0, T1, SUM, VMIN, XMIN, TMIN, VMAX, XMAX, TMAX, LAST = range(14)
_COLS = 14


def _reduce(x: np.ndarray, t: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Buckets for the rows of ``(m, size)`` blocks of points."""
    m = x.shape[0]
    out = np.empty((m, _COLS))
    finite = np.isfinite(v)
    out[:, N] = x.shape[1]
    out[:, NF] = finite.sum(axis=1)
    out[:, X0], out[:, X1] = x[:, 0], x[:, -1]
    out[:, T0], out[:, T1] = t[:, 0], t[:, -1]
    out[:, SUM] = np.where(finite, v, 0.0).sum(axis=1)
    rows = np.arange(m)
    lo = np.where(finite, v, np.inf)
    hi = np.where(finite, v, -np.inf)
    imin, imax = lo.argmin(axis=1), hi.argmax(axis=1)
    out[:, VMIN], out[:, XMIN], out[:, TMIN] = lo[rows, imin], x[rows, imin], t[rows, imin]
    out[:, VMAX], out[:, XMAX], out[:, TMAX] = hi[rows, imax], x[rows, imax], t[rows, imax]
    # The newest finite value of each row (nan where the row has none).
    last_idx = x.shape[1] - 1 - np.argmax(finite[:, ::-1], axis=1)
    out[:, LAST] = np.where(out[:, NF] > 0, v[rows, last_idx], np.nan)
    return out


def _merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bucket-wise union of rows ``a[i]`` (earlier) and ``b[i]`` (later)."""
    out = np.empty_like(a)
    out[:, N] = a[:, N] + b[:, N]
    out[:, NF] = a[:, NF] + b[:, NF]
    out[:, X0], out[:, T0] = a[:, X0], a[:, T0]
    out[:, X1], out[:, T1] = b[:, X1], b[:, T1]
    out[:, SUM] = a[:, SUM] + b[:, SUM]
    take_b = b[:, VMIN] < a[:, VMIN]
    for col in (VMIN, XMIN, TMIN):
        out[:, col] = np.where(take_b, b[:, col], a[:, col])
    take_b = b[:, VMAX] > a[:, VMAX]
    for col in (VMAX, XMAX, TMAX):
        out[:, col] = np.where(take_b, b[:, col], a[:, col])
    out[:, LAST] = np.where(b[:, NF] > 0, b[:, LAST], a[:, LAST])
    return out


def merge_groups(buckets: np.ndarray, size: int) -> np.ndarray:
    """Merge each run of ``size`` consecutive buckets into one (the last run may be shorter)."""
    while size > 1 and len(buckets) > 1:
        even = buckets[0 : len(buckets) // 2 * 2 : 2]
        odd = buckets[1 : len(buckets) // 2 * 2 : 2]
        merged = _merge(even, odd)
        if len(buckets) % 2:
            merged = np.vstack([merged, buckets[-1:]])
        buckets = merged
        size = (size + 1) // 2
    return buckets


class Series:
    """One metric of one run, appended to in batches, read as at most ~``points`` points."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self.size = 1  # points per new bucket
        self.buckets = np.empty((0, _COLS))
        self._pending: Tuple[np.ndarray, ...] = (np.empty(0), np.empty(0), np.empty(0))
        self.count = 0
        self.nonfinite = 0
        self.markers: Deque[Tuple[float, float, str]] = collections.deque(maxlen=MARKERS)
        self.last: Optional[Tuple[float, float, float]] = None  # newest (x, time, value)
        self.tail: Deque[float] = collections.deque(maxlen=TAIL)  # newest finite values
        self.tail_points: Deque[Tuple[float, float, float]] = collections.deque(maxlen=TAIL)  # and their (x, time, value)

    @property
    def nbytes(self) -> int:
        return self.buckets.nbytes + sum(p.nbytes for p in self._pending) + 40 * len(self.markers)

    def extend(self, xs: Sequence[float], ts: Sequence[float], vs: Sequence[float]) -> None:
        """Append points in the order the run wrote them."""
        if not len(xs):
            return
        x, t, v = (np.asarray(a, dtype=float) for a in (xs, ts, vs))
        self.count += len(x)
        self.last = (float(x[-1]), float(t[-1]), float(v[-1]))
        finite = np.isfinite(v)
        self.tail.extend(v[finite][-TAIL:].tolist())
        self.tail_points.extend(zip(x[finite][-TAIL:].tolist(), t[finite][-TAIL:].tolist(), v[finite][-TAIL:].tolist()))
        bad = np.flatnonzero(~finite)
        self.nonfinite += len(bad)
        for i in bad[-MARKERS:]:
            value = v[i]
            self.markers.append((float(x[i]), float(t[i]), "nan" if value != value else ("inf" if value > 0 else "-inf")))
        if len(self._pending):
            x, t, v = (np.concatenate([p, a]) for p, a in zip(self._pending, (x, t, v)))
        pos = 0
        while len(x) - pos >= self.size:
            if len(self.buckets) >= self.capacity:  # full: halve the resolution, then go on
                self.buckets = merge_groups(self.buckets, 2)
                self.size *= 2
                continue
            take = min((len(x) - pos) // self.size, self.capacity - len(self.buckets))
            end = pos + take * self.size
            shape = (take, self.size)
            new = _reduce(x[pos:end].reshape(shape), t[pos:end].reshape(shape), v[pos:end].reshape(shape))
            self.buckets = np.vstack([self.buckets, new])
            pos = end
        self._pending = (x[pos:].copy(), t[pos:].copy(), v[pos:].copy())

    def all_buckets(self) -> np.ndarray:
        """The kept buckets plus one bucket per pending point (so the newest points show at once)."""
        x, t, v = self._pending
        if not len(x):
            return self.buckets
        tail = _reduce(x[:, None], t[:, None], v[:, None])
        return np.vstack([self.buckets, tail]) if len(self.buckets) else tail

    def points(self, points: int = 1000, axis: str = "step") -> Dict[str, Any]:
        """``{"x": [...], "y": [...]}``, at most about ``points`` long: the min and max of each group.

        ``axis`` is ``"step"`` (the metric's own x) or ``"time"`` (the point's time). Buckets with
        no finite value are left out; their points are in ``markers``.
        """
        buckets = self.all_buckets()
        groups = max(1, points // 2)
        if len(buckets) > groups:
            buckets = merge_groups(buckets, -(-len(buckets) // groups))
        buckets = buckets[buckets[:, NF] > 0]
        xmin_col, xmax_col = (XMIN, XMAX) if axis == "step" else (TMIN, TMAX)
        xs = np.stack([buckets[:, xmin_col], buckets[:, xmax_col]], axis=1)
        ys = np.stack([buckets[:, VMIN], buckets[:, VMAX]], axis=1)
        # min and max in the order they occurred; one point where they are the same point
        swap = xs[:, 0] > xs[:, 1]
        xs[swap] = xs[swap][:, ::-1]
        ys[swap] = ys[swap][:, ::-1]
        same = (xs[:, 0] == xs[:, 1]) & (ys[:, 0] == ys[:, 1])
        keep = np.ones(xs.shape, dtype=bool)
        keep[:, 1] = ~same
        x, y = xs[keep], ys[keep]
        order = np.argsort(x, kind="stable")  # a chart wants ascending x (user steps may restart)
        return {"x": x[order].tolist(), "y": y[order].tolist()}

    def means(self, points: int = 500, axis: str = "step") -> Tuple[np.ndarray, np.ndarray]:
        """``(x, mean)`` of finite values per group, x at the group's midpoint: for seed averages."""
        buckets = self.all_buckets()
        if len(buckets) > points:
            buckets = merge_groups(buckets, -(-len(buckets) // points))
        buckets = buckets[buckets[:, NF] > 0]
        a, b = (X0, X1) if axis == "step" else (T0, T1)
        x = (buckets[:, a] + buckets[:, b]) / 2
        order = np.argsort(x, kind="stable")
        return x[order], (buckets[:, SUM] / buckets[:, NF])[order]

    def summary(self) -> Dict[str, Any]:
        """Counts and the newest point, JSON-ready (non-finite values as strings)."""
        buckets = self.all_buckets()
        finite = buckets[buckets[:, NF] > 0]
        out: Dict[str, Any] = {"count": self.count, "nonfinite": self.nonfinite}
        if len(finite):
            out["min"] = float(finite[:, VMIN].min())
            out["max"] = float(finite[:, VMAX].max())
            out["last_finite"] = float(finite[-1, LAST])
        if self.last is not None:
            x, t, v = self.last
            out["last"] = {"x": x, "time": t, "value": json_number(v)}
        return out


def json_number(value: float) -> Any:
    """A float for JSON: finite as is, else ``"nan"``, ``"inf"`` or ``"-inf"`` (JSON has no NaN)."""
    if math.isfinite(value):
        return value
    return "nan" if value != value else ("inf" if value > 0 else "-inf")
