"""The engine writes inside the project's ``.scalebox/`` only: never through a link to a file.

``.scalebox/`` is the engine's, but a project tree can hold one it did not make: git stores
symbolic links, so a cloned repository may ship ``.scalebox/watch.lock -> ~/.ssh/authorized_keys``.
Opening such a path for writing follows the link: the watcher truncated the link's target to
write its pid there, and the project's events were appended to a file outside the project.

The engine makes every file of ``.scalebox/`` itself, so a link to a file (or to nothing) there
is never the user's: it is refused. A link to a *folder* is: moving ``.scalebox`` or its
``runs`` to a larger disk and linking it back is how people make room, and what the engine
writes through it are new files in folders it makes (a run folder is made with ``mkdir``, which
never reuses one that exists).

- Folders: :func:`check_folder` -- no component of a folder the engine writes into, from
  ``.scalebox`` down, is a link to anything but a folder; :func:`check_entries` -- no entry of
  ``.scalebox/`` or ``store.git/`` (locks, events, caches, the run folders' root) is one. The
  store checks these two whenever it is opened, so every command meets a planted link before
  it writes.
- Files opened in place (locks, appended logs and journals): ``O_NOFOLLOW`` (:func:`open_in_place`),
  so a link there is an error, not a write elsewhere. Whole-file writes go through a temporary
  and ``os.replace``, which replaces a link itself.

A link refused is an ``OSError`` (``ELOOP``) whose text names it and says what to do: every
caller already reports a failed write of the state folder in one line.
This module imports only the standard library: the import hook and the runtime use it.
"""
from __future__ import annotations

import errno
import os
from typing import Optional

#: the engine's own folder in a project (as ``scalebox_cst.config.STATE_DIR``)
STATE_DIR = ".scalebox"
#: add to ``os.open`` flags for a file written in place in the state folder
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class LinkInState(OSError):
    """A symbolic link where the engine writes (``errno.ELOOP``; ``strerror`` says what to do)."""

    def __init__(self, path: str) -> None:
        try:
            target = f" (to {os.readlink(path)})"
        except OSError:
            target = ""
        super().__init__(errno.ELOOP, f"a symbolic link{target} inside the engine's folder {STATE_DIR}/, which "
                                      "writes only files of its own (a link to a folder is followed): remove it", path)

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def _state_root(path: str) -> Optional[str]:
    """The ``.scalebox`` folder that ``path`` lies in (or is), else None."""
    path = os.path.abspath(path)
    probe = path
    while True:
        if os.path.basename(probe) == STATE_DIR:
            return probe
        parent = os.path.dirname(probe)
        if parent == probe:
            return None
        probe = parent


def check_folder(path: str) -> None:
    """Raise :class:`LinkInState` where ``path`` (a folder at or below a ``.scalebox``, existing
    or not yet made) reaches through a link from ``.scalebox`` down; the folders above
    ``.scalebox`` (the project's own place, perhaps under a linked home) are the user's."""
    path = os.path.abspath(path)
    root = _state_root(path)
    if root is None:
        return
    rel = os.path.relpath(path, root)
    probe = root
    for part in [] if rel == os.curdir else rel.split(os.sep):
        if _bad_link(probe):
            raise LinkInState(probe)
        if not os.path.lexists(probe):
            return  # made by the caller from here on: a new folder holds no link
        probe = os.path.join(probe, part)
    if _bad_link(probe):
        raise LinkInState(probe)


def _bad_link(path: str) -> bool:
    """A link to anything but a folder (a file, a device, nothing)."""
    return os.path.islink(path) and not os.path.isdir(path)


def check_entries(folder: str) -> None:
    """Raise :class:`LinkInState` for a link to anything but a folder among the entries of
    ``folder`` (the engine opens the entries of ``.scalebox/`` and ``store.git/`` directly)."""
    try:
        with os.scandir(folder) as it:
            links = sorted(e.path for e in it if e.is_symlink() and not e.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return
    if links:
        raise LinkInState(links[0])


def makedirs(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)`` for a folder in the state folder, never through a link."""
    check_folder(path)
    os.makedirs(path, exist_ok=True)


def open_in_place(path: str, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags | O_NOFOLLOW, mode)``; a link there is :class:`LinkInState`."""
    try:
        return os.open(path, flags | NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            raise LinkInState(path) from None
        raise
