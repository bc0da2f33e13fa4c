"""``scalebox monitor``: the live page of a project's branches and runs (scalebox_cst.monitor)."""
from __future__ import annotations

import signal
from typing import Tuple

import click

from scalebox_cst.cli._common import FiniteFloat, _fail, cli
from scalebox_cst.config import find_project_root
from scalebox_cst.store import StoreError


# ---------------------------------------------------------------------------- monitor
def _interrupt(*_) -> None:
    raise KeyboardInterrupt


@cli.command()
@click.argument("directory", default=".", type=click.Path(file_okay=False, exists=True))
@click.option("--web-port", "port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="Port (0: any free one).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind; another than loopback exposes the page (a warning says to whom).")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME", help="Also answer requests naming NAME in their Host header (repeatable; loopback names and the bound address always are).")
@click.option("--refresh-interval", type=FiniteFloat(min=0.25, max=3600), default=2.0, show_default=True, help="Seconds between the page's polls.")
@click.option("--verbose", is_flag=True, help="Log each request to stderr.")
def monitor(directory: str, port: int, host: str, allow_hosts: Tuple[str, ...], refresh_interval: float, verbose: bool) -> None:
    """Serve a live page of DIRECTORY's branches, curves, diffs and events (read-only)."""
    from scalebox_cst.monitor import Monitor, MonitorServer
    from scalebox_cst.monitor.access import HostError, checked_name, exposure_warning

    try:
        for name in allow_hosts:
            checked_name(name)
    except HostError as exc:
        _fail(str(exc))
    root = find_project_root(directory)
    try:
        data = Monitor(root, refresh_interval=refresh_interval)
    except StoreError as exc:
        _fail(str(exc))
    try:
        server = MonitorServer(data, host=host, port=port, verbose=verbose, allow_hosts=allow_hosts)
    except OSError as exc:
        import socket

        hint = "check --host" if isinstance(exc, socket.gaierror) else "try another --web-port"
        _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc} ({hint})")
    click.echo(f"scalebox: monitor of {data.root} on {server.url} (refresh {refresh_interval:g}s); Ctrl-C to stop", err=True)
    warning = exposure_warning(host, server.server_address[1], allow_hosts)
    if warning:
        click.echo(warning, err=True)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        data.close()
