"""The monitor's HTTP server: a fixed route table over :class:`~scalebox_cst.monitor.api.Monitor`.

Only two kinds of path answer: the API routes in ``ROUTES`` and the static files in ``STATIC``,
a fixed allow-list of files shipped inside the package. No part of a URL is ever joined to a
path on disk, so any other request (``/../../etc/passwd``, ``/static/x``, ``/api/nope``) is a 404.

Bound to 127.0.0.1 by default. Requests whose ``Host`` header names a host it was not asked to
serve are refused, on any bind (:mod:`~scalebox_cst.monitor.access`: a page elsewhere cannot reach
it through DNS rebinding). JSON answers carry an ``ETag``; a poll that finds nothing new gets a
``304`` and no body.

A connection holds one thread, and at most ``max_connections`` are served at once. A request
must arrive whole within ``request_timeout`` seconds of the connection starting to wait for it
(a client that trickles bytes gets no more time), and an answer must be taken within as long;
else the connection is closed. When all are taken, a new connection takes the place of the one
that has waited longest for its request (half-open, or kept alive and idle: closed unanswered),
so a flood of half-open connections holds a bounded number of threads for a bounded time and
does not lock out a client that sends its request; only when every thread is busy answering
does a new connection get a ``503`` at once (a thread that has answered and is on its way to
wait or end is waited for, up to a second). (Every answer is a short JSON or static file: no
endpoint streams; the page polls, and a kept-alive connection idle that long is closed, which
browsers reopen.)
"""
from __future__ import annotations

import errno
import hashlib
import http.server
import importlib.resources
import json
import math
import os
import select
import socket
import sys
import threading
import time
import urllib.parse
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from scalebox_cst.explore import monitor_api as explore_api
from scalebox_cst.monitor.access import HostCheck, refusal
from scalebox_cst.monitor.api import DEFAULT_POINTS, ApiError, Monitor, names_from_query

#: URL path -> (file inside scalebox_cst/monitor/static, content type)
STATIC: Dict[str, Tuple[str, str]] = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/profile.js": ("profile.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
    "/favicon.svg": ("favicon.svg", "image/svg+xml"),
    "/study": ("study.html", "text/html; charset=utf-8"),
    "/study.js": ("study.js", "text/javascript; charset=utf-8"),
    "/vendor/uPlot.iife.min.js": ("vendor/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "/vendor/uPlot.min.css": ("vendor/uPlot.min.css", "text/css; charset=utf-8"),
    "/vendor/uPlot.LICENSE": ("vendor/uPlot.LICENSE", "text/plain; charset=utf-8"),
}

Query = Dict[str, List[str]]


def _one(query: Query, key: str, default: Optional[str] = None) -> Optional[str]:
    values = query.get(key)
    return values[-1] if values else default


def _int(query: Query, key: str, default: int) -> int:
    raw = _one(query, key)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ApiError(f"{key} must be an integer, got {raw!r}") from None


def _float(query: Query, key: str, default: float) -> float:
    raw = _one(query, key)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ApiError(f"{key} must be a number, got {raw!r}") from None


def _required(query: Query, key: str) -> str:
    value = _one(query, key)
    if not value:
        raise ApiError(f"missing query parameter {key}")
    return value


#: URL path -> function (monitor, query) -> JSON-ready data
ROUTES: Dict[str, Callable[[Monitor, Query], Any]] = {
    "/api/project": lambda m, q: m.project(),
    "/api/branches": lambda m, q: m.branches(),
    "/api/runs": lambda m, q: m.runs(_required(q, "branch")),
    "/api/metrics": lambda m, q: m.metric_names(names_from_query(q.get("branch", [])), names_from_query(q.get("run", []))),
    "/api/series": lambda m, q: m.series(
        _required(q, "metric"),
        names_from_query(q.get("branch", [])),
        names_from_query(q.get("run", [])),
        axis=_one(q, "axis", "step"),
        points=_int(q, "points", DEFAULT_POINTS),
    ),
    "/api/diff": lambda m, q: m.diff(_required(q, "branch")),
    "/api/sites": lambda m, q: m.sites(_required(q, "branch")),
    "/api/studies": lambda m, q: explore_api.studies(m.root),
    "/api/study": lambda m, q: explore_api.study(m.root, _required(q, "name")),
    "/api/events": lambda m, q: m.events(limit=_int(q, "limit", 100), since=_float(q, "since", 0.0)),
}


def _static(name: str) -> bytes:
    return importlib.resources.files("scalebox_cst.monitor").joinpath("static", *name.split("/")).read_bytes()


class _RequestReader:
    """The request side of a connection: lines and bytes off the socket, each ``recv`` given only
    the time left until ``deadline`` (``time.monotonic()``; None: the socket's own timeout), so a
    request trickled a byte at a time still ends at its deadline (``TimeoutError``, which
    ``handle_one_request`` answers by closing the connection)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.deadline: Optional[float] = None
        self.closed = False
        self.eof = False  # the client closed (or the server evicted it)

    def _fill(self) -> bool:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request did not arrive in time")
            self.sock.settimeout(left)
        data = self.sock.recv(65536)
        self.buffer += data
        self.eof = not data
        return bool(data)

    def readline(self, limit: int = -1) -> bytes:
        while True:
            end = self.buffer.find(b"\n") + 1 or None
            if limit >= 0 and len(self.buffer) >= limit:
                end = min(end or limit, limit)
            if end is not None or not self._fill():
                end = end or len(self.buffer)
                line = bytes(self.buffer[:end])
                del self.buffer[:end]
                return line

    def read(self, size: int = -1) -> bytes:
        while (size < 0 or len(self.buffer) < size) and self._fill():
            pass
        size = len(self.buffer) if size < 0 else min(size, len(self.buffer))
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    def close(self) -> None:
        self.closed = True


class Handler(http.server.BaseHTTPRequestHandler):
    server: "MonitorServer"
    protocol_version = "HTTP/1.1"
    server_version = "scalebox-monitor"
    #: a reply is two writes (headers, then body): with Nagle's algorithm on, the body waited for
    #: the client's delayed ACK, ~40 ms per request on a kept-alive connection (the leak campaign)
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # quiet unless asked
        if self.server.verbose:
            sys.stderr.write("monitor: " + (format % args) + "\n")

    def setup(self) -> None:
        self.timeout = self.server.request_timeout  # (``setup`` puts it on the socket: writes)
        super().setup()
        self.rfile = _RequestReader(self.connection)  # type: ignore[assignment]
        self._first = True  # the accepting thread marked the first request waiting, in accept order

    def handle_one_request(self) -> None:
        self.rfile.deadline = time.monotonic() + self.server.request_timeout  # type: ignore[attr-defined]
        if self._first:
            self._first = False
        else:  # a keep-alive connection's next request
            self.server.waiting(self.connection, True)
        try:
            super().handle_one_request()
        finally:
            self.server.waiting(self.connection, False)

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _answer(self, head: bool) -> None:
        if not self.server.waiting(self.connection, False) or self.rfile.eof:  # type: ignore[attr-defined]
            self.close_connection = True  # evicted, or the head was cut short: no one to answer
            return
        self.server.answering(self.connection, True)
        self.connection.settimeout(self.server.request_timeout)  # the answer's own time to be taken
        try:
            url = urllib.parse.urlsplit(self.path)
        except ValueError:  # "GET http://[::1/ HTTP/1.1" (an IPv6 host left open): the client's error
            return self._send(400, b"bad request\n", "text/plain; charset=utf-8", head)
        path = url.path
        host = self.headers.get("Host")
        if not self.server.hosts.allows(host, self.connection.getsockname()[0]):
            return self._send(403, refusal(host), "text/plain; charset=utf-8", head)
        if path in STATIC:
            name, ctype = STATIC[path]
            body = self.server.static_bytes(name)
            return self._send(200, body, ctype, head, cache="no-cache", etag=_etag(body))
        route = ROUTES.get(path)
        if route is None:
            return self._send(404, b"not found\n", "text/plain; charset=utf-8", head)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=False)
        try:
            data = route(self.server.monitor, query)
            status = 200
        except ApiError as exc:
            data, status = {"error": str(exc)}, exc.status
        except Exception as exc:  # one bad project file must not take the page down
            data, status = {"error": f"{type(exc).__name__}: {exc}"}, 500
        try:
            body = json.dumps(data, allow_nan=False, separators=(",", ":"), default=str).encode()
        except ValueError:  # a nan or inf left in the data (a damaged record, an option): as strings
            body = json.dumps(finite_json(data), allow_nan=False, separators=(",", ":"), default=str).encode()
        self._send(status, body, "application/json", head, cache="no-cache", etag=_etag(body))

    def _send(self, status: int, body: bytes, ctype: str, head: bool, cache: str = "no-store", etag: Optional[str] = None) -> None:
        try:
            self._write(status, body, ctype, head, cache, etag)
        finally:  # (the client gone mid-answer)
            self._last_write()

    def _last_write(self) -> None:
        """The answer's last bytes go next: once they arrive, the client may ask again at once, on
        a new connection, before this thread has freed its slot; it waits for the slot then, where
        it is told 503 while every thread works out an answer. (Unmarked only after the write, the
        client could be told 503 for its own first connection.)"""
        self.server.answering(self.connection, False)

    def _write(self, status: int, body: bytes, ctype: str, head: bool, cache: str, etag: Optional[str]) -> None:
        if etag is not None and status == 200 and etag in _etags(self.headers.get("If-None-Match")):
            self.send_response(304)
            self.send_header("ETag", etag)
            self.send_header("Cache-Control", cache)
            self.send_header("Content-Length", "0")
            self._last_write()
            self.end_headers()
            return
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", cache)
        self.send_header("X-Content-Type-Options", "nosniff")
        if etag is not None:
            self.send_header("ETag", etag)
        if head:
            self._last_write()
        self.end_headers()
        if not head:
            self._last_write()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass


def _reserve() -> Optional[int]:
    try:
        return os.open(os.devnull, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None


def _etag(body: bytes) -> str:
    return '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'


def _etags(header: Optional[str]) -> List[str]:
    return [t.strip().removeprefix("W/") for t in (header or "").split(",") if t.strip()]


#: what a connection over ``max_connections`` is told before it is closed
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: 31\r\nRetry-After: 1\r\nConnection: close\r\n\r\nmonitor busy: too many clients\n")


class MonitorServer(http.server.ThreadingHTTPServer):
    """A threaded HTTP server for one :class:`Monitor`; ``serve_forever`` until ``shutdown``.

    ``allow_hosts``: more ``Host`` names to serve (``--allow-host``); ``max_connections`` and
    ``request_timeout`` bound the threads and the time half-open connections hold them."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    _spare: Optional[int] = None  # (``server_close`` runs when binding fails, before __init__ sets it)

    def __init__(self, monitor: Monitor, host: str = "127.0.0.1", port: int = 8080, verbose: bool = False,
                 allow_hosts: Sequence[str] = (), max_connections: int = 64, request_timeout: float = 10.0) -> None:
        self.hosts = HostCheck(host, allow_hosts)  # (a bad name fails before the port is taken)
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), Handler)
        self.monitor = monitor
        self.verbose = verbose
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self._waiting: Dict[socket.socket, None] = {}  # connections waiting for a request, oldest first
        self._waiting_lock = threading.Lock()
        self._answering: Dict[socket.socket, None] = {}  # threads working out an answer
        self._stuck = False  # the last wait for a thread on its way out ran out (see _take_slot)
        self._static: Dict[str, bytes] = {}
        self._spare: Optional[int] = _reserve()  # given up to answer a connection when out of descriptors

    def get_request(self) -> Tuple[socket.socket, Any]:
        """``accept``; out of file descriptors (``EMFILE``: a low ``ulimit -n``, every thread
        busy), the connection waiting first is answered 503 through the descriptor kept in
        reserve and closed. Left in the backlog, it kept the listening socket readable and
        ``serve_forever`` called ``accept`` again at once: one core at 100% until a descriptor was
        free (found by the fourth fault campaign, ``ulimit -n 40`` and 120 clients)."""
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self._shed()
            raise

    def _shed(self) -> None:
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
            try:
                request, _ = self.socket.accept()
            except OSError:
                request = None
            if request is not None:
                try:
                    request.settimeout(0.05)
                    request.sendall(BUSY)
                except OSError:
                    pass
                self.shutdown_request(request)
            self._spare = _reserve()
        if self._spare is None:  # nothing to answer with: wait instead of spinning on accept
            time.sleep(0.05)

    def server_close(self) -> None:
        super().server_close()
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None

    def waiting(self, connection: socket.socket, wait: bool) -> bool:
        """Mark ``connection`` as waiting for its request (or not); False if it was evicted."""
        with self._waiting_lock:
            if wait:
                self._waiting[connection] = None
                return True
            return self._waiting.pop(connection, False) is None

    def answering(self, connection: socket.socket, busy: bool) -> None:
        """Mark ``connection``'s thread as working out an answer (or no longer: writing it, then
        waiting for a next request or ending)."""
        with self._waiting_lock:
            if busy:
                self._answering[connection] = None
            else:
                self._answering.pop(connection, None)

    def _take_slot(self) -> bool:
        """A slot for a new connection: a free one; else the one of the connection that has waited
        longest for its request (evicted); else, unless every thread is working out an answer, the
        slot of a thread on its way in or out, once it is free or its connection waits (up to a
        second). A client that had its answer and asked again at once was told 503 while its first
        thread was on its way out (CI, under load). A wait that ran out (threads stuck writing to
        clients that do not read) is not waited again until a slot is free: a flood of them costs
        the accepting thread one second, not one a connection."""
        if self._slots.acquire(blocking=False):
            self._stuck = False
            return True
        deadline = time.monotonic() + 1.0
        while True:
            if self._evict():
                return self._slots.acquire(timeout=1.0)
            with self._waiting_lock:
                all_busy = len(self._answering) >= self.max_connections
            if all_busy or self._stuck:
                return False
            if self._slots.acquire(timeout=0.01):
                return True
            if time.monotonic() > deadline:
                self._stuck = True
                return False

    def _evict(self) -> bool:
        """Close the connection that has waited longest for its request (its thread then ends)."""
        with self._waiting_lock:
            if not self._waiting:
                return False
            oldest = next(iter(self._waiting))
            del self._waiting[oldest]
        try:
            oldest.shutdown(socket.SHUT_RDWR)  # wakes its thread's recv with an end of file
        except OSError:
            pass
        return True

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._take_slot():
            return self._refuse(request)
        # waiting from here, in the order connections were accepted: marked by its own thread, a
        # connection could queue behind a later one (threads start in any order under load), and
        # the later one was evicted first
        self.waiting(request, True)
        try:
            super().process_request(request, client_address)
        except Exception:  # no thread started (it could not be made): its slot is free again
            self.waiting(request, False)
            self._slots.release()
            self.shutdown_request(request)
            raise
        # A KeyboardInterrupt (the monitor's SIGTERM) raised in ``Thread.start`` while it waits for
        # the new thread is not undone here: that thread may have served the request and freed its
        # slot already, and a second release raised ValueError in place of the interrupt, which
        # socketserver reports and serves on (a SIGTERM lost: the monitor ran until the next one).

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.answering(request, False)  # (a route that raised)
            self._slots.release()
            self._stuck = False

    def _refuse(self, request: socket.socket) -> None:
        """Every thread busy answering: a 503 without blocking this (the accepting) thread, then close."""
        try:
            select.select([request], [], [], 0.05)  # its request, if on the way: unread bytes
            request.setblocking(False)             # at close would reset the 503 away
            try:
                request.recv(65536)
            except OSError:
                pass
            request.send(BUSY)
        except OSError:
            pass
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone mid-request (reset, broken pipe) is no error of ours: quiet unless verbose."""
        if self.verbose or not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        return f"http://{shown}:{port}/"

    def static_bytes(self, name: str) -> bytes:
        body = self._static.get(name)
        if body is None:
            body = self._static[name] = _static(name)
        return body

    def start_background(self) -> threading.Thread:
        """Serve in a daemon thread (tests, embedding); stop with ``shutdown()`` then ``server_close()``."""
        from scalebox_cst.runtime import threads

        return threads.start_daemon(self.serve_forever, "scalebox-monitor")


def finite_json(value: Any) -> Any:
    """``value`` with every non-finite float as the string ``"nan"``, ``"inf"`` or ``"-inf"`` (the
    API's documented encoding), so that no answer fails to encode."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value
