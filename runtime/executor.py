"""Run a committed rewrite in a subprocess and keep its record (exit, wall time, metrics, log).

The child is ``runtime.launch``, which serves the script and project modules from the commit.
Its output is echoed and logged; lines made only of ``key=value`` numeric tokens (``step=2048
episode_return=23.5``) become metrics beside what rewritten code records (``grad_norm``). Stopping
sends SIGINT to the child's process group, then SIGTERM after a grace period, then SIGKILL.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Dict, List, Optional

from scalebox_cst.runtime.metrics import ENV_FILE, Stats

_TOKEN = re.compile(r"^([A-Za-z_][\w./-]*)=(\S+)$")


def parse_metric_line(line: str) -> Dict[str, float]:
    """``{"step": 2048.0, ...}`` for a line made only of numeric key=value tokens, else {}."""
    tokens = line.split()
    out: Dict[str, float] = {}
    for token in tokens:
        match = _TOKEN.match(token)
        if not match:
            return {}
        try:
            out[match.group(1)] = float(match.group(2))
        except ValueError:
            return {}
    return out


@dataclasses.dataclass
class RunRecord:
    branch: str
    commit: str
    script: str
    args: List[str]
    started: float
    ended: Optional[float] = None
    wall_time: Optional[float] = None
    exit_status: Optional[int] = None
    stopped: bool = False  # ended by us (a newer change), not by itself
    metrics: Dict[str, Dict[str, float]] = dataclasses.field(default_factory=dict)

    @property
    def status(self) -> str:
        if self.exit_status is None:
            return "running"
        if self.stopped:
            return "stopped"
        return "ok" if self.exit_status == 0 else f"failed ({self.exit_status})"

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["status"] = self.status
        return data

    @classmethod
    def from_json(cls, data: dict) -> "RunRecord":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


def run_dir(runs_root: str, branch: str) -> str:
    return os.path.join(runs_root, *branch.split("/"))


def load_record(runs_root: str, branch: str) -> Optional[RunRecord]:
    path = os.path.join(run_dir(runs_root, branch), "record.json")
    try:
        with open(path, encoding="utf-8") as fh:
            return RunRecord.from_json(json.load(fh))
    except (OSError, ValueError):
        return None


class Execution:
    """One subprocess running SCRIPT from a commit; ``stop()`` and ``wait()`` finish its record."""

    def __init__(
        self,
        store_path: str,
        project_dir: str,
        runs_root: str,
        branch: str,
        commit: str,
        script: str,
        args: List[str],
        echo: Optional[IO[str]] = None,
        python: str = sys.executable,
        env: Optional[Dict[str, str]] = None,
    ) -> None:
        self.dir = run_dir(runs_root, branch)
        os.makedirs(self.dir, exist_ok=True)
        self.metrics_file = os.path.join(self.dir, "metrics.jsonl")
        for name in ("metrics.jsonl", "log.txt"):
            try:
                os.remove(os.path.join(self.dir, name))
            except FileNotFoundError:
                pass
        self.record = RunRecord(branch, commit, script, list(args), started=time.time())
        self.echo = echo
        child_env = dict(os.environ if env is None else env)
        child_env[ENV_FILE] = self.metrics_file
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        cmd = [python, "-m", "scalebox_cst.runtime.launch", store_path, commit, project_dir, script, *args]
        self._stats = Stats()
        self._log = open(os.path.join(self.dir, "log.txt"), "w", encoding="utf-8")
        self._write_record()
        self.proc = subprocess.Popen(
            cmd,
            cwd=project_dir,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,  # its own process group: we decide when it stops
        )
        self._reader = threading.Thread(target=self._pump, name=f"scalebox-run-{branch}", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            if self.echo is not None:
                try:
                    self.echo.write(line)
                    self.echo.flush()
                except (OSError, ValueError):
                    pass
            for name, value in parse_metric_line(line).items():
                self._stats.add(name, value)
        self._log.flush()

    def poll(self) -> Optional[int]:
        return self.proc.poll()

    def stop(self, grace: float = 3.0) -> RunRecord:
        """SIGINT to the process group, then SIGTERM, then SIGKILL; returns the finished record."""
        if self.proc.poll() is None:
            self.record.stopped = True
            for sig, wait_for in ((signal.SIGINT, grace), (signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait_for)
                    break
                except subprocess.TimeoutExpired:
                    continue
        return self.wait()

    def wait(self, timeout: Optional[float] = None) -> RunRecord:
        status = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5.0)
        if self.record.exit_status is None:
            self.record.exit_status = status
            self.record.ended = time.time()
            self.record.wall_time = round(self.record.ended - self.record.started, 3)
            self.record.metrics = self._collect_metrics()
            self._write_record()
            self._log.close()
        return self.record

    def _collect_metrics(self) -> Dict[str, Dict[str, float]]:
        stats = self._stats
        try:
            with open(self.metrics_file, encoding="utf-8") as fh:
                for line in fh:
                    try:
                        item = json.loads(line)
                        stats.add(item["name"], float(item["value"]))
                    except (ValueError, KeyError):
                        continue
        except FileNotFoundError:
            pass
        return stats.data

    def _write_record(self) -> None:
        tmp = os.path.join(self.dir, "record.json.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self.record.to_json(), fh, indent=2, default=str)
        os.replace(tmp, os.path.join(self.dir, "record.json"))
