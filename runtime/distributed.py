"""Inside a torchrun run: torchrun itself (the run's child) and each rank, under the host's
:mod:`scalebox_cst.runner.torchrun` (which builds the command line and keeps the record).

``python -m scalebox_cst.runtime.distributed --torchrun TORCHRUN_ARGS`` is torch.distributed's
elastic launcher (``torch.distributed.run``, the engine behind ``torchrun``) with an end-with-parent
watch; each worker it starts is ``python -m scalebox_cst.runtime.distributed STORE COMMIT PROJECT
SCRIPT ARGS``: :func:`main`, which serves the same commit through ``runtime.launch`` (the one way to
run a commit), so every rank runs the same rewrite. Rendezvous, ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``,
restarts and stopping the group are torchrun's; the collective backend is the script's own
(``device.placement`` turns ``"nccl"`` into ``"hccl"`` for NPU; on CPU scripts use gloo).

Per rank, in the run folder (layout: scalebox_cst.runs):
``ranks/<k>/rank.json`` (rank, local rank, node, host, pid), ``ranks/<k>/log.txt`` (the rank's
stdout and stderr, torchrun's ``--redirects`` file, hard-linked), ``ranks/<k>/failure.json``
(when it raised). Rank 0's telemetry is the run's (``metrics.jsonl``, ``events.jsonl``,
``sites.json`` in the run folder: training scripts log on rank 0); rank k > 0 writes its own into
``ranks/<k>/``. A worker whose torchrun is gone (killed) ends its own process group (runtime.launch).
"""
from __future__ import annotations

import json
import os
import socket
import stat
import sys
import time
from typing import Any, Dict, List, Optional

from scalebox_cst import tmpnames
from scalebox_cst.runtime.lifeline import ENV_RUN_DIR
from scalebox_cst.runtime.metrics import ENV_FILE

#: the per-rank telemetry folder of rank k (rank 0 uses the run folder itself)
RANKS = "ranks"
RANK_INFO = "rank.json"
FAILURE = "failure.json"
TORCHRUN_FLAG = "--torchrun"


def rank_dir(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, RANKS, str(rank))


# ------------------------------------------------------------------------------ torchrun, the child
def _torchrun(argv: List[str]) -> None:
    """torchrun in this process, ended (with its workers: its SIGTERM handler stops them) when
    the executor that started it dies without stopping it, as a local run's child is: the watch
    starts before torch is imported (runtime.lifeline)."""
    from scalebox_cst.runtime import lifeline

    lifeline.hold(grace=10.0)
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import SignalException

    try:
        run.main(argv)
    except SignalException as exc:
        # the stop the run's supervisor sent (Ctrl-C, SIGTERM): the agent has already stopped its
        # workers; its exception's traceback is not news to the user, who is told once by the host
        raise SystemExit(128 + int(exc.sigval)) from None


# ------------------------------------------------------------------------------ inside a rank
def _same_file(fd: int, path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return stat.S_ISREG(a.st_mode) and (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _write_json(path: str, data: Dict[str, Any]) -> None:
    tmpnames.write_replacing(path, json.dumps(data, indent=2).encode("utf-8"), tmpnames.sibling(path, tmpnames.writer_id()))


def _link(src: str, dst: str) -> None:
    """``dst`` names the same file as ``src`` (a hard link; a symlink across file systems)."""
    try:
        os.remove(dst)
    except FileNotFoundError:
        pass
    try:
        os.link(src, dst)
    except OSError:
        os.symlink(os.path.relpath(src, os.path.dirname(dst)), dst)


def _setup_rank(run_dir: str) -> Dict[str, Any]:
    """Per-rank files and telemetry paths; returns the rank's ``rank.json``."""
    rank = int(os.environ.get("RANK", "0"))
    folder = rank_dir(run_dir, rank)
    os.makedirs(folder, exist_ok=True)
    info: Dict[str, Any] = {
        "rank": rank,
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "node_rank": int(os.environ.get("GROUP_RANK", "0")),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.time(),
        "log": None,
    }
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE") or ""
    stdout_log = os.path.join(os.path.dirname(error_file), "stdout.log") if error_file else ""
    if stdout_log and _same_file(1, stdout_log):
        os.dup2(1, 2)  # one file per rank, in the order written (as log.txt of a local run)
        _link(stdout_log, os.path.join(folder, "log.txt"))
        info["log"] = os.path.relpath(os.path.join(folder, "log.txt"), run_dir)
    try:
        os.remove(os.path.join(folder, FAILURE))  # a restart's rank starts clean
    except FileNotFoundError:
        pass
    if rank != 0:
        os.environ[ENV_FILE] = os.path.join(folder, "metrics.jsonl")
        os.environ[ENV_RUN_DIR] = folder
    _write_json(os.path.join(folder, RANK_INFO), info)
    return info


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m scalebox_cst.runtime.distributed STORE COMMIT PROJECT SCRIPT [ARGS]``: a worker
    of torchrun; ``... --torchrun TORCHRUN_ARGS``: torchrun itself, as the run's child."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [TORCHRUN_FLAG]:
        _torchrun(argv[1:])
        return
    run_dir = os.environ.get(ENV_RUN_DIR)
    folder = None
    if run_dir:
        folder = rank_dir(run_dir, _setup_rank(run_dir)["rank"])
    from scalebox_cst.runtime import launch

    try:
        launch.main(argv)
    except SystemExit as exc:
        if exc.code not in (None, 0) and folder is not None:
            _write_json(os.path.join(folder, FAILURE), {"time": time.time(), "error": f"SystemExit: {exc.code}"})
        raise
    except BaseException as exc:
        if folder is not None and not isinstance(exc, KeyboardInterrupt):
            _write_json(os.path.join(folder, FAILURE), {"time": time.time(), "error": f"{type(exc).__name__}: {exc}"})
        raise


if __name__ == "__main__":
    main()
