"""The option schema: every ``[section] key`` the engine reads, with its kind and default, once.

Why one table: the guard's ``z = 10.0`` was written in three places (the config template, the
grad_clip transform and the runtime stabilizer) and options were checked in three (the config
loader, the grad_clip transform and the hot-fix policy), each with its own messages. Now the
loader (:mod:`scalebox_cst.config`), the transforms (through ``ctx.option``), the hot-fix policy,
the ``scalebox.toml`` template and the runtime read defaults from here, and :func:`option_error` is
the one check. Pure data, no imports beyond the standard library: the runtime (inside the user's
process) imports it too, and a config is checked without importing libcst.

A kind is ``"bool"``, ``"positive"`` (a finite number > 0), ``"nonnegative"``,
``"positive_int"``, ``"table"``, ``"size"`` (``4g``, ``300m``: scalebox_cst.limits reads it) or a
tuple of allowed strings.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
import reprlib
from typing import Any, Dict, Iterable, Optional


@dataclasses.dataclass(frozen=True)
class Option:
    kind: Any
    default: Any


_HOTFIX_DEFAULTS = {
    "max_per_source": 2,
    "max_interventions": 3,
    "window": 200,
    "max_nonfinite_loss": 2,
    "divergence": 1000.0,
    "healthy_points": 10,  # grad-norm points needed before divergence is judged
}

#: section -> key -> :class:`Option`. tests/scalebox_cst/test_config.py checks that every option a transform
#: (or the hot-fix policy) reads is listed.
OPTIONS: Dict[str, Dict[str, Option]] = {
    "grad_clip": {
        "max_norm": Option("positive", 1.0),
        "mode": Option(("guard", "fixed"), "guard"),
        "skip_nonfinite": Option("bool", False),
        # the guard's spike test: max(mean + z*std, ratio*mean) after `warmup` steps
        "z": Option("positive", 10.0),
        "ratio": Option("positive", 100.0),  # healthy CartPole PPO reaches 19x its EW mean (z 22) in 20k steps
        "warmup": Option("positive_int", 25),
        # what the guard does with a spike: report it (an event the hot-fix policy counts; the
        # step runs as written, so a healthy run stays bitwise the original) or clip it
        "spikes": Option(("report", "clip"), "report"),
    },
    "vectorize.recurrence": {"reassociate": Option("bool", True)},
    "accelerate": {"level": Option(("exact", "reassociated"), "exact")},  # reassociated: --fast (accelerate.compile, accelerate.defer_sync, accelerate.fused_optim, accelerate.fast_categorical, accelerate.threads)
    "vectorize.target_update": {"allow_lerp": Option("bool", False)},
    "device": {
        "allow_precision_change": Option("bool", False),
        "allow_tf32": Option("bool", False),
        "fast_gelu": Option("bool", False),
        "npu_fused_optimizer": Option("bool", False),
    },
    # precision.autocast (off unless named or `mode` is set); `calibration` is written by the engine
    # from the newest `scalebox run --calibrate-precision` (scalebox_cst.calibration)
    "precision": {
        "mode": Option(("bf16", "fp16"), None),
        "calibrate_steps": Option("positive_int", 20),
        "calibration": Option("table", None),
    },
    # read by scalebox_cst.limits for every run (scalebox run, watch, hot-fixes, explore trials)
    "run": {
        "memory": Option("size", None),
        "cpus": Option("positive", None),
        "device_memory": Option("size", None),
        "priority": Option(("low", "normal", "high"), "normal"),
        "network": Option("bool", True),
    },
    # read by scalebox_cst.hotfix (the policy that makes hot-fix branches), not by a transform
    "hotfix": {key: Option("nonnegative", value) for key, value in _HOTFIX_DEFAULTS.items()},
}


def default(section: str, key: str) -> Any:
    """The default of ``[section] key`` (KeyError for an option the schema does not list)."""
    return OPTIONS[section][key].default


def defaults(section: str) -> Dict[str, Any]:
    """``{key: default}`` of one section."""
    return {key: opt.default for key, opt in OPTIONS[section].items()}


def _nearest(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, else ''."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def shown(value: Any) -> str:
    """``repr(value)`` for a message: one line, nested and long values cut short (``reprlib``)."""
    r = reprlib.Repr()
    r.maxstring = r.maxother = 60
    return " ".join(r.repr(value).split())


UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.I)


#: the largest size taken (64 PiB): a 64-bit machine's whole user address space (2**56 bytes with
#: 5-level paging). Larger ones overflowed setrlimit in the run's child (a traceback) or a float.
MAX_SIZE = 1 << 56
_BAD_SIZE = "expected a number with k, m, g or t, e.g. 4g or 300m"


#: seeds are what numpy's ``seed`` takes: 0 <= seed < 2**32 (a larger one failed in the child)
SEED_LIMIT = 1 << 32


def seed_ok(value: Any) -> bool:
    """Whether ``value`` is a seed every library the launcher seeds takes."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < SEED_LIMIT


def size_problem(value: Any) -> Optional[str]:
    """Why ``value`` is no size this engine takes (one line, without the option's name), or None."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        match = _SIZE.match(value) if isinstance(value, str) else None
        if not match:
            return _BAD_SIZE
        number = float(match.group(1))  # digits only: inf for a very long one, never nan
        if not math.isfinite(number) or number * UNITS[match.group(2).lower()] > MAX_SIZE:
            return f"larger than any machine's address space (at most {MAX_SIZE >> 40}t)"
        n = int(number * UNITS[match.group(2).lower()])
    if n < 1:
        return f"{_BAD_SIZE}, of at least one byte"
    if n > MAX_SIZE:
        return f"larger than any machine's address space (at most {MAX_SIZE >> 40}t)"
    return None


def size_bytes(value: Any) -> Optional[int]:
    """Bytes of ``4g``, ``300m``, ``512k``, ``1.5G``, ``2GiB`` or a whole number of bytes; None
    when ``value`` is no size (:func:`size_problem` says why; the one reading of a size: the
    check here and scalebox_cst.limits)."""
    if size_problem(value) is not None:
        return None
    if isinstance(value, int):
        return value
    match = _SIZE.match(value)
    assert match is not None
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


def option_error(section: str, key: str, value: Any) -> Optional[str]:
    """What is wrong with ``[section] key = value`` (one line, without the file), or None."""
    if section not in OPTIONS:
        return f"unknown option table [{section}]{_nearest(section, OPTIONS)}; known: {', '.join(sorted(OPTIONS))}"
    kinds = OPTIONS[section]
    if key not in kinds:
        return f"unknown option {section}.{key}{_nearest(key, kinds)}; known: {', '.join(sorted(kinds))}"
    kind = kinds[key].kind
    # ints are finite however large (math.isfinite(10**400) raises OverflowError)
    number = isinstance(value, int) or isinstance(value, float) and math.isfinite(value)
    number = number and not isinstance(value, bool)
    got = shown(value)
    if kind == "bool" and not isinstance(value, bool):
        return f"{section}.{key} must be true or false, got {got}"
    if kind == "positive" and not (number and value > 0):
        return f"{section}.{key} must be a positive number, got {got}"
    if kind == "nonnegative" and not (number and value >= 0):
        return f"{section}.{key} must be a non-negative number, got {got}"
    if kind == "positive_int" and not (number and isinstance(value, int) and value >= 1):
        return f"{section}.{key} must be a positive integer, got {got}"
    if kind == "table" and not isinstance(value, dict):
        return f"{section}.{key} must be a table, got {got}"
    problem = size_problem(value) if kind == "size" else None
    if problem and problem.startswith("larger"):
        return f"{section}.{key} = {got} is {problem}"
    if problem:
        return f"{section}.{key} must be a size such as 4g or 300m, got {got}"
    if isinstance(kind, tuple) and not (isinstance(value, str) and value in kind):
        return f"{section}.{key} must be one of {', '.join(kind)}, got {got}"
    return None


def checked(section: str, key: str, value: Any) -> Any:
    """``value`` when valid, else ValueError with :func:`option_error`'s line."""
    problem = option_error(section, key, value)
    if problem:
        raise ValueError(problem)
    return value
