"""Where a run's time goes: the main thread's stack, sampled by the telemetry thread.

Every tick of the telemetry thread (:data:`sites.HZ`, 25 Hz on average, at random intervals:
``telemetry._next_look``) looks at the main thread's innermost frame (``sys._current_frames``)
and credits the wall time and the main thread's CPU time since the previous look (its own CPU
clock, ``pthread_getcpuclockid``) to

- a *line*: the innermost frame in the user's project (files under the project folder, outside
  any site-packages or ``.venv``), in the user's own numbering
  (rewritten files map back through :func:`runtime.loader.origin_of`, as tracebacks do);
- a *category* (:data:`CATEGORIES`), from the frames walking outward from the innermost one:
  first what the innermost frame, where it is a line of the user's, is doing (its bytecode):
  calling ``.item()`` / ``.cpu()`` / ``.numpy()`` / ``.tolist()`` / ``float(t)`` (host-device
  syncs once a device is initialised, host copies before), ``torch.tensor`` / ``.to`` /
  ``.clone`` / ``torch.stack``... or storing ``buf[t] = x`` (tensor creation and copies),
  ``print`` (logging); then the first frame with a rule: gymnasium/gym (and telemetry's env
  step wrappers) environment step, ``torch.distributions``, ``torch.optim``, autograd's
  backward, tensorboard/tensorboardX/wandb/``logging``, replay buffers and data loaders (also a
  project method like ``ReplayBuffer.sample``), the engine's runtime helpers, a library module's
  top level run by the import machinery (start-up: ``import torch`` alone is ~1.5 s of CPU, and torch
  imports ``torch._dynamo`` when the first optimizer steps; paid once per process, so a short run
  is told apart from a slow step), and ``nn.Module.__call__`` / ``torch.nn.functional``:
  acting/target forward when the main thread's grad mode is off (acting, and the targets an
  update computes under ``no_grad``: in DQN, TD3 and SAC, most of it), loss forward when it is on. Grad mode is
  thread-local inside torch, so the grad-mode context managers are patched (class level) to
  note the main thread's mode after they switch it.

``calls`` counts the visits samples saw (a new frame or line since the previous sample): a
lower bound, a line run many times between two samples counts once.

Aggregates stay in this process; :func:`flush` (called by the telemetry thread every
:data:`EVERY` seconds and at exit) appends one line of per-(line, category) deltas to the run's
``profile.jsonl``, kept apart from metrics.jsonl. The host reduces it (``scalebox_cst.profile``).
``SCALEBOX_PROFILE=0`` turns the sampling off (the other telemetry stays). Cost: one look is
tens of microseconds (caches per file and per code object, keyed by id: hashing a code object
hashes its body), well under 1% of a core at 25 Hz (benchmarks/bench_telemetry.py).
"""
from __future__ import annotations

import dis
import functools
import json
import os
import re
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from scalebox_cst import digits
from scalebox_cst.runtime import metrics

ENV_SWITCH = "SCALEBOX_PROFILE"
FILE = "profile.jsonl"
#: seconds between two appends to profile.jsonl (each holds the lines seen since the last)
EVERY = digits.setting("SCALEBOX_PROFILE_EVERY", 10, 0.1, 86400)

_MODULE = "module"  # rule of nn.Module.__call__ / nn.functional: action or forward by grad mode
USER, LIB, PASS = 0, 1, 2  # frame kinds; PASS: the launcher's and telemetry's plumbing
#: the line number profile.jsonl gives code a rewrite added outside any site (support imports, helpers)
ADDED = 0

_RUNTIME = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TELEMETRY = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: runtime files that are plumbing, not an engine site (their callers decide); user_lines.py wraps
#: warnings / logging / inspect.getframeinfo in every run, the original's too: the wrapped call's
#: time is the caller's (torch's import calls inspect.stack: start-up, not "engine sites")
_PASS_FILES = {"loader.py", "launch.py", "metrics.py", "threads.py", "user_lines.py"}
_TELEMETRY_RULES = {"envs.py": "env", "writer.py": "logging", "training.py": "backward"}

#: library path prefixes (after site-packages/ or the standard library) -> category
_LIBRARY_RULES: Tuple[Tuple[str, str], ...] = (
    ("gymnasium/", "env"), ("gym/", "env"), ("envpool/", "env"), ("stable_baselines3/common/vec_env/", "env"),
    ("pettingzoo/", "env"), ("dm_control/", "env"), ("ale_py/", "env"), ("procgen/", "env"),
    ("torch/distributions/", "distributions"),
    ("torch/optim/", "optimizer"),
    ("torch/utils/tensorboard/", "logging"), ("tensorboardX/", "logging"), ("tensorboard/", "logging"),
    ("wandb/", "logging"), ("logging/", "logging"), ("mlflow/", "logging"),
    ("torch/utils/data/", "replay"), ("stable_baselines3/common/buffers.py", "replay"), ("torchrl/data/", "replay"),
    ("torch/nn/functional.py", _MODULE),
)
_BACKWARD_NAMES = {"backward", "_engine_run_backward", "grad"}
_MODULE_CALLS = {"_call_impl", "_wrapped_call_impl"}
_REPLAY_QUALNAME = re.compile(r"(?i)(replay|buffer|memory|storage)[^.]*\.(sample\w*|get_batch|get|__getitem__)$")
#: a step or reset of the project's own env class (a class named ...Env / ...Environment, a vector
#: env's step_async / step_wait): BY571's IQN waits for its SubprocVecEnv workers in step_wait
_ENV_QUALNAME = re.compile(r"(?:^|\.)\w*(?:Env|env|Environment|environment)\d*\.(?:step|step_async|step_wait|reset|reset_async|reset_wait)$")

SYNC_CALLS = {"item", "cpu", "numpy", "tolist", "synchronize", "float", "int", "bool"}
TENSOR_CALLS = {
    "tensor", "as_tensor", "from_numpy", "zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like",
    "full_like", "rand", "randn", "randint", "arange", "linspace", "stack", "cat", "concatenate", "clone", "copy_",
    "to", "cuda", "contiguous", "pin_memory", "array", "asarray", "FloatTensor", "LongTensor", "Tensor",
    "__setitem__",  # a subscript store (``rewards[step] = r``): a copy into the tensor or array
}
LOG_CALLS = {"print"}

#: entries of a per-code cache before it starts again
CACHE_LIMIT = 100_000

_LOADS = {"LOAD_METHOD", "LOAD_ATTR", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_FAST", "LOAD_DEREF"}


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


# ------------------------------------------------------------------------------- grad mode


class _Grad:
    main = threading.main_thread().ident
    enabled = True  # the main thread's grad mode, as the last context manager left it


def _note_grad(fn, torch):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        result = fn(*args, **kwargs)
        if threading.get_ident() == _Grad.main:
            _Grad.enabled = bool(torch.is_grad_enabled())
        return result

    wrapper._scalebox_observed = True
    return wrapper


def attach_torch(torch: Any) -> None:
    """Follow the main thread's grad mode through torch's grad-mode context managers."""
    grad_mode = getattr(getattr(torch, "autograd", None), "grad_mode", None)
    for name in ("no_grad", "enable_grad", "set_grad_enabled", "inference_mode"):
        cls = getattr(grad_mode, name, None)
        if not isinstance(cls, type):
            continue
        for method in ("__init__", "__enter__", "__exit__"):
            fn = cls.__dict__.get(method)
            if callable(fn) and not getattr(fn, "_scalebox_observed", False):
                setattr(cls, method, _note_grad(fn, torch))


def _device_in_use() -> bool:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_initialized():
            return True
        npu = getattr(torch, "npu", None) if "torch_npu" in sys.modules else None
        return bool(npu is not None and getattr(npu, "is_initialized", lambda: True)())
    except Exception:
        return False


# ------------------------------------------------------------------------------- classifying


def calls_of(code) -> Dict[int, str]:
    """Byte offset of each call instruction in ``code`` -> the name it calls (``t.item()``:
    ``item``), for calls whose callable is a plain name or attribute. One pass over the code."""
    out: Dict[int, str] = {}
    instrs = [i for i in dis.get_instructions(code) if i.opname not in ("CACHE", "KW_NAMES")]
    for at, ins in enumerate(instrs):
        if ins.opname == "STORE_SUBSCR":  # buf[step] = x: slow enough to be seen on a tensor / array
            out[ins.offset] = "__setitem__"
            continue
        if ins.opname not in ("CALL", "PRECALL"):
            continue
        argc = ins.arg or 0
        k = at - 1
        while k >= 0 and instrs[k].opname == "PRECALL":
            k -= 1
        total = 0
        while argc and k >= 0:  # walk back over the arguments: they push argc values
            i = instrs[k]
            total += dis.stack_effect(i.opcode, i.arg if i.opcode >= dis.HAVE_ARGUMENT else None, jump=False)
            if total >= argc:
                break
            k -= 1
        if argc:
            k -= 1
        if 0 <= k and instrs[k].opname in _LOADS and isinstance(instrs[k].argval, str):
            out[ins.offset] = instrs[k].argval
    return out


_calls: Dict[int, Tuple[Any, Dict[int, str]]] = {}  # id(code) -> (code, calls_of(code))


def callee(code, lasti: int) -> Optional[str]:
    """The name the call at byte offset ``lasti`` of ``code`` calls, or None (no call there, or
    not a plain name). Keyed by the code's id (hashing a code object hashes its whole body),
    the code itself kept so the id stays its own."""
    found = _calls.get(id(code))
    if found is None or found[0] is not code:
        try:
            names = calls_of(code)
        except Exception:  # an odd code object: no names
            names = {}
        if len(_calls) >= CACHE_LIMIT:  # code made at run time (exec, compile) must not grow it forever
            _calls.clear()
        found = _calls[id(code)] = (code, names)
    return found[1].get(lasti)


class Classifier:
    """Frame kinds and rules per code object (cached), and the (user frame, category) of a stack."""

    def __init__(self, project: Optional[str] = None) -> None:
        self._project = project
        self.codes: Dict[int, Tuple[int, Optional[str], Any]] = {}
        self.files: Dict[str, Tuple[int, Optional[str]]] = {}

    @property
    def project(self) -> str:
        """The project folder: the launcher's (``SCALEBOX_RUN``), else the working directory
        (the launcher starts the run there; it sets the variable only after telemetry starts)."""
        if self._project is None:
            try:
                found = json.loads(os.environ.get("SCALEBOX_RUN") or "{}").get("project")
            except ValueError:
                found = None
            self._project = os.path.join(os.path.realpath(found or os.getcwd()), "")
        return self._project

    def file_kind(self, filename: str) -> Tuple[int, Optional[str]]:
        """(USER / LIB / PASS, category rule or None) of a file (a relative name, as
        ``runpy.run_path("train.py")`` gives its code, is taken from the working directory)."""
        found = self.files.get(filename)
        if found is not None:
            return found
        key, filename = filename, _absolute(filename)
        path = filename.replace(os.sep, "/")
        kind, rule = LIB, None
        if filename.startswith(_TELEMETRY):
            kind, rule = PASS, _TELEMETRY_RULES.get(os.path.basename(filename))
        elif filename.startswith(_RUNTIME):
            name = os.path.basename(filename)
            kind, rule = (PASS, None) if name in _PASS_FILES else (LIB, "engine")
        elif "/site-packages/" in path or "/dist-packages/" in path or path.startswith("<"):
            tail = re.split(r"/(?:site|dist)-packages/", path)[-1]
            rule = next((r for prefix, r in _LIBRARY_RULES if tail.startswith(prefix)), None)
        elif filename.startswith(self.project) and "/.venv/" not in path:
            kind = USER
        else:  # the standard library (logging), or a file outside the project
            tail = path.rsplit("/lib/python", 1)[-1].split("/", 1)[-1] if "/lib/python" in path else ""
            rule = next((r for prefix, r in _LIBRARY_RULES if tail.startswith(prefix)), None)
        self.files[key] = (kind, rule)
        return kind, rule

    def code_kind(self, code) -> Tuple[int, Optional[str]]:
        found = self.codes.get(id(code))  # by id: a code object's hash hashes its whole body
        if found is not None and found[2] is code:
            return found[0], found[1]
        kind, rule = self.file_kind(code.co_filename)
        name = code.co_name
        if kind == LIB and code.co_filename.startswith("<frozen importlib"):
            rule = "imports"  # the import machinery anywhere outside: start-up, whatever runs inside
        elif kind == LIB and name == "<module>":
            rule = "other"  # a module's top level outside an import (exec of a string, runpy): not a category
        elif kind == LIB and "torch/" in code.co_filename.replace(os.sep, "/"):
            path = code.co_filename.replace(os.sep, "/")
            if name in _BACKWARD_NAMES and ("/torch/autograd/" in path or path.endswith("/torch/_tensor.py")):
                rule = "backward"
            elif name in _MODULE_CALLS and path.endswith("/torch/nn/modules/module.py"):
                rule = _MODULE
            elif name == "synchronize" and "/torch/cuda/" in path:
                rule = "sync"
        elif kind == USER and _REPLAY_QUALNAME.search(getattr(code, "co_qualname", name)):
            rule = "replay"
        elif kind == USER and _ENV_QUALNAME.search(getattr(code, "co_qualname", name)):
            rule = "env"
        if len(self.codes) >= CACHE_LIMIT:
            self.codes.clear()
        self.codes[id(code)] = (kind, rule, code)
        return kind, rule

    def classify(self, frame) -> Tuple[Any, Optional[str]]:
        """(innermost user frame or None, category) of the stack whose innermost frame is ``frame``."""
        user, category = None, None
        if frame is None:
            return None, "other"
        kind, _ = self.code_kind(frame.f_code)
        if kind == USER:  # the C function a line of the user's calls (library frames: their rules)
            called = callee(frame.f_code, frame.f_lasti)
            if called in SYNC_CALLS:
                category = "sync" if _device_in_use() else "tensors"
            elif called in TENSOR_CALLS:
                category = "tensors"
            elif called in LOG_CALLS:
                category = "logging"
        f = frame
        while f is not None:  # the whole stack: an import anywhere outside makes it start-up
            kind, rule = self.code_kind(f.f_code)
            if kind == USER and user is None:
                user = f
            if rule == "imports":
                category = rule
            elif category is None and rule is not None:
                category = rule
            f = f.f_back
        if category == _MODULE:
            category = "forward" if _Grad.enabled else "action"
        return user, category or "other"


# ------------------------------------------------------------------------------- sampling


def _cpu_clock() -> Optional[int]:
    try:
        return time.pthread_getcpuclockid(threading.main_thread().ident)
    except (AttributeError, OSError, TypeError):
        return None


Row = List[Any]  # [samples, wall_s, cpu_s, calls]


class Profiler:
    """Called by the telemetry thread each tick; accumulates per (file, line, category)."""

    def __init__(self, classifier: Optional[Classifier] = None) -> None:
        self.classifier = classifier or Classifier()
        self.clock = _cpu_clock()
        self.rows: Dict[Tuple[str, int, str], Row] = {}
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.last_wall = time.perf_counter()
        self.last_cpu = self._cpu()
        self.visit: Tuple[int, int] = (0, 0)

    def _cpu(self) -> float:
        if self.clock is None:
            return 0.0
        try:
            return time.clock_gettime(self.clock)
        except OSError:  # the main thread is gone (exit)
            self.clock = None
            return 0.0

    def tick(self, frame) -> None:
        now, cpu = time.perf_counter(), self._cpu()
        wall, used = now - self.last_wall, max(cpu - self.last_cpu, 0.0)
        self.last_wall, self.last_cpu = now, cpu
        user, category = self.classifier.classify(frame)
        if user is not None:
            filename, line = user.f_code.co_filename, user.f_lineno or 0
        else:
            filename, line = "", 0
        visit = (id(user), line)
        key = (filename, line, category)
        with self.lock:
            row = self.rows.get(key)
            if row is None:
                row = self.rows[key] = [0, 0.0, 0.0, 0]
            row[0] += 1
            row[1] += wall
            row[2] += used
            if visit != self.visit:
                row[3] += 1
        self.visit = visit

    def take(self) -> Dict[Tuple[str, int, str], Row]:
        with self.lock:
            rows, self.rows = self.rows, {}
        return rows


def _absolute(filename: str) -> str:
    """A code object's file name as a path from the root: ``runpy.run_path("train.py")`` compiles
    with the relative name, which is the working directory's (``<string>``-style names stay)."""
    if filename and not filename.startswith("<") and not os.path.isabs(filename):
        return os.path.abspath(filename)
    return filename


def _where(filename: str, line: int, project: Optional[str], cache: Dict[str, Any]) -> Tuple[str, int]:
    """Project-relative path and the user's own line number (rewritten files map back)."""
    if not filename:
        return "", 0
    filename = _absolute(filename)
    if filename not in cache:
        try:
            from scalebox_cst.runtime.loader import origin_of

            cache[filename] = origin_of(filename)
        except Exception:
            cache[filename] = None
    origin = cache[filename]
    if origin is not None:
        line = _users_line(origin, line)
    path = filename
    if project and filename.startswith(project):
        path = filename[len(project):].replace(os.sep, "/")
    return path, line


def _users_line(origin, line: int) -> int:
    """The user's line a rewritten line stands for; ADDED (0) for code the rewrite added outside
    any site: its support imports (they import torch) and helpers. The loader's map gives such a
    line the user's next one, so every rewritten run's profile had the file's first line
    (``import argparse``) as its hottest, where the original's had ``import torch``."""
    old, same = origin.map.get(line, (line, True))
    if not same and not any(lo <= old <= hi for lo, hi, _ in origin.sites):
        return ADDED
    return old


_origins: Dict[str, Any] = {}


def flush(profiler: Profiler) -> None:
    """Append the samples taken since the last flush to the run's profile.jsonl (one line)."""
    rows = profiler.take()
    path = metrics.run_file(FILE)
    if not rows or not path or os.getpid() != profiler.pid:
        return
    from scalebox_cst.runtime.telemetry import sites

    merged: Dict[Tuple[str, int, str], Row] = {}
    for (filename, line, category), row in rows.items():
        where, user_line = _where(filename, line, profiler.classifier.project, _origins)
        into = merged.setdefault((where, user_line, category), [0, 0.0, 0.0, 0])
        for k in range(4):
            into[k] += row[k]
    item = {
        "time": round(time.time(), 3), "hz": sites.HZ, "cpu": profiler.clock is not None,
        "rows": [[p, l, c, n, round(w, 6), round(u, 6), v] for (p, l, c), (n, w, u, v) in merged.items()],
    }
    try:
        metrics.append_text(path, json.dumps(item) + "\n")
    except OSError as exc:
        print(f"scalebox: cannot write {path}: {exc}", file=sys.stderr)
