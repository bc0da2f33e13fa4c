"""The console scripts (``scalebox``, ``scalebox-watch``): Ctrl-C while the command's modules
load (click, pygit2, the engine: the first tenths of a second) ends it with one line and status
130 (:func:`scalebox_cst.runner.signals.starting`), not a ``KeyboardInterrupt`` traceback from
inside an import. Once loaded, the commands handle SIGINT themselves."""
from scalebox_cst.runner import signals


def _load():
    with signals.starting():
        from scalebox_cst import cli
    return cli


def main() -> None:
    _load().main()


def watch_main() -> None:
    _load().watch_main()
