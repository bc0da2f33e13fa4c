"""Many runs on a Ray cluster: each (branch, seed) is one Ray task, recorded like a local run.

``scalebox run --launcher ray --seeds 0,1,2,3 [--address ADDR]`` hands the runs to Ray (a local
instance started for the call when no address is given) instead of a scheduler of our own. No
shared file system is assumed: the call stages, in a temporary folder that Ray ships as the job's
``runtime_env`` ``working_dir``,

- ``store.git``: a small bare store with only the commits that run (their trees, the source
  snapshots tracebacks map back to, the site reports), and
- ``trees/<commit>/``: each commit's files (the working directory of its runs: files the script
  reads beside itself must be committed, see ``include`` in scalebox.toml),

and ships the engine itself (``py_modules``), so the worker runs the same ``runtime`` the rewrite
was made for. Each task runs the same supervisor as a local run (``runner.supervisor.RunSupervisor``:
the child ``runtime.launch`` serving the commit from the staged store, its telemetry, key=value
metrics, traceback tail, status) into a run folder on the worker, and streams that folder back as
it grows (a Ray streaming generator); the host writes it into ``.scalebox/runs/<branch>/<NNNN>/``
(numbers allocated here, as for local runs), so ``scalebox log``/``compare`` and the monitor read
Ray runs like local ones (``launcher: "ray"``, ``ray: {node, address}``).

Stopping the call (Ctrl-C, SIGTERM) cancels every task: a cancelled task stops its run (SIGINT,
SIGTERM, SIGKILL to the child's group) and sends its last output; a run whose worker died is
recorded as failed with Ray's error. A local instance started for the call ends with it, even
if the call is killed (a small watcher process ends its processes then).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from typing import IO, Any, Callable, Dict, List, Optional, Sequence, Tuple

from scalebox_cst import limits as run_limits, runs, tmpnames
from scalebox_cst.rayreaper import start_reaper
from scalebox_cst.runtime import threads as quiet

INSTALL_HINT = 'the ray launcher needs Ray: pip install "scalebox_cst[ray]" (or pip install "ray>=2.9")'
#: seconds between two chunks a task streams back
CHUNK_INTERVAL = 1.0
#: files of a run folder that only grow (sent from an offset); the others are sent whole
_APPENDED = (".jsonl", ".txt")


class RayUnavailable(RuntimeError):
    """Ray is not installed (the message says how to install it)."""


class RayStartError(RuntimeError):
    """``ray.init`` refused: an address that is not Ray's or does not answer, a local instance
    that does not start. One line naming the address, as every error a user can cause."""


def require_ray():
    try:
        import ray
    except ImportError:
        raise RayUnavailable(INSTALL_HINT) from None
    return ray


@dataclasses.dataclass
class RayJob:
    """One run to hand to Ray: what ``Execution`` takes, less the paths."""

    branch: str
    commit: str  # the commit that runs (the rewrite, or the source snapshot for "original")
    script: str
    args: List[str]
    source_commit: Optional[str] = None
    variant: str = "rewrite"
    seed: Optional[int] = None
    seed_via: Optional[str] = None  # "option" (already in args) or "env"
    #: what the task asks of Ray beside one CPU: an accelerator for a rewrite made for one
    num_gpus: float = 0
    resources: Dict[str, float] = dataclasses.field(default_factory=dict)
    run: int = 0  # allocated by run_ray
    dir: str = ""
    limits: Dict[str, Any] = dataclasses.field(default_factory=dict)  # scalebox_cst.limits: the driver's [run] and options


def accelerator_request(backend: Optional[str]) -> Dict[str, Any]:
    """Ray options for a run of a rewrite made for ``backend``: a CUDA rewrite asks for a GPU,
    an NPU rewrite for an ``NPU`` (Ray's resource for Ascend devices), so the worker is given
    one (Ray hides the devices a task did not ask for); a CPU rewrite asks for none."""
    if backend == "cuda":
        return {"num_gpus": 1, "resources": {}}
    if backend == "npu":
        return {"num_gpus": 0, "resources": {"NPU": 1}}
    return {"num_gpus": 0, "resources": {}}


# ------------------------------------------------------------------------------ staging
def _copy_objects(src, dst, oid, seen: set) -> None:
    """Copy a commit or tree with everything below it (not a commit's parents)."""
    import pygit2

    stack = [oid]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        obj = src[current]
        dst.odb.write(obj.type, obj.read_raw())
        if obj.type == pygit2.enums.ObjectType.COMMIT:
            stack.append(obj.tree_id)
        elif obj.type == pygit2.enums.ObjectType.TREE:
            stack.extend(entry.id for entry in obj)


def _export_tree(repo, commit_id: str, dest: str) -> None:
    import pygit2

    stack = [("", repo[commit_id].peel(pygit2.Tree))]
    while stack:
        prefix, tree = stack.pop()
        for entry in tree:
            path = os.path.join(dest, prefix, entry.name)
            obj = repo[entry.id]
            if obj.type == pygit2.enums.ObjectType.TREE:
                os.makedirs(path, exist_ok=True)
                stack.append((os.path.join(prefix, entry.name), obj))
            else:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as fh:
                    fh.write(obj.data)
                if entry.filemode == pygit2.enums.FileMode.BLOB_EXECUTABLE:
                    os.chmod(path, 0o755)


def stage(store_path: str, jobs: Sequence[RayJob], dest: str) -> str:
    """Fill ``dest`` (the working_dir Ray ships) with a store holding only the jobs' commits and
    each commit's exported tree; returns ``dest``."""
    import pygit2

    from scalebox_cst.store import REPORTS_REF, checked

    checked.install(src := pygit2.Repository(store_path), store_path)  # a cut object: an error, not a hang
    mini = pygit2.init_repository(os.path.join(dest, "store.git"), bare=True)
    seen: set = set()
    sig = pygit2.Signature("scalebox", "scalebox@localhost")
    for commit in sorted({j.commit for j in jobs}):
        oid = src[commit].id
        _copy_objects(src, mini, oid, seen)
        parents = src[oid].parent_ids
        for parent in parents[:1]:  # the source snapshot: tracebacks quote the user's lines
            _copy_objects(src, mini, parent, seen)
        try:
            note = src.lookup_note(str(oid), REPORTS_REF)
            mini.create_note(note.message, sig, sig, str(oid), REPORTS_REF, True)
        except KeyError:
            pass
        _export_tree(src, commit, os.path.join(dest, "trees", str(oid)))
    return dest


def stage_engine(dest: str) -> str:
    """A copy of the installed engine package (``scalebox_cst`` with its ``runtime`` and
    ``transforms``, wherever ``package_dir`` put them) for Ray's ``py_modules``."""
    import importlib

    target = os.path.join(dest, "scalebox_cst")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name, sub in (("scalebox_cst", ""), ("scalebox_cst.runtime", "runtime"), ("scalebox_cst.transforms", "transforms")):
        package = importlib.import_module(name)
        for path in package.__path__:
            shutil.copytree(path, os.path.join(target, sub) if sub else target, ignore=ignore, dirs_exist_ok=True)
    return target


# ------------------------------------------------------------------------------ on the worker
class _Mirror:
    """What changed in a run folder since the last call: new bytes of the growing files, the
    whole of the others (record.json, sites.json) when they changed."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.offsets: Dict[str, int] = {}
        self.stamps: Dict[str, Any] = {}

    def collect(self) -> Dict[str, Dict[str, bytes]]:
        chunk: Dict[str, Dict[str, bytes]] = {"append": {}, "replace": {}}
        for root, dirs, files in os.walk(self.dir):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".tmp"):
                    continue
                path = os.path.join(root, name)
                rel = os.path.relpath(path, self.dir).replace(os.sep, "/")
                try:
                    if name.endswith(_APPENDED):
                        with open(path, "rb") as fh:
                            fh.seek(self.offsets.get(rel, 0))
                            data = fh.read()
                        if data:
                            self.offsets[rel] = self.offsets.get(rel, 0) + len(data)
                            chunk["append"][rel] = data
                    else:
                        st = os.stat(path)
                        stamp = (st.st_mtime_ns, st.st_size)
                        if self.stamps.get(rel) != stamp:
                            with open(path, "rb") as fh:
                                chunk["replace"][rel] = fh.read()
                            self.stamps[rel] = stamp
                except OSError:
                    continue
        return chunk


def _run_task(job: Dict[str, Any], interval: float):
    """The Ray task body (a generator: Ray streams each chunk back as it is yielded)."""
    import os

    from scalebox_cst.runner.supervisor import RunSpec, RunSupervisor

    here = os.getcwd()  # the staged working_dir
    store = os.path.join(here, "store.git")
    project = os.path.join(here, "trees", job["commit"])
    engine = os.path.dirname(os.path.dirname(os.path.abspath(__import__("scalebox_cst").__file__)))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (engine, os.environ.get("PYTHONPATH")) if p)}
    if job.get("limits"):  # the worker's tree has no scalebox.toml of the driver's: its limits travel with the job
        env[run_limits.ENV] = json.dumps(job["limits"])
    runs_root = tempfile.mkdtemp(prefix="scalebox-ray-")
    parent = os.path.join(runs_root, *job["branch"].split("/"))
    os.makedirs(parent)
    if job["run"] > 1:  # the worker's run folder gets the host's number (Execution takes max + 1)
        os.mkdir(os.path.join(parent, f"{job['run'] - 1:04d}"))
    node = {"node_host": socket.gethostname(), "node_id": None}
    try:
        import ray

        node["node_id"] = ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - informative only
        pass
    yield {"node": node}
    supervisor = RunSupervisor(store, project, runs_root, echo=None, tensorboard=False, notice=lambda text: None)
    execution = supervisor.start(RunSpec(
        job["branch"], job["commit"], job["script"], tuple(job["args"]), source_commit=job.get("source_commit"),
        variant=job.get("variant", "rewrite"), seed=job.get("seed"), seed_via=job.get("seed_via"), env=env,
    ))
    mirror = _Mirror(execution.dir)  # the executor writes log.txt and stderr.txt unbuffered
    try:
        while execution.poll() is None:
            time.sleep(interval)
            chunk = mirror.collect()
            if chunk["append"] or chunk["replace"]:
                yield chunk
        supervisor.reap(execution)
        yield mirror.collect()
    except GeneratorExit:  # the consumer went away: nothing more can be sent
        supervisor.stop(execution, reason="stopped")
        raise
    except BaseException:  # cancelled (KeyboardInterrupt / TaskCancelledError): stop the run, send its end
        supervisor.stop(execution, reason="stopped")
        yield mirror.collect()
        raise
    finally:
        if execution.poll() is None:
            supervisor.stop(execution, reason="stopped")
        shutil.rmtree(runs_root, ignore_errors=True)


# ------------------------------------------------------------------------------ on the host
class _HostRun:
    """The host's copy of one Ray run: writes the chunks into the run folder."""

    def __init__(self, project_root: str, job: RayJob, address: Optional[str], echo: Optional[IO[str]], prefix: str) -> None:
        self.job = job
        self.project_root = project_root
        self.address = address
        self.echo = echo
        self.prefix = prefix
        self.node: Dict[str, Any] = {}
        self.record: Dict[str, Any] = {}
        self._tb = None

    def start_record(self) -> None:
        j = self.job
        self.record = {
            "branch": j.branch, "run": j.run, "commit": j.commit, "source_commit": j.source_commit, "variant": j.variant,
            "script": j.script, "args": list(j.args), "seed": j.seed, "seed_via": j.seed_via, "pid": None, "pgid": None,
            "host": None, "started": time.time(), "ended": None, "wall_time": None, "exit_status": None,
            "status": "running", "signal": None, "hotfix_of": None, "launcher": "ray", "nproc": 1, "headline": {},
            "metrics": {}, "error_tail": [], "ray": self._ray_info(), "engine_prefix": runs.ENGINE,
        }
        runs.write_record(j.dir, self.record)

    def _ray_info(self) -> Dict[str, Any]:
        return {"address": self.address or "local", "driver_host": socket.gethostname(), "driver_pid": os.getpid(), **self.node}

    def apply(self, chunk: Dict[str, Any]) -> None:
        if "node" in chunk:
            self.node = dict(chunk["node"])
            self.record["ray"] = self._ray_info()
            runs.write_record(self.job.dir, self.record)
            return
        for rel, data in chunk.get("append", {}).items():
            path = self._local(rel)
            if path is None:
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "ab") as fh:
                fh.write(data)
            if rel in (runs.LOG, runs.STDERR) and self.echo is not None:  # the script's stdout and stderr
                self._echo(data.decode("utf-8", "replace"))
        for rel, data in chunk.get("replace", {}).items():
            if rel == runs.RECORD:
                try:
                    record = json.loads(data)
                except ValueError:
                    continue
                record.update(launcher="ray", run=self.job.run, ray=self._ray_info())
                self.record = record
                runs.write_record(self.job.dir, record)
                continue
            path = self._local(rel)
            if path is None:
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmpnames.write_replacing(path, data, tmpnames.sibling(path, tmpnames.writer_id()))
        self._pump_tensorboard()

    def _local(self, rel: Any) -> Optional[str]:
        """The path in the run folder of a file the worker names ``rel`` (``a/b.jsonl``), or None
        where the name could lead elsewhere: not a string, empty, absolute, a ``.``/``..``
        component, a NUL or backslash, or a folder on the way that is a link out of the run folder.
        The worker runs the user's script, which may write any name into its own run folder."""
        if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
            return None
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts):
            return None
        path = os.path.join(self.job.dir, *parts)
        root = os.path.realpath(self.job.dir)
        folder = os.path.realpath(os.path.dirname(path))
        if folder != root and not folder.startswith(root + os.sep):
            return None
        if os.path.islink(path):
            return None
        return path

    def _echo(self, text: str) -> None:
        try:
            for line in text.splitlines(True):
                self.echo.write(self.prefix + line)
            self.echo.flush()
        except (OSError, ValueError):
            pass

    def _pump_tensorboard(self) -> None:
        from scalebox_cst.runner.execution import _TensorBoard

        if self._tb is None:
            tb_dir = runs.tensorboard_dir(self.project_root, self.job.branch, self.job.run, self.job.commit, self.job.variant)
            self._tb = _TensorBoard(tb_dir, lambda text: print(text, file=sys.stderr))
        self._tb.pump(os.path.join(self.job.dir, runs.METRICS))

    def finish(self, error: Optional[BaseException], cancelled: bool) -> Dict[str, Any]:
        """The final record: the worker's, or (the task died, was cancelled before its run
        ended) the host's own, failed with Ray's error or stopped."""
        rec = self.record
        if rec.get("status") == "running":
            rec["ended"] = time.time()
            rec["wall_time"] = round(rec["ended"] - rec["started"], 3)
            if cancelled:
                rec["status"], rec["stop_reason"] = "stopped", "stopped"
            else:
                rec["status"] = "failed"
                text = "".join(str(error or "the Ray task ended without a result").splitlines(True)[-30:])
                rec["error_tail"] = text.splitlines()
            series, damage = runs.read_series_counted(self.job.dir)
            rec["headline"] = runs.headline(rec, series, runs.read_sites(self.job.dir), damage)
            runs.write_record(self.job.dir, rec)
            kind = "stopped" if cancelled else "failed"
            runs.append_event(os.path.join(self.job.dir, runs.EVENTS), kind, f"{self.job.branch}#{self.job.run} {kind} (ray)")
        if self._tb is not None:
            self._tb.pump(os.path.join(self.job.dir, runs.METRICS))
            self._tb.close()
        return rec


def _stop_on_signals(stop: threading.Event, notice: Callable[[str], None]):
    """The supervisor's stop signals set ``stop`` (``stop.signum``: which came), said once."""
    from scalebox_cst.runner import signals

    def on_signal(signum):
        if not stop.is_set():
            notice(f"scalebox: {signal.Signals(signum).name}: stopping every Ray run")
            stop.signum = signum
            stop.set()

    return signals.calling(on_signal)


def _local_cpus(jobs: int, parallel: Optional[int]) -> int:
    wanted = parallel or jobs
    return max(1, min(wanted, os.cpu_count() or 1))


def run_ray(
    project_root: str,
    store_path: str,
    jobs: Sequence[RayJob],
    address: Optional[str] = None,
    parallel: Optional[int] = None,
    echo: Optional[IO[str]] = None,
    notice: Optional[Callable[[str], None]] = None,
    num_cpus_per_run: float = 1,
    stop: Optional[threading.Event] = None,
    handle_signals: bool = False,
) -> List[Dict[str, Any]]:
    """Run each job as a Ray task and record it under ``runs/<branch>/<NNNN>/``; returns the
    final records in the order of ``jobs``. ``stop`` cancels them all (KeyboardInterrupt too);
    ``handle_signals``: SIGTERM, SIGINT and SIGHUP set it (handlers installed once Ray is
    connected, which installs its own for SIGTERM; ``stop.signum`` says which came)."""
    ray = require_ray()
    notice = notice or (lambda text: print(text, file=sys.stderr, flush=True))
    jobs = list(jobs)
    if not jobs:
        return []
    stop = stop or threading.Event()
    staging = tempfile.mkdtemp(prefix="scalebox-ray-stage-")
    started_here = False
    reaper = None
    handlers = contextlib.ExitStack()
    hosts: List[_HostRun] = []
    try:
        work = stage(store_path, jobs, os.path.join(staging, "work"))
        engine = stage_engine(os.path.join(staging, "engine"))
        runtime_env = {"working_dir": work, "py_modules": [engine]}
        if ray.is_initialized():
            raise RuntimeError(
                "Ray is already initialised in this process: the commits travel as the job's runtime_env, "
                "so run_ray must connect itself (call ray.shutdown() first)"
            )
        try:
            if address:
                ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
            else:
                ray.init(num_cpus=_local_cpus(len(jobs), parallel), include_dashboard=False, runtime_env=runtime_env, log_to_driver=False)
        except Exception as exc:  # noqa: BLE001 - Ray raises ValueError, ConnectionError, RuntimeError...
            text = str(exc).strip().splitlines()
            where = f"cannot connect to {address!r}" if address else "cannot start a local Ray instance"
            raise RayStartError(f"ray: {where}: {text[0] if text else type(exc).__name__}") from None
        if not address:
            reaper = start_reaper(os.getpid())
        started_here = True
        if handle_signals:
            handlers.enter_context(_stop_on_signals(stop, notice))
        where = address or "a local Ray instance"
        notice(f"scalebox: {len(jobs)} run(s) on {where}")
        task = ray.remote(num_cpus=num_cpus_per_run, max_retries=0, num_returns="streaming")(_run_task)
        for job in jobs:
            job.run, job.dir = runs.allocate_run(project_root, job.branch)
            host = _HostRun(project_root, job, address, echo, prefix=f"[{job.branch}#{job.run}{'' if job.seed is None else f' seed {job.seed}'}] " if len(jobs) > 1 else "")
            host.start_record()
            hosts.append(host)
        gate = threading.Semaphore(parallel or len(jobs))
        generators: Dict[int, Any] = {}
        lock = threading.Lock()
        results: Dict[int, Dict[str, Any]] = {}

        def drive(i: int, host: _HostRun) -> None:
            error: Optional[BaseException] = None
            with gate:
                if stop.is_set():
                    results[i] = host.finish(None, cancelled=True)
                    return
                payload = dataclasses.asdict(host.job)
                options = {"num_gpus": host.job.num_gpus, **({"resources": host.job.resources} if host.job.resources else {})}
                with lock:
                    generators[i] = task.options(**options).remote(payload, CHUNK_INTERVAL)
                try:
                    for ref in generators[i]:
                        host.apply(ray.get(ref))
                except Exception as exc:  # noqa: BLE001 - the task's failure is the run's
                    error = exc
                results[i] = host.finish(error, cancelled=stop.is_set())

        threads = [quiet.start_daemon(drive, f"scalebox-ray-{i}", (i, h)) for i, h in enumerate(hosts)]
        try:
            while any(t.is_alive() for t in threads):
                if stop.wait(0.2):
                    break
        except KeyboardInterrupt:
            stop.set()
        if stop.is_set():
            notice("scalebox: stopping every Ray run")
            with lock:
                pending = list(generators.values())
            for gen in pending:
                try:
                    ray.cancel(gen)
                except Exception:  # noqa: BLE001 - already finished
                    pass
        for t in threads:
            t.join(timeout=None if not stop.is_set() else 30.0)
        return [results.get(i) or h.finish(None, cancelled=True) for i, h in enumerate(hosts)]
    finally:
        handlers.close()
        if started_here:
            ray.shutdown()
        if reaper is not None:
            reaper.kill()
            reaper.wait()
        shutil.rmtree(staging, ignore_errors=True)


# ------------------------------------------------------------------------------ the CLI's call
def cli_run(
    project_root: str,
    store_path: str,
    branches: Sequence[Any],
    script: str,
    args: Sequence[str],
    seeds: Sequence[Optional[int]],
    seed_via_for: Callable[[str], Tuple[Optional[str], bool]],
    backend_of: Callable[[str], Optional[str]],
    variant: str,
    address: Optional[str],
    parallel: Optional[int],
    echo: Callable[[str], None],
    describe: Callable[[Dict[str, Any]], str],
) -> int:
    """``scalebox run --launcher ray``: one job per (branch, seed); SIGTERM/SIGINT/SIGHUP stop
    them all. ``branches``: store BranchInfo objects; ``seed_via_for(commit)``: how the script
    takes a seed (its option, "--seed" or "-seed", given with the seed; or "env") and whether the
    option goes ahead of the arguments (seedopt.seed_first); ``backend_of(branch)``: the backend
    its rewrite was made for (an original runs where its rewrite would). Returns the exit status."""
    from scalebox_cst.runner import seedopt

    jobs = []
    for info in branches:
        commit = info.source_commit if variant == "original" else info.commit
        ask = accelerator_request(backend_of(info.name))
        for seed in seeds:
            flag, first = seed_via_for(commit) if seed is not None else (None, False)
            via = None if flag is None else "env" if flag == "env" else "option"
            run_args = seedopt.with_seed(args, flag, seed, first) if via == "option" else list(args)
            jobs.append(RayJob(info.name, commit, script, run_args, source_commit=info.source_commit, variant=variant, seed=seed, seed_via=via,
                               limits=run_limits.resolve(project_root).to_json(), **ask))
    stop = threading.Event()
    records = run_ray(project_root, store_path, jobs, address=address, parallel=parallel, echo=sys.stdout, notice=echo, stop=stop, handle_signals=True)
    for job, record in zip(jobs, records):
        echo(f"scalebox: {describe(record)}; {runs.where_recorded(job.dir)}")
    if stop.is_set():
        return 128 + int(getattr(stop, "signum", signal.SIGTERM))
    return 0 if all(r.get("status") == "ok" for r in records) else 1
