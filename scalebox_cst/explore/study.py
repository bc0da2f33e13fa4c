"""A study: Optuna asks for values, each trial is a committed branch whose runs are ordinary runs.

Why Optuna's ask/tell and not ``study.optimize``: the engine owns the runs (it commits, starts,
watches and stops them), so the loop is ours: it feeds the pruner the metric as the run writes
it (``metrics.jsonl``, read incrementally while the run runs), stops a pruned run and records
it ``pruned``, stops the study on the first trial that recorded no such metric (not after
twenty) and after 3 failing trials in a row (with the last traceback).

The storage is Optuna's journal file in ``.scalebox/explore/<study>/journal.log``: appended
and flushed per operation, so a study killed with ``kill -9`` loses no finished trial; on
``--resume`` the trials it left running are marked failed (``interrupted``) and their values
asked again first. Several processes may feed one study through the same file: each trial
names the process that asked it (``owner``), and a trial whose process runs is left to it.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from scalebox_cst import runs, statedir
from scalebox_cst.explore import branches, journal
from scalebox_cst.explore.config import ExploreConfig, ParamSpec
from scalebox_cst.oneline import error_line
from scalebox_cst.store import StoreError

INSTALL_HINT = "scalebox explore needs Optuna: pip install 'scalebox_cst[explore]' (or pip install 'optuna>=3')"
FAILS_IN_A_ROW = 3


class ExploreError(RuntimeError):
    """Stops the study; the message is one line (a traceback may follow it)."""


def disk_error(exc: OSError, where: str, stored: bool = True) -> str:
    """One line for an OSError writing the study (ENOSPC above all). ``stored``: whether the
    study is in its journal already (else there is nothing to ``--resume``: the same command
    again makes it)."""
    then = ("the journal keeps every finished trial: make room, then --resume" if stored
            else "no study was stored: make room, then run the same command again")
    return f"{exc.filename or where}: {exc.strerror or exc}; stopping the study ({then})"


class _Pruned(Exception):
    pass


class _TrialFailed(Exception):
    def __init__(self, message: str, tail: List[str]) -> None:
        super().__init__(message)
        self.tail = tail


def require_optuna():
    try:
        import optuna
    except ImportError:
        raise ExploreError(INSTALL_HINT) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def study_dir(project_root: str, name: str) -> str:
    return os.path.join(project_root, ".scalebox", "explore", name)


def storage(directory: str, repair: bool = False, echo: Optional[Callable[[str], None]] = None):
    """Optuna's journal file storage in ``directory``, its file checked first (``journal.check``:
    a damaged last record is cut off when ``repair``, other damage is one ExploreError line)."""
    optuna = require_optuna()
    path = os.path.join(directory, journal.JOURNAL)
    try:
        statedir.makedirs(directory)
        journal.check(path, repair, echo)
    except journal.JournalError as exc:
        raise ExploreError(str(exc)) from None
    except OSError as exc:
        raise ExploreError(f"{directory}: {exc.strerror or exc}") from None
    lock = path + ".lock"  # Optuna's lock beside its journal: held, or left by a killed writer
    if echo is not None and os.path.lexists(lock):
        shown = os.path.join(".scalebox", "explore", os.path.basename(directory), os.path.basename(lock))
        echo(f"scalebox: {shown} is held: another explore of this study is writing, or a killed one left it "
             "(Optuna breaks a lock left alone for 30 s)")
    return optuna.storages.JournalStorage(journal.backend(path))


def load_study(project_root: str, name: str):
    """The stored study (for the report and the monitor; read only), or None."""
    directory = study_dir(project_root, name)
    if not os.path.lexists(os.path.join(directory, journal.JOURNAL)):
        return None
    optuna = require_optuna()
    try:
        return optuna.load_study(study_name=name, storage=storage(directory))
    except KeyError:
        return None
    except (ValueError, TypeError, OSError) as exc:
        raise ExploreError(f"{directory}: the study cannot be read ({exc})") from None


def make_sampler(optuna, config: ExploreConfig, seed: Optional[int]):
    startup = min(10, max(3, config.trials // 3))  # a 16-trial study spends 5 at random, not 10
    if config.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True)
    if config.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if config.sampler == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=startup)
    if config.sampler == "qmc":
        return optuna.samplers.QMCSampler(seed=seed)
    return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup)


def suggest(trial, spec: ParamSpec) -> Any:
    if spec.kind == "uniform":
        return trial.suggest_float(spec.key, spec.low, spec.high)
    if spec.kind == "loguniform":
        return trial.suggest_float(spec.key, spec.low, spec.high, log=True)
    if spec.kind == "int":
        return trial.suggest_int(spec.key, spec.low, spec.high, log=spec.log)
    return trial.suggest_categorical(spec.key, list(spec.choices))


def metric_points(series: Dict[str, List[runs.Point]], metric: str) -> Optional[List[float]]:
    """The metric's finite values: the script's own series of that name, else the engine's."""
    for name in (metric, runs.ENGINE + metric, "user/" + metric):
        if name in series:
            return runs.finite(series[name])
    return None


def _owner() -> Dict[str, Any]:
    """This process, as the one that asked a trial: host, pid and start (a reused pid starts later)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": runs.process_start(os.getpid())}


def _owner_runs(owner: Any) -> bool:
    """Whether the process that asked a trial (its ``owner`` attribute) still runs. A trial
    without one (a journal written before owners were kept) is not; one of another host is
    trusted to (as a run's record of another host is: :func:`runs.is_alive`)."""
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
        return False
    if owner.get("host") != socket.gethostname():
        return True
    pid = owner["pid"]
    if pid == os.getpid():
        return False  # this process runs no trial yet when it recovers
    start = owner.get("start")
    if isinstance(start, int):
        fields = runs.stat_fields(pid)  # state [0] (Z: exited, not yet reaped), start [19]
        return fields is not None and fields[0] != b"Z" and fields[19] == str(start).encode()
    try:  # no /proc: the pid exists
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


class Study:
    """One study run by this process: ``run()`` until ``trials`` are finished (resumed ones count)."""

    def __init__(self, project, config: ExploreConfig, bound: Dict[str, Any], resume: bool,
                 echo: Callable[[str], None], sampler_seed: Optional[int] = None) -> None:
        self.optuna = require_optuna()
        self.project = project
        self.config = config
        self.bound = bound
        self.echo = echo
        self.dir = study_dir(project.root, config.study)
        optuna = self.optuna
        # the journal is written below: a damaged last record (a kill, a full disk) is cut off first
        store = storage(self.dir, repair=True, echo=echo)
        existing: List[str] = []
        created = False  # the study is in the journal (a write failing after this: --resume goes on with it)
        try:
            existing = [s.study_name for s in optuna.get_all_study_summaries(store)] if os.path.exists(self.dir) else []
            if config.study in existing and not resume:
                raise ExploreError(f"study {config.study} already exists in {os.path.relpath(self.dir, project.root)}: "
                                   "--resume to go on with it, or give another study: name")
            if resume and config.study not in existing:
                raise ExploreError(f"--resume: no study {config.study} in {os.path.relpath(self.dir, project.root)} to resume")
            pruner = (optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=config.prune_warmup_steps)
                      if config.prune == "median" else optuna.pruners.NopPruner())
            self.study = optuna.create_study(study_name=config.study, storage=store, direction=config.direction,
                                             sampler=make_sampler(optuna, config, sampler_seed), pruner=pruner,
                                             load_if_exists=True)
            created = True
            self.study.set_user_attr("config", {"script": config.script, "metric": config.metric, "direction": config.direction,
                                                "seeds": config.seeds, "trials": config.trials, "sampler": config.sampler,
                                                "prune": config.prune, "args": config.args})
            self.study.set_user_attr("places", {k: p.to_json() for k, p in bound.items()})
        except ExploreError:
            raise
        except OSError as exc:
            raise ExploreError(disk_error(exc, self.dir, stored=created or config.study in existing)) from None
        except (ValueError, TypeError) as exc:
            raise ExploreError(f"{os.path.join(self.dir, journal.JOURNAL)}: the study cannot be read ({exc})") from None
        self.lock = threading.Lock()
        self.active: Dict[int, Any] = {}  # trial number -> its running Execution
        self.stopping: Optional[str] = None
        self.fatal: Optional[ExploreError] = None
        self.fails_in_a_row = 0
        self.last_tail: List[str] = []
        self.metric_seen = any(t.state.name == "COMPLETE" for t in self.study.trials)

    # ------------------------------------------------------------------ resume
    def _recover(self) -> None:
        """Trials a killed study left RUNNING: failed (``interrupted``), their values asked again
        first. A trial whose process still runs (another ``explore`` of this study) is its own:
        marked failed under it, its ``tell`` failed and that process stopped its study."""
        TrialState = self.optuna.trial.TrialState
        storage_ = self.study._storage
        for frozen in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if _owner_runs(frozen.user_attrs.get("owner")):
                continue
            storage_.set_trial_user_attr(frozen._trial_id, "interrupted", True)
            storage_.set_trial_state_values(frozen._trial_id, TrialState.FAIL)
            if frozen.params:
                self.study.enqueue_trial(frozen.params, skip_if_exists=False)
            self.echo(f"scalebox: trial {frozen.number} was interrupted; its values run again")

    def finished(self) -> int:
        done = ("COMPLETE", "PRUNED", "FAIL")
        return sum(1 for t in self.study.get_trials(deepcopy=False) if t.state.name in done and not t.user_attrs.get("interrupted"))

    def taken(self) -> int:
        """Trials that count toward ``trials:``: the finished ones and those running now, in this
        process or another explore of the study (read afresh from the journal). Counting only
        this process's own, two processes on one study of ``trials: 6`` ran 12."""
        done = ("COMPLETE", "PRUNED", "FAIL")
        return sum(1 for t in self.study.get_trials(deepcopy=False)
                   if not t.user_attrs.get("interrupted") and (t.state.name in done or
                                                                (t.state.name == "RUNNING" and _owner_runs(t.user_attrs.get("owner")))))

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        self._recover()
        remaining = self.config.trials - self.finished()
        if remaining <= 0:
            self.echo(f"scalebox: study {self.config.study} already has {self.finished()} finished trial(s)")
            return
        counter = {"left": remaining, "alive": 0}

        def worker() -> None:
            try:
                while True:
                    with self.lock:
                        if self.stopping or counter["left"] <= 0 or self.taken() >= self.config.trials:
                            return
                        counter["left"] -= 1
                    self._one()
            except (OSError, StoreError) as exc:  # a full disk: one line, the study stops
                with self.lock:
                    if self.fatal is None:
                        self.fatal = ExploreError(disk_error(exc, self.dir) if isinstance(exc, OSError)
                                                  else f"{exc}; stopping the study")
                    self.stopping = "fatal"
            except Exception as exc:  # noqa: BLE001 - a launcher or sampler error (a Ray address
                # that does not connect): one line and the study stops; escaping the thread, it
                # was a thread traceback, the other workers went on and the command ended 0
                with self.lock:
                    if self.fatal is None:
                        self.fatal = ExploreError(f"{error_line(exc)}; stopping the study")
                    self.stopping = "fatal"
            finally:
                with self.lock:
                    counter["alive"] -= 1

        def alive() -> int:
            with self.lock:
                return counter["alive"]

        counter["alive"] = min(self.config.parallel, remaining)
        # plain threads, not runtime.threads' (signals blocked): a run's child inherits the mask of
        # the thread that starts it, and a child that cannot see SIGINT/SIGTERM stops only at SIGKILL.
        # A signal the kernel hands a worker waits at most one sleep below for the main thread.
        for i in range(counter["alive"]):
            threading.Thread(target=worker, name=f"explore-{i}", daemon=True).start()
        # the main thread sleeps, never joins: a join that a signal interrupts can leave a live
        # thread marked as ended (CPython 3.11), and the runs would be left to the kernel
        try:
            while alive():
                time.sleep(0.2)
        except BaseException:  # Ctrl-C, SIGTERM: stop every run, their trials failed as interrupted
            with self.lock:
                self.stopping = "interrupted"
                active = list(self.active.values())
            for execution in active:
                try:
                    execution.stop(reason=f"scalebox explore {self.config.study} interrupted", grace=1.0)
                except Exception:
                    pass
            deadline = time.time() + 30
            while alive() and time.time() < deadline:
                time.sleep(0.1)
            raise
        if self.fatal is not None:
            raise self.fatal

    def _one(self) -> None:
        optuna = self.optuna
        trial = self.study.ask()
        trial.set_user_attr("owner", _owner())  # another process's --resume leaves it running
        try:
            value = self._trial(trial)
        except _Pruned:
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            with self.lock:
                self.fails_in_a_row = 0
            return
        except _TrialFailed as exc:
            if self.stopping == "interrupted":  # stopped with the study: asked again on --resume
                trial.set_user_attr("interrupted", True)
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                self.study.enqueue_trial(trial.params, skip_if_exists=False)
                return
            trial.set_user_attr("error", str(exc))
            trial.set_user_attr("error_tail", exc.tail[-30:])
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            self.echo(f"scalebox: trial {trial.number} failed: {exc}")
            with self.lock:
                self.fails_in_a_row += 1
                self.last_tail = exc.tail
                if self.fails_in_a_row >= FAILS_IN_A_ROW and self.fatal is None:
                    tail = "\n".join(exc.tail[-30:])
                    self.fatal = ExploreError(f"{FAILS_IN_A_ROW} trials failed in a row; stopping the study. The last one's error:\n{tail}")
                    self.stopping = "failures"
            return
        except ExploreError as exc:
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            with self.lock:
                if self.fatal is None:
                    self.fatal = exc
                self.stopping = "fatal"
            return
        except BaseException:
            try:  # a full disk may refuse this record too: the error that stopped the trial is the one to say
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            except Exception:
                pass
            raise
        self.study.tell(trial, value)
        with self.lock:
            self.fails_in_a_row = 0
        best = self.study.best_trial
        self.echo(f"scalebox: trial {trial.number} -> {self.config.metric} {value:.6g} (best {best.value:.6g}, trial {best.number})")

    @staticmethod
    def _values(params: Dict[str, Any]) -> str:
        return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())

    def _trial(self, trial) -> float:
        config = self.config
        values = {spec.key: suggest(trial, spec) for spec in config.params}
        label = f"study {config.study}, trial {trial.number}"
        assignments = [(self.bound[k], v) for k, v in values.items()]
        try:
            branch, commit, report = branches.commit_values(
                self.project, assignments, label, f"{config.study}#{trial.number}", f"scalebox explore {config.study} trial {trial.number}")
        except branches.PlaceError as exc:
            raise ExploreError(str(exc)) from None
        trial.set_user_attr("branch", branch)
        trial.set_user_attr("commit", commit)
        trial.set_user_attr("source_commit", report.source_commit)
        self.echo(f"scalebox: trial {trial.number} ({branch}): {self._values(values)}")
        tags = {"study": config.study, "trial": trial.number}
        finals: List[float] = []
        run_ids: List[str] = []
        for index, seed in enumerate(config.seeds):
            feed = trial if index == 0 and config.prune == "median" else None
            record, series = self._run_seed(trial, branch, commit, report.source_commit, seed, tags, feed, run_ids)
            if record["status"] == "pruned":
                raise _Pruned()
            if record["status"] != "ok":
                tail = record.get("error_tail") or []
                last = next((line for line in reversed(tail) if line.strip()), record["status"])
                raise _TrialFailed(f"{branch}#{record['run']} {record['status']}: {last.strip()}", tail)
            points = metric_points(series, config.metric)
            if not points:
                if not self.metric_seen:
                    names = sorted(n for n in series if not n.startswith(runs.ENGINE + "workers/"))
                    raise ExploreError(f"metric {config.metric!r}: {branch}#{record['run']} recorded no such metric"
                                       f" (it recorded: {', '.join(names) if names else 'nothing'}); stopping after the first trial")
                raise _TrialFailed(f"{branch}#{record['run']} recorded no {config.metric!r}", [])
            final = runs.tail_mean(points)
            assert final is not None  # points is not empty
            finals.append(final)
        self.metric_seen = True
        trial.set_user_attr("finals", finals)
        return sum(finals) / len(finals)

    def _run_seed(self, trial, branch, commit, source_commit, seed, tags, feed, run_ids):
        """Run one seed to its end (or its pruning); returns (record dict, series)."""
        if self.config.launcher == "ray":
            from scalebox_cst.explore.raytrials import run_seed_on_ray

            return run_seed_on_ray(self, trial, branch, commit, source_commit, seed, tags, feed, run_ids)
        execution = branches.start_run(self.project, branch, commit, source_commit, self.config.script,
                                       self.config.args, seed, tags)
        run_ids.append(execution.record.id)
        trial.set_user_attr("runs", list(run_ids))
        with self.lock:
            if self.stopping:
                execution.stop(reason=f"scalebox explore {self.config.study} stopping", grace=1.0)
            self.active[trial.number] = execution
        try:
            watcher = _Feed(self, trial, feed, execution.metrics_file)
            started = time.time()
            while execution.poll() is None:
                step = watcher.pump()
                if step is not None:
                    record = branches.mark_pruned(execution, f"pruned by study {self.config.study} at step {step} (below the median)")
                    self.echo(f"scalebox: trial {trial.number} ({execution.record.id}) pruned at step {step}")
                    return record, runs.read_series(execution.dir)
                if self.config.timeout and time.time() - started > self.config.timeout:
                    execution.stop(reason=f"timeout {self.config.timeout}s (scalebox explore)", grace=1.0)
                    break
                time.sleep(0.1)
            watcher.pump()
            record = execution.wait().to_json()
        finally:
            with self.lock:
                self.active.pop(trial.number, None)
        return record, runs.read_series(execution.dir)


class _Feed:
    """The metric as the run writes it, reported to the trial per step (the running mean of its
    last 10 points: the objective's own definition); ``pump`` returns the step to prune at."""

    def __init__(self, study: Study, trial, feed, metrics_file: str) -> None:
        self.study = study
        self.trial = feed
        self.path = metrics_file
        self.offset = 0
        self.values: List[float] = []
        self.reported: set = set()
        metric = study.config.metric
        self.names = (metric, runs.ENGINE + metric, "user/" + metric)

    def pump(self) -> Optional[int]:
        if self.trial is None:
            return None
        try:
            points, self.offset = runs.read_metrics(self.path, self.offset)
        except OSError:
            return None
        prune_at = None
        for point in points:
            if point.name not in self.names or not (point.value == point.value) or abs(point.value) == float("inf"):
                continue
            self.values.append(point.value)
            step = int(point.step)
            if step in self.reported:
                continue
            self.reported.add(step)
            self.trial.report(runs.tail_mean(self.values), step)
            if prune_at is None and self.trial.should_prune():
                prune_at = step
        return prune_at
