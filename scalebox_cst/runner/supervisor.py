"""The one run supervisor: starts, stops, replaces and records the runs of a project.

Every way a run is started goes through :class:`RunSupervisor`: ``scalebox run`` (one run, seeds
in parallel, torchrun), ``scalebox-watch --run`` (a run restarted on each save), the hot-fix loop
(``--heal``, and the watcher's healer: the unstable run stopped, its hot-fix started in its
place), ``--locate-nan``, each Ray task on its worker, and a trial of ``scalebox explore``. The
run itself is an :class:`~scalebox_cst.runner.execution.Execution` (its subprocess, folder and
record); what the supervisor adds is the part that was written once per caller: the run's
options from a branch (:class:`RunSpec`), the launcher (local or torchrun), the signal handling
(:mod:`scalebox_cst.runner.signals`: a signal while a run starts waits until it is tracked), the
runs it holds, and stopping them all.

A trial, start to end::

    sup = RunSupervisor.for_project(project)
    run = sup.start(sup.spec("run/0003", "train.py", ["--lr", "3e-4"], env={"X": "1"}, seed=0))
    record = sup.follow(run, check=lambda run: "pruned" if pruner_says_so(run.metrics_file) else None)

``record`` is the finished :class:`~scalebox_cst.runner.record.RunRecord` (``status`` ``"stopped"``
with ``stop_reason="pruned"`` when ``check`` stopped it); the run's series are in ``run.dir``
(read with :func:`scalebox_cst.runs.read_series`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import IO, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from scalebox_cst.runner import signals
from scalebox_cst.runner.record import RunRecord


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run to start: a commit of a branch, the script and its arguments, and how it is seeded.
    ``env`` is added to this process's environment; ``variant`` ``"original"`` runs the source
    snapshot itself; ``hotfix_of`` names the run a hot-fix replaces; ``stale`` the working tree's
    changes since the branch (recorded, not run)."""

    branch: str
    commit: str
    script: str
    args: Tuple[str, ...] = ()
    source_commit: Optional[str] = None
    variant: str = "rewrite"
    seed: Optional[int] = None
    seed_via: Optional[str] = None  # "option" (--seed N appended by the caller) or "env"
    env: Optional[Mapping[str, str]] = None
    hotfix_of: Optional[str] = None
    stale: Optional[Tuple[str, ...]] = None
    tags: Optional[Mapping[str, Any]] = None  # who started it (scalebox explore: study and trial)

    @classmethod
    def from_branch(cls, info, script: str, args: Sequence[str] = (), *, original: bool = False, **fields: Any) -> "RunSpec":
        """The run of ``info`` (a store BranchInfo): its rewrite, or with ``original`` its snapshot."""
        commit = info.source_commit if original else info.commit
        if commit is None:
            raise ValueError(f"{info.name} has no source snapshot to run")
        return cls(info.name, commit, script, tuple(args), source_commit=info.source_commit,
                   variant="original" if original else "rewrite", **fields)


class RunSupervisor:
    """Starts runs of one project and holds them until they are stopped or reaped.

    ``echo``: where the children's stdout goes (None: only to their run folders); ``notice``:
    the supervisor's own one-line messages; ``grace``: seconds between the stop signals;
    ``label_output``: prefix each child's lines with its run id; ``tensorboard``: tail the
    metrics into event files; ``torchrun``: the options of
    :class:`~scalebox_cst.runner.torchrun.TorchrunExecution` (``nproc``, ``nnodes``, ...) to run
    every run under torchrun."""

    def __init__(
        self,
        store_path: str,
        project_root: str,
        runs_root: str,
        *,
        echo: Optional[IO[str]] = None,
        notice: Optional[Callable[[str], None]] = None,
        grace: float = 3.0,
        label_output: bool = False,
        tensorboard: bool = True,
        torchrun: Optional[Dict[str, Any]] = None,
    ) -> None:
        self.store_path = store_path
        self.project_root = project_root
        self.runs_root = runs_root
        self.echo = echo
        self.notice = notice
        self.grace = grace
        self.label_output = label_output
        self.tensorboard = tensorboard
        if torchrun is not None:
            from scalebox_cst.runner.torchrun import OPTIONS

            unknown = sorted(set(torchrun) - set(OPTIONS))
            if unknown:
                raise ValueError(f"torchrun: unknown option(s) {', '.join(unknown)}; known: {', '.join(OPTIONS)}")
        self.torchrun = dict(torchrun) if torchrun is not None else None
        self.project = None
        self.active: List[Any] = []  # started, not yet stopped or reaped; oldest first
        self._gate: Optional[signals.Gate] = None

    @classmethod
    def for_project(cls, project, **options: Any) -> "RunSupervisor":
        """A supervisor of ``project``'s runs (its store, its ``.scalebox/runs``)."""
        supervisor = cls(project.store.path, project.root, project.runs_dir, **options)
        supervisor.project = project
        return supervisor

    # ------------------------------------------------------------------ starting
    def spec(self, branch: str, script: str, args: Sequence[str] = (), *, original: bool = False, **fields: Any) -> RunSpec:
        """The :class:`RunSpec` of ``branch`` (a name or ``HEAD``-like ref the store resolves)."""
        if self.project is None:
            raise ValueError("spec() needs a supervisor made by RunSupervisor.for_project")
        return RunSpec.from_branch(self.project.store.resolve(branch), script, args, original=original, **fields)

    def start(self, spec: RunSpec):
        """Start ``spec`` as a new run (a new run folder) and hold it; returns its Execution. A
        stop signal that comes while it starts (under :meth:`signals`) is raised once it is held."""
        with self._gate.starting() if self._gate is not None else contextlib.nullcontext():
            run = self._execution(spec)
            self.active.append(run)
        return run

    def _execution(self, spec: RunSpec):
        from scalebox_cst.runner import execution  # looked up per start: tests replace Execution there

        env = dict(os.environ, **spec.env) if spec.env else None
        kwargs: Dict[str, Any] = dict(
            echo=self.echo, env=env, source_commit=spec.source_commit, variant=spec.variant, seed=spec.seed,
            seed_via=spec.seed_via, hotfix_of=spec.hotfix_of, stale=list(spec.stale) if spec.stale is not None else None,
            label_output=self.label_output, notice=self.notice, tensorboard=self.tensorboard,
        )
        if spec.tags:
            kwargs["tags"] = dict(spec.tags)
        where = (self.store_path, self.project_root, self.runs_root, spec.branch, spec.commit, spec.script, list(spec.args))
        if self.torchrun is not None:
            from scalebox_cst.runner.torchrun import TorchrunExecution

            return TorchrunExecution(*where, **{**self.torchrun, **kwargs})
        return execution.Execution(*where, **kwargs)

    # ------------------------------------------------------------------ stopping and ending
    def stop(self, run, reason: str = "stopped", grace: Optional[float] = None) -> RunRecord:
        """Stop ``run`` (SIGINT, SIGTERM, SIGKILL to its group, ``grace`` seconds apart) and let
        it go; returns its finished record, ``stop_reason`` = ``reason``."""
        self.release(run)
        grace = self.grace if grace is None else grace
        return run.stop(grace=grace, reason=reason)

    def wait(self, run, timeout: Optional[float] = None) -> RunRecord:
        """The finished record of ``run`` once it ends (it stays held: :meth:`reap` lets it go)."""
        return run.wait() if timeout is None else run.wait(timeout)

    def reap(self, run) -> RunRecord:
        """The finished record of a run that ended; it is no longer held."""
        record = self.wait(run)
        self.release(run)
        return record

    def release(self, run) -> None:
        """No longer hold ``run`` (its end is the caller's)."""
        if run in self.active:
            self.active.remove(run)

    def ended(self) -> List[Tuple[Any, RunRecord]]:
        """(run, record) of each held run that ended by itself since the last call, reaped."""
        done = [run for run in self.active if run.poll() is not None]
        return [(run, self.reap(run)) for run in done]

    def replace(self, run, spec: RunSpec, reason: str) -> Tuple[Optional[RunRecord], Any]:
        """Stop ``run`` (if one, and if it still runs; else reap it) with ``reason`` and start
        ``spec`` in its place: (the old record or None, the new run)."""
        record = None
        if run is not None:
            record = self.stop(run, reason) if run.poll() is None else self.reap(run)
        return record, self.start(spec)

    def stop_all(self, reason: str, each: Optional[Callable[[Any, RunRecord], None]] = None) -> List[Tuple[Any, RunRecord]]:
        """Stop every held run, with the stop signals ignored meanwhile (it takes up to two grace
        periods; a second Ctrl-C must not orphan a child); ``each(run, record)`` as each ends."""
        out = []
        with signals.ignored():
            for run in list(self.active):
                record = self.stop(run, reason)
                if each is not None:
                    each(run, record)
                out.append((run, record))
        return out

    @property
    def current(self):
        """The newest held run, or None (the watcher holds one at a time)."""
        return self.active[-1] if self.active else None

    # ------------------------------------------------------------------ signals and following
    @contextlib.contextmanager
    def signals(self) -> Iterator[None]:
        """Within the block SIGTERM, SIGHUP and SIGINT raise :class:`signals.Interrupted` in the
        main thread (the caller stops the runs: :meth:`stop_all`); one that comes while a run
        starts waits until the run is held."""
        gate = signals.Gate()
        self._gate = gate
        try:
            with signals.raising(gate):
                yield
        finally:
            self._gate = None

    def follow(self, run, *, check: Optional[Callable[[Any], Optional[str]]] = None, poll_s: float = 0.5,
               interrupted: str = "{signal} to scalebox") -> RunRecord:
        """Wait for ``run`` to end, calling ``check(run)`` every ``poll_s`` seconds: a reason it
        returns stops the run with that reason (a pruned trial, an unstable run). An interrupt
        (Ctrl-C, or :class:`signals.Interrupted`) stops the run with ``interrupted`` (``{signal}``:
        the signal's name) and propagates. Returns the finished record; the run is let go."""
        try:
            while run.poll() is None:
                reason = check(run) if check is not None else None
                if reason is not None:
                    return self.stop(run, reason)
                time.sleep(poll_s)
        except KeyboardInterrupt as exc:
            self.stop(run, interrupted.format(signal=exc or "SIGINT"))
            raise
        return self.reap(run)
