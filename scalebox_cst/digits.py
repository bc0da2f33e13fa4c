"""Whether a name is a number the engine wrote: ASCII digits only.

``str.isdigit()`` is true of ``²`` and ``١٢٣٤`` too, which ``int()`` then reads (``run/١٢٣٤`` made
the next branch ``run/1235``) or refuses (``²``: a traceback). Run numbers, branch numbers,
ranks and settings are written by the engine or typed by a user in ASCII, so a name of any other
digits is not one of them. One check for every such place: written out beside each other, one of
them read ``not s.isascii() and s.isdigit()``. Standard library only (the runtime uses it).
"""
from __future__ import annotations

import math
import os
import sys


def ascii_digits(text: str) -> bool:
    """``text`` is one or more ASCII digits ``0``-``9``."""
    return text.isascii() and text.isdigit()


def setting(name: str, default: float, low: float, high: float) -> float:
    """The number the environment variable ``name`` holds, if it is one a person could mean: ASCII,
    finite, within ``[low, high]``. Unset or empty: ``default``. Anything else (text, ``nan``,
    ``inf``, ``1e400``, a negative size, digits of another script) is ``default`` too, said in one
    line on stderr: a bare ``float()`` was a traceback where it raised (``int(inf)``, ``'abc'``, in the
    user's process for the telemetry's variables) and, where it did not, a cache of one byte, a
    sampler spinning with no pause, or nan reaching every comparison."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text) if text.isascii() else math.nan
    except ValueError:
        value = math.nan
    if math.isfinite(value) and low <= value <= high:
        return value
    try:
        sys.stderr.write(f"scalebox: {name}={text!a} is not a number from {_shown(low)} to {_shown(high)}; using {_shown(default)}\n")
    except (OSError, ValueError, AttributeError):  # no stderr, or a closed one: the default all the same
        pass
    return default


def _shown(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else f"{number:g}"
