"""The ``[grad_clip]`` options, read and checked once per module: ``mode`` (``guard`` or ``fixed``),
``max_norm``, ``skip_nonfinite`` (what hot-fix branches set) and the guard's ``z``, ``ratio``,
``warmup`` and ``spikes`` (``report``, the default, or ``clip``). A bad value is one ``ValueError`` line naming the option.
"""
from __future__ import annotations

import dataclasses

from scalebox_cst.options import checked, default

from ..base import FileContext

#: the transform's id, and its section of the config
ID = "grad_clip"
MODES = ("guard", "fixed")
#: guard options written into the call only when they differ from the runtime's defaults (which
#: are the schema's: scalebox_cst.options)
GUARD_DEFAULTS = {key: default(ID, key) for key in ("z", "ratio", "warmup")}


def number_text(value, key: str = "max_norm") -> str:
    checked(ID, key, value)
    return repr(value)


@dataclasses.dataclass(frozen=True)
class Options:
    mode: str
    max_norm: str
    skip_nonfinite: bool
    guard_args: str  # ", z=4.0" etc.: non-default guard options, in a fixed order
    spikes: str = "report"  # what the guard does with a spike: report or clip

    @classmethod
    def read(cls, ctx: FileContext) -> "Options":
        """The options, each checked by the schema's one check (a bad value: one ValueError line)."""
        mode = checked(ID, "mode", ctx.option(ID, "mode", default(ID, "mode")))
        skip = checked(ID, "skip_nonfinite", ctx.option(ID, "skip_nonfinite", default(ID, "skip_nonfinite")))
        max_norm = ctx.option(ID, "max_norm", default(ID, "max_norm"))
        args = []
        for key, d in GUARD_DEFAULTS.items():
            value = ctx.option(ID, key, d)
            text = number_text(value, key)
            if value != d:
                args.append(f", {key}={text}")
        spikes = checked(ID, "spikes", ctx.option(ID, "spikes", default(ID, "spikes")))
        if spikes != default(ID, "spikes"):
            args.append(f", spike={spikes!r}")
        return cls(mode, number_text(max_norm), skip, "".join(args), spikes)
