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

from importhook_project import CONFIG, _fresh_import, proj  # noqa: F401 (proj: the fixture)
from scalebox_cst.importhook import cache as hook_cache
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


def test_a_monitor_polled_and_abandoned_holds_no_more(project):
    """150 requests (kept alive and not), 10 connections left half-open then closed: the
    monitor's threads and file descriptors come back to what they were, and no memory is kept
    per request (each /api/branches kept one string per branch: pygit2's lookup_reference;
    +1,790 blocks over 150 requests before)."""
    import http.client
    import socket
    import sys
    import time

    from scalebox_cst.monitor.api import Monitor
    from scalebox_cst.monitor.server import MonitorServer

    store = Project.init(str(project))[0].store
    for i in range(30):
        source, _ = store.snapshot({"a.py": b"x = %d\n" % i}, "save")
        store.commit_rewrite(source, {"a.py": b"x = %d  # r\n" % i}, "rewrite", "(no sites)", {"files": []}, "fp")
    server = MonitorServer(Monitor(str(project)), port=0, request_timeout=2.0)
    thread = server.start_background()
    port = server.server_address[1]
    paths = ["/api/branches", "/api/events?limit=20", "/api/branches", "/api/runs?branch=run/0003", "/api/branches", "/app.js"]

    def poll(count: int) -> None:
        conn, idle = None, []
        for i in range(count):
            if conn is None or i % 5 == 0:
                if conn is not None:
                    conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", paths[i % len(paths)])
            conn.getresponse().read()
            if i % 15 == 0:
                sock = socket.create_connection(("127.0.0.1", port))
                sock.sendall(b"GET /api/branches HTTP/1.1\r\n")  # never finished
                idle.append(sock)
        conn.close()
        for sock in idle:
            sock.close()

    try:
        poll(60)
        time.sleep(0.3)
        fds, threads, blocks = _fds(), threading.active_count(), sys.getallocatedblocks()
        poll(150)
        deadline = time.monotonic() + 5
        while threading.active_count() > threads and time.monotonic() < deadline:
            time.sleep(0.05)
        gc.collect()
        assert threading.active_count() <= threads
        assert _fds() <= fds
        assert sys.getallocatedblocks() - blocks < 300  # was 30 names per /api/branches (75 of them)
    finally:
        server.shutdown()
        server.server_close()
        server.monitor.close()
        thread.join(timeout=5)


def _files(folder):
    return {p: p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def _age(folder, seconds=2.0):
    """Move every file of ``folder`` ``seconds`` into the past: what a step writes or touches next
    is then later than all before it, even where a file system keeps mtimes in coarse ticks (CI
    saw a hit's touch and the next step's write share one, and the sweep took the touched entry)."""
    for p in folder.rglob("*"):
        if p.is_file():
            st = p.stat()
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns - int(seconds * 1e9)))


def test_the_import_cache_keeps_its_bound_least_recently_used_first(proj, monkeypatch):
    """Each pipeline fingerprint (here: each edit of max_norm) wrote a new set of cache entries and
    a fingerprint memo, none ever removed (+11 kB per module per config: 20 modules, 6 configs,
    1.34 MB). Bounded: what the folder holds stays within the limit (plus one write, an eighth of
    it at most between sweeps), an entry used again outlives newer ones not used, a temporary file a
    killed writer left goes, and a damaged entry does not stop the sweep."""
    root, pkg = proj
    cache = root / ".scalebox" / "pycache"
    Project.init(str(root))
    _fresh_import(root, pkg)
    (first,) = [p for p in _files(cache) if p.suffix == ".pyc"]
    entry = first.stat().st_size
    monkeypatch.setattr(hook_cache, "LIMIT_BYTES", 4 * entry, raising=False)
    monkeypatch.setattr(hook_cache, "_WRITTEN", {}, raising=False)
    killed = first.parent / (first.name + ".1234.tmp")  # what a writer of this entry killed mid-write leaves
    killed.write_bytes(b"x" * 100)
    os.utime(killed, (1, 1))
    (cache / "notes.pyc.1234.tmp").write_bytes(b"x" * 100)  # not a name the cache writes: never its to remove
    os.utime(cache / "notes.pyc.1234.tmp", (1, 1))
    (cache / pkg / "damaged.cpython-311-scalebox-x.pyc").write_bytes(b"\x00" * 10)
    for i in range(2, 9):
        (root / "scalebox.toml").write_text(CONFIG.format(max_norm=float(i)))
        _age(cache)
        _fresh_import(root, pkg)
        (root / "scalebox.toml").write_text(CONFIG.format(max_norm=1.0))
        _age(cache)
        _fresh_import(root, pkg)  # a hit on the first config's entry: used again
        assert sum(_files(cache).values()) <= 4 * entry + entry, i
    assert first.exists()  # used after every other entry was written
    assert not killed.exists() and (cache / "notes.pyc.1234.tmp").exists()
    assert len([p for p in _files(cache) if p.suffix == ".pyc"]) < 7


def test_a_monitor_holds_the_events_of_the_runs_it_shows_not_of_every_run(project, monkeypatch):
    """The monitor kept an events reader per run it ever listed (+5.1 to 5.8 kB a run of three
    events, 1,600 runs: 1,601 readers), and the report of every branch it ever listed. It reads
    the events files newest first (by mtime) and stops where no older file could hold one of the
    newest ``limit``; the readers kept are bounded; a branch deleted takes its report along."""
    import time

    from scalebox_cst import runs
    from scalebox_cst.monitor import api
    from scalebox_cst.monitor.api import Monitor

    monkeypatch.setattr(api, "EVENTS_FILES", 12, raising=False)
    store = Project.init(str(project))[0].store
    source, _ = store.snapshot({"a.py": b"x = 1\n"}, "save")
    for i in range(3):
        store.commit_rewrite(source, {"a.py": b"x = %d\n" % i}, "rewrite", "(no sites)", {"files": []}, "fp")
    monitor = Monitor(str(project), runs_ttl=0)
    assert len(monitor.branches()["branches"]) == 3
    start = time.time() - 10_000
    written = []
    for i in range(300):
        branch = f"run/000{1 + i % 3}"
        number, folder = runs.allocate_run(str(project), branch)
        runs.write_record(folder, {"branch": branch, "run": number, "status": "ok", "pid": os.getpid()})
        path = os.path.join(folder, runs.EVENTS)
        for k in range(3):
            stamp = round(start + 10 * i + k, 3)
            runs.append_jsonl(path, {"time": stamp, "kind": "note", "message": f"{branch}#{number} {k}"})
            written.append((stamp, f"{branch}#{number}"))
        os.utime(path, (start + 10 * i + 3, start + 10 * i + 3))
        if i % 50 == 49:
            got = monitor.events(limit=20)["events"]
            assert [(e["time"], e["run"]) for e in got] == sorted(written, reverse=True)[:20]
            assert len(monitor._events) <= 12, i  # was one per run listed (the 20 newest events: 7 or 8 files)
    assert monitor.events(limit=5, since=start + 10 * 150)["events"][-1]["time"] > start + 10 * 150
    store.repo.references.delete("refs/heads/run/0002")
    assert len(monitor.branches()["branches"]) == 3  # its runs remain, shown as runs-only
    assert len(monitor._reports) == 2  # was 3: a deleted branch's report stayed
    monitor.close()


def _cache_entries(store, ref):
    """Entries in a rewrite cache's tree (each is a rewritten blob and its signed report)."""
    stack, count = [store.repo[store.repo.references[ref].target].tree], 0
    while stack:
        for item in stack.pop():
            if item.type_str == "tree":
                stack.append(store.repo[item.id])
            elif item.name.endswith(".json"):
                count += 1
    return count


def test_the_rewrite_cache_keeps_its_bound_least_recently_used_first(project, monkeypatch):
    """Every save put one entry into the store's rewrite cache for good (300 saves: 301 entries),
    every pipeline kept its cache, and the cache's reflog a line per put. Bounded: two generations
    of at most CACHE_GENERATION entries, an entry found in the older put back among the newest,
    the caches of the 4 pipelines written last kept, the reflog dropped as the generations turn."""
    from scalebox_cst.store import cache as store_cache
    from scalebox_cst.store.common import CACHE_PREFIX
    from scalebox_cst.store.repository import Store

    monkeypatch.setattr(store_cache, "CACHE_GENERATION", 8, raising=False)
    store = Project.init(str(project))[0].store
    ref = CACHE_PREFIX + "fp"

    def put(i, fp="fp"):
        store.cache_put_many([(Store.blob_id(b"v%d\n" % i), fp, b"r%d\n" % i, {"status": "rewritten"})])

    put(0)
    for i in range(1, 60):
        put(i)
        if i % 4 == 0:  # a new process finds the first version (the user went back to it)
            reader = Store.open(str(project))
            assert reader.cache_get(Store.blob_id(b"v0\n"), "fp") is not None, i
            reader.cache_put_many([])  # what Project does after every rewrite
        assert _cache_entries(store, ref) <= 2 * 8, i
        assert len(list(store.repo.references[ref].log())) <= 8 + 1, i
    fresh = Store.open(str(project))
    assert fresh.cache_get(Store.blob_id(b"v0\n"), "fp") is not None  # used: kept
    assert fresh.cache_get(Store.blob_id(b"v59\n"), "fp") is not None  # newest: kept
    assert fresh.cache_get(Store.blob_id(b"v1\n"), "fp") is None  # not used since: gone
    for n in range(6):  # six config edits: six pipelines
        put(100 + n, fp=f"other{n}")
    caches = sorted(r for r in store.repo.references if r.startswith(CACHE_PREFIX))
    assert caches == [CACHE_PREFIX + f"other{n}" for n in range(2, 6)]


def test_the_users_cache_keeps_the_answers_used_last(tmp_path, monkeypatch):
    """The user's cache folder took one transforms-<version>-<digest>.json per engine edit or
    upgrade (110 of them in this machine's ~/.cache/scalebox_cst) and one backend-<key>.json per
    reboot or torch install, never removed, and a killed writer's .tmp for good. Kept: the 8 of
    each kind used last (a read marks one used), temporary files younger than a minute."""
    import time

    from scalebox_cst import catalog
    from scalebox_cst.runtime import backend

    monkeypatch.setenv("SCALEBOX_CACHE_DIR", str(tmp_path))
    old = time.time() - 3600
    for i in range(12):
        for kind in ("transforms-0.0.1", "backend"):
            path = tmp_path / f"{kind}-{i:04d}.json"
            path.write_text("[]")
            os.utime(path, (old + i, old + i))
    for name, age in (("transforms-x.json.1.tmp", 3600), ("transforms-y.json.2.tmp", 0)):
        (tmp_path / name).write_text("{")
        os.utime(tmp_path / name, (time.time() - age,) * 2)
    backend.read_cached(str(tmp_path / "transforms-0.0.1-0000.json"))  # the oldest, used now
    catalog._write(catalog._path(), {"grad_clip": "1"})
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("transforms-"))
    kept = ["transforms-0.0.1-0000.json"] + [f"transforms-0.0.1-{i:04d}.json" for i in range(6, 12)]
    assert names == sorted(kept + [os.path.basename(catalog._path()), "transforms-y.json.2.tmp"])
    assert len(list(tmp_path.glob("backend-*.json"))) == 12  # another kind: not counted with these
    backend.keep_newest(str(tmp_path / "backend-0011.json"))
    assert sorted(p.name for p in tmp_path.glob("backend-*.json")) == [f"backend-{i:04d}.json" for i in range(4, 12)]


def test_cache_misses_and_config_edits_keep_nothing_per_lookup(project):
    """Every rewrite-cache miss (one a save: the new version of the file) kept its entry's name,
    ~100 B, for the life of the process: pygit2 1.21 keeps the name of a tree lookup that misses
    (the ref-name leak of store.common._reference, in Tree.__getitem__); store.read_file of a
    missing path did the same. And the memory layer kept a dict per pipeline ever used."""
    import sys

    from scalebox_cst.store.repository import Store

    store = Project.init(str(project))[0].store
    source, _ = store.snapshot({"a.py": b"x = 1\n"}, "save")
    store.cache_put(Store.blob_id(b"x = 1\n"), "fp", b"x = 1  # r\n", {"status": "rewritten"})

    def lookups(start, count):
        for i in range(start, start + count):
            assert store.cache_get(Store.blob_id(b"x = %d\n" % i), "fp") is None
            assert store.read_file(source, f"gone{i}.py") is None

    lookups(10_000, 2000)  # every two-hex-digit folder name met once (kept: 256 of them at most)
    gc.collect()
    blocks = sys.getallocatedblocks()
    lookups(1000, 300)
    gc.collect()
    assert sys.getallocatedblocks() - blocks < 100  # was two strings kept per loop: +950
    for n in range(10):  # ten config edits of a watcher's life
        store.cache_get(Store.blob_id(b"y\n"), f"pipeline{n}")
    assert len(store._cache_mem) <= 4
