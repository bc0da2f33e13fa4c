"""What a ``step()`` steps: an optimizer, a GradScaler (``scaler.step(optimizer)``), a scheduler or
something this cannot tell; and the text of the optimizer a guard would name.

The names' assignments decide first (``torch.optim.*`` versus ``lr_scheduler``), the receiver's
own name only where no assignment says, so ``env.step()`` and ``trainer.step()`` are left alone.
"""
from __future__ import annotations

import ast
from typing import Optional

from ..names import ast_dotted
from .events import Event, ModuleScan
from .recognise import NOT_OPTIMIZER_PREFIXES, looks_like_optimizer, plain_text, scaler_step_optimizer


def role(mod: ModuleScan, recv: ast.AST, text: Optional[str]) -> str:
    if text is None:
        return "unknown"
    if text in mod.scalers:
        return "scaler"
    base = ast_dotted(recv.value) if isinstance(recv, ast.Subscript) else text
    last = (base or text).rsplit(".", 1)[-1]
    quals = mod.assigned.get(text)
    if quals is None:
        quals = mod.by_last.get(last, set())
    if any(q.startswith(NOT_OPTIMIZER_PREFIXES) for q in quals):
        return "scheduler"
    if any(q.startswith("torch.optim.") for q in quals):
        return "optimizer"
    # an item read by a string key is named by the key: sheeprl keeps each critic's optimizer as
    # critic["optimizer"] (a dict per critic), optimizers["actor"] is named by the dict
    names = [last]
    if isinstance(recv, ast.Subscript) and isinstance(recv.slice, ast.Constant) and isinstance(recv.slice.value, str):
        names.append(recv.slice.value)
    if any("sched" in name.lower() for name in names):
        return "scheduler"
    if any(looks_like_optimizer(name) for name in names):
        return "optimizer"
    return "unknown"


def describe_step(source: str, mod: ModuleScan, ev: Event) -> None:
    """Fill in the step event's role, receiver text and optimizer text."""
    recv = ev.call.func.value
    ev.recv_text = plain_text(source, recv)
    ev.role = role(mod, recv, ev.recv_text)
    if ev.role == "scaler":
        arg = scaler_step_optimizer(ev.call)
        if arg is not None:
            ev.opt_text = plain_text(source, arg)
    elif ev.role in ("optimizer", "unknown"):
        ev.opt_text = ev.recv_text
