"""The monitor's HTTP server: a fixed route table over :class:`~scalebox_cst.monitor.api.Monitor`.

Only two kinds of path answer: the API routes in ``ROUTES`` and the static files in ``STATIC``,
a fixed allow-list of files shipped inside the package. No part of a URL is ever joined to a
path on disk, so any other request (``/../../etc/passwd``, ``/static/x``, ``/api/nope``) is a 404.

Bound to 127.0.0.1 by default. While it is bound to a loopback address, requests whose ``Host``
header names another host are refused (a page elsewhere cannot reach it through DNS rebinding).
JSON answers carry an ``ETag``; a poll that finds nothing new gets a ``304`` and no body.
"""
from __future__ import annotations

import hashlib
import http.server
import importlib.resources
import ipaddress
import json
import socket
import sys
import threading
import urllib.parse
from typing import Any, Callable, Dict, List, Optional, Tuple

from scalebox_cst.monitor.api import DEFAULT_POINTS, ApiError, Monitor, names_from_query

#: URL path -> (file inside scalebox_cst/monitor/static, content type)
STATIC: Dict[str, Tuple[str, str]] = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/profile.js": ("profile.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
    "/favicon.svg": ("favicon.svg", "image/svg+xml"),
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
    "/api/events": lambda m, q: m.events(limit=_int(q, "limit", 100), since=_float(q, "since", 0.0)),
}


def _static(name: str) -> bytes:
    return importlib.resources.files("scalebox_cst.monitor").joinpath("static", *name.split("/")).read_bytes()


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Handler(http.server.BaseHTTPRequestHandler):
    server: "MonitorServer"
    protocol_version = "HTTP/1.1"
    server_version = "scalebox-monitor"

    def log_message(self, format: str, *args: Any) -> None:  # quiet unless asked
        if self.server.verbose:
            sys.stderr.write("monitor: " + (format % args) + "\n")

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _host_allowed(self) -> bool:
        if not self.server.loopback:
            return True
        host = (self.headers.get("Host") or "").strip()
        if host.startswith("["):
            name = host[1:].partition("]")[0]
        else:
            name = host.rpartition(":")[0] if host.count(":") == 1 else host
        return _is_loopback(name)

    def _answer(self, head: bool) -> None:
        url = urllib.parse.urlsplit(self.path)
        path = url.path
        if not self._host_allowed():
            return self._send(403, b"forbidden host\n", "text/plain; charset=utf-8", head)
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
        body = json.dumps(data, allow_nan=False, separators=(",", ":"), default=str).encode()
        self._send(status, body, "application/json", head, cache="no-cache", etag=_etag(body))

    def _send(self, status: int, body: bytes, ctype: str, head: bool, cache: str = "no-store", etag: Optional[str] = None) -> None:
        if etag is not None and status == 200 and etag in _etags(self.headers.get("If-None-Match")):
            self.send_response(304)
            self.send_header("ETag", etag)
            self.send_header("Cache-Control", cache)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", cache)
        self.send_header("X-Content-Type-Options", "nosniff")
        if etag is not None:
            self.send_header("ETag", etag)
        self.end_headers()
        if not head:
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass


def _etag(body: bytes) -> str:
    return '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'


def _etags(header: Optional[str]) -> List[str]:
    return [t.strip().removeprefix("W/") for t in (header or "").split(",") if t.strip()]


class MonitorServer(http.server.ThreadingHTTPServer):
    """A threaded HTTP server for one :class:`Monitor`; ``serve_forever`` until ``shutdown``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, monitor: Monitor, host: str = "127.0.0.1", port: int = 8080, verbose: bool = False) -> None:
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), Handler)
        self.monitor = monitor
        self.verbose = verbose
        self.loopback = _is_loopback(host)
        self._static: Dict[str, bytes] = {}

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
