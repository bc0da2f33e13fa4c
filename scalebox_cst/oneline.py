"""An exception as the one line the engine says about it.

Why one module: the host and the user's process both report errors they caught (a config that
does not load, torch_npu that cannot import, a compile that fell back, a study that stops) and
each had its own three-line helper, with small differences (the type's name or not, the first
line or the whole message joined). A message here reads the same wherever it is said. Standard
library only: the runtime imports it.
"""
from __future__ import annotations

from typing import Optional


def error_line(exc: BaseException, typed: bool = True, limit: Optional[int] = None) -> str:
    """``Type: first line of the message``, its whitespace collapsed (``typed=False``: the line
    alone; ``limit``: at most that many characters of it); the type's name where there is no
    message (``MemoryError()``, ``KeyboardInterrupt()``)."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    text = " ".join(lines[0].split()) if lines else ""
    if limit is not None:
        text = text[:limit]
    if not text:
        return type(exc).__name__
    return f"{type(exc).__name__}: {text}" if typed else text
