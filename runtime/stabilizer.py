"""The gradient guard the ``grad_clip`` transform inserts before each optimizer ``step()``.

``stabilize(optimizer)`` measures the total gradient norm of the optimizer's parameters, records
it (``scalebox/grad_norm``: the maximum over each window of ``RECORD_EVERY`` steps; the first
guarded optimizer's, others as ``scalebox/grad_norm/<site>``; after the code's own clip,
``spike=False``, the norm it measures is the clipped one: ``scalebox/grad_norm_clipped``, while
telemetry records what the code's ``clip_grad_norm_`` returned as ``scalebox/grad_norm_preclip``)
and, only when the step is unhealthy, intervenes:

- a non-finite norm (NaN/inf in some gradient): the optimizer step is skipped, as ``GradScaler``
  skips it, instead of writing NaN into the weights (event ``step_skipped``, first one also
  ``nonfinite`` naming the parameters);
- a spike, a norm above ``max(mean + z * std, ratio * mean)`` of its own history (an
  exponentially weighted mean and variance, ZClip's estimator; OLMo-core's skip-step optimizer uses
  the same 6-sigma rule): by default (``spike="report"``) an event (``spike_seen``) the hot-fix
  policy counts, the step runs as written (healthy RL gradients are heavy-tailed: see
  docs/stabilization.md); with ``spike="clip"`` the gradients are scaled down to that threshold
  (``spike_clipped``). Either way the history is fed the threshold, not the spike.

Otherwise nothing is written: the gradients, the optimizer and its state are the code's own,
so a run with no non-finite value (and, with ``spike="clip"``, no spike) is bitwise identical to the unguarded one
(exactness ``exact-until-intervention``). ``max_norm=X`` turns it into the fixed clip
(``clip_grad_norm_`` semantics, bit for bit) that also skips non-finite steps: what hot-fix
branches use.

Where it decides:
- CPU gradients: on the host (``.item()`` on a CPU tensor is no device synchronisation). A skip
  sets the parameters' ``.grad`` to None for the duration of ``step()`` (torch optimizers leave
  such parameters and their state alone) and a step post-hook puts them back afterwards. The
  healthy step, which every training step pays, is one call into the optional C helper
  ``_gradnorm_c`` where it is built (it reads plain contiguous float32/float64 gradients, sums
  their squares in double, updates the history with this module's arithmetic; each torch op
  between ``backward()`` and ``step()`` costs 1-2% of a small MLP's step). Without it, or for
  gradients it does not read (sparse, strided, other dtypes), ``torch._foreach_norm`` measures.
- CUDA/NPU gradients: on the device, no host synchronisation per step. The spike factor
  ``min(1, thr / norm)`` is a device tensor multiplied into the gradients (``* 1.0`` is bitwise
  the identity). A non-finite step is skipped through ``optimizer.found_inf`` where the optimizer
  takes it (fused Adam/AdamW/SGD, ``_step_supports_amp_scaling``: the kernel skips the update and
  restores the step count, as under ``GradScaler``; fused SGD's unwritten first momentum buffers
  are dropped after it: ``fused_optimizer.unset_momentum``); other optimizers get the step
  (weights may go non-finite), the event reported at the next flush, which the hot-fix policy
  acts on (its branch: ``sync=True``, a true skip on any optimizer). Under AMP (``scaler=``)
  ``GradScaler`` skips non-finite steps; the guard only measures and clips spikes.
Events cross to the host in batches (every ``FLUSH_EVERY`` steps and at exit; ``guard_events``).
"""
from __future__ import annotations

import atexit
import math
import os
import sys
import threading
import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch

from scalebox_cst.options import default as _default
from scalebox_cst.runtime import metrics
from scalebox_cst.runtime.fused_optimizer import forget_unwritten_momentum, unset_momentum
from scalebox_cst.runtime.grad_norms import host_norm, total_norm
from scalebox_cst.runtime.guard_events import EVENTS_ENV, events, report_nonfinite  # noqa: F401 (stabilizer.EVENTS_ENV, read by tests)

METRIC = "grad_norm"
#: the guard's series after the code's own clip (``spike=False``): the norm of clipped gradients
CLIPPED = "grad_norm_clipped"
LOCATE_ENV = "SCALEBOX_LOCATE_NAN"  # "SITE@STEP": arm the NaN locator for that guard call
FLUSH_EVERY = 64
#: grad_norm is recorded as the maximum over each window of this many guarded steps (a NaN/inf in
#: the window shows): one JSON point per step cost more than the norm itself on a small model
RECORD_EVERY = 8

# the spike test's defaults: the option schema's (healthy CartPole PPO: 19x its EW mean, z 22, in 20k steps)
Z, RATIO, WARMUP = (_default("grad_clip", key) for key in ("z", "ratio", "warmup"))
ALPHA = 0.97

_NONE, _CLIPPED, _SKIPPED, _SEEN = 0, 1, 2, 3
#: ``spike=``: report (default), clip (True: the older spelling), or no spike test (False: after the code's clip)
SPIKE_MODES = ("report", "clip", True, False)


# --------------------------------------------------------------------------- the C helper

C_VERSION = 2  # the contract of _gradnorm_c this module was written for


def _load_c() -> Any:
    """The optional C helper (runtime/_gradnorm_c.c, built at install), None without a build or
    with one of another contract version: torch measures and Python keeps the history then."""
    try:
        from scalebox_cst.runtime import _gradnorm_c as mod
    except ImportError:
        return None
    if getattr(mod, "VERSION", None) != C_VERSION:
        return None
    return mod  # configured at the end of this module, once _known and _window exist


_c = _load_c()
_c_sumsq = _c.sumsq if _c is not None else None
_c_step = _c.step if _c is not None else None
_fast = None  # _c.fast once configured (not while the NaN locator is armed)
_TENSOR = torch.Tensor


# --------------------------------------------------------------------------- per-optimizer state


class _Guard(_c.State if _c is not None else object):
    """History and cached parameter list of one optimizer at one site (with the C helper, its
    numbers and the cached list are members of the C base, which ``_c_step`` updates)."""

    def __init__(self, site: str, index: int, metric: str) -> None:
        self.site = site
        self.index = index  # which optimizer at this site, for messages
        self.metric = metric
        self.key: Optional[Tuple] = None
        self.params: List[torch.Tensor] = []
        self.uniform = True  # one device and dtype (a gradient has its parameter's): one foreach call
        self.on_cpu = True
        self.calls = 0
        # host history (CPU path)
        self.count = 0
        self.mean = 0.0
        self.var = 0.0
        # device history (device path): created on first use
        self.dev: Optional[Dict[str, torch.Tensor]] = None
        self.pending: List[Tuple[int, torch.Tensor, torch.Tensor]] = []
        self.wmax = -math.inf  # host window of grad norms (see RECORD_EVERY)
        self.wn = 0
        self.stash: Optional[List[Tuple[torch.Tensor, torch.Tensor]]] = None
        self.hooked = False
        self.no_skip = False  # device path, optimizer without found_inf: non-finite steps run
        self.unset: List[torch.Tensor] = []  # fused SGD's parameters without momentum buffers (fused_optimizer)
        self.reported_nonfinite = False
        self.interventions = 0
        self.owner: Any = None  # () -> the optimizer, or None once it is gone (set by _guard_for)
        self.ref: Any = None  # the same for _c_step: a weak reference, or the optimizer itself
        # the C reader's dtype argument (see _gradnorm_c.c), None: torch measures (no build, other
        # devices or dtypes, or a gradient it could not read)
        self.c_dtype: Optional[torch.dtype] = None
        self.c_double = False

    def refresh(self, groups: Any) -> Optional[List[torch.Tensor]]:
        """The distinct parameters of the groups, rebuilt only when the groups change: another
        group (``add_param_group``), a group's ``params`` list replaced or grown/shrunk. The
        parameters are cached, never their gradients (``zero_grad()`` makes new ones)."""
        key = self.key
        try:
            if key is not None:  # the common case: the same lists
                if len(key) == 1 and len(groups) == 1:
                    current = groups[0]["params"]
                    plist, n = key[0]
                    if current is plist and len(current) == n:
                        return self.params
                elif len(key) == len(groups):
                    for g, (plist, n) in zip(groups, key):
                        current = g["params"]
                        if current is not plist or len(current) != n:
                            break
                    else:
                        return self.params
            key = tuple((g["params"], len(g["params"])) for g in groups)
        except (TypeError, KeyError):
            return None
        seen, params = set(), []
        for g in groups:
            for p in g["params"]:
                if isinstance(p, torch.Tensor) and id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
        self.key, self.params = key, params
        self.facts()
        return self.params

    def facts(self) -> None:
        """Device and dtype facts of the parameters: which path measures the norm."""
        params = self.params
        first = params[0] if params else None
        self.uniform = all(p.device == first.device and p.dtype == first.dtype for p in params)
        self.on_cpu = decides_on_host(params)
        dtype = first.dtype if first is not None else None
        ok = _c_sumsq is not None and self.uniform and self.on_cpu and dtype in (torch.float32, torch.float64)
        self.c_dtype = dtype if ok else None
        self.c_double = dtype is torch.float64


def decides_on_host(params: List[torch.Tensor]) -> bool:
    """Whether the guard decides on the host: CPU parameters (reading a CPU scalar is no sync)."""
    return all(p.device.type == "cpu" for p in params)


_guards: "weakref.WeakKeyDictionary[Any, Dict[str, _Guard]]" = weakref.WeakKeyDictionary()
_by_id: Dict[int, Dict[str, _Guard]] = {}  # optimizers that cannot be weakly referenced
_lock = threading.Lock()
_warned: set = set()
#: the first guarded optimizer records ``scalebox/grad_norm`` (what `scalebox log` shows); each
#: other one ``scalebox/grad_norm/<site>`` (several optimizers never share one series); guards
#: after the code's own clip the same with ``grad_norm_clipped``
_metric_names: set = set()


def _guard_for(optimizer: Any, site: str, clipped: bool = False) -> _Guard:
    try:
        table = _guards.get(optimizer)
        if table is None:
            table = _guards.setdefault(optimizer, {})
    except TypeError:
        table = _by_id.setdefault(id(optimizer), {})
    guard = table.get(site)
    if guard is None:
        with _lock:
            base = metrics.engine(CLIPPED if clipped else METRIC)
            taken = any(n.startswith(base) and n[len(base):len(base) + 1] in ("", "/") for n in _metric_names)
            metric = base if not taken else f"{base}/{site}#{len(table)}" if table else f"{base}/{site}"
            if metric in _metric_names:
                metric = f"{metric}@{len(_metric_names)}"
            _metric_names.add(metric)
        guard = table[site] = _Guard(site, len(table), metric)
    if guard.owner is None:
        key = (id(optimizer), site)
        try:
            guard.owner = guard.ref = weakref.ref(optimizer, lambda _, key=key, guard=guard: _known.pop(key, None) if _known.get(key) is guard else None)
        except TypeError:  # kept alive, as in _by_id
            guard.owner, guard.ref = (lambda: optimizer), optimizer
        _known[key] = guard
    return guard


#: (id(optimizer), site) -> its guard: the per-call lookup (a WeakKeyDictionary lookup makes a
#: weak reference each call); guard.owner() is checked, an entry leaves when its optimizer dies
_known: Dict[Tuple[int, str], _Guard] = {}


def _warn_once(what: str) -> None:
    if what not in _warned:
        _warned.add(what)
        print(f"scalebox: {what}", file=sys.stderr)


# --------------------------------------------------------------------------- norms (the guard's; grad_norms holds the plain ones)


def _host_value(guard: _Guard, params: List[torch.Tensor], grads: List[torch.Tensor]) -> float:
    """The total 2-norm as a float on the host: the C reader where it can, else ``host_norm``."""
    if guard.c_dtype is not None:
        s = _c_sumsq(params, _TENSOR, guard.c_dtype, guard.c_double)
        if s is not None and s >= 0.0:
            return math.sqrt(s)
        if s is None:
            _c_refused(guard)
    return host_norm(grads, guard.uniform)


def _c_refused(guard: _Guard) -> None:
    """A gradient the C reader does not read (sparse, strided, another dtype through grad_dtype,
    a parameter moved by ``p.data = ...``): torch measures from now on, with fresh facts."""
    guard.facts()
    guard.c_dtype = None


def _threshold(mean: float, var: float, z: float, ratio: float) -> float:
    return max(mean + z * math.sqrt(max(var, 0.0)), ratio * mean)


def _update(guard: _Guard, x: float) -> None:
    """Exponentially weighted mean/variance; plain running mean over the first 1/(1-alpha) steps."""
    w = max(1.0 - ALPHA, 1.0 / (guard.count + 1))
    delta = x - guard.mean
    guard.mean += w * delta
    guard.var = (1.0 - w) * (guard.var + w * delta * delta)
    guard.count += 1


# --------------------------------------------------------------------------- the guard


def stabilize(
    optimizer: Any,
    *,
    site: str = "",
    scaler: Any = None,
    spike: Any = "report",
    max_norm: Optional[float] = None,
    sync: bool = False,
    z: float = Z,
    ratio: float = RATIO,
    warmup: int = WARMUP,
) -> Optional[torch.Tensor]:
    """Guard ``optimizer``'s next ``step()`` (see the module docstring); returns the total norm.

    ``site``: ``path:line`` of the step, for events. ``scaler``: the ``GradScaler`` whose
    ``step`` follows (it skips non-finite steps itself). ``spike``: ``"report"`` (a spike is an
    event, the step runs as written), ``"clip"`` or True (scaled to the threshold), False (no
    spike test: the code clips on its own). ``max_norm``: fixed clip instead of spike detection.
    ``sync=True``: decide on the host on every backend (a true skip for any optimizer).
    Returns the norm as a float where the host decided, as a 0-d tensor on the device path and
    with ``max_norm`` (then bitwise ``clip_grad_norm_``'s); None without gradients.
    """
    # The healthy CPU step, in as few calls as possible (every training step pays this; the
    # arithmetic is _host_step's): one C call (lookup, owner, groups, norm, history, window) where
    # the helper is built. An intervening step goes on to the general path below; the rare steps
    # that intervene pay the rest.
    if max_norm is None and _fast is not None:
        value = _fast(optimizer, site, spike, z, ratio, warmup)
        if value is not None:
            return value
    guard = _known.get((id(optimizer), site))
    if guard is not None and max_norm is None and _locator is None and guard.c_dtype is None and guard.owner() is optimizer:
        # no C helper (or gradients it does not read): torch measures, Python keeps the history
        params = guard.refresh(getattr(optimizer, "param_groups", None))
        if params is not None and guard.on_cpu and guard.uniform and guard.c_dtype is None:
            grads = [p.grad for p in params if p.grad is not None]
            if not grads:
                guard.calls += 1
                return None
            value = host_norm(grads, True)
            if value < math.inf and not (spike and guard.count >= warmup and value > _threshold(guard.mean, guard.var, z, ratio)):
                guard.calls += 1
                if guard.wn == 0:
                    _active.add(guard)
                if guard.wmax == guard.wmax and not value <= guard.wmax:
                    guard.wmax = value
                guard.wn += 1
                if guard.wn >= RECORD_EVERY:
                    _record(guard, guard.calls, guard.wmax)
                    guard.wmax, guard.wn = -math.inf, 0
                # _update, inlined
                count = guard.count
                w = max(1.0 - ALPHA, 1.0 / (count + 1))
                delta = value - guard.mean
                guard.mean += w * delta
                guard.var = (1.0 - w) * (guard.var + w * delta * delta)
                guard.count = count + 1
                return value
            # non-finite or a spike: act on it, on the value measured here
            guard.calls += 1
            _host_step(optimizer, guard, params, grads, value, value, scaler, spike, max_norm, z, ratio, warmup)
            return value
    return _general(optimizer, site, scaler, spike, max_norm, sync, z, ratio, warmup)


def _general(optimizer, site, scaler, spike, max_norm, sync, z, ratio, warmup) -> Any:
    """Every other case: the first call, the device path, ``max_norm``, the NaN locator, a
    gradient the C reader refused."""
    if spike not in SPIKE_MODES:
        raise ValueError(f"stabilize(spike={spike!r}): expected one of 'report', 'clip', True, False")
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        _warn_once(f"{type(optimizer).__qualname__} has no param_groups; the inserted gradient guard does nothing for it")
        return None
    # spike=False without max_norm: the guard follows the code's own clip (grad_clip.guard)
    guard = _guard_for(optimizer, site, clipped=not spike and max_norm is None)
    params = guard.refresh(groups)
    if params is None:
        _warn_once(f"{type(optimizer).__qualname__}.param_groups is not readable; the gradient guard does nothing for it")
        return None
    grads = [p.grad for p in params if p.grad is not None]
    guard.calls += 1
    if not grads:
        return None
    if _locator is not None:
        _locator.before_step(guard)
    if (guard.on_cpu or sync) and max_norm is None:
        # .item() of a CPU tensor; with sync=True the one deliberate sync
        value = _host_value(guard, params, grads) if guard.on_cpu else host_norm(grads, guard.uniform)
        norm: Any = value
    else:
        norm = total_norm(grads, guard.uniform, wide=max_norm is None)  # a decision: see its ``wide``
        value = norm.item() if guard.on_cpu or sync else None
    if value is not None:
        _host_step(optimizer, guard, params, grads, norm, value, scaler, spike, max_norm, z, ratio, warmup)
    else:
        _device_step(optimizer, guard, grads, norm, scaler, spike, max_norm, z, ratio, warmup)
    if _locator is not None:
        _locator.after_guard(guard, value if value is not None else norm)
    return norm


def _window(guard: _Guard) -> None:
    """After _c_step: a window's first step (flush() owes its partial maximum) or its last."""
    if guard.wn == 1:
        _active.add(guard)
    if guard.wn >= RECORD_EVERY:
        _record(guard, guard.calls, guard.wmax)
        guard.wmax, guard.wn = -math.inf, 0


def _record(guard: _Guard, step: int, value: Any) -> None:
    try:
        metrics.record(guard.metric, value, step)
    except TypeError:  # a metrics module that counts steps itself
        metrics.record(guard.metric, value)


def _host_step(optimizer, guard, params, grads, norm, value, scaler, spike, max_norm, z, ratio, warmup) -> None:
    if guard.wn == 0:
        _active.add(guard)
    if guard.wmax == guard.wmax and not value <= guard.wmax:  # the window's maximum; NaN stays once seen
        guard.wmax = value
    guard.wn += 1
    if guard.wn >= RECORD_EVERY:
        _record(guard, guard.calls, guard.wmax)
        guard.wmax, guard.wn = -math.inf, 0
    step = guard.calls
    if not math.isfinite(value):
        if scaler is not None:
            return  # GradScaler skips this step itself and lowers its scale: AMP's normal overflow
        report_nonfinite(guard, step, value, [p for p in params if p.grad is not None])
        _skip(optimizer, guard, params)
        return
    if max_norm is not None:  # clip_grad_norm_'s arithmetic, bit for bit
        torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return
    if spike and guard.count >= warmup:
        thr = _threshold(guard.mean, guard.var, z, ratio)
        if value > thr:
            if spike == "report":
                events.emit("spike_seen", f"grad norm {value:.4g} above {thr:.4g} ({value / max(guard.mean, 1e-300):.3g}x its mean) "
                            f"at {guard.site} step {step}, left as is", site=guard.site, step=step, value=value, threshold=thr)
                _update(guard, thr)
                return
            torch._foreach_mul_(grads, thr / value)
            guard.interventions += 1
            events.emit("spike_clipped", f"grad norm {value:.4g} clipped to {thr:.4g} at {guard.site} step {step}",
                        site=guard.site, step=step, value=value, threshold=thr)
            _update(guard, thr)
            return
    _update(guard, value)


def _device_step(optimizer, guard, grads, norm, scaler, spike, max_norm, z, ratio, warmup) -> None:
    dev = guard.dev
    if dev is None:
        f = lambda v: torch.tensor(v, dtype=torch.float32, device=norm.device)  # noqa: E731
        dev = guard.dev = {"mean": f(0.0), "var": f(0.0), "count": f(0.0), "one": f(1.0), "wmax": f(-math.inf)}
    x = norm.float()
    torch.maximum(dev["wmax"], x, out=dev["wmax"])
    guard.wn += 1
    if guard.wn >= RECORD_EVERY:
        _record(guard, guard.calls, dev["wmax"].clone())
        dev["wmax"].fill_(-math.inf)
        guard.wn = 0
    finite = torch.isfinite(x)
    coef: Optional[torch.Tensor]
    if max_norm is not None:
        clip = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        coef, code = clip, torch.where(finite, (clip < 1.0).float() * _CLIPPED, torch.full_like(x, _SKIPPED))
    else:
        mean, var, count = dev["mean"], dev["var"], dev["count"]
        thr = torch.maximum(mean + z * var.clamp(min=0).sqrt(), ratio * mean)
        hit = finite & (count >= warmup) & (x > thr) if spike else torch.zeros_like(finite)
        report = spike == "report"
        coef = None if report else torch.where(hit, thr / x, dev["one"])
        code = torch.where(finite, hit.float() * (_SEEN if report else _CLIPPED), torch.full_like(x, _SKIPPED))
        # history: the clipped value for a spike, nothing for a non-finite step
        fed = torch.where(hit, thr, x)
        w = torch.clamp(1.0 / (count + 1.0), min=1.0 - ALPHA)
        delta = torch.where(finite, fed - mean, torch.zeros_like(x))
        w = torch.where(finite, w, torch.zeros_like(w))
        mean.add_(w * delta)
        var.copy_((1.0 - w) * (var + w * delta * delta))
        count.add_(finite.float())
    if coef is not None:
        torch._foreach_mul_(grads, coef)
    if scaler is not None:
        code = torch.where(finite, code, torch.zeros_like(code))  # GradScaler skips and rescales itself
    elif getattr(optimizer, "_step_supports_amp_scaling", False):
        optimizer.found_inf = (~finite).float()  # the fused kernel skips the update on device
        optimizer.grad_scale = None
        guard.unset = unset_momentum(optimizer)
        _ensure_hook(optimizer, guard)
    else:
        guard.no_skip = True
    guard.pending.append((guard.calls, code, x))
    _active.add(guard)
    if len(guard.pending) >= FLUSH_EVERY:
        _flush_guard(guard)


def _flush_guard(guard: _Guard) -> None:
    """One host transfer for the batch of per-step decisions; events for those that intervened."""
    batch, guard.pending = guard.pending, []
    if not batch:
        return
    values = torch.stack([torch.stack([c.float(), x.float()]) for _, c, x in batch]).cpu().tolist()
    skips_real = not guard.no_skip
    for (step, _, _), (code, value) in zip(batch, values):
        if code == _CLIPPED:
            guard.interventions += 1
            events.emit("spike_clipped", f"grad norm {value:.4g} clipped at {guard.site} step {step}",
                        site=guard.site, step=step, value=value)
        elif code == _SEEN:
            events.emit("spike_seen", f"grad norm {value:.4g} above its history's threshold at {guard.site} step {step}, "
                        "left as is", site=guard.site, step=step, value=value)
        elif code == _SKIPPED:
            if not guard.reported_nonfinite:
                guard.reported_nonfinite = True
                msg = f"non-finite gradient norm {value} at {guard.site} step {step}"
                print(f"scalebox: {msg}", file=sys.stderr)
                events.emit("nonfinite", msg, site=guard.site, step=step, value=str(value), what="grad_norm")
            guard.interventions += 1
            events.emit("step_skipped" if skips_real else "guard_intervened",
                        f"{'optimizer step skipped' if skips_real else 'non-finite step NOT skipped (optimizer has no found_inf)'}"
                        f" at {guard.site} step {step}", site=guard.site, step=step, skipped=skips_real)


#: guards with pending device steps or a partial host window (strong: a guard whose optimizer is
#: gone still owes its events; flush() empties it)
_active: set = set()


def flush() -> None:
    """Events of pending device steps, and each host window's partial maximum (at exit)."""
    for guard in list(_active):
        _active.discard(guard)
        _flush_guard(guard)
        if guard.wn:
            _record(guard, guard.calls, guard.wmax if guard.dev is None else guard.dev["wmax"].clone())
            guard.wmax, guard.wn = -math.inf, 0
            if guard.dev is not None:
                guard.dev["wmax"].fill_(-math.inf)


atexit.register(flush)


# --------------------------------------------------------------------------- skipping


def _ensure_hook(optimizer: Any, guard: _Guard) -> None:
    if guard.hooked:
        return
    register = getattr(optimizer, "register_step_post_hook", None)
    if register is None:
        return
    ref = weakref.ref(guard)

    def after_step(opt: Any, args: Any, kwargs: Any) -> None:
        g = ref()
        if g is None:
            return
        if g.stash is not None:
            for p, grad in g.stash:
                if p.grad is None:
                    p.grad = grad
            g.stash = None
        if "found_inf" in opt.__dict__:
            g.unset = forget_unwritten_momentum(opt, g.unset, opt.found_inf)
            del opt.found_inf
            opt.__dict__.pop("grad_scale", None)

    register(after_step)
    guard.hooked = True


def _skip(optimizer: Any, guard: _Guard, params: List[torch.Tensor]) -> None:
    """Make the coming ``step()`` leave every parameter and its state alone (grads back after it)."""
    _ensure_hook(optimizer, guard)
    guard.stash = [(p, p.grad) for p in params if p.grad is not None]
    for p, _ in guard.stash:
        p.grad = None
    if not guard.hooked:
        _warn_once(f"{type(optimizer).__qualname__} has no register_step_post_hook: gradients of skipped steps stay None")
    guard.interventions += 1
    events.emit("step_skipped", f"optimizer step skipped at {guard.site} step {guard.calls} (non-finite gradient)",
                site=guard.site, step=guard.calls, skipped=True)


def reset() -> None:
    """Forget every guard's history (tests)."""
    _guards.clear()
    _by_id.clear()
    _known.clear()
    _active.clear()
    _metric_names.clear()
    events.counts.clear()
    events.memory.clear()


# --------------------------------------------------------------------------- NaN locating

_locator = None


def _install_locator() -> None:
    global _locator
    spec = os.environ.get(LOCATE_ENV)
    if not spec:
        return
    from scalebox_cst.runtime.nan_locate import Locator

    _locator = Locator.from_spec(spec)


_install_locator()
if _c is not None:
    _c.configure(torch.Tensor, ALPHA, _known, _window, RECORD_EVERY)
    if _locator is None:
        _fast = _c.fast
