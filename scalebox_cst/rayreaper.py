"""The watcher of a local Ray instance that ``scalebox run --launcher ray`` started
(``raylaunch.run_ray``): Ray's processes share the driver's process group but not its fate, so
if the driver is killed (SIGKILL: no ``ray.shutdown``) this process, started beside it in its own
session, ends them. ``python -m scalebox_cst.rayreaper --reap DRIVER_PID PID:START,...``.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Dict, List, Optional

from scalebox_cst import runs

if TYPE_CHECKING:  # the reaper's type; subprocess is imported where it is started
    import subprocess


def _process_table() -> Dict[int, tuple]:
    """pid -> (parent pid, start time) of every process (Linux /proc; empty elsewhere)."""
    table: Dict[int, tuple] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        fields = runs.stat_fields(int(name))
        try:
            if fields is not None:
                table[int(name)] = (int(fields[1]), fields[19].decode())
        except ValueError:
            continue
    return table


def descendants(pid: int) -> List[tuple]:
    """(pid, start time) of every process below ``pid``."""
    table = _process_table()
    children: Dict[int, List[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    out, stack = [], list(children.get(pid, []))
    while stack:
        current = stack.pop()
        out.append((current, table[current][1]))
        stack.extend(children.get(current, []))
    return out


def start_reaper(driver: int) -> Optional["subprocess.Popen"]:
    """A watcher for the local Ray instance this call started: its processes share the driver's
    process group but not its fate, so if the driver is killed (SIGKILL: no ray.shutdown) the
    watcher ends them. Each is named by pid and start time (a reused pid is left alone)."""
    import subprocess

    procs = descendants(driver)
    if not procs:
        return None
    spec = ",".join(f"{pid}:{start}" for pid, start in procs)
    return subprocess.Popen(
        [sys.executable, "-m", "scalebox_cst.rayreaper", "--reap", str(driver), spec],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )


def _reap(driver: int, spec: str, interval: float = 0.5, grace: float = 3.0) -> None:
    wanted = [(int(p), start) for p, start in (item.split(":") for item in spec.split(",") if item)]
    while True:
        table = _process_table()
        if driver not in table:
            break
        time.sleep(interval)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        table = _process_table()
        alive = [pid for pid, start in wanted if table.get(pid, (None, None))[1] == start]
        if not alive:
            return
        for pid in alive:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        time.sleep(grace)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--reap"] and len(sys.argv) == 4:
        _reap(int(sys.argv[2]), sys.argv[3])
    else:
        sys.exit("usage: python -m scalebox_cst.rayreaper --reap DRIVER_PID PID:START,...")
