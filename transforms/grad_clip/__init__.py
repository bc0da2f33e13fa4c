"""Insert a gradient guard (or a fixed clip) between ``backward()`` and each optimizer ``step()``.

RL training loops are prone to exploding gradients and rarely clip. ``[grad_clip] mode``:
``"guard"`` (default) inserts ``runtime.stabilizer.stabilize``, which records the total norm, skips
a step whose gradients are non-finite and clips a spike far above the norm's own history, and
otherwise writes nothing, so healthy runs are bitwise the original's (``exact-until-intervention``;
inserted also where the code clips already, measuring and skipping only). ``"fixed"`` clips to
``max_norm`` on every step (``changes-semantics``), only where the code does not clip.

Each scope (module level, each function, each class body) is read as its calls in source order: a
``step()`` is paired with the run of ``backward()`` calls before it and guarded only when nothing
in that window already guards or (in fixed mode) clips. Traps handled: AMP (``scaler.unscale_``
first), clipping before ``backward()`` (warned), conditional clipping, several optimizers after one
backward, backward in a loop with the step after it, gradient accumulation, ``step(closure)``,
schedulers and ``env.step(action)``.

Layout (one concept per module, dependencies one way): :mod:`.recognise` what clips, guards,
scales and steps, by qualified name; :mod:`.events` the scan of each scope's calls and where they
sit; :mod:`.steps` what a ``step()`` steps; :mod:`.pairing` the backward() run that feeds a step;
:mod:`.window` what stands between them (clips, guards, accelerate, AMP); :mod:`.options` the
``[grad_clip]`` options; :mod:`.guard` the inserted lines and the site's reason; :mod:`.insert` the
libcst side; :mod:`.examples`; :mod:`.transform` the ``Transform``.
"""
from __future__ import annotations

from .events import Event, ModuleScan
from .guard import GUARD_ALIAS, RUNTIME_ALIAS
from .insert import StructureMismatch
from .options import GUARD_DEFAULTS, ID, MODES, Options
from .recognise import (
    ACCELERATORS,
    CLIP_NAME_PREFIX,
    CLIP_QUALNAMES,
    GRAD_SCALERS,
    GUARD_QUALNAME,
    GUARD_QUALNAMES,
    NOT_OPTIMIZER_PREFIXES,
    RUNTIME_QUALNAME,
    looks_like_optimizer,
)
from .transform import GradClip

__all__ = [
    "ACCELERATORS", "CLIP_NAME_PREFIX", "CLIP_QUALNAMES", "GRAD_SCALERS", "GUARD_ALIAS", "GUARD_DEFAULTS",
    "GUARD_QUALNAME", "GUARD_QUALNAMES", "ID", "MODES", "NOT_OPTIMIZER_PREFIXES", "RUNTIME_ALIAS",
    "RUNTIME_QUALNAME", "Event", "GradClip", "ModuleScan", "Options", "StructureMismatch", "looks_like_optimizer",
]
