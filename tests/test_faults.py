"""Fault injection: kill -9 during store writes, rewrites and rollbacks (real subprocesses, random
moments), and a full disk (a small tmpfs in a private mount namespace where ``unshare`` allows).

After each kill: the store opens, every ref names a readable commit, the tree is fully old or
fully new, and the next command works (stale ref locks and orphan temporary objects of the
killed writer are cleared). ``SCALEBOX_FAULT_TRIALS`` sets the kills per test (CI: a few).
"""
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from scalebox_cst.project import JOURNAL_FILE, Project
from scalebox_cst.store import Store, StoreError

from conftest import ROOT, scalebox

TRIALS = int(os.environ.get("SCALEBOX_FAULT_TRIALS", "4"))
FP = "fp-faults"


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}


def _start(script, *args):
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    line = proc.stdout.readline()  # "ready": the loop is running
    assert line.strip() == b"ready", proc.stderr.read().decode()
    return proc


def _kill_at_random(proc, rng, most=0.08):
    time.sleep(rng.uniform(0, most))
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _check_store(root):
    """Every ref resolves to a commit whose whole tree is readable."""
    store = Store.open(str(root))
    for refname in store.repo.listall_references():
        store.tree_paths(str(store.repo.references[refname].target))
    return store


def _locks(root):
    return glob.glob(str(root / ".scalebox" / "store.git" / "refs" / "**" / "*.lock"), recursive=True)


STORE_WRITER = textwrap.dedent(
    """\
    import os, sys
    from scalebox_cst.store import Store
    store = Store.init(sys.argv[1])
    tip, _ = store.snapshot({"a.py": b"0"}, "base")
    print("ready", flush=True)
    i = 0
    while True:
        i += 1
        files = {f"m{k}.py": os.urandom(64) for k in range(4)}
        tip, _ = store.snapshot(files, f"s{i}")
        store.commit_rewrite(tip, {"m0.py": os.urandom(2000)}, "r", "", {"n": i}, "fp-faults")
        store.cache_put(Store.blob_id(files["m1.py"]), "fp-faults", os.urandom(5000), {"i": i})
    """
)


def test_kill_during_store_writes_leaves_a_store_that_works(tmp_path):
    rng = random.Random(7)
    root = tmp_path / "proj"
    root.mkdir()
    left_locks = 0
    for trial in range(TRIALS):
        proc = _start(STORE_WRITER, str(root))
        _kill_at_random(proc, rng)
        left_locks += len(_locks(root))
        for tmp in glob.glob(str(root / ".scalebox" / "store.git" / "objects" / "tmp_object_git2_*")):
            os.utime(tmp, (time.time() - 3600,) * 2)  # as if the kill was an hour ago
        store = _check_store(root)
        # the next writer works, whatever the killed one left behind
        tip, _ = store.snapshot({"after.py": str(trial).encode()}, "after kill")
        store.commit_rewrite(tip, {"after.py": b"r"}, "r", "", {}, FP)
        store.cache_put(Store.blob_id(b"x%d" % trial), FP, b"y", {})
        assert not glob.glob(str(root / ".scalebox" / "store.git" / "objects" / "tmp_object_git2_*"))
        store.close()
    print(f"\n{TRIALS} kills during store writes: {left_locks} ref lock(s) left behind, all recovered")


@pytest.mark.parametrize("name", ["refs/heads/source", "refs/notes/scalebox-reports", "refs/heads/run/0002"])
def test_a_stale_ref_lock_of_a_dead_writer_is_removed(tmp_path, name):
    root = tmp_path / "proj"
    root.mkdir()
    store = Store.init(str(root))
    tip, _ = store.snapshot({"a.py": b"1"}, "base")
    store.commit_rewrite(tip, {"a.py": b"r"}, "r", "", {}, FP)
    lock = os.path.join(store.path, *name.split("/")) + ".lock"
    with open(lock, "w") as fh:
        fh.write("0" * 40 + "\n")  # what libgit2 leaves when killed between write and rename
    os.utime(lock, (time.time() - 5,) * 2)
    fresh = Store.open(str(root))
    tip, _ = fresh.snapshot({"a.py": b"2"}, "next")
    branch, _ = fresh.commit_rewrite(tip, {"a.py": b"r2"}, "r", "", {}, FP)
    assert branch == "run/0002" and not os.path.exists(lock)


STORE_ONCE = textwrap.dedent(
    """\
    import sys
    from scalebox_cst.store import Store, StoreError
    try:
        Store.open(sys.argv[1]).snapshot({"a.py": b"3"}, "x")
    except StoreError as exc:
        print("error", exc)
    else:
        print("ok")
    """
)


def test_a_lock_another_program_holds_is_named(tmp_path, monkeypatch):
    """A lock made while we hold the store's write lock is not ours to remove: it is named."""
    from scalebox_cst.store import refs as store_refs

    root = tmp_path / "proj"
    root.mkdir()
    store = Store.init(str(root))
    store.snapshot({"a.py": b"1"}, "base")
    lock = os.path.join(store.path, "refs", "heads", "source.lock")
    with open(lock, "w") as fh:
        fh.write("x")
    os.utime(lock, (time.time() + 60,) * 2)  # newer than any hold: a live foreign writer's
    monkeypatch.setattr(store_refs, "_FOREIGN_LOCK_WAIT_S", 0.2)
    with pytest.raises(StoreError) as info:
        Store.open(str(root)).snapshot({"a.py": b"2"}, "x")
    assert lock in str(info.value) and "busy" not in str(info.value) and "\n" not in str(info.value)
    assert os.path.exists(lock)


ROLLER = textwrap.dedent(
    """\
    import sys
    from scalebox_cst.project import Project
    project = Project(sys.argv[1])
    targets = sys.argv[2:]
    print("ready", flush=True)
    i = 0
    while True:
        project.rollback(targets[i % 2])
        i += 1
    """
)


def _tree(root):
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".scalebox"]
        for name in filenames:
            out[os.path.relpath(os.path.join(dirpath, name), root)] = open(os.path.join(dirpath, name), "rb").read()
    return out


@pytest.mark.parametrize("names", ["short", "longest"])
def test_kill_during_rollback_leaves_the_tree_fully_old_or_fully_new(tmp_path, names):
    """``longest``: file names of 250 bytes and more (ASCII, UTF-8), whose temporaries must
    still fit the file system's 255 bytes."""
    rng = random.Random(11)
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    project, _ = Project.init(str(root))
    stems = [f"m{i}" for i in range(30)]
    if names == "longest":
        stems = [f"{i:02d}" + ("l" * 250 if i % 2 else "\u00e9" * 124)[: 250 - 2] for i in range(30)]
    for i, stem in enumerate(stems):
        (root / "pkg" / f"{stem}.py").write_text(f"A = {i}\n")
    a = project.commit_change(force=True).branch
    state_a = _tree(root)
    for i, stem in enumerate(stems):
        (root / "pkg" / f"{stem}.py").write_text(f"B = {i}\n" * 20)
    b = project.commit_change(force=True).branch
    state_b = _tree(root)
    outcomes = {"old/new": 0, "finished": 0, "reverted": 0}
    trials = TRIALS * 2 if names == "short" else TRIALS
    for trial in range(trials):
        proc = _start(ROLLER, str(root), a, b)
        _kill_at_random(proc, rng, most=0.4)
        done = Project(str(root)).recover()  # what the next command does first
        if done and done.startswith("finished"):
            outcomes["finished"] += 1
        elif done:
            outcomes["reverted"] += 1
        else:
            outcomes["old/new"] += 1
        tree = _tree(root)
        assert tree in (state_a, state_b), f"trial {trial}: half-restored tree ({done})"
        assert not [p for p in tree if p.endswith(".scalebox-tmp")]
        assert not os.path.exists(root / ".scalebox" / JOURNAL_FILE)
        _check_store(root).close()
    Project(str(root)).rollback(a)  # and the next rollback works
    assert _tree(root) == state_a
    print(f"\n{trials} kills during rollback ({names} names): {outcomes}")


PAUSED_ROLLER = textwrap.dedent(
    """\
    import sys
    from scalebox_cst.project import Project
    from scalebox_cst.rollback import Replacer
    root, action, target, phase = sys.argv[1:5]
    real = Replacer._write_journal

    def write_journal(self, journal):
        real(self, journal)
        if journal["phase"] == phase:  # the journal is on disk: wait for the test's save
            print("journal", flush=True)
            sys.stdin.readline()

    Replacer._write_journal = write_journal
    print("ready", flush=True)
    try:
        Project(root).undo() if action == "undo" else Project(root).rollback(target)
    except Exception as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
    """
)


def _in_source_history(project, rel, data):
    stack, seen = [project.store.source_tip()], set()
    while stack:
        commit = stack.pop()
        if commit not in seen:
            seen.add(commit)
            if project.store.read_file(commit, rel) == data:
                return True
            stack.extend(str(p) for p in project.store.repo[commit].parent_ids)
    return False


def test_a_save_during_a_rollback_or_undo_is_never_lost(tmp_path):
    """Deterministic trials: a rollback or undo (real subprocess) pauses once its journal is on
    disk, in the write phase or the rename phase; a file it is to replace is saved; then it
    goes on (it must stop, nothing replaced) or is killed -9 (the next command reverts it, or
    finishes it after snapshotting the save). The save is on disk or in the source history."""
    rng = random.Random(19)
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    project, _ = Project.init(str(root))
    states = []
    for letter in "AB":
        for i in range(12):
            (root / "pkg" / f"m{i}.py").write_text(f"{letter} = {i}\n" * 5)
        states.append((project.commit_change(force=True).branch, _tree(root)))
    last_before = None  # the tree before the newest recorded rollback: what undo restores
    outcomes = {}
    combos = [("prepare", "go on"), ("replace", "go on"), ("prepare", "kill"), ("replace", "kill")]
    for trial in range(TRIALS * 2):
        phase, then = combos[trial % 4]
        before = _tree(root)
        action = "undo" if (trial // 4) % 2 and last_before not in (None, before) else "rollback"
        branch, target = max(states, key=lambda s: sum(before.get(k) != v for k, v in s[1].items()))
        if action == "undo":
            branch, target = "", last_before
        edited = rng.choice(sorted(k for k, v in target.items() if before.get(k) != v))
        edit = f"saved = {trial}\n".encode()
        proc = subprocess.Popen(
            [sys.executable, "-c", PAUSED_ROLLER, str(root), action, branch, phase],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
        )
        assert proc.stdout.readline().strip() == b"ready"
        assert proc.stdout.readline().strip() == b"journal", proc.stderr.read().decode()
        with open(root / edited, "wb") as fh:  # the save, while the journal is on disk
            fh.write(edit)
        if then == "go on":
            _, err = proc.communicate(b"\n", timeout=120)
            assert proc.returncode == 1 and err.decode().count("\n") == 1, err.decode()
            assert f"{edited} was saved after the rollback snapshotted it" in err.decode()
            assert _tree(root) == {**before, edited: edit}
            outcome = "stopped"
        else:
            proc.kill()
            proc.communicate()
            done = Project(str(root)).recover()
            if phase == "prepare":
                assert "was undone" in done and _tree(root) == {**before, edited: edit}
                outcome = "reverted"
            else:
                assert "snapshotted first as" in done and _tree(root) == target
                assert _in_source_history(Project(str(root)), edited, edit)
                last_before = before
                outcome = "finished, save snapshotted"
        outcomes[f"{action} {outcome}"] = outcomes.get(f"{action} {outcome}", 0) + 1
        assert not [p for p in _tree(root) if p.endswith(".scalebox-tmp")]
        assert not os.path.exists(root / ".scalebox" / JOURNAL_FILE)
    _check_store(root).close()
    print(f"\n{TRIALS * 2} saves during a paused rollback/undo, none lost: {outcomes}")


REWRITER = textwrap.dedent(
    """\
    import sys
    from scalebox_cst.project import Project
    project = Project(sys.argv[1])
    print("ready", flush=True)
    i = 0
    while True:
        i += 1
        with open(sys.argv[1] + "/train.py", "w") as fh:
            fh.write(f"x = {i}\\n" * 30)
        project.commit_change(force=True)
    """
)


def test_kill_during_rewrite_then_the_next_rewrite_works(tmp_path):
    rng = random.Random(3)
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text("x = 0\n")
    Project.init(str(root))
    for trial in range(TRIALS):
        proc = _start(REWRITER, str(root))
        _kill_at_random(proc, rng, most=0.5)
        _check_store(root).close()
        project = Project(str(root))
        result = project.commit_change(force=True)
        assert result.created and project.store.read_file(result.report.commit, "train.py") == (root / "train.py").read_bytes()


# ---------------------------------------------------------------------------- disk full
DISK_FULL = textwrap.dedent(
    """\
    import json, os, sys
    from scalebox_cst.project import Project
    from scalebox_cst.store import Store, StoreError
    disk = sys.argv[1]
    root = os.path.join(disk, "proj")
    os.makedirs(os.path.join(root, "pkg"))
    project, _ = Project.init(root)
    for i in range(30):
        open(os.path.join(root, "pkg", f"m{i}.py"), "w").write(f"A = {i}\\n")
    a = project.commit_change(force=True).branch
    for i in range(30):
        open(os.path.join(root, "pkg", f"m{i}.py"), "w").write(f"B = {i}\\n")
    b = project.commit_change(force=True).branch
    before = {n: open(os.path.join(root, "pkg", n)).read() for n in os.listdir(os.path.join(root, "pkg"))}
    Project(root).store.snapshot(Project(root).scan(), "so the backup snapshot needs no new object")
    big = {f"pkg/m{i}.py": (f"A = {i}\\n" * 400).encode() for i in range(30)}
    tip, _ = project.store.snapshot(big, "large version")
    # fill the disk, then roll back to the large version: it cannot fit
    with open(os.path.join(disk, "fill"), "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\\0" * 4096)
                fh.flush()
        except OSError:
            pass
    try:
        os.remove(os.path.join(root, ".scalebox", "rollback.lock"))
    except OSError:
        pass
    errors = {}
    for name, call in [
        ("rollback", lambda: Project(root).rollback(tip[:10])),
        ("snapshot", lambda: Project(root).store.snapshot({"new.py": os.urandom(5000)}, "x")),
        ("commit_change", lambda: Project(root).commit_change(force=True)),
    ]:
        try:
            call()
            errors[name] = None
        except StoreError as exc:
            errors[name] = str(exc)
        except BaseException as exc:
            errors[name] = "TRACEBACK " + type(exc).__name__ + ": " + str(exc)
    after = {n: open(os.path.join(root, "pkg", n)).read() for n in os.listdir(os.path.join(root, "pkg"))}
    os.remove(os.path.join(disk, "fill"))
    Project(root).rollback(tip[:10])  # with space again it works
    print(json.dumps({"errors": errors, "same": before == after, "after_space": open(os.path.join(root, "pkg", "m3.py")).read() == "A = 3\\n" * 400}))
    """
)


def _tmpfs_available():
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt && echo ok"], capture_output=True, text=True)
    return probe.stdout.strip() == "ok"


def _on_a_small_tmpfs(tmp_path, source, size):
    """Run the script ``source`` with a tmpfs of ``size`` mounted at its first argument (a disk
    that fills); the JSON of its last line of output."""
    disk = tmp_path / "disk"
    disk.mkdir()
    script = tmp_path / "on_tmpfs.py"
    script.write_text(source)
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size={size} tmpfs "{disk}" && exec "{sys.executable}" "{script}" "{disk}"'],
        capture_output=True, text=True, env=_env(), timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not _tmpfs_available(), reason="needs unshare -rm to mount a small tmpfs")
def test_disk_full_is_one_line_and_the_tree_stays_whole(tmp_path):
    got = _on_a_small_tmpfs(tmp_path, DISK_FULL, "4m")
    for name, error in got["errors"].items():
        assert error is not None, f"{name} succeeded on a full disk?"
        assert not error.startswith("TRACEBACK") and "\n" not in error, f"{name}: {error}"
        assert "busy" not in error, f"{name}: {error}"
    assert "No space left on device" in got["errors"]["rollback"]
    assert got["same"], "a rollback on a full disk changed the tree"
    assert got["after_space"]


# ---------------------------------------------------------------------------- scalebox run
# The run's supervision under faults (runner.execution, runtime.output, runtime.lifeline): every
# process of a run carries SCALEBOX_RUN_DIR in its environment, which is how these tests (by a
# /proc scan of their own) find what a run left behind.
SLEEPER = textwrap.dedent(
    """\
    import subprocess, sys, time
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(f"worker={worker.pid}", flush=True)
    time.sleep(120)
    """
)

DAEMONS = textwrap.dedent(
    """\
    import os, subprocess, sys, time
    # a new session (start_new_session=True) and a classic double fork: both leave the run's group
    session = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    read, write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write, str(os.getpid()).encode())
            time.sleep(120)
        os._exit(0)
    double = int(os.read(read, 32))
    print(f"daemons={session.pid},{double}", flush=True)
    if sys.argv[1:] == ["wait"]:
        time.sleep(120)
    """
)

CHATTY = textwrap.dedent(
    """\
    import sys
    for i in range(int(sys.argv[1])):
        print(f"line {i} " + "x" * 60)
        if i % 50 == 0:
            print(f"step={i} loss={1.0 / (i + 1):.6f}")
    print("done", flush=True)
    if sys.argv[2:] == ["wait"]:  # still running when scalebox run is killed
        import time
        time.sleep(120)
    """
)


LONG_LINES = textwrap.dedent(
    """\
    import os, sys
    for i in range(int(sys.argv[1])):  # lines of 1 MiB that are not UTF-8, then one without its end
        os.write(2, b"\\xff" * (1 << 20) + b"\\n")
    os.write(1, b"y" * (3 << 20) + b" the end")
    sys.exit(3)
    """
)


@pytest.fixture
def run_project(tmp_path):
    """A project whose scripts are committed on run/0001 (``scalebox run run/0001 SCRIPT``)."""
    root = tmp_path / "runproj"
    root.mkdir()
    for name, text in (("sleeper.py", SLEEPER), ("daemons.py", DAEMONS), ("chatty.py", CHATTY), ("long_lines.py", LONG_LINES)):
        (root / name).write_text(text)
    (root / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n')
    cli = [sys.executable, "-c", "from scalebox_cst.cli import main; main()"]
    subprocess.run([*cli, "rewrite", str(root)], check=True, capture_output=True, env=_env(), timeout=120)
    return root, cli


def _run_processes(run_dir):
    """Live processes whose environment names the run's folder (the test's own scan)."""
    marker = f"SCALEBOX_RUN_DIR={run_dir}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in env and state != b"Z":
            found.append(int(name))
    return found


def _describe(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")[:120]
        with open(f"/proc/{pid}/stat", "rb") as fh:
            ppid = fh.read().rsplit(b")", 1)[1].split()[1].decode()
    except OSError:
        return f"{pid} (gone)"
    return f"{pid} (ppid {ppid}): {cmd}"


def _wait_gone(run_dir, timeout=20.0):
    deadline = time.time() + timeout
    while _run_processes(run_dir) and time.time() < deadline:
        time.sleep(0.1)
    return _run_processes(run_dir)


def _kill_all(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _first_run_dir(root, timeout=60.0):
    folder = root / ".scalebox" / "runs" / "run" / "0001"
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = sorted(folder.glob("[0-9][0-9][0-9][0-9]")) if folder.exists() else []
        if found:
            return found[-1]
        time.sleep(0.005)
    raise AssertionError("no run folder appeared")


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds a run's processes in /proc")


@needs_proc
def test_sigkill_of_scalebox_run_early_in_the_childs_start_up_leaves_nothing(run_project):
    """kill -9 of `scalebox run` at several delays after the run folder appears, most of them
    while the child is still starting (importing): no process of the run survives."""
    root, cli = run_project
    delays = [0.0, 0.05, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0][: max(4, TRIALS * 2)]
    survived = {}
    for delay in delays:
        proc = subprocess.Popen([*cli, "run", "run/0001", "sleeper.py"], cwd=root, env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            run_dir = _first_run_dir(root)
            time.sleep(delay)
        finally:
            proc.kill()
            proc.wait()
        left = _wait_gone(str(run_dir))
        if left:
            survived[delay] = [_describe(pid) for pid in left]
            _kill_all(left)
        shutil.rmtree(run_dir)  # the next trial's folder is the only one
    print(f"\n{len(delays)} kills of scalebox run at {delays} s after its run folder appeared: survivors {survived or 'none'}")
    assert not survived


@needs_proc
def test_log_txt_holds_what_the_terminal_showed_when_scalebox_run_is_killed(run_project):
    root, cli = run_project
    proc = subprocess.Popen([*cli, "run", "run/0001", "chatty.py", "--", "30", "wait"], cwd=root, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    seen = b""
    while b"done\n" not in seen:
        chunk = proc.stdout.read1(65536)
        assert chunk, seen[-300:]
        seen += chunk
    proc.kill()  # at once, before the run's end is recorded
    proc.wait()
    run_dir = _first_run_dir(root)
    assert (run_dir / "log.txt").read_bytes() == seen
    _kill_all(_wait_gone(str(run_dir)))


@needs_proc
@pytest.mark.parametrize("how", ["ends", "scalebox run killed"])
def test_processes_that_leave_the_runs_group_end_with_the_run(run_project, how):
    root, cli = run_project
    args = ["--", "wait"] if how != "ends" else []
    proc = subprocess.Popen([*cli, "run", "run/0001", "daemons.py", *args], cwd=root, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("daemons="), line + proc.stderr.read()
    daemons = [int(p) for p in line.split("=")[1].split(",")]
    run_dir = str(_first_run_dir(root))
    if how == "ends":
        proc.communicate(timeout=60)
        assert proc.returncode == 0
    else:
        proc.kill()
        proc.wait()
    left = _wait_gone(run_dir)
    _kill_all(left)
    assert not left, f"{how}: left {[_describe(p) for p in left]} (daemons {daemons})"
    assert not [p for p in daemons if _describe(p).endswith("time.sleep(120) ")]  # not by another name either


def _limit_file_size(limit):
    def apply():
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@needs_proc
def test_a_full_disk_stops_the_recording_not_the_run(run_project):
    """RLIMIT_FSIZE makes the kernel refuse writes past a size (EFBIG), as a full disk does
    (ENOSPC), on the real write path: log.txt stops growing, the run goes on to its end on the
    terminal, one line says the recording stopped, and the record ends."""
    root, cli = run_project
    lines = 6000  # about 420 KB of output against a 128 KB limit: more than a pipe holds
    proc = subprocess.run([*cli, "run", "run/0001", "chatty.py", "--", str(lines)], cwd=root, env=_env(),
                          capture_output=True, text=True, timeout=180, preexec_fn=_limit_file_size(128 * 1024))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.splitlines()
    assert out[-1] == "done" and len([l for l in out if l.startswith("line ")]) == lines
    said = [l for l in proc.stderr.splitlines() if "recording stopped" in l]
    assert len(said) == 1 and "File too large" in said[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    run_dir = _first_run_dir(root)
    record = json.loads((run_dir / "record.json").read_text())
    assert record["status"] == "ok" and "File too large" in record["recording_error"]
    assert (run_dir / "log.txt").stat().st_size <= 128 * 1024


def test_a_full_disk_under_the_tensorboard_writer_stops_the_recording_and_the_record_still_ends(run_project, capfd):
    """The TensorBoard event file hits a full disk: recording stops with one line, nothing waits
    on the writer, and the record ends (it used to hang on tensorboardX's dead writer thread)."""
    import errno
    import threading

    from scalebox_cst.project import Project
    from scalebox_cst.runner import execution as executor

    root, _ = run_project
    (root / "steps.py").write_text(
        "import time\nfor i in range(60):\n    print(f'step={i} loss={i * 0.5}', flush=True)\n    time.sleep(0.05)\n"
    )
    project = Project(str(root))

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    notes = []
    project.commit_change(force=True)
    info = project.store.resolve(project.store.newest_branch())
    execution = executor.Execution(
        project.store.path, project.root, project.runs_dir, info.name, info.commit, "steps.py", [],
        source_commit=info.source_commit, notice=notes.append,
    )
    class FullFile:
        def write(self, _data):
            full()

        flush = close = full

    execution._tb.writer._fh = FullFile()
    done = {}
    waiter = threading.Thread(target=lambda: done.update(record=execution.wait()), daemon=True)
    waiter.start()
    waiter.join(120)
    if waiter.is_alive():
        execution.stop()
    assert not waiter.is_alive(), "the record waited on the dead TensorBoard writer"
    record = done["record"]
    assert record.status == "ok" and "No space left on device" in record.recording_error
    assert [n for n in notes if "recording stopped" in n] == notes[-1:] and len(notes) == 1, notes
    assert "Traceback" not in capfd.readouterr().err
    on_disk = json.loads(open(os.path.join(execution.dir, "record.json")).read())
    assert on_disk["status"] == "ok"


@pytest.mark.parametrize("fault", ["runs-is-a-file", "branch-folder-is-a-file", "disk-full"])
def test_a_run_folder_or_first_record_that_cannot_be_written_is_one_line_and_leaves_nothing(run_project, fault):
    """The run folder could not be made (``.scalebox/runs`` a file, the branch's folder a file)
    or its first record not written (a full disk: RLIMIT_FSIZE's EFBIG, as ENOSPC): each was a
    raw traceback, and the full disk left ``.record.json.NNN.tmp`` and a half run folder."""
    root, cli = run_project
    runs_dir = root / ".scalebox" / "runs"
    shutil.rmtree(runs_dir, ignore_errors=True)
    preexec = None
    if fault == "runs-is-a-file":
        runs_dir.write_text("")
    elif fault == "branch-folder-is-a-file":
        (runs_dir / "run").mkdir(parents=True)
        (runs_dir / "run" / "0001").write_text("")
    else:
        preexec = _limit_file_size(0)
    proc = subprocess.run([*cli, "run", "run/0001", "chatty.py", "--", "3"], cwd=root, env=_env(),
                          capture_output=True, text=True, timeout=120, preexec_fn=preexec)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    said = [l for l in proc.stderr.splitlines() if l.startswith("scalebox: cannot start")]
    assert len(said) == 1 and str(root) in said[0], proc.stderr
    assert proc.stdout == ""  # the script never ran (or was ended before its first line)
    if fault == "disk-full":
        assert "File too large" in said[0] and "record.json" in said[0]
        assert [str(p) for p in runs_dir.rglob("*")] == [str(runs_dir / "run"), str(runs_dir / "run" / "0001")]


def test_output_lines_of_megabytes_keep_the_host_small_and_the_record_short(run_project):
    """A script printing megabytes without a newline: the host kept its last 400 lines whole for
    the error tail (1 MiB each, twice that once undecodable bytes became U+FFFD: 450 MB for
    2 GB of output) and wrote ten of them into record.json (44 MB, read by every `scalebox log`
    and monitor poll). Each kept line is now at most TAIL_LINE_CHARS, its start and end kept."""
    from scalebox_cst.runner.record import TAIL_LINE_CHARS

    root, cli = run_project
    host = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
            "stderr=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    proc = subprocess.run([sys.executable, "-c", host, *cli, "run", "run/0001", "long_lines.py", "--", "150"],
                          cwd=root, env=_env(), capture_output=True, text=True, timeout=300)
    peak_mib = int(proc.stdout.split()[-1]) / 1024  # the largest of scalebox run and its script
    run_dir = _first_run_dir(root)
    record = json.loads((run_dir / "record.json").read_text())
    assert record["status"] == "failed" and record["exit_status"] == 3
    tail = record["error_tail"]
    assert tail and all(len(line) <= TAIL_LINE_CHARS for line in tail), [len(line) for line in tail]
    assert " the end" in tail and any("characters, the middle cut" in line for line in tail), [line[:40] for line in tail]
    assert (run_dir / "record.json").stat().st_size < 1 << 20
    assert (run_dir / "stderr.txt").stat().st_size == 150 * ((1 << 20) + 1)  # the files keep every byte
    assert peak_mib < 200, f"scalebox run peaked at {peak_mib:.0f} MiB"


@pytest.mark.parametrize("how", ["2>&1 | head -1", "2>&-: stderr's reader gone at once"])
def test_a_run_whose_stderr_reader_goes_away_goes_on_to_its_end_and_its_record(run_project, how):
    """``scalebox run x.py 2>&1 | head``: the next notice met the closed pipe and click's EPIPE
    exit ended scalebox run (status 1, not a word), its child killed with it and its record left
    ``running`` (read as ``lost``); with stderr's reader gone first, no run at all. The run now
    goes on to its end as it does when only its stdout's reader goes away, and is recorded."""
    root, cli = run_project
    if how.startswith("2>&1"):
        proc = subprocess.Popen([*cli, "run", "run/0001", "chatty.py", "--", "3000"], cwd=root, env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        proc.stdout.readline()
        proc.stdout.close()
    else:
        proc = subprocess.Popen([*cli, "run", "run/0001", "chatty.py", "--", "3000"], cwd=root, env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stderr.close()
        proc.stdout.read()
    assert proc.wait(timeout=120) == 0
    run_dir = _first_run_dir(root, timeout=5)
    record = json.loads((run_dir / "record.json").read_text())
    assert record["status"] == "ok" and record["exit_status"] == 0, record
    assert (run_dir / "log.txt").read_text().splitlines()[-1] == "done"


# ---------------------------------------------------------------------------- scalebox gc
def _gc_store(root, saves=120):
    """A store with many loose objects, unreachable cache trees among them, all aged past the
    grace period (so a pass packs, prunes and packs refs: each step can be interrupted)."""
    store = Store.init(str(root))
    for i in range(saves):
        files = {"train.py": b"step = %d\n" % i, "lib/util.py": b"X = %d\n" % (i % 3)}
        source, _ = store.snapshot(files, f"save {i}")
        store.commit_rewrite(source, {p: d + b"# r\n" for p, d in files.items()}, "r", f"save {i}", {"i": i}, FP)
        store.cache_put_many([(Store.blob_id(d), FP, d + b"# r\n", {"i": i}) for d in files.values()])
    store.close()
    old = time.time() - 30 * 86400
    for path in glob.glob(str(root / ".scalebox" / "store.git" / "objects" / "??" / "*")):
        os.utime(path, (old, old))


def _user_made(root):
    store = Store.open(str(root))
    found = {b.name: (store.files(b.commit), store.report(b.name)) for b in store.branches()}
    found["source"] = store.files(store.source_tip())
    store.close()
    return found


def _git_fsck(root):
    if shutil.which("git") is None:
        return
    proc = subprocess.run(["git", "--git-dir", str(root / ".scalebox" / "store.git"), "fsck", "--no-dangling"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "error" not in proc.stderr.lower(), proc.stderr


def test_a_gc_killed_folding_the_refs_leaves_locks_the_next_gc_gets_past(tmp_path):
    # libgit2's compress_references takes packed-refs.lock, then each loose ref's <ref>.lock as it
    # folds them in: a `scalebox gc` killed there (kill -9 at a random moment, 1 in 30 trials) left
    # refs/heads/run/0239.lock, and every later gc failed ('failed to lock loose reference'); a
    # packed-refs.lock failed them for an hour
    _gc_store(tmp_path, saves=40)
    before = _user_made(tmp_path)
    git_dir = tmp_path / ".scalebox" / "store.git"
    stale = [git_dir / "refs" / "heads" / "run" / "0007.lock", git_dir / "packed-refs.lock"]
    for lock in stale:
        lock.write_bytes(b"")
        os.utime(lock, (time.time() - 5, time.time() - 5))
    proc = scalebox("gc", cwd=tmp_path, check=False)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert not [p for p in stale if p.exists()] and not (git_dir / "refs" / "heads" / "run" / "0007").exists()
    assert _user_made(tmp_path) == before
    _git_fsck(tmp_path)


def test_kill_9_of_gc_at_random_moments_loses_nothing(tmp_path):
    rng = random.Random(24)
    base = tmp_path / "base"
    base.mkdir()
    _gc_store(base)
    before = _user_made(base)
    for trial in range(TRIALS):
        root = tmp_path / f"t{trial}"
        shutil.copytree(base, root, symlinks=True)
        proc = subprocess.Popen([sys.executable, "-c", "from scalebox_cst.cli import main; main()", "gc"], cwd=root,
                                env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _kill_at_random(proc, rng, most=1.5)
        assert _user_made(root) == before, trial
        _git_fsck(root)
        proc = scalebox("gc", cwd=root, check=False)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (trial, proc.stderr)
        assert _user_made(root) == before, trial
        _git_fsck(root)
        shutil.rmtree(root)


GC_ON_A_FULL_DISK = textwrap.dedent(
    """\
    import glob, json, os, sys, time
    from scalebox_cst.store import Store, gc
    disk = sys.argv[1]
    root = os.path.join(disk, "proj")
    os.makedirs(root)
    store = Store.init(root)
    for i in range(60):
        files = {"train.py": b"step = %d\\n" % i}
        source, _ = store.snapshot(files, f"save {i}")
        store.commit_rewrite(source, files, "r", f"save {i}", {"i": i}, "fp")
        store.cache_put_many([(Store.blob_id(files["train.py"]), "fp", b"# %d\\n" % i, {"i": i})])
    store.close()
    old = time.time() - 30 * 86400
    for path in glob.glob(os.path.join(root, ".scalebox", "store.git", "objects", "??", "*")):
        os.utime(path, (old, old))
    before = {b.name: Store.open(root).files(b.commit) for b in Store.open(root).branches()}
    with open(os.path.join(disk, "fill"), "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\\0" * 4096)
        except OSError:
            pass
    try:
        error = None
        gc.collect(Store.open(root))
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    after = {b.name: Store.open(root).files(b.commit) for b in Store.open(root).branches()}
    loose = len(glob.glob(os.path.join(root, ".scalebox", "store.git", "objects", "??", "*")))
    print(json.dumps({"error": error, "same": before == after, "loose": loose}))
    """
)


@pytest.mark.skipif(not _tmpfs_available(), reason="needs unshare -rm to mount a small tmpfs")
def test_gc_on_a_full_disk_frees_room_first_and_finishes(tmp_path):
    # `scalebox gc` is what a user runs when the disk is full; it packed first, failed there
    # ('cannot extend packfile ...: No space left on device') and freed nothing, while removing
    # the unreachable trees and commits it would remove next takes no room at all
    got = _on_a_small_tmpfs(tmp_path, GC_ON_A_FULL_DISK, "16m")
    assert got["same"] and got["error"] is None and got["loose"] == 0, got


@pytest.mark.skipif(not _tmpfs_available(), reason="needs unshare -rm for a read-only bind mount")
def test_gc_dry_run_reads_a_read_only_store(tmp_path):
    # a dry run changes nothing, but took the store's write lock: on a read-only store it failed
    # ('cannot write to the store: .../scalebox.lock: Read-only file system'); gc itself still says so
    _gc_store(tmp_path, saves=10)
    git_dir = tmp_path / ".scalebox" / "store.git"
    cli = f'"{sys.executable}" -c "from scalebox_cst.cli import main; main()"'
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f'mount --bind -o ro "{git_dir}" "{git_dir}" && cd "{tmp_path}" && {cli} gc --dry-run '
                                       f'&& {cli} gc; echo "gc=$?"'],
        capture_output=True, text=True, env=_env(), timeout=300,
    )
    assert "scalebox gc (dry run):" in proc.stdout and "would pack" in proc.stdout, proc.stderr
    assert proc.stdout.strip().endswith("gc=1") and "Read-only file system" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
