"""Which accelerator this process can use: NPU, else CUDA, else CPU.

Detection must survive broken installs: without the CANN toolkit ``import torch_npu`` raises
(``libhccl.so``), and with torch_npu installed even ``import torch`` can raise through torch's
device-backend autoload. Each such case becomes one line in ``notes`` and detection carries on.

:func:`detect` imports torch (2 s of CPU). The engine's own commands (``scalebox init``, ``run``,
``status``, the watcher) only need the backend's name, so they call :func:`probe`: it reads the
answer off the installation where that is certain (no torch, a torch built without CUDA/ROCm, no
GPU device node) and otherwise runs :func:`detect` in a subprocess whose answer is cached per
machine state (see :func:`_probe_key`).
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

from scalebox_cst import tmpnames
from scalebox_cst.intake import NotRead, read_regular
from scalebox_cst.oneline import error_line


@dataclasses.dataclass
class BackendInfo:
    name: str  # "npu", "cuda" or "cpu"
    device_name: Optional[str] = None
    torch_version: Optional[str] = None
    notes: List[str] = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        text = self.name
        if self.device_name:
            text += f" ({self.device_name})"
        if self.torch_version:
            text += f", torch {self.torch_version}"
        return text


def _autoload_breaks_torch() -> Optional[str]:
    """If a device-backend plug-in would break ``import torch``, the first line of the error.

    torch imports every ``torch.backends`` entry point on import. A broken one (torch_npu
    without CANN) makes ``import torch`` raise, and a half-imported torch cannot be imported
    again in the same process, so the probe runs in a subprocess, only when such plug-ins exist.
    """
    if "torch" in sys.modules or os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == "0":
        return None
    from importlib.metadata import entry_points

    if not list(entry_points(group="torch.backends")):
        return None
    probe = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True)
    if probe.returncode == 0:
        return None
    lines = [line for line in probe.stderr.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"exit status {probe.returncode}"


def _import_torch(notes: List[str]):
    broken = _autoload_breaks_torch()
    if broken is not None:
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        notes.append(
            f"import torch fails through device-backend autoload ({broken}); "
            "continuing with TORCH_DEVICE_BACKEND_AUTOLOAD=0"
        )
    try:
        import torch

        return torch
    except Exception as exc:  # noqa: BLE001 - any failure here must become one line
        notes.append(f"torch is not importable ({error_line(exc)}); backend cpu")
        return None


def detect() -> BackendInfo:
    """Detect the best backend; never raises."""
    notes: List[str] = []
    torch = _import_torch(notes)
    if torch is None:
        return BackendInfo("cpu", notes=notes)
    version = str(torch.__version__)
    try:
        import torch_npu  # noqa: F401

        npu = getattr(torch, "npu", None)
        if npu is not None and npu.is_available():
            name = None
            try:
                name = npu.get_device_name(0)
            except Exception:  # noqa: BLE001
                pass
            return BackendInfo("npu", name, version, notes)
        notes.append("torch_npu is installed but no NPU is available")
    except ImportError as exc:
        if getattr(exc, "name", None) != "torch_npu":
            notes.append(f"torch_npu is installed but cannot load ({error_line(exc)}); is CANN installed? skipping NPU")
    except Exception as exc:  # noqa: BLE001
        notes.append(f"torch_npu failed to initialise ({error_line(exc)}); skipping NPU")
    try:
        if torch.cuda.is_available():
            return BackendInfo("cuda", torch.cuda.get_device_name(0), version, notes)
    except Exception as exc:  # noqa: BLE001
        notes.append(f"CUDA check failed ({error_line(exc)}); using CPU")
    return BackendInfo("cpu", None, version, notes)


def resolve(requested: str) -> BackendInfo:
    """``auto`` → probe(); an explicit backend is taken as the rewrite target without probing."""
    if requested == "auto":
        return probe()
    return BackendInfo(requested)


#: without any of these device nodes no CUDA (or ROCm, or WSL GPU) device can be opened on Linux
GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")
#: the environment that decides what detect() finds (visible devices, backend autoload)
_PROBE_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES",
              "ASCEND_VISIBLE_DEVICES", "TORCH_DEVICE_BACKEND_AUTOLOAD", "PYTHONPATH")
_AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"
_DETECT_JSON = ("import dataclasses, json, os; from scalebox_cst.runtime.backend import detect; "
                "print(json.dumps({'info': dataclasses.asdict(detect()), 'autoload': os.environ.get('TORCH_DEVICE_BACKEND_AUTOLOAD')}))")


def _spec(name: str):
    try:
        return importlib.util.find_spec(name)  # a top-level name: nothing is imported
    except (ImportError, ValueError):
        return None


def torch_build(spec=None) -> Optional[Tuple[str, Optional[str], Optional[str]]]:
    """``(version, cuda, hip)`` of the installed torch, read from its ``version.py`` without
    importing torch; None when torch is absent or the file does not say."""
    spec = spec or _spec("torch")
    if spec is None or not spec.origin:
        return None
    found: Dict[str, object] = {}
    try:
        with open(os.path.join(os.path.dirname(spec.origin), "version.py"), encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        for node in tree.body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(node, "target", None)
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(target, ast.Name) and node.value is not None:
                try:
                    found[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    except (OSError, SyntaxError, ValueError):
        return None
    version = found.get("__version__")
    if not isinstance(version, str) or "cuda" not in found or "hip" not in found:
        return None
    cuda, hip = found["cuda"], found["hip"]
    return version, cuda if isinstance(cuda, str) else None, hip if isinstance(hip, str) else None


def probe() -> BackendInfo:
    """What :func:`detect` would say, without importing torch here. Certain answers come from the
    installation: no torch (cpu, with detect's note); no torch_npu and a torch built without
    CUDA/ROCm, or on Linux no GPU device node (cpu). Otherwise :func:`detect` runs in a
    subprocess, once per machine state (cached, :func:`_cached_detect`)."""
    if "torch" in sys.modules:  # already imported: detecting costs nothing more
        return detect()
    torch_spec = _spec("torch")
    if torch_spec is None:
        return BackendInfo("cpu", notes=["torch is not importable (ModuleNotFoundError: No module named 'torch'); backend cpu"])
    build = torch_build(torch_spec)
    if build is not None and _spec("torch_npu") is None:
        version, cuda, hip = build
        if not (cuda or hip) or (sys.platform.startswith("linux") and not any(os.path.exists(p) for p in GPU_NODES)):
            return BackendInfo("cpu", None, version)
    return _cached_detect(torch_spec)


def cache_dir() -> str:
    """Per-user cache of the engine (``$SCALEBOX_CACHE_DIR``, else ``$XDG_CACHE_HOME/scalebox_cst``)."""
    explicit = os.environ.get("SCALEBOX_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(base):  # the XDG spec: a relative value is ignored (it would follow the cwd
        base = os.path.join(os.path.expanduser("~"), ".cache")  # into a project, with the user's key)
    return os.path.join(base, "scalebox_cst")


#: the most a file of the user's cache holds (a probe's answer, the transforms' versions)
CACHED_BYTES = 1 << 20


def read_cached(path: str) -> bytes:
    """The bytes of a file in the user's cache if it is a regular file within
    :data:`CACHED_BYTES` (``intake.read_regular``); ``intake.NotRead`` otherwise, and the answer
    is made again and the file replaced. A FIFO there blocked a plain ``open`` for ever:
    ``scalebox status`` and every ``run`` hung. A file read is marked used (:func:`keep_newest`)."""
    data = read_regular(path, limit=CACHED_BYTES, follow=True)
    try:
        os.utime(path)
    except OSError:  # a read-only cache: the order is that of the writes
        pass
    return data


#: answers of one kind the user's cache keeps (probes per machine state, transforms' versions
#: per engine source): one was added per reboot or torch install and per engine edit, never removed
CACHED_KEPT = 8


def keep_newest(path: str, keep: int = CACHED_KEPT) -> None:
    """After writing the cache file *path* (``<kind>-<key>.json``): remove all but the *keep*
    files of its kind used most recently (by mtime), and temporary files of its kind older than
    a minute (a writer killed between write and rename). Each removal is one unlink: a kill at
    any point leaves whole files; a reader that loses one makes its answer again."""
    folder, name = os.path.split(path)
    kind = name.split("-", 1)[0] + "-"
    cutoff = time.time() - 60.0
    found = []
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if not entry.name.startswith(kind) or not entry.is_file(follow_symlinks=False):
                    continue
                try:
                    mtime = entry.stat(follow_symlinks=False).st_mtime
                    if entry.name.endswith(".tmp"):
                        if mtime < cutoff:
                            os.remove(entry.path)
                    elif entry.name.endswith(".json"):
                        found.append((mtime, entry.name != name, entry.path))
                except OSError:
                    continue
    except OSError:
        return
    found.sort(key=lambda f: (f[1], -f[0]))  # the file just written first, then newest first
    for _mtime, _other, old in found[keep:]:
        try:
            os.remove(old)
        except OSError:
            pass


def _stat(path: Optional[str]) -> Optional[List[float]]:
    try:
        st = os.stat(path) if path else None
    except OSError:
        return None
    return [st.st_mtime, st.st_size] if st else None


def _probe_key(torch_spec) -> str:
    """Everything detect()'s answer depends on: this interpreter, the torch and torch_npu
    installed (their files' times), the device nodes, the boot (a driver loaded or unloaded),
    the environment that hides devices or turns backend autoload off."""
    npu = _spec("torch_npu")
    try:
        nodes = sorted(n for n in os.listdir("/dev") if n.startswith(("nvidia", "davinci", "kfd", "dxg", "dri")))
    except OSError:
        nodes = []
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = None
    key = {
        "python": sys.executable, "torch": [torch_spec.origin, _stat(torch_spec.origin),
                                            _stat(os.path.join(os.path.dirname(torch_spec.origin or ""), "version.py"))],
        "torch_npu": [npu.origin, _stat(npu.origin)] if npu is not None else None,
        "nodes": nodes, "boot": boot, "env": {k: os.environ.get(k) for k in _PROBE_ENV},
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def _cached_detect(torch_spec) -> BackendInfo:
    """detect() in a subprocess, its answer kept in the user's cache under :func:`_probe_key`
    (a torch upgrade, a reboot, other visible devices: another key). The subprocess's
    TORCH_DEVICE_BACKEND_AUTOLOAD=0 (set when a backend plug-in breaks ``import torch``) is
    set here too, as detect() in this process would have, so the runs started from here get it."""
    key = _probe_key(torch_spec)
    path = os.path.join(cache_dir(), f"backend-{key}.json")
    try:
        data = json.loads(read_cached(path))
        info = BackendInfo(**data["info"])
    except (NotRead, ValueError, TypeError, KeyError):
        try:
            proc = subprocess.run([sys.executable, "-c", _DETECT_JSON], capture_output=True, text=True, timeout=300)
            data = json.loads(proc.stdout.strip().splitlines()[-1])
            info = BackendInfo(**data["info"])
        except (OSError, ValueError, TypeError, KeyError, IndexError, subprocess.SubprocessError):
            return detect()  # the subprocess cannot say (scalebox_cst not importable there): ask here
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmpnames.write_replacing(path, json.dumps(data).encode("utf-8"), tmpnames.sibling(path, tmpnames.writer_id()))
            keep_newest(path)
        except OSError:
            pass  # a read-only home: probed again next time
    if data.get("autoload") == "0":
        os.environ[_AUTOLOAD] = "0"
    return info
