"""The child's output under ``scalebox run`` (runtime.output): stdout and stderr stay apart on the
terminal and on disk, carriage returns pass through, and metrics are read from logical lines of
each stream (a progress bar's ``\\r``-ended redraw is a line of its own)."""
import io
import os
import subprocess
import sys
import textwrap

from hypothesis import given, settings
from hypothesis import strategies as st

from scalebox_cst import runs
from scalebox_cst.runtime.output import Console, LineSplitter, Recorder

from conftest import scalebox


def test_logical_lines_end_at_newline_crlf_and_a_lone_cr_across_chunks():
    split = LineSplitter()
    got = split.feed(b"a=1\r\n  5%|#| 1/2 [224it/s]\rppo step=200 reward=-1455.43\nhalf")
    assert got == [("a=1", False), ("  5%|#| 1/2 [224it/s]", True), ("ppo step=200 reward=-1455.43", False)]
    assert split.feed(b" line\r") == []  # a last "\r" may be the first half of "\r\n"
    assert split.feed(b"\nbar 1\rbar 2\r") == [("half line", False), ("bar 1", True)]
    assert split.feed(b"x") == [("bar 2", True)]
    assert split.close() == ("x", False) and split.close() is None


def _lines_at_once(data: bytes):
    """The logical lines of the whole stream (the reference: one split, no chunks)."""
    out, start, i = [], 0, 0
    while i < len(data):
        if data[i:i + 2] == b"\r\n":
            out.append((data[start:i].decode("utf-8", "replace"), False))
            i += 2
            start = i
        elif data[i:i + 1] in (b"\n", b"\r"):
            out.append((data[start:i].decode("utf-8", "replace"), data[i:i + 1] == b"\r"))
            i += 1
            start = i
        else:
            i += 1
    if start < len(data):
        out.append((data[start:].decode("utf-8", "replace"), False))
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"bc", b"\n", b"\r", b"\r\n", b"\xc3\xa9", b"xyz"]), max_size=40),
       st.lists(st.integers(1, 7), min_size=1, max_size=40))
def test_any_chunking_gives_the_lines_of_the_whole_stream(parts, cuts):
    data = b"".join(parts)
    splitter, got, i = LineSplitter(), [], 0
    for k in cuts * (len(data) + 1):
        if i >= len(data):
            break
        got += splitter.feed(data[i:i + k])
        i += k
    rest = splitter.close()
    got += [rest] if rest is not None else []
    assert [(t, cr) for t, cr in got] == _lines_at_once(data)


def test_a_line_without_end_is_handed_on_in_bounded_pieces():
    """Found by a fault campaign: 60 MiB written without a newline took 36 s under `scalebox run`
    (the partial line was joined to and searched with every chunk). The partial line stays under
    MAX_LINE bytes, the pieces hold every byte, the line's end comes last."""
    splitter, chunk, pieces = LineSplitter(), b"x" * 65536, []
    for _ in range(int(3.5 * LineSplitter.MAX_LINE) // 65536):
        pieces += splitter.feed(chunk)
        assert len(splitter._partial) < LineSplitter.MAX_LINE
    pieces += splitter.feed(b"end\nnext")
    assert [len(t) for t, _ in pieces[:3]] == [LineSplitter.MAX_LINE] * 3
    assert "".join(t for t, _ in pieces) == "x" * (int(3.5 * LineSplitter.MAX_LINE) // 65536 * 65536) + "end"
    assert splitter.close() == ("next", False)


def test_a_line_split_inside_a_multibyte_character_decodes_whole():
    split = LineSplitter()
    data = "loss=0.5 µ=2\n".encode()
    cut = data.index("µ".encode()) + 1
    assert split.feed(data[:cut]) == [] and split.feed(data[cut:]) == [("loss=0.5 µ=2", False)]


def test_console_prefixes_every_line_a_carriage_return_starts():
    out = io.StringIO()
    console = Console(out, "[r#1] ")
    console.write(b"a\r")
    console.write(b"b\nc")
    console.write(b"d\n")
    assert out.getvalue() == "[r#1] a\r[r#1] b\n[r#1] cd\n"


def test_recorder_stops_at_the_first_failed_write_and_says_so_once(tmp_path):
    notes = []
    recorder = Recorder(str(tmp_path), "run/0001#1", notes.append)
    recorder.open("log.txt")
    recorder.write("log.txt", b"kept\n")
    os.close(recorder._fds["log.txt"])  # the next write fails (EBADF), as a full disk's would
    recorder.write("log.txt", b"lost\n")
    recorder.append(str(tmp_path / "metrics.jsonl"), b"{}\n")
    recorder.write("log.txt", b"lost\n")
    assert (tmp_path / "log.txt").read_bytes() == b"kept\n" and not (tmp_path / "metrics.jsonl").exists()
    assert len(notes) == 1 and "recording stopped (log.txt: [Errno 9]" in notes[0] and "the run goes on" in notes[0]
    assert not recorder.ok


PROGRESS = textwrap.dedent(
    """\
    import sys, time
    for i in range(3):
        sys.stderr.write(f"\\r  {i}%|bar| {i}/3 [224it/s]")
        sys.stderr.flush()
        time.sleep(0.05)
        print(f"ppo step={i} reward=-{i}.5", flush=True)
        print(f"step={i} reward=-{i}.5", flush=True)
        time.sleep(0.05)
    sys.stderr.write("\\n")
    print("last", end="")
    """
)


def _project(tmp_path):
    root = tmp_path / "out"
    root.mkdir()
    (root / "progress.py").write_text(PROGRESS)
    (root / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n')
    scalebox("rewrite", str(root))
    return root


def test_scalebox_run_keeps_stdout_and_stderr_apart_and_passes_carriage_returns(tmp_path):
    root = _project(tmp_path)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", "from scalebox_cst.cli import main; main()", "run", "run/0001", "progress.py"],
                          cwd=root, capture_output=True, env=env, timeout=120)  # bytes: "\r" as written
    assert proc.returncode == 0, proc.stderr
    expected_out = "".join(f"ppo step={i} reward=-{i}.5\nstep={i} reward=-{i}.5\n" for i in range(3)) + "last"
    assert proc.stdout == expected_out.encode()  # the script's stdout alone: grep-able
    bars = ("".join(f"\r  {i}%|bar| {i}/3 [224it/s]" for i in range(3)) + "\n").encode()
    assert bars in proc.stderr  # the bar's redraws as written, not one line each
    run_dir = runs.run_dir(str(root), "run/0001", 1)
    assert open(os.path.join(run_dir, runs.LOG), "rb").read() == expected_out.encode()
    assert open(os.path.join(run_dir, runs.STDERR), "rb").read() == bars
    reward = runs.read_series(run_dir)["reward"]
    assert sorted({(p.step, p.value) for p in reward}) == [(0, -0.5), (1, -1.5), (2, -2.5)]


def test_the_metric_parser_sees_each_streams_logical_lines_alone(tmp_path):
    from scalebox_cst.project import Project
    from scalebox_cst.runner import execution as executor

    root = _project(tmp_path)
    project = Project(str(root))
    info = project.store.resolve("run/0001")
    seen = []

    class Spy(executor.Execution):
        def _line_metrics(self, line):
            seen.append(line)
            super()._line_metrics(line)

    out, err = io.StringIO(), io.StringIO()
    record = Spy(project.store.path, project.root, project.runs_dir, info.name, info.commit, "progress.py", [],
                 echo=out, echo_err=err, notice=lambda _: None, tensorboard=False).wait(timeout=120)
    assert record.status == "ok"
    results = [line for line in seen if "reward" in line]
    assert results == [f"{p}step={i} reward=-{i}.5" for i in range(3) for p in ("ppo ", "")]  # never glued to a bar
    assert [line for line in seen if "bar" in line] == [f"  {i}%|bar| {i}/3 [224it/s]" for i in range(3)]
    assert "last" in seen  # a last line without its end, at the stream's end
    assert "\r" in err.getvalue() and "bar" not in out.getvalue()


def test_the_error_tail_is_the_traceback_from_stderr_whatever_stdout_lines_arrived_after_it():
    """stdout and stderr have a reader each: stdout lines printed before a traceback can reach
    the tail after it, and must not end the record's error tail."""
    from scalebox_cst.runner.record import error_tail

    trace = ["Traceback (most recent call last):", '  File "t.py", line 3, in <module>', "RuntimeError: boom"]
    arrived = ["step=0 loss=1", *trace, "step=1 loss=2"]
    assert error_tail(arrived, errors=trace) == trace
    assert error_tail(arrived, errors=["a warning"]) == trace + ["step=1 loss=2"]  # none on stderr: as arrived
    assert error_tail(["a", "b"], errors=[]) == ["a", "b"]


def test_the_processes_of_a_run_include_those_started_from_a_folder_inside_it(tmp_path):
    """A torchrun rank other than 0 runs with SCALEBOX_RUN_DIR=<run>/ranks/<k>, and so do the
    processes it starts: they are the run's (kill -9 of `scalebox run --nproc 2` left one);
    a sibling run whose folder only starts with the same characters is not."""
    import subprocess
    import sys

    from scalebox_cst.runtime import lifeline

    run_dir = str(tmp_path / "0001")
    started = []
    try:
        for where in (run_dir, os.path.join(run_dir, "ranks", "1"), run_dir + "0"):
            env = dict(os.environ, **{lifeline.ENV_RUN_DIR: where})
            started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env))
        found = lifeline.run_processes(run_dir)
        assert sorted(found) == sorted(p.pid for p in started[:2])
    finally:
        for p in started:
            p.kill()
            p.wait()


def test_the_parent_watch_never_hangs_a_run_whose_thread_cannot_start(tmp_path):
    """``threading.Thread.start`` waits without limit for the new thread to say it runs; under
    ``scalebox run --memory 16m`` the parent-watch thread could be made and die of MemoryError
    before saying so, and the run hung for ever (a test-order shuffle met it in test_limits).
    A thread that never runs is simulated: ``hold`` returns, and keeps the death signal set (the
    kernel still ends the child with its parent); a thread that runs clears it."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""\
        import _thread, os, sys, threading, time
        from scalebox_cst.runtime import lifeline
        lifeline.START_WAIT = 1.0
        calls = []
        lifeline._set_death_signal = lambda sig: calls.append(sig) or True
        if sys.argv[1] == "dead":  # made, never runs (as a thread whose first allocation fails)
            _thread.start_new_thread = threading._start_new_thread = lambda fn, args, kwargs=None: 1
        os.environ[lifeline.ENV_PARENT] = str(os.getppid())
        started = time.monotonic()
        print(lifeline.hold(grace=0.1), calls, round(time.monotonic() - started) < 4)
        """)
    for case, expected in (("dead", "True [] True"), ("alive", "True [0] True")):
        proc = subprocess.run([sys.executable, "-c", code, case], capture_output=True, text=True, timeout=30)
        assert proc.stdout.strip() == expected, (case, proc.stdout, proc.stderr[-500:])
