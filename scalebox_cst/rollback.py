"""Replacing the user's files, all or nothing: the machinery of ``rollback``, ``undo`` and the
recovery of a rollback that was killed. :class:`~scalebox_cst.project.Project` holds the what
(which snapshot, which files to remove); this module holds the how.

A rollback snapshots the current files, writes every new file in full beside its destination,
records the plan in a journal under ``.scalebox/``, then renames each new file into place. It is
the only code that writes the user's tree, so it must never destroy an edit: the user (an editor,
another scalebox process) may save a file at any moment of it. Just before each file is replaced
(and after a file to be removed is moved aside) its content is compared with what the snapshot
holds; a file saved since the snapshot stops the rollback with one line and the files already
replaced are put back (nothing replaced, the edit kept). On Linux the comparison has no window:
the new file and the current one are swapped atomically (``renameat2``, :mod:`.renameat`) and
the file swapped out is compared (and swapped back if saved since). A rollback killed while renaming is
finished by the next command; a file edited after the kill is snapshotted again first, so the
edit is in the store's history before the rollback's file replaces it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Tuple

from scalebox_cst import renameat, tmpnames
from scalebox_cst.store import Store, StoreError
from scalebox_cst.store.refs import _FileLock

if TYPE_CHECKING:
    from scalebox_cst.project import Project

#: the rollback journal under .scalebox/: present only while a rollback is replacing files
JOURNAL_FILE = "rollback-journal.json"
ROLLBACK_LOCK = "rollback.lock"
#: trailer of the snapshot a rollback ends with: what ``undo`` needs to revert it (JSON, one line)
ROLLBACK_TRAILER = "Scalebox-Rollback"
TMP_TAG = ".scalebox-tmp"


@dataclasses.dataclass
class RollbackResult:
    branch: str  # what was restored: run/NNNN, a snapshot id, or "undo of ..."
    restored: List[str]
    unchanged: List[str]
    left_in_place: List[str]  # current files the snapshot did not have (not deleted)
    backup_commit: str  # snapshot of the files as they were before the rollback
    skipped: List[Tuple[str, str]] = dataclasses.field(default_factory=list)  # (path, why): never written
    removed: List[str] = dataclasses.field(default_factory=list)  # undo: files the rollback had created
    commit: Optional[str] = None  # the snapshot of the tree after the rollback


class _Edited(Exception):
    """A file was saved after the rollback snapshotted it: the rollback must not replace it."""

    def __init__(self, rel: str) -> None:
        super().__init__(rel)
        self.rel = rel


def tmp_name(rel: str) -> str:
    """The temporary file beside project path ``rel`` (``/``-separated): always a name that fits."""
    folder, _, name = rel.rpartition("/")
    return (folder + "/" if folder else "") + tmpnames.sibling(name, tmpnames.writer_id(), TMP_TAG, hidden=True)


def journal_path(project: "Project") -> str:
    return os.path.join(project.state_dir, JOURNAL_FILE)


def journal_temporaries(project: "Project") -> List[str]:
    """Temporary journals (``rollback-journal.json.<pid>.scalebox-tmp``) under ``.scalebox/``.
    Written only under :func:`locked`: one seen by a holder of that lock is a killed writer's."""
    prefix = tmpnames.stem(JOURNAL_FILE) + "."
    try:
        names = os.listdir(project.state_dir)
    except OSError:
        return []
    return [os.path.join(project.state_dir, n) for n in names if n.startswith(prefix) and n.endswith(TMP_TAG)]


@contextlib.contextmanager
def locked(project: "Project") -> Iterator[None]:
    """Rollbacks, undos and recoveries of one project run one at a time (across processes)."""
    if not os.path.isdir(project.state_dir):
        raise StoreError(f"no store at {Store.store_path(project.root)}: run `scalebox init`")
    lock = _FileLock(os.path.join(project.state_dir, ROLLBACK_LOCK))
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


class Replacer:
    """One project's rollback machinery (call under :func:`locked`)."""

    def __init__(self, project: "Project") -> None:
        self.project = project
        self.root = project.root
        self.store = project.store

    def _abs(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/"))

    def unsafe(self, rel: str) -> Optional[str]:
        """Why ``rel`` must not be written by a rollback (a symlink on the way, a folder or file
        in the way), or None. Every folder above it is a real folder inside the project."""
        parts = rel.split("/")
        path = self.root
        for i, part in enumerate(parts):
            path = os.path.join(path, part)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                return None  # the rest is created, as real folders, inside the project
            except OSError as exc:
                return f"cannot be inspected ({exc.strerror})"
            shown = "/".join(parts[: i + 1])
            if stat.S_ISLNK(st.st_mode):
                if i == len(parts) - 1:
                    return "it is a symbolic link (kept as a link; rollback does not write through links)"
                return f"{shown} is a symbolic link (rollback does not write through links)"
            if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
                return f"{shown} is a file, not a folder"
            if i == len(parts) - 1 and not stat.S_ISREG(st.st_mode):
                return "a folder or special file is in the way"
        return None

    # ------------------------------------------------------------------ one rollback
    def restore(self, target: Dict[str, bytes], remove: Dict[str, bytes], label: str, source: str) -> RollbackResult:
        """Lay ``target`` over the tree (and remove ``remove``'s files where they still hold those
        bytes) all or nothing: the current files are snapshotted, every new file is written in
        full beside its destination, a journal records the plan, then each is renamed into
        place (unless it was saved since the snapshot: see the module docstring). A failure
        before the renames removes the temporary files; one during them puts back what was
        replaced; a kill is finished by the next command (:meth:`recover`)."""
        current = self.project.scan()
        restored, unchanged, skipped, removing = [], [], [], []
        for rel, data in sorted(target.items()):
            why = self.unsafe(rel)
            if why is not None:
                if current.get(rel) != data:
                    skipped.append((rel, why))
                continue
            if current.get(rel) == data:
                unchanged.append(rel)
            else:
                restored.append(rel)
        for rel, data in sorted(remove.items()):
            if rel not in target and current.get(rel) == data and self.unsafe(rel) is None:
                removing.append(rel)
        backup, _ = self.store.snapshot(current, f"before rollback to {label}")
        created = [rel for rel in restored if rel not in current]
        left = sorted(set(current) - set(target) - set(removing))
        if restored or removing:
            journal = {
                "label": label,
                "source": source,
                "backup": backup,
                "write": [[rel, tmp_name(rel)] for rel in restored],
                "remove": [[rel, tmp_name(rel)] for rel in removing],
                "created": created,
                "phase": "prepare",
            }
            self._replace_files(journal, target, current)
        final = {rel: data for rel, data in current.items() if rel not in removing}
        final.update((rel, target[rel]) for rel in restored)
        commit = self._record(label, source, backup, created, final)
        return RollbackResult(label, restored, unchanged, left, backup, skipped, removing, commit)

    def _record(self, label: str, source: str, backup: str, created: List[str], final: Dict[str, bytes]) -> str:
        """The snapshot a rollback ends with; its trailer lets ``undo`` revert it. Then the
        journal goes: the rollback is complete."""
        meta = json.dumps({"label": label, "source": source, "backup": backup, "created": created}, sort_keys=True)
        message = f"rollback to {label} (previous files: {backup[:10]})\n\n{ROLLBACK_TRAILER}: {meta}"
        try:
            commit, _ = self.store.snapshot(final, message)
        except StoreError as exc:
            raise StoreError(f"the files of {label} are in place, but the store could not record it ({exc}); the next scalebox command records it") from None
        remove_quietly(journal_path(self.project))
        return commit

    def _write_journal(self, journal: dict) -> None:
        path = journal_path(self.project)
        tmp = tmpnames.sibling(path, tmpnames.writer_id(), TMP_TAG)
        data = json.dumps(journal, sort_keys=True).encode("utf-8")
        try:
            write_new(tmp, data, None)
            os.replace(tmp, path)
            fsync_dir(os.path.dirname(path))
        except BaseException:
            remove_quietly(tmp)
            raise

    def _replace_files(self, journal: dict, target: Dict[str, bytes], current: Dict[str, bytes]) -> None:
        label = journal["label"]
        made_dirs: List[str] = []
        written: List[str] = []
        try:
            self._write_journal(journal)
            for rel, tmp in journal["write"]:
                path = self._abs(rel)
                folder = os.path.dirname(path)
                missing = []
                while not os.path.lexists(folder):
                    missing.append(folder)
                    folder = os.path.dirname(folder)
                for folder in reversed(missing):
                    os.mkdir(folder)
                    made_dirs.append(folder)
                try:
                    mode = os.lstat(path).st_mode & 0o7777
                except FileNotFoundError:
                    mode = None
                written.append(tmp)
                write_new(self._abs(tmp), target[rel], mode)
            for folder in {os.path.dirname(self._abs(rel)) for rel, _ in journal["write"]}:
                fsync_dir(folder)
            journal["phase"] = "replace"
            self._write_journal(journal)
        except BaseException as exc:
            for tmp in written:
                remove_quietly(self._abs(tmp))
            for folder in reversed(made_dirs):
                try:
                    os.rmdir(folder)
                except OSError:
                    pass
            remove_quietly(journal_path(self.project))
            if not isinstance(exc, Exception):
                raise
            raise StoreError(
                f"rollback to {label} stopped before any file was replaced ({why(exc)}); nothing changed"
            ) from None

        done: List[Tuple[str, str, str]] = []  # (kind, rel, tmp)
        try:
            for rel, tmp in journal["remove"]:
                os.replace(self._abs(rel), self._abs(tmp))  # kept aside until the end
                done.append(("remove", rel, tmp))
                if read_or_none(self._abs(tmp)) != current[rel]:  # aside, so no save can land in between
                    raise _Edited(rel)
            for rel, tmp in journal["write"]:
                if self.unsafe(rel) is not None:
                    raise StoreError(f"{rel} changed into a link or folder during the rollback")
                self._into_place(rel, tmp, current.get(rel))
                done.append(("write", rel, tmp))
        except BaseException as exc:
            failed = self._put_back(done, journal, current, target)
            if not isinstance(exc, Exception):
                raise
            if failed:
                raise StoreError(
                    f"rollback to {label} failed ({why(exc)}) and {len(failed)} file(s) could not be put back "
                    f"(first: {failed[0]}); the previous files are in snapshot {journal['backup'][:10]}"
                ) from None
            if isinstance(exc, _Edited):
                raise StoreError(
                    f"rollback to {label} stopped: {exc.rel} was saved after the rollback snapshotted it; "
                    f"nothing replaced, the edit is kept (run the rollback again to replace it)"
                ) from None
            raise StoreError(
                f"rollback to {label} failed ({why(exc)}); the {len(done)} file(s) already replaced were put back, nothing changed"
            ) from None
        for rel, tmp in journal["remove"]:
            remove_quietly(self._abs(tmp))

    def _into_place(self, rel: str, tmp: str, before: Optional[bytes]) -> None:
        """Rename the new file ``tmp`` over ``rel``, unless ``rel`` no longer holds ``before`` (its
        content in the snapshot; None: no file): then :class:`_Edited`, ``rel`` untouched. Where
        ``renameat2`` works the check has no window: the files are swapped in one step and the
        one swapped out is compared (swapped back if it was saved since); a file the rollback
        creates is renamed in only if none appeared. Elsewhere: compare, then ``os.replace``."""
        path, aside = self._abs(rel), self._abs(tmp)
        try:
            swapped = before is not None and renameat.exchange(aside, path)
        except FileNotFoundError:
            raise _Edited(rel) from None  # removed since the snapshot: an edit too
        if swapped:
            if read_or_none(aside) != before:
                renameat.exchange(aside, path)  # the saved file back in place, ours aside again
                raise _Edited(rel)
            remove_quietly(aside)  # the replaced file: its content is in the backup snapshot
            return
        if before is None:
            try:
                if renameat.noreplace(aside, path):
                    return
            except FileExistsError:
                raise _Edited(rel) from None
        if read_or_none(path) != before:
            raise _Edited(rel)
        os.replace(aside, path)

    def _put_back(self, done: List[Tuple[str, str, str]], journal: dict, current: Dict[str, bytes], target: Dict[str, bytes]) -> List[str]:
        """Undo the renames of a failed rollback; returns the paths that could not be put back.
        A replaced file saved again since it was replaced is the user's newest: it is kept."""
        failed = []
        journal["phase"] = "putback"  # a kill from here on is reverted by the next command
        try:
            self._write_journal(journal)
        except OSError:
            pass  # then a kill now would be finished forward instead: still all or nothing
        for _, tmp in journal["write"]:
            remove_quietly(self._abs(tmp))  # not renamed: frees their space for the put-back
        for kind, rel, tmp in reversed(done):
            try:
                if kind == "remove":
                    os.replace(self._abs(tmp), self._abs(rel))
                    continue
                path = self._abs(rel)
                if read_or_none(path) != target[rel]:
                    continue  # saved since it was replaced: the newest content, kept
                if rel in current:
                    back = self._abs(tmp_name(rel))
                    write_new(back, current[rel], os.lstat(path).st_mode & 0o7777)
                    os.replace(back, path)
                else:
                    os.remove(path)
            except OSError:
                failed.append(rel)
        if not failed:
            remove_quietly(journal_path(self.project))
        return failed

    # ------------------------------------------------------------------ after a kill
    def recover(self) -> Optional[str]:
        """Finish or revert the rollback a kill interrupted (its journal is still there)."""
        for tmp in journal_temporaries(self.project):  # killed while writing the journal: never read
            remove_quietly(tmp)
        path = journal_path(self.project)
        try:
            with open(path, "rb") as fh:
                journal = json.loads(fh.read().decode("utf-8"))
            label = str(journal["label"])
            writes = [(str(r), str(t)) for r, t in journal["write"]]
            removes = [(str(r), str(t)) for r, t in journal["remove"]]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise StoreError(f"the rollback journal {path} is unreadable ({why(exc)}); remove it to go on") from None
        for rel, tmp in writes + removes:
            for name in (rel, tmp):
                if self.unsafe(name) is not None:
                    raise StoreError(f"the rollback journal {path} names {name}, which is not a plain file in the project; remove the journal to go on")
        if journal.get("phase") == "putback":
            self._finish_put_back(journal, writes, removes)
            remove_quietly(path)
            return f"an interrupted rollback to {label} was reverted (it had failed and was putting files back)"
        if journal.get("phase") != "replace":
            # killed while the new files were being written: none replaced anything yet
            for _, tmp in writes:
                remove_quietly(self._abs(tmp))
            remove_quietly(path)
            return f"an interrupted rollback to {label} was undone (it had replaced no file yet)"
        old = self.store.files(str(journal["backup"]))
        again = self._snapshot_edits(journal, old, writes)
        pending = 0
        for rel, tmp in removes:  # a file saved since the snapshot is not removed
            here, aside = self._abs(rel), self._abs(tmp)
            if not os.path.lexists(aside):
                if read_or_none(here) != old.get(rel):
                    continue
                os.replace(here, aside)
            if read_or_none(aside) != old.get(rel) and not os.path.lexists(here):
                os.replace(aside, here)  # saved before it was moved aside
            elif read_or_none(aside) == old.get(rel):
                remove_quietly(aside)
        for rel, tmp in writes:
            if self._swapped_out(rel, tmp, old):
                remove_quietly(self._abs(tmp))  # killed just after the swap: replaced already
            elif os.path.lexists(self._abs(tmp)):
                os.replace(self._abs(tmp), self._abs(rel))  # written in full and synced before "replace"
                pending += 1
        self._record(label, str(journal["source"]), str(journal["backup"]), list(journal.get("created", [])), self.project.scan())
        kept = f"; files saved since it began were snapshotted first as {again[:10]}" if again else ""
        return f"finished an interrupted rollback to {label} ({pending} of {len(writes)} file(s) were still to be replaced{kept})"

    def _swapped_out(self, rel: str, tmp: str, old: Dict[str, bytes]) -> bool:
        """Whether ``tmp`` is the file a swap (:meth:`_into_place`) took out of ``rel``: it holds
        the snapshot's content, which the new file written there never does (only changed
        files are replaced)."""
        return rel in old and os.path.lexists(self._abs(tmp)) and read_or_none(self._abs(tmp)) == old[rel]

    def _snapshot_edits(self, journal: dict, old: Dict[str, bytes], writes: List[Tuple[str, str]]) -> Optional[str]:
        """Before a killed rollback is finished: when a file it is still to replace was saved
        after its snapshot (``old``), snapshot the current files again (the id), so finishing
        it destroys no edit the store does not hold."""
        pending = [rel for rel, tmp in writes if os.path.lexists(self._abs(tmp)) and not self._swapped_out(rel, tmp, old)]
        if all(read_or_none(self._abs(rel)) == old.get(rel) for rel in pending):
            return None
        commit, _ = self.store.snapshot(self.project.scan(), f"saved during the interrupted rollback to {journal['label']}")
        return commit

    def _finish_put_back(self, journal: dict, writes: List[Tuple[str, str]], removes: List[Tuple[str, str]]) -> None:
        """Killed while putting back a failed rollback: finish putting back. Only files that
        still hold what the rollback wrote are put back (any other content is an edit)."""
        old = self.store.files(str(journal["backup"]))
        new = self.store.files(str(journal["source"]))
        for rel, tmp in removes:
            if os.path.lexists(self._abs(tmp)):
                os.replace(self._abs(tmp), self._abs(rel))
        for rel, tmp in writes:
            remove_quietly(self._abs(tmp))
            target = self._abs(rel)
            try:
                with open(target, "rb") as fh:
                    data = fh.read()
                mode = os.lstat(target).st_mode & 0o7777
            except FileNotFoundError:
                continue  # never renamed in (the rollback created it), or removed since
            if data != new.get(rel) or data == old.get(rel):
                continue  # not replaced, already put back, or saved since
            if rel not in old:
                remove_quietly(target)
                continue
            write_new(self._abs(tmp), old[rel], mode)
            os.replace(self._abs(tmp), target)


def read_or_none(path: str) -> Optional[bytes]:
    """The bytes of a file (None when there is none). Never follows a final symbolic link."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError:
        return b"\0scalebox: unreadable"  # differs from any snapshot: treated as changed
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return " ".join(str(exc).split()) or type(exc).__name__


def write_new(path: str, data: bytes, mode: Optional[int], dir_fd: Optional[int] = None) -> None:
    """Write a new file in full and sync it (a partial file is removed). No link is followed.
    ``dir_fd``: ``path`` is a name in that open folder (``rewrite --out``: scalebox_cst.outdir)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o666, dir_fd=dir_fd)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            tmpnames.write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        remove_quietly(path, dir_fd)
        raise


def fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_quietly(path: str, dir_fd: Optional[int] = None) -> None:
    try:
        os.remove(path, dir_fd=dir_fd)
    except OSError:
        pass
