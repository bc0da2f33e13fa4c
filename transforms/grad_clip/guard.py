"""Emitting the inserted guard: the lines put before a step, in the form the mode and options ask
for, and the reason and exactness the site reports.

- ``guard`` (default): ``runtime.stabilizer.stabilize`` records the total norm, skips a step whose
  gradients are non-finite and reports a spike far above the norm's own history (``spikes =
  "clip"``: clips it); otherwise it writes nothing (``exact-until-intervention``). After the code's own clip it measures and skips only.
- ``fixed``: ``clip_grad_norm_(max_norm)`` on every step (``changes-semantics``); with
  ``skip_nonfinite`` the clip comes from the guard, which also skips.
- ``skip_nonfinite`` decides on the host (``sync=True``), so a non-finite step is skipped for any
  optimizer on any backend (on CUDA/NPU without it, only optimizers that take ``found_inf`` skip).
- AMP: ``scaler.unscale_(optimizer)`` goes first where the code does not unscale already.

The runtime names are imported once per module, on first use.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from scalebox_cst.report import CHANGES_SEMANTICS, EXACT_UNTIL_INTERVENTION

from ..base import FileContext
from .events import Event
from .options import Options
from .pairing import Pairing
from .recognise import GUARD_QUALNAME, RUNTIME_QUALNAME
from .window import Window

RUNTIME_ALIAS = "_scalebox_clip_grad_norm"
GUARD_ALIAS = "_scalebox_stabilize"


class Aliases:
    """The module's local names of the runtime's guard and fixed clip, imported on first use."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self._guard: Optional[str] = None
        self._clip: Optional[str] = None

    def guard(self) -> str:
        if self._guard is None:
            self._guard = self.ctx.runtime_name(GUARD_QUALNAME, GUARD_ALIAS)
        return self._guard

    def clip(self) -> str:
        if self._clip is None:
            self._clip = self.ctx.runtime_name(RUNTIME_QUALNAME, RUNTIME_ALIAS)
        return self._clip


def guard_lines(ctx: FileContext, opts: Options, aliases: Aliases, step: Event, pairing: Pairing,
                win: Window) -> Tuple[List[str], str, str]:
    """The statements to insert before ``step`` (in order), the site's reason and its exactness."""
    scaler, clips, clipped_at = win.scaler, win.clips, win.clipped_at
    texts: List[str] = []
    if step.role == "scaler" and not win.unscales:
        texts.append(f"{scaler}.unscale_({step.opt_text})")
    where = f"{ctx.path}:{ctx.original_line(step.call.lineno)}"
    between = f"between backward() (line {pairing.backward_line}) and step()"
    amp = f", scaler={scaler}" if scaler is not None else ""
    if opts.mode == "guard":
        alias = aliases.guard()
        if opts.skip_nonfinite:
            amp += ", sync=True"  # decide on the host: a true skip for any optimizer on any backend
        if clips:
            texts.append(f"{alias}({step.opt_text}, site={where!r}{amp}, spike=False)")
            reason = (f"guard {step.opt_text}'s step {between}, after the code's own clip (line {clipped_at}), with "
                      "stabilize: skips a non-finite step (no spike clip)")
        else:
            texts.append(f"{alias}({step.opt_text}, site={where!r}{amp}{opts.guard_args})")
            # what stabilize does and when: its contract (transforms/contracts.py, the site's details)
            spikes = "clips a spike" if opts.spikes == "clip" else "reports a spike"
            reason = f"guard {step.opt_text}'s step {between} with stabilize: skips a non-finite step, {spikes}"
        if scaler is not None:
            reason += "; GradScaler skips non-finite steps itself"
        if opts.skip_nonfinite:
            reason += "; checked on the host every step (skip_nonfinite)"
        exactness = EXACT_UNTIL_INTERVENTION
    elif opts.skip_nonfinite and clips:
        alias = aliases.guard()
        texts.append(f"{alias}({step.opt_text}, site={where!r}{amp}, spike=False, sync=True)")
        reason = (f"skip {step.opt_text}'s step if a gradient is non-finite (checked on the host every step) "
                  f"{between}; the code's own clip (line {clipped_at}) stays its only clip")
        exactness = EXACT_UNTIL_INTERVENTION
    elif opts.skip_nonfinite:
        alias = aliases.guard()
        texts.append(f"{alias}({step.opt_text}, site={where!r}{amp}, max_norm={opts.max_norm}, sync=True)")
        reason = (f"clip grad norm of {step.opt_text}'s params to max_norm={opts.max_norm} {between}, "
                  "and skip the step if a gradient is non-finite (checked on the host every step)")
        exactness = CHANGES_SEMANTICS
    else:
        texts.append(f"{aliases.clip()}({step.opt_text}, max_norm={opts.max_norm})")
        reason = f"clip grad norm of {step.opt_text}'s params to max_norm={opts.max_norm} {between}"
        exactness = CHANGES_SEMANTICS
    if len(texts) == 2:
        reason += f"; {texts[0]} inserted first (AMP gradients are scaled)"
    return texts, reason, exactness
