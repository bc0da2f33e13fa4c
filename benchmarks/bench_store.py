"""Store cost of one change event: a 100-file project (300 lines each) with one file edited.

Times the store's share of the save-to-commit budget (150 ms in all, parsing and transforms
included): snapshot, 100 cache lookups, cache put of the changed file, the rewrite commit.

    python benchmarks/bench_store.py [--files 100] [--events 30] [--dir /dev/shm]

The store is bound by file creation (each loose object and ref update is a new file), so the
figures follow the disk; ``--dir`` on a tmpfs shows the store's own CPU cost.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from scalebox_cst.store import Store

FP = "bench0fingerprnt"


def make_file(i: int, version: int) -> bytes:
    lines = [f"# module {i} version {version}", "import torch", ""]
    for k in range(297):
        lines.append(f"value_{k} = torch.zeros({k + 1}) * {i}  # line {k}")
    return ("\n".join(lines) + "\n").encode()


def rewrite(data: bytes) -> bytes:
    return data.replace(b"torch.zeros", b"torch.empty")


def report_for(path_index: int) -> dict:
    return {
        "status": "rewritten",
        "error": None,
        "sites": [
            {"transform": "grad_clip", "line": 10 + k, "end_line": 12 + k, "action": "rewritten",
             "reason": "clip_grad_norm_ inserted before optimizer.step()", "exactness": "changes-semantics"}
            for k in range(3)
        ],
    }


def loose_objects(store_path: str) -> int:
    root = os.path.join(store_path, "objects")
    return sum(len(names) for d, _, names in os.walk(root) if len(os.path.basename(d)) == 2)


def fs_floor_us(folder: str, n: int = 200) -> float:
    """Median cost of creating one small file (write to a temp name, rename): the I/O floor."""
    times = []
    for i in range(n):
        tmp, final = os.path.join(folder, f"probe{i}.tmp"), os.path.join(folder, f"probe{i}")
        t0 = time.perf_counter()
        with open(tmp, "wb") as fh:
            fh.write(b"x" * 200)
        os.replace(tmp, final)
        times.append(time.perf_counter() - t0)
    for i in range(n):
        os.unlink(os.path.join(folder, f"probe{i}"))
    return statistics.median(times) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--events", type=int, default=30)
    ap.add_argument("--dir", default=None, help="where to create the temporary project")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_store_", dir=args.dir) as project:
        paths = [f"pkg{i % 4}/sub{i % 3}/module_{i}.py" for i in range(args.files)]
        files = {p: make_file(i, 0) for i, p in enumerate(paths)}
        t0 = time.perf_counter()
        store = Store.init(project)
        tip, _ = store.snapshot(files, "initial")
        ids = {p: Store.blob_id(d) for p, d in files.items()}
        store.cache_put_many([(ids[p], FP, rewrite(files[p]), report_for(i)) for i, p in enumerate(paths)])
        store.commit_rewrite(tip, {p: rewrite(d) for p, d in files.items()}, "initial", "", {}, FP)
        first_ms = (time.perf_counter() - t0) * 1e3

        cold = Store.open(project)
        t0 = time.perf_counter()
        cold_hits = cold.cache_get_many(ids.values(), FP)
        cold_ms = (time.perf_counter() - t0) * 1e3
        assert len(cold_hits) == len(paths)

        timings: dict = {k: [] for k in ("hash", "snapshot", "lookups", "cache_put", "commit_rewrite", "total")}
        objects_per_event = []
        for event in range(1, args.events + 1):
            changed = paths[event % len(paths)]
            files[changed] = make_file(event % len(paths), event)  # the editor saved one file
            fresh = {p: bytes(d) for p, d in files.items()}  # as if re-read from disk
            before = loose_objects(store.path)
            t_start = time.perf_counter()
            ids = {p: Store.blob_id(d) for p, d in fresh.items()}
            t_hash = time.perf_counter()
            tip, created = store.snapshot(fresh, f"save {changed}")
            assert created
            t_snap = time.perf_counter()
            outputs, misses = {}, []
            for p in paths:
                hit = store.cache_get(ids[p], FP)
                if hit is None:
                    misses.append(p)
                else:
                    outputs[p] = hit[0]
            t_look = time.perf_counter()
            assert misses == [changed], misses
            out = rewrite(fresh[changed])  # (the pipeline's work, not timed as store cost)
            t_rw = time.perf_counter()
            outputs[changed] = store.cache_put(ids[changed], FP, out, report_for(0))
            t_put = time.perf_counter()
            store.commit_rewrite(tip, outputs, f"save {changed}", f"{changed}:10: grad_clip rewritten", {}, FP)
            t_end = time.perf_counter()
            objects_per_event.append(loose_objects(store.path) - before)
            timings["hash"].append(t_hash - t_start)
            timings["snapshot"].append(t_snap - t_hash)
            timings["lookups"].append(t_look - t_snap)
            timings["cache_put"].append(t_put - t_rw)
            timings["commit_rewrite"].append(t_end - t_put)
            timings["total"].append((t_end - t_start) - (t_rw - t_look))

        t0 = time.perf_counter()
        same, created = store.snapshot({p: bytes(d) for p, d in files.items()}, "no change")
        unchanged_ms = (time.perf_counter() - t0) * 1e3
        assert not created
        floor = fs_floor_us(project)

    print(f"store benchmark: {args.files} files x 300 lines, {args.events} change events (one file each)")
    print(f"  first snapshot + {args.files} cache puts + first commit: {first_ms:8.2f} ms")
    print(f"  cold cache_get_many of {args.files} (fresh Store):       {cold_ms:8.2f} ms")
    print(f"  unchanged snapshot (dedup, nothing written):        {unchanged_ms:8.2f} ms")
    print(f"  filesystem floor: one small file create+rename     {floor:8.1f} us")
    print(f"  objects written per event: {statistics.median(objects_per_event):.0f}, ref updates per event: 4"
          " (source, cache, reports note, new run branch)")
    print("  per change event, median:")
    for key, values in timings.items():
        label = {"hash": f"blob ids of {args.files} files", "lookups": f"{args.files} cache_get (warm)"}.get(key, key)
        print(f"    {label:28s} {statistics.median(values) * 1e3:8.3f} ms")
    parts = sum(statistics.median(v) for k, v in timings.items() if k != "total") * 1e3
    print(f"    {'sum of the medians above':28s} {parts:8.3f} ms  (robust to preemption on a busy machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
