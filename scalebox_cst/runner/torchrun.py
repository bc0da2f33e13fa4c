"""One run on many processes, from the host: a committed branch under torch.distributed's elastic launcher.

``scalebox run --nproc N`` makes torch.distributed's elastic launcher (``torch.distributed.run``,
the engine behind ``torchrun``, run in ``python -m scalebox_cst.runtime.distributed --torchrun``,
which only adds an end-with-parent watch) the run's child; torchrun starts N workers per node,
each ``python -m scalebox_cst.runtime.distributed STORE COMMIT PROJECT SCRIPT ARGS``: that
module's ``main`` (in-process code), which serves the same commit through ``runtime.launch`` (the one way to
run a commit), so every rank runs the same rewrite. Rendezvous, ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``,
restarts and stopping the group are torchrun's; the collective backend is the script's own
(``device.placement`` turns ``"nccl"`` into ``"hccl"`` for NPU; on CPU scripts use gloo).

Per rank, in the run folder (layout: scalebox_cst.runs):
``ranks/<k>/rank.json`` (rank, local rank, node, host, pid), ``ranks/<k>/log.txt`` (the rank's
stdout and stderr, torchrun's ``--redirects`` file, hard-linked), ``ranks/<k>/failure.json``
(when it raised). Rank 0's telemetry is the run's (``metrics.jsonl``, ``events.jsonl``,
``sites.json`` in the run folder: training scripts log on rank 0); rank k > 0 writes its own into
``ranks/<k>/``. ``log.txt`` of the run is torchrun's console, each rank's line prefixed ``[rank<k>]:``.

A failing rank fails the run (torchrun stops the others); the record's ``error_tail`` is the
traceback of the rank that failed first. Stopping the run signals torchrun, which stops its
workers; a worker whose torchrun is gone (killed) ends its own process group (runtime.launch).
"""
from __future__ import annotations

import math
import os
import re
import sys
from typing import Any, Dict, List, Optional, Sequence, TypedDict

from scalebox_cst import intake, runs
from scalebox_cst.intake import open_regular
from scalebox_cst.runner import execution as executor
from scalebox_cst.runner.record import error_tail
from scalebox_cst.runtime.distributed import FAILURE, RANK_INFO, RANKS, TORCHRUN_FLAG, rank_dir
from scalebox_cst.digits import ascii_digits

#: torchrun's per-rank files go under the run folder, here
TORCHRUN_LOGS = "torchrun"
#: prefix of each rank's console line (torchrun's log_line_prefix_template, global rank)
PREFIX_TEMPLATE = "[rank${rank}]:"
_PREFIXED = re.compile(r"^\[rank(\d+)\]:(.*)$", re.S)
#: what torch.distributed's excepthook puts before each traceback line of a rank
_TRACEBACK_PREFIX = re.compile(r"^\[rank\d+\]: ?")


#: the keyword options of :class:`TorchrunExecution` that are torchrun's (a supervisor's
#: ``torchrun=`` holds only these; the rest of a run's options are the supervisor's)
OPTIONS = ("nproc", "nnodes", "rdzv_endpoint", "rdzv_backend", "rdzv_id", "node_rank", "max_restarts", "torchrun_args")


class _Options(TypedDict):
    """:func:`torchrun_command`'s options, as a run holds them."""

    nproc: int
    nnodes: str
    rdzv_endpoint: Optional[str]
    rdzv_backend: str
    rdzv_id: Optional[str]
    node_rank: Optional[int]
    max_restarts: int
    extra: List[str]


def split_prefixed(line: str):
    """``(rank, text)`` for a console line torchrun prefixed with ``[rank<k>]:``, else ``(None, line)``."""
    match = _PREFIXED.match(line)
    if match is None:
        return None, line
    return int(match.group(1)), match.group(2)


def torchrun_command(
    python: str,
    run_dir: str,
    nproc: int,
    nnodes: str = "1",
    rdzv_endpoint: Optional[str] = None,
    rdzv_backend: str = "c10d",
    rdzv_id: Optional[str] = None,
    node_rank: Optional[int] = None,
    max_restarts: int = 0,
    extra: Sequence[str] = (),
) -> List[str]:
    """The command line up to (and including) the worker module; the launch arguments follow.

    One node without an endpoint is torchrun's ``--standalone`` (a local rendezvous on a free
    port). Several nodes need ``--rdzv-endpoint HOST:PORT`` (c10d: the first node to come hosts
    the store) and the same ``--rdzv-id`` everywhere (default: the endpoint)."""
    if nproc < 1:
        raise ValueError(f"--nproc must be at least 1, got {nproc}")
    cmd = [python, "-m", "scalebox_cst.runtime.distributed", TORCHRUN_FLAG, "--nproc-per-node", str(nproc), "--nnodes", str(nnodes)]
    single = str(nnodes) in ("1", "1:1")
    if rdzv_endpoint is None:
        if not single:
            raise ValueError("--nnodes above 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
        cmd.append("--standalone")
    else:
        cmd += ["--rdzv-backend", rdzv_backend, "--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id or f"scalebox-{rdzv_endpoint}"]
    if node_rank is not None:
        cmd += ["--node-rank", str(node_rank)]
    cmd += [
        "--max-restarts", str(max_restarts),
        "--log-dir", os.path.join(run_dir, TORCHRUN_LOGS),
        # stdout to a file per rank (the worker sends its stderr there too) and to the console
        "--redirects", "1", "--tee", "1",
        *extra,
        "--module", "scalebox_cst.runtime.distributed",
    ]
    return cmd


def torchrun_env(env: Dict[str, str]) -> Dict[str, str]:
    """The launcher's environment: console lines carry the global rank."""
    env = dict(env)
    env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = PREFIX_TEMPLATE
    return env


# ------------------------------------------------------------------------------ on the host
class TorchrunExecution(executor.Execution):
    """A run whose child is torchrun: the executor's record, log, stop and telemetry, with
    the command, key=value lines and the end of the record per rank.

    ``nproc``: workers on this node; ``nnodes`` (``"2"`` or an elastic ``"1:4"``),
    ``rdzv_endpoint``, ``rdzv_id``, ``node_rank``, ``max_restarts`` as torchrun's options;
    ``torchrun_args``: more of torchrun's own options, passed as given."""

    def __init__(
        self,
        store_path: str,
        project_dir: str,
        runs_root: str,
        branch: str,
        commit: str,
        script: str,
        args: List[str],
        *,
        nproc: int,
        nnodes: str = "1",
        rdzv_endpoint: Optional[str] = None,
        rdzv_backend: str = "c10d",
        rdzv_id: Optional[str] = None,
        node_rank: Optional[int] = None,
        max_restarts: int = 0,
        torchrun_args: Sequence[str] = (),
        env: Optional[Dict[str, str]] = None,
        **kwargs: Any,
    ) -> None:
        self._options = _Options(
            nproc=int(nproc), nnodes=str(nnodes), rdzv_endpoint=rdzv_endpoint, rdzv_backend=rdzv_backend,
            rdzv_id=rdzv_id, node_rank=node_rank, max_restarts=int(max_restarts), extra=list(torchrun_args),
        )
        torchrun_command(sys.executable, "", **self._options)  # bad options fail before a run folder is made
        self._rank_counters: Dict[int, Dict[str, int]] = {}
        self._ranks: List[Dict[str, Any]] = []
        super().__init__(store_path, project_dir, runs_root, branch, commit, script, args, env=torchrun_env(dict(os.environ if env is None else env)), **kwargs)

    def _command(self, python, store_path, commit, project_dir, script, args):
        self.record.launcher = "torchrun"
        self.record.nproc = self._options["nproc"]
        return [*torchrun_command(python, self.dir, **self._options), store_path, commit, project_dir, script, *args]

    def _line_metrics(self, line: str) -> None:
        rank, text = split_prefixed(line)
        if rank is None:
            return  # torchrun's own messages
        values = executor.parse_metric_line(text)
        if not values:
            return
        if rank == 0:
            self._append_key_values(values)
            return
        folder = rank_dir(self.dir, rank)
        os.makedirs(folder, exist_ok=True)
        self._append_key_values(values, os.path.join(folder, "metrics.jsonl"), self._rank_counters.setdefault(rank, {}))

    def _write_record(self) -> None:
        data = self.record.to_json()
        data["torchrun"] = {k: v for k, v in self._options.items() if k != "extra"} | {"args": self._options["extra"]}
        data["ranks"] = self._ranks
        # across nodes each node records its ranks as a run: the one with global rank 0 holds the
        # run's telemetry (readers comparing runs count that one; None until the ranks are known)
        data["primary"] = any(r.get("rank") == 0 for r in self._ranks) if self._ranks else None
        runs.write_record(self.dir, data)

    def wait(self, timeout: Optional[float] = None):
        rec = super().wait(timeout)
        ranks = rank_records(self.dir)
        failed = first_failure(ranks)
        self._ranks = [
            {k: r.get(k) for k in ("rank", "local_rank", "node_rank", "host", "pid", "log")}
            | {"failed": bool(r.get("failure")), "error": (r.get("failure") or {}).get("error")}
            for r in ranks
        ]
        if rec.status == "failed" and failed is not None:
            lines = rank_log_lines(self.dir, failed)
            rec.error_tail = [failed_first_line(failed, self._options["nnodes"]), *error_tail(lines)]
        self._write_record()
        return rec


# ------------------------------------------------------------------------------ after the run
def rank_records(run_dir: str) -> List[Dict[str, Any]]:
    """``rank.json`` of every rank that started on this node, with its failure (if any), by rank."""
    out = []
    base = os.path.join(run_dir, RANKS)
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return []
    for name in sorted(names, key=lambda n: int(n) if ascii_digits(n) else -1):
        if not ascii_digits(name):
            continue
        # the rank's process (the user's script) can write anything there: a file that is not a
        # JSON object ([1]: 'info["failure"] = ...' raised) or a failure whose time is no finite
        # number (min() compared a list with a float) is read as no file
        info = intake.state_json(os.path.join(base, name, RANK_INFO))
        if not isinstance(info, dict):
            continue
        failure = intake.state_json(os.path.join(base, name, FAILURE))
        if isinstance(failure, dict):
            stamp = failure.get("time")
            if not (isinstance(stamp, (int, float)) and not isinstance(stamp, bool) and math.isfinite(stamp)):
                failure["time"] = 0.0
        info["failure"] = failure if isinstance(failure, dict) else None
        out.append(info)
    return out


def first_failure(ranks: Sequence[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The rank that failed first (the others often fail because it did: a peer closed)."""
    failed = [r for r in ranks if r.get("failure")]
    return min(failed, key=lambda r: r["failure"].get("time", 0.0)) if failed else None


def failed_first_line(failed: Dict[str, Any], nnodes: str) -> str:
    """The error tail's first line. Across nodes, a node sees only its own ranks: a rank on another
    node may have failed earlier (that node's record says so), so the line says "on this node"."""
    where = "" if str(nnodes) in ("1", "1:1") else " on this node"
    return f"rank {failed.get('rank')} failed first{where}: {(failed.get('failure') or {}).get('error')}"


def rank_log_lines(run_dir: str, rank: Dict[str, Any]) -> List[str]:
    """The failed rank's log lines; its path comes from the rank's own ``rank.json`` (written in
    the training process), so only a file inside the run folder is read: its tail goes into the
    record, which the monitor serves."""
    log = rank.get("log")
    if not isinstance(log, str) or not log or "\0" in log:  # (a NUL made realpath raise)
        return []
    folder = os.path.realpath(run_dir)
    path = os.path.realpath(os.path.join(folder, log))
    if os.path.commonpath([path, folder]) != folder:
        return []
    try:
        with open_regular(path, "r", encoding="utf-8", errors="replace") as fh:
            return [_TRACEBACK_PREFIX.sub("", line) for line in fh]
    except OSError:
        return []
