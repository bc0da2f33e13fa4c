"""The study's journal file (``.scalebox/explore/<study>/journal.log``): checked before Optuna
opens it, repaired when only its last record is damaged, and never left ending in a partial
record by our own writes.

Optuna's ``JournalFileBackend`` skips a last line that is cut short or garbled when it reads,
but appends the next record right after it: ``...}\\n{"op`` + ``{"op_code": ...}\\n`` is a
garbled line in the middle, and every later read fails with ``JSONDecodeError``. So: a write
that fails (ENOSPC) is undone (the file truncated back to where the write began, which needs
no space), and ``--resume`` cuts a damaged last record off (keeping a copy of the file) before
the first append. A damaged record anywhere else is one line naming its line number.
"""
from __future__ import annotations

import json
import os
import stat
import time
from typing import Callable, Optional

from scalebox_cst import statedir, tmpnames

JOURNAL = "journal.log"


class JournalError(RuntimeError):
    """The journal cannot be read or written; the message is one line."""


def _rel(path: str) -> str:
    parts = os.path.normpath(path).split(os.sep)
    return os.path.join(*parts[-4:]) if len(parts) >= 4 else path


def _bad(line: bytes) -> Optional[str]:
    """Why ``line`` (with its newline, if any) is not a journal record, or None."""
    if not line.endswith(b"\n"):
        return "cut short"
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return "not JSON"
    if not isinstance(record, dict) or "op_code" not in record:
        return "not a journal record"
    if record["op_code"] not in _op_codes():  # Optuna's replay asserts ("Should not reach."): a traceback
        return f"a record of an unknown operation ({str(record['op_code'])[:20]})"
    return None


def _op_codes() -> frozenset:
    try:
        from optuna.storages.journal._storage import JournalOperation
    except ImportError:  # another Optuna: every integer
        return _AnyInt()
    return frozenset(op.value for op in JournalOperation)


class _AnyInt(frozenset):
    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)


def check(path: str, repair: bool, echo: Optional[Callable[[str], None]] = None) -> None:
    """Raise JournalError unless ``path`` is absent or a readable journal. A damaged tail (the last
    record cut short or garbled, or trailing NUL bytes) is cut off when ``repair`` (the original
    kept beside it as ``journal.log.damaged-<time>``; ``echo`` says so in one line), else left
    for Optuna's reader, which skips it. A damaged record before the last: JournalError."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise JournalError(f"{_rel(path)}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(info.st_mode):  # a repair truncated the link's target: a file outside the project
        raise JournalError(f"{_rel(path)}: {statedir.LinkInState(path).strerror}")
    if not stat.S_ISREG(info.st_mode):
        raise JournalError(f"{_rel(path)}: not a regular file; move it away to start the study again")
    try:
        fd = statedir.open_in_place(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the lstat
                raise JournalError(f"{_rel(path)}: not a regular file; move it away to start the study again")
            with os.fdopen(os.dup(fd), "rb") as fh:
                data = fh.read()
        finally:
            os.close(fd)
    except OSError as exc:
        raise JournalError(f"{_rel(path)}: {exc.strerror or exc}") from None
    lines = data.splitlines(keepends=True)
    offset = 0
    for number, line in enumerate(lines, start=1):
        why = _bad(line)
        if why is None:
            offset += len(line)
            continue
        rest = lines[number:]
        if rest and not all(not r.strip(b"\0 \t\r\n") for r in rest):
            raise JournalError(f"{_rel(path)}: line {number} of {len(lines)} is {why}; the study cannot be read "
                               "(move the file away, or delete that line to keep the rest)")
        if repair:
            _cut(path, data, offset, number, why, echo)
        return


def _cut(path: str, data: bytes, offset: int, number: int, why: str, echo: Optional[Callable[[str], None]]) -> None:
    copy = f"{path}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
    try:  # the bytes checked are copied, and the file itself is cut: never a link's target
        for n in range(100):  # two repairs in one second: the second copy beside the first
            try:
                fd = statedir.open_in_place(copy if not n else f"{copy}.{n}", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
                break
            except FileExistsError:
                if n == 99:
                    raise
        try:
            tmpnames.write_all(fd, data)
        finally:
            os.close(fd)
        fd = statedir.open_in_place(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, offset)
        finally:
            os.close(fd)
    except OSError as exc:
        raise JournalError(f"{_rel(path)}: its last record (line {number}) is {why} and could not be repaired: "
                           f"{exc.strerror or exc}") from None
    if echo is not None:
        echo(f"scalebox: {_rel(path)}: its last record (line {number}) was {why}; cut off "
             f"({len(data) - offset} bytes), the original kept as {os.path.basename(copy)}")


def backend(path: str):
    """Optuna's journal file backend for ``path`` whose failed appends leave the file as it was."""
    try:
        from optuna.storages.journal import JournalFileBackend
        from optuna.storages.journal._file import get_lock_file
    except ImportError:  # optuna 3.x: its own backend as it is
        import optuna

        return optuna.storages.JournalFileStorage(path)

    class _Backend(JournalFileBackend):
        def append_logs(self, logs):  # as Optuna's, plus the undo of a failed write
            text = "\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n"
            data = text.encode("utf-8")
            with get_lock_file(self._lock):
                fd = statedir.open_in_place(self._file_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                try:
                    start = os.fstat(fd).st_size
                    try:
                        tmpnames.write_all(fd, data)  # unbuffered: nothing is left for a close
                        os.fsync(fd)
                    except OSError:
                        try:
                            os.ftruncate(fd, start)
                        except OSError:
                            pass
                        raise
                finally:
                    os.close(fd)

    return _Backend(path)
