"""Why a run-time guard sent a rewritten site to the code as written.

A guard's refusal was a bare False (or None): a run's end line said ``guards 0%`` and nothing
more, so a user could not tell a loop too short to pay (lists of Python floats below 1,024 steps)
from one fed float16 tensors or a list next to a tensor -- which they can change. The deciding
helpers (``recurrence_ok``, ``quadratic_ok``, the target updates, ``batch_*``, the scatter
batches) now say why as they refuse, through :func:`no` / :func:`none`. The counting wrappers of
the run's telemetry (runtime/telemetry/sites.py) :func:`take` it right after the call and count
it per site; sites.json carries the most frequent few, and ``scalebox run``, ``log`` and
``profile`` name the first.

A reason is a fixed phrase per check (never a value: one site's reasons stay a handful of keys),
read in one breath, saying what the inputs were, not how the guard is written. Saying it costs
one thread-local store, on the refusing path only.
"""
from __future__ import annotations

import threading
from typing import Any, Optional

_local = threading.local()


def no(why: str) -> bool:
    """False, having noted ``why`` for this thread's next :func:`take`."""
    _local.why = why
    return False


def none(why: str) -> Any:
    """None (a batch helper's refusal), having noted ``why`` (typed Any: returned in place of
    whatever the helper returns when it accepts)."""
    _local.why = why
    return None


def take() -> Optional[str]:
    """The reason noted last on this thread (None if none), cleared."""
    why = getattr(_local, "why", None)
    if why is not None:
        _local.why = None
    return why
