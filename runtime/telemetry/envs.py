"""Episode return and length of every gymnasium / gym environment a script steps, observed only.

Nothing the script can see changes: no wrapper object (``type``, ``isinstance``, ``unwrapped``,
``spec`` are the script's), no key added to ``info``, no value altered. Instead the ``step`` and
``reset`` functions of the environment classes are replaced, at class level, by functions that
call the original and then look at what it returned (``functools.wraps`` keeps name, docstring
and signature). Env and vector env classes that exist when gymnasium/gym is imported are patched
then, classes defined later (the user's, lazily imported env modules) through
``__init_subclass__``; wrapper classes only once ``make`` returns one (each patched layer costs a
frame per step: a ``make`` chain TimeLimit > OrderEnforcing > PassiveEnvChecker > CartPoleEnv has
two patched, not four).

Which object's steps count, per call chain (several patched layers call each other):
- the object ``gymnasium.make`` / ``gym.make`` returned, else a non-wrapper env (one built
  directly), but never one called inside a counted call: ``RecordEpisodeStatistics(make(..))``
  counts once, at ``make``'s level (the raw env return, as CleanRL records it; wrappers the user
  adds outside, reward normalisation, life-loss episodes, do not change it); the base env of a
  made one, reached by ``.unwrapped`` and stepped there (to drop the time limit), counts as built
  directly;
- a vector env counts its sub-envs itself (per index, with gymnasium 1.x's next-step / same-step
  / disabled autoreset and the same-step autoreset of gymnasium 0.29 and gym) unless its first
  step is seen to step counted envs inside (``SyncVectorEnv`` of ``make`` envs: those count);
- a directly built env under a time limit wrapper of a class ``make`` has returned (TimeLimit):
  the episode also ends when that wrapper says truncated (a ``make`` env's episodes end only where
  it says so). Under a wrapper class never patched, a truncated episode is dropped at the reset.
Partial episodes ended by ``reset`` are dropped, as RecordEpisodeStatistics drops them.

Points: ``scalebox/episodic_return`` and ``scalebox/episodic_length`` at step = env steps so
far, counted over all envs (a next-step autoreset step is not a transition and does not count).
Rewards on an accelerator (a tensor not on the CPU) are not read (that would be a device sync per
step): such an env is reported once on stderr and not counted.

Child processes of the run (``multiprocessing`` workers, forked or spawned: SB3's
``SubprocVecEnv``, a custom ``ParallelEnv``, a bare ``Process`` stepping an env) count the envs
they step themselves, under ``scalebox/workers/<id>/episodic_return`` (``metrics.engine``), x =
that worker's env steps. The workers of gymnasium's / gym's own ``AsyncVectorEnv`` do not: their
parent counts through the vector env (an env first seen inside their worker function is left out).
"""
from __future__ import annotations

import functools
import os
import sys
import threading
import types
import weakref
from typing import Any, Dict, List, Optional, Set

from scalebox_cst.runtime import metrics

RETURN, LENGTH = "episodic_return", "episodic_length"

#: env steps counted so far, over every env (the x of the episode points and of SPS)
env_steps = 0

_on = True
_single: List[type] = []  # gymnasium.Env, gym.Env
_wrappers: List[type] = []
_vectors: List[type] = []
_old_vectors: List[type] = []  # vector base classes that use same-step autoreset by default
_made: Set[int] = set()
_recs: Dict[int, "_Rec"] = {}
_warned: Set[str] = set()
_MARK = "_scalebox_observed"
_child = False  # this process is a child of the run (see in_worker / _forked)
#: the worker functions of gymnasium's / gym's AsyncVectorEnv (their parent counts those envs)
_VECTOR_WORKERS = {"_async_worker", "_worker", "_worker_shared_memory"}


class _Thread:
    """Call-chain state of one thread (a plain object: attribute access on a threading.local
    costs several times more, and a step touches these five or six times)."""

    __slots__ = ("active", "vactive", "inner", "base", "making")

    def __init__(self) -> None:
        self.active = 0  # counted single-env calls running on this thread
        self.vactive = 0  # counted vector-env calls running on this thread
        self.inner = 0  # counted single-env calls finished on this thread (vector delegation test)
        self.base: Optional["_Rec"] = None  # the directly built env a wrapper call reached
        self.making = 0  # inside gymnasium.make / gym.make: what it builds is made, not direct


_states: Dict[int, _Thread] = {}
_ident = threading.get_ident


def _state() -> _Thread:
    key = _ident()
    t = _states.get(key)
    if t is None:
        t = _states[key] = _Thread()
    return t


class _Rec:
    """Per env object: whether it counts and its running episode."""

    __slots__ = ("counts", "vector", "made", "ret", "length", "prev_done", "same_step", "__weakref__")

    def __init__(self, env: Any) -> None:
        self.made = id(env) in _made
        self.vector = isinstance(env, tuple(_vectors))
        wrapper = isinstance(env, tuple(_wrappers))
        self.counts = (self.made or not wrapper) and not (_child and _in_vector_worker())
        self.ret: Any = 0.0
        self.length: Any = 0
        self.prev_done: Any = None
        self.same_step = False
        if self.vector:
            self.same_step = _same_step(env)


def _rec(env: Any) -> _Rec:
    key = id(env)
    rec = _recs.get(key)
    if rec is None:
        rec = _recs[key] = _Rec(env)
        try:
            weakref.finalize(env, _recs.pop, key, None)
        except TypeError:  # not weak-referenceable: kept (ids of such objects are rare here)
            pass
    return rec


def _in_vector_worker() -> bool:
    """Whether this call runs inside an AsyncVectorEnv worker function of gymnasium or gym."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in _VECTOR_WORKERS and str(frame.f_globals.get("__name__", "")).startswith(("gymnasium.vector", "gym.vector")):
            return True
        frame = frame.f_back
    return False


def _same_step(env: Any) -> bool:
    meta = getattr(env, "metadata", None) or {}
    mode = meta.get("autoreset_mode") if isinstance(meta, dict) else None
    if mode is None:
        # gymnasium 1.x assumes next-step (as its RecordEpisodeStatistics); 0.29 and gym: same step
        return isinstance(env, tuple(_old_vectors))
    return str(getattr(mode, "value", mode)).replace("_", "").lower() in ("samestep", "disabled")


def _warn(env: Any, why: str) -> None:
    name = type(env).__qualname__
    if name not in _warned:
        _warned.add(name)
        print(f"scalebox: episodes of {name} are not recorded: {why}", file=sys.stderr)


def _on_device(x: Any) -> bool:
    device = getattr(x, "device", None)
    return device is not None and getattr(device, "type", "cpu") != "cpu"


def _emit(ret: float, length: int) -> None:
    metrics.record(metrics.engine(RETURN), float(ret), step=env_steps)
    metrics.record(metrics.engine(LENGTH), int(length), step=env_steps, rare=True)  # both in one write


#: reward / flag types read without further checks (no device behind them)
_HOST = {float, int, bool}


def _reward(reward: Any) -> float:
    """A single env's reward as a float: a number, or a numpy array of one element. Pendulum
    given an action of shape (1, 1) (MrSyee/pg-is-all-you-need's PPO) returns its reward with
    shape (1,), of which numpy 2 refuses ``float()``: no episode of the run was recorded."""
    try:
        return float(reward)
    except TypeError:
        if getattr(reward, "size", None) != 1 or not hasattr(reward, "reshape"):
            raise
        return float(reward.reshape(-1)[0])


def _observe_single(env: Any, rec: _Rec, result: Any) -> bool:
    """Add one transition; True when it ended the episode."""
    global env_steps
    if type(result) is not tuple:
        return False
    if len(result) == 5:
        reward, done, other = result[1], result[2], result[3]
    elif len(result) == 4:
        reward, done, other = result[1], result[2], False
    else:
        return False
    if not (type(reward) in _HOST and type(done) in _HOST and type(other) in _HOST):
        if _on_device(reward) or _on_device(done) or _on_device(other):
            rec.counts = False
            _warn(env, "rewards are on an accelerator")
            return False
    rec.ret += _reward(reward)
    rec.length += 1
    env_steps += 1
    if done or other:
        _emit(rec.ret, rec.length)
        rec.ret, rec.length = 0.0, 0
        return True
    return False


def _observe_vector(env: Any, rec: _Rec, result: Any) -> None:
    global env_steps
    import numpy as np

    if type(result) is not tuple or len(result) not in (4, 5):
        return
    parts = result[1:4] if len(result) == 5 else result[1:3]
    if any(_on_device(p) for p in parts):
        rec.counts = False
        _warn(env, "rewards are on an accelerator")
        return
    rewards = np.asarray(parts[0], dtype=np.float64).reshape(-1)
    done = np.asarray(parts[1], dtype=bool).reshape(-1)
    if len(parts) == 3:
        done = done | np.asarray(parts[2], dtype=bool).reshape(-1)
    n = rewards.shape[0]
    if not isinstance(rec.ret, np.ndarray) or rec.ret.shape[0] != n:
        rec.ret, rec.length, rec.prev_done = np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    if rec.same_step:
        rec.ret += rewards
        rec.length += 1
        env_steps += n
    else:  # the step after an episode's end resets that sub-env: not a transition
        prev = rec.prev_done
        live = ~prev
        rec.ret[prev] = 0.0
        rec.length[prev] = 0
        rec.ret[live] += rewards[live]
        rec.length[live] += 1
        env_steps += int(live.sum())
    if done.any():
        for i in np.flatnonzero(done):
            _emit(rec.ret[i], rec.length[i])
        if rec.same_step:
            rec.ret[done] = 0.0
            rec.length[done] = 0
    rec.prev_done = done


def _observe_reset(env: Any, rec: _Rec, mask: Any) -> None:
    if not rec.vector:
        rec.ret, rec.length = 0.0, 0
        return
    import numpy as np

    if mask is not None and isinstance(rec.ret, np.ndarray):
        mask = np.asarray(mask, dtype=bool).reshape(-1)
        if mask.shape == rec.ret.shape:
            rec.ret[mask] = 0.0
            rec.length[mask] = 0
            rec.prev_done[mask] = False
            return
    rec.ret, rec.length, rec.prev_done = 0.0, 0, None


def _stop(env: Any, rec: _Rec, exc: BaseException) -> None:
    rec.counts = False
    _warn(env, f"telemetry failed on its step result ({exc!r})")


def _wrap_step(fn):
    @functools.wraps(fn)
    def step(self, *args, **kwargs):
        t = _states.get(_ident()) or _state()
        if t.active or not _on:  # inside a counted env's call (or off): nothing below counts
            return fn(self, *args, **kwargs)
        rec = _recs.get(id(self)) or _rec(self)
        if rec.vector:
            if t.vactive or not rec.counts:
                return fn(self, *args, **kwargs)
            t.vactive += 1
            inner = t.inner
            try:
                result = fn(self, *args, **kwargs)
            finally:
                t.vactive -= 1
            try:
                if t.inner != inner:
                    rec.counts = False  # it steps counted envs: they count themselves
                else:
                    _observe_vector(self, rec, result)
            except Exception as exc:
                _stop(self, rec, exc)
            return result
        if not rec.counts:
            # a wrapper outside the counted env: its result can end a directly built env's episode
            t.base = None
            result = fn(self, *args, **kwargs)
            base = t.base
            if base is not None and not base.made and base.length and isinstance(result, tuple) and len(result) in (4, 5):
                try:
                    if any(bool(d) for d in result[2:len(result) - 1]):
                        _emit(base.ret, base.length)
                        base.ret, base.length = 0.0, 0
                except Exception as exc:
                    _stop(self, base, exc)
            return result
        t.active += 1
        try:
            result = fn(self, *args, **kwargs)
        finally:
            t.active -= 1
        t.inner += 1
        t.base = rec
        try:
            if type(result) is tuple and len(result) == 5 and type(result[1]) in _HOST and type(result[2]) in _HOST and type(result[3]) in _HOST:
                global env_steps  # the common case, inline: a plain reward and flags
                rec.ret += result[1]
                rec.length += 1
                env_steps += 1
                if result[2] or result[3]:
                    _emit(rec.ret, rec.length)
                    rec.ret, rec.length = 0.0, 0
            else:
                _observe_single(self, rec, result)
        except Exception as exc:
            _stop(self, rec, exc)
        return result

    setattr(step, _MARK, True)
    return step


def _wrap_reset(fn):
    @functools.wraps(fn)
    def reset(self, *args, **kwargs):
        t = _states.get(_ident()) or _state()
        if t.active or not _on:
            return fn(self, *args, **kwargs)
        rec = _recs.get(id(self)) or _rec(self)
        if not rec.counts or (rec.vector and t.vactive):
            return fn(self, *args, **kwargs)
        options = kwargs.get("options")
        mask = options.get("reset_mask") if isinstance(options, dict) else None  # read before a wrapper pops it
        inner = t.inner
        if rec.vector:
            t.vactive += 1
        else:
            t.active += 1
        try:
            result = fn(self, *args, **kwargs)
        finally:
            if rec.vector:
                t.vactive -= 1
            else:
                t.active -= 1
        try:
            if rec.vector and t.inner != inner:
                rec.counts = False
            else:
                if not rec.vector:
                    t.inner += 1
                _observe_reset(self, rec, mask)
        except Exception as exc:
            _stop(self, rec, exc)
        return result

    setattr(reset, _MARK, True)
    return reset


def patch_class(cls: type, names=("step", "reset")) -> None:
    """Observe ``cls``'s own ``step`` and ``reset`` (inherited ones are patched where defined)."""
    for name in names:
        fn = cls.__dict__.get(name)
        if isinstance(fn, types.FunctionType) and not getattr(fn, _MARK, False):
            setattr(cls, name, (_wrap_step if name == "step" else _wrap_reset)(fn))


def _is_wrapper(cls: type) -> bool:
    return issubclass(cls, tuple(_wrappers))


def _patch_defining(cls: type) -> None:
    """Patch ``step``/``reset`` of ``cls`` where each is defined (in its MRO)."""
    for name in ("step", "reset"):
        for owner in cls.__mro__:
            if name in owner.__dict__:
                patch_class(owner, (name,))
                break


def _patch_tree(base: type) -> None:
    """Patch a vector env base class and its subclasses (vector wrappers left out)."""
    todo, seen = [base], set()
    while todo:
        cls = todo.pop()
        if cls in seen or _is_wrapper(cls):
            continue
        seen.add(cls)
        patch_class(cls)
        try:
            todo.extend(cls.__subclasses__())
        except TypeError:
            pass


def _hook_subclasses(base: type) -> None:
    """Patch every later non-wrapper subclass of a vector base class when it is defined."""
    own = base.__dict__.get("__init_subclass__")
    if getattr(own, _MARK, False):
        return

    def __init_subclass__(cls, **kwargs):
        if own is not None:
            own.__func__(cls, **kwargs)
        else:
            super(base, cls).__init_subclass__(**kwargs)
        if not _is_wrapper(cls):
            patch_class(cls)

    hook = classmethod(__init_subclass__)
    setattr(__init_subclass__, _MARK, True)
    setattr(hook, _MARK, True)
    base.__init_subclass__ = hook


_direct_classes: Set[type] = set()
_direct_seen = False  # a non-wrapper env was built outside make


def _built(cls: type) -> None:
    """An env object of ``cls`` is being built outside ``make``: a non-wrapper env is stepped
    directly, so its class is patched; wrappers built after one (a user's TimeLimit around it)
    too, for their truncation. Classes only ever built by ``make`` stay unpatched."""
    global _direct_seen
    if cls in _direct_classes:
        return
    if _is_wrapper(cls):
        if not _direct_seen:
            return
    elif issubclass(cls, tuple(_vectors)):
        _direct_classes.add(cls)
        return  # patched as a vector env class
    else:
        _direct_seen = True
    _direct_classes.add(cls)
    _patch_defining(cls)


def _hook_new(base: type) -> None:
    """``base.__new__`` notes envs built outside ``make`` (no instance attribute, no wrapper)."""
    own = base.__dict__.get("__new__")
    if getattr(getattr(own, "__func__", own), _MARK, False):
        return
    inherited = base.__new__  # object.__new__ unless a base class defines one

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls) if inherited is object.__new__ else inherited(cls, *args, **kwargs)
        if not _state().making and _on:
            try:
                _built(cls)
            except Exception:
                pass
        return obj

    setattr(__new__, _MARK, True)
    base.__new__ = staticmethod(__new__)


def _hook_unwrapped(wrapper: type) -> None:
    """``wrapper.unwrapped`` notes the base env a script reaches through a made env
    (``gym.make(...).unwrapped``, to step it without the time limit): built inside ``make``, its
    class was never patched, so its steps went uncounted. It counts as a directly built env from
    then on; stepped through its wrappers instead, those calls count once, at ``make``'s level."""
    prop = wrapper.__dict__.get("unwrapped")
    if not isinstance(prop, property) or prop.fget is None or getattr(prop.fget, _MARK, False):
        return
    fget = prop.fget

    @functools.wraps(fget)
    def unwrapped(self):
        env = fget(self)
        cls = type(env)
        if cls not in _direct_classes and _on and not _state().making:
            try:
                _built(cls)
            except Exception:
                pass
        return env

    setattr(unwrapped, _MARK, True)
    wrapper.unwrapped = property(unwrapped, prop.fset, prop.fdel, prop.__doc__)  # type: ignore[attr-defined]


def _wrap_make(module: Any, name: str = "make") -> None:
    fn = getattr(module, name, None)
    if fn is None or getattr(fn, _MARK, False):
        return

    @functools.wraps(fn)
    def make(*args, **kwargs):
        t = _state()
        t.making += 1
        try:
            env = fn(*args, **kwargs)
        finally:
            t.making -= 1
        try:
            _patch_defining(type(env))
            key = id(env)
            _made.add(key)
            _recs.pop(key, None)
            weakref.finalize(env, _made.discard, key)
        except TypeError:
            pass
        return env

    setattr(make, _MARK, True)
    setattr(module, name, make)


def _attach(package: Any, vector_names: Any, wrapper_names: Any, old: bool) -> None:
    name = package.__name__
    env = getattr(package, "Env", None)
    vector = sys.modules.get(f"{name}.vector")
    bases = []
    if isinstance(env, type):
        _single.append(env)
        bases.append(env)
        wrapper = getattr(package, "Wrapper", None)
        if isinstance(wrapper, type):
            _wrappers.append(wrapper)
            _hook_unwrapped(wrapper)
    for attr in wrapper_names:
        cls = getattr(vector, attr, None)
        if isinstance(cls, type):
            _wrappers.append(cls)
    for attr in vector_names:
        cls = getattr(vector, attr, None)
        if isinstance(cls, type) and cls not in _vectors:
            _vectors.append(cls)
            if old or (isinstance(env, type) and issubclass(cls, env)):
                _old_vectors.append(cls)
            bases.append(cls)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        _HOST.update({numpy.float64, numpy.float32, numpy.bool_, numpy.int64, numpy.int32})
    for base in bases[1 if isinstance(env, type) else 0:]:  # vector env classes
        _patch_tree(base)
        _hook_subclasses(base)
    if isinstance(env, type):
        _hook_new(env)
    registration = sys.modules.get(f"{name}.envs.registration")
    for module in (package, registration):
        if module is not None:
            _wrap_make(module)


def attach_gymnasium(module: Any) -> None:
    _attach(module, ("VectorEnv",), ("VectorWrapper", "VectorEnvWrapper"), old=False)


def attach_gym(module: Any) -> None:
    _attach(module, ("VectorEnv",), ("VectorEnvWrapper", "VectorWrapper"), old=True)


def in_worker() -> None:
    """This process is a child of the run: it counts its own envs, from 0 env steps."""
    global _child, env_steps
    _child = True
    env_steps = 0
    _states.clear()  # the forking thread's call-chain state is not this process's


def _forked() -> None:
    in_worker()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
