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
turns it off.
"""
from __future__ import annotations

import os
import sys
from typing import Any

#: the most parameters an optimizer may hold for its run to be capped (MLPs of a few hundred
#: units are 1e4-3e5; the Nature Atari CNN is 1.7e6 and keeps torch's threads)
SMALL = 1_000_000

_decided = [False]


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
    try:
        count = sum(p.numel() for group in optimizer.param_groups for p in group["params"])
    except (AttributeError, KeyError, TypeError):  # not a torch optimizer after all
        return optimizer
    if count > SMALL:
        return optimizer
    torch.set_num_threads(1)
    _event(f"{count} parameters: intra-op threads {threads} -> 1 (small networks; OMP_NUM_THREADS unset)",
           parameters=count, threads=threads)
    return optimizer
