"""The ``[grad_clip]`` options, read and checked once per module: ``mode`` (``guard`` or ``fixed``),
``max_norm``, ``skip_nonfinite`` (what hot-fix branches set) and the guard's ``z``, ``ratio`` and
``warmup``. A bad value is one ``ValueError`` line naming the option.
"""
from __future__ import annotations

import dataclasses
import math

from ..base import FileContext

#: the transform's id, and its section of the config
ID = "grad_clip"
MODES = ("guard", "fixed")
#: guard options written into the call only when they differ from the runtime's defaults
GUARD_DEFAULTS = {"z": 10.0, "ratio": 100.0, "warmup": 25}


def number_text(value, key: str = "max_norm") -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"grad_clip.{key} must be a positive number, got {value!r}")
    return repr(value)


@dataclasses.dataclass(frozen=True)
class Options:
    mode: str
    max_norm: str
    skip_nonfinite: bool
    guard_args: str  # ", z=4.0" etc.: non-default guard options, in a fixed order

    @classmethod
    def read(cls, ctx: FileContext) -> "Options":
        mode = ctx.option(ID, "mode", "guard")
        if mode not in MODES:
            raise ValueError(f"grad_clip.mode must be one of {', '.join(MODES)}, got {mode!r}")
        skip = ctx.option(ID, "skip_nonfinite", False)
        if not isinstance(skip, bool):
            raise ValueError(f"grad_clip.skip_nonfinite must be true or false, got {skip!r}")
        args = []
        for key, default in GUARD_DEFAULTS.items():
            value = ctx.option(ID, key, default)
            text = number_text(value, key)
            if key == "warmup" and (isinstance(value, float) or value < 1):
                raise ValueError(f"grad_clip.warmup must be a positive integer, got {value!r}")
            if value != default:
                args.append(f", {key}={text}")
        return cls(mode, number_text(ctx.option(ID, "max_norm", 1.0)), skip, "".join(args))
