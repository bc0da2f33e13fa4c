"""Precision calibration in the run's child (issue 24 part 1): ``scalebox run --calibrate-precision``.

For the first N optimizer steps (``SCALEBOX_CALIBRATE_PRECISION=N``), a global forward hook on
``torch.nn.Module`` records, per call site of a top-level module call in the user's code (the
innermost project frame; a module called inside another's forward counts for its outermost
caller), the largest absolute value and the smallest non-zero absolute value of every floating
output of that call and of the modules it runs. ``precision.json`` in the run folder holds
``{"steps": n, "lines": [{"file", "line", "max", "min"}]}``; the host copies it into record.json
``precision``, and the next ``precision.autocast`` rewrite in fp16 keeps a statement whose line
overflows fp16 (above 65504) or underflows its normal range (below 6.1e-5) in fp32.
"""
from __future__ import annotations

import json
import math
import os
import sys
import threading
from typing import Dict, List, Tuple

from scalebox_cst import tmpnames
from scalebox_cst.runtime import metrics
from scalebox_cst.digits import ascii_digits

ENV = "SCALEBOX_CALIBRATE_PRECISION"
FILE = "precision.json"

ranges: Dict[Tuple[str, int], List[float]] = {}  # (file, line) -> [max |x|, min non-zero |x|]
_state = threading.local()
_handles: list = []
_steps = {"limit": 0}


def _extremes(value, out: List[float]) -> None:
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.numel():
            a = value.detach().abs()
            finite = a[torch.isfinite(a)]
            top = float(a.max()) if finite.numel() == a.numel() else math.inf
            nonzero = finite[finite > 0]
            out[0] = max(out[0], top)
            if nonzero.numel():
                out[1] = min(out[1], float(nonzero.min()))
    elif isinstance(value, (tuple, list)):
        for item in value:
            _extremes(item, out)
    elif isinstance(value, dict):
        for item in value.values():
            _extremes(item, out)


def _pre(module, args) -> None:
    depth = getattr(_state, "depth", 0)
    if depth == 0:
        from scalebox_cst.runtime.telemetry.fallbacks import call_site

        _state.site = call_site(sys._getframe(1))
        _state.acc = [0.0, math.inf]
    _state.depth = depth + 1


def _post(module, args, output) -> None:
    _state.depth = getattr(_state, "depth", 1) - 1
    acc = getattr(_state, "acc", None)
    if acc is None:
        return
    _extremes(output, acc)
    if _state.depth == 0:
        from scalebox_cst.runtime.telemetry import training

        if training.optimizer_steps >= _steps["limit"]:
            stop()
            return
        site = _state.site
        if site[0]:
            seen = ranges.setdefault(site, [0.0, math.inf])
            seen[0], seen[1] = max(seen[0], acc[0]), min(seen[1], acc[1])


def install(steps: int) -> None:
    """Record module ranges for the first ``steps`` optimizer steps."""
    import torch

    from scalebox_cst.runtime.telemetry import training

    _steps["limit"] = training.optimizer_steps + steps
    _handles.append(torch.nn.modules.module.register_module_forward_pre_hook(_pre))
    _handles.append(torch.nn.modules.module.register_module_forward_hook(_post))
    metrics.after_flush(write_json)
    print(f"scalebox: calibrating precision: module ranges over the first {steps} optimizer steps", file=sys.stderr)


def stop() -> None:
    while _handles:
        _handles.pop().remove()
    write_json()


def write_json() -> None:
    path = metrics.run_file(FILE)
    if not path:
        return
    from scalebox_cst.runtime.telemetry import training

    rows = [{"file": f, "line": line, "max": hi, "min": (lo if math.isfinite(lo) else None)}
            for (f, line), (hi, lo) in sorted(ranges.items())]
    data = {"steps": min(training.optimizer_steps, _steps["limit"]), "lines": rows}
    try:
        tmpnames.write_replacing(path, json.dumps(data, default=str).encode("utf-8"), tmpnames.sibling(path, tmpnames.writer_id()))
    except OSError as exc:
        print(f"scalebox: cannot write {path}: {exc}", file=sys.stderr)


def install_from_env() -> None:
    text = os.environ.get(ENV)
    if text and ascii_digits(text) and int(text) > 0:
        from scalebox_cst.runtime import telemetry

        telemetry.imports.when_imported("torch", lambda _torch: install(int(text)))
