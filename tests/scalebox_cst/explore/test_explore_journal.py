"""The study's journal under faults: a full disk mid-study (one line, the journal left whole),
a journal cut short or garbled at its end (``--resume`` repairs it, keeping a copy, in one line),
damage elsewhere or a folder in its place (one line), and the monitor's /api/study on each."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import scalebox

optuna = pytest.importorskip("optuna")

from scalebox_cst.explore import monitor_api  # noqa: E402
from scalebox_cst.explore.study import load_study  # noqa: E402
from scalebox_cst.monitor.api import ApiError  # noqa: E402

SCRIPT = textwrap.dedent(
    """\
    LR = 0.9
    for step in range(3):
        print(f"step={step} score={-(LR - 0.3) ** 2:.6f}")
    """
)
CONFIG = textwrap.dedent(
    """\
    script: train.py
    metric: score
    trials: 2
    seeds: [0]
    sampler: random
    params:
      LR: {uniform: [0.0, 1.0]}
    """
)
ENV = {"SCALEBOX_TELEMETRY": "0", "SCALEBOX_PROFILE": "0"}
# a disk that fills up: the journal's writes after the first N fail with ENOSPC, half written
FULL_DISK = textwrap.dedent(
    """\
    import errno, os
    _write, _count = os.write, [0]
    def _full(fd, data):
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            name = ""
        if name.endswith("journal.log"):
            _count[0] += 1
            if _count[0] > int(os.environ["JOURNAL_WRITES"]):
                if len(data) > 1:
                    return _write(fd, bytes(data)[: len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return _write(fd, data)
    os.write = _full
    from scalebox_cst.cli import main
    main()
    """
)


def make(tmp_path, trials=2):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text(SCRIPT)
    (root / "explore.yaml").write_text(CONFIG.replace("trials: 2", f"trials: {trials}"))
    scalebox("init", ".", cwd=root)
    return root


def explore(root, *args, check=True):
    return scalebox("explore", "-c", "explore.yaml", *args, cwd=root, check=check, env=ENV, timeout=240)


def journal(root):
    return root / ".scalebox" / "explore" / "explore" / "journal.log"


def states(root):
    return [t.state.name for t in load_study(str(root), "explore").get_trials(deepcopy=False)]


def explore_on_a_full_disk(root, tmp_path, writes):
    """``explore`` whose journal writes after the first ``writes`` fail with ENOSPC (FULL_DISK)."""
    (tmp_path / "fulldisk.py").write_text(FULL_DISK)
    env = {**os.environ, **ENV, "OMP_NUM_THREADS": "1", "JOURNAL_WRITES": str(writes)}
    return subprocess.run([sys.executable, str(tmp_path / "fulldisk.py"), "explore", "-c", "explore.yaml"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=240)


def no_traceback(proc):
    assert "Traceback" not in proc.stderr and "Error:" not in proc.stderr.replace("scalebox:", ""), proc.stderr


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = make(tmp_path_factory.mktemp("journal"))
    explore(root, "--sampler-seed", "0")
    return root, journal(root).read_bytes()


def fresh(finished, tmp_path, tail: bytes = b"", cut: int = 0):
    """A copy of the finished study with its journal cut by ``cut`` bytes and ``tail`` appended."""
    import shutil

    root = tmp_path / "proj"
    shutil.copytree(finished[0], root)
    data = finished[1]
    journal(root).write_bytes(data[: len(data) - cut] + tail)
    (root / "explore.yaml").write_text(CONFIG.replace("trials: 2", "trials: 3"))
    return root


@pytest.mark.parametrize("damage", ["cut", "nul", "garbled"])
def test_resume_repairs_a_damaged_last_record_and_keeps_a_copy(finished, tmp_path, damage):
    root = {"cut": lambda: fresh(finished, tmp_path, cut=37),
            "nul": lambda: fresh(finished, tmp_path, tail=b"\0" * 64),
            "garbled": lambda: fresh(finished, tmp_path, tail=b'{"op_code": 5, "worker\n')}[damage]()
    damaged = journal(root).read_bytes()
    # read only (the monitor): the damaged end is skipped, nothing is written
    assert monitor_api.study(str(root), "explore")["counts"]["complete"] >= 1
    assert journal(root).read_bytes() == damaged
    proc = explore(root, "--resume", check=False)
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    repaired = [line for line in proc.stderr.splitlines() if "its last record" in line]
    assert len(repaired) == 1 and "cut off" in repaired[0] and "journal.log.damaged-" in repaired[0], proc.stderr
    copies = [p for p in journal(root).parent.iterdir() if p.name.startswith("journal.log.damaged-")]
    assert len(copies) == 1 and copies[0].read_bytes() == damaged
    assert states(root).count("COMPLETE") == 3
    assert explore(root, "--resume").returncode == 0  # and it reads again afterwards


def test_damage_before_the_last_record_is_one_line(finished, tmp_path):
    root = fresh(finished, tmp_path)
    lines = journal(root).read_bytes().splitlines(keepends=True)
    lines[1] = b'{"op_code": 4, "gar\n'
    journal(root).write_bytes(b"".join(lines))
    proc = explore(root, "--resume", check=False)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"journal.log: line 2 of {len(lines)} is not JSON; the study cannot be read" in proc.stderr
    with pytest.raises(ApiError, match="line 2"):
        monitor_api.study(str(root), "explore")


def test_a_folder_in_place_of_the_journal_is_one_line(finished, tmp_path):
    root = fresh(finished, tmp_path)
    journal(root).unlink()
    journal(root).mkdir()
    proc = explore(root, "--resume", check=False)
    assert proc.returncode == 1 and proc.stderr.strip().endswith("journal.log: not a regular file; move it away to start the study again")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert monitor_api.studies(str(root)) == {"studies": []}


def test_a_link_in_place_of_the_journal_is_one_line_and_its_target_is_never_cut(finished, tmp_path):
    # a project that came with .scalebox/explore/S/journal.log -> a file outside: --resume read the
    # target as the journal, found its one line "cut short" and truncated the target to 0 bytes
    root = fresh(finished, tmp_path)
    victim = tmp_path / "outside.txt"
    victim.write_bytes(b"a token without a newline")
    journal(root).unlink()
    journal(root).symlink_to(victim)
    proc = explore(root, "--resume", check=False)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "journal.log: a symbolic link" in proc.stderr and "remove it" in proc.stderr
    assert victim.read_bytes() == b"a token without a newline"
    assert not [p for p in journal(root).parent.iterdir() if p.name.startswith("journal.log.damaged-")]
    with pytest.raises(ApiError, match="symbolic link"):
        monitor_api.study(str(root), "explore")


def test_a_record_of_an_unknown_operation_is_one_line(finished, tmp_path):
    # Optuna's replay asserted ("AssertionError: Should not reach."): a traceback
    root = fresh(finished, tmp_path)
    lines = journal(root).read_bytes().splitlines(keepends=True)
    lines[1] = b'{"op_code": 999, "worker_id": "w", "study_id": 0}\n'
    journal(root).write_bytes(b"".join(lines))
    proc = explore(root, "--resume", check=False)
    no_traceback(proc)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "line 2 of" in proc.stderr and "unknown operation (999)" in proc.stderr


@pytest.mark.parametrize("writes", [3, 12])
def test_a_full_disk_stops_the_study_in_one_line_and_resume_goes_on(tmp_path, writes):
    root = make(tmp_path, trials=4)
    proc = explore_on_a_full_disk(root, tmp_path, writes)
    no_traceback(proc)
    assert proc.returncode == 1
    assert "No space left on device; stopping the study" in proc.stderr, proc.stderr
    data = journal(root).read_bytes()
    assert data.endswith(b"\n") and os.path.getsize(journal(root)) == len(data)  # no partial record left
    again = explore(root, "--resume", check=False)
    no_traceback(again)
    assert again.returncode == 0, again.stderr
    assert states(root).count("COMPLETE") == 4


def test_a_disk_full_before_the_study_is_stored_says_to_run_it_again_not_to_resume(tmp_path):
    """The study's first journal write failing said "make room, then --resume", and --resume then
    answered "no study to resume" (the fault campaign's third list)."""
    root = make(tmp_path, trials=1)
    proc = explore_on_a_full_disk(root, tmp_path, 0)
    no_traceback(proc)
    assert proc.returncode == 1 and "no study was stored: make room, then run the same command again" in proc.stderr, proc.stderr
    again = explore(root, check=False)
    no_traceback(again)
    assert again.returncode == 0, again.stderr
    assert states(root).count("COMPLETE") == 1


def test_a_held_or_stale_journal_lock_is_said_before_the_wait(tmp_path):
    """Optuna waits for its journal's lock (and breaks one left alone for 30 s) with nothing said
    for its first 10 s: a lock found when the study opens is one line at once."""
    from scalebox_cst.explore import journal
    from scalebox_cst.explore.study import storage

    directory = tmp_path / ".scalebox" / "explore" / "s"
    directory.mkdir(parents=True)
    said = []
    storage(str(directory), echo=said.append)
    assert said == []
    os.symlink(journal.JOURNAL, directory / (journal.JOURNAL + ".lock"))  # as Optuna's lock, its writer killed
    storage(str(directory), echo=said.append)
    assert said == [f"scalebox: .scalebox/explore/s/{journal.JOURNAL}.lock is held: another explore of this study is writing, "
                    "or a killed one left it (Optuna breaks a lock left alone for 30 s)"]


def test_two_explores_of_one_study_run_its_trials_between_them(tmp_path):
    """A second `explore --resume` started while the first runs: each counted only the trials
    finished when it began and ran the rest itself (12 completed for `trials: 6`, the fault
    campaign's third list). Trials finished or running in either process now count for both."""
    import time

    root = make(tmp_path, trials=4)
    (root / "train.py").write_text("import time\n" + SCRIPT.replace("for step in range(3):", "for step in range(3):\n    time.sleep(0.4)"))
    env = {**os.environ, **ENV, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", "from scalebox_cst.cli import main; main()", "explore", "-c", "explore.yaml"]
    first = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (journal(root).exists() and "RUNNING" in states(root)):
            time.sleep(0.2)
        second = subprocess.run(cmd + ["--resume"], cwd=root, env=env, capture_output=True, text=True, timeout=240)
        out, err = first.communicate(timeout=240)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0 and second.returncode == 0, (err, second.stderr)
    done = states(root)
    # one more at most: the two may each find three taken at the same instant
    assert 4 <= done.count("COMPLETE") <= 5 and "RUNNING" not in done, done
