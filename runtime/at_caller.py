"""Calls made from the caller's line, so that what they warn is where the user's code warned.

A runtime helper that falls back to the code as written (``tensor_from_arrays`` calling
``torch.tensor(data)`` for a list it does not take) becomes the innermost Python frame of that
call. A warning raised from C (torch's ``TORCH_WARN``: "Creating a tensor from a list of
numpy.ndarrays is extremely slow") or with ``stacklevel=1`` is then reported at the helper's
file and line, and counted in the helper module's ``__warningregistry__``: the user's
``ppo.py:53: UserWarning`` became ``runtime/hot_tensors.py:88: UserWarning``, and every site
sharing the helper shared one "default"-filter slot.

:func:`call_at_caller` runs the call from a one-line function whose code object carries the
caller's file name, line number and function name and whose globals are the caller's: the
warning machinery (``PyErr_WarnEx`` from C, ``warnings.warn`` from Python) reads exactly those
(the filename, ``f_lineno``, ``__name__`` for the module field and the registry), so the message,
its location, the quoted source line and the once-per-location bookkeeping are the original's.
A traceback through it shows the caller's line twice (the helper's frame between them), which is
all that differs. The functions are cached per (code object, line): a few per call site.
"""
from __future__ import annotations

import sys
import types
from typing import Any, Callable, Dict, Tuple

_TEMPLATE = next(c for c in compile("def _at(fn, args, kwargs): return fn(*args, **kwargs)\n", "<at_caller>", "exec").co_consts
                 if isinstance(c, types.CodeType))
_cache: Dict[Tuple[types.CodeType, int], Callable[..., Any]] = {}


def call_at_caller(fn: Callable[..., Any], args: tuple, kwargs: Dict[str, Any], depth: int = 1) -> Any:
    """``fn(*args, **kwargs)`` from a frame at the line ``depth`` frames above the one calling this
    (1: the caller of the function that calls this)."""
    frame = sys._getframe(depth + 1)
    code, line = frame.f_code, frame.f_lineno
    at = _cache.get((code, line))
    if at is None:
        moved = _TEMPLATE.replace(co_filename=code.co_filename, co_firstlineno=line if line > 0 else 1,
                                  co_name=code.co_name)
        at = _cache[(code, line)] = types.FunctionType(moved, frame.f_globals)
    return at(fn, args, kwargs)
