"""``scalebox rewrite --out DIR``: writing the rewritten files to a folder of the user's, safely.

- DIR must not be the project folder, hold it, or lie inside ``.scalebox/``, and no file written
  there may be a file of the project that this rewrite reads (``--out src`` beside ``src/x.py``):
  checked before anything is committed (:func:`refusal`).
- Nothing is written through a symbolic link: below DIR every folder is opened one component at a
  time with ``O_NOFOLLOW`` (as :mod:`scalebox_cst.intake` reads the project), and a link (or a
  folder, a FIFO) where a file goes stops the write with one line.
- Each file is written in full to a temporary sibling (``O_EXCL | O_NOFOLLOW``), synced, then
  renamed over its destination: a failure (disk full) never leaves a partial file, nor the
  temporary one.
"""
from __future__ import annotations

import os
import stat
from typing import AbstractSet, Dict, Optional

from scalebox_cst import tmpnames
from scalebox_cst.intake import _DIR_FLAGS, _NOFOLLOW
from scalebox_cst.rollback import TMP_TAG, remove_quietly, write_new



class OutError(Exception):
    """Why --out cannot be written (one line, naming the path)."""


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def refusal(out: str, root: str, state_dir: str, rels: AbstractSet[str]) -> Optional[str]:
    """Why ``out`` must not receive the rewrite of project paths ``rels``, or None."""
    where = os.path.realpath(out)
    root, state = os.path.realpath(root), os.path.realpath(state_dir)
    if _inside(root, where):
        return f"{out} is the project folder {root} or holds it: the rewritten files would replace your own (choose a folder of its own)"
    if _inside(where, state):
        return f"{out} is inside the store {state}: choose a folder of its own"
    if _inside(where, root):
        for rel in rels:
            target = os.path.relpath(os.path.join(where, *rel.split("/")), root).replace(os.sep, "/")
            if target in rels:
                return f"{out}/{rel} would replace {target}, a file of the project being rewritten (choose a folder of its own)"
    return None


def _open_below(out_fd: int, parts, shown: str) -> int:
    """The folder ``parts`` below ``out_fd``, made where missing, no component a link."""
    fd = os.dup(out_fd)
    try:
        for i, part in enumerate(parts):
            try:
                os.mkdir(part, 0o777, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                import errno

                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    where = "/".join([shown, *parts[: i + 1]])
                    raise OutError(f"{where} is a symbolic link or a file, not a folder (--out never writes through links)") from None
                raise
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_at(dir_fd: int, name: str, data: bytes, shown: str) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise OutError(f"{shown} is {what}; not replaced (--out never writes through links)")
    mode = stat.S_IMODE(st.st_mode) if st is not None else None
    tmp = os.path.basename(tmpnames.sibling(name, tmpnames.writer_id(), TMP_TAG, hidden=True))
    write_new(tmp, data, mode, dir_fd=dir_fd)
    try:
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        remove_quietly(tmp, dir_fd)
        raise


def write_tree(out: str, outputs: Dict[str, bytes]) -> None:
    """Write ``outputs`` (project path -> bytes) below ``out``. OutError or OSError on failure."""
    os.makedirs(out, exist_ok=True)
    out_fd = os.open(out, _DIR_FLAGS & ~_NOFOLLOW)
    try:
        for rel, data in sorted(outputs.items()):
            *folders, name = rel.split("/")
            shown = os.path.join(out, *rel.split("/"))
            dir_fd = _open_below(out_fd, folders, out.rstrip("/"))
            try:
                _write_at(dir_fd, name, data, shown)
            finally:
                os.close(dir_fd)
    finally:
        os.close(out_fd)
