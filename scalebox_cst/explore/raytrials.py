"""``launcher: ray``: a trial's seed as a Ray task, as ``scalebox run --launcher ray`` runs it.

``raylaunch.run_ray`` stages the commit, runs it on a worker and streams the run folder back
into ``.scalebox/runs/<branch>/<NNNN>/`` as it grows; this module reads that folder's metrics
while the task runs (the pruner's feed, as for a local run) and cancels the task to prune it.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Dict

from scalebox_cst import runs
from scalebox_cst.runner import seedopt


def run_seed_on_ray(study, trial, branch, commit, source_commit, seed, tags, feed, run_ids):
    from scalebox_cst import raylaunch
    from scalebox_cst.explore.study import _Feed

    project, config = study.project, study.config
    args, via = seedopt.seeded(project.store.read_file(commit, config.script) if seed is not None else None, config.args, seed)
    job = raylaunch.RayJob(branch, commit, config.script, args, source_commit=source_commit, seed=seed, seed_via=via)
    stop = threading.Event()
    out: Dict[str, Any] = {}

    def go():
        try:
            out["records"] = raylaunch.run_ray(project.root, project.store.path, [job], address=config.address,
                                               notice=lambda text: None, stop=stop)
        except BaseException as exc:  # noqa: BLE001 - said by the trial as its failure
            out["error"] = exc

    thread = threading.Thread(target=go, name=f"explore-ray-{trial.number}", daemon=True)
    thread.start()
    watcher = None
    pruned_at = None
    started = time.time()
    while thread.is_alive():
        if watcher is None and job.dir:
            watcher = _Feed(study, trial, feed, f"{job.dir}/{runs.METRICS}")
            run_ids.append(f"{branch}#{job.run}")
            trial.set_user_attr("runs", list(run_ids))
        if watcher is not None and pruned_at is None:
            pruned_at = watcher.pump()
            if pruned_at is not None:
                stop.set()
        if config.timeout and time.time() - started > config.timeout:
            stop.set()
        if study.stopping:
            stop.set()
        thread.join(timeout=0.2)
    if "error" in out:
        if isinstance(out["error"], raylaunch.RayStartError):  # every trial would meet it: the study stops
            from scalebox_cst.explore.study import ExploreError

            raise ExploreError(f"{out['error']}; stopping the study") from None
        raise out["error"]
    record = dict(out["records"][0])
    record["tags"] = tags
    if pruned_at is not None:
        record["status"] = "pruned"
        record["stop_reason"] = f"pruned by study {config.study} at step {pruned_at} (below the median)"
        runs.append_event(f"{job.dir}/{runs.EVENTS}", "pruned", f"{branch}#{job.run} pruned: {record['stop_reason']}")
    runs.write_record(job.dir, record)
    return record, runs.read_series(job.dir)
