"""Operators that fall back to the CPU (issue 24 part 2), per operator and per line of the user's.

torch_npu warns ``CAUTION: The operator 'aten::X' is not currently supported on the NPU backend
and will fall back to run on the CPU`` once per operator (a static set of names in its fallback
kernel, whatever ``torch.set_warn_always`` says); MPS says the same of its backend. The warning
alone tells neither where nor how often. Here:

* every shown warning passes ``warnings._showwarnmsg``; a filter put first makes these warnings
  always shown (the user's own filters still decide what is printed: the wrapper prints only what
  would have been printed before, once per operator and line);
* the operator's call site is the innermost frame in the project (rewritten files map to the
  user's line, as the profile's lines do), found by walking the stack at the warning;
* from the first warning of an operator on, its later calls are counted by a dispatch mode
  (``TorchDispatchMode``, this thread) that looks only at that operator's name (every overload)
  with a tensor on the fallback's device: the cost is paid only by runs that have a fallback,
  which already pay a device-to-host copy per call. ``SCALEBOX_FALLBACK_COUNT=0``: no mode, the
  count is the warnings' (one per operator).

The counts go to the run's ``fallbacks.json`` at each metrics flush (the host copies them into
record.json ``fallbacks``); the first sight of each (operator, line) is an event in events.jsonl.
The C++ log form of the message (``[W...] Warning: CAUTION ...`` on stderr, printed where no
Python frame is at hand: a backward pass on the autograd thread) has no call site and is not seen.
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
from typing import Dict, Tuple

from scalebox_cst import tmpnames
from scalebox_cst.runtime import metrics

FILE = "fallbacks.json"
PATTERN = re.compile(r"The operator '([\w:.]+)' is not currently supported on the (\w+) backend and will fall back to run on the CPU")
ENV_COUNT = "SCALEBOX_FALLBACK_COUNT"

#: (op, file, line) -> count
counts: Dict[Tuple[str, str, int], int] = {}
_watched: Dict[str, Tuple[str, str, str]] = {}  # op base name (aten::gelu) -> (device type, op as warned, backend)
_lock = threading.Lock()
_mode = None
_installed = False
_dirty = False


_classifier_obj = None


def _classifier():
    """The profile's frame classifier (which files are the project's), made on first use."""
    global _classifier_obj
    if _classifier_obj is None:
        from scalebox_cst.runtime.telemetry.profile import Classifier

        _classifier_obj = Classifier()
    return _classifier_obj


def call_site(frame) -> Tuple[str, int]:
    """(project-relative file, user's line) of the innermost frame in the project, else ("", 0)."""
    from scalebox_cst.runtime.telemetry import profile

    classifier = _classifier()
    while frame is not None:
        kind, _ = classifier.file_kind(frame.f_code.co_filename)
        if kind == profile.USER:  # a rewritten file's line maps to the user's (as warnings and tracebacks do)
            from scalebox_cst.runtime.user_lines import user_line

            filename, line = frame.f_code.co_filename, frame.f_lineno
            mapped = user_line(filename, line)
            path = filename[len(classifier.project):] if filename.startswith(classifier.project) else filename
            return path.replace(os.sep, "/"), mapped[0] if mapped else line
        frame = frame.f_back
    return "", 0


def seen(op: str, backend: str, frame, first: bool) -> None:
    """One call of ``op`` that ran on the CPU for ``backend``, from ``frame``'s stack."""
    global _dirty
    site = call_site(frame)
    key = (op, *site)
    with _lock:
        new = key not in counts
        counts[key] = counts.get(key, 0) + 1
        _dirty = True
    if new:
        where = f"{site[0]}:{site[1]}" if site[0] else "outside the project"
        metrics.append_event("fallback", f"{op} falls back to the CPU on {backend} at {where}", op=op, file=site[0], line=site[1])
    if first:
        _watch(op, backend)


def _device_type(backend: str) -> str:
    """The tensors' device type of a fallback on ``backend`` (the test stand-in's NPU tensors are
    CPU tensors and says so, as it does to the runtime guards)."""
    if backend.upper() == "NPU":
        return getattr(sys.modules.get("torch_npu"), "_scalebox_kernel_device_type", "npu")
    return backend.lower()


def _watch(op: str, backend: str) -> None:
    """Count the later calls of ``op``, any overload, under the name it was warned of (its
    warning comes once)."""
    global _mode
    base = op.split(".")[0]
    if os.environ.get(ENV_COUNT, "1") == "0" or base in _watched:
        return
    _watched[base] = (_device_type(backend), op, backend)
    if _mode is None and threading.current_thread() is threading.main_thread():
        from torch.utils._python_dispatch import TorchDispatchMode

        class _Counter(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                watched = _watched.get(func._schema.name)
                if watched is not None and _on(args, kwargs, watched[0]):
                    seen(watched[1], watched[2], sys._getframe(1), False)
                return func(*args, **(kwargs or {}))

        _mode = _Counter()
        _mode.__enter__()  # for the rest of the run, in this thread


def _on(args, kwargs, device: str) -> bool:
    import torch

    for value in (*args, *(kwargs or {}).values()):
        if isinstance(value, torch.Tensor):
            return value.device.type == device
    return False


def _patch(warnings) -> None:
    show = warnings._showwarnmsg
    printed = set()

    def _showwarnmsg(msg):
        match = PATTERN.search(str(msg.message))
        if match is None:
            return show(msg)
        op, backend = match.group(1), match.group(2)
        first = op.split(".")[0] not in _watched
        try:
            seen(op, backend, sys._getframe(1), first)
        except Exception:  # noqa: BLE001 - a warning must print whatever happens
            pass
        key = (op, msg.filename, msg.lineno)
        if key not in printed:  # shown as before: once
            printed.add(key)
            return show(msg)
        return None

    _showwarnmsg.__wrapped__ = show  # type: ignore[attr-defined]
    warnings._showwarnmsg = _showwarnmsg
    warnings.filterwarnings("always", message=r".*is not currently supported on the \w+ backend and will fall back")


def install() -> None:
    """Capture the warnings (idempotent); the counts are written at each flush."""
    global _installed
    if _installed:
        return
    _installed = True
    import warnings

    _patch(warnings)
    metrics.after_flush(write_json)


def write_json() -> None:
    """The counts so far, as ``{"fallbacks": [{op, file, line, count}]}`` (atomically)."""
    global _dirty
    path = metrics.run_file(FILE)
    if not path or not _dirty:
        return
    with _lock:
        rows = [{"op": op, "file": f, "line": line, "count": n} for (op, f, line), n in sorted(counts.items())]
        _dirty = False
    try:
        tmpnames.write_replacing(path, json.dumps({"fallbacks": rows}).encode("utf-8"), tmpnames.sibling(path, tmpnames.writer_id()))
    except OSError as exc:
        print(f"scalebox: cannot write {path}: {exc}", file=sys.stderr)

