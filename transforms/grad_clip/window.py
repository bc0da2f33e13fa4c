"""What stands between a backward() run and its step(), and so whether and how a guard goes in:
a clip placed before backward() (warned: backward() recomputes what it clipped), our own guard (a
second rewrite), the code's own clip (on any branch: a conditional clip is the user's choice),
accelerate's backward(), and AMP (the GradScaler, and whether ``unscale_`` runs on every path).
"""
from __future__ import annotations

import ast
import dataclasses
from typing import List, Optional, Set, Tuple, Union

from ..base import FileContext
from ..names import ast_dotted
from .events import Event, ModuleScan, dominates
from .options import Options
from .pairing import Pairing
from .recognise import plain_text, scaler_of


@dataclasses.dataclass
class Window:
    clips: List[Event]  # the code's own clips between backward() and step()
    clipped_at: Optional[int]  # the first one's line (quoted in reasons: the pipeline maps it back)
    scaler: Optional[str]  # the GradScaler that scales these gradients
    unscales: List[Event]  # its unscale_(optimizer) calls before the step


def clip_warnings(ctx: FileContext, pairing: Pairing, step: Event, opts: Options,
                  warned: Set[int]) -> List[Tuple[ast.AST, str]]:
    """(node, warning) for each clip before the run not warned about yet (``warned``: call ids)."""
    out: List[Tuple[ast.AST, str]] = []
    for e in pairing.before_run():
        if e.kind == "clip" and id(e.call) not in warned:
            warned.add(id(e.call))
            out.append((e.stmt if e.loc is not None else e.call,
                        f"clip before backward() has no effect (backward() at line "
                        f"{pairing.backward_line} recomputes the gradients); a "
                        f"{'guard' if opts.mode == 'guard' else 'clip'} is inserted before step() at line "
                        f"{step.call.lineno}"))
    return out


def read_window(ctx: FileContext, mod: ModuleScan, pairing: Pairing, step: Event, opts: Options) -> Union[Window, str]:
    """What is between the run and ``step``, or the reason the step is left alone."""
    window = pairing.window()
    guards = [e for e in window if e.kind == "guard"]
    if guards:
        return f"already guarded (line {guards[0].call.lineno}) before step()"
    clips = [e for e in window if e.kind == "clip"]
    clipped_at = clips[0].call.lineno if clips else None
    if clips and opts.mode == "fixed" and not opts.skip_nonfinite:
        return (f"already clipped (line {clipped_at}) between backward() "
                f"(line {pairing.first_line}) and step()")
    for e in pairing.group:
        recv = e.call.func.value if isinstance(e.call.func, ast.Attribute) else None
        text = ast_dotted(recv) if recv is not None else None
        if text is not None and (text in mod.accelerators or text.rsplit(".", 1)[-1] == "accelerator"):
            return "accelerate's backward() may scale gradients; clip with accelerator.clip_grad_norm_ (not inserted)"
    # where the guard would stand: right before the step, naming its optimizer
    if not step.direct:
        return "step() is part of a larger expression; cannot place a clip right before it"
    if step.opt_text is None:
        return "the optimizer is not a plain name or attribute; not clipped"

    scaled = [x for x in (scaler_of(e.call) for e in pairing.group) if x is not None]
    scaler = step.recv_text if step.role == "scaler" else (scaled[0] if scaled else None)
    unscales = [] if scaler is None else [
        e for e in pairing.after_start()
        if e.kind == "unscale" and ast_dotted(e.call.func.value) == scaler and len(e.call.args) == 1
        and plain_text(ctx.code, e.call.args[0]) == step.opt_text
    ]
    if unscales and not any(dominates(e.path, step.path) for e in unscales):
        return (f"{scaler}.unscale_({step.opt_text}) is called only on some paths before step(); another "
                "unscale_ would raise where it ran, and no unscale_ would clip scaled gradients; not clipped")
    if step.role != "scaler" and scaler is not None and not unscales:
        return (f"gradients are scaled by {scaler}.scale() but stepped with a plain step(), not "
                f"{scaler}.step(); clipping scaled gradients would be wrong; not clipped")
    return Window(clips, clipped_at, scaler, unscales)
