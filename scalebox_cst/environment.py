"""Every ``SCALEBOX_*`` environment variable, in one list: who sets it, who reads it, its default.

Why one list: the variables were named in a dozen modules (the launcher, the import hook, the
telemetry, the stabilizer, the C-extension switches) and nowhere together, so a user could not find
the switch that turns the profiler off and a newcomer could not tell which ones the engine sets for
itself. tests/scalebox_cst/test_environment.py checks that every ``SCALEBOX_`` name in the code is listed here
and that ``docs/environment.md`` shows this table. Pure data: the runtime may import it.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List


@dataclasses.dataclass(frozen=True)
class EnvVar:
    name: str
    #: "user": a switch a person may set; "engine": set by the engine for its own processes
    set_by: str
    default: str
    read_by: str
    meaning: str


VARIABLES: List[EnvVar] = [
    # switches a person may set
    EnvVar("SCALEBOX_TELEMETRY", "user", "1", "runtime.telemetry",
           "0 turns the run telemetry (system samples, phases) off"),
    EnvVar("SCALEBOX_TELEMETRY_EVERY", "user", "2", "runtime.telemetry", "seconds between telemetry samples"),
    EnvVar("SCALEBOX_TELEMETRY_HZ", "user", "25", "runtime.telemetry.sites", "samples per second of the per-site timings"),
    EnvVar("SCALEBOX_PROFILE", "user", "1", "runtime.telemetry.profile", "0 turns the sampling profiler off"),
    EnvVar("SCALEBOX_PROFILE_EVERY", "user", "10", "runtime.telemetry.profile",
           "seconds between profile.jsonl flushes"),
    EnvVar("SCALEBOX_RECURRENCE_C", "user", "1", "runtime.recurrence",
           "0 turns the C recurrence kernel off (numpy, then numba)"),
    EnvVar("SCALEBOX_FUSED_C", "user", "1", "runtime.fused", "0 turns the fused one-pass C kernel off"),
    EnvVar("SCALEBOX_TARGET_UPDATE_NUMBA_AFTER", "user", "auto", "runtime.target_update",
           "calls with one plan before the numba kernel is compiled (-1 never); auto: once the foreach "
           "updates took as long as the switch costs (~0.5 s)"),
    EnvVar("SCALEBOX_COMPILE", "user", "1", "runtime.compiled", "0 runs accelerate.compile sites eager (--fast rewrites)"),
    EnvVar("SCALEBOX_COMPILE_CUDAGRAPHS", "user", "1", "runtime.compiled",
           "0 compiles accelerate.compile sites without CUDA graphs on CUDA"),
    EnvVar("SCALEBOX_THREADS", "user", "", "runtime.intra_op",
           "keep: accelerate.threads keeps torch's intra-op threads for small networks (--fast rewrites)"),
    EnvVar("SCALEBOX_FALLBACK_COUNT", "user", "1", "runtime.telemetry.fallbacks",
           "0 counts NPU CPU-fallback operators by their warnings only (no dispatch mode counting every call)"),
    EnvVar("SCALEBOX_BENCH_CACHE", "user", "", "benchmarks/bench_public_scripts.py",
           "where the public scripts' repositories are read from (bare mirrors or clones; --cache)"),
    EnvVar("SCALEBOX_CACHE_DIR", "user", "$XDG_CACHE_HOME/scalebox_cst", "runtime.backend",
           "the per-user cache of the engine (compiled kernels)"),
    EnvVar("SCALEBOX_IMPORT_CACHE_MB", "user", "256", "scalebox_cst.importhook.cache",
           "megabytes the import hook's .scalebox/pycache keeps, least recently used removed first"),
    EnvVar("SCALEBOX_BENCH_MANIFEST", "user", "", "benchmarks/bench_public_scripts.py",
           "the manifest of public scripts to benchmark"),
    # set by the engine for the processes it starts
    EnvVar("SCALEBOX_RUN", "engine", "", "runtime.launch, runtime.telemetry",
           "the launched run: store, commit, project, script (JSON)"),
    EnvVar("SCALEBOX_LIMITS", "engine", "", "scalebox_cst.limits",
           "the CLI's run limits (JSON), inherited by hot-fixes, torchrun ranks and Ray tasks"),
    EnvVar("SCALEBOX_DEVICE_MEMORY", "engine", "", "runtime.launch, runtime.limits",
           "bytes of GPU/NPU memory per process (scalebox run --device-memory)"),
    EnvVar("SCALEBOX_CALIBRATE_PRECISION", "engine", "", "runtime.launch, runtime.precision",
           "optimizer steps over which module activation ranges are recorded (--calibrate-precision)"),
    EnvVar("SCALEBOX_RUN_INFO", "engine", "", "runtime.launch", "the run: branch, run, variant, commit, source commit, seed (JSON)"),
    EnvVar("SCALEBOX_RUN_DIR", "engine", "", "runtime.lifeline",
           "the run's folder, inherited by every process of the run"),
    EnvVar("SCALEBOX_PARENT_PID", "engine", "", "runtime.lifeline", "the pid of the scalebox run process, for its own child only"),
    EnvVar("SCALEBOX_SEED", "engine", "", "runtime.launch", "the run's seed: random, numpy, torch and unseeded gymnasium envs are seeded with it before the script runs"),
    EnvVar("SCALEBOX_METRICS_FILE", "engine", "<run>/metrics.jsonl", "runtime.metrics", "where metric points go"),
    EnvVar("SCALEBOX_EVENTS_FILE", "engine", "<run>/events.jsonl", "runtime.metrics, runtime.guard_events",
           "where guard and run events go"),
    EnvVar("SCALEBOX_LOCATE_NAN", "engine", "", "runtime.stabilizer, runtime.nan_locate",
           "SITE@STEP: arm the NaN locator for that guard call (set by hot-fixes)"),
    EnvVar("SCALEBOX_HOOK", "engine", "", "scalebox_cst.importhook", "prefix of the import hook's variables"),
    EnvVar("SCALEBOX_HOOK_SESSION", "engine", "", "scalebox_cst.importhook", "the import-hook session of a process"),
    EnvVar("SCALEBOX_HOOK_MAIN", "engine", "", "scalebox_cst.importhook, runtime.launch",
           "the script the hook serves as __main__"),
]

BY_NAME: Dict[str, EnvVar] = {v.name: v for v in VARIABLES}


def markdown_table() -> str:
    """The table docs/environment.md shows (a test keeps the page equal to it)."""
    rows = ["| variable | set by | default | read by | meaning |", "|---|---|---|---|---|"]
    for v in VARIABLES:
        rows.append(f"| `{v.name}` | {v.set_by} | {('`' + v.default + '`') if v.default else ''} | {v.read_by} | {v.meaning} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # python -m scalebox_cst.environment: the table for docs/environment.md
    print(markdown_table(), end="")
