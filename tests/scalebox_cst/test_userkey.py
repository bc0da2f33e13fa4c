"""The user's signing key when processes start together over a damaged key file (cut short by a
crash, emptied by hand): every one of them ends with the key that is on disk.

Found by the fourth fault campaign: each process that read the damaged key removed whatever was
at the key's path, so a process slower to remove it removed the key another had just made and
made its own; eight processes started together over a 5-byte key ended with up to five keys,
each signing cache entries and vouches that the others (and every later process) read as misses.
The repair is now made under a lock on the folder, the key read again first."""
from __future__ import annotations

import os
import tempfile
import time

import pytest

from scalebox_cst import userkey


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks the processes that race")
@pytest.mark.parametrize("damaged", [b"short", b"", b"x" * 40])
def test_processes_repairing_a_damaged_key_together_end_with_the_key_on_disk(tmp_path, monkeypatch, damaged):
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("SCALEBOX_CACHE_DIR", str(folder))
    (folder / userkey.FILE_NAME).write_bytes(damaged)
    userkey.forget()
    start = time.time() + 0.3
    children = []
    for index in range(5):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.close(read)
                remove = os.remove

                def slow_remove(path, *args, _i=index, **kwargs):  # the slower, the later it removes
                    if str(path).endswith(userkey.FILE_NAME):
                        time.sleep(0.08 * _i)
                    return remove(path, *args, **kwargs)

                userkey.os.remove = slow_remove
                time.sleep(max(0.0, start - time.time()))
                found = userkey.key()
                os.write(write, found.hex().encode() if found else b"none")
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        children.append((pid, read))
    keys = []
    for pid, read in children:
        with os.fdopen(read, "rb") as fh:
            keys.append(fh.read().decode())
        assert os.waitpid(pid, 0)[1] == 0
    on_disk = (folder / userkey.FILE_NAME).read_bytes().hex()
    assert keys == [on_disk] * len(keys)
    userkey.forget()
    assert userkey.key().hex() == on_disk


def test_a_damaged_key_is_not_removed_by_a_reader_that_makes_none(tmp_path, monkeypatch):
    """``key(create=False)`` (the vouch check) reads a damaged key as no key and leaves it to the
    next writer, which repairs it under the folder's lock."""
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("SCALEBOX_CACHE_DIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # the fallback folder: empty
    (folder / userkey.FILE_NAME).write_bytes(b"short")
    userkey.forget()
    try:
        assert userkey.key(create=False) is None
        made = userkey.key()
        assert made is not None and (folder / userkey.FILE_NAME).read_bytes() == made
    finally:
        userkey.forget()
