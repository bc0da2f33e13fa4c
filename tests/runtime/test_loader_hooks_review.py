"""Attacks on the hooks runtime.loader installs in the user's process (review of the excepthook,
threading.excepthook and unraisablehook changes)."""
import time
import types

from scalebox_cst.runtime import loader

from conftest import sigint_as_from_a_terminal


def _deep_traceback(depth):
    try:
        raise RecursionError("maximum recursion depth exceeded")
    except RecursionError as caught:
        exc = caught
        tb = exc.__traceback__
    for _ in range(depth):  # one frame repeated, as a RecursionError's traceback is
        tb = types.TracebackType(tb, tb.tb_frame, tb.tb_lasti, tb.tb_lineno)
    return exc, tb


def test_format_exception_of_a_very_deep_traceback_takes_linear_time():
    """A RecursionError under a raised recursion limit (sys.setrecursionlimit(100_000)) has as
    many frames: each frame's mark was looked up by a scan of the whole stack, and the excepthook
    (main thread, threads, unraisable) took minutes to print it (30,000 frames: ~16 s)."""
    exc, tb = _deep_traceback(30_000)
    start = time.perf_counter()
    text = loader.format_exception(RecursionError, exc, tb)
    took = time.perf_counter() - start
    assert "Previous line repeated" in text and "RecursionError" in text
    assert took < 5.0, took


def test_ctrl_c_under_python_m_scalebox_cst_ends_the_process_by_sigint(tmp_path):
    """Python ends on an unhandled Ctrl-C by SIGINT (status 130 in a shell: a shell loop of runs
    stops there). Under ``python -m scalebox_cst`` the process ended with status 1: what the
    excepthook runs from a string on its first use (exec/eval of a namedtuple or dataclass a
    module it imports makes) clears CPython's note of the interrupt. A program that calls the
    hook itself and goes on ends as it ends."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import ROOT

    (tmp_path / "scalebox.toml").write_text("")
    (tmp_path / "hang.py").write_text("import time\nprint('ready', flush=True)\nwhile True:\n    time.sleep(0.05)\n")
    (tmp_path / "shown.py").write_text(
        "import sys\nfrom scalebox_cst.runtime.loader import install_excepthook\ninstall_excepthook()\n"
        "try:\n    raise KeyboardInterrupt\nexcept KeyboardInterrupt as exc:\n"
        "    sys.excepthook(type(exc), exc, exc.__traceback__)\nprint('went on')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALEBOX_")}
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "scalebox_cst", "hang.py"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_from_a_terminal)
    try:
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.3)  # (in the loop by then)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGINT, (proc.returncode, err)
    assert "time.sleep(0.05)" in err and err.rstrip().endswith("KeyboardInterrupt")
    shown = subprocess.run([sys.executable, "shown.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and shown.stdout == "went on\n" and "KeyboardInterrupt" in shown.stderr
