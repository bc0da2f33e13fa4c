"""TEST-ONLY: the ``torch.npu`` namespace of the stand-in (twins of the torch.cuda functions)."""
from __future__ import annotations

import contextlib
import os
import time

import torch

from . import amp  # noqa: F401

_current = 0
# the "NPU" generator: separate from the CPU one, as CUDA's generators are
_generator = torch.Generator()
_generator.manual_seed(0)


def is_available():
    return os.environ.get("FAKE_TORCH_NPU_AVAILABLE", "1") != "0"


def device_count():
    return 1 if is_available() else 0


def is_initialized():
    return is_available()


def _check_index(index):
    if index is not None and not 0 <= int(index) < max(device_count(), 1):
        raise RuntimeError(f"npu:{index}: invalid device ordinal (the stand-in has {device_count()} npu)")


def _index(device):
    if device is None:
        return _current
    if isinstance(device, int):
        return device
    d = torch.device(device)
    return d.index if d.index is not None else _current


def set_device(device):
    global _current
    index = _index(device)
    _check_index(index)
    _current = index


def current_device():
    return _current


class device:
    """``with torch.npu.device(i):`` selects npu i inside the block (like torch.cuda.device)."""

    def __init__(self, device):
        self.index = _index(device) if device is not None and not (isinstance(device, int) and device < 0) else None
        self._previous = None

    def __enter__(self):
        global _current
        self._previous = _current
        if self.index is not None:
            _check_index(self.index)
            _current = self.index
        return self

    def __exit__(self, *exc):
        global _current
        _current = self._previous
        return False


def synchronize(device=None):
    _check_index(_index(device))


def manual_seed(seed):
    _generator.manual_seed(int(seed))


def manual_seed_all(seed):
    _generator.manual_seed(int(seed))


def seed():
    _generator.seed()


def initial_seed():
    return _generator.initial_seed()


def get_rng_state(device="npu"):
    return _generator.get_state()


def set_rng_state(new_state, device="npu"):
    _generator.set_state(new_state)


def _is_in_bad_fork():
    return False


def memory_allocated(device=None):
    return 0


def max_memory_allocated(device=None):
    return 0


def memory_reserved(device=None):
    return 0


def max_memory_reserved(device=None):
    return 0


def reset_peak_memory_stats(device=None):
    return None


def empty_cache():
    return None


def get_device_name(device=None):
    return "Ascend stand-in (CPU)"


def is_bf16_supported():
    return True


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]


class Event:
    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.enable_timing = enable_timing
        self._time = None

    def record(self, stream=None):
        self._time = time.perf_counter()

    def wait(self, stream=None):
        return None

    def query(self):
        return True

    def synchronize(self):
        return None

    def elapsed_time(self, end_event):
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Events were not created with enable_timing=True")
        if self._time is None or end_event._time is None:
            raise RuntimeError("both events must be recorded before elapsed_time")
        return (end_event._time - self._time) * 1000.0


class Stream:
    def __init__(self, device=None, priority=0):
        self.device = torch.device("npu", _index(device))
        self.priority = priority

    def synchronize(self):
        return None

    def query(self):
        return True

    def wait_stream(self, stream):
        return None

    def wait_event(self, event):
        return None

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event


_default_stream = Stream()


def current_stream(device=None):
    return _default_stream


def default_stream(device=None):
    return _default_stream


@contextlib.contextmanager
def stream(s):
    yield s
