"""Leaks: what a long-running engine process holds must not grow with the number of saves.

The watcher, the monitor and the import hook live for days; a resource kept per save (a cached
tree, a file descriptor, a thread, a child, a temporary file) that is never let go is a slow
failure nobody sees in a test of one save. Each test here makes many saves (or runs) and checks
that what the process holds after them is what it held after the first few. Growth by design
(one branch per change, its objects in the store) is not what is measured.
"""
import gc
import io
import os
import threading

import pygit2

from scalebox_cst.project import Project
from scalebox_cst.watcher import Watcher

SAVES = 40


def _fds() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


def _save(root, i: int) -> None:
    """The saves an editor makes while someone works: new code, a syntax error, bytes that are
    not UTF-8, the fix of each."""
    kind = i % 5
    if kind in (0, 1):
        (root / "helpers.py").write_text(f"import torch\n\n\ndef make_model():\n    return torch.nn.Linear(4, {i + 1})\n")
    elif kind == 2:
        (root / "helpers.py").write_text(f"def (:  # {i}\n")
    elif kind == 3:
        (root / "notes.py").write_bytes(b"X = '\xff\xfe %d'\n" % i)
    else:
        (root / "notes.py").write_text(f"X = {i}\n")


def test_many_saves_hold_no_more_than_a_few(project):
    """40 saves of every kind through the watcher's change handling: file descriptors, threads,
    Python objects, libgit2's object cache and temporary files end where they were after the
    first 10 (libgit2's cache grew ~6 kB a save, never let go)."""
    Project.init(str(project))
    watcher = Watcher(Project(str(project), backend="cpu"), echo=lambda line: None, run_output=io.StringIO())
    watcher.claim()
    try:
        watcher.handle_change()
        for i in range(10):
            _save(project, i)
            watcher.handle_change()
        fds, threads, objects = _fds(), threading.active_count(), _tracked()
        cached = pygit2.settings.cached_memory[0]
        for i in range(10, 10 + SAVES):
            _save(project, i)
            watcher.handle_change()
        assert len(watcher.branches) >= SAVES // 2  # the saves were committed (those that parse)
        assert _fds() <= fds
        assert threading.active_count() <= threads
        assert pygit2.settings.cached_memory[0] <= cached
        assert _tracked() - objects < SAVES  # not one object (or more) kept per save
        left = [name for name in os.listdir(project) if name not in ("train.py", "helpers.py", "notes.py", "data.txt",
                                                                         "scalebox.toml", ".scalebox")]
        assert left == []
    finally:
        watcher.close()
