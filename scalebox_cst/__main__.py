"""``python -m scalebox_cst [-p PACKAGE]... [--project DIR] SCRIPT [ARGS...]``

Runs SCRIPT as ``__main__`` with the import hook on, the way ``python -m cProfile`` runs a
script under the profiler: the script and the project modules it imports are rewritten (each
rewrite committed before it runs), with ``sys.argv`` = [SCRIPT, *ARGS].
"""
from __future__ import annotations

import argparse
import os
import sys


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m scalebox_cst",
        description="Run a script with its project's modules rewritten on import (each rewrite committed first).",
    )
    parser.add_argument("-p", "--package", action="append", default=[], help="rewrite this top-level package (repeatable; default: the script's project)")
    parser.add_argument("--project", help="project folder (default: the nearest one holding .scalebox/ or scalebox.toml above the script)")
    parser.add_argument("--backend", choices=("auto", "cpu", "cuda", "npu"), help="rewrite target (default: the config's)")
    parser.add_argument("--no-cache", action="store_true", help="do not read or write .scalebox/pycache/")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        os.getcwd()
    except FileNotFoundError:  # the script's folder and the project are found from it
        parser.exit(1, "python -m scalebox_cst: the current folder no longer exists (deleted or moved away); "
                       "cd into an existing folder and run it again\n")

    from scalebox_cst.importhook import run_script

    run_script(ns.script, ns.args, ns.package, ns.project, ns.backend, not ns.no_cache)


if __name__ == "__main__":
    main()
