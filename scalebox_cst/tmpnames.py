"""Names of temporary files written beside their destination, that always fit the file system.

Every whole-or-nothing write in scalebox (rollback and undo, config, run records, the import
hook's cache, the store's small files, mirrored run files) writes a temporary sibling and renames
it over the destination. The sibling's name is the destination's name plus a writer id and a
tag, so a destination name near the file-system limit (NAME_MAX: 255 *bytes* of the encoded
name on Linux and macOS, not characters) made every such write fail with "File name too long":
one long file name made every rollback and undo of the project impossible.

Here a name that leaves too little room keeps a prefix of itself (cut on bytes, at a character
boundary when the name is UTF-8; a name that is not UTF-8 keeps its bytes through
``os.fsdecode``'s surrogate escapes) and a hash of the whole name, so two long names in one
folder never share a temporary name, and the stem of a name's temporaries does not depend on the
writer id (a cleaner can find the orphans of a killed writer by :func:`stem`).
"""
from __future__ import annotations

import hashlib
import os

#: the longest file name (in bytes) that every file system we write to takes
NAME_MAX = 255
#: bytes kept free after a stem for the writer id and tag (``.<pid>-<thread id>.scalebox-tmp``)
RESERVE = 48
_HASH = 16  # hex digits of the whole name's hash in a shortened stem


def stem(name: str, lead: str = "") -> str:
    """``lead + name``, shortened to ``NAME_MAX - RESERVE`` bytes (prefix ``~`` hash) when longer."""
    return fit(lead + name, NAME_MAX - RESERVE)


def fit(name: str, limit: int = NAME_MAX, keep: str = "") -> str:
    """``name + keep`` when it is at most ``limit`` bytes, else a prefix of ``name``, ``~``, a
    hash of ``name``, then ``keep`` (which is kept whole), together ``limit`` bytes at most."""
    raw = os.fsencode(name)
    kept = len(os.fsencode(keep))
    if len(raw) + kept <= limit:
        return name + keep
    room = limit - kept - _HASH - 1
    if room < 1:
        raise ValueError(f"no room for a name in {limit} bytes beside {keep!r}")
    cut = raw[:room]
    try:
        prefix = cut.decode("utf-8")
    except UnicodeDecodeError as exc:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            prefix = os.fsdecode(cut)  # not UTF-8: keep the bytes as they are
        else:
            prefix = cut[: exc.start].decode("utf-8")  # cut in the middle of a character
    return prefix + "~" + hashlib.sha256(raw).hexdigest()[:_HASH] + keep


def sibling(path: str, writer: str, tag: str = ".tmp", hidden: bool = False) -> str:
    """The temporary file beside ``path`` for one writer (``writer``: pid, thread id): always a
    name that fits. ``hidden`` starts it with a dot (a file in the user's tree)."""
    folder, name = os.path.split(path)
    suffix = f".{writer}{tag}"
    if len(os.fsencode(suffix)) > RESERVE:
        raise ValueError(f"temporary-name suffix {suffix!r} is longer than {RESERVE} bytes")
    return os.path.join(folder, stem(name, "." if hidden else "") + suffix)


def writer_id(thread: bool = False) -> str:
    """The id that keeps two writers' temporaries apart: the pid (and the thread id)."""
    if not thread:
        return str(os.getpid())
    import threading

    return f"{os.getpid()}-{threading.get_ident()}"


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data`` to the descriptor ``fd`` (``os.write`` may write fewer: a signal,
    a pipe, a nearly full disk), unbuffered: nothing is left for a close to write later."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_replacing(path: str, data: bytes, tmp: str) -> None:
    """Write ``data`` to ``path`` whole or not at all, through the temporary ``tmp`` (a
    :func:`sibling` name), never through a link: whatever is at ``tmp`` goes first (a link
    planted at that name, which ``open(tmp, "w")`` followed and wrote through; a killed writer's
    leftover), the temporary is made afresh (``O_EXCL | O_NOFOLLOW``), and it is removed when
    the write or the rename fails (a full disk leaves no half file). ``os.replace`` then puts it
    in place of ``path``, replacing a link there itself, never its target."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o666)
    try:
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
