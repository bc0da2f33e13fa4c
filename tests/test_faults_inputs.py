"""Hostile inputs, in random trials: project trees holding links out of the project, FIFOs, a link
to /dev/zero, oversized files, code nested too deeply for Python, NUL bytes, names that are not
UTF-8; configs nested thousands deep or of the wrong type; saves landing while the watcher starts.

Each trial draws a random mix and checks the outcome: nothing hangs (a subprocess with a time
limit), nothing outside the project reaches the store, every file left out or left unchanged is
named in one line (on the right line), the rest of the tree is rewritten, no traceback.
``SCALEBOX_FAULT_TRIALS`` sets the trials per test (CI: a few), as in test_faults.py.
"""
import os
import random
import shutil
import subprocess
import sys
import time

from scalebox_cst import intake, userkey
from scalebox_cst.project import Project
from scalebox_cst.watcher import Watcher

from conftest import HELPERS_PY, ROOT, TRAIN_PY, newest_branch_holds, scalebox

TRIALS = int(os.environ.get("SCALEBOX_FAULT_TRIALS", "4"))
SECRET = b"SECRET-not-in-the-project-51c2"
ODD_CHARS = [("\n", "a control character"), ("\t", "a control character"), ("\r", "a control character"),
             ("\x1b", "a control character"), ("\u202e", "a bidirectional-text control"),
             ("\u2066", "a bidirectional-text control"), ("\u2028", "a line separator")]
ODD_SHOWN = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\x1b": "\\x1b", "\u202e": "\\u202e", "\u2066": "\\u2066", "\u2028": "\\u2028"}


def _deep(rng):
    kind = rng.choice(["sum", "elif", "chain"])
    if kind == "sum":
        return "x = " + "+".join(["1"] * rng.randint(5000, 20000)) + "\n"
    if kind == "elif":
        return "if a:\n    pass\n" + "".join(f"elif a == {i}:\n    pass\n" for i in range(rng.randint(3000, 6000)))
    return "x = a" + ".f()" * rng.randint(3000, 6000) + "\n"


def _hostile_tree(root, outside, rng):
    """Write a random mix of hostile entries under ``root``; returns {name: expected stderr line}."""
    expect = {}
    kinds = rng.sample(["outside", "zero", "fifo", "dangling", "deep", "nul", "name", "big", "folder", "odd"], k=rng.randint(3, 10))
    sub = root / rng.choice(["", "pkg", "pkg/inner"])
    sub.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(sub, root).replace(os.sep, "/")
    prefix = "" if rel == "." else rel + "/"
    for kind in kinds:
        name = f"{kind}_{rng.randint(0, 999)}.py"
        path = sub / name
        if kind == "outside":
            path.symlink_to(outside / "secret.py")
            expect[prefix + name] = f"{prefix}{name}: a symbolic link to {outside / 'secret.py'}, outside the project (never read); not snapshotted"
        elif kind == "zero":
            path.symlink_to("/dev/zero")
            expect[prefix + name] = f"{prefix}{name}: a symbolic link to /dev/zero, outside the project (never read); not snapshotted"
        elif kind == "fifo":
            os.mkfifo(path)
            expect[prefix + name] = f"{prefix}{name}: a FIFO, not a regular file; not snapshotted"
        elif kind == "dangling":
            path.symlink_to(sub / "missing.py")
            expect[prefix + name] = f"{prefix}{name}: a broken symbolic link; not snapshotted"
        elif kind == "deep":
            head = rng.randint(0, 5)
            path.write_text("import os\n" * head + _deep(rng) + "y = 1\n")
            expect[prefix + name] = f"{prefix}{name}:{head + 1}: nested too deeply for Python to compile (RecursionError); left unchanged"
        elif kind == "nul":
            lines = [f"v{i} = {i}\n" for i in range(rng.randint(1, 30))]
            at = rng.randrange(len(lines))
            lines[at] = lines[at][:2] + "\0" + lines[at][2:]
            path.write_text("".join(lines))
            expect[prefix + name] = f"{prefix}{name}:{at + 1}: SyntaxError: source code cannot contain null bytes"
        elif kind == "name":
            raw = os.fsencode(name[:-3]) + b"\xe9\xff.py"
            (sub / os.fsdecode(raw)).write_text("x = 1\n")
            shown = raw.decode("utf-8", errors="backslashreplace")
            expect[prefix + shown] = f"{prefix}{shown}: file name is not UTF-8; not snapshotted (rename it to include it)"
        elif kind == "odd":  # a name no line can show as it is: a newline, an escape, a bidi control
            char, label = rng.choice(ODD_CHARS)
            odd = name[:-3] + char + rng.choice(["", "x", "yp.evil"]) + ".py"
            (sub / odd).write_text("x = 1\n")
            shown = (prefix + odd).replace(char, ODD_SHOWN[char])
            expect[prefix + odd] = f"{shown}: file name holds {label} ({ODD_SHOWN[char]}); not snapshotted (rename it to include it)"
        elif kind == "big":
            with open(path, "wb") as fh:
                fh.truncate(intake.MAX_FILE_BYTES + rng.randint(1, 10**6))  # sparse: no disk used
            size = os.path.getsize(path)
            expect[prefix + name] = f"{prefix}{name}: larger than 10 MiB ({size} bytes); not snapshotted"
        elif kind == "folder":
            (sub / name[:-3]).symlink_to(outside / "lib", target_is_directory=True)  # never followed: no line
    return expect


def _store_bytes(root):
    return subprocess.run(
        ["git", "--git-dir", str(root / ".scalebox" / "store.git"), "cat-file", "--batch-all-objects", "--batch"],
        capture_output=True, check=True,
    ).stdout


def test_rewrite_of_hostile_trees_names_every_bad_file_and_rewrites_the_rest(tmp_path):
    rng = random.Random(19)
    outside = tmp_path / "outside"
    (outside / "lib").mkdir(parents=True)
    (outside / "secret.py").write_bytes(b"token = 1  # " + SECRET + b"\n")
    (outside / "lib" / "mod.py").write_bytes(b"x = 1  # " + SECRET + b"\n")
    failures = []
    for trial in range(TRIALS):
        root = tmp_path / f"proj{trial}"
        root.mkdir()
        (root / "train.py").write_text(TRAIN_PY)
        (root / "helpers.py").write_text(HELPERS_PY)
        expect = _hostile_tree(root, outside, rng)
        scalebox("init", ".", cwd=str(root), env={"PYTHONPATH": ROOT})
        proc = scalebox("rewrite", ".", "--backend", "cpu", cwd=str(root), check=False, timeout=300, env={"PYTHONPATH": ROOT})
        said = proc.stderr.splitlines()
        problems = []
        if "Traceback" in proc.stderr or proc.returncode not in (0, 1):
            problems.append(f"rc {proc.returncode}: {proc.stderr[-500:]}")
        for line in expect.values():
            if line not in said and f"scalebox: warning: {line}" not in said:
                problems.append(f"not said: {line}")
        if SECRET in _store_bytes(root):
            problems.append("the secret reached the store")
        listed = subprocess.run(["git", "--git-dir", str(root / ".scalebox" / "store.git"), "ls-tree", "-r", "-z", "--name-only", "source"],
                                capture_output=True, check=True).stdout.decode("utf-8", "replace").split("\0")
        if any(c in name for name in listed for c in ODD_SHOWN):
            problems.append(f"a name no line can show reached the store: {listed}")
        project = Project(str(root))
        tip = project.store.resolve(project.store.newest_branch())
        if project.store.read_file(tip.commit, "train.py") == TRAIN_PY.encode():
            problems.append("train.py was not rewritten")
        if problems:
            failures.append((trial, sorted(expect), problems))
    print(f"\n{TRIALS} hostile trees rewritten: {len(failures)} failure(s)")
    assert not failures, failures


def _bad_config(rng):
    depth = rng.randint(1500, 6000)
    return rng.choice(
        [
            ("scalebox.toml", "include = " + "[" * depth + "]" * depth, "values nested too deeply to read"),
            ("scalebox.toml", "[grad_clip]\nz = " + "{a=" * depth + "1" + "}" * depth, "values nested too deeply to read"),
            ("pyproject.toml", "tool = " + rng.choice(["1", "[1]", "true", "2.5", "'x'"]), "tool must be a table ([tool])"),
            ("pyproject.toml", "[tool]\nscalebox = " + rng.choice(["5", "[1, 2]", "false", "'s'"]), "tool.scalebox must be a table"),
            ("scalebox.toml", f"{rng.choice(['grad_clip', 'hotfix', 'device', 'vectorize'])} = {rng.randint(0, 9)}", "must be a table"),
            ("scalebox.toml", f"include = [\"{'**/' * rng.randint(10, 40)}x.py\"]\ntransforms = []", None),
        ]
    )


def test_config_mistakes_are_one_line_errors(tmp_path):
    rng = random.Random(23)
    failures = []
    for trial in range(TRIALS):
        root = tmp_path / f"proj{trial}"
        (root / "pkg" / "a" / "b" / "c" / "d" / "e" / "f").mkdir(parents=True)
        (root / "pkg" / "a" / "b" / "c" / "d" / "e" / "f" / "m.py").write_text("x = 1\n")
        name, text, message = _bad_config(rng)
        (root / name).write_text(text)
        proc = scalebox("rewrite", ".", "--backend", "cpu", cwd=str(root), check=False, timeout=120, env={"PYTHONPATH": ROOT})
        lines = proc.stderr.strip().splitlines()
        if message is None:  # a legal config (many ** in a pattern): it must simply finish
            ok = proc.returncode == 0 and "Traceback" not in proc.stderr
        else:
            ok = proc.returncode == 1 and len(lines) == 1 and message in lines[0] and name in lines[0]
        if not ok:
            failures.append((trial, name, text[:60], proc.returncode, proc.stderr[-300:]))
    print(f"\n{TRIALS} config mistakes: {len(failures)} failure(s)")
    assert not failures, failures


def test_saves_landing_while_the_watcher_starts_are_never_lost(tmp_path):
    rng = random.Random(29)
    failures = []
    for trial in range(TRIALS):
        root = tmp_path / f"proj{trial}"
        root.mkdir()
        (root / "train.py").write_text(TRAIN_PY)
        (root / "helpers.py").write_text(HELPERS_PY)
        Project.init(str(root))
        project = Project(str(root), backend="cpu")
        watcher = Watcher(project, debounce=0.05, polling=rng.random() < 0.3, echo=lambda line: None)
        real = project.commit_change
        delay = rng.uniform(0, 0.3)
        marker = f"X = {trial}  # saved {delay:.3f}s after the start's snapshot\n"

        def commit_then_save(*args, **kwargs):
            result = real(*args, **kwargs)
            if project.commit_change is commit_then_save:
                project.commit_change = real
                time.sleep(delay)  # the observer's start would come here in the old order
                tmp = root / ".helpers.py.tmp"
                tmp.write_text(marker)
                os.replace(tmp, root / "helpers.py")
            return result

        project.commit_change = commit_then_save
        watcher.start()
        try:
            if not newest_branch_holds(watcher, project, "helpers.py", marker.encode(), timeout=15):
                failures.append((trial, delay))
        finally:
            watcher.close()
    print(f"\n{TRIALS} saves during the watcher's start: {len(failures)} lost")
    assert not failures, failures


def test_an_unwritable_import_cache_or_store_is_said_once_however_many_modules_meet_it(tmp_path):
    """The import hook on a project whose cache folder or store cannot be written (read-only, full,
    something in the way): each cause is one warning, not one per module, and the script runs."""
    rng = random.Random(31)
    failures = []
    for trial in range(max(2, TRIALS // 2)):
        root = tmp_path / f"proj{trial}"
        root.mkdir()
        count = rng.randint(6, 20)
        for i in range(count):  # each has a site, so each rewrite is committed and cached
            (root / f"mod{i}.py").write_text(f"def f{i}(opt, loss):\n    loss.backward()\n    opt.step()\n")
        (root / "main.py").write_text("".join(f"import mod{i}\n" for i in range(count)) + "print('done')\n")
        Project.init(str(root))
        fault = rng.choice(["cache", "store", "both"])
        if fault in ("cache", "both"):  # a file where the cache folder goes: every cache write fails
            (root / ".scalebox" / "pycache").write_text("in the way\n")
        if fault in ("store", "both"):  # a folder where the store's lock file goes: every commit fails
            lock = root / ".scalebox" / "store.git" / "scalebox.lock"
            if lock.exists():
                lock.unlink()
            lock.mkdir()
        proc = subprocess.run([sys.executable, "-m", "scalebox_cst", "main.py"], cwd=root, capture_output=True, text=True,
                              timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
        said = [line for line in proc.stderr.splitlines() if "scalebox:" in line]
        causes = {"cache": 1, "store": 1, "both": 2}[fault]
        if proc.returncode != 0 or "done" not in proc.stdout or "Traceback" in proc.stderr or len(said) > causes:
            failures.append((trial, fault, count, proc.returncode, len(said), proc.stderr[-600:]))
    print(f"\n{max(2, TRIALS // 2)} unwritable caches or stores: {len(failures)} failure(s)")
    assert not failures, failures


def test_a_fifo_or_folder_in_place_of_an_import_cache_file_never_hangs_an_import(tmp_path, writes_caches):
    """The import hook's own files (a module's cache entry, the fingerprint memo, the user's key)
    replaced by a FIFO or a folder: the script runs rewritten within its time limit, and the entry
    and memo are written again as files (a plain open of a FIFO blocked every import for ever)."""
    rng = random.Random(41)
    failures = []
    for trial in range(max(2, TRIALS // 2)):
        root = tmp_path / f"proj{trial}"
        root.mkdir()
        (root / "mod.py").write_text("def f(opt, loss):\n    loss.backward()\n    opt.step()\n")
        (root / "main.py").write_text("import inspect, mod\nprint('rewritten', 'scalebox' in inspect.getsource(mod))\n")
        Project.init(str(root))

        def run():
            return subprocess.run([sys.executable, "-m", "scalebox_cst", "main.py"], cwd=root, capture_output=True, text=True,
                                  timeout=60, env=dict(os.environ, OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(root / "home-cache")))

        first = run()
        assert first.returncode == 0 and "rewritten True" in first.stdout, first.stderr
        cache = root / ".scalebox" / "pycache"
        targets = {"entry": next(cache.glob("mod.*.pyc")), "memo": next(cache.glob("fingerprint-*")),
                   "key": root / "home-cache" / "scalebox_cst" / userkey.FILE_NAME}  # (scalebox_cst.userkey)
        chosen = rng.sample(sorted(targets), k=rng.randint(1, 3))
        how = rng.choice(["fifo", "folder"])
        for name in chosen:
            targets[name].unlink()
            os.mkfifo(targets[name]) if how == "fifo" else targets[name].mkdir()
        try:
            proc = run()
        except subprocess.TimeoutExpired:
            failures.append((trial, how, chosen, "hung"))
            continue
        if proc.returncode != 0 or "rewritten True" not in proc.stdout or "Traceback" in proc.stderr:
            failures.append((trial, how, chosen, proc.returncode, proc.stderr[-600:]))
        elif how == "fifo" and not all(targets[n].is_file() for n in chosen if n != "key"):
            failures.append((trial, how, chosen, "not written again as a file"))
    print(f"\n{max(2, TRIALS // 2)} FIFOs or folders in the import cache: {len(failures)} failure(s)")
    assert not failures, failures


def _never_blocks(call, seconds=10.0):
    """``call()`` in a thread: (finished, result or exception); a call blocked on a FIFO is left behind."""
    import threading

    out = []

    def go():
        try:
            out.append(call())
        except Exception as exc:  # noqa: BLE001 - reported as the outcome
            out.append(exc)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    thread.join(seconds)
    return (not thread.is_alive()), (out[0] if out else None)


def test_a_fifo_or_folder_in_place_of_a_run_file_never_hangs_a_reader(tmp_path):
    """A run folder whose record, series or side files are FIFOs or folders: ``scalebox log``,
    ``status`` and ``compare`` end in time without a traceback, and every reader of the run
    folder (series, sites, profile, fallbacks, precision, ranks, the monitor's) returns nothing
    instead of blocking (each did a plain ``open``, which waits for a writer that never comes)."""
    import json

    from scalebox_cst import calibration, fallbacks, profile, runs
    from scalebox_cst.monitor.files import EventsFile, MetricsFile
    from scalebox_cst.runner import torchrun

    rng = random.Random(43)
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text("for i in range(5):\n    print(f'step={i} episodic_return={i}', flush=True)\n")
    scalebox("init", cwd=root)
    for _ in range(2):
        scalebox("run", "train.py", cwd=root, timeout=300)
    run_dir = root / ".scalebox" / "runs" / "run" / "0001" / "0001"
    names = ["record.json", "metrics.jsonl", "events.jsonl", "sites.json", "profile.jsonl", "fallbacks.json",
             "precision.json", "ranks/0/rank.json"]
    failures = []
    for trial in range(max(3, TRIALS)):
        chosen = rng.sample(names, k=rng.randint(1, 4))
        how = rng.choice(["fifo", "folder"])
        saved = {}
        for name in chosen:
            path = run_dir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_file():
                saved[name] = path.read_bytes()
                path.unlink()
            os.mkfifo(path) if how == "fifo" else path.mkdir()
        for args in (["log"], ["status"], ["compare", "run/0001", "run/0002"]):
            try:
                proc = scalebox(*args, cwd=root, check=False, timeout=60)
            except subprocess.TimeoutExpired:
                failures.append((trial, how, chosen, args, "hung"))
                continue
            if "Traceback" in proc.stderr:
                failures.append((trial, how, chosen, args, proc.stderr[-600:]))
        readers = {
            "load_record": lambda: runs.load_record(str(run_dir)),
            "read_series": lambda: runs.read_series(str(run_dir)),
            "read_events": lambda: runs.read_events(str(run_dir / "events.jsonl")),
            "read_sites": lambda: runs.read_sites(str(run_dir)),
            "profile": lambda: profile.Reader(str(run_dir)).refresh(),
            "fallbacks": lambda: fallbacks.read(str(run_dir)),
            "precision": lambda: calibration.read(str(run_dir)),
            "ranks": lambda: torchrun.rank_records(str(run_dir)),
            "monitor metrics": lambda: MetricsFile(str(run_dir / "metrics.jsonl")).refresh(),
            "monitor events": lambda: EventsFile(str(run_dir / "events.jsonl")).refresh(),
        }
        for name, call in readers.items():
            done, result = _never_blocks(call)
            if not done or isinstance(result, Exception):
                failures.append((trial, how, chosen, name, "hung" if not done else repr(result)))
        for name in chosen:  # put the folder back as it was
            path = run_dir / name
            path.rmdir() if path.is_dir() else path.unlink()
            if name in saved:
                path.write_bytes(saved[name])
        json.loads((run_dir / "record.json").read_text())
    print(f"\n{max(3, TRIALS)} run folders with FIFOs or folders in place of files: {len(failures)} failure(s)")
    assert not failures, failures


def test_modules_whose_names_a_snapshot_leaves_out_are_not_committed_by_the_import_hook(tmp_path):
    """Module files named with a control or bidi character, or not UTF-8, imported through the
    hook: each runs as written with one escaped warning, and no hook branch holds the name (the
    hook committed them, so ``scalebox log``/``diff`` had to show names a snapshot refuses)."""
    rng = random.Random(47)
    failures = []
    for trial in range(max(2, TRIALS // 2)):
        root = tmp_path / f"proj{trial}"
        (root / "names").mkdir(parents=True)
        (root / "names" / "__init__.py").write_text("")
        body = "def f(opt, loss):\n    loss.backward()\n    opt.step()\n"
        picked = rng.sample(ODD_CHARS, k=3)
        stems = [f"m{i}{char}x" for i, (char, _) in enumerate(picked)] + [os.fsdecode(b"m_\xe9\xff")]
        for stem in stems:
            with open(os.path.join(os.fsencode(root / "names"), os.fsencode(stem) + b".py"), "w") as fh:
                fh.write(body)
        (root / "names" / "plain.py").write_text(body)
        (root / "main.py").write_text("import importlib, os\n"
                                      "for n in sorted(os.listdir('names')):\n"
                                      "    if n.endswith('.py') and '\\n' not in n and n != '__init__.py':\n"
                                      "        importlib.import_module('names.' + n[:-3])\n"
                                      "print('done')\n")
        Project.init(str(root))
        proc = subprocess.run([sys.executable, "-m", "scalebox_cst", "main.py"], cwd=root, capture_output=True,
                              timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
        names = subprocess.run(["git", "--git-dir", str(root / ".scalebox" / "store.git"), "log", "--all", "--name-only",
                                "--format=", "-z"], capture_output=True, check=True).stdout.split(b"\0")
        bad = [n for n in names if n.startswith(b"names/") and n not in (b"names/__init__.py", b"names/plain.py")]
        said = proc.stderr.decode("utf-8", "replace")
        if proc.returncode != 0 or b"done" not in proc.stdout or bad or "Traceback" in said:
            failures.append((trial, proc.returncode, bad, said[-600:]))
        elif b"names/plain.py" not in names or "\x1b" in said or "\u202e" in said or "\u2066" in said:
            failures.append((trial, "plain.py not committed, or a raw control character in the warnings", said[-600:]))
    print(f"\n{max(2, TRIALS // 2)} projects with oddly named modules under the hook: {len(failures)} failure(s)")
    assert not failures, failures


def test_a_fifo_or_folder_in_the_users_cache_never_hangs_a_command(tmp_path, monkeypatch):
    """The engine's per-user cache (``runtime.backend.cache_dir``: the transforms' versions, the
    backend probe's answer) holding a FIFO or a folder where a file was: ``scalebox status`` ends
    in time and the answer is made again and written back as a file (a plain ``open`` of the FIFO
    hung every ``status`` and ``run``)."""
    import importlib.util

    from scalebox_cst import catalog
    from scalebox_cst.runtime import backend

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text("print('hi')\n")
    scalebox("init", cwd=root)
    scalebox("rewrite", ".", cwd=root)  # a branch: status compares its pipeline with the config's
    versions = catalog._path()
    os.makedirs(os.path.dirname(versions), exist_ok=True)
    probe = os.path.join(backend.cache_dir(), f"backend-{backend._probe_key(importlib.util.find_spec('torch'))}.json")
    failures = []
    for how in ("fifo", "folder"):
        for path in (versions, probe):
            if os.path.isdir(path):
                os.rmdir(path)
            elif os.path.lexists(path):
                os.remove(path)
            os.mkfifo(path) if how == "fifo" else os.mkdir(path)
        try:
            proc = scalebox("status", cwd=root, check=False, env={"XDG_CACHE_HOME": str(tmp_path / "cache")}, timeout=60)
        except subprocess.TimeoutExpired:
            failures.append((how, "status hung"))
            continue
        if proc.returncode != 0 or "Traceback" in proc.stderr:
            failures.append((how, proc.returncode, proc.stderr[-400:]))
        finished, answer = _never_blocks(lambda: backend._cached_detect(importlib.util.find_spec("torch")), 120)
        if not finished or isinstance(answer, BaseException):
            failures.append((how, "backend probe", "hung" if not finished else repr(answer)))
        if how == "fifo" and not (os.path.isfile(versions) and os.path.isfile(probe)):
            failures.append((how, "not written again as files"))


def test_a_command_started_in_a_deleted_folder_is_one_line(tmp_path):
    """The shell's folder was deleted (``rm -rf`` of a build folder in another terminal) before a
    command ran: every relative path, ``.`` included, raised FileNotFoundError from
    ``os.path.abspath``, a traceback. Now one line, status 1; absolute paths still work there."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text(TRAIN_PY)
    (root / "helpers.py").write_text(HELPERS_PY)
    scalebox("rewrite", str(root), "--backend", "cpu", env={"PYTHONPATH": ROOT})
    cli = [sys.executable, "-c", "from scalebox_cst.cli import main; main()"]
    watch = [sys.executable, "-c", "from scalebox_cst.cli import watch_main; watch_main()"]
    hook = [sys.executable, "-m", "scalebox_cst"]
    failures = []
    cases = [[*cli, "log"], [*cli, "status"], [*cli, "rewrite", "."], [*cli, "run", "train.py"], [*cli, "diff"],
             [*cli, "init"], [*cli, "watch", "."], [*watch, "."], [*hook, "train.py"]]
    for number, argv in enumerate(cases):
        gone = tmp_path / f"gone{number}"
        gone.mkdir()
        proc = subprocess.run(["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", str(gone), *argv],
                              capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT))
        lines = proc.stderr.strip().splitlines()
        if not (proc.returncode == 1 and len(lines) == 1 and "current folder no longer exists" in lines[0]):
            failures.append((argv[2:], proc.returncode, proc.stderr[-300:]))
    gone = tmp_path / "gone_abs"
    gone.mkdir()
    (root / "helpers.py").write_text(HELPERS_PY + "# changed\n")
    proc = subprocess.run(["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", str(gone), *cli, "rewrite", str(root)],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT))
    if proc.returncode != 0 or "run/0002" not in proc.stdout:
        failures.append(("rewrite ABSOLUTE", proc.returncode, proc.stderr[-300:]))
    print(f"\n{len(cases) + 1} commands in a deleted folder: {len(failures)} failure(s)")
    assert not failures, failures


def test_a_store_deleted_under_the_watcher_is_made_again_for_the_next_save(tmp_path):
    """``git clean -xdf`` or ``rm -r .scalebox`` while ``scalebox watch`` runs: the next save
    says once that the store was deleted and is committed to a new one (each save failed with
    libgit2's "failed to create temporary file ..." line, a new one each time, and was lost)."""
    import shutil

    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text(TRAIN_PY)
    (root / "helpers.py").write_text(HELPERS_PY)
    Project.init(str(root))
    project = Project(str(root), backend="cpu")
    said = []
    watcher = Watcher(project, debounce=0.05, echo=said.append)
    watcher.start()
    try:
        shutil.rmtree(root / ".scalebox")
        marker = "X = 2  # saved after the store was deleted\n"
        (root / "helpers.py").write_text(marker)
        assert newest_branch_holds(watcher, project, "helpers.py", marker.encode(), timeout=15), said
        assert sum("was deleted while watching" in line for line in said) == 1, said
        assert not any("failed to create" in line for line in said), said
    finally:
        watcher.close()


def test_python_m_scalebox_cst_names_what_its_script_is_when_it_is_no_file(tmp_path):
    """``python -m scalebox_cst SCRIPT`` where SCRIPT is a FIFO or a folder says so (it said "no
    such file", which sent the user looking for a typo), and never opens the FIFO."""
    os.mkfifo(tmp_path / "fifo.py")
    (tmp_path / "folder.py").mkdir()
    expected = {"fifo.py": "a FIFO, not a regular file", "folder.py": "a folder, not a regular file", "absent.py": "no such file"}
    for name, said in expected.items():
        proc = subprocess.run([sys.executable, "-m", "scalebox_cst", name], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert proc.returncode == 2 and proc.stderr.strip() == f"scalebox: {name}: {said}", (name, proc.stderr)


def test_a_run_whose_folder_the_script_deleted_does_not_say_where_its_record_is(tmp_path):
    """A script that deleted its own run folder (a cleanup of ``.scalebox/runs`` by glob) ended
    with "ok in 0.4s; record in <that folder>", a folder that no longer existed. The last line
    now says there is no record and why; a run that kept its folder still says where it is."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "keep.py").write_text("print('kept')\n")
    (root / "clean.py").write_text(
        "import glob, shutil\nfor d in glob.glob('.scalebox/runs/run/*/*/'):\n    shutil.rmtree(d)\nprint('cleaned')\n")
    scalebox("init", cwd=root)
    kept = scalebox("run", "keep.py", cwd=root, check=False)
    last = kept.stderr.strip().splitlines()[-1]
    assert kept.returncode == 0 and "; record in " in last and os.path.isfile(last.split("; record in ")[1] + "/record.json")
    proc = scalebox("run", "clean.py", cwd=root, check=False)
    last = proc.stderr.strip().splitlines()[-1]
    assert "cleaned" in proc.stdout and "record in" not in last, proc.stderr
    assert "no record: its folder" in last and last.endswith("was deleted"), last


def test_json_nested_too_deeply_in_a_run_folder_or_the_state_is_skipped_or_one_line(tmp_path):
    # a line `[[[...]]]` 100,000 deep (a script writes its run folder; a project may ship .scalebox/):
    # json raises RecursionError, which is no ValueError: `scalebox profile` and `compare` were tracebacks
    from scalebox_cst.jsonlines import parse

    (tmp_path / "train.py").write_text("for i in range(3):\n    print(f'step={i} reward={i}')\n")
    scalebox("init", ".", cwd=tmp_path)
    scalebox("run", "train.py", cwd=tmp_path)
    deep = b"[" * 100_000 + b"]" * 100_000 + b"\n"
    run_dir = next((tmp_path / ".scalebox" / "runs").glob("run/*/*"))
    for name in ("metrics.jsonl", "events.jsonl", "profile.jsonl"):
        with open(run_dir / name, "ab") as fh:
            fh.write(deep)
    damage = {}
    assert parse([b'{"a": 1}', deep.strip()], "metrics.jsonl", damage) == [{"a": 1}]
    assert damage == {"metrics.jsonl": 1}
    for args in (("profile",), ("compare", "run/0001", "run/0001"), ("log",)):
        proc = scalebox(*args, cwd=tmp_path, check=False)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr[-800:])
    (tmp_path / ".scalebox" / "rollback-journal.json").write_bytes(deep)
    proc = scalebox("status", cwd=tmp_path, check=False)
    assert "Traceback" not in proc.stderr and "rollback journal" in proc.stderr and "remove it" in proc.stderr, proc.stderr[-800:]
    assert len(proc.stderr.strip().splitlines()) == 1


def _rewritten_once(root):
    """A project of one script, rewritten once (branch run/0001); its store, opened by pygit2."""
    import pygit2

    (root / "train.py").write_text("print('step=1 reward=2')\n")
    scalebox("init", ".", cwd=root)
    scalebox("rewrite", ".", cwd=root)
    return pygit2.Repository(str(root / ".scalebox" / "store.git"))


def test_digits_that_are_not_ascii_in_a_branch_or_run_folder_name_are_not_numbers(tmp_path):
    # "²".isdigit() is True and int("²") a ValueError: a store holding refs/heads/run/²²²² (a shipped
    # store) made every command a traceback, a run folder ²²²² every `scalebox run`; "١٢٣٤" counted as 1234
    repo = _rewritten_once(tmp_path)
    target = repo.references["refs/heads/run/0001"].target
    for name in ("²²²²", "١٢٣٤"):
        repo.references.create(f"refs/heads/run/{name}", target)
        (tmp_path / ".scalebox" / "runs" / "run" / "0001" / name).mkdir(parents=True)
    for args in (("log",), ("status",), ("run", "--no-commit", "train.py"), ("profile", "run/0001#²")):
        proc = scalebox(*args, cwd=tmp_path, check=False)
        assert "Traceback" not in proc.stderr, (args, proc.stderr[-800:])
    assert (tmp_path / ".scalebox" / "runs" / "run" / "0001" / "0001").is_dir()  # the first run, not #1235
    (tmp_path / "train.py").write_text("print('step=1 reward=3')\n")
    assert scalebox("rewrite", ".", cwd=tmp_path).stdout.startswith("run/0002 ")  # not run/1235


def _young_unreachable_store(root):
    """A store whose rewrite cache left unreachable trees and commits written just now (as a
    writer's in-flight objects are): the grace period must keep them."""
    from scalebox_cst.store import Store

    store = Store.init(str(root))
    for i in range(4):
        files = {"train.py": b"step = %d\n" % i}
        source, _ = store.snapshot(files, f"save {i}")
        store.commit_rewrite(source, files, "rewrite", f"save {i}", {"files": []}, "fp")
        store.cache_put_many([(Store.blob_id(files["train.py"]), "fp", b"# %d\n" % i, {"status": "rewritten"})])
    store.close()
    objects = root / ".scalebox" / "store.git" / "objects"
    return sorted(str(p) for p in objects.glob("??/*"))


def test_a_grace_period_that_is_no_number_removes_nothing(tmp_path):
    # click's FloatRange(min=1/24) let 'nan' through (every comparison with nan is false), and the
    # pass kept an object only when `mtime >= now - grace`: `scalebox gc --grace-days nan` removed
    # every unreachable tree and commit however young, a concurrent writer's in-flight ones too
    from scalebox_cst.store import Store, gc

    loose = _young_unreachable_store(tmp_path)
    for days in ("nan", "NaN", "inf", "1e400", "-inf"):
        proc = scalebox("gc", "--dry-run", "--grace-days", days, cwd=tmp_path, check=False)
        assert proc.returncode != 0 and "finite" in proc.stderr and "Traceback" not in proc.stderr, (days, proc.stderr)
    # float() reads Arabic-Indic and fullwidth digits too: a number no one typed meaning it
    for days in ("\u0661\u0664", "\uff11\uff14"):
        proc = scalebox("gc", "--dry-run", "--grace-days", days, cwd=tmp_path, check=False)
        assert proc.returncode != 0 and "ASCII" in proc.stderr and "Traceback" not in proc.stderr, (days, proc.stderr)
    report = gc.collect(Store.open(str(tmp_path)), dry_run=True, grace_s=float("nan"))
    assert report.pruned == 0 and report.kept_young > 0, report.line()
    gc.collect(Store.open(str(tmp_path)), grace_s=float("nan"))
    left = sorted(str(p) for p in (tmp_path / ".scalebox" / "store.git" / "objects").glob("??/*"))
    packed = Store.open(str(tmp_path))
    assert all(packed.repo.get(os.path.basename(os.path.dirname(p)) + os.path.basename(p)) is not None for p in loose)
    assert left  # the young unreachable trees and commits stay loose, not removed


SETTINGS = [  # variable, module and name that reads it, its default as read
    ("SCALEBOX_IMPORT_CACHE_MB", "scalebox_cst.importhook.cache", "LIMIT_BYTES", 256 << 20),
    ("SCALEBOX_TELEMETRY_HZ", "scalebox_cst.runtime.telemetry.sites", "HZ", 25),
    ("SCALEBOX_TELEMETRY_EVERY", "scalebox_cst.runtime.telemetry", "EVERY", 2),
    ("SCALEBOX_PROFILE_EVERY", "scalebox_cst.runtime.telemetry.profile", "EVERY", 10),
    ("SCALEBOX_TARGET_UPDATE_NUMBA_AFTER", "scalebox_cst.runtime.target_update", "NUMBA_AFTER", -1),
]


def test_a_numeric_setting_that_is_no_number_is_one_line_and_the_default(tmp_path):
    # SCALEBOX_IMPORT_CACHE_MB=inf was an OverflowError (int(inf)) wherever the import cache loaded,
    # -5 a cache of one byte, 'abc' silently 256; SCALEBOX_TELEMETRY_HZ=abc killed the user's run
    # (a ValueError as the telemetry loaded in its process), inf made the sampler spin, nan wait(nan)
    rng = random.Random(11)
    bad = ["abc", "nan", "inf", "-inf", "1e400", "-5", "\u0661\u0662", "0x10", "1e30"]
    for trial in range(TRIALS * 2):
        name, module, attr, default = rng.choice(SETTINGS)
        value = rng.choice(bad)
        proc = subprocess.run([sys.executable, "-c", f"import {module} as m; print(m.{attr})"], capture_output=True,
                              text=True, timeout=120, env={**os.environ, name: value, "PYTHONPATH": ROOT})
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (name, value, proc.stderr[-800:])
        assert float(proc.stdout.split()[-1]) == default, (name, value, proc.stdout)
        said = [line for line in proc.stderr.splitlines() if name in line]
        assert len(said) == 1 and said[0].startswith(f"scalebox: {name}=") and "using" in said[0], (name, value, proc.stderr)
    (tmp_path / "train.py").write_text("for i in range(3):\n    print(f'step={i} reward={i}')\n")
    scalebox("init", ".", cwd=tmp_path)
    proc = scalebox("run", "train.py", cwd=tmp_path, check=False, env={"SCALEBOX_TELEMETRY_HZ": "abc"})
    assert proc.returncode == 0 and " ok in " in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-800:]


def test_a_stored_report_of_another_shape_is_one_line_or_left_out(tmp_path):
    # a report note is JSON the engine wrote, but a shipped or damaged store can hold any JSON there:
    # {"files": [{"path": ...}]} made `scalebox diff` a KeyError traceback ('status'), [1] made
    # `scalebox log` an AttributeError (.get) and the monitor's branch list an error
    import json as _json

    import pygit2

    from scalebox_cst.monitor.api import Monitor

    repo = _rewritten_once(tmp_path)
    commit = repo.references["refs/heads/run/0001"].target
    sig = pygit2.Signature("t", "t@t")
    shapes = [[1], "text", {"files": 5}, {"files": [1]}, {"files": [{"path": "train.py"}]},
              {"files": [{"path": "train.py", "status": "rewritten", "sites": [{"transform": "t"}]}]},
              {"files": [{"path": "train.py", "status": "rewritten", "sites": [{"transform": ["t"], "line": "x", "end_line": 1,
                                                                                 "action": "rewritten", "reason": "r"}]}]}]
    for shape in shapes:
        repo.create_note(_json.dumps(shape), sig, sig, str(commit), "refs/notes/scalebox-reports", True)
        for args in (("diff",), ("diff", "run/0001"), ("log",), ("log", "--json")):
            proc = scalebox(*args, cwd=tmp_path, check=False)
            assert "Traceback" not in proc.stderr, (shape, args, proc.stderr[-800:])
            if proc.returncode:
                assert len(proc.stderr.strip().splitlines()) == 1 and "report of run/0001" in proc.stderr, (shape, args, proc.stderr)
        monitor = Monitor(str(tmp_path))
        assert [b["name"] for b in monitor.branches()["branches"] if b["name"] == "run/0001"], shape
        monitor.diff("run/0001")


COPIED_MODULE = (
    "def train(model, opt, x):\n"
    "    loss = model(x).sum()\n"
    "    opt.zero_grad()\n"
    "    loss.backward()\n"
    "    opt.step()\n"
    "    return loss\n"
)
SITES_SHOWN = (
    "import pkg1.u, pkg2.u\n"
    "def consts(code):\n"
    "    out = []\n"
    "    for c in code.co_consts:\n"
    "        if isinstance(c, str) and '.py:' in c:\n"
    "            out.append(c)\n"
    "        elif hasattr(c, 'co_consts'):\n"
    "            out += consts(c)\n"
    "    return out\n"
    "print(consts(pkg1.u.train.__code__), consts(pkg2.u.train.__code__))\n"
)


def _copied_module_project(root):
    for pkg in ("pkg1", "pkg2"):
        (root / pkg).mkdir()
        (root / pkg / "__init__.py").write_text("")
        (root / pkg / "u.py").write_text(COPIED_MODULE)
    (root / "main.py").write_text(SITES_SHOWN)
    scalebox("init", ".", cwd=root)


def test_two_files_of_the_same_bytes_each_get_their_own_rewrite(tmp_path):
    # the rewrite cache was keyed by the source blob alone, but a rewrite names its file
    # (site='pkg1/u.py:8', by which guard events, sites.json, the profile and the NaN locator go):
    # a copied utils.py was served the first copy's rewrite, in `rewrite`, `run` and the import hook
    _copied_module_project(tmp_path)
    scalebox("rewrite", "pkg2/u.py", cwd=tmp_path)
    scalebox("rewrite", ".", cwd=tmp_path)
    shown = scalebox("diff", cwd=tmp_path).stdout
    assert "site='pkg1/u.py:5'" in shown and "site='pkg2/u.py:5'" in shown, shown
    for _ in range(2):  # cold, then warm from .scalebox/pycache
        proc = subprocess.run([sys.executable, "-m", "scalebox_cst", "main.py"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
        assert proc.returncode == 0, proc.stderr[-800:]
        assert proc.stdout.strip().splitlines()[-1] == "['pkg1/u.py:5'] ['pkg2/u.py:5']", proc.stdout


def test_an_import_cache_entry_of_another_module_reached_through_a_folder_link_is_a_miss(tmp_path, writes_caches):
    # .scalebox/pycache/pkg2 -> pkg1 (a folder link, allowed there: statedir): pkg2/u.py's entry
    # is then pkg1/u.py's, which passes the source-hash and MAC checks (same bytes, this user's
    # key) and served pkg1's rewrite for pkg2; an entry names the module it was written for
    _copied_module_project(tmp_path)
    run = [sys.executable, "-m", "scalebox_cst", "main.py"]
    env = {**os.environ, "PYTHONPATH": ROOT}
    subprocess.run(run, cwd=tmp_path, capture_output=True, timeout=300, env=env, check=True)
    cache = tmp_path / ".scalebox" / "pycache"
    shutil.rmtree(cache / "pkg2")
    (cache / "pkg2").symlink_to("pkg1")
    for _ in range(2):
        proc = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-800:]
        assert proc.stdout.strip().splitlines()[-1] == "['pkg1/u.py:5'] ['pkg2/u.py:5']", proc.stdout


def test_numbers_beyond_a_float_in_a_run_folder_are_skipped_not_tracebacks(tmp_path):
    # a script writes its run folder (and a .scalebox/ may come with the project): a JSON integer
    # of 400 digits made math.isfinite / float() raise OverflowError in the record's type check,
    # the series, the profile and the monitor's event times, and a step of Infinity in
    # metrics.jsonl (int(inf)) took `scalebox run` itself down at its end, its record left 'lost';
    # "sites": 5 was iterated, a "source_commit" of [1] went to pygit2 (the fifth fault campaign)
    import json as _json

    from scalebox_cst import runs
    from scalebox_cst.monitor.api import Monitor

    huge = "1" + "0" * 400
    (tmp_path / "train.py").write_text(
        "import os\n"
        "for i in range(3):\n"
        "    print(f'step={i} reward={i}', flush=True)\n"
        "open(os.environ['SCALEBOX_METRICS_FILE'], 'a').write("
        "'{\"name\": \"reward\", \"step\": Infinity, \"value\": 1}\\n'"
        f"'{{\"name\": \"reward\", \"step\": 4, \"value\": {huge}}}\\n'"
        f"'{{\"name\": \"reward\", \"step\": 5, \"value\": 2, \"time\": {huge}}}\\n')\n"
    )
    scalebox("init", ".", cwd=tmp_path)
    proc = scalebox("run", "train.py", cwd=tmp_path, check=False)
    assert proc.returncode == 0 and " ok in " in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-800:]
    run_dir = next((tmp_path / ".scalebox" / "runs").glob("run/*/*"))
    points = [p for p in runs.read_metrics(str(run_dir / "metrics.jsonl"))[0] if p.name == "reward"]
    assert (4, float("inf")) in [(p.step, p.value) for p in points] and 5 in [p.step for p in points], points
    record = _json.loads((run_dir / "record.json").read_text())
    record["status"] = "ok"
    text = _json.dumps({**record, "source_commit": [1]})
    for key in ("started", "ended", "wall_time"):
        text = text.replace(f'"{key}": ', f'"{key}": {huge}, "_{key}": ', 1)
    (run_dir / "record.json").write_text(text)
    with open(run_dir / "events.jsonl", "a") as fh:
        fh.write(f'{{"time": {huge}, "kind": "note", "message": "m"}}\n')
    with open(run_dir / "profile.jsonl", "a") as fh:
        fh.write(f'{{"hz": {huge}, "rows": [["train.py", 3, "other", 1, 0.1, 0.1, 1]]}}\n')
    (run_dir / "sites.json").write_text('{"sites": 5}')
    for args in (("log",), ("log", "--json"), ("status", "--json"), ("compare", "run/0001", "run/0001"), ("profile",),
                 ("profile", "run/0001#1", "--json")):
        proc = scalebox(*args, cwd=tmp_path, check=False)
        assert "Traceback" not in proc.stderr, (args, proc.stderr[-800:])
    (run_dir / "sites.json").write_text('{"sites": [{"path": "train.py", "line": Infinity, "transform": "t", "time_s": %s}]}' % huge)
    monitor = Monitor(str(tmp_path))
    monitor.branches(), monitor.events(limit=50), monitor.runs("run/0001"), monitor.sites("run/0001")
    monitor.series("reward", ["run/0001"])
    assert scalebox("compare", "run/0001", "run/0001", cwd=tmp_path, check=False).returncode in (0, 1)


def test_rank_files_of_another_shape_are_read_as_none(tmp_path):
    # torchrun's rank.json and failure.json are written in the training process (the user's
    # script): a rank.json of [1] made `info["failure"] = ...` a TypeError at the run's end, a
    # failure time of [1] made min() compare a list with a float, a log name holding a NUL made
    # realpath raise, a rank.json without "rank" a KeyError in the record's first error line
    from scalebox_cst.runner import torchrun

    ranks = tmp_path / torchrun.RANKS
    shapes = {"0": ("[1]", '{"time": 1.0, "error": "e0"}'), "1": ('{"rank": 1, "log": "a\\u0000b"}', '{"time": [1], "error": "e1"}'),
              "2": ('{"log": "x"}', '{"time": 0.5, "error": "e2"}'), "3": ('{"rank": 3}', "5"),
              "4": ('{"rank": 4}', '{"time": Infinity, "error": "e4"}')}
    for name, (info, failure) in shapes.items():
        (ranks / name).mkdir(parents=True)
        (ranks / name / torchrun.RANK_INFO).write_text(info)
        (ranks / name / torchrun.FAILURE).write_text(failure)
    found = torchrun.rank_records(str(tmp_path))
    assert len(found) == 4 and all(isinstance(r, dict) for r in found)
    failed = torchrun.first_failure(found)
    assert failed is not None and torchrun.failed_first_line(failed, "1").startswith("rank ")
    for rank in found:
        torchrun.rank_log_lines(str(tmp_path), rank)


def test_gc_never_removes_through_a_link_a_shipped_store_holds(tmp_path):
    # a project may come with its .scalebox/ (git stores links): objects/pack -> a folder made
    # gc remove every file there older than an hour whose name was not pack-* (the project's own
    # files with 'objects/pack -> ../../..'), objects/02 -> ../../../.git/objects/02 moved the
    # user's git objects into the store's pack (git fsck: missing blob), and a FIFO planted as a
    # loose object blocked the pass, holding the store's lock
    import zlib

    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("x = 1\n")
    scalebox("init", ".", cwd=project)
    scalebox("rewrite", ".", cwd=project)
    objects = project / ".scalebox" / "store.git" / "objects"
    fan = next(f"{n:02x}" for n in range(256) if not (objects / f"{n:02x}").exists())  # none of the store's own
    outside = tmp_path / "outside"
    (outside / fan).mkdir(parents=True)
    body = b"precious\n"
    blob = zlib.compress(b"blob %d\0" % len(body) + body)
    name = "a819f21d4c6b8b8b26c4a840bfd54a99872bc1"
    (outside / fan / name).write_bytes(blob)
    (outside / "notes.txt").write_text("mine\n")
    old = time.time() - 2 * 86400
    for path in (outside / fan / name, outside / "notes.txt"):
        os.utime(path, (old, old))
    shutil.rmtree(objects / "pack")  # empty (nothing packed yet); git keeps no empty folder, so a copied store may lack it:
    # gc then packed, removed the loose copies and failed folding the refs ('object not found')
    for link, target in (("pack", outside), (fan, outside / fan)):
        (objects / link).symlink_to(target)
        proc = scalebox("gc", cwd=project, check=False)
        assert proc.returncode == 1 and "is a symbolic link" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert (outside / "notes.txt").exists() and (outside / fan / name).read_bytes() == blob
        (objects / link).unlink()
    (objects / fan).mkdir()
    os.mkfifo(objects / fan / ("0" * 38))
    proc = scalebox("gc", "--grace-days", "0.05", cwd=project, check=False, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert scalebox("log", cwd=project).returncode == 0
    # a moved .scalebox (a link to a folder on a larger disk) is the user's: gc works through it
    moved = tmp_path / "disk" / ".scalebox"
    moved.parent.mkdir()
    os.remove(objects / fan / ("0" * 38))
    shutil.move(str(project / ".scalebox"), str(moved))
    (project / ".scalebox").symlink_to(moved)
    proc = scalebox("gc", cwd=project, check=False)
    assert proc.returncode == 0 and "scalebox gc (done)" in proc.stdout, proc.stderr


def test_the_import_cache_sweep_removes_only_its_own_files_through_a_linked_folder(tmp_path):
    # statedir allows a link to a folder in .scalebox/ (a larger disk), and the sweep walked
    # whatever .scalebox/pycache reached: a project that came with `.scalebox/pycache -> ../data`
    # had data/'s oldest files removed (every file once the folder held more than the limit)
    from scalebox_cst import tmpnames
    from scalebox_cst.importhook import cache

    data = tmp_path / "data"
    data.mkdir()
    old = time.time() - 3 * 86400
    mine = [data / f"file{i}.bin" for i in range(5)] + [data / "notes.123.tmp", data / "run.pyc"]
    for path in mine:
        path.write_bytes(os.urandom(20000))
        os.utime(path, (old, old))
    entry = data / "pkg" / ("m" * 300)
    ours = tmpnames.fit(str(entry.name), keep=".cpython-311-scalebox-0123456789abcdef.pyc")
    (data / "pkg").mkdir()
    for name in (ours, "fingerprint-0123456789abcdef", tmpnames.stem(ours) + ".77-12.tmp", "x.cpython-311-scalebox-0123456789abcdef.pyc.4.tmp"):
        (data / "pkg" / name).write_bytes(os.urandom(30000))
        os.utime(data / "pkg" / name, (old, old))
    (tmp_path / ".scalebox").mkdir()
    (tmp_path / ".scalebox" / "pycache").symlink_to("../data")
    cache.sweep(str(tmp_path / ".scalebox" / "pycache"), limit=10000)
    assert all(path.exists() for path in mine)
    assert os.listdir(data / "pkg") == []  # the cache's own entries, memo and temporaries went


def test_an_event_line_is_written_whole_after_a_short_write(tmp_path, monkeypatch):
    # os.write may write fewer bytes than asked (a nearly full disk, a signal): append_jsonl wrote
    # once and dropped the rest of the line, and the next event was glued to the half line
    from scalebox_cst import runs

    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data[:7])))
    path = str(tmp_path / "events.jsonl")
    runs.append_event(path, "branch_created", "run/0001: a long enough message")
    runs.append_event(path, "branch_created", "run/0002")
    monkeypatch.setattr(os, "write", real)
    events, _ = runs.read_events(path)
    assert [e["message"] for e in events] == ["run/0001: a long enough message", "run/0002"]


def test_gc_never_removes_a_branch_log_through_a_link(tmp_path):
    # gc removes the reflogs that record only a branch's creation (logs/refs/heads/run/NNNN): a
    # shipped store's logs/refs/heads/run -> a folder of the user's is refused like objects/pack
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("x = 1\n")
    scalebox("init", ".", cwd=project)
    scalebox("rewrite", ".", cwd=project)
    logs = project / ".scalebox" / "store.git" / "logs" / "refs" / "heads" / "run"
    outside = tmp_path / "outside"
    shutil.copytree(logs, outside)
    shutil.rmtree(logs)
    logs.symlink_to(outside)
    before = {p.name: p.read_bytes() for p in outside.iterdir()}
    proc = scalebox("gc", cwd=project, check=False)
    assert proc.returncode == 1 and "is a symbolic link" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before
