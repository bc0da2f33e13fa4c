"""``torch.compile`` of one rewritten site, guarded: whatever goes wrong, the site runs eager.

The ``accelerate.compile`` transform decorates a method (``Agent.get_action_and_value``, a
Q-network's ``forward``) with :func:`compiled`. The first call compiles it, ``fullgraph=True``
and ``dynamic=False`` (one graph per shape, as the rollout and the minibatch shapes are fixed):

* the compile raises (no compiler, an unsupported op, an inductor failure) or the body does not
  fit one graph (a graph break: a host sync, data-dependent control flow, a distribution that
  validates its arguments) -> the site runs eager from then on and the call that failed is rerun
  eager (tracing runs nothing of the user's code, so the rerun is the first execution);
* more than :data:`MAX_COMPILES` compiles at one site (a recompile storm: shapes or Python values
  that change every call), or dynamo's own recompile limit hit (frames without a graph are not
  counted in :data:`MAX_COMPILES`) -> eager from then on.

Each fallback is one ``compile_fallback`` event in the run's events.jsonl (the site, why) and the
site's counters (``calls``, ``compiled_calls``, ``compiles``, ``fallback``) are in
:func:`stats`. Random ops keep eager's random stream (inductor's ``fallback_random``): a sampled
action is the same as the original's on the same seed; the remaining difference is the
floating-point order of fused kernels (``reassociated``). On CUDA the graph is also captured as a
CUDA graph (``triton.cudagraphs``: what ``mode="reduce-overhead"`` sets), as LeanRL does by hand.
Their outputs are cloned out of the graph's memory pool (the next replay would overwrite
them). ``SCALEBOX_COMPILE=0`` runs every site eager (a quick A/B without a new rewrite);
``SCALEBOX_COMPILE_CUDAGRAPHS=0`` compiles without CUDA graphs.
"""
from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
from typing import Any, Callable, Dict, Optional

from scalebox_cst.oneline import error_line

#: compiles at one site before it is declared a recompile storm and run eager
MAX_COMPILES = 6

_lock = threading.Lock()
_sites: Dict[str, "Compiled"] = {}


def _compile_count() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0))


def _cudagraphs(device_type: str) -> bool:
    return device_type == "cuda" and os.environ.get("SCALEBOX_COMPILE_CUDAGRAPHS", "1") != "0"


def _options(device_type: str) -> Dict[str, Any]:
    options: Dict[str, Any] = {"fallback_random": True}
    if _cudagraphs(device_type):
        options["triton.cudagraphs"] = True  # mode="reduce-overhead"; mode and options exclude each other
    return options


def _own(out: Any) -> Any:
    """Tensors the caller owns: a CUDA graph's outputs live in its memory pool and the next replay
    overwrites them (``qf1(x)`` then ``qf2(x)``, one graph for both instances, would leave
    ``qf1``'s values overwritten), so they are cloned outside the graph, as torch advises."""
    import torch

    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, tuple) and not hasattr(out, "_fields"):
        return tuple(_own(o) for o in out)
    if isinstance(out, list):
        return [_own(o) for o in out]
    if isinstance(out, dict):
        return {k: _own(v) for k, v in out.items()}
    return out


def _device_type(args: tuple, kwargs: dict) -> str:
    import torch

    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device.type
        if isinstance(value, torch.nn.Module):
            for p in torch.nn.Module.parameters(value):  # not an override: user code, or a compiled site
                return p.device.type
    return "cpu"


def _event(site: str, message: str) -> None:
    try:
        from scalebox_cst.runtime.guard_events import events

        events.emit("compile_fallback", f"{site}: {message}", site=site)
    except Exception as exc:  # telemetry never breaks a run
        print(f"scalebox: {site}: {message} ({exc})", file=sys.stderr)


class Compiled:
    """A function (or, through ``__get__``, a method) compiled on first call, eager on trouble."""

    def __init__(self, fn: Callable, site: str) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.site = site
        self.compiled: Optional[Callable] = None
        self.eager = os.environ.get("SCALEBOX_COMPILE", "1") == "0"
        self.reason: Optional[str] = "SCALEBOX_COMPILE=0" if self.eager else None
        self.calls = self.compiled_calls = self.compiles = 0
        self.owns = False  # outputs cloned (CUDA graphs)
        with _lock:
            if not _sites:
                atexit.register(_summary)
            _sites[site] = self

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return functools.partial(self.__call__, obj)

    def fall_back(self, why: str) -> None:
        self.eager, self.reason, self.compiled = True, why, None
        _event(self.site, f"runs eager: {why}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        if torch.compiler.is_compiling():
            # called from inside another compiled site (Actor.get_action calls self(x)): inlined.
            # First, before this wrapper touches its counters: dynamo would guard on their values
            # and recompile the caller on every call.
            return self.fn(*args, **kwargs)
        self.calls += 1
        if self.eager:
            return self.fn(*args, **kwargs)
        if self.compiled is None:
            try:
                device_type = _device_type(args, kwargs)
                self.owns = _cudagraphs(device_type)
                self.compiled = _compile(self.fn, device_type)
            except Exception as exc:  # noqa: BLE001 - any failure to build means: eager
                self.fall_back(f"torch.compile failed ({error_line(exc, limit=160)})")
                return self.fn(*args, **kwargs)
        before = _compile_count()
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            from torch._dynamo.exc import TorchDynamoException

            limit = _recompile_limit(exc)
            if not isinstance(exc, TorchDynamoException) and not limit and _compile_count() == before:
                raise  # the user's code raised in a graph that compiled earlier: as eager would
            if limit:
                self.fall_back(f"recompile storm (dynamo's recompile limit hit after {self.calls} calls: "
                               "frames without a graph recompile uncounted)")
                return self.fn(*args, **kwargs)  # refused before tracing: this call has not run
            kind = "graph break" if type(exc).__name__ == "Unsupported" else "compile failed"
            self.fall_back(f"{kind} ({error_line(exc, limit=160)})")
            return self.fn(*args, **kwargs)  # tracing ran none of the user's code: this is its first run
        new = _compile_count() - before
        if new:
            self.compiles += new
            if self.compiles > MAX_COMPILES:
                self.fall_back(f"recompile storm ({self.compiles} compiles > {MAX_COMPILES}: shapes or values change per call)")
                return _own(out) if self.owns else out
        self.compiled_calls += 1
        return _own(out) if self.owns else out


def _compile(fn: Callable, device_type: str) -> Callable:
    """``torch.compile`` of ``fn``, leaving ``torch.distributions``' default validation as it was.

    The first ``torch.compile`` of a process calls ``Distribution.set_default_validate_args(False)``
    (torch/_dynamo/eval_frame.py, ``TorchPatcher.patch``, run once): every distribution the
    program built from then on, compiled or not, stopped validating its arguments (NaN
    probabilities anywhere else in the user's code stopped raising: what docs/accelerate.md
    measured and chose not to do). A compiled site needs none of it (each distribution in its body
    is built with ``validate_args=False``, or the site is not compiled), so the default is put
    back. Left as torch leaves it where the program's own ``torch.compile`` ran first (the default
    was off already); where the program's runs after this one, torch's patch has run and does not
    turn the default off again: validation stays on there.
    """
    import torch
    from torch.distributions import Distribution

    before = Distribution._validate_args
    try:
        return torch.compile(fn, fullgraph=True, dynamic=False, options=_options(device_type))
    finally:
        if Distribution._validate_args != before:
            Distribution.set_default_validate_args(before)


def _recompile_limit(exc: BaseException) -> bool:
    """Whether ``exc`` is dynamo refusing to compile a frame once more (``fullgraph=True`` past
    ``recompile_limit``: ``FailOnRecompileLimitHit``, which is no ``TorchDynamoException``). Frames
    that hold no graph (a method that only appends to a list, guarded on its length) recompile
    every call without counting in ``unique_graphs``: this is where their storm ends."""
    cls = type(exc)
    return cls.__name__.startswith("FailOn") and cls.__name__.endswith("LimitHit") and cls.__module__.startswith("torch._dynamo")


def compiled(site: str) -> Callable[[Callable], Compiled]:
    """Decorator: ``@compiled(site="train.py:42")`` on a function or method."""

    def wrap(fn: Callable) -> Compiled:
        return Compiled(fn, site)

    return wrap


def _summary() -> None:
    """At exit, one ``compiled_site`` event per site that ran: the run's record of what compiled."""
    for site, row in stats().items():
        if row["calls"]:
            how = f"eager ({row['fallback']})" if row["fallback"] else "compiled"
            try:
                from scalebox_cst.runtime.guard_events import events

                events.emit("compiled_site", f"{site}: {how}; {row['compiled_calls']}/{row['calls']} calls compiled, "
                            f"{row['compiles']} compile(s)", site=site, **row)
            except Exception:  # noqa: BLE001 - telemetry never breaks a run
                pass


def stats() -> Dict[str, Dict[str, Any]]:
    """Per site: calls, calls that ran compiled, compiles, and why it runs eager (None: it does not)."""
    with _lock:
        return {
            site: {"calls": c.calls, "compiled_calls": c.compiled_calls, "compiles": c.compiles,
                   "fallback": c.reason}
            for site, c in _sites.items()
        }
