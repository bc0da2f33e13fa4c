"""Who may read the monitor: the ``Host`` names it serves, and what it tells the user on a public bind.

The page and its API show a project's source diffs, file paths, metrics and the tracebacks of
failed runs, with no login. On loopback only this machine can connect; a page on another site
could still reach it through DNS rebinding (its own name resolving to 127.0.0.1), which the
``Host`` check stops: a rebound request names the attacker's host. A bind to another address
(``--host 0.0.0.0``, ``::``, a LAN address) lets every machine that can reach the port read
all of it, so :func:`exposure_warning` says so, and the ``Host`` check stays on: requests must
name a loopback name, the bound address (for a wildcard bind: the address the connection came
in on) or a name given with ``--allow-host``.
"""
from __future__ import annotations

import ipaddress
import re
from typing import Iterable, Optional, Union

IP = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

#: what a --allow-host NAME may be besides an IP address: DNS labels (``localhost``, ``gpu-box.lan``)
_NAME = re.compile(r"(?=.{1,253}\Z)[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)*\Z")


class HostError(ValueError):
    """A --allow-host value that is not a host name or address (the message is one line)."""


def _ip(text: str) -> Optional[IP]:
    try:
        ip = ipaddress.ip_address(text.partition("%")[0])  # (a zone id: fe80::1%eth0)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # a "::" socket sees IPv4 clients as ::ffff:a.b.c.d
    return ip


def _normal(name: str) -> str:
    return name.strip().lower().rstrip(".")


def host_of(header: Optional[str]) -> str:
    """The host part of a ``Host`` header (``name:port``, ``[v6]:port``), lower case; '' if none."""
    host = (header or "").strip()
    if host.startswith("["):
        return _normal(host[1:].partition("]")[0])
    return _normal(host.rpartition(":")[0] if host.count(":") == 1 else host)


def is_loopback(host: str) -> bool:
    ip = _ip(host)
    return ip.is_loopback if ip is not None else _normal(host) == "localhost"


def is_wildcard(host: str) -> bool:
    ip = _ip(host)
    return ip is not None and ip.is_unspecified


def checked_name(value: str) -> str:
    """A --allow-host value, normalised; :class:`HostError` for anything else."""
    name = _normal(value)
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if _ip(name) is not None or _NAME.match(name):
        return name
    raise HostError(f"--allow-host {value!r} is not a host name or IP address")


class HostCheck:
    """Which ``Host`` headers a monitor bound to ``bound`` answers (see the module docstring)."""

    def __init__(self, bound: str, allowed: Iterable[str] = ()) -> None:
        self.names = {checked_name(n) for n in allowed}
        self.ips = {ip for ip in map(_ip, self.names) if ip is not None}
        self.bound = _ip(bound)
        self.wildcard = self.bound is not None and self.bound.is_unspecified
        if self.bound is None:  # bound by name (``--host myhost``): that name is served
            self.names.add(_normal(bound))

    def allows(self, header: Optional[str], local_address: str = "") -> bool:
        name = host_of(header)
        if not name:
            return False
        if name in self.names or name == "localhost":
            return True
        ip = _ip(name)
        if ip is None:
            return False
        if ip.is_loopback or ip == self.bound or ip in self.ips:
            return True
        # A wildcard bind serves every address of this machine: the one this connection came in on.
        return self.wildcard and ip == _ip(local_address)


def refusal(header: Optional[str]) -> bytes:
    """The body of a 403 for a foreign ``Host``: which name, and how to serve it on purpose."""
    name = "".join(c for c in host_of(header)[:100] if c.isprintable() and c.isascii()) or "(none)"
    return f"forbidden host {name}: this monitor serves it only when started with --allow-host {name}\n".encode()


def exposure_warning(host: str, port: int, allowed: Iterable[str] = ()) -> Optional[str]:
    """The warning for a bind that is not loopback-only (None on loopback)."""
    if is_loopback(host):
        return None
    where = f"all addresses of this machine ({host})" if is_wildcard(host) else host
    names = ["localhost", "127.0.0.1", "::1", "the address it is reached at" if is_wildcard(host) else host]
    names += sorted(checked_name(n) for n in allowed)
    return (
        f"scalebox: warning: the monitor listens on {where}, port {port}, not only loopback: anyone who can "
        f"reach it can read this project's source diffs, file paths, run metrics and the tracebacks of failed "
        f"runs (there is no login). Requests must name one of: {', '.join(names)} (add names with --allow-host)."
    )
