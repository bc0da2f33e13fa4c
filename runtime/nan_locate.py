"""Name the module (and the user's source line) that first produced a non-finite value.

Used by ``scalebox run --locate-nan``: the run is started again from the beginning with
``$SCALEBOX_LOCATE_NAN=SITE@STEP`` (the guard site and step where the first non-finite gradient was
seen). No checks run on the steps before: the locator only counts guard calls at SITE. After call
STEP-1 it installs global module hooks (``isfinite`` on every tensor output of every
``nn.Module``; a gradient hook on each output to catch the backward pass) for the one step, then
at call STEP reports what it found and ends the process. Unlike ``torch.autograd.detect_anomaly``
(about 50% slower on every step) healthy steps pay nothing but a counter. The rerun reproduces the
step when the script seeds its random number generators; when the step comes out finite, it says so.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional

import torch
from scalebox_cst.digits import ascii_digits

_SKIP_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tensors(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _nonfinite(t: torch.Tensor) -> bool:
    return (t.is_floating_point() or t.is_complex()) and t.numel() > 0 and not bool(torch.isfinite(t).all())


def user_line() -> str:
    """``path:line`` of the innermost frame outside torch and scalebox (the user's call)."""
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_SKIP_DIRS) and not path.startswith("<"):
            return f"{frame.f_code.co_filename}:{_users_line(frame.f_code.co_filename, frame.f_lineno)}"
        frame = frame.f_back
    return "?"


def _users_line(filename: str, line: int) -> int:
    """The line in the user's file for a line of code served from a rewrite (as tracebacks show;
    a failed map gives the line as it is: a diagnosis must not fail on it)."""
    from scalebox_cst.runtime.user_lines import user_line

    where = user_line(filename, line)
    return where[0] if where is not None else line


def module_names() -> Dict[int, str]:
    """id(module) -> ``Root.child.grandchild`` for every live module (built once, when arming)."""
    from scalebox_cst.runtime.guard_events import live_modules

    modules = live_modules()
    children = {id(c) for m in modules for c in m.children()}
    names: Dict[int, str] = {}
    for root in modules:
        if id(root) in children:
            continue
        for name, sub in root.named_modules(remove_duplicate=False):
            names.setdefault(id(sub), f"{type(root).__name__}.{name}" if name else type(root).__name__)
    return names


class Locator:
    def __init__(self, site: str, step: int) -> None:
        self.site, self.step = site, step
        self.calls = 0
        self.handles: List[Any] = []
        self.names: Dict[int, str] = {}
        self.forward: Optional[Dict[str, str]] = None
        self.backward: Optional[Dict[str, str]] = None
        if step <= 1:
            self.arm()

    @classmethod
    def from_spec(cls, spec: str) -> "Locator":
        site, sep, step = spec.rpartition("@")
        if not sep or not ascii_digits(step):
            raise ValueError(f"SCALEBOX_LOCATE_NAN must be SITE@STEP, got {spec!r}")
        return cls(site, int(step))

    # ---------------------------------------------------------------- hooks
    def _name(self, module: torch.nn.Module) -> str:
        if id(module) not in self.names:
            self.names = module_names()
        return self.names.get(id(module), type(module).__name__)

    def _on_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        outs = _tensors(output)
        if self.forward is None and any(_nonfinite(t) for t in outs):
            self.forward = {"module": self._name(module), "type": type(module).__name__, "line": user_line()}
        if self.backward is None:
            for t in outs:
                if t.requires_grad and t.grad_fn is not None:
                    t.register_hook(self._grad_hook(module))

    def _grad_hook(self, module: torch.nn.Module):
        def check(grad: torch.Tensor) -> None:
            if self.backward is None and _nonfinite(grad):
                self.backward = {"module": self._name(module), "type": type(module).__name__}
        return check

    def arm(self) -> None:
        self.names = module_names()
        self.handles.append(torch.nn.modules.module.register_module_forward_hook(self._on_forward))

    def disarm(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    # ---------------------------------------------------------------- called by the guard
    def before_step(self, guard: Any) -> None:
        if guard.site != self.site:
            return
        self.calls += 1
        if self.calls == self.step:
            self.disarm()

    def after_guard(self, guard: Any, norm: torch.Tensor) -> None:
        if guard.site != self.site:
            return
        if self.calls == self.step - 1:
            self.arm()
        elif self.calls == self.step:
            self.report(bool(torch.isfinite(torch.as_tensor(norm))))

    def report(self, finite: bool) -> None:
        from scalebox_cst.runtime import metrics, stabilizer

        where = f"{self.site} step {self.step}"
        if self.forward is not None:
            f = self.forward
            msg = f"NaN located: {f['module']} ({f['type']}) produced the first non-finite output at {where}, called at {f['line']}"
            extra = {"module": f["module"], "line": f["line"], "phase": "forward"}
        elif self.backward is not None:
            b = self.backward
            msg = (f"NaN located: module outputs were finite at {where}; the first non-finite gradient flowed into the "
                   f"output of {b['module']} ({b['type']}): the backward of what consumes it (often the loss) made it")
            extra = {"module": b["module"], "phase": "backward"}
        elif finite:
            msg = f"NaN not reproduced: {where} came out finite in this rerun (does the script seed its RNGs?)"
            extra = {"phase": None}
        else:
            msg = f"NaN located outside modules: every module output and output gradient was finite at {where} (the loss?)"
            extra = {"phase": "outside-modules"}
        print(f"scalebox: {msg}", file=sys.stderr, flush=True)
        stabilizer.events.emit("nan_located", msg, site=self.site, step=self.step, **extra)
        stabilizer.flush()
        metrics.flush()
        sys.stdout.flush()
        os._exit(0)
