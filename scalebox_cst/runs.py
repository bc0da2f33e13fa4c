"""Run records on disk: the one reader (and the few writers) of ``.scalebox/runs/``.

``scalebox log``/``compare``, the monitor and the hot-fix policy all read runs through this
module; the layout is documented in docs/runs.md and docs/architecture.md. A run is
``(branch, run number)``: ``runs/<branch>/<NNNN>/`` holds ``record.json`` (atomic), ``log.txt``
(the script's stdout), ``stderr.txt`` (its stderr), ``metrics.jsonl`` and ``events.jsonl``
(append-only, readable while written), ``sites.json`` and ``profile.jsonl`` (where the time
went; read by :mod:`scalebox_cst.profile`).

Stable API: :func:`list_runs`, :func:`load_record`, :func:`read_metrics`, :func:`read_events`,
:func:`read_series`, :func:`read_sites`, :func:`headline`, :func:`is_alive`; writers:
:func:`allocate_run`, :func:`write_record`, :func:`append_event`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import time
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from scalebox_cst import headlines, intake, jsonlines, recordtypes, site_counts, statedir, tmpnames
from scalebox_cst.intake import NotRegularFile, open_regular, state_json
from scalebox_cst.digits import ascii_digits
from scalebox_cst.jsonlines import LONGEST_LINE, read_lines  # noqa: F401 (the API's names from before)

STATE_DIR = ".scalebox"
RUNS = "runs"
TENSORBOARD = "tensorboard"
RECORD = "record.json"
METRICS = "metrics.jsonl"
EVENTS = "events.jsonl"
SITES = "sites.json"
LOG = "log.txt"
STDERR = "stderr.txt"

#: statuses a record can hold; "lost" is only ever computed by readers (see :func:`is_alive`)
ENDED = ("ok", "failed", "stopped", "pruned", "lost")

#: the engine's own series (telemetry, guard, clip: runtime.metrics.ENGINE); every other name is
#: the script's own (SummaryWriter tags, key=value tokens), never merged with the engine's
ENGINE = "scalebox/"
#: a child process's engine series: ``scalebox/workers/<id>/<name>``
WORKERS = ENGINE + "workers/"
#: names the headline reads, first found wins: the engine's observation, then the script's own
#: tags (CleanRL's, key=value keys); in records written before the namespace (no ``scalebox/``
#: series at all) the bare ``episodic_return``/``SPS`` were the engine's and still read
RETURN_NAMES = (ENGINE + "episodic_return", "episodic_return", "charts/episodic_return", "episode_return", "final_return")
SPS_NAMES = (ENGINE + "SPS", "SPS", "charts/SPS", "sps")
#: the grad norm the headline shows, first found wins: what the code's own clip_grad_norm_
#: returned (before clipping), the guard's norm (nothing clipped before it), the guard's norm
#: after the code's clip (bounded by its max_norm: last resort, named as such)
GRAD_NORM_NAMES = (ENGINE + "grad_norm_preclip", ENGINE + "grad_norm", ENGINE + "grad_norm_clipped")
#: the bare name a record written before the namespace used for the guard's norm
LEGACY_GRAD_NORM = "grad_norm"
#: episodes averaged for the final/best episodic return (CleanRL-style smoothing)
RETURN_WINDOW = 10


class Point(NamedTuple):
    name: str
    step: int
    value: float
    time: float


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """One run as found on disk; ``record`` has the effective status (``lost`` applied)."""

    branch: str
    run: int
    dir: str
    record: Dict[str, Any]

    @property
    def id(self) -> str:
        """``run/0003#2``: how the CLI and ``hotfix_of`` name a run."""
        return f"{self.branch}#{self.run}"

    @property
    def status(self) -> str:
        return str(self.record.get("status", "running"))

    @property
    def variant(self) -> str:
        return str(self.record.get("variant", "rewrite"))


# ------------------------------------------------------------------------------------ paths
def runs_root(project_root: str) -> str:
    return os.path.join(project_root, STATE_DIR, RUNS)


def run_dir(project_root: str, branch: str, run: int) -> str:
    return os.path.join(runs_root(project_root), *branch.split("/"), f"{int(run):04d}")


def tensorboard_dir(project_root: str, branch: str, run: int, commit: str, variant: str = "rewrite") -> str:
    """``tensorboard/<branch>/<NNNN>-<commit8>[-original]``: TensorBoard's run name carries both."""
    name = f"{int(run):04d}-{commit[:8]}" + ("-original" if variant == "original" else "")
    return os.path.join(project_root, STATE_DIR, TENSORBOARD, *branch.split("/"), name)


def project_events_path(project_root: str) -> str:
    return os.path.join(runs_root(project_root), EVENTS)


# ------------------------------------------------------------------------------------ writers
def allocate_run(project_root: str, branch: str) -> Tuple[int, str]:
    """The next run number of ``branch`` and its new, empty folder (``os.mkdir`` is the lock:
    two processes starting runs at once get different numbers; numbers are never reused)."""
    return allocate_in(os.path.join(runs_root(project_root), *branch.split("/")))


def allocate_in(parent: str) -> Tuple[int, str]:
    """:func:`allocate_run` given the branch's folder ``runs/<branch>``."""
    statedir.makedirs(parent)  # a ``runs`` planted as a link leads nowhere outside the project
    taken = [int(n) for n in os.listdir(parent) if len(n) == 4 and ascii_digits(n)]
    number = max(taken, default=0) + 1
    while True:
        path = os.path.join(parent, f"{number:04d}")
        try:
            os.mkdir(path)
            return number, path
        except FileExistsError:
            number += 1


def where_recorded(directory: str) -> str:
    """The end of a run's last line: where its record is, or that it has none (a script that
    deleted its own run folder was told "ok; record in <that folder>"), or that the record there
    is still the one written at the start (a full disk: the run's end was told "ok; record in
    <folder>" after "record not written; it reads as lost")."""
    if os.path.isfile(os.path.join(directory, RECORD)):
        record = load_record(directory)
        if record is None or record.get("status") not in ENDED or record.get("status") == "lost":
            return f"its record in {directory} is the one from its start (the end could not be written): it reads as lost"
        return f"record in {directory}"
    if not os.path.isdir(directory):
        return f"no record: its folder {directory} was deleted"
    return f"no record in {directory} (it could not be written)"


def write_record(directory: str, record: Dict[str, Any]) -> None:
    """Replace ``record.json`` atomically (a reader sees the old or the new one, never half)."""
    tmp = tmpnames.sibling(os.path.join(directory, RECORD), tmpnames.writer_id(), hidden=True)
    text = json.dumps(json_safe(record), indent=2, default=str, allow_nan=False)
    tmpnames.write_replacing(os.path.join(directory, RECORD), text.encode("utf-8"), tmp)  # no half temporary left


def append_jsonl(path: str, item: Dict[str, Any]) -> None:
    """One line, one ``write`` on an O_APPEND descriptor: whole lines even with several writers.
    A short write (a nearly full disk, a signal) is written on (``tmpnames.write_all``): the one
    ``os.write`` dropped the rest of the line without a word, and the next event appended was
    glued to the half line, both then unreadable."""
    line = (json.dumps(item, default=str) + "\n").encode("utf-8")
    fd = statedir.open_in_place(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        tmpnames.write_all(fd, line)
    finally:
        os.close(fd)


def append_event(path: str, kind: str, message: str, /, **extra: Any) -> None:
    """Append ``{"time", "kind", "message", ...extra}`` to an events.jsonl (made if missing)."""
    statedir.makedirs(os.path.dirname(path) or ".")
    append_jsonl(path, {"time": round(time.time(), 3), "kind": kind, "message": message, **extra})


def append_project_event(project_root: str, kind: str, message: str, /, **extra: Any) -> None:
    """Project-level events (branch_created, save_blocked, hotfix_created, rollback)."""
    append_event(project_events_path(project_root), kind, message, **extra)


# ------------------------------------------------------------------------------------ readers
def _number(raw: Any) -> float:
    if isinstance(raw, str):
        return float(raw)  # "nan", "inf", "-inf" (float() also takes "NaN", "Infinity")
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ValueError(raw)
    return float(raw)


def read_metrics(path: str, offset: int = 0, *, ended: bool = False,
                 damage: Optional[jsonlines.Damage] = None) -> Tuple[List[Point], int]:
    """Points of a metrics.jsonl from byte ``offset`` and the offset to resume from.

    Values may be numbers or the strings "nan"/"inf"/"-inf"; a line that is not a point is
    skipped and counted in ``damage``, a partial last line is left for the next call unless
    ``ended`` (scalebox_cst.jsonlines)."""
    lines, new_offset = read_lines(path, offset, ended=ended, damage=damage)
    make = Point._make
    points: List[Point] = []
    for item in jsonlines.parse(lines, path, damage):
        try:
            name, step, value, stamp = item["name"], item.get("step", 0), item["value"], item.get("time", 0.0)
            points.append(make((
                name if type(name) is str else str(name),
                step if type(step) is int else int(step),
                value if type(value) is float else _number(value),
                stamp if type(stamp) is float else float(stamp),
            )))
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError):  # OverflowError: a step of Infinity
            jsonlines.count(damage, path)
    return points, new_offset


def read_events(path: str, offset: int = 0, *, ended: bool = False,
                damage: Optional[jsonlines.Damage] = None) -> Tuple[List[Dict[str, Any]], int]:
    """Events of an events.jsonl (a run's or the project's) from ``offset``, as read_metrics."""
    lines, new_offset = read_lines(path, offset, ended=ended, damage=damage)
    events: List[Dict[str, Any]] = []
    for item in jsonlines.parse(lines, path, damage):
        if isinstance(item, dict):
            events.append(item)
        else:
            jsonlines.count(damage, path)
    return events, new_offset


def read_series(directory: str, *, ended: bool = True, damage: Optional[jsonlines.Damage] = None) -> Dict[str, List[Point]]:
    """Every metric of a run, by name, in file order (``ended``: the run writes no more, so a
    cut last line is damage; a running run's is still being written)."""
    points, _ = read_metrics(os.path.join(directory, METRICS), ended=ended, damage=damage)
    series: Dict[str, List[Point]] = {}
    for p in points:
        series.setdefault(p.name, []).append(p)
    return series


def read_series_counted(directory: str, ended: bool = True) -> Tuple[Dict[str, List[Point]], jsonlines.Damage]:
    """:func:`read_series` and the damaged lines skipped in the run's metrics.jsonl and
    events.jsonl (what a headline says: :func:`headline`'s ``damage``)."""
    damage: jsonlines.Damage = {}
    series = read_series(directory, ended=ended, damage=damage)
    read_events(os.path.join(directory, EVENTS), ended=ended, damage=damage)
    return series, damage


def read_sites(directory: str) -> List[Dict[str, Any]]:
    """The per-site guard counts and times of a run (empty if telemetry wrote none)."""
    data = state_json(os.path.join(directory, SITES))
    sites = data.get("sites") if isinstance(data, dict) else None
    return [s for s in sites if isinstance(s, dict)] if isinstance(sites, list) else []  # ("sites": 5 was iterated)


def stat_fields(pid: int) -> Optional[List[bytes]]:
    """The fields of ``/proc/<pid>/stat`` after ``pid (comm)`` (state is ``[0]``, parent ``[1]``,
    start in clock ticks since boot ``[19]``), or None where there is no /proc or no such
    process. The one reader of that file in the engine core (the run records, Ray's reaper)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def _stat(pid: int) -> Optional[Tuple[bytes, int]]:
    """``(state, start)`` of ``pid``, or None (see :func:`stat_fields`)."""
    fields = stat_fields(pid)
    try:
        return None if fields is None else (fields[0], int(fields[19]))
    except ValueError:
        return None


def process_start(pid: int) -> Optional[int]:
    """When ``pid`` started (clock ticks since boot), or None. A pid and its start name one
    process for good: a reused pid starts later."""
    stat = _stat(pid)
    return None if stat is None else stat[1]


def _pid_runs_launch(pid: int, start: Optional[int] = None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process with that pid: cannot tell, keep "running"
    if start is not None:
        stat = _stat(pid)
        if stat is not None:  # the same process, not a zombie (exited, not yet reaped)
            return stat[1] == start and stat[0] != b"Z"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read()
    except OSError:
        return True  # no /proc (macOS): the pid exists
    if not cmdline:
        return False  # a zombie: exited, not yet reaped
    # records written before ``pid_start``: the child's argv names the engine's launcher module
    # (a word of its own, not a path that happens to hold "scalebox_cst")
    return any(arg.startswith(b"scalebox_cst.") for arg in cmdline.split(b"\0"))


def is_alive(record: Dict[str, Any]) -> bool:
    """Whether a ``running`` record's process still runs (on another host: trusted as is)."""
    if record.get("status", "running") != "running":
        return False
    pid = record.get("pid")
    if not isinstance(pid, int):
        return True  # written before the child started: a moment, not a state
    if record.get("host") not in (None, socket.gethostname()):
        return True
    start = record.get("pid_start")
    return _pid_runs_launch(pid, start if isinstance(start, int) else None)


def _damaged(why: str) -> Dict[str, Any]:
    """The record of a run whose ``record.json`` cannot be read: shown as lost, saying why (a
    damaged record made the run vanish from ``log``, ``compare`` and the monitor)."""
    return {"status": "lost", "stop_reason": f"its record.json is damaged ({why}); what it recorded is lost",
            "script": "?"}


def load_record(directory: str) -> Optional[Dict[str, Any]]:
    """``record.json`` of a run folder with the effective status: a ``running`` record whose
    process is gone reads as ``lost`` (ended), never ``running``; so does a damaged one, saying
    so in ``stop_reason``. None if absent or unreadable."""
    try:
        with open_regular(os.path.join(directory, RECORD), "rb") as fh:
            data = fh.read(intake.STATE_LIMIT + 1)
        if len(data) > intake.STATE_LIMIT:  # a record is kilobytes: 300 MB held every reader at 650 MB
            raise NotRegularFile(0, f"larger than {intake.STATE_LIMIT >> 20} MiB")
        record = intake.loads_state(data)
    except NotRegularFile as exc:  # a FIFO or a device in its place: never opened for reading
        record = _damaged(str(exc.strerror))
    except OSError:
        return None
    except (ValueError, RecursionError) as exc:  # cut short, overwritten, not UTF-8: the run still was
        record = _damaged(f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
    if not isinstance(record, dict):
        record = _damaged(f"a JSON {type(record).__name__}, not an object")
    recordtypes.typed(record)
    if record.get("status", "running") == "running" and not is_alive(record):
        record["status"] = "lost"
        if record.get("ended") is None:
            try:  # the last sign of life: its newest output
                record["ended"] = max(os.path.getmtime(os.path.join(directory, n)) for n in (LOG, METRICS, RECORD) if os.path.exists(os.path.join(directory, n)))
            except ValueError:
                pass
    return record


def list_runs(project_root: str, branch: Optional[str] = None) -> List[RunInfo]:
    """Every run of the project (or of one branch), sorted by branch then run number."""
    root = runs_root(project_root)
    found: List[RunInfo] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        if RECORD not in filenames:
            continue
        rel = os.path.relpath(dirpath, root).replace(os.sep, "/")
        name, _, number = rel.rpartition("/")
        if not ("/" in name and len(number) == 4 and ascii_digits(number)):  # branches hold a "/"
            continue
        if branch is not None and name != branch:
            continue
        record = load_record(dirpath)
        if record is not None:
            record.setdefault("run", int(number))  # the folder says, where a damaged record cannot
            record.setdefault("branch", name)
            found.append(RunInfo(name, int(number), dirpath, record))
        dirnames[:] = []
    found.sort(key=lambda r: (r.branch, r.run))
    return found


# ------------------------------------------------------------------------------------ headline
def first_series(series: Mapping[str, Sequence[Point]], names: Iterable[str]) -> Optional[Tuple[str, Sequence[Point]]]:
    for name in names:
        if series.get(name):
            return name, series[name]
    return None


def is_worker_series(key: str, name: str) -> bool:
    """Whether ``key`` is one worker process's engine series ``name`` (``scalebox/workers/<id>/name``)."""
    suffix = "/" + name
    return key.startswith(WORKERS) and key.endswith(suffix) and "/" not in key[len(WORKERS):-len(suffix)]


def worker_series(series: Mapping[str, Sequence[Point]], name: str) -> List[Point]:
    """The points of engine series ``name`` over every worker process (``scalebox/workers/<id>/
    name``), in time order: the run's episodes when its envs are stepped in child processes."""
    found = [p for points in worker_sources(series, name) for p in points]
    found.sort(key=lambda p: p.time)
    return found


def worker_sources(series: Mapping[str, Sequence[Point]], name: str) -> List[Sequence[Point]]:
    """Each worker process's points of engine series ``name`` (one list per worker)."""
    return [points for key, points in series.items() if points and is_worker_series(key, name)]


def workers_stepped_most(own: Sequence[Tuple[float, float]], workers: Sequence[Sequence[Tuple[float, float]]]) -> bool:
    """Whether the run's episodes are its workers' though its own process stepped an env too:
    ``(env steps so far, time)`` of each source's episodes; the workers stepped more (BY571's IQN
    trains in SubprocVecEnv workers and evaluates in the main process: 6 evaluation episodes
    of 56 steps were the run's return and 15 steps/s, beside 1,000 training steps)."""
    if not own or not workers:
        return False
    return sum(max(x for x, _ in ps) for ps in workers if ps) > max(x for x, _ in own)


def env_step_points(sources: Sequence[Sequence[Tuple[float, float]]]) -> List[Tuple[float, float, float]]:
    """``(env steps of every source so far, time, 0)`` in time order, from each source's
    ``(its env steps so far, time)``: the run's steps where several processes stepped envs."""
    events = sorted((t, i, x) for i, ps in enumerate(sources) for x, t in ps)
    latest: Dict[int, float] = {}
    out = []
    for t, i, x in events:
        latest[i] = max(x, latest.get(i, 0.0))
        out.append((sum(latest.values()), t, 0.0))
    return out


def engine_name(series: Mapping[str, Sequence[Point]], name: str) -> str:
    """The series a reader means by ``name``: itself where the run has it, else the engine's
    ``scalebox/name`` (``--metric losses/backward``), else ``name``."""
    if name in series or name.startswith(ENGINE) or ENGINE + name not in series:
        return name
    return ENGINE + name


def is_grad_norm(name: str) -> bool:
    """An engine series of unclipped grad norms: the guard's (``scalebox/grad_norm[/<site>]``) or
    what the code's own clip returned (``scalebox/grad_norm_preclip[/...]``); not a script's own
    ``grad_norm`` tag, nor the guard's norm after the code's clip (bounded by its max_norm)."""
    for base in (ENGINE + "grad_norm", ENGINE + "grad_norm_preclip"):
        if name == base or name.startswith(base + "/"):
            return True
    return False


def is_legacy(series: Mapping[str, Sequence[Point]], record: Optional[Dict[str, Any]] = None) -> bool:
    """A record written before the engine's namespace: its record.json has no ``engine_prefix``
    and it has no ``scalebox/`` series at all (a run of today with telemetry off and no guard
    is not one: its bare ``grad_norm`` is the script's)."""
    if record is not None and "engine_prefix" in record:
        return False
    return not any(name.startswith(ENGINE) for name in series)


def finite(points: Sequence[Point]) -> List[float]:
    return [p.value for p in points if math.isfinite(p.value)]


def tail_mean(values: Sequence[float], window: int = RETURN_WINDOW) -> Optional[float]:
    """Mean of the last ``window`` values (a run's "final" value of a metric)."""
    if not values:
        return None
    tail = values[-window:]
    return sum(tail) / len(tail)


def best_window_mean(values: Sequence[float], window: int = RETURN_WINDOW) -> Optional[float]:
    """Highest mean over ``window`` consecutive values (the whole series when shorter)."""
    if not values:
        return None
    w = min(window, len(values))
    total = sum(values[:w])
    best = total
    for i in range(w, len(values)):
        total += values[i] - values[i - w]
        best = max(best, total)
    return best / w


_median = headlines.median


def headline(record: Dict[str, Any], series: Mapping[str, Sequence[Point]], sites: Optional[Sequence[Dict[str, Any]]] = None,
             damage: Optional[jsonlines.Damage] = None) -> Dict[str, Any]:
    """The numbers ``scalebox log`` shows per run (None where a run has no such data):

    episodic_return_final / _best: mean of the last / best window of RETURN_WINDOW episodes;
    episodes; sps: steps/s over the later half of the SPS points (scalebox_cst.headlines: one table of
    these numbers, their labels and formats);
    guard_pass_rate: vectorized / (vectorized + fallback) over every site, guard_fallback_why: why
    the fallbacks fell back ([[reason, count], ...], scalebox_cst.site_counts); site_time_s (and
    site_samples: how many telemetry samples it rests on, 0 where the sites ran too briefly to be seen);
    grad_norm_last and grad_norm_metric (the series it is from: GRAD_NORM_NAMES); nonfinite
    (count of non-finite points); wall_time; cpu_time_s (the run's process and reaped children,
    user + system: what compare reads where runs shared the machine); last: {name: last value};
    damaged: ``{file name: damaged lines skipped}`` of the run's files (``damage``, as read), which
    every view of the numbers says (scalebox_cst.jsonlines.note): they rest on what was readable.
    The return is the engine's (the run's own process, else its workers' together: metric_return
    ``scalebox/workers/*/episodic_return``), else the script's own tag (metric_return names it).
    """
    out: Dict[str, Any] = {"metric_return": None, "episodic_return_final": None, "episodic_return_best": None, "episodes": 0}
    found = first_series(series, RETURN_NAMES[:1])
    own = [(p.step, p.time) for p in found[1]] if found else []  # (env steps so far, time) of each source's episodes
    per_worker = [[(p.step, p.time) for p in ps] for ps in worker_sources(series, "episodic_return")]
    stepped_in_workers = workers_stepped_most(own, per_worker)
    if found is None or stepped_in_workers:
        workers = worker_series(series, "episodic_return")
        found = (WORKERS + "*/episodic_return", workers) if workers else first_series(series, RETURN_NAMES[1:])
    if found:
        values = finite(found[1])
        out.update(metric_return=found[0], episodic_return_final=tail_mean(values), episodic_return_best=best_window_mean(values), episodes=len(found[1]))
    sps = first_series(series, SPS_NAMES)
    points = [(p.step, p.time, p.value) for p in sps[1] if math.isfinite(p.value)] if sps else []
    # the monitor's live value is the same reducer; the engine's x counts env steps
    out["sps"] = headlines.steps_per_second(points, counts_steps=sps is not None and sps[0] == SPS_NAMES[0])
    if stepped_in_workers and (sps is None or sps[0] == SPS_NAMES[0]):
        # the engine's SPS counts this process's env steps only: here the fewer (an evaluation env)
        merged = env_step_points([own, *per_worker])
        out["sps"] = headlines.steps_per_second(merged, counts_steps=True)
    out["metric_sps"] = sps[0] if sps else None  # the engine's scalebox/SPS, else the script's own
    sites = list(sites or [])
    passed, fell, whys = site_counts.totals(sites)
    out["guard_pass_rate"] = site_counts.pass_rate(passed, fell)
    out["guard_fallback_why"] = [[why, n] for why, n in whys]  # the most frequent first
    out["site_time_s"] = sum(site_counts.seconds(s) for s in sites) if sites else None
    counted = [s for s in sites if "samples" in s]  # records written before sample counts have none
    out["site_samples"] = sum(site_counts.count(s.get("samples")) for s in counted) if counted else None
    grad = first_series(series, GRAD_NORM_NAMES + ((LEGACY_GRAD_NORM,) if is_legacy(series, record) else ()))
    out["grad_norm_last"] = grad[1][-1].value if grad else None
    out["grad_norm_metric"] = grad[0] if grad else None
    out["nonfinite"] = sum(1 for points in series.values() for p in points if not math.isfinite(p.value))
    out["wall_time"] = record.get("wall_time")
    cpu = series.get(ENGINE + "cpu_time_s") or []  # the last point, at exit, is the whole run's
    out["cpu_time_s"] = cpu[-1].value if cpu and math.isfinite(cpu[-1].value) else None
    out["last"] = {name: points[-1].value for name, points in series.items() if points}
    out["damaged"] = {name: n for name, n in (damage or {}).items() if n}
    return out


def grad_norm_fact(head: Dict[str, Any]) -> List[str]:
    """``["grad_norm_preclip=3.2"]``: the headline's grad norm named by its series (pre-clip, the
    guard's, or clipped: a clipped norm is mostly the code's max_norm), [] without one."""
    value, name = head.get("grad_norm_last"), head.get("grad_norm_metric")
    if not isinstance(value, (int, float)) or not isinstance(name, str):
        return []
    return [f"{name[len(ENGINE):] if name.startswith(ENGINE) else name}={value:.4g}"]


def run_headline(run: RunInfo) -> Dict[str, Any]:
    """:func:`headline` of a run from its files (the stored one is a snapshot at its end); the
    cut last line of a run still running is being written, not damage."""
    series, damage = read_series_counted(run.dir, ended=run.status != "running")
    return headline(run.record, series, read_sites(run.dir), damage)


def json_safe(value: Any) -> Any:
    """NaN/inf as the strings the metrics file uses, so ``--json`` output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
