"""``scalebox monitor``: a local web page with a project's branches, curves, diffs and events.

:mod:`~scalebox_cst.monitor.api` turns the project's files into JSON (read-only, incremental,
downsampled), :mod:`~scalebox_cst.monitor.server` serves it and the page under ``static/``
(uPlot is bundled there: the page needs no network).
"""
from scalebox_cst.monitor.api import Monitor
from scalebox_cst.monitor.server import MonitorServer

__all__ = ["Monitor", "MonitorServer"]
