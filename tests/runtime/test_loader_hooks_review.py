"""Attacks on the hooks runtime.loader installs in the user's process (review of the excepthook,
threading.excepthook and unraisablehook changes)."""
import time
import types

from scalebox_cst.runtime import loader


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
