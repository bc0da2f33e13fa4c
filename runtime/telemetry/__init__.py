"""Telemetry of a run, measured inside the child without the user writing a line.

``install()`` (called by ``runtime.launch`` before the script runs; ``SCALEBOX_TELEMETRY=0``
turns it off) attaches each source once the script imports what it observes:

- :mod:`.envs`: ``episodic_return`` / ``episodic_length`` of every gymnasium / gym env (vector
  envs per sub-env), x = env steps over all envs; worker processes count their own envs;
- :mod:`.writer`: ``SummaryWriter.add_scalar(s)`` values under the user's tags and steps;
- :mod:`.training`: optimizer steps, ``losses/backward`` (non-finite ones reported at flush),
  ``grad_norm_preclip`` (what the code's own ``clip_grad_norm_`` returns);
- :mod:`.sites`: guard passes/fallbacks and sampled time per rewritten site (sites.json);
- :mod:`.fallbacks`: operators that fall back to the CPU on the NPU, per line (fallbacks.json);
- :mod:`.system`: host/device peak memory and device utilization where a tool exists;
- :mod:`.profile`: where the main thread's time goes, per line of the user's and per category
  (profile.jsonl; ``SCALEBOX_PROFILE=0`` turns it off).

One daemon thread (``scalebox-telemetry``) samples the main thread's stack at :data:`sites.HZ`
(for site time, and for the profile; it needs the GIL for each look, so with the profile on the
switch interval is lowered to :data:`SWITCH_INTERVAL`), and every :data:`EVERY` seconds records ``SPS``, ``optimizer_steps_per_s``,
``wall_time``, ``telemetry_cpu_s`` (the CPU time this thread has used: its own cost),
``cpu_time_s`` (the process's and its reaped children's CPU time: speed where the machine is
shared, see scalebox_cst.contention; the last point, at exit, is the run's), ``intra_op_threads``
(torch's at exit, where the script imported torch: above 1, CPU time counts waits for a core too) and the
:mod:`.system` points, then flushes the metrics (values cross from the device there, off the
training thread). The training thread pays for the patched calls only:
a few dict look-ups and increments per env step, guard call and backward, no device sync.

Every series recorded here is the engine's: in the ``scalebox/`` namespace (``metrics.engine``;
``scalebox/SPS``, ``scalebox/episodic_return``...), so a script's own ``SPS`` or ``grad_norm``
tag, kept under its own name, never shares a series with it. A child process of the run records
under ``scalebox/workers/<id>/`` (:func:`install_worker` for spawned ones; forked ones inherit
the patches and switch names at the fork).
"""
from __future__ import annotations

import atexit
import os
import random
import sys
import threading
import time
from typing import Optional

from scalebox_cst import digits
from scalebox_cst.runtime import metrics, threads
from scalebox_cst.runtime.telemetry import envs, fallbacks, imports, profile, sites, system, training, writer

ENV_SWITCH = "SCALEBOX_TELEMETRY"
EVERY = digits.setting("SCALEBOX_TELEMETRY_EVERY", 2, 0.1, 86400)

_installed = False
_thread: Optional["_Telemetry"] = None

#: how long the main thread may keep the GIL once the sampler asks for it (sys.setswitchinterval).
#: With CPython's 5 ms the sampler got it at the main thread's next call that releases the GIL
#: (a torch op), so a stretch of pure Python before one (a replay buffer's random.sample and
#: np.stack, ~1 ms) was charged to the line after it: in quantumiracle's discrete SAC,
#: ``torch.FloatTensor(state)`` (1% of the run, timed) was the hottest line at 14%. A thread
#: waiting for the GIL is what makes a switch, so a single-threaded script pays nothing more.
SWITCH_INTERVAL = 0.0002


def _next_look(rng: "random.Random", period: float) -> float:
    """Seconds to the sampler's next look: uniform in [0, 2 * period] (mean ``period``), never a
    fixed period. A look that had to wait for the GIL lands where the main thread next releases
    it (the first torch op after a Python stretch); a fixed period after it then fell at the same
    point of every step, and a short op right after that one (a backward pass after the loss's
    forward) was never seen: CI's profile had no backward at all. A random interval covers
    every phase; the interval credited to a look is still the time since the last one."""
    return rng.uniform(0.0, 2.0 * period)


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def install() -> bool:
    """Attach every source (idempotent); False when telemetry is switched off."""
    global _installed, _thread
    if not enabled():
        return False
    if _installed:
        return True
    _installed = True
    imports.when_imported("gymnasium", envs.attach_gymnasium)
    imports.when_imported("gym", envs.attach_gym)
    for name in writer.MODULES:
        imports.when_imported(name, writer.attach)
    imports.when_imported("torch", training.attach)
    if profile.enabled():
        imports.when_imported("torch", profile.attach_torch)
    for name in sites.GUARDS:
        imports.when_imported(name, sites.attach)
    if profile.enabled() and sys.getswitchinterval() > SWITCH_INTERVAL:  # a script's own setting later wins
        sys.setswitchinterval(SWITCH_INTERVAL)
    metrics.after_flush(sites.write_json)
    fallbacks.install()  # CPU-fallback warnings of torch_npu / MPS, per operator and line
    metrics.background_flush(True)
    _thread = _Telemetry()
    threads.start(_thread)
    atexit.register(_thread.finish)
    return True


def install_worker() -> bool:
    """In a spawned child of the run (``runtime.launch.run_spawned_main``): its envs' episodes,
    losses and clip norms under its worker's names; no sampler thread, no sites.json."""
    if not enabled():
        return False
    metrics.in_worker()
    envs.in_worker()
    imports.when_imported("gymnasium", envs.attach_gymnasium)
    imports.when_imported("gym", envs.attach_gym)
    for name in writer.MODULES:
        imports.when_imported(name, writer.attach)
    imports.when_imported("torch", training.attach)
    return True


class _Telemetry(threading.Thread):
    def __init__(self) -> None:
        super().__init__(name="scalebox-telemetry", daemon=True)
        self.started = time.time()
        self.clock = sites.Clock()
        self.system = system.Sampler()
        self.stopped = threading.Event()
        self.last = time.perf_counter()
        self.env_steps = envs.env_steps
        self.opt_steps = training.optimizer_steps
        self.lock = threading.Lock()
        self.cpu_s = 0.0  # CPU time this thread has used (its own cost, recorded as telemetry_cpu_s)
        self.intra_op: Optional[int] = None  # torch.get_num_threads() at exit (finish)
        self.profiler = profile.Profiler() if profile.enabled() else None
        self.main = threading.main_thread().ident
        self.profile_due = time.perf_counter() + profile.EVERY

    def run(self) -> None:
        period = 1.0 / max(sites.HZ, 0.1)
        rng = random.Random()  # its own: the script's random.seed stream is never drawn from
        due = time.perf_counter() + EVERY
        while not self.stopped.is_set():
            if sites._sites or self.profiler is not None:
                frame = sys._current_frames().get(self.main)
                if self.profiler is not None:
                    self.profiler.tick(frame)
                if sites._sites:
                    self.clock.tick(frame)
                else:  # no site yet: the first one's first look must not be credited with the time before it
                    self.clock.last = time.perf_counter()
                del frame
                self.stopped.wait(_next_look(rng, period))
            else:
                self.clock.last = time.perf_counter()
                self.stopped.wait(min(EVERY, 0.25))
            if time.perf_counter() >= due:
                due = time.perf_counter() + EVERY
                self.cpu_s = time.thread_time()
                self.report()
        self.cpu_s = time.thread_time()

    def report(self, final: bool = False) -> None:
        """Rates since the last report, resources, then a flush (once at a time); the profile
        every :data:`profile.EVERY` seconds and at the end."""
        with self.lock:
            now = time.perf_counter()
            dt, self.last = now - self.last, now
            steps, opt = envs.env_steps, training.optimizer_steps
            if dt > 0 and steps > self.env_steps:
                metrics.record(metrics.engine("SPS"), (steps - self.env_steps) / dt, step=steps)
            if dt > 0 and opt > self.opt_steps:
                metrics.record(metrics.engine("optimizer_steps_per_s"), (opt - self.opt_steps) / dt, step=opt)
            self.env_steps, self.opt_steps = steps, opt
            metrics.record(metrics.engine("wall_time"), time.time() - self.started)
            metrics.record(metrics.engine("telemetry_cpu_s"), self.cpu_s)
            metrics.record(metrics.engine("cpu_time_s"), system.cpu_time_s())
            if final and self.intra_op is not None:
                metrics.record(metrics.engine("intra_op_threads"), self.intra_op)
            for name, value in self.system.sample().items():
                metrics.record(metrics.engine(name), value)
            metrics.flush()
            if self.profiler is not None and (final or now >= self.profile_due):
                self.profile_due = now + profile.EVERY
                profile.flush(self.profiler)

    def finish(self) -> None:
        """At exit: stop sampling, a last report and flush (sites.json included)."""
        self.stopped.set()
        # torch's intra-op threads, read here on the main thread (at exit): OpenMP keeps the
        # count per thread, so the sampler thread's would not follow the script's set_num_threads
        torch = sys.modules.get("torch") if threading.current_thread() is threading.main_thread() else None
        if torch is not None and callable(getattr(torch, "get_num_threads", None)):
            try:
                self.intra_op = int(torch.get_num_threads())
            except Exception:  # a torch half torn down at exit: no count
                self.intra_op = None
        if self.is_alive():
            self.join(timeout=1.0)
        training.flush_clips()
        self.report(final=True)
