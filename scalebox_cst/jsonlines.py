"""Reading the append-only JSON-lines files of a run (``metrics.jsonl``, ``events.jsonl``,
``profile.jsonl``) honestly: every reader goes through :func:`read_lines` and :func:`parse`, and
what they skip is counted in one ``damage`` tally, ``{file name: lines skipped}``, that the
run's record, ``scalebox log``/``compare``/``profile`` and the monitor say in one line
(:func:`note`). Skipping without a word made a run whose file was cut by kill -9, a full disk
or a stray non-JSON line look complete: its numbers were shown as if nothing was missing.

A last line without its newline is not damage while its writer may still write it: it is left
for the next read. Once the writer has ended (``ended=True``) it is the file's last line: read
as one, and counted if it is not JSON (a line cut by kill -9)."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from scalebox_cst import intake
from scalebox_cst.intake import open_regular

#: no line of a run's series or events is this long (a point is ~100 bytes): unterminated bytes
#: beyond it are a writer's garbage, passed over, not read again on every poll (a script writing a
#: 300 MB line without a newline into metrics.jsonl held `scalebox run` at 1.3 GB)
LONGEST_LINE = 1 << 20
_PIECE = 1 << 22

#: ``{file name: damaged lines skipped}``; readers take one as ``damage`` (None: not counted)
Damage = Dict[str, int]


def count(damage: Optional[Damage], path: str, skipped: int = 1) -> None:
    """Add ``skipped`` lines of the file at ``path`` (by its name) to ``damage``."""
    if damage is not None and skipped > 0:
        name = os.path.basename(path)
        damage[name] = damage.get(name, 0) + skipped


def read_lines(path: str, offset: int, limit: Optional[int] = None, *, ended: bool = False,
               damage: Optional[Damage] = None) -> Tuple[List[bytes], int]:
    """Complete lines from byte ``offset`` and the offset after them (``limit``: stop once about
    that many bytes of lines are read; None: all). A last line without a newline is being
    written: left for the next call (``ended``: the writer is gone, so it is the last line),
    unless it is longer than :data:`LONGEST_LINE`: then passed over, and its rest, once its
    newline comes, reads as one malformed line (counted by :func:`parse`). Read in bounded pieces."""
    out: List[bytes] = []
    try:
        with open_regular(path) as fh:  # a FIFO in its place: no lines, not a reader blocked for ever
            fh.seek(offset)
            data, taken, passed = b"", 0, False
            while limit is None or taken < limit:
                piece = fh.read(_PIECE if limit is None else max(1, min(_PIECE, limit - taken)))
                if not piece:
                    break
                data += piece
                end = data.rfind(b"\n")
                if end >= 0:
                    out.extend(data[: end + 1].splitlines())
                    offset, taken, data, passed = offset + end + 1, taken + end + 1, data[end + 1:], False
                if len(data) > LONGEST_LINE:
                    offset, data, passed = offset + len(data), b"", True
            if ended and (limit is None or taken < limit):  # at the end of a file no one writes on
                if data:
                    out.append(data)  # its cut last line is a line (damaged, unless it parses)
                elif passed:
                    count(damage, path)  # it ended inside a line too long to keep
                offset += len(data)
    except OSError:  # absent, or a folder or FIFO in its place: nothing to read (as the monitor's reader)
        return [], offset
    return out, offset


def parse(lines: List[bytes], path: str, damage: Optional[Damage] = None) -> List[Any]:
    """The JSON values of ``lines`` (blank ones aside); a line that is not JSON is skipped and
    counted. One C-level parse of a clean chunk (2-3x faster than a json.loads per line)."""
    lines = [line for line in lines if line.strip()]
    if not lines:
        return []
    try:
        return intake.loads_state(b"[" + b",".join(lines) + b"]")
    except (ValueError, RecursionError):  # a malformed line somewhere (or one nested too deeply)
        out = []
        for line in lines:
            try:
                out.append(intake.loads_state(line))
            except (ValueError, RecursionError):
                count(damage, path)
        return out


def note(damage: Any) -> Optional[str]:
    """``metrics.jsonl: 2 damaged lines skipped`` (files joined by ``; ``), or None where nothing
    was skipped; ``damage`` as a record stores it (anything else: None)."""
    if not isinstance(damage, Mapping):
        return None
    parts = [f"{name}: {n} damaged line{'s' if n != 1 else ''} skipped" for name, n in sorted(damage.items())
             if isinstance(name, str) and type(n) is int and n > 0]
    return "; ".join(parts) or None
