"""Logged ``.item()`` values read after the loop instead of once per step (``accelerate.defer_sync``).

On CUDA each ``loss.item()`` waits for every queued kernel (a host-device sync); a loop that logs
three such numbers per minibatch stalls the GPU three times per minibatch. The
``accelerate.defer_sync`` rewrite turns each logging statement whose number reaches only the
log (``writer.add_scalar(tag, loss.item(), step)``, ``losses.append(loss.item())``,
``clipfracs += [x.item()]``) into ``d.call(sink, ..., d.item(loss), ...)`` and flushes ``d``
when the loop ends (``try``/``finally``: break, exceptions and KeyboardInterrupt flush too).

* :meth:`Deferred.item` keeps a *copy* of the tensor (``detach().reshape(()).clone()``): the
  copy runs on the tensor's stream where the ``.item()`` stood, so a later in-place change
  (``optimizer.step()`` on a logged parameter, ``loss.mul_()``) cannot reach the logged value;
  the copy is bitwise, and ``.tolist()`` of the stacked copies gives the same Python numbers as
  ``.item()`` of each (one sync per dtype and device at the flush).
* A tensor on the CPU (no device sync to save) or with more than one element (``.item()``
  raises: it raises at once, where the original did) is read at once; :data:`DEFER_ON_CPU`
  makes CPU tensors deferred too (the tests and the benchmark use it).
* :meth:`Deferred.call` with nothing pending and no deferred number calls the sink at once (the
  original's timing). An argument that is not an immutable value (a list a name holds, an
  array, a tensor) could change before the flush: the pending calls and this one run at once,
  in order. Order of the calls on each sink is kept; what changes is when they happen
  (the ``reassociated`` tier: logs are written at the end of the loop, after later prints).
"""
from __future__ import annotations

import numbers
import time
from typing import Any, Dict, List, Tuple

import torch

#: defer CPU tensors too (no sync to save there: off in runs, on in the tests and benchmark)
DEFER_ON_CPU = False

#: totals over the process: numbers deferred, flushes, calls run at once because of a mutable argument
STATS = {"deferred": 0, "flushes": 0, "eager_calls": 0}


class _Item:
    """A logged number not read yet: the tensor's copy and the conversion the code asked for."""

    __slots__ = ("tensor", "convert")

    def __init__(self, tensor: torch.Tensor, convert) -> None:
        self.tensor = tensor
        self.convert = convert


def _immutable(value: Any) -> bool:
    if isinstance(value, (str, bytes, type(None))):
        return True
    if isinstance(value, tuple):
        return all(_immutable(v) for v in value)
    return isinstance(value, numbers.Number) and not isinstance(value, torch.Tensor)


def _value(v: Any, read: Dict[int, Any]) -> Any:
    """An argument of a deferred call with each deferred number in it (``read``: by id) read."""
    if isinstance(v, _Item):
        return read[id(v)]
    if _display(v):
        if isinstance(v, dict):
            return {k: _value(x, read) for k, x in v.items()}
        return type(v)(_value(x, read) for x in v)
    return v


def _display(value: Any) -> bool:
    """A list/tuple/dict built in the call itself: the rewrite only puts a deferred number there."""
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return any(isinstance(v, _Item) for v in items)


def _safe(value: Any) -> bool:
    if isinstance(value, _Item) or _immutable(value):
        return True
    if _display(value):
        items = value.values() if isinstance(value, dict) else value
        keys = value.keys() if isinstance(value, dict) else ()
        return all(isinstance(v, _Item) or _immutable(v) for v in items) and all(_immutable(k) for k in keys)
    return False


class Deferred:
    """The logging calls of one execution of a loop, in order, run by :meth:`flush`."""

    __slots__ = ("site", "calls", "items")

    def __init__(self, site: str = "") -> None:
        self.site = site
        self.calls: List[Tuple[Any, tuple, Dict[str, Any]]] = []
        self.items = 0

    def _keep(self, x: Any, convert):
        if x.numel() != 1 or (x.device.type == "cpu" and not DEFER_ON_CPU):
            return x.item() if convert is None else convert(x)
        self.items += 1
        STATS["deferred"] += 1
        return _Item(x.detach().reshape(()).clone(), convert)

    @staticmethod
    def now() -> float:
        """``time.time()`` where a deferred writer call stood (its event's ``walltime``)."""
        return time.time()

    def item(self, x: Any):
        """``x.item()``, read at the flush when ``x`` is a one-element device tensor."""
        if not isinstance(x, torch.Tensor):
            return x.item()
        return self._keep(x, None)

    def float(self, x: Any):
        """``float(x)``, read at the flush when ``x`` is a one-element device tensor."""
        if not isinstance(x, torch.Tensor):
            return float(x)
        return self._keep(x, float)

    def call(self, fn, *args, **kwargs) -> None:
        """``fn(*args, **kwargs)`` now when nothing waits, else after the pending calls."""
        if not self.calls and not self.items:
            fn(*args, **kwargs)  # no number kept, nothing pending: the original's timing
            return
        self.calls.append((fn, args, kwargs))
        if not all(_safe(v) for v in (*args, *kwargs.values())):
            STATS["eager_calls"] += 1
            self.flush()  # an argument could change before the flush: this call runs now, in order

    def flush(self) -> None:
        """Read every deferred number (one ``tolist`` per dtype and device), then run the calls in order."""
        calls, self.calls, self.items = self.calls, [], 0
        if not calls:
            return
        STATS["flushes"] += 1
        pending: List[_Item] = []
        for _, args, kwargs in calls:
            for v in (*args, *kwargs.values()):
                if isinstance(v, _Item):
                    pending.append(v)
                elif _display(v):
                    pending.extend(x for x in (v.values() if isinstance(v, dict) else v) if isinstance(x, _Item))
        groups: Dict[Tuple[Any, Any], List[_Item]] = {}
        for it in pending:
            groups.setdefault((it.tensor.device, it.tensor.dtype), []).append(it)
        read: Dict[int, Any] = {}
        for members in groups.values():
            numbers_ = torch.stack([m.tensor for m in members]).tolist()
            for m, number in zip(members, numbers_):
                read[id(m)] = number if m.convert is None else m.convert(number)

        for fn, args, kwargs in calls:
            fn(*[_value(a, read) for a in args], **{k: _value(v, read) for k, v in kwargs.items()})
