"""Races between scalebox processes on one project, saves the clock does not order, and Ctrl-C
as a command starts, in random trials: two watchers at once (the second is refused in one line,
and a killed first leaves no stale lock); saves of the same size whose mtime was kept, set back,
or set far ahead, under the polling watcher (each one is a branch); SIGINT while the console
script loads (one line, status 130). ``SCALEBOX_FAULT_TRIALS`` sets the trials per test (CI: a
few), as in test_faults.py.
"""
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from scalebox_cst.project import Project
from scalebox_cst.watcher import Watcher

from conftest import HELPERS_PY, TRAIN_PY, newest_branch_holds, scalebox, sigint_as_from_a_terminal

TRIALS = int(os.environ.get("SCALEBOX_FAULT_TRIALS", "4"))


def _project(root):
    root.mkdir()
    (root / "train.py").write_text(TRAIN_PY)
    (root / "helpers.py").write_text(HELPERS_PY)
    Project.init(str(root))
    return root


def _watch(root):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-c", "from scalebox_cst.cli import main; main()", "watch", ".", "--debounce", "0.05"],
                            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)


def _wait_line(proc, needle, timeout=60.0):
    """Read proc's stdout until a line holding ``needle`` (the watcher says it after its first commit)."""
    deadline = time.time() + timeout
    seen = []
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return seen
    raise AssertionError(f"no {needle!r} from the watcher: {seen}")


def test_a_second_watcher_of_a_project_is_refused_and_a_killed_one_leaves_no_lock(tmp_path):
    rng = random.Random(41)
    failures = []
    for trial in range(max(1, TRIALS // 2)):
        root = _project(tmp_path / f"proj{trial}")
        first = _watch(root)
        try:
            _wait_line(first, "run/0001")
            second = scalebox("watch", ".", cwd=root, check=False, timeout=20)
            lines = second.stderr.strip().splitlines()
            if not (second.returncode == 1 and len(lines) == 1 and f"pid {first.pid}" in lines[0]
                    and "already watched" in lines[0] and "Traceback" not in second.stderr):
                failures.append((trial, "second", second.returncode, second.stdout[-300:], second.stderr[-300:]))
            how = rng.choice([signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
            os.killpg(first.pid, how)
            first.wait(timeout=30)
            # the lock went with its holder: a new watcher starts, and one save is one branch
            third = _watch(root)
            try:
                _wait_line(third, "watching")
                time.sleep(0.5)
                (root / "helpers.py").write_text(HELPERS_PY + f"# save {trial}\n")
                made = _wait_line(third, "run/0002")
                time.sleep(1.0)
                branches = [b.name for b in Project(str(root)).store.branches()]
                if branches.count("run/0003") or not made:
                    failures.append((trial, how, "branches", branches))
            finally:
                os.killpg(third.pid, signal.SIGTERM)
                third.communicate(timeout=30)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
            first.communicate(timeout=30)
    print(f"\n{max(1, TRIALS // 2)} second watchers: {len(failures)} failure(s)")
    assert not failures, failures


def test_saves_that_keep_or_skew_the_mtime_are_each_a_branch_under_the_polling_watcher(tmp_path):
    rng = random.Random(43)
    root = _project(tmp_path / "proj")
    project = Project(str(root), backend="cpu")
    watcher = Watcher(project, debounce=0.05, polling=True, echo=lambda line: None)
    watcher.start()
    failures = []
    path = root / "helpers.py"
    try:
        for trial in range(TRIALS * 2):
            before = os.stat(path)
            marker = f"# save {trial:04d}\n"  # every save the same size
            path.write_text(HELPERS_PY + marker)
            how = rng.choice(["kept", "future", "past", "epoch"])
            if how == "kept":  # an editor or copy that preserves the mtime, or a coarse clock
                os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
            else:
                stamp = {"future": time.time() + 86400 * 365, "past": time.time() - 86400 * 3650, "epoch": 0}[how]
                os.utime(path, (stamp, stamp))
            if not newest_branch_holds(watcher, project, "helpers.py", (HELPERS_PY + marker).encode(), timeout=10):
                failures.append((trial, how))
    finally:
        watcher.close()
    print(f"\n{TRIALS * 2} mtime-skewed saves under polling: {len(failures)} lost")
    assert not failures, failures


def test_ctrl_c_while_a_command_starts_is_one_line_and_status_130(tmp_path):
    """SIGINT while the console script loads its modules (click, pygit2, the engine) was a
    KeyboardInterrupt traceback from inside an import; now one line and 130, or the command's own
    handling once it runs (0 where it had finished); click's ``Aborted!`` and status 1 once
    loaded is ``interrupted`` and 130 too. A SIGINT in the interpreter's own start-up,
    before the entry module runs (tens of milliseconds), is Python's and not counted."""
    script = os.path.join(os.path.dirname(sys.executable), "scalebox")
    if not os.path.exists(script):
        pytest.skip("no installed scalebox console script beside this python")
    root = _project(tmp_path / "proj")
    scalebox("rewrite", ".", cwd=root)  # a branch: every command below ends with 0 when not interrupted
    rng = random.Random(47)
    failures = []
    for trial in range(TRIALS * 3):
        cmd = rng.choice([["log"], ["status"], ["init"], ["diff", "--stat"], ["rewrite", "."]])
        delay = rng.uniform(0.0, 1.5 if cmd[0] == "rewrite" else 0.3)
        (root / "helpers.py").write_text(HELPERS_PY + f"# {trial}\n")  # a rewrite has something to do
        proc = subprocess.Popen([script, *cmd], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True,
                                preexec_fn=sigint_as_from_a_terminal)
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        lines = err.strip().splitlines()
        if "Traceback" in err and "scalebox_cst" + os.sep not in err:
            continue  # the interpreter's own start-up, before any module of the package ran
        if "Traceback" in err or len(lines) > 1 or proc.returncode not in (0, 130, -signal.SIGINT):
            failures.append((trial, cmd, round(delay, 3), proc.returncode, err[-400:]))
    print(f"\n{TRIALS * 3} Ctrl-C during start-up: {len(failures)} failure(s)")
    assert not failures, failures


_INTERRUPT_AT = """
import os, signal, sys
import click
from scalebox_cst import _entry
where, entry = sys.argv[1], sys.argv[2]
sys.argv = ["scalebox", *sys.argv[3:]]
cls, name = {"parse": (click.Command, "make_context"), "close": (click.Context, "close")}[where]
original = getattr(cls, name)

def interrupted(self, *a, **k):
    os.kill(os.getpid(), signal.SIGINT)  # delivered at the next bytecode: inside click, outside the command
    return original(self, *a, **k)

setattr(cls, name, interrupted)
getattr(_entry, entry)()
"""


@pytest.mark.parametrize("where,entry,argv", [("parse", "main", ["log"]), ("close", "main", ["log"]),
                                              ("parse", "watch_main", [".", "--debounce", "0.05"])])
def test_ctrl_c_while_click_parses_or_closes_is_one_line_and_status_130(tmp_path, where, entry, argv):
    """The console script's start-up handler was put back as soon as the modules had loaded, so a
    Ctrl-C while click parsed the arguments (CI: 0.12 s in) or closed its context after the
    command was click's ``Aborted!`` and status 1. Now: before the command, ``interrupted while
    starting`` and 130; after it, ``interrupted`` and 130 with the command's output whole."""
    root = _project(tmp_path / "proj")
    proc = subprocess.run([sys.executable, "-c", _INTERRUPT_AT, where, entry, *argv], cwd=root, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"),
                          preexec_fn=sigint_as_from_a_terminal)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 130 and len(lines) == 1 and "Aborted" not in proc.stderr, (proc.returncode, proc.stderr)
    assert lines[0] == ("scalebox: interrupted while starting; nothing was done" if where == "parse" else "scalebox: interrupted")
    if where == "close":
        assert proc.stdout == "no run branches yet\n"  # what the command printed before the Ctrl-C


def test_a_watcher_whose_output_is_closed_stops_with_one_line_and_leaves_no_run(tmp_path):
    """``scalebox watch . --run x.py | tee log`` and the tee dies: the watcher ended with status 1
    and not a word (click's EPIPE exit); now one stderr line with the branches made, the run stopped."""
    root = _project(tmp_path / "proj")
    (root / "slow.py").write_text("import time\nfor i in range(600):\n    print(f'step={i}', flush=True)\n    time.sleep(0.05)\n")
    rng = random.Random(53)
    failures = []
    for trial in range(max(1, TRIALS // 2)):
        read, write = os.pipe()
        proc = subprocess.Popen([sys.executable, "-c", "from scalebox_cst.cli import main; main()", "watch", ".", "--debounce", "0.05",
                                 *(["--run", "slow.py"] if rng.random() < 0.7 else [])],
                                cwd=root, stdout=write, stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                                start_new_session=True)
        os.close(write)
        with os.fdopen(read) as out:
            out.readline()  # "watching ..."
        # the reader is gone: the next line the watcher writes meets a closed pipe
        for i in range(3):
            (root / "helpers.py").write_text(HELPERS_PY + f"# {trial}.{i}\n")
            time.sleep(1.0)
            if proc.poll() is not None:
                break
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
            failures.append((trial, "still running with no reader"))
            continue
        left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
        lines = [line for line in err.splitlines() if "stopped: its output was closed" in line]
        if proc.returncode != 1 or len(lines) != 1 or "Traceback" in err or left:
            failures.append((trial, proc.returncode, err[-400:], left))
    print(f"\n{max(1, TRIALS // 2)} watchers with a closed output: {len(failures)} failure(s)")
    assert not failures, failures
