"""The monitor's incremental readers of append-only run files: ``metrics.jsonl`` into bounded
:class:`~scalebox_cst.monitor.series.Series` and ``events.jsonl`` into a short deque, each read
on from the byte offset reached last time and reset when the file shrinks or is replaced. Each
counts the damaged lines it skipped (``damage``, scalebox_cst.jsonlines), which the API says."""
from __future__ import annotations

import collections
import os
import threading
from typing import Any, Deque, Dict, List, Optional, Tuple

import numpy as np

from scalebox_cst import jsonlines, runs
from scalebox_cst.monitor.series import Series

#: bytes of metrics read per step (a million-line file is parsed in bounded pieces)
CHUNK_BYTES = 8 << 20
#: events kept per events.jsonl (the newest)
EVENTS_PER_FILE = 200


class MetricsFile:
    """One run's metrics.jsonl, read on from where the last read stopped."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self._reset(None)

    def _reset(self, ident: Optional[Tuple[int, int]]) -> None:
        self.ident = ident
        self.offset = 0
        self.series: Dict[str, Series] = {}
        self.first_time: Optional[float] = None
        self.damage: jsonlines.Damage = {}

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.series.values()) + 1024

    def refresh(self, ended: bool = False) -> None:
        """Read the lines appended since the last call (complete lines only; ``ended``: the run
        writes no more, and its cut last line is read as a line, damaged unless it parses)."""
        with self.lock:
            try:
                st = os.stat(self.path)
            except OSError:
                self._reset(None)
                return
            ident = (st.st_dev, st.st_ino)
            if ident != self.ident or st.st_size < self.offset:
                self._reset(ident)  # replaced or truncated: start over
            while self.offset < st.st_size:
                lines, offset = jsonlines.read_lines(self.path, self.offset, CHUNK_BYTES, ended=ended, damage=self.damage)
                if offset == self.offset:
                    break
                self.offset = offset
                self._add(lines)

    def _add(self, lines: List[bytes]) -> None:
        items = jsonlines.parse(lines, self.path, self.damage)
        if not items:
            return
        try:  # the common case, column by column in C loops: every line well formed
            names = [item["name"] for item in items]
            uniq = set(names)
            if not all(isinstance(n, str) for n in uniq):
                raise TypeError("metric name is not a string")
            vs = np.array([float(item["value"]) for item in items])  # "nan"/"inf" strings too
            xs = np.array([item.get("step", 0) for item in items], dtype=float)
            ts = np.array([item.get("time", 0.0) for item in items], dtype=float)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
            self._add_slowly(items)
            return
        if self.first_time is None:
            stamped = ts[ts != 0]
            if len(stamped):
                self.first_time = float(stamped[0])
        if len(uniq) == 1:
            self._extend(names[0], xs, ts, vs)
            return
        labels = np.array(names, dtype=object)
        for name in sorted(uniq, key=names.index):
            mask = labels == name
            self._extend(name, xs[mask], ts[mask], vs[mask])

    def _add_slowly(self, items: List[Any]) -> None:
        """Line by line, leaving out the ones that are not a metric point."""
        columns: Dict[str, Tuple[List[float], List[float], List[float]]] = {}
        for item in items:
            try:
                name = item["name"]
                value = item["value"]
                value = float(value) if isinstance(value, str) else value  # "nan", "inf", "-inf"
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not isinstance(name, str):
                    raise TypeError(name)
                step = float(item.get("step", 0))
                stamp = float(item.get("time", 0.0))
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
                jsonlines.count(self.damage, self.path)  # not a metric point
                continue
            cols = columns.get(name)
            if cols is None:
                cols = columns[name] = ([], [], [])
            cols[0].append(step)
            cols[1].append(stamp)
            cols[2].append(float(value))
            if self.first_time is None and stamp:
                self.first_time = stamp
        for name, (xs, ts, vs) in columns.items():
            self._extend(name, xs, ts, vs)

    def _extend(self, name: str, xs, ts, vs) -> None:
        series = self.series.get(name)
        if series is None:
            series = self.series[name] = Series()
        series.extend(xs, ts, vs)


class EventsFile:
    """One events.jsonl: the newest ``EVENTS_PER_FILE`` events, read on from the last offset."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.ident: Optional[Tuple[int, int]] = None
        self.offset = 0
        self.events: Deque[Dict[str, Any]] = collections.deque(maxlen=EVENTS_PER_FILE)
        self.damage: jsonlines.Damage = {}

    def refresh(self) -> None:
        with self.lock:
            try:
                st = os.stat(self.path)
            except OSError:
                self.events.clear()
                self.ident, self.offset, self.damage = None, 0, {}
                return
            ident = (st.st_dev, st.st_ino)
            if ident != self.ident or st.st_size < self.offset:
                self.events.clear()
                self.ident, self.offset, self.damage = ident, 0, {}
            if st.st_size > self.offset:
                events, self.offset = runs.read_events(self.path, self.offset, damage=self.damage)
                self.events.extend(e for e in events if isinstance(e.get("kind"), str))
