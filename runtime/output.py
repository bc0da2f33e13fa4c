"""The child's output on its way to the terminal and the run folder, one stream at a time.

``scalebox run`` reads the child's stdout and stderr from two pipes, each by its own thread
(:class:`StreamPump`), so the two stay apart: stdout goes to the terminal's stdout and to
``log.txt``, stderr to the terminal's stderr and to ``stderr.txt``. Bytes pass through as the
child wrote them (a ``\\r`` that redraws a progress bar stays a ``\\r``), each chunk written to
its file with one ``os.write`` as it arrives: what the terminal showed is on disk even when
``scalebox run`` is killed with SIGKILL a moment later.

Metrics and the error tail read *logical lines*: a segment ended by ``\\n``, ``\\r\\n`` or a lone
``\\r`` (a progress bar's redraw), per stream, so ``ppo step=200 reward=...`` printed to stdout
while a tqdm bar redraws on stderr is one line of its own (:class:`LineSplitter`).

Recording can fail while the run goes on (a full disk: ENOSPC, a file size limit: EFBIG).
:class:`Recorder` then stops every write to the run folder, says so in one line and lets the
pumps keep draining the pipes to the terminal: a dead reader would leave the child blocked on a
full pipe forever.
"""
from __future__ import annotations

import os
import threading
from typing import IO, Callable, List, Optional, Tuple

from scalebox_cst.statedir import NOFOLLOW as _NOFOLLOW  # a run folder's files: never through a link


class LineSplitter:
    """Bytes in, logical lines out: ``(text, ended_by_cr)`` per line ended by ``\\n``, ``\\r\\n``
    or ``\\r``; a partial line waits for the next chunk (:meth:`close` returns it).

    Each chunk is searched once and a partial line grows in place, so a line of any length costs
    time linear in its bytes (joining the partial line to every 64 KiB chunk and searching it
    again was quadratic: a 60 MiB line without a newline took 36 s and blocked the child on its
    pipe). A partial line of :data:`MAX_LINE` bytes is handed on as a line of its own (no
    metric or error line is that long), so memory stays bounded."""

    #: the longest partial line kept; longer ones are handed on in pieces of this size
    MAX_LINE = 1 << 20

    def __init__(self) -> None:
        self._partial = bytearray()
        self._cr = False  # the last chunk ended with "\r": a "\n" may open the next one

    def _take(self, tail: bytes) -> str:
        self._partial += tail
        text = self._partial.decode("utf-8", "replace")
        self._partial = bytearray()
        return text

    def feed(self, data: bytes) -> List[Tuple[str, bool]]:
        out: List[Tuple[str, bool]] = []
        start, n = 0, len(data)
        if self._cr and n:
            self._cr = False
            if data[0] == 0x0A:  # "\r\n" split across two chunks: one end
                out.append((self._take(b""), False))
                start = 1
            else:
                out.append((self._take(b""), True))
        while start < n:
            nl = data.find(b"\n", start)
            cr = data.find(b"\r", start)
            if nl < 0 and cr < 0:
                self._partial += data[start:]
                break
            if cr < 0 or 0 <= nl < cr:
                out.append((self._take(data[start:nl]), False))
                start = nl + 1
            elif cr + 1 == n:
                self._partial += data[start:cr]
                self._cr = True  # "\r" last: a "\n" may follow in the next chunk
                break
            elif data[cr + 1] == 0x0A:
                out.append((self._take(data[start:cr]), False))
                start = cr + 2
            else:
                out.append((self._take(data[start:cr]), True))
                start = cr + 1
        while len(self._partial) >= self.MAX_LINE and not self._cr:
            piece = bytes(self._partial[: self.MAX_LINE])
            del self._partial[: self.MAX_LINE]
            out.append((piece.decode("utf-8", "replace"), False))
        return out

    def close(self) -> Optional[Tuple[str, bool]]:
        """The last line if it had no end (the child's final ``print(..., end="")``)."""
        if not self._partial and not self._cr:
            return None
        cr, self._cr = self._cr, False
        return self._take(b""), cr


class Console:
    """Writes raw bytes to a text stream (its ``.buffer`` when it has one, so ``\\r`` and the
    child's encoding pass unchanged), optionally starting every line with ``prefix``. A closed
    or broken terminal is ignored: the run goes on."""

    def __init__(self, stream: Optional[IO[str]], prefix: str = "") -> None:
        self.stream = stream
        self.prefix = prefix.encode("utf-8")
        self._at_line_start = True

    def _prefixed(self, data: bytes) -> bytes:
        out = bytearray()
        for piece in data.splitlines(keepends=True):
            if self._at_line_start:
                out += self.prefix
            out += piece
            self._at_line_start = piece.endswith((b"\n", b"\r"))
        return bytes(out)

    def write(self, data: bytes) -> None:
        if self.stream is None or not data:
            return
        if self.prefix:
            data = self._prefixed(data)
        try:
            buffer = getattr(self.stream, "buffer", None)
            if buffer is not None:
                self.stream.flush()  # what was written as text before comes first
                buffer.write(data)
                buffer.flush()
            else:
                self.stream.write(data.decode("utf-8", "replace"))
                self.stream.flush()
        except (OSError, ValueError):
            pass


class Recorder:
    """The run folder's writer of output and metrics. The first failed write (ENOSPC, EFBIG,
    EIO...) stops all recording with one line through ``notice``; writes after it are dropped."""

    def __init__(self, directory: str, label: str, notice: Callable[[str], None]) -> None:
        self.dir = directory
        self.label = label
        self.notice = notice
        self.error: Optional[str] = None
        self._lock = threading.Lock()
        self._fds = {}

    @property
    def ok(self) -> bool:
        return self.error is None

    def open(self, name: str) -> None:
        """Create (truncate) ``name`` in the run folder, unbuffered: each write is one ``os.write``."""
        self._guard(name, lambda: self._fds.setdefault(name, os.open(os.path.join(self.dir, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | _NOFOLLOW, 0o644)))

    def write(self, name: str, data: bytes) -> None:
        fd = self._fds.get(name)
        if fd is None or self.error is not None or not data:
            return
        self._guard(name, lambda: _write_all(fd, data))

    def append(self, path: str, data: bytes) -> None:
        """One ``os.write`` on an O_APPEND descriptor of ``path`` (whole lines beside other writers)."""
        if self.error is not None:
            return

        def write() -> None:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, 0o644)
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)

        self._guard(os.path.relpath(path, self.dir), write)

    def fail(self, what: str, exc: BaseException) -> None:
        """Stop recording because of ``exc`` (said once)."""
        with self._lock:
            if self.error is not None:
                return
            self.error = f"{what}: {exc}"
        self.notice(f"scalebox: {self.label}: recording stopped ({self.error}); the run goes on, its output on the terminal only")

    def _guard(self, what: str, action: Callable[[], object]) -> None:
        try:
            action()
        except OSError as exc:
            self.fail(what, exc)

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class StreamPump:
    """One pipe of the child: every chunk to the console and the recorder as it comes, every
    logical line to ``on_line(text, ended_by_cr)``. Runs until the pipe's end (EOF)."""

    CHUNK = 65536

    def __init__(self, fd: int, console: Console, recorder: Recorder, file_name: str,
                 on_line: Callable[[str, bool], None], on_activity: Callable[[], None]) -> None:
        self.fd = fd
        self.console = console
        self.recorder = recorder
        self.file_name = file_name
        self.on_line = on_line
        self.on_activity = on_activity
        self.splitter = LineSplitter()

    def run(self) -> None:
        """Until EOF; the descriptor stays open (its owner, a Popen file object, closes it: a
        second close here could close a number another run's file was given since)."""
        while True:
            try:
                data = os.read(self.fd, self.CHUNK)
            except InterruptedError:
                continue
            except OSError:
                break
            if not data:
                break
            self.on_activity()
            self.recorder.write(self.file_name, data)  # first: what the terminal shows is on disk
            self.console.write(data)
            for text, cr in self.splitter.feed(data):
                self._line(text, cr)
        rest = self.splitter.close()
        if rest is not None:
            self._line(*rest)

    def _line(self, text: str, cr: bool) -> None:
        try:
            self.on_line(text, cr)
        except OSError as exc:  # a metrics write: recording stops, the pump goes on
            self.recorder.fail("metrics", exc)
