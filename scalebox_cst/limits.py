"""Runs under limits (issue 24 part 3): memory, CPU, priority, device memory, no network.

A run's limits come from ``[run]`` in scalebox.toml, overridden by ``scalebox run --memory 4g
--cpus 2 --device-memory 16g --priority low|normal|high --no-network``, which the CLI passes as
:data:`ENV` (JSON) so that everything that starts runs from that process (watch, hot-fixes, explore
trials, torchrun, Ray tasks) inherits them. The executor asks :func:`plan` for what the child gets
(:class:`Enforcement`): the limit is enforced on the run's whole process tree, never on the host.

How each limit is enforced, best first (the run's start says which, in one line):

* memory and CPU: a cgroup v2 the engine may create (at the cgroup root, or in a delegated subtree
  whose ``memory`` and ``cpu`` controllers it may enable): ``memory.max`` with no swap and
  ``memory.oom.group`` (the whole run is killed together), ``cpu.max``, ``cpu.weight``; else a
  transient scope from ``systemd-run --scope`` with the same properties; else, per process,
  ``RLIMIT_DATA`` (heap and private writable mappings: ``RLIMIT_AS`` would count the address space
  torch's libraries reserve, and ``import torch`` fails under 300m), CPU affinity to
  ``ceil(cpus)`` cores and ``nice`` for the priority.
* device memory: ``set_per_process_memory_fraction`` in the child (scalebox_cst.runtime.limits).
* no network: a new network namespace (``unshare``, in a user namespace when not root) with only
  its own loopback up (torchrun's rendezvous works, the host's listeners are out of reach); where
  the kernel refuses, the run is refused with one line.

A run that hits its memory (or device memory) limit ends ``failed`` with ``stop_reason``
``memory limit 4g reached``; the executor ends its process group as for every run.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
from typing import Any, Callable, Dict, List, Mapping, Optional

from scalebox_cst import options

#: the CLI's limits (JSON), inherited by everything its process starts
ENV = "SCALEBOX_LIMITS"
#: bytes of device memory per process, read in the child by scalebox_cst.runtime.limits
ENV_DEVICE_MEMORY = "SCALEBOX_DEVICE_MEMORY"
PRIORITIES = ("low", "normal", "high")
NICE = {"low": 10, "normal": 0, "high": -5}
CPU_WEIGHT = {"low": 20, "normal": 100, "high": 500}
CGROUP_ROOT = "/sys/fs/cgroup"
CPU_PERIOD = 100000  # microseconds, cpu.max's default period
_UNITS = options.UNITS
#: what a process that ran out of (host or device) memory prints last
_HOST_OOM = ("MemoryError", "can't allocate memory", "Cannot allocate memory", "std::bad_alloc",
             # what a limit too small for the interpreter itself looks like under RLIMIT_DATA
             "can't start new thread", "failed to map segment from shared object", "cannot map zero-fill pages")
#: signals of a process that could not allocate (no message: malloc's NULL met in C code)
_CRASHES = (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT)
_DEVICE_OOM = ("CUDA out of memory", "NPU out of memory", "OutOfMemoryError")


class LimitError(ValueError):
    """A limit that is malformed, or that this host cannot enforce (one line)."""


def parse_size(value: Any) -> int:
    """Bytes of ``4g``, ``300m``, ``512k``, ``1.5G``, ``2GiB`` or a whole number of bytes."""
    problem = options.size_problem(value)
    if problem is not None:
        raise LimitError(f"bad size {options.shown(value)}: {problem}")
    size = options.size_bytes(value)
    assert size is not None
    return size


def format_size(n: int) -> str:
    """``4g`` for 4 GiB: the largest unit that divides it, else one decimal of it."""
    for unit in "tgmk":
        if n >= _UNITS[unit]:
            value = n / _UNITS[unit]
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{n}b"


@dataclasses.dataclass
class Limits:
    """A run's limits; None: unlimited."""

    memory: Optional[int] = None
    cpus: Optional[float] = None
    device_memory: Optional[int] = None
    priority: str = "normal"
    network: bool = True

    def any(self) -> bool:
        return self != Limits()

    def to_json(self) -> Dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v != getattr(Limits(), k)}

    @classmethod
    def from_table(cls, table: Dict[str, Any], where: str = "[run]") -> "Limits":
        """From ``[run]`` (or the CLI's JSON): one-line LimitError on a bad value or key."""
        out = cls()
        for key, value in table.items():
            name = key.replace("-", "_")
            if name in ("memory", "device_memory"):
                setattr(out, name, parse_size(value))
            elif name == "cpus":
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
                if not ok:
                    raise LimitError(f"{where}: cpus must be a positive number, got {value!r}")
                out.cpus = float(value)
            elif name == "priority":
                if value not in PRIORITIES:
                    raise LimitError(f"{where}: priority must be one of {', '.join(PRIORITIES)}, got {value!r}")
                out.priority = value
            elif name == "network":
                if not isinstance(value, bool):
                    raise LimitError(f"{where}: network must be true or false, got {value!r}")
                out.network = value
            else:
                raise LimitError(f"{where}: unknown limit {key!r}; known: memory, cpus, device_memory, priority, network")
        return out


def resolve(project_dir: str, env: Optional[Mapping[str, str]] = None) -> Limits:
    """``[run]`` of the project's config, overridden by the CLI's :data:`ENV` in ``env``."""
    from scalebox_cst.config import Config, ConfigError

    try:
        table = dict(Config.load(project_dir).options.get("run", {}))
    except (ConfigError, OSError):
        table = {}  # the CLI reported it when it opened the project; a Ray tree may have none
    text = (os.environ if env is None else env).get(ENV)
    if text:
        try:
            table.update(json.loads(text))
        except ValueError:
            raise LimitError(f"{ENV} is not JSON: {text[:60]!r}") from None
    return Limits.from_table(table)


def cli_limits(memory, cpus, device_memory, priority, no_network) -> Dict[str, Any]:
    """The options ``scalebox run`` was given, as :data:`ENV`'s JSON table (validated)."""
    table: Dict[str, Any] = {}
    if memory is not None:
        table["memory"] = memory
    if cpus is not None:
        table["cpus"] = cpus
    if device_memory is not None:
        table["device_memory"] = device_memory
    if priority is not None:
        table["priority"] = priority
    if no_network:
        table["network"] = False
    Limits.from_table(table, where="scalebox run")
    return table


# ---------------------------------------------------------------------------- mechanisms
def _cgroup_parent(root: str = CGROUP_ROOT) -> Optional[str]:
    """The cgroup v2 folder this process is in, if the unified hierarchy is mounted at ``root``."""
    if not os.path.exists(os.path.join(root, "cgroup.controllers")):
        root = os.path.join(root, "unified")  # a hybrid host: cgroup v2 beside v1 (its controllers mostly bound to v1)
        if not os.path.exists(os.path.join(root, "cgroup.controllers")):
            return None
    try:
        with open("/proc/self/cgroup") as fh:
            rel = next((line[3:].strip() for line in fh if line.startswith("0::")), None)
    except OSError:
        return None
    return None if rel is None else os.path.join(root, rel.lstrip("/"))


def make_cgroup(parent: str, name: str, limits: Limits) -> str:
    """Create ``parent/name`` with the limits written; OSError where the engine may not (then
    nothing is left behind). The parent must let its children use memory and cpu."""
    wanted = [c for c, need in (("memory", limits.memory), ("cpu", limits.cpus or limits.priority != "normal")) if need]
    with open(os.path.join(parent, "cgroup.subtree_control")) as fh:
        enabled = fh.read().split()
    missing = [c for c in wanted if c not in enabled]
    if missing:  # allowed at the root and in a delegated subtree with no processes of its own
        with open(os.path.join(parent, "cgroup.subtree_control"), "w") as fh:
            fh.write(" ".join("+" + c for c in missing))
    path = os.path.join(parent, name)
    os.mkdir(path)
    try:
        settings = []
        if limits.memory:
            settings += [("memory.max", str(limits.memory)), ("memory.swap.max", "0"), ("memory.oom.group", "1")]
        if limits.cpus:
            settings.append(("cpu.max", f"{int(limits.cpus * CPU_PERIOD)} {CPU_PERIOD}"))
        if limits.priority != "normal":
            settings.append(("cpu.weight", str(CPU_WEIGHT[limits.priority])))
        for key, value in settings:
            if key == "memory.swap.max" and not os.path.exists(os.path.join(path, key)):
                continue  # a kernel without swap accounting
            with open(os.path.join(path, key), "w") as fh:
                fh.write(value)
    except OSError:
        os.rmdir(path)
        raise
    return path


def oom_kills(cgroup: str) -> int:
    """``oom_kill`` of the cgroup's memory.events (0 when unreadable)."""
    try:
        with open(os.path.join(cgroup, "memory.events")) as fh:
            return next((int(line.split()[1]) for line in fh if line.startswith("oom_kill ")), 0)
    except (OSError, ValueError):
        return 0


_probes: Dict[str, bool] = {}


def _probe(key: str, cmd: List[str], preexec: Optional[Callable[[], None]] = None) -> bool:
    """Whether ``cmd`` succeeds (once per process)."""
    if key not in _probes:
        try:
            _probes[key] = subprocess.run(cmd, preexec_fn=preexec, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          timeout=10).returncode == 0
        except (OSError, subprocess.SubprocessError):
            _probes[key] = False
    return _probes[key]


def _systemd_scope(limits: Limits) -> Optional[List[str]]:
    """``systemd-run --scope`` with the limits as properties, where systemd will make one."""
    tool = shutil.which("systemd-run")
    if tool is None:
        return None
    base = [tool, "--scope", "--quiet", "--collect"] + ([] if os.geteuid() == 0 else ["--user"])
    if not _probe("systemd-run" + str(os.geteuid()), base + ["true"]):
        return None
    props = []
    if limits.memory:
        props += ["-p", f"MemoryMax={limits.memory}", "-p", "MemorySwapMax=0"]
    if limits.cpus:
        props += ["-p", f"CPUQuota={int(limits.cpus * 100)}%"]
    if limits.priority != "normal":
        props += ["-p", f"CPUWeight={CPU_WEIGHT[limits.priority]}"]
    return base + props + ["--"]


def netns_step() -> Callable[[], None]:
    """For a forked child: a new network namespace (in a user namespace mapping this user to
    itself when not root) with its loopback up. Raises OSError where the kernel refuses."""
    import ctypes
    import fcntl
    import socket
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid, root = os.getuid(), os.getgid(), os.geteuid() == 0

    def step() -> None:
        if libc.unshare(0x40000000 | (0 if root else 0x10000000)) != 0:  # CLONE_NEWNET [| CLONE_NEWUSER]
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        if not root:
            for path, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{path}", "w") as fh:
                    fh.write(text)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:  # SIOCGIFFLAGS, SIOCSIFFLAGS: lo up
            flags = struct.unpack("16sH14x", fcntl.ioctl(sock, 0x8913, struct.pack("16sH14x", b"lo", 0)))[1]
            fcntl.ioctl(sock, 0x8914, struct.pack("16sH14x", b"lo", flags | 1))

    return step


def require_netns() -> Callable[[], None]:
    """:func:`netns_step` where the kernel permits it, else LimitError (the run is refused)."""
    step = netns_step()
    if not _probe("netns" + str(os.geteuid()), [shutil.which("true") or "/bin/true"], step):
        raise LimitError("no network: this kernel does not let the engine make a network namespace (unshare); not run")
    return step


class Enforcement:
    """What one run's child gets: a command prefix, a ``preexec_fn`` step, environment, a
    one-line note of what is enforced, and afterwards which limit (if any) ended it."""

    def __init__(self, limits: Limits, name: str, cgroup_root: str = CGROUP_ROOT) -> None:
        self.limits = limits
        self.prefix: List[str] = []
        self.env: Dict[str, str] = {}
        self.cgroup: Optional[str] = None
        self.scope = False
        self._steps: List[Callable[[], None]] = []
        self._oom = 0
        self.enforced: Dict[str, str] = {}
        if not limits.any():
            return
        if limits.memory or limits.cpus or limits.priority != "normal":
            self._host(name, cgroup_root)
        if limits.priority != "normal" and not self.cgroup and not self.scope or limits.priority == "low":
            self._nice()
        if limits.device_memory:
            self.env[ENV_DEVICE_MEMORY] = str(limits.device_memory)
            self.enforced["device_memory"] = f"{format_size(limits.device_memory)} (set_per_process_memory_fraction in the child)"
        if not limits.network:
            self._steps.append(require_netns())
            self.enforced["network"] = "none (network namespace, own loopback only)"

    def _host(self, name: str, cgroup_root: str) -> None:
        limits = self.limits
        parent = _cgroup_parent(cgroup_root)
        if parent is not None:
            try:
                self.cgroup = make_cgroup(parent, name, limits)
            except OSError:
                self.cgroup = None
        if self.cgroup is not None:
            procs = os.path.join(self.cgroup, "cgroup.procs")

            def join() -> None:
                with open(procs, "w") as fh:
                    fh.write("0")

            self._steps.append(join)
            how = "cgroup v2"
        else:
            prefix = _systemd_scope(limits)
            if prefix is not None:
                self.prefix, self.scope, how = prefix, True, "systemd-run scope"
        if self.cgroup or self.scope:
            if limits.memory:
                self.enforced["memory"] = f"{format_size(limits.memory)} ({how}, whole run, no swap)"
            if limits.cpus:
                self.enforced["cpus"] = f"{limits.cpus:g} ({how} cpu quota)"
            if limits.priority != "normal":
                self.enforced["priority"] = f"{limits.priority} ({how} cpu.weight {CPU_WEIGHT[limits.priority]})"
            return
        import resource

        if limits.memory:
            size = limits.memory
            self._steps.append(lambda: resource.setrlimit(resource.RLIMIT_DATA, (size, size)))
            self.enforced["memory"] = f"{format_size(size)} (RLIMIT_DATA per process: no cgroup v2 the engine may create)"
        if limits.cpus:
            allowed = sorted(os.sched_getaffinity(0))
            cores = allowed[: max(1, math.ceil(limits.cpus))]
            self._steps.append(lambda: os.sched_setaffinity(0, cores))
            self.enforced["cpus"] = f"{limits.cpus:g} (affinity to cores {','.join(map(str, cores))}: no cgroup v2)"

    def _nice(self) -> None:
        import resource

        nice = NICE[self.limits.priority]
        floor = 20 - resource.getrlimit(resource.RLIMIT_NICE)[0]
        if nice < 0 and os.geteuid() != 0 and nice < floor:
            self.enforced["priority"] = f"normal ({self.limits.priority} needs root or RLIMIT_NICE)"
            return
        self._steps.append(lambda: os.setpriority(os.PRIO_PROCESS, 0, nice))
        self.enforced.setdefault("priority", f"{self.limits.priority} (nice {nice})")

    def note(self) -> Optional[str]:
        """One line: what is enforced, and how."""
        if not self.enforced:
            return None
        return "limits: " + "; ".join(f"{k.replace('_', ' ')} {v}" for k, v in self.enforced.items())

    def preexec(self, base: Optional[Callable[[], None]]) -> Optional[Callable[[], None]]:
        """``base`` (the lifeline's step) then the limits' steps, in the forked child."""
        steps = ([base] if base else []) + self._steps
        if not steps:
            return None

        def run_steps() -> None:
            for step in steps:
                step()

        return run_steps

    def started(self, pid: int) -> None:
        """A scope's cgroup is known once the child is in it (for its memory.events)."""
        if self.scope and self.cgroup is None:
            try:
                with open(f"/proc/{pid}/cgroup") as fh:
                    rel = next((line[3:].strip() for line in fh if line.startswith("0::")), None)
                if rel:
                    self.cgroup = os.path.join(CGROUP_ROOT, rel.lstrip("/"))
            except OSError:
                pass

    def poll(self) -> None:
        """Remember the OOM kills (a scope's cgroup goes with its last process)."""
        if self.cgroup and self.limits.memory:
            self._oom = max(self._oom, oom_kills(self.cgroup))

    def cause(self, status: int, errors: List[str]) -> Optional[str]:
        """Which limit ended the run (exit ``status``, the last lines of its stderr), else None."""
        if status == 0:
            return None
        self.poll()
        text = "\n".join(errors[-40:])
        if self.limits.device_memory and any(word in text for word in _DEVICE_OOM):
            return f"device memory limit {format_size(self.limits.device_memory)} reached"
        if self.limits.memory:
            crashed = status < 0 and -status in _CRASHES and "RLIMIT_DATA" in self.enforced.get("memory", "")
            if self._oom or crashed or any(word in text for word in _HOST_OOM):
                return f"memory limit {format_size(self.limits.memory)} reached"
        return None

    def close(self) -> None:
        """Remove the run's own cgroup (after its processes are gone)."""
        if self.cgroup and not self.scope:
            try:
                os.rmdir(self.cgroup)
            except OSError:
                pass


def plan(project_dir: str, env: Mapping[str, str], name: str) -> Enforcement:
    """The run's enforcement (LimitError: one line, nothing started)."""
    return Enforcement(resolve(project_dir, env), name)


_names = iter(range(1, 1 << 30))


def cgroup_name() -> str:
    """A cgroup name no other run of this host takes (this process's pid, a counter)."""
    return f"scalebox-{os.getpid()}-{next(_names)}"
