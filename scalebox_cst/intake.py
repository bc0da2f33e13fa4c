"""The one place a project's files are listed and read (snapshots, the watcher, the import hook).

Whatever is in a project folder, reading it must neither leak, hang nor exhaust memory:

- Only regular files are read, and at most :data:`MAX_FILE_BYTES` of them. A FIFO named
  ``x.py`` would block an ``open`` forever and a link to ``/dev/zero`` never ends, so every file
  is checked with ``lstat`` before it is opened (``O_NONBLOCK``, ``O_NOFOLLOW``) and with
  ``fstat`` after: a file swapped for something else in between is caught, not read.
- Symbolic links. A link to a file is read only when its target is a file the snapshot takes
  anyway (inside the project, included by the config): then the link's name holds the same
  bytes. A link to anything else (``passwd.py -> /etc/passwd``, a file the config leaves out, a
  missing file) is skipped with a note and never opened. Links to folders are not followed (as
  git does): a linked folder inside the project is snapshotted under its own name only.
- Folders are opened one component at a time with ``O_NOFOLLOW`` (``dir_fd``), so a folder
  replaced by a link while the tree is walked cannot lead the walk outside the project.

Every file left out says why in one line (:func:`scan`'s notes); the CLI and the watcher show them.
This module imports only the standard library: the import hook uses it on every import.
"""
from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

#: larger files are not read (a Python source this size is generated data, not code to rewrite)
MAX_FILE_BYTES = 10 * 1024 * 1024

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class NotRead(Exception):
    """A file that is not read, and why (one line, without the path). ``link``: it is a symbolic
    link (the caller may classify its target); ``gone``: it vanished (an editor's temp file)."""

    def __init__(self, reason: str, link: bool = False, gone: bool = False) -> None:
        super().__init__(reason)
        self.link = link
        self.gone = gone


class NotRegularFile(OSError):
    """:func:`open_regular` met something other than a regular file (a FIFO, a device, a folder)."""


def open_regular(path: str, mode: str = "rb", follow: bool = False, **kwargs):
    """``open(path, mode)`` for reading the engine's own state files (a run's record and
    series, the import cache), that raises :class:`NotRegularFile` (an ``OSError``) instead of
    blocking: a FIFO planted in ``.scalebox/`` would block a plain ``open`` for ever, and with
    it ``scalebox log``, ``status``, the monitor and every hooked import. One ``open`` and one
    ``fstat``. A link in the last component is not followed unless ``follow`` (also
    :class:`NotRegularFile`): a ``record.json`` planted as a link to a file outside the project
    (a ``.scalebox/`` that came with it) had that file's fields printed by ``scalebox log`` and
    served by the monitor."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else _NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise NotRegularFile(errno.ELOOP, "a symbolic link, not followed", path) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, f"{kind_name(st.st_mode)}, not a regular file", path)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, mode, **kwargs)


#: the most of one of the engine's JSON state files read (a run's record, sites, fallbacks,
#: precision): kilobytes are written; more is damage (a 300 MB record.json held every reader at
#: 650 MB, and the monitor parsed it again on every poll)
STATE_LIMIT = 16 << 20


def _json_int(text: str) -> Any:
    """An integer literal of a state file: a Python int where a float can hold it, else the
    float it is (``inf``). A run's files are written by the script too (and a ``.scalebox/`` may
    come with the project): ``"started": 1000...0`` (400 digits) made every ``math.isfinite`` and
    ``float()`` of it an OverflowError, and ``log``, ``compare``, ``profile`` and the monitor
    tracebacks; read as inf, it is the non-finite number every reader already passes over."""
    return int(text) if len(text) < 300 else float(text)


def loads_state(raw: Any) -> Any:
    """``json.loads`` for the engine's state files and a run's series (see :func:`_json_int`)."""
    return json.loads(raw, parse_int=_json_int)


def state_json(path: str) -> Any:
    """The parsed JSON of one of the engine's state files, or None where it is missing, no
    regular file (:func:`open_regular`), past :data:`STATE_LIMIT` bytes, not JSON or nested too
    deeply."""
    limit = STATE_LIMIT
    try:
        with open_regular(path, "rb") as fh:
            raw = fh.read(limit + 1)
        return loads_state(raw) if len(raw) <= limit else None
    except (OSError, ValueError, RecursionError):
        return None


def kind_name(mode: int) -> str:
    """What a file that is not a regular one is, for a one-line message ("a FIFO", "a folder")."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"


def _size(n: int) -> str:
    """A limit as a person sets it: whole MiB where it is one, else bytes."""
    return f"{n // (1024 * 1024)} MiB" if n and n % (1024 * 1024) == 0 else f"{n} bytes"


def read_regular(name: str, dir_fd: Optional[int] = None, limit: int = MAX_FILE_BYTES, follow: bool = False) -> bytes:
    """The bytes of the regular file ``name`` (relative to ``dir_fd`` if given), not following
    a link in its last component unless ``follow``; raises :class:`NotRead`. No open blocks (a
    FIFO) and no read goes past ``limit`` bytes (a file growing while it is read included)."""
    try:
        before = os.stat(name, dir_fd=dir_fd, follow_symlinks=follow)
    except FileNotFoundError:
        raise NotRead("vanished while being read", gone=True) from None
    except OSError as exc:
        raise NotRead(f"cannot be read ({exc.strerror})") from None
    if stat.S_ISLNK(before.st_mode):
        raise NotRead("a symbolic link", link=True)
    if not stat.S_ISREG(before.st_mode):
        raise NotRead(f"{kind_name(before.st_mode)}, not a regular file")
    if before.st_size > limit:
        raise NotRead(f"larger than {_size(limit)} ({before.st_size} bytes)")
    try:
        fd = os.open(name, _FILE_FLAGS & ~_NOFOLLOW if follow else _FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise NotRead("vanished while being read", gone=True) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a link since the lstat
            raise NotRead("a symbolic link", link=True) from None
        raise NotRead(f"cannot be read ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise NotRead("replaced while being read")
        chunks: List[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise NotRead(f"larger than {_size(limit)}")
        return b"".join(chunks)
    except OSError as exc:
        raise NotRead(f"cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)


def read_named(path: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a file the user names (a config, a script, ``--tuned-config``), read as
    :func:`read_regular` reads a project's files, following a link (the user named it): a FIFO,
    a device or a file over ``limit`` raises :class:`NotRead` instead of blocking or filling
    memory."""
    try:
        return read_regular(path, limit=limit, follow=True)
    except NotRead as exc:
        if exc.gone:
            missing = "a link to a missing file" if os.path.islink(path) else "no such file"
            raise NotRead(missing, gone=True) from None
        raise


def _open_root(root: str) -> int:
    try:
        return os.open(root, _DIR_FLAGS & ~_NOFOLLOW)
    except OSError as exc:
        raise NotRead(f"the project folder cannot be read ({exc.strerror})") from None


def _open_dir(root_fd: int, parts: Sequence[str]) -> int:
    """A descriptor for the folder ``parts`` below ``root_fd``, no component a link (OSError)."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            fd, parent = os.open(part, _DIR_FLAGS, dir_fd=fd), fd
            os.close(parent)  # (held by ``fd`` no more: an interrupt here never closes it twice)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_at(root_fd: int, rel: str, limit: int) -> bytes:
    """``read_regular`` of ``rel`` below ``root_fd``, no folder on the way a link."""
    *folders, base = rel.split("/")
    try:
        dir_fd = _open_dir(root_fd, folders)
    except FileNotFoundError:
        raise NotRead("vanished while being read", gone=True) from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotRead("a folder on its path is a symbolic link or a file") from None
        raise NotRead(f"cannot be read ({exc.strerror})") from None
    try:
        return read_regular(base, dir_fd, limit)
    finally:
        os.close(dir_fd)


def snapshotted(config, rel: str) -> bool:
    """Whether ``rel`` (``/``-separated, inside the project) is a path the snapshot takes: no
    excluded folder on the way and included by the config."""
    parts = rel.split("/")
    if any(config.excludes_dir("/".join(parts[: i + 1])) for i in range(len(parts) - 1)):
        return False
    return config.includes(rel)


def _link_target(root: str, rel: str, config) -> str:
    """The project path the link at ``rel`` may be read through, else :class:`NotRead` (why not)."""
    try:
        target = os.path.realpath(os.path.join(root, *rel.split("/")), strict=True)
    except (OSError, RuntimeError):
        raise NotRead("a broken symbolic link") from None
    inside = os.path.relpath(target, root)
    if inside == os.pardir or inside.startswith(os.pardir + os.sep) or os.path.isabs(inside):
        raise NotRead(f"a symbolic link to {target}, outside the project (never read)")
    trel = inside.replace(os.sep, "/")
    if not snapshotted(config, trel):
        raise NotRead(f"a symbolic link to {trel}, which the config leaves out (never read)")
    return trel


def read_project_file(root: str, rel: str, config, limit: int = MAX_FILE_BYTES, root_fd: Optional[int] = None) -> bytes:
    """The bytes of the project file ``rel`` (``root`` a real path) under the rules above: a
    link to a snapshotted file gives its target's bytes; :class:`NotRead` otherwise (``config``
    None: a link is not classified, ``NotRead.link`` says it is one)."""
    fd = _open_root(root) if root_fd is None else root_fd
    try:
        try:
            return _read_at(fd, rel, limit)
        except NotRead as exc:
            if not exc.link or config is None:
                raise
        target = _link_target(root, rel, config)
        try:
            return _read_at(fd, target, limit)
        except NotRead as exc:
            if exc.link:  # the resolved path has no link in it: it changed meanwhile
                raise NotRead("replaced while being read") from None
            raise
    finally:
        if root_fd is None:
            os.close(fd)


def read_module(origin: str, root: str, rel: str, config: Callable[[], object], plain_dirs: Dict[str, bool]) -> bytes:
    """The bytes of the module file ``origin`` (the project file ``rel`` of ``root``) for the
    import hook, on every import: a folder with no link on its way (one ``realpath`` per folder,
    remembered in ``plain_dirs``) is read with one :func:`read_regular`; otherwise, and for a
    link, as :func:`read_project_file` (``config()`` called only to classify a link). A name a
    snapshot leaves out (not UTF-8, or holding a control or bidi character: see
    :func:`_unshowable`) is not read either, so no hook branch holds a name no line can show."""
    problem = name_problem(rel)
    if problem:
        raise NotRead(f"{problem} (rename it to include it)")
    try:
        folder = origin.rpartition(os.sep)[0]
        plain = plain_dirs.get(folder)
        if plain is None:
            plain = plain_dirs[folder] = os.path.realpath(folder) == folder
        if plain:
            return read_regular(origin)
        return read_project_file(root, rel, None)
    except NotRead as exc:
        if not exc.link:
            raise
    return read_project_file(root, rel, config())


def scan(root: str, config, limit: Optional[int] = None) -> Tuple[Dict[str, bytes], List[str]]:
    """The project's snapshotted files (relative ``/`` paths → bytes, sorted) and one line per
    file left out (``path: why; not snapshotted``). ``root`` is a real path (no link in it).

    Folders are opened from the root, one component at a time without following links, one
    descriptor at a time (however deep the tree)."""
    limit = MAX_FILE_BYTES if limit is None else limit
    files: Dict[str, bytes] = {}
    notes: List[str] = []
    try:
        root_fd = _open_root(root)
    except NotRead as exc:
        return files, [f"{root}: {exc}"]
    try:
        pending = [""]
        while pending:
            reldir = pending.pop()
            try:
                dir_fd = _open_dir(root_fd, reldir.split("/") if reldir else [])
            except FileNotFoundError:
                continue  # removed meanwhile
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):  # replaced by a link or file meanwhile
                    notes.append(f"{shown_name(reldir)}/: folder cannot be read ({exc.strerror}); its files are not snapshotted")
                continue
            try:
                pending.extend(reversed(_scan_folder(root, root_fd, dir_fd, reldir, config, limit, files, notes)))
            finally:
                os.close(dir_fd)
    finally:
        os.close(root_fd)
    return dict(sorted(files.items())), notes


def _scan_folder(root, root_fd, dir_fd, reldir, config, limit, files, notes) -> List[str]:
    """Read one folder's included files into ``files``; returns its subfolders to walk."""
    try:
        with os.scandir(dir_fd) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        notes.append(f"{reldir or '.'}/: folder cannot be read ({exc.strerror}); its files are not snapshotted")
        return []
    folders = []
    for entry in entries:
        rel = f"{reldir}/{entry.name}" if reldir else entry.name
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        if is_dir:
            if not config.excludes_dir(rel):
                folders.append(rel)
            continue
        if not config.includes(rel):
            continue
        problem = name_problem(rel)
        if problem:
            shown = os.fsencode(rel).decode("utf-8", errors="backslashreplace") if not _utf8(rel) else shown_name(rel)
            notes.append(f"{shown}: {problem}; not snapshotted (rename it to include it)")
            continue
        try:
            try:
                files[rel] = read_regular(entry.name, dir_fd, limit)
            except NotRead as exc:
                if not exc.link:
                    raise
                files[rel] = read_project_file(root, rel, config, limit, root_fd)
        except NotRead as exc:
            if not exc.gone:
                notes.append(f"{rel}: {exc}; not snapshotted")
    return folders


def _utf8(rel: str) -> bool:
    """Whether a listed name (undecodable bytes as surrogates, ``os.fsdecode``) is UTF-8."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


#: characters that reorder the text around them on a terminal (Trojan-Source style bidi controls)
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _odd(c: str) -> bool:
    o = ord(c)
    return o < 0x20 or 0x7F <= o < 0xA0 or c in _BIDI or c in "\u2028\u2029"


def name_problem(rel: str) -> Optional[str]:
    """Why no snapshot takes a file by its name (``file name is not UTF-8``, ``file name holds a
    control character (\\t)``), or None: the words of every line that says so."""
    if not _utf8(rel):
        return "file name is not UTF-8"
    odd = _unshowable(rel)
    return f"file name holds {odd}" if odd else None


def _unshowable(rel: str) -> Optional[str]:
    """What in ``rel`` cannot be shown on one line as it is, or None: a control character (a
    newline splits every line that names the file; an escape sequence rewrites the terminal) or
    a bidirectional-text control (the name shows as another name). Such a name is never
    snapshotted, so no line of any command has to show it (as a name that is not UTF-8)."""
    for c in rel:
        if _odd(c):
            kind = "a bidirectional-text control" if c in _BIDI else "a line separator" if c in "\u2028\u2029" else "a control character"
            return f"{kind} ({_escape(c)})"
    return None


def _escape(c: str) -> str:
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
    return named.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def shown_name(rel: str) -> str:
    """``rel`` on one line: its control and bidi characters escaped (``\\n``, ``\\u202e``)."""
    return "".join(_escape(c) if _odd(c) else c for c in rel)
