"""Atomic renames that ``os.replace`` cannot do: swap two files (``RENAME_EXCHANGE``) and rename
without replacing (``RENAME_NOREPLACE``), through Linux ``renameat2`` (glibc 2.28+, via ctypes).

Why: a rollback that compares a file with its snapshot and then renames its new file over it
destroys a save landing between the two. Swapping instead puts the new file in place and the old
one aside in one step, so the file compared afterwards is exactly the one replaced (no save can
land in between); a file the rollback creates is renamed in only if none appeared meanwhile.
Each function returns False where the primitive is unavailable (another OS, an old libc or
kernel, a filesystem without the flag): the caller then falls back to ``os.replace``.
"""
from __future__ import annotations

import ctypes
import errno
import os
from typing import Callable, Optional

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
#: errors meaning "this system or filesystem cannot do it", not "it failed"
_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, getattr(errno, "EOPNOTSUPP", errno.ENOTSUP)}


def _load() -> Optional[Callable[..., int]]:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError, TypeError):  # no libc (Windows), no renameat2 (macOS, old glibc)
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_renameat2 = _load()


def _call(src: str, dst: str, flags: int) -> bool:
    if _renameat2 is None:
        return False
    if _renameat2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), dst)


def exchange(a: str, b: str) -> bool:
    """Swap files ``a`` and ``b`` atomically (both must exist); False when unsupported here."""
    return _call(a, b, RENAME_EXCHANGE)


def noreplace(src: str, dst: str) -> bool:
    """Rename ``src`` to ``dst`` unless ``dst`` exists (then ``FileExistsError``); False when
    unsupported here."""
    return _call(src, dst, RENAME_NOREPLACE)
