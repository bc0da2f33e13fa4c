"""The watcher with real file events: editor saves, bursts, syntax errors, runs restarted."""
import io
import os
import time

import pytest

from scalebox_cst.project import Project
from scalebox_cst.watcher import Watcher



def make_watcher(root, script=None, args=(), polling=False, debounce=0.15):
    project, _ = Project.init(str(root))
    project = Project(str(root), backend="cpu")
    messages = []
    watcher = Watcher(project, script, args, debounce=debounce, polling=polling, echo=messages.append, run_output=io.StringIO(), grace=2.0)
    return watcher, messages


def wait_for(predicate, watcher, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        watcher.process_pending(timeout=0.1)
        if predicate():
            return True
    return False


def branches(watcher):
    return [b.name for b in watcher.project.store.branches()]


@pytest.fixture
def started(project):
    watcher, messages = make_watcher(project)
    watcher.start()
    yield watcher, messages, project
    watcher.close()


def test_initial_state_is_committed_once(started):
    watcher, messages, project = started
    assert branches(watcher) == ["run/0001"]
    watcher2, _ = make_watcher(project)
    watcher2.handle_change()
    assert branches(watcher) == ["run/0001"]  # same content + fingerprint: no new branch


def test_rename_save_creates_a_branch(started):
    watcher, messages, project = started
    tmp = project / ".train.py.swp~"
    tmp.write_text((project / "train.py").read_text() + "# edited\n")
    os.replace(tmp, project / "train.py")  # an editor's atomic save
    assert wait_for(lambda: len(branches(watcher)) == 2, watcher)
    info = watcher.project.store.resolve("run/0002")
    assert b"# edited" in watcher.project.store.read_file(info.commit, "train.py")


def test_reads_touches_and_non_python_files_make_no_branch(started):
    watcher, messages, project = started
    (project / "train.py").read_text()
    os.utime(project / "train.py")
    (project / "data.txt").write_text("changed\n")
    (project / "notes.md").write_text("x\n")
    watcher.process_pending(timeout=0.5)
    watcher.process_pending(timeout=0.5)
    assert branches(watcher) == ["run/0001"]


def test_burst_of_100_files_is_one_batch(started):
    watcher, messages, project = started
    pkg = project / "pkg"
    pkg.mkdir()
    for i in range(100):
        (pkg / f"m{i:03d}.py").write_text(f"X = {i}\n")
    assert wait_for(lambda: len(branches(watcher)) >= 2, watcher)
    watcher.process_pending(timeout=0.5)
    assert branches(watcher) == ["run/0001", "run/0002"]
    info = watcher.project.store.resolve("run/0002")
    assert len([p for p in watcher.project.store.tree_paths(info.commit) if p.startswith("pkg/")]) == 100


def test_syntax_error_then_fix(started):
    watcher, messages, project = started
    good = (project / "train.py").read_text()
    (project / "train.py").write_text(good + "def broken(:\n")
    assert wait_for(lambda: any("SyntaxError" in m for m in messages), watcher)
    assert branches(watcher) == ["run/0001"]
    error_lines = [m for m in messages if "SyntaxError" in m]
    assert error_lines[0].startswith("train.py:") and "\n" not in error_lines[0]
    (project / "train.py").write_text(good + "# fixed\n")
    assert wait_for(lambda: len(branches(watcher)) == 2, watcher)


def test_state_dirs_are_ignored(started):
    watcher, messages, project = started
    (project / "__pycache__").mkdir(exist_ok=True)
    (project / "__pycache__" / "x.py").write_text("X = 1\n")
    (project / ".scalebox" / "junk.py").write_text("X = 1\n")
    watcher.process_pending(timeout=0.5)
    assert watcher.events.empty()
    assert branches(watcher) == ["run/0001"]


def test_polling_observer_works(project):
    watcher, messages = make_watcher(project, polling=True)
    watcher.start()
    try:
        (project / "helpers.py").write_text("X = 2\n")
        assert wait_for(lambda: len(branches(watcher)) == 2, watcher, timeout=15)
    finally:
        watcher.close()


def test_run_is_restarted_from_each_new_branch(project):
    slow = project / "loop.py"
    slow.write_text(
        "import time, helpers\n"
        "print('started', flush=True)\n"
        "try:\n"
        "    time.sleep(60)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
    )
    watcher, messages = make_watcher(project, script="loop.py")
    watcher.start()
    try:
        first = watcher.execution
        assert first is not None and first.record.branch == "run/0001"
        time.sleep(1.0)
        saved = time.time()
        (project / "helpers.py").write_text("VALUE = 2\n")
        assert wait_for(lambda: watcher.execution is not first, watcher)
        restart = time.time() - saved
        assert watcher.execution.record.branch == "run/0002"
        assert first.record.stopped and first.record.exit_status is not None
        assert restart < 5.0  # generous bound for a shared CI machine; measured in benchmarks
    finally:
        watcher.close()
    record = watcher.project.runs_dir
    assert os.path.exists(os.path.join(record, "run", "0001", "0001", "record.json"))  # run/0001, run 1


def test_a_save_that_restarts_the_run_says_so_and_records_the_stop_the_same_way(project):
    """The stopped run's own last line names the save (not a bare KeyboardInterrupt), and each
    restart is recorded alike: reason, the signals sent, one event message."""
    from scalebox_cst import runs

    (project / "loop.py").write_text("import time, helpers\nprint('started', flush=True)\ntime.sleep(60)\n")
    watcher, messages = make_watcher(project, script="loop.py")
    watcher.start()
    stopped = []
    try:
        for value in (2, 3):
            running = watcher.execution
            assert wait_for(lambda: "started" in watcher.run_output.getvalue().split("restarted it")[-1], watcher, timeout=60)
            (project / "helpers.py").write_text(f"VALUE = {value}\n")
            assert wait_for(lambda: watcher.execution is not running, watcher, timeout=30)
            stopped.append(running)
        last = watcher.execution  # stopped at once, in its start-up: one line too, no traceback
    finally:
        watcher.close()
    output = watcher.run_output.getvalue()
    assert "KeyboardInterrupt" not in output and "Traceback" not in output, output
    assert (last.record.stop_reason, last.record.stop_signals, last.record.signal) == ("scalebox-watch stopped", ["SIGINT"], "SIGINT")
    for number, execution in enumerate(stopped, start=2):
        reason = f"a save restarted it from run/{number:04d}"
        assert f"scalebox: run stopped: {reason}\n" in output  # the child's own line
        record = execution.record
        assert (record.status, record.stop_reason, record.stop_signals, record.signal) == ("stopped", reason, ["SIGINT"], "SIGINT")
        assert any(m.startswith(f"scalebox: {record.id} stopped after ") and m.endswith(f"s: {reason}") for m in messages), messages
        events, _ = runs.read_events(os.path.join(execution.dir, runs.EVENTS))
        assert [e["kind"] for e in events] == ["started", "stopping", "stopped"]
        assert events[-1]["message"].endswith(f": {reason}") and events[1]["message"] == reason


def test_engine_state_writes_do_not_retrigger(started):
    """Runs and the store write under .scalebox/: that must never cause another batch."""
    watcher, messages, project = started
    runs = project / ".scalebox" / "runs" / "run" / "0009"
    runs.mkdir(parents=True)
    (runs / "log.txt").write_text("x\n")
    (runs / "sub.py").write_text("X = 1\n")
    watcher.process_pending(timeout=0.5)
    assert watcher.events.empty()


def test_a_lasting_syntax_error_is_reported_once(started):
    watcher, messages, project = started
    (project / "train.py").write_text("def broken(:\n")
    assert wait_for(lambda: any("SyntaxError" in m for m in messages), watcher)
    (project / "helpers.py").write_text("X = 3\n")  # another save while train.py is still broken
    watcher.process_pending(timeout=0.5)
    watcher.process_pending(timeout=0.5)
    assert sum("SyntaxError" in m for m in messages) == 1
    assert branches(watcher) == ["run/0001"]


# ---------------------------------------------------------------------------- keep watching (issue 9, items 9-10)
def test_a_store_error_is_one_line_and_the_watcher_keeps_going(started, monkeypatch):
    from scalebox_cst.store import StoreError

    watcher, messages, project = started
    real = watcher.project.commit_change
    errors = [StoreError("the store stayed busy: refs/heads/source.lock"), OSError(28, "No space left on device")]

    def failing(*args, **kwargs):
        if errors:
            raise errors.pop(0)
        return real(*args, **kwargs)

    monkeypatch.setattr(watcher.project, "commit_change", failing)
    (project / "train.py").write_text((project / "train.py").read_text() + "# one\n")
    first = watcher.handle_change()
    assert not first.created and first.blocked == ["scalebox: the store stayed busy: refs/heads/source.lock; this change was not committed, still watching"]
    second = watcher.handle_change()
    assert second.blocked and "OSError: [Errno 28] No space left on device" in second.blocked[0]
    assert all("\n" not in m for m in messages)
    third = watcher.handle_change()  # the store is fine again: the pending change is committed
    assert third.created and branches(watcher) == ["run/0001", "run/0002"]


def test_a_run_that_cannot_start_is_one_line(project, monkeypatch):
    import scalebox_cst.runner.execution as executor

    watcher, messages = make_watcher(project, script="train.py")

    def refuse(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(executor, "Execution", refuse)
    try:
        watcher.start()
        assert watcher.execution is None and branches(watcher) == ["run/0001"]
        assert any("Read-only file system; train.py not started from run/0001, still watching" in m for m in messages), messages
    finally:
        watcher.close()


def test_a_file_name_that_is_not_utf8_is_skipped_with_a_warning(project):
    odd = os.path.join(os.fsencode(str(project)), b"caf\xe9.py")
    with open(odd, "wb") as fh:
        fh.write(b"x = 1\n")
    watcher, messages = make_watcher(project)
    watcher.start()
    try:
        assert branches(watcher) == ["run/0001"]
        files = watcher.project.store.files(watcher.project.store.resolve("run/0001").source_commit)
        assert "train.py" in files and len(files) == 2  # train.py, helpers.py
        warned = [m for m in messages if "caf\\xe9.py: file name is not UTF-8" in m]
        assert len(warned) == 1
        (project / "helpers.py").write_text("VALUE = 3\n")
        watcher.handle_change()
        assert branches(watcher) == ["run/0001", "run/0002"]
        assert len([m for m in messages if "not UTF-8" in m]) == 1  # said once
    finally:
        watcher.close()


def test_a_coding_declaration_does_not_block_later_branches(started):
    watcher, messages, project = started
    latin = "# -*- coding: latin-1 -*-\nimport torch\nname = 'caf\u00e9'\nopt = torch.optim.SGD([], lr=0.1)\nloss.backward()\nopt.step()\n"
    (project / "legacy.py").write_bytes(latin.encode("latin-1"))
    result = watcher.handle_change()
    assert result.created and not result.blocked, result.blocked
    entry = next(f for f in result.report.files if f.path == "legacy.py")
    assert entry.status == "rewritten" and entry.error is None
    committed = watcher.project.store.read_file(result.report.commit, "legacy.py")
    assert committed.startswith(b"# -*- coding: latin-1 -*-\n") and b"name = 'caf\xe9'\n" in committed
    (project / "helpers.py").write_text("VALUE = 4\n")
    assert watcher.handle_change().created


@pytest.mark.parametrize("polling", [False, True])
def test_a_save_made_while_the_watcher_takes_its_first_snapshot_makes_a_branch(project, polling):
    watcher, messages = make_watcher(project, polling=polling)
    real = watcher.project.commit_change
    saved = []

    def snapshot_then_a_save(*args, **kwargs):
        result = real(*args, **kwargs)
        if not saved:  # an editor's rename-save lands just after the initial snapshot was read
            tmp = project / ".helpers.py.swp~"
            tmp.write_text("X = 'saved during start'\n")
            os.replace(tmp, project / "helpers.py")
            saved.append(True)
        return result

    watcher.project.commit_change = snapshot_then_a_save
    watcher.start()
    try:
        assert saved and branches(watcher) == ["run/0001"]
        assert wait_for(lambda: len(branches(watcher)) == 2, watcher, timeout=15)
        info = watcher.project.store.resolve("run/0002")
        assert b"saved during start" in watcher.project.store.read_file(info.commit, "helpers.py")
    finally:
        watcher.close()


def test_code_nested_too_deeply_is_named_and_later_saves_make_branches(started):
    watcher, messages, project = started
    (project / "deep.py").write_text("x = " + "+".join(["1"] * 10000) + "\n")
    assert wait_for(lambda: any("deep.py" in m for m in messages), watcher)
    assert [m for m in messages if "deep.py" in m] == ["deep.py:1: nested too deeply for Python to compile (RecursionError); left unchanged"]
    assert branches(watcher) == ["run/0001"]  # like a syntax error: the run keeps the last branch
    os.remove(project / "deep.py")
    (project / "helpers.py").write_text("X = 3\n")
    assert wait_for(lambda: len(branches(watcher)) == 2, watcher)


def test_links_out_of_the_project_and_fifos_are_named_once(started, tmp_path):
    watcher, messages, project = started
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET = 1\n")
    (project / "passwd.py").symlink_to(secret)
    os.mkfifo(project / "pipe.py")
    (project / "helpers.py").write_text("X = 4\n")
    assert wait_for(lambda: len(branches(watcher)) == 2, watcher)
    (project / "helpers.py").write_text("X = 5\n")
    assert wait_for(lambda: len(branches(watcher)) == 3, watcher)
    warned = [m for m in messages if m.startswith("scalebox: warning:")]
    assert warned == [
        f"scalebox: warning: passwd.py: a symbolic link to {secret}, outside the project (never read); not snapshotted",
        "scalebox: warning: pipe.py: a FIFO, not a regular file; not snapshotted",
    ]
    info = watcher.project.store.resolve("run/0003")
    assert "passwd.py" not in watcher.project.store.tree_paths(info.commit)


@pytest.mark.parametrize("value, said", [("nan", "'nan' is not a finite number"), ("inf", "'inf' is not a finite number"),
                                         ("-1", "-1.0 is not in the range 0<=x<=300"), ("1e9", "1000000000.0 is not in the range 0<=x<=300")])
def test_a_debounce_that_is_not_a_sane_number_is_refused_when_parsed(project, value, said):
    from conftest import scalebox

    proc = scalebox("watch", str(project), "--debounce", value, check=False, timeout=30)
    assert proc.returncode == 2 and f"Invalid value for '--debounce': {said}" in proc.stderr
    assert not (project / ".scalebox").exists()  # refused before anything was made
    with pytest.raises(ValueError, match="debounce must be a number of seconds"):
        make_watcher(project, debounce=float(value))


def test_a_stop_while_a_batch_is_gathered_is_prompt_and_commits_nothing(started):
    """SIGTERM sets stop(): with a 20 s debounce the watcher must not wait out the batch, nor
    commit it (or start a run) after the stop was asked for."""
    import threading

    watcher, messages, project = started
    watcher.debounce = 20.0
    (project / "train.py").write_text((project / "train.py").read_text() + "# edited\n")
    threading.Timer(0.5, watcher.stop).start()
    began = time.monotonic()
    assert watcher.process_pending(timeout=5.0) is None
    assert time.monotonic() - began < 2.0
    assert branches(watcher) == ["run/0001"]


def test_a_config_edit_is_used_by_the_next_branch_and_a_bad_one_is_one_line(started):
    """Found by a fault campaign: the watcher kept the config it started with, silently, whatever
    the file said later (also a config ``scalebox status`` refused)."""
    watcher, messages, project = started
    first = watcher.project.store.resolve("run/0001")
    config = project / "scalebox.toml"
    text = config.read_text()
    assert "disabled = []" in text and 'backend = "auto"' in text  # scalebox init's file
    config.write_text(text.replace("disabled = []", 'disabled = ["grad_clip"]'))
    assert wait_for(lambda: len(branches(watcher)) == 2, watcher)  # the config edit alone makes one
    assert any("scalebox.toml changed: the next branches use it" in m for m in messages), messages
    second = watcher.project.store.resolve("run/0002")
    assert second.fingerprint != first.fingerprint
    assert b"_scalebox_stabilize" in watcher.project.store.read_file(first.commit, "train.py")
    assert b"_scalebox_stabilize" not in watcher.project.store.read_file(second.commit, "train.py")
    for bad, said in ((text.replace('backend = "auto"', 'backend = "tpu"'), "backend"),
                      (text.replace("disabled = []", "disabled = 7"), "disabled"), (text + "[oops\n", "scalebox.toml")):
        messages.clear()
        config.write_text(bad)
        assert wait_for(lambda: any("the config loaded before stays in use" in m for m in messages), watcher), messages
        line = next(m for m in messages if "stays in use" in m)
        assert said in line and "\n" not in line
    (project / "train.py").write_text((project / "train.py").read_text() + "# after\n")
    assert wait_for(lambda: len(branches(watcher)) == 3, watcher)  # still committing, on the last good config
    third = watcher.project.store.resolve("run/0003")
    assert third.fingerprint == second.fingerprint


def test_a_config_replaced_by_a_fifo_is_one_line_and_the_watcher_goes_on(started):
    """Found by the fifth fault campaign: the watcher opened its config files to see whether they
    changed; one replaced by a FIFO blocked that open, and with it every later save, for good."""
    watcher, messages, project = started
    config = project / "scalebox.toml"
    text = config.read_text()
    os.remove(config)
    os.mkfifo(config)
    assert wait_for(lambda: any("stays in use" in m for m in messages), watcher), messages
    line = next(m for m in messages if "stays in use" in m)
    assert "scalebox.toml: a FIFO, not a regular file; not read" in line and "\n" not in line
    (project / "train.py").write_text((project / "train.py").read_text() + "# after\n")
    assert wait_for(lambda: len(branches(watcher)) == 2, watcher)  # still committing
    os.remove(config)
    config.write_text(text)


def test_a_run_that_ends_by_itself_ends_with_the_line_scalebox_run_prints(project):
    """The newcomer's walkthrough (Lizhi-sjtu PPO-discrete under scalebox-watch) read
    "scalebox: run/0002 ok after 8.6s": the branch, not the run, and none of the return, steps/s
    and guards that `scalebox run` (and the README's "each run ends with one line") give."""
    from scalebox_cst import headlines

    (project / "quick.py").write_text("print('done', flush=True)\n")
    watcher, messages = make_watcher(project, script="quick.py")
    watcher.start()
    try:
        execution = watcher.execution
        assert wait_for(lambda: any(" ok " in m for m in messages), watcher, timeout=60), messages
    finally:
        watcher.close()
    record = execution.record
    ended = [m for m in messages if " ok " in m]
    assert ended == [f"scalebox: {headlines.end_line(record)}"], messages
    assert ended[0].startswith(f"scalebox: {record.id} ok in "), ended


def test_each_save_a_lasting_error_blocks_gets_one_short_line(started):
    """A file with a syntax error (or nested too deeply) blocks branches until it is fixed. Its
    error was said once; every later save of another file was then silent, no branch and no
    word (the fault campaign's third list). Each now gets one short line naming what blocks."""
    watcher, messages, project = started
    (project / "broken.py").write_text("def f(:\n")
    watcher.handle_change()
    assert len([m for m in messages if "broken.py:1" in m and "SyntaxError" in m]) == 1, messages
    before = len(messages)
    for value in (4, 5):
        (project / "helpers.py").write_text(f"VALUE = {value}\n")
        result = watcher.handle_change()
        assert not result.created
    said = messages[before:]
    assert said == ["scalebox: no branch for this save: broken.py still has an error (said above)"] * 2, said
    (project / "broken.py").write_text("def f():\n    pass\n")
    assert watcher.handle_change().created
