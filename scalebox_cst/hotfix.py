"""Hot-fix branches: when a run's telemetry shows instability, rewrite its source snapshot again
with a stronger stabilizer, commit it as a new branch, and (under ``--heal``) run that instead.

The policy reads the run's ``metrics.jsonl`` and ``events.jsonl`` through :mod:`scalebox_cst.runs`
(incrementally, from byte offsets, while the run goes on). Signals, first found wins:

- ``nonfinite-unskipped``: the guard saw a non-finite gradient it could not skip (device path,
  optimizer without ``found_inf``): the weights are probably non-finite already;
- ``repeated-interventions``: ``max_interventions`` guard interventions or spikes (skipped steps,
  spikes reported or clipped) at one site within ``window`` steps: one bad batch is the guard's
  job (a reported spike runs as written), a pattern is not;
- ``nonfinite-loss``: a loss metric (a name holding "loss") non-finite ``max_nonfinite_loss`` times;
- ``grad-norm-divergence``: a finite grad norm ``divergence`` times the median of the run's first
  healthy points (catches sites whose spikes the guard does not clip: the code's own clip);
- ``failed-nonfinite``: the run failed after a non-finite value was seen (RL code often crashes on
  NaN logits, e.g. ``Categorical(probs=nan)``).

The hot-fix is the same snapshot rewritten with ``[grad_clip] mode = "fixed"``, ``max_norm`` taken
from the run's healthy grad-norm history (the median of its recorded norms before the signal, so
healthy steps are hardly clipped; 1.0 where there is none; halved again for a hot-fix of a
hot-fix) and ``skip_nonfinite = true`` (a host check per step: a true skip on any optimizer and
backend). The commit message and the stored report name the run, step and signal
(``hotfix_of: "run/0002#1"``); a project event ``hotfix_created`` tells the monitor. At most
``[hotfix] max_per_source`` (default 2) hot-fixes per source snapshot: then the run stops with the
reason. Review with ``scalebox diff``, keep or roll back as any branch.
"""
from __future__ import annotations

import dataclasses
import math
import os
import statistics
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from scalebox_cst import options, runs
from scalebox_cst.config import Config
from scalebox_cst.report import RunReport

SECTION = "hotfix"
DEFAULTS = options.defaults(SECTION)  # the option schema's (scalebox_cst.options)


class HotfixError(Exception):
    """No hot-fix can be made (limit reached, no snapshot); the message is one line."""


@dataclasses.dataclass(frozen=True)
class Signal:
    kind: str
    step: Optional[int]
    message: str
    site: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Hotfix:
    branch: str
    commit: str
    hotfix_of: str  # "run/0002#1"
    signal: Signal
    max_norm: float
    message: str


def settings(config: Config) -> Dict[str, Any]:
    """The [hotfix] table over the defaults; a bad value is a one-line error."""
    out = dict(DEFAULTS)
    for key, value in config.options.get(SECTION, {}).items():
        problem = options.option_error(SECTION, key, value)
        if problem:
            raise HotfixError(problem)
        out[key] = value
    return out


# --------------------------------------------------------------------------- the policy


class RunWatch:
    """Reads one run's metrics and events as they grow and says when it became unstable."""

    def __init__(self, run_dir: str, options: Optional[Dict[str, Any]] = None) -> None:
        self.dir = run_dir
        self.opts = dict(DEFAULTS, **(options or {}))
        self._metrics_offset = 0
        self._events_offset = 0
        self._norms: Dict[str, List[Tuple[int, float]]] = {}  # scalebox/grad_norm[/<site>], ..._preclip
        self.first_trouble_step: Optional[int] = None  # the healthy history ends here
        self.nonfinite_seen: Optional[Signal] = None
        self._interventions: Dict[str, List[int]] = {}
        self._nonfinite_loss = 0
        self.signal: Optional[Signal] = None

    def poll(self) -> Optional[Signal]:
        """The first instability signal so far (sticky), reading only what was appended since."""
        if self.signal is not None:
            return self.signal
        events, self._events_offset = runs.read_events(os.path.join(self.dir, runs.EVENTS), self._events_offset)
        for event in events:
            self.signal = self.signal or self._event(event)
        points, self._metrics_offset = runs.read_metrics(os.path.join(self.dir, runs.METRICS), self._metrics_offset)
        for point in points:
            self.signal = self.signal or self._point(point)
        return self.signal

    def after_exit(self, status: str) -> Optional[Signal]:
        """After the process ended: a failure following a non-finite value is a signal too."""
        signal = self.poll()
        if signal is None and status == "failed" and self.nonfinite_seen is not None:
            seen = self.nonfinite_seen
            self.signal = Signal("failed-nonfinite", seen.step, f"the run failed after {seen.message}", seen.site)
        return self.signal

    def _trouble(self, step: Optional[int]) -> None:
        if self.first_trouble_step is None and step is not None:
            self.first_trouble_step = step

    def _event(self, event: Dict[str, Any]) -> Optional[Signal]:
        kind, step, site = event.get("kind"), event.get("step"), event.get("site")
        step = step if isinstance(step, int) else None
        message = str(event.get("message", kind))
        if kind == "nonfinite":
            self._trouble(step)
            if self.nonfinite_seen is None:
                self.nonfinite_seen = Signal("nonfinite", step, message, site)
            return None
        if kind == "guard_intervened" and event.get("skipped") is False:
            self._trouble(step)
            return Signal("nonfinite-unskipped", step, message, site)
        if kind in ("step_skipped", "spike_clipped", "spike_seen") and site is not None:
            self._trouble(step)
            steps = self._interventions.setdefault(site, [])
            steps.append(step if step is not None else (steps[-1] + 1 if steps else 0))
            recent = [s for s in steps if s > steps[-1] - self.opts["window"]]
            if len(recent) >= self.opts["max_interventions"]:
                return Signal("repeated-interventions", steps[-1],
                              f"{len(recent)} guard interventions or spikes at {site} within {self.opts['window']} steps "
                              f"(last: {message})", site)
        return None

    def _point(self, point: runs.Point) -> Optional[Signal]:
        value = point.value
        if "loss" in point.name.lower() and not math.isfinite(value):
            self._nonfinite_loss += 1
            self._trouble(point.step)
            if self.nonfinite_seen is None:
                self.nonfinite_seen = Signal("nonfinite", point.step, f"non-finite {point.name}={value} at step {point.step}")
            if self._nonfinite_loss >= self.opts["max_nonfinite_loss"]:
                return Signal("nonfinite-loss", point.step,
                              f"{point.name} non-finite {self._nonfinite_loss} times (last {value} at step {point.step})")
        if runs.is_grad_norm(point.name) and math.isfinite(value):
            series = self._norms.setdefault(point.name, [])
            series.append((point.step, value))
            early = [v for _, v in series[: max(int(self.opts["healthy_points"]), 1) * 5]]
            if len(early) >= self.opts["healthy_points"]:
                base = statistics.median(early)
                if base > 0 and value > self.opts["divergence"] * base:
                    self._trouble(point.step)
                    return Signal("grad-norm-divergence", point.step,
                                  f"grad norm {value:.4g} at step {point.step} is {value / base:.3g}x the run's early median {base:.4g}")
        return None

    def healthy_norms(self) -> List[float]:
        """Recorded grad norms before the first sign of trouble: of the optimizer whose norms are
        largest (one max_norm serves every site; the larger-norm optimizer is hardly clipped)."""
        end = self.first_trouble_step
        best: List[float] = []
        for series in self._norms.values():
            values = [v for s, v in series if end is None or s < end]
            if values and (not best or statistics.median(values) > statistics.median(best)):
                best = values
        return best


def clip_threshold(healthy: Sequence[float], previous: Optional[float] = None) -> float:
    """A fixed clip from the healthy history: its median (1.0 without history), 3 significant
    digits; at most half the previous hot-fix's threshold."""
    value = statistics.median(healthy) if healthy else 1.0
    if previous is not None:
        value = min(value, previous / 2)
    if not (value > 0 and math.isfinite(value)):
        value = 1.0
    return float(f"{value:.3g}")


# --------------------------------------------------------------------------- making the branch


def hotfixes_of_source(store, source_commit: str) -> List[Tuple[str, Dict[str, Any]]]:
    """(branch, report) of every hot-fix branch made from ``source_commit``, oldest first."""
    from scalebox_cst.store import StoreError

    found = []
    for info in store.branches():
        if info.source_commit != source_commit:
            continue
        try:
            report = store.report(info.name)
        except StoreError:
            continue
        if report.get("hotfix_of"):
            found.append((info.name, report))
    return found


def make_hotfix(project, branch: str, run: int, signal: Signal, healthy: Sequence[float]) -> Hotfix:
    """Commit the hot-fix branch for run ``branch#run`` (see the module docstring)."""
    from scalebox_cst.project import Project, report_text
    from scalebox_cst.store import StoreError

    store = project.store
    info = store.resolve(branch)
    if info.source_commit is None:
        raise HotfixError(f"{info.name} has no source snapshot to rewrite")
    opts = settings(project.config)
    made = hotfixes_of_source(store, info.source_commit)
    if len(made) >= opts["max_per_source"]:
        names = ", ".join(b for b, _ in made)
        raise HotfixError(f"hot-fix limit reached: {len(made)} hot-fix(es) of snapshot {info.source_commit[:10]} "
                          f"already ({names}; [hotfix] max_per_source = {opts['max_per_source']})")
    try:
        parent_report = store.report(info.name)
    except StoreError:
        parent_report = {}
    previous = parent_report.get("hotfix", {}).get("max_norm") if parent_report.get("hotfix_of") else None
    max_norm = clip_threshold(healthy, previous)
    config = project.config.replace()
    for key, value in (("mode", "fixed"), ("max_norm", max_norm), ("skip_nonfinite", True)):
        config.set_option("grad_clip", key, value)
    fixed = Project(project.root, config=config, backend=project.backend)
    fixed._store = store
    files = store.files(info.source_commit)
    python = [p for p in files if config.includes(p)]
    results = fixed.rewrite_files(files, python)
    report = RunReport(None, None, info.source_commit, fixed.backend, [r.report for r in results.values()])
    of = f"{info.name}#{run}"
    step = f"step {signal.step}" if signal.step is not None else "the end of the run"
    why = f"hotfix of {of} at {step}: {signal.kind}"
    keep = (f'to keep it: [grad_clip] mode = "fixed", max_norm = {max_norm}, skip_nonfinite = true in scalebox.toml')
    body = f"{why}\n{signal.message}\nstabilizer: fixed clip at max_norm={max_norm} (median healthy grad norm) " \
           f"and non-finite steps skipped on the host; {keep}\n\n{report_text(report)}"
    data = report.to_json()
    data["hotfix_of"] = of
    data["hotfix"] = {"run": of, "step": signal.step, "signal": signal.kind, "message": signal.message,
                      "site": signal.site, "max_norm": max_norm, "options": {"grad_clip": dict(config.options["grad_clip"])}}
    out_files = {path: r.output for path, r in results.items()}
    new_branch, commit = store.commit_rewrite(info.source_commit, out_files, why, body, data, fixed.pipeline.fingerprint)
    try:
        runs.append_project_event(project.root, "hotfix_created", f"{new_branch}: {why}", branch=new_branch,
                                  hotfix_of=of, step=signal.step, signal=signal.kind, max_norm=max_norm)
    except OSError:
        pass
    return Hotfix(new_branch, commit, of, signal, max_norm, why)


# --------------------------------------------------------------------------- --heal


def _supervisor(project, echo):
    from scalebox_cst.runner.supervisor import RunSupervisor

    return RunSupervisor.for_project(project, echo=echo)


def heal_loop(
    project,
    branch: str,
    script: str,
    args: Sequence[str],
    *,
    echo=None,
    notice: Callable[[str], None] = lambda text: print(text, file=sys.stderr, flush=True),
    start: Optional[Callable] = None,
    poll_s: float = 0.5,
    supervisor=None,
) -> Tuple[Any, List[Hotfix]]:
    """Run ``script`` from ``branch``; on instability stop it, make a hot-fix and run that instead.

    Returns the last run's record and the hot-fixes made. Runs are started, followed and stopped
    by ``supervisor`` (a :class:`~scalebox_cst.runner.supervisor.RunSupervisor`; default: one of
    ``project``); ``start(info, hotfix_of)`` replaces its start (tests pass fakes with ``dir``,
    ``poll()``, ``wait()``, ``stop(grace=, reason=)`` and ``record``).
    """
    from scalebox_cst.runner.supervisor import RunSpec

    opts = settings(project.config)
    supervisor = supervisor or _supervisor(project, echo)
    if start is None:
        def start(info, hotfix_of):
            return supervisor.start(RunSpec.from_branch(info, script, args, hotfix_of=hotfix_of))
    info = project.store.resolve(branch)
    hotfix_of: Optional[str] = None
    made: List[Hotfix] = []
    while True:
        execution = start(info, hotfix_of)
        run_no = getattr(execution.record, "run", None) or getattr(execution, "run", 1)
        watch = RunWatch(execution.dir, opts)

        def unstable(_run) -> Optional[str]:
            found = watch.poll()
            return None if found is None else f"hot-fix: {found.kind} at step {found.step}"

        # Ctrl-C, or SIGTERM/SIGHUP under the supervisor's signals: the child stops too
        record = supervisor.follow(execution, check=unstable, poll_s=poll_s, interrupted="{signal} to scalebox run --heal")
        signal = watch.signal
        if signal is None:
            status = getattr(record, "status", "ok")
            signal = watch.after_exit("failed" if str(status).startswith("failed") else str(status))
            if signal is None or signal.kind != "failed-nonfinite":
                return record, made
        notice(f"scalebox: {info.name}#{run_no} unstable: {signal.message}")
        try:
            fix = make_hotfix(project, info.name, run_no, signal, watch.healthy_norms())
        except HotfixError as exc:
            notice(f"scalebox: {info.name}#{run_no} stopped, no hot-fix: {exc}")
            return record, made
        made.append(fix)
        notice(f"scalebox: hot-fix {fix.branch} ({fix.commit[:10]}): {fix.message}; fixed clip at max_norm="
               f"{fix.max_norm}, non-finite steps skipped; review: scalebox diff {fix.branch}")
        info = project.store.resolve(fix.branch)
        hotfix_of = fix.hotfix_of


# --------------------------------------------------------------------------- --locate-nan


def first_nonfinite(run_dir: str) -> Optional[Dict[str, Any]]:
    """The run's first ``nonfinite`` event that names a guard site and step (what --locate-nan reruns)."""
    events, _ = runs.read_events(os.path.join(run_dir, runs.EVENTS))
    for event in events:
        if event.get("kind") == "nonfinite" and event.get("site") and isinstance(event.get("step"), int):
            return event
    return None


LOCATE_ENV = "SCALEBOX_LOCATE_NAN"  # runtime.stabilizer.LOCATE_ENV (not imported: it loads torch)


def locate_env(event: Dict[str, Any]) -> Dict[str, str]:
    return {LOCATE_ENV: f"{event['site']}@{event['step']}"}


# --------------------------------------------------------------------------- the CLI's --heal / --locate-nan


def cli_run(project, branch: str, script: str, args: Sequence[str], *, heal: bool, locate_nan: bool,
            notice: Callable[[str], None]) -> int:
    """``scalebox run --heal`` / ``--locate-nan``: returns the exit status for the CLI. SIGTERM,
    SIGHUP and SIGINT stop the run (the supervisor's signals) and give 130."""
    supervisor = _supervisor(project, sys.stdout)
    with supervisor.signals():
        if locate_nan:
            return _locate(project, supervisor, branch, script, args, notice)
        try:
            record, made = heal_loop(project, branch, script, list(args), notice=notice, supervisor=supervisor)
        except KeyboardInterrupt as exc:
            notice(f"scalebox: {exc or 'SIGINT'}: run stopped")
            return 130
        except HotfixError as exc:
            notice(f"scalebox: {exc}")
            return 2
    if made:
        notice(f"scalebox: {len(made)} hot-fix(es): {', '.join(f'{m.branch} (of {m.hotfix_of})' for m in made)}; "
               "review with scalebox diff, keep with the options its commit message names, or roll back")
    status = getattr(record, "exit_status", None)
    return status if status and status > 0 else (0 if status == 0 else 1)


def _locate(project, supervisor, branch: str, script: str, args: Sequence[str], notice: Callable[[str], None]) -> int:
    """Rerun ``branch``'s newest run that saw a non-finite gradient, with the NaN locator armed."""
    from scalebox_cst.runner.supervisor import RunSpec

    found = None
    for info in reversed(runs.list_runs(project.root, branch)):
        event = first_nonfinite(info.dir)
        if event is not None:
            found = (info, event)
            break
    if found is None:
        notice(f"scalebox: no run of {branch} recorded a non-finite gradient at a guarded step; nothing to locate")
        return 1
    info, event = found
    notice(f"scalebox: {info.id}: first non-finite gradient at {event['site']} step {event['step']}: "
           f"{event.get('message', '')}; rerunning from the start with isfinite checks on module outputs for that step")
    execution = supervisor.start(RunSpec.from_branch(project.store.resolve(branch), script, args, env=locate_env(event)))
    try:
        supervisor.follow(execution, interrupted="{signal} during --locate-nan")
    except KeyboardInterrupt:
        return 130
    events, _ = runs.read_events(os.path.join(execution.dir, runs.EVENTS))
    located = [e for e in events if e.get("kind") == "nan_located"]
    if not located:
        notice(f"scalebox: the rerun ended before guard step {event['step']} at {event['site']}; nothing located")
        return 1
    notice(f"scalebox: {located[0]['message']}")
    return 0


# --------------------------------------------------------------------------- scalebox-watch --run


class WatchHealer:
    """The watcher's hook (``Watcher.reap_run`` calls :meth:`check` about twice a second): the
    same policy as ``--heal`` for the run the watcher's supervisor holds. On a signal the run is
    stopped, a hot-fix branch is committed and started in its place by the same supervisor; past
    the limit the run stays stopped (with the reason) until the next save."""

    def __init__(self, project, supervisor, script: str, args: Sequence[str], echo: Callable[[str], None]) -> None:
        self.project = project
        self.supervisor = supervisor
        self.script = script
        self.args = list(args)
        self.echo = echo
        self.watch: Optional[RunWatch] = None

    def check(self) -> None:
        from scalebox_cst.runner.supervisor import RunSpec

        sup, echo = self.supervisor, self.echo
        execution = sup.current
        if execution is None:
            return
        if self.watch is None or self.watch.dir != execution.dir:
            try:
                opts = settings(self.project.config)
            except HotfixError as exc:
                echo(f"scalebox: {exc}; runs are not healed")
                opts = dict(DEFAULTS, max_per_source=0)
            self.watch = RunWatch(execution.dir, opts)
        watch = self.watch
        if execution.poll() is None:
            signal = watch.poll()
            if signal is None:
                return
            record = sup.stop(execution, reason=f"hot-fix: {signal.kind} at step {signal.step}")
        else:
            record = sup.wait(execution)
            signal = watch.after_exit("failed" if str(record.status).startswith("failed") else str(record.status))
            if signal is None:
                return  # an ordinary end: the watcher's reap reports it
            sup.release(execution)
        run_no = getattr(record, "run", 1)
        echo(f"scalebox: {record.branch}#{run_no} unstable: {signal.message}; stopped")
        try:
            fix = make_hotfix(self.project, record.branch, run_no, signal, watch.healthy_norms())
        except (HotfixError, OSError) as exc:
            echo(f"scalebox: {record.branch}#{run_no} stays stopped, no hot-fix: {exc} (save to run again)")
            return
        echo(f"scalebox: hot-fix {fix.branch} ({fix.commit[:10]}): {fix.message}; review: scalebox diff {fix.branch}")
        info = self.project.store.resolve(fix.branch)
        try:
            sup.start(RunSpec.from_branch(info, self.script, self.args, hotfix_of=fix.hotfix_of))
            echo(f"scalebox: running {self.script} from {info.name} (hot-fix of {fix.hotfix_of})")
        except Exception as exc:  # the watcher keeps watching
            echo(f"scalebox: {self.script} not started from {info.name}: {exc}")
