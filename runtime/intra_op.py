"""One intra-op thread for small networks, where the user set no thread count (``accelerate.threads``).

With ``OMP_NUM_THREADS`` unset, torch runs every op on as many threads as the machine has
cores. A 64-unit MLP's ops are microseconds long: the threads mostly spin at barriers, which
is CPU time (and, on a shared machine, wall time) for nothing. Measured on this project's
2-core machine (shared, loaded): CleanRL's update 1.4 ms CPU with one thread against 45 ms with
two; minimalRL's ``dqn.py``, 8000 steps, ``OMP_NUM_THREADS`` unset: 96.6 s CPU / 101.6 s wall
as written, 6.5 s / 6.7 s rewritten with ``--fast`` (benchmarks/bench_fast_cpu.py; docs/accelerate.md).

:func:`one_thread_for_small_nets` is called with each optimizer as it is built (the transform
wraps the constructor call) and returns it unchanged. The first time, if neither
``OMP_NUM_THREADS`` nor ``MKL_NUM_THREADS`` is set, torch runs more than one thread, and the
optimizer holds at most :data:`SMALL` parameters, it calls ``torch.set_num_threads(1)`` and
reports it (one ``intra_op_threads`` event). Results: the same ops; reductions split over one
thread instead of several may round differently (``reassociated``). ``SCALEBOX_THREADS=keep``
turns it off. A count the process chose itself is kept: torch's count is not its default (its
physical cores within the affinity mask), or ``torch.set_num_threads`` was called after this
module was imported (it is watched from then on).
"""
from __future__ import annotations

import os
import sys
from typing import Any

#: the most parameters an optimizer may hold for its run to be capped (MLPs of a few hundred
#: units are 1e4-3e5; the Nature Atari CNN is 1.7e6 and keeps torch's threads)
SMALL = 1_000_000

_decided = [False]
#: whether code called torch.set_num_threads after this module was imported
_set_by_code = [False]


def _torch_default() -> int:
    """The intra-op thread count torch starts with where no variable sets it: its physical cores
    among those this process may run on (torch's cpuinfo count, within the affinity mask)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/core_id") as f1, \
                    open(f"/sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id") as f2:
                cores.add((f2.read().strip(), f1.read().strip()))
        except OSError:
            cores.add(("", str(cpu)))
    return max(1, len(cores))


def _watch_set_num_threads() -> None:
    """Note a later ``torch.set_num_threads`` by the code (torch's own function, wrapped once)."""
    import torch

    real = torch.set_num_threads
    if getattr(real, "_scalebox_watched", False):
        return

    def set_num_threads(nthreads: int) -> None:
        _set_by_code[0] = True
        real(nthreads)

    set_num_threads._scalebox_watched = True  # type: ignore[attr-defined]
    set_num_threads.__wrapped__ = real  # type: ignore[attr-defined]
    set_num_threads.__doc__ = real.__doc__
    torch.set_num_threads = set_num_threads


def _event(message: str, **fields: Any) -> None:
    try:
        from scalebox_cst.runtime.guard_events import events

        events.emit("intra_op_threads", message, **fields)
    except Exception as exc:  # noqa: BLE001 - telemetry never breaks a run
        print(f"scalebox: {message} ({exc})", file=sys.stderr)


def one_thread_for_small_nets(optimizer: Any) -> Any:
    """``optimizer``, after capping torch at one intra-op thread where its networks are small."""
    if _decided[0]:
        return optimizer
    _decided[0] = True
    if os.environ.get("SCALEBOX_THREADS") == "keep" or os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS"):
        return optimizer
    import torch

    threads = torch.get_num_threads()
    if threads <= 1:
        return optimizer
    if _set_by_code[0] or threads != _torch_default():
        # the process chose its count (torch.set_num_threads in another file, before or after
        # this module was imported): not the default this cap is for
        return optimizer
    try:
        count = sum(p.numel() for group in optimizer.param_groups for p in group["params"])
    except (AttributeError, KeyError, TypeError):  # not a torch optimizer after all
        return optimizer
    if count > SMALL:
        return optimizer
    getattr(torch.set_num_threads, "__wrapped__", torch.set_num_threads)(1)
    _event(f"{count} parameters: intra-op threads {threads} -> 1 (small networks; OMP_NUM_THREADS unset)",
           parameters=count, threads=threads)
    return optimizer


_watch_set_num_threads()
