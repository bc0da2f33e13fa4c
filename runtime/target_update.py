"""Target-network updates over all parameter pairs at once (``torch._foreach_*``).

``vectorize.target_update`` replaces the per-parameter Python loop of a soft/hard target update
with one call here. Each function returns ``True`` when it did the update and ``False`` when it
declined (the caller then runs its original loop, kept verbatim): a function declines unless both
arguments are ``nn.Module`` instances whose parameter traversal is torch's own, the two parameter
lists have equal length, each pair has equal shape, dtype and device (strided layout), no
parameter of one list aliases a parameter at another index, the coefficients are plain ``int`` /
``float`` values and, for updates written through the parameters themselves rather than their
``.data``, grad mode is off (as it must be for the original loop not to raise).

The foreach sequences compute exactly what the loops compute, op for op (``tau * p + (1 - tau) *
tp`` is one scalar multiply of each operand and one add; the only difference is the operand order
of that add, which is commutative in IEEE arithmetic, so only NaN payload bits could differ). On
CPU a foreach op runs the same per-tensor kernel as the loop (except in-place scalar multiplies
of float16/bfloat16, which round the scalar first: those dtypes take out-of-place sequences).
``soft_update(..., replace=True)`` is the loop ``tp.data = a * p.data + b * tp.data``, which stores
a new tensor in each target parameter: the same values, computed out of place and stored the same way.
``lerp_update`` for the ``soft_update`` form is *not* bitwise identical (≈1e-7 relative); the
transform emits it only when ``vectorize.target_update.allow_lerp`` is set.

On CPU the exact ``soft_update`` / ``scale_add`` forms (float32 or float64, contiguous) switch to
one compiled numba pass per parameter pair that rounds exactly as the loop does
(``_target_update_cpu``): about 8x the loop on a 73k-parameter MLP where the foreach sequence,
three passes over memory, is about 2x. The switch costs about 0.5 s once per process (importing
numba and loading the kernel from its disk cache; a cold compile ~1 s) and saves 35-55 us a call
on 5k-70k-parameter MLPs, so it pays after some 9,000-14,000 calls. When a run makes that many
is unknown, so the switch waits until this process has spent as long in the foreach sequences as
the switch costs (``SWITCH_S``; a rent-or-buy rule: a run never loses more than the switch costs
against the better choice in hindsight). A switch after a fixed 1,000 calls cost a 3,000-update
DQN run (XinJingHao's Duel-DDQN on CartPole) 0.5 s to save 0.1 s. Once numba is loaded, other
plans switch at once. ``$SCALEBOX_TARGET_UPDATE_NUMBA_AFTER`` (or :data:`NUMBA_AFTER`) set to a
number of calls with one plan switches after that many instead; -1 never.

The parameter lists (and, for ``.data`` updates, the ``.data`` aliases) are cached per (source,
target) pair; modules are held weakly (the entry dies with them). Each call re-checks, cheaply
(~4 us for two 6-module MLPs), what could have changed since: every module of both trees still
has ``_modules`` / ``_parameters`` of the same sizes holding the same children and parameters
under the same keys, and every parameter's data still starts at the same address with the same
shape (``module.to(...)``, ``.half()``, ``p.data = ...``, parameter or submodule replacement
all fail that check and rebuild the plan). Not detected: entries deleted and re-inserted
unchanged in another order between two calls, a module's ``__class__`` swapped in place, and
parameters that overlap at different offsets of one storage (the aliasing check compares data
pointers).
"""
from __future__ import annotations

import logging
import os
import weakref
from time import perf_counter as _clock
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from scalebox_cst import digits

from . import numba_cache
from .guard_reasons import no, none
from .memory import any_overlap, may_share

__all__ = ["soft_update", "scale_add", "scale_add_alpha", "lerp_update", "hard_update", "clear_cache"]

_log = logging.getLogger(__name__)

_Module = nn.Module
_Tensor = torch.Tensor
_PLAIN = (torch.Tensor, nn.Parameter)  # exact types: subclasses may override the update's ops
_strided = torch.strided
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
#: dtypes for which ``torch._foreach_mul_(ts, python_scalar)`` rounds like ``t.mul_(python_scalar)``;
#: on CPU, for float16/bfloat16 it does not (it differs in the last bit for ~70% of elements), so
#: those dtypes take out-of-place sequences that match the loop's ops.
_FAST = (torch.float32, torch.float64)

#: module types whose parameter traversal is nn.Module's own (checked once per type)
_TYPE_OK: Dict[type, bool] = {}
_TRAVERSAL = ("parameters", "named_parameters", "_named_members", "named_modules", "__hash__", "__eq__")


def _type_ok(cls: type) -> bool:
    ok = _TYPE_OK.get(cls)
    if ok is None:
        ok = all(getattr(cls, name, None) is getattr(_Module, name) for name in _TRAVERSAL)
        _TYPE_OK[cls] = ok
    return ok


class _Plan:
    __slots__ = ("src", "tgt", "modules", "ps", "ts", "pd", "td", "ptrs", "shapes", "fast", "calls", "kernel")

    def __init__(self, src, tgt, modules, ps, ts, pd, td, ptrs, shapes, fast) -> None:
        self.src = src  # weak references
        self.tgt = tgt
        # Per module: (weakref, len(_modules), len(_parameters), [(key, child weakref)],
        # [(key, parameter)]). Modules are held weakly so that the cache never keeps a network
        # alive (a child may refer back to its parent).
        self.modules = modules
        self.ps = ps
        self.ts = ts
        self.pd = pd
        self.td = td
        self.ptrs = ptrs
        self.shapes = shapes
        self.fast = fast  # float32/float64 only: in-place foreach ops with scalars are safe
        self.calls = 0  # exact soft updates done with this plan
        self.kernel: Any = None  # numba (function, ps, ts) once compiled; False: not eligible

    def valid(self) -> bool:
        for ref, nm, npar, kids, params in self.modules:
            m = ref()
            if m is None:
                return False
            md, pdict = m._modules, m._parameters
            if len(md) != nm or len(pdict) != npar:
                return False
            for k, kid in kids:
                if md.get(k) is not kid():
                    return False
            for k, p in params:
                if pdict.get(k) is not p:
                    return False
        both = self.ps + self.ts
        return [t.data_ptr() for t in both] == self.ptrs and [t.shape for t in both] == self.shapes


_CACHE: Dict[Tuple[int, int], _Plan] = {}


def clear_cache() -> None:
    _CACHE.clear()


#: the coefficients' refusal (runtime/guard_reasons.py)
_COEFFICIENT = "a coefficient that is not a Python number or a 0-d tensor"


def _none() -> None:
    return None


def _walk(m: Any, out: List[Any], seen: set) -> bool:
    """Modules in ``named_modules()`` order; False when a module's traversal is not torch's."""
    if not _type_ok(type(m)):
        return False
    seen.add(id(m))
    out.append(m)
    for child in m._modules.values():
        if child is not None and id(child) not in seen:
            if not _walk(child, out, seen):
                return False
    return True


def _collect(root: Any, modules: list) -> Optional[List[_Tensor]]:
    mods: List[Any] = []
    if not _walk(root, mods, set()):
        return none("a module of a type whose parameters torch does not walk the usual way")
    params: List[_Tensor] = []
    seen = set()
    for m in mods:
        md, pdict = m._modules, m._parameters
        if type(md) is not dict or type(pdict) is not dict:
            return none("a module of a type whose parameters torch does not walk the usual way")
        kids = [(k, _none if v is None else weakref.ref(v)) for k, v in md.items()]
        modules.append((weakref.ref(m), len(md), len(pdict), kids, list(pdict.items())))
        for p in pdict.values():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


def _build(src: Any, tgt: Any) -> Optional[_Plan]:
    if not isinstance(src, _Module) or not isinstance(tgt, _Module):
        return none("the two networks are not torch modules")
    modules: list = []
    ps = _collect(src, modules)
    if ps is None:
        return None  # (the reason is noted)
    ts = _collect(tgt, modules) if tgt is not src else ps
    if ts is None:
        return None
    if len(ps) != len(ts):
        return none("the two networks hold different numbers of parameters")
    pd, td = [], []
    for p, t in zip(ps, ts):
        if type(p) not in _PLAIN or type(t) not in _PLAIN:  # subclasses may override the update's ops
            return none("a parameter of a subclass of torch's Parameter or Tensor")
        a, b = p.data, t.data
        if a.layout is not _strided or b.layout is not _strided or a.is_quantized or b.is_quantized:
            return none("a sparse or quantized parameter")
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device or a.dtype not in _FLOATS:
            return none("paired parameters differ in shape, dtype or device, or are not floating point")
        pd.append(a)
        td.append(b)
    # The loop updates pair i before it reads pair i+1; doing all pairs at once is the same only
    # when no tensor of one pair is (or spans bytes of) a tensor of another pair.
    where: Dict[Any, int] = {}
    for i, (a, b) in enumerate(zip(pd, td)):
        # a pair that shares its memory (a layer shared by the online and the target network, or
        # one module as both): the loop reads p after scaling t, the fused paths before
        if ps[i] is ts[i] or (a.numel() and b.numel() and may_share(a, b)):
            return none("the two networks share a parameter's memory")
        keys: Tuple[Any, ...] = (("obj", id(ps[i])), ("obj", id(ts[i])))
        if a.numel():  # empty tensors touch no memory
            keys += (("mem", a.device, a.data_ptr()), ("mem", b.device, b.data_ptr()))
        for key in keys:
            if where.setdefault(key, i) != i:
                return none("a parameter appears in two pairs, or two pairs share memory")
    if any_overlap(pd + td):  # bytes in common under two storages (from_numpy, frombuffer, DLPack)
        return none("a parameter appears in two pairs, or two pairs share memory")
    fast = all(t.dtype in _FAST for t in td)
    both = ps + ts if tgt is not src else ps + ps
    return _Plan(
        weakref.ref(src), weakref.ref(tgt), modules, ps, ts, pd, td,
        [t.data_ptr() for t in both], [t.shape for t in both], fast,
    )


_FINALIZERS: Dict[Tuple[int, int], bool] = {}


def _forget(key: Tuple[int, int]) -> None:
    _CACHE.pop(key, None)
    _FINALIZERS.pop(key, None)


def _plan(src: Any, tgt: Any) -> Optional[_Plan]:
    key = (id(src), id(tgt))
    plan = _CACHE.get(key)
    if plan is not None and plan.src() is src and plan.tgt() is tgt and plan.valid():
        return plan
    plan = _build(src, tgt)
    if plan is None:
        _CACHE.pop(key, None)
        return None
    if key not in _FINALIZERS:  # drop the entry (and the tensors it holds) with either module
        _FINALIZERS[key] = True
        weakref.finalize(src, _forget, key)
        if tgt is not src:
            weakref.finalize(tgt, _forget, key)
    _CACHE[key] = plan
    return plan


def _scalar(x: Any) -> bool:
    t = type(x)
    return t is float or t is int


#: exact soft updates of one (source, target) pair after which the CPU path switches from
#: foreach ops to one compiled numba pass (-1: never); None ("auto", the default): once this
#: process has spent SWITCH_S in the foreach sequences the kernel could replace
NUMBA_AFTER: Optional[int] = None if os.environ.get("SCALEBOX_TARGET_UPDATE_NUMBA_AFTER", "auto").strip() in ("", "auto") \
    else int(digits.setting("SCALEBOX_TARGET_UPDATE_NUMBA_AFTER", -1, -1, 1 << 31))
#: what the switch costs once per process, measured (numba's import and its cached kernel's load)
SWITCH_S = 0.5
_spent = [0.0]  # seconds this process spent in foreach updates that a kernel could have done
_numba: Any = None  # module, or False when numba is unavailable


def _load_numba() -> Any:
    global _numba
    if _numba is None:
        try:
            numba_cache.directory()  # $NUMBA_CACHE_DIR: the user's own folder (runtime/numba_cache.py)
            from . import _target_update_cpu as mod

            _numba = mod
        except Exception as exc:  # numba missing or broken: foreach it is
            _log.debug("target_update: numba unavailable (%r)", exc)
            _numba = False
    return _numba


def _numba_kernel(plan: _Plan) -> Any:
    """(kernel, [(flat source view, flat target view)]) for the plan's ``.data``, or False."""
    tensors = plan.pd + plan.td
    dtype = tensors[0].dtype
    if any(t.device.type != "cpu" or t.dtype != dtype or not t.is_contiguous() for t in tensors):
        return False
    mod = _load_numba()
    if not mod:
        return False
    fn = mod.soft32 if dtype == torch.float32 else mod.soft64
    try:  # compile (or load from numba's disk cache) now, on empty arrays: no data is touched
        empty = torch.empty(0, dtype=dtype).numpy()
        fn(empty, empty.copy(), 0.5, 0.5)
    except Exception as exc:  # pragma: no cover - a numba/llvm failure: foreach it is
        _log.debug("target_update: numba kernel not compiled (%r)", exc)
        return False
    pairs = [(p.numpy().reshape(-1), t.numpy().reshape(-1)) for p, t in zip(plan.pd, plan.td)]
    return fn, pairs


def _numba_update(plan: _Plan, a: Any, b: Any) -> Optional[bool]:
    """``t = b * t + a * p`` for every pair in one compiled pass, once the plan has earned it:
    True when done, None when the caller's foreach update is to be timed toward the switch."""
    if NUMBA_AFTER is not None and NUMBA_AFTER < 0:
        return False
    plan.calls += 1
    if plan.kernel is None:
        if NUMBA_AFTER is None:
            if not _numba and _spent[0] < SWITCH_S:  # numba loaded: no switch left to pay for
                return None
        elif plan.calls <= NUMBA_AFTER:
            return False
        plan.kernel = _numba_kernel(plan)
    if not plan.kernel:
        return False
    fn, pairs = plan.kernel
    if (type(a) is int and abs(a) > 2**24) or (type(b) is int and abs(b) > 2**24):
        return False  # torch rounds a huge int to float32 once; float() then float32 would twice
    a, b = float(a), float(b)  # one compiled signature (small ints convert exactly)
    for p, t in pairs:
        fn(p, t, a, b)
    return True


def _plan_for(src: Any, tgt: Any, data: bool) -> Optional[_Plan]:
    if not data and torch.is_grad_enabled():  # the original in-place update of a leaf would raise: let it
        return none("an in-place update of parameters outside torch.no_grad() (the loop raises)")
    return _plan(src, tgt)


def soft_update(src: Any, tgt: Any, a: Any, b: Any, data: bool = True, replace: bool = False) -> bool:
    """``for p, tp in zip(src.parameters(), tgt.parameters()): tp.copy_(a * p + b * tp)``; with
    ``replace``, ``tp.data = a * p.data + b * tp.data`` (see :func:`_soft_replace`)."""
    if not (_scalar(a) and _scalar(b)):
        return no(_COEFFICIENT)
    plan = _plan_for(src, tgt, data)
    if plan is None:
        return False  # (the reason is noted)
    if replace:
        return _soft_replace(plan, a, b)
    ps, ts = (plan.pd, plan.td) if data else (plan.ps, plan.ts)
    if not ps:
        return True
    done = _numba_update(plan, a, b) if data and plan.fast else False
    if done:
        return True
    if plan.fast:
        began = _clock() if done is None else 0.0
        scaled = torch._foreach_mul(ps, a)
        torch._foreach_mul_(ts, b)
        torch._foreach_add_(ts, scaled)
        if done is None:
            _spent[0] += _clock() - began
    else:
        scaled = torch._foreach_mul(ps, a)
        other = torch._foreach_mul(ts, b)
        torch._foreach_add_(other, scaled)
        torch._foreach_copy_(ts, other)
    return True


def _soft_replace(plan: _Plan, a: Any, b: Any) -> bool:
    """``tp.data = a * p.data + b * tp.data`` for every pair: the loop stores a new tensor in each
    target parameter (views of the old storage keep the old values), so this computes every new
    tensor out of place (the same multiplies and add; the add's operands may be swapped, which
    IEEE addition does not see) and stores each one through the same ``.data`` setter. All pairs
    are computed before any is stored, the same as the loop where no tensor of one pair is a
    tensor of another (the plan checks that). The plan's ``.data`` aliases then follow the new
    tensors, and a compiled kernel, which holds views of the old ones, is dropped."""
    if plan.ps:
        new = torch._foreach_add(torch._foreach_mul(plan.td, b), torch._foreach_mul(plan.pd, a))
        for t, n in zip(plan.ts, new):
            t.data = n
        plan.pd = [p.data for p in plan.ps]
        plan.td = [t.data for t in plan.ts]
        both = plan.ps + plan.ts
        plan.ptrs = [t.data_ptr() for t in both]
        if plan.kernel:
            plan.kernel = None
    return True


def scale_add(src: Any, tgt: Any, b: Any, a: Any, data: bool = True) -> bool:
    """``for p, tp in zip(...): tp.mul_(b); tp.add_(a * p)`` (in that order)."""
    if not (_scalar(a) and _scalar(b)):
        return no(_COEFFICIENT)
    plan = _plan_for(src, tgt, data)
    if plan is None:
        return False  # (the reason is noted)
    ps, ts = (plan.pd, plan.td) if data else (plan.ps, plan.ts)
    if not ps:
        return True
    done = _numba_update(plan, a, b) if data and plan.fast else False  # same rounding: b*t, a*p, add
    if done:
        return True
    if plan.fast:
        began = _clock() if done is None else 0.0
        torch._foreach_mul_(ts, b)
        torch._foreach_add_(ts, torch._foreach_mul(ps, a))
        if done is None:
            _spent[0] += _clock() - began
    else:
        scaled = torch._foreach_mul(ts, b)
        torch._foreach_add_(scaled, torch._foreach_mul(ps, a))
        torch._foreach_copy_(ts, scaled)
    return True


def scale_add_alpha(src: Any, tgt: Any, b: Any, a: Any, data: bool = True) -> bool:
    """``for p, tp in zip(...): tp.mul_(b); tp.add_(p, alpha=a)``."""
    if not (_scalar(a) and _scalar(b)):
        return no(_COEFFICIENT)
    plan = _plan_for(src, tgt, data)
    if plan is None:
        return False  # (the reason is noted)
    ps, ts = (plan.pd, plan.td) if data else (plan.ps, plan.ts)
    if not ps:
        return True
    if plan.fast:
        torch._foreach_mul_(ts, b)
        torch._foreach_add_(ts, ps, alpha=a)
    else:
        scaled = torch._foreach_mul(ts, b)
        torch._foreach_add_(scaled, ps, alpha=a)
        torch._foreach_copy_(ts, scaled)
    return True


def lerp_update(src: Any, tgt: Any, w: Any, data: bool = True) -> bool:
    """``for p, tp in zip(...): tp.lerp_(p, w)``."""
    if not _scalar(w):
        return no(_COEFFICIENT)
    plan = _plan_for(src, tgt, data)
    if plan is None:
        return False  # (the reason is noted)
    ps, ts = (plan.pd, plan.td) if data else (plan.ps, plan.ts)
    if ps:
        torch._foreach_lerp_(ts, ps, w)
    return True


def hard_update(src: Any, tgt: Any, data: bool = True) -> bool:
    """``for p, tp in zip(...): tp.copy_(p)``."""
    plan = _plan_for(src, tgt, data)
    if plan is None:
        return False  # (the reason is noted)
    ps, ts = (plan.pd, plan.td) if data else (plan.ps, plan.ts)
    if ps:
        torch._foreach_copy_(ts, ps)
    return True
