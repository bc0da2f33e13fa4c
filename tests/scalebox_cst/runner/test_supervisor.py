"""The one run supervisor (scalebox_cst.runner.supervisor) as a caller such as an explore trial
uses it: start a commit's script with its arguments and environment, follow it, stop it early,
read its record; replace a run; a stop signal while a run starts waits until it is held."""
import os
import signal
import textwrap

import pytest
from conftest import scalebox

from scalebox_cst import runs
from scalebox_cst.project import Project
from scalebox_cst.runner import signals
from scalebox_cst.runner.supervisor import RunSpec, RunSupervisor

TRIAL = textwrap.dedent(
    """
    import argparse, os, time
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000000)
    args = parser.parse_args()
    scale = float(os.environ["TRIAL_SCALE"])
    for i in range(args.steps):
        print(f"step={i} value={i * scale}", flush=True)
        time.sleep(0.05)
    """
)


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "trial.py").write_text(TRIAL)
    (root / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n')
    scalebox("rewrite", str(root))
    return Project(str(root))


def _supervisor(project):
    return RunSupervisor.for_project(project, notice=lambda _: None, tensorboard=False)


def test_a_trial_runs_a_commit_with_its_args_and_env_and_ends_in_its_record(project):
    sup = _supervisor(project)
    run = sup.start(sup.spec("run/0001", "trial.py", ["--steps", "3"], env={"TRIAL_SCALE": "2.5", "OMP_NUM_THREADS": "1"}))
    assert sup.current is run
    record = sup.follow(run, poll_s=0.05)
    assert record.status == "ok" and record.exit_status == 0 and record.args == ["--steps", "3"]
    values = [(p.step, p.value) for p in runs.read_series(run.dir)["value"]]
    assert values == [(0, 0.0), (1, 2.5), (2, 5.0)]  # the arguments and the environment reached the script
    assert sup.active == [] and runs.load_record(run.dir)["status"] == "ok"
    if os.path.exists(f"/proc/{os.getpid()}/stat"):  # its process is named by pid and start: a reused pid is not this run
        assert isinstance(record.pid_start, int) and record.pid_start > 0


def test_a_trial_stopped_early_is_recorded_with_the_reason(project):
    sup = _supervisor(project)
    run = sup.start(sup.spec("run/0001", "trial.py", env={"TRIAL_SCALE": "1"}))

    def pruned(run):
        points = runs.read_series(run.dir).get("value", [])
        return "pruned at step 3" if any(p.step >= 3 for p in points) else None

    record = sup.follow(run, check=pruned, poll_s=0.05)
    assert record.status == "stopped" and record.stop_reason == "pruned at step 3"
    assert record.stop_signals[0] == "SIGINT" and run.poll() is not None
    assert runs.load_record(run.dir)["stop_reason"] == "pruned at step 3" and sup.active == []


def test_replace_stops_the_old_run_and_starts_the_new_one_in_its_place(project):
    sup = _supervisor(project)
    info = project.store.resolve("run/0001")
    old = sup.start(RunSpec.from_branch(info, "trial.py", env={"TRIAL_SCALE": "1"}))
    record, new = sup.replace(old, RunSpec.from_branch(info, "trial.py", ["--steps", "1"], env={"TRIAL_SCALE": "1"},
                                                       hotfix_of="run/0001#1"), reason="replaced by a hot-fix")
    assert record.status == "stopped" and record.stop_reason == "replaced by a hot-fix"
    assert sup.active == [new] and new.record.run == 2 and new.record.hotfix_of == "run/0001#1"
    assert sup.follow(new, poll_s=0.05).status == "ok"


class _Held:
    """A run that never ends by itself (what start() returns, for the signal checks)."""

    dir = ""

    def __init__(self):
        self.stopped = None

    def poll(self):
        return None if self.stopped is None else 0

    def stop(self, grace=None, reason=""):
        self.stopped = reason
        return reason


def test_a_stop_signal_while_a_run_starts_waits_until_it_is_held(project, monkeypatch):
    sup = _supervisor(project)
    held = _Held()

    def start_under_a_signal(spec):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs now, in the middle of the start
        return held

    monkeypatch.setattr(sup, "_execution", start_under_a_signal)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(signals.Interrupted) as caught:
        with sup.signals():
            sup.start(RunSpec("run/0001", "0" * 40, "trial.py"))
    assert caught.value.signum == signal.SIGTERM and str(caught.value) == "SIGTERM"
    assert sup.active == [held]  # held before the signal was raised: the caller can stop it
    sup.stop_all("SIGTERM to the test")
    assert held.stopped == "SIGTERM to the test" and sup.active == []
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is put back


def test_follow_stops_the_run_on_an_interrupt_and_says_which(project, monkeypatch):
    sup = _supervisor(project)
    held = _Held()
    sup.active.append(held)

    def interrupted(_):
        raise signals.Interrupted(signal.SIGHUP)

    monkeypatch.setattr("scalebox_cst.runner.supervisor.time.sleep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sup.follow(held, interrupted="{signal} to the trial")
    assert held.stopped == "SIGHUP to the trial" and sup.active == []


@pytest.mark.parametrize("options", [
    {"nproc": 2, "tensorboard": False},  # the supervisor's own option: two values for it at start
    {"nproc": 2, "env": {"A": "1"}},  # a run's option (RunSpec.env), not torchrun's
    {"nprocs": 2},  # a misspelt one
])
def test_torchrun_options_that_are_not_torchrun_s_fail_when_the_supervisor_is_made(project, options):
    # they used to pass here and fail only at start(), as a TypeError from the Execution call
    with pytest.raises(ValueError, match="torchrun: unknown option"):
        RunSupervisor.for_project(project, notice=lambda _: None, torchrun=options)


def test_the_torchrun_option_names_are_torchrun_execution_s_own_keywords():
    import inspect

    from scalebox_cst.runner import torchrun

    params = inspect.signature(torchrun.TorchrunExecution.__init__).parameters.values()
    own = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY} - {"env"}
    assert set(torchrun.OPTIONS) == own


def test_a_torchrun_start_passes_its_options_and_the_run_s_options_once_each(project, monkeypatch):
    from scalebox_cst.runner import torchrun

    made = []

    class Recorder:
        def __init__(self, *where, **kwargs):
            made.append((where, kwargs))

    monkeypatch.setattr(torchrun, "TorchrunExecution", Recorder)
    sup = RunSupervisor.for_project(project, notice=lambda _: None, tensorboard=False,
                                    torchrun={"nproc": 2, "max_restarts": 1})
    sup._execution(sup.spec("run/0001", "trial.py", ["--steps", "1"], env={"TRIAL_SCALE": "1"}))
    (where, kwargs), = made
    assert where[3:] == ("run/0001", project.store.resolve("run/0001").commit, "trial.py", ["--steps", "1"])
    assert kwargs["nproc"] == 2 and kwargs["max_restarts"] == 1 and kwargs["tensorboard"] is False
    assert kwargs["env"]["TRIAL_SCALE"] == "1"


def test_a_run_started_from_a_thread_that_blocks_stop_signals_still_stops_on_sigint(project):
    """A child inherits the signal mask of the thread that forks it: a run started from a thread
    made by runtime.threads (SIGINT/SIGTERM blocked there) used to ignore the graceful stop and
    end only at SIGKILL, past the grace. The child now starts with an empty mask. (The thread
    lives until the run ends: the death signal the child asks for follows the forking thread.)"""
    import threading

    from scalebox_cst.runtime import threads

    sup = RunSupervisor.for_project(project, notice=lambda _: None, tensorboard=False, grace=2.0)
    records = []

    def start_and_stop():
        run = sup.start(sup.spec("run/0001", "trial.py", env={"TRIAL_SCALE": "1", "OMP_NUM_THREADS": "1"}))
        while not runs.read_series(run.dir).get("value") and run.poll() is None:  # the script is in its loop
            pass
        records.append(sup.stop(run, reason="test stop"))

    threads.start(threading.Thread(target=start_and_stop)).join()
    (record,) = records
    assert record.status == "stopped" and record.stop_signals == ["SIGINT"], record.stop_signals


def test_a_limit_the_child_cannot_apply_is_one_line_and_leaves_no_run(project, monkeypatch):
    """A limit step failing in the child (setrlimit refused a value) raised subprocess's bare
    "Exception occurred in preexec_fn" and left a half run folder."""
    from scalebox_cst import limits
    from scalebox_cst.runner import execution

    real_plan = limits.plan

    def refusing(*args, **kwargs):
        enforcement = real_plan(*args, **kwargs)

        def step():
            raise ValueError("not allowed to raise maximum limit")

        enforcement._steps.append(step)
        enforcement.enforced["memory"] = "4g (RLIMIT_DATA per process)"
        return enforcement

    monkeypatch.setattr(execution.run_limits, "plan", refusing)
    sup = _supervisor(project)
    with pytest.raises(execution.RunStartError) as err:
        sup.start(sup.spec("run/0001", "trial.py", ["--steps", "1"], env={"TRIAL_SCALE": "1"}))
    line = str(err.value)
    assert "\n" not in line and line.startswith("cannot start run/0001#1: starting its process (under limits: memory 4g"), line
    assert sup.active == [] and runs.list_runs(project.root) == []
    assert os.listdir(os.path.join(project.root, ".scalebox", "runs", "run", "0001")) == []
