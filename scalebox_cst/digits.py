"""Whether a name is a number the engine wrote: ASCII digits only.

``str.isdigit()`` is true of ``²`` and ``١٢٣٤`` too, which ``int()`` then reads (``run/١٢٣٤`` made
the next branch ``run/1235``) or refuses (``²``: a traceback). Run numbers, branch numbers,
ranks and settings are written by the engine or typed by a user in ASCII, so a name of any other
digits is not one of them. One check for every such place: written out beside each other, one of
them read ``not s.isascii() and s.isdigit()``. Standard library only (the runtime uses it).
"""
from __future__ import annotations


def ascii_digits(text: str) -> bool:
    """``text`` is one or more ASCII digits ``0``-``9``."""
    return text.isascii() and text.isdigit()
