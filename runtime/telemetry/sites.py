"""Per rewritten site: how often its guard took the vectorized branch, how often the fallback,
and the time the main thread spent in the site.

Counting: rewritten code calls the guard helpers through their modules
(``_sbx.recurrence_ok(...)``, ``_sb_soft_update(...)`` imported from
``scalebox_cst.runtime.target_update``...). Once such a module is imported, its guard functions
are replaced in the module by counting wrappers (the helpers themselves are untouched): the
caller's (file, line) keys a three-number counter, one dict look-up and one increment a call.
- *entry* helpers (``steps``, ``length``, ``backward_steps``: the first call of a recurrence
  guard's test) count evaluations of the guard, including those the test's ``T >= 2 and ...``
  or a ``dim1(...) is not None`` sends to the fallback before the deciding helper runs;
- *deciding* helpers count a pass (``recurrence_ok``/``quadratic_ok``/target updates: True;
  ``batch_*``/scatter batches/``fused_linear``: not None) or a refusal. A recurrence's one-pass
  tier (``fused_linear``) and its vectorized steps (``recurrence_ok``) are tried on one line,
  ``fused_linear(...) is not None or recurrence_ok(...)``: their passes add up on one site.
fallback = evaluations - passes where an entry helper counts evaluations, else refusals.
``hot_tensors.tensor_from_arrays`` is not wrapped (its fallback calls the constructor from the
caller's line, so torch's warning names the user's line; a wrapper's frame would take that place):
it reports each call itself through its module's ``report`` slot, which :func:`attach` fills.
Calls from inside the runtime package are not counted (they are no site). Only a line's first
entry call counts an evaluation (``backward_steps(x) >= 2 and steps(T) == T_2`` calls two).

Why: a deciding helper notes a reason as it refuses (runtime/guard_reasons.py); the wrapper takes
it and counts it per site (``fallback_why``, the most frequent first). Evaluations the guard's
first test sent to the fallback before any helper decided are put down to the entry helper's
answer (fewer than 2 steps, or not a count of steps); ``fused_linear``'s None only hands over to
``recurrence_ok`` on the same line and says nothing.

Time: measured, a site would need a hook at its end, which Python 3.11 offers only through
tracing (a cost on every line). So it is sampled: the telemetry thread looks at the main thread's
stack on average every 1/:data:`HZ` s, at random intervals (``sys._current_frames``) and credits the interval since its last look
to the innermost site whose lines (the guard's statement, both branches; for ``batch_*`` the
assignment before the ``if`` too) hold a frame, so callees (``linear_recurrence``) count for their
site. ``time_s`` is that estimate (host time; device work queued asynchronously shows where the
host waits for it), ``samples`` how many looks it rests on: few samples, a rough figure.

sites.json (docs/runs.md) is rewritten atomically at each metrics flush: per site the user's
file (project-relative) and line span and the transform (from the stored report, through the
loader's origin of the rewritten file; without one, the line that ran and the helper's transform).
"""
from __future__ import annotations

import ast
import functools
import json
import linecache
import os
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from scalebox_cst import digits, tmpnames
from scalebox_cst.runtime import guard_reasons, metrics

HZ = digits.setting("SCALEBOX_TELEMETRY_HZ", 25, 0.1, 1000)
ENTRY, BOOL, OPTIONAL = "entry", "bool", "optional"
#: a helper that reports each call itself through its module's ``report`` slot (no wrapper: its
#: fallback calls the constructor from the caller's line, which a wrapper's frame would take)
REPORTS = "reports"

#: guard helpers by module: name -> (kind, transform when no report says)
GUARDS: Dict[str, Dict[str, Tuple[str, str]]] = {
    "scalebox_cst.runtime.vectorized": {
        "steps": (ENTRY, "vectorize.recurrence"),
        "length": (ENTRY, "vectorize.recurrence"),
        "backward_steps": (ENTRY, "vectorize.recurrence"),
        "recurrence_ok": (BOOL, "vectorize.recurrence"),
        "fused_linear": (OPTIONAL, "vectorize.recurrence"),  # the one-pass tier, on the guard's line
        "quadratic_ok": (BOOL, "vectorize.recurrence"),
    },
    "scalebox_cst.runtime.loop_batch": {
        "batch_zip": (OPTIONAL, "vectorize.reduction/elementwise"),
        "batch_range": (OPTIONAL, "vectorize.reduction/elementwise"),
    },
    "scalebox_cst.runtime.scatter": {
        name: (OPTIONAL, "vectorize.elementwise")
        for name in ("scatter_add_rows", "index_add_rows", "scatter_add_calls", "index_add_calls")
    },
    "scalebox_cst.runtime.target_update": {
        name: (BOOL, "vectorize.target_update")
        for name in ("soft_update", "scale_add", "scale_add_alpha", "lerp_update", "hard_update")
    },
    "scalebox_cst.runtime.hot_grad": {
        "checked_modules": (BOOL, "hot.no_grad"),
    },
    "scalebox_cst.runtime.hot_tensors": {
        "tensor_from_arrays": (REPORTS, "hot.tensor_from_arrays"),
    },
}

_RUNTIME_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_MARK = "_scalebox_observed"

Key = Tuple[str, int]


class _Site:
    __slots__ = ("entered", "passed", "refused", "transform", "time_s", "samples", "span", "whys", "short", "uncounted",
                 "first_call")

    def __init__(self, transform: str) -> None:
        self.entered = self.passed = self.refused = 0
        self.transform = transform
        self.time_s = 0.0
        self.samples = 0
        self.span: Optional[Tuple[int, int]] = None  # lines of the rewritten file, once resolved
        self.whys: Dict[str, int] = {}  # a deciding helper's reason -> refusals (runtime/guard_reasons.py)
        self.short = self.uncounted = 0  # entry helpers' answers below 2 steps / not a count of steps
        self.first_call = -1  # the bytecode offset of the line's first entry call (see _wrap)

    @property
    def fallback(self) -> int:
        return self.entered - self.passed if self.entered else self.refused

    def refused_why(self, why: Optional[str]) -> None:
        why = why or UNSAID
        if why not in self.whys and len(self.whys) >= MAX_WHYS:
            why = OTHER_WHYS
        self.whys[why] = self.whys.get(why, 0) + 1

    def reasons(self) -> List[List[Any]]:
        """``[[reason, count], ...]``, most frequent first (at most :data:`SHOWN_WHYS`): the
        deciding helpers' reasons, then for the evaluations the guard's first test sent to the loop
        before any helper decided, the entry helpers' answers (fewer than 2 steps, not a count)."""
        counts = dict(self.whys)
        left = self.fallback - sum(counts.values())
        for why, n in ((FEW_STEPS, self.short), (NOT_A_COUNT, self.uncounted)):
            n = min(left, n)
            if n > 0:
                counts[why] = counts.get(why, 0) + n
                left -= n
        if left > 0:
            counts[UNSAID] = counts.get(UNSAID, 0) + left
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return [[why, n] for why, n in ranked[:SHOWN_WHYS]]


#: reasons per site: distinct ones kept, and listed in sites.json
MAX_WHYS, SHOWN_WHYS = 8, 3
FEW_STEPS = "fewer than 2 steps"
NOT_A_COUNT = "the loop's range is not a count of steps the guard can read"
UNSAID = "no reason recorded"
OTHER_WHYS = "other reasons"
#: deciding helpers whose None only hands over to the next helper on the line (not a fallback)
_TIERS = frozenset({"fused_linear"})


_OWNER = os.getpid()
_sites: Dict[Key, _Site] = {}
_spans: Dict[str, List[Tuple[int, int, Key]]] = {}  # filename -> (first, last, key), innermost first
_resolved: set = set()
_trees: Dict[str, Optional[ast.Module]] = {}


def _site(key: Key, transform: str) -> _Site:
    site = _sites.get(key)
    if site is None:
        site = _sites[key] = _Site(transform)
    elif site.transform != transform and transform != "vectorize.recurrence":
        site.transform = transform  # a deciding helper names it better than an entry helper
    return site


def _wrap(fn, kind: str, transform: str, tier: bool = False):
    if kind == ENTRY:

        @functools.wraps(fn)
        def entry(*args, **kwargs):
            result = fn(*args, **kwargs)
            f = sys._getframe(1)
            code = f.f_code
            if not code.co_filename.startswith(_RUNTIME_DIR):
                key = (code.co_filename, f.f_lineno)
                site = _sites.get(key) or _site(key, transform)
                # One evaluation of a guard can call two entry helpers (``backward_steps(x) >= 2
                # and steps(T) == T_2``): only the line's first call counts it (by its bytecode
                # offset; the first call ever made on a line is its leftmost, ``and`` evaluating
                # left to right), else such a site counted passes twice and fell back half the time.
                if site.first_call < 0:
                    site.first_call = f.f_lasti
                if f.f_lasti == site.first_call:
                    site.entered += 1
                    if type(result) is int and result < 2:
                        if result < 0:
                            site.uncounted += 1
                        else:
                            site.short += 1
            return result

        wrapper = entry
    else:
        ok = bool if kind == BOOL else (lambda r: r is not None)

        @functools.wraps(fn)
        def deciding(*args, **kwargs):
            guard_reasons.take()  # a reason left by an earlier call is not this one's
            result = fn(*args, **kwargs)
            f = sys._getframe(1)
            code = f.f_code
            if not code.co_filename.startswith(_RUNTIME_DIR):
                key = (code.co_filename, f.f_lineno)
                site = _sites.get(key) or _site(key, transform)
                if ok(result):
                    site.passed += 1
                else:
                    site.refused += 1
                    if not tier:
                        site.refused_why(guard_reasons.take())
            return result

        wrapper = deciding
    setattr(wrapper, _MARK, True)
    return wrapper


def _reporter(transform: str):
    """What a :data:`REPORTS` helper calls per call: ``why`` None counts a pass, else a fallback."""
    def report(frame, why: Optional[str]) -> None:
        code = frame.f_code
        if not code.co_filename.startswith(_RUNTIME_DIR):
            key = (code.co_filename, frame.f_lineno)
            site = _sites.get(key) or _site(key, transform)
            if why is None:
                site.passed += 1
            else:
                site.refused += 1
                site.refused_why(why)

    return report


def attach(module: Any) -> None:
    """Replace ``module``'s guard helpers by counting ones (in the module's namespace only); a
    :data:`REPORTS` helper's module gets a reporter in its ``report`` slot instead."""
    for name, (kind, transform) in GUARDS.get(module.__name__, {}).items():
        if kind == REPORTS:
            if getattr(module, "report", False) is None:
                module.report = _reporter(transform)
            continue
        fn = getattr(module, name, None)
        if callable(fn) and not getattr(fn, _MARK, False):
            setattr(module, name, _wrap(fn, kind, transform, name in _TIERS))


# ------------------------------------------------------------------------------- time sampling


def _tree(filename: str) -> Optional[ast.Module]:
    if filename not in _trees:
        try:
            _trees[filename] = ast.parse("".join(linecache.getlines(filename)))
        except (SyntaxError, ValueError):
            _trees[filename] = None
    return _trees[filename]


def _span(filename: str, line: int) -> Optional[Tuple[int, int]]:
    """Lines of the site whose guard is called on ``line``: the statement starting there (an
    ``if``), or an assignment there and the ``if`` right after it that tests what it bound."""
    tree = _tree(filename)
    if tree is None:
        return None
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for i, st in enumerate(block):
                if not isinstance(st, ast.stmt) or st.lineno != line:
                    continue
                end = st.end_lineno or st.lineno
                if not isinstance(st, ast.If) and i + 1 < len(block) and isinstance(block[i + 1], ast.If):
                    bound = {n.id for n in ast.walk(st) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                    tested = {n.id for n in ast.walk(block[i + 1].test) if isinstance(n, ast.Name)}
                    if bound & tested:
                        end = block[i + 1].end_lineno or end
                return st.lineno, end
    return None


def _resolve_new() -> None:
    for key in list(_sites):
        if key in _resolved:
            continue
        _resolved.add(key)
        span = _span(*key)
        if span is None:
            continue
        _sites[key].span = span
        spans = _spans.setdefault(key[0], [])
        spans.append((span[0], span[1], key))
        spans.sort(key=lambda s: s[1] - s[0])  # innermost (shortest) first


class Clock:
    """Credits the time since the previous look to the site the main thread is in."""

    def __init__(self) -> None:
        self.main = threading.main_thread().ident
        self.last = time.perf_counter()

    def tick(self, frame: Any = False) -> None:
        """``frame``: the main thread's innermost frame when the caller has looked already."""
        now = time.perf_counter()
        dt, self.last = now - self.last, now
        if len(_resolved) != len(_sites):
            _resolve_new()
        if not _spans:
            return
        if frame is False:
            frame = sys._current_frames().get(self.main)
        while frame is not None:
            spans = _spans.get(frame.f_code.co_filename)
            if spans:
                line = frame.f_lineno
                for lo, hi, key in spans:
                    if lo <= line <= hi:
                        site = _sites[key]
                        site.time_s += dt
                        site.samples += 1
                        return
            frame = frame.f_back


# ------------------------------------------------------------------------------- sites.json


def _project() -> Optional[str]:
    try:
        return json.loads(os.environ.get("SCALEBOX_RUN") or "{}").get("project")
    except ValueError:
        return None


def _origin(filename: str):
    try:
        from scalebox_cst.runtime import loader
    except ImportError:
        return None
    origin_of = getattr(loader, "origin_of", None)
    return origin_of(filename) if origin_of is not None else None


def rows() -> List[Dict[str, Any]]:
    """The sites as sites.json lists them, in file and line order."""
    project = _project()
    out = []
    for (filename, line), site in sorted(list(_sites.items())):
        path = filename
        if project and filename.startswith(project.rstrip(os.sep) + os.sep):
            path = os.path.relpath(filename, project).replace(os.sep, "/")
        user_line, end_line, transform = line, None, site.transform
        origin = _origin(filename)
        if origin is not None:
            user_line = origin.locate(line)[0]
            for lo, hi, name in getattr(origin, "sites", ()):
                if lo <= user_line <= hi:
                    user_line, end_line, transform = lo, hi, name
                    break
        out.append({
            "path": path, "line": user_line, "end_line": end_line, "rewritten_line": line,
            "transform": transform, "vectorized": site.passed, "fallback": site.fallback,
            "time_s": round(site.time_s, 6), "samples": site.samples,
            "fallback_why": site.reasons() if site.fallback > 0 else [],
        })
    return out


def write_json() -> None:
    """Rewrite the run's sites.json (tmp + rename: readers never see half a file)."""
    path = metrics.run_file("sites.json")
    if not path or not _sites or os.getpid() != _OWNER:  # a forked child holds a stale copy
        return
    data = {"sites": rows(), "time_method": f"sampled at {HZ:g} Hz", "updated": round(time.time(), 3)}
    try:
        tmpnames.write_replacing(path, json.dumps(data, indent=1).encode("utf-8"), tmpnames.sibling(path, tmpnames.writer_id()))
    except OSError as exc:
        print(f"scalebox: cannot write {path}: {exc}", file=sys.stderr)
