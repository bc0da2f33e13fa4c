"""Project configuration: ``scalebox.toml`` or ``[tool.scalebox]`` in ``pyproject.toml``.

The configuration decides which files are snapshotted, which transforms run and with which
options. Its fingerprint (with the engine version and a digest of the engine's rewriting code) keys
the rewrite cache, so changing any of it re-runs the pipeline instead of serving stale rewrites.
"""
from __future__ import annotations

import copy
import dataclasses
import fnmatch
import functools
import hashlib
import importlib.util
import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from scalebox_cst._version import __version__
from scalebox_cst.options import OPTIONS, _nearest, default as _default, option_error, shown as _shown

CONFIG_FILE = "scalebox.toml"
STATE_DIR = ".scalebox"  # the engine's own folder in a project: store, runs, caches
BACKENDS = ("auto", "cpu", "cuda", "npu")

DEFAULT_INCLUDE = ["**/*.py"]
# Never snapshotted, whatever the user's globs say: the engine's own state and tool caches.
ALWAYS_EXCLUDED_DIRS = (".scalebox", ".git", "__pycache__", ".hg", ".svn")
DEFAULT_EXCLUDE = [
    ".venv/**",
    "venv/**",
    "env/**",
    "build/**",
    "dist/**",
    "*.egg-info/**",
    ".tox/**",
    ".nox/**",
    ".mypy_cache/**",
    ".pytest_cache/**",
    "node_modules/**",
]
DEFAULT_TRANSFORMS = ["grad_clip", "vectorize.*", "hot.*", "accelerate.*", "device.*"]

def _toml(value: Any) -> str:
    """A default as the template writes it (TOML)."""
    return ("true" if value else "false") if isinstance(value, bool) else json.dumps(value)


DEFAULT_TOML = """\
# scalebox_cst configuration. Every key is optional; the values below are the defaults.
# The engine rewrites copies of these files into .scalebox/store.git; your files are never edited.

# Files to snapshot and rewrite (glob patterns relative to this directory; ** matches folders).
include = ["**/*.py"]
# Files to leave out (.scalebox/, .git/ and __pycache__/ are always left out).
exclude = [".venv/**", "venv/**", "env/**", "build/**", "dist/**"]

# Transforms to run, by id or glob: "grad_clip", "vectorize.*", "hot.*", "accelerate.*", "device.*".
transforms = ["grad_clip", "vectorize.*", "hot.*", "accelerate.*", "device.*"]
# Transforms to switch off even if matched above, e.g. ["vectorize.elementwise"].
disabled = []

# Target backend for device.* transforms: "auto" (detected), "cpu", "cuda" or "npu".
backend = "auto"

[grad_clip]
# "guard": before each optimizer step, skip it if a gradient is non-finite, report a grad norm far
# above its own history (max(mean + z*std, ratio*mean) after `warmup` steps; spikes = "clip": clip
# it to that), change nothing otherwise (runs stay bitwise identical until a non-finite gradient).
# "fixed": clip_grad_norm_(max_norm) every step.
mode = {mode}
z = {z}
ratio = {ratio}
warmup = {warmup}
spikes = {spikes}
max_norm = {max_norm}
# true: decide on the host every step (a true skip on any optimizer and device; hot-fixes set it).
skip_nonfinite = {skip_nonfinite}

[accelerate]
# "exact": only rewrites whose results are bitwise the original's. "reassociated" (also
# `scalebox rewrite --fast`): accelerate.* too, e.g. torch.compile of module methods (results
# differ in the last bits; compare learning curves over seeds with `scalebox compare`) and
# logged .item() numbers read when their loop ends (same values, logs written later).
level = "exact"

[hotfix]
# `scalebox run --heal` / `scalebox-watch --run`: hot-fix branches per source snapshot, at most.
max_per_source = {max_per_source}
""".format(
    **{k: _toml(v) for k, v in {**{k: _default("grad_clip", k) for k in ("mode", "z", "ratio", "warmup", "spikes", "max_norm", "skip_nonfinite")},
                               "max_per_source": _default("hotfix", "max_per_source")}.items()})


class ConfigError(ValueError):
    """A configuration file that cannot be read or holds an invalid value."""


#: Top-level keys of a config (anything else must be a known option table).
TOP_KEYS = ("include", "exclude", "transforms", "disabled", "backend")

#: The option tables the engine reads, with their kinds and defaults: :mod:`scalebox_cst.options`
#: (the one schema; ``option_error`` is the one check).
__all__ = ["OPTIONS", "option_error"]


def transform_pattern_error(pattern: str, known: Sequence[str]) -> Optional[str]:
    """What is wrong with a transform id or glob that matches none of ``known``, or None."""
    if any(_id_matches(t, pattern) for t in known):
        return None
    families = sorted({t.split(".")[0] + ".*" for t in known if "." in t})
    return f"unknown transform {pattern!r}{_nearest(pattern, [*known, *families])}; known: {', '.join(known)}"


@dataclasses.dataclass
class Config:
    include: List[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_INCLUDE))
    exclude: List[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_EXCLUDE))
    transforms: List[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_TRANSFORMS))
    disabled: List[str] = dataclasses.field(default_factory=list)
    backend: str = "auto"
    # Per-transform option tables, e.g. {"grad_clip": {"max_norm": 1.0}}.
    options: Dict[str, Dict[str, Any]] = dataclasses.field(default_factory=dict)
    source: Optional[str] = None  # the file it came from, for messages

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, project_dir: str) -> "Config":
        """Read ``scalebox.toml`` or ``pyproject.toml``'s ``[tool.scalebox]``; defaults otherwise."""
        # present in any form (a FIFO, a link to a device or to nothing): read, or one line saying
        # why not; never passed over in silence as if there were no config
        path = os.path.join(project_dir, CONFIG_FILE)
        if os.path.lexists(path):
            return cls.from_dict(_read_toml(path), source=path)
        pyproject = os.path.join(project_dir, "pyproject.toml")
        if os.path.lexists(pyproject):
            tool = _read_toml(pyproject).get("tool", {})
            if not isinstance(tool, dict):
                raise ConfigError(f"{pyproject}: tool must be a table ([tool]), got {_shown(tool)}")
            table = tool.get("scalebox")
            if table is not None:
                if not isinstance(table, dict):
                    raise ConfigError(f"{pyproject}: tool.scalebox must be a table ([tool.scalebox]), got {_shown(table)}")
                return cls.from_dict(table, source=pyproject + " [tool.scalebox]")
        return cls()

    @classmethod
    def from_dict(cls, data: Dict[str, Any], source: Optional[str] = None) -> "Config":
        """A checked config: unknown keys, tables and options and bad values are one-line errors
        (with the nearest valid name), so nothing runs on a typo that would be ignored."""
        cfg = cls(source=source)
        where = source or "config"
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: a config must be a table of keys, got {_shown(data)}")
        for key, value in data.items():
            if key in ("include", "exclude", "transforms", "disabled"):
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ConfigError(f"{where}: {key} must be a list of strings")
                setattr(cfg, key, list(value))
            elif key == "backend":
                if value not in BACKENDS:
                    raise ConfigError(f"{where}: backend must be one of {', '.join(BACKENDS)}")
                cfg.backend = value
            elif isinstance(value, dict):
                for section, table in _tables(key, value):
                    cfg.options[section] = table
            elif key in OPTIONS or any(s.startswith(key + ".") for s in OPTIONS):
                raise ConfigError(f"{where}: {key} must be a table ([{key}]), got {_shown(value)}")
            else:
                raise ConfigError(f"{where}: unknown key {key!r}{_nearest(key, [*TOP_KEYS, *OPTIONS])}")
        cfg.check_options()
        return cfg

    def check_options(self) -> None:
        """Raise :class:`ConfigError` for the first unknown option or bad value."""
        where = self.source or "config"
        for section, table in self.options.items():
            if not table and section not in OPTIONS:
                raise ConfigError(f"{where}: {option_error(section, '', None)}")
            for key, value in table.items():
                problem = option_error(section, key, value)
                if problem:
                    raise ConfigError(f"{where}: {problem}")

    def check_transforms(self, known: Sequence[str]) -> None:
        """Raise :class:`ConfigError` for a ``transforms``/``disabled`` entry that names nothing."""
        where = self.source or "config"
        for key in ("transforms", "disabled"):
            for pattern in getattr(self, key):
                problem = transform_pattern_error(pattern, known)
                if problem:
                    raise ConfigError(f"{where}: {key}: {problem}")

    def replace(self, **changes: Any) -> "Config":
        new = copy.deepcopy(self)
        for key, value in changes.items():
            setattr(new, key, value)
        return new

    # ------------------------------------------------------------------ queries
    def option(self, section: str, key: str, default: Any = None) -> Any:
        return self.options.get(section, {}).get(key, default)

    def set_option(self, section: str, key: str, value: Any) -> None:
        self.options.setdefault(section, {})[key] = value

    def transform_enabled(self, transform_id: str) -> bool:
        on = any(_id_matches(transform_id, pat) for pat in self.transforms)
        if transform_id == "precision.autocast":  # off by default: named, or asked for by [precision] mode
            on = any(pat == transform_id or pat == "precision.*" for pat in self.transforms) or "mode" in self.options.get("precision", {})
        off = any(_id_matches(transform_id, pat) for pat in self.disabled)
        return on and not off

    def includes(self, relpath: str) -> bool:
        """Whether a project-relative path (``/``-separated) is snapshotted."""
        parts = relpath.split("/")
        if any(p in ALWAYS_EXCLUDED_DIRS for p in parts[:-1]):
            return False
        if not any(_glob_match(relpath, pat) for pat in self.include):
            return False
        return not any(_glob_match(relpath, pat) for pat in self.exclude)

    def excludes_dir(self, reldir: str) -> bool:
        """Whether a whole folder can be skipped while walking (cheap pruning)."""
        name = reldir.rsplit("/", 1)[-1]
        if name in ALWAYS_EXCLUDED_DIRS:
            return True
        return any(_glob_match(reldir + "/x", pat) and pat.endswith("/**") for pat in self.exclude)

    def fingerprint(self, transform_versions: Dict[str, str], backend: str) -> str:
        """Identity of everything that decides a rewrite's bytes (engine, transforms, options)."""
        payload = {
            "engine": __version__,
            "code": engine_digest(),
            "torch": installed_version("torch"),  # device.* entries depend on the torch the code runs on
            "transforms": sorted(transform_versions.items()),
            "backend": backend,
            "options": {k: v for k, v in self.options.items() if k != "run"},  # run limits change no rewrite
        }
        blob = json.dumps(payload, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


#: the engine core's modules that decide a rewrite's bytes: every top-level module the pipeline
#: imports (tests/scalebox_cst/test_config.py checks that none is missing) but ``_version``, whose
#: value the fingerprint holds
PIPELINE_MODULES = ("pipeline.py", "astsplice.py", "config.py", "continuation.py", "digits.py", "emitted.py", "fastcode.py",
                    "fused_program.py", "linediff.py", "oneline.py", "options.py", "report.py", "sourcefile.py", "textlines.py", "textshape.py")

#: packages whose code decides a rewrite's bytes, with the prefix their files are named by: the
#: transforms, and the runtime modules the pipeline and transforms read (``physical_lines``,
#: the fused programs of ``one_pass``)
_ENGINE_PACKAGES = (("scalebox_cst.transforms", ""), ("scalebox_cst.runtime", "runtime/"))


def engine_files() -> Tuple[List[str], List[Tuple[str, str]]]:
    """``(folders, [(path, name)])``: the code that decides a rewrite's bytes (the pipeline's own
    modules, every module of transforms/ and runtime/, subpackages included), and the folders
    walked to find it (their mtimes change when a module is added or removed). One list for the
    fingerprint's digest and for the import hook's memo of it, so the two never disagree."""
    here = os.path.dirname(os.path.abspath(__file__))
    files = [(os.path.join(here, n), n) for n in PIPELINE_MODULES]
    folders: List[str] = []
    for package, prefix in _ENGINE_PACKAGES:
        module = sys.modules.get(package)
        tops = list(getattr(module, "__path__", None) or [])
        if not tops:
            spec = importlib.util.find_spec(package)
            tops = list(spec.submodule_search_locations or []) if spec else []
        for top in tops:
            found = []
            for root, dirs, names in os.walk(top):  # families may be packages (device/, vectorize/)
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                folders.append(root)
                found += [os.path.join(root, n) for n in names if n.endswith(".py")]
            files += [(path, prefix + os.path.relpath(path, top).replace(os.sep, "/")) for path in sorted(found)]
    return folders, files


@functools.lru_cache(maxsize=None)
def engine_digest() -> str:
    """Digest of the code that decides a rewrite's bytes (``engine_files``).
    Part of the fingerprint, so an edited or upgraded engine never serves a rewrite cached by
    an older one, whether or not anyone bumped a transform's version."""
    digest = hashlib.sha256()
    for path, name in engine_files()[1]:
        if not os.path.exists(path):
            continue
        with open(path, "rb") as fh:
            digest.update(name.encode() + b"\0" + fh.read() + b"\0")
    return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def installed_version(dist: str) -> Optional[str]:
    """The installed version of distribution ``dist`` (None when absent); read once per process."""
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def find_project_root(start: str) -> str:
    """The nearest folder at or above ``start`` holding ``.scalebox/`` or ``scalebox.toml``;
    else ``start`` itself (its folder, for a file). Lives here because it must stay cheap to
    import (the import hook uses it before libcst or pygit2 are loaded)."""
    here = os.path.abspath(start)
    if os.path.isfile(here):
        here = os.path.dirname(here)
    probe = here
    while True:
        if os.path.isdir(os.path.join(probe, STATE_DIR)) or os.path.isfile(os.path.join(probe, CONFIG_FILE)):
            return probe
        parent = os.path.dirname(probe)
        if parent == probe:
            return here
        probe = parent


def _tables(key: str, value: Dict[str, Any]):
    """``(section, options)`` for a table: TOML reads ``[vectorize.recurrence]`` as a table
    ``recurrence`` inside ``vectorize``; the section is the dotted name."""
    if key in OPTIONS or not any(s.startswith(key + ".") for s in OPTIONS):
        yield key, dict(value)
        return
    for sub, inner in value.items():
        if not isinstance(inner, dict):
            yield key, {sub: inner}  # reported as an unknown table
        else:
            yield from _tables(f"{key}.{sub}", inner)


#: a config file larger than this is not read (a pyproject.toml is a few kB)
MAX_CONFIG_BYTES = 4 * 1024 * 1024


def _read_toml(path: str) -> Dict[str, Any]:
    from scalebox_cst.intake import NotRead, read_named

    try:
        data = read_named(path, limit=MAX_CONFIG_BYTES)  # a FIFO or /dev/zero never hangs
    except NotRead as exc:
        raise ConfigError(f"{path}: {exc}; not read") from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:  # tomllib decodes the whole file as UTF-8 first
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 (byte 0x{data[exc.start]:02x}); TOML files must be UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except (RecursionError, MemoryError):  # include = [[[[...]]]] thousands deep
        raise ConfigError(f"{path}: values nested too deeply to read") from None


def _id_matches(transform_id: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(transform_id, pattern) or transform_id.startswith(pattern + ".")


def _glob_match(relpath: str, pattern: str) -> bool:
    """Glob with ``**`` spanning folders; a pattern without ``/`` matches the file name anywhere."""
    if "/" not in pattern and "**" not in pattern:
        return fnmatch.fnmatchcase(relpath.rsplit("/", 1)[-1], pattern)
    return _match_parts(relpath.split("/"), pattern.split("/"))


def _match_parts(parts: List[str], pats: List[str]) -> bool:
    """Whether path ``parts`` match pattern ``pats`` (``**``: any number of folders).

    The set of pattern positions reachable after each part (a tiny NFA): linear in parts times
    pattern parts, where trying each split of each ``**`` grows exponentially with their
    number (``**/**/**/**/**/**/**/**/x.py`` took seconds per path) and recursed per part."""

    def closure(states):
        out = set()
        for i in states:
            out.add(i)
            while i < len(pats) and pats[i] == "**":
                i += 1
                out.add(i)
        return out

    states = closure({0})
    for part in parts:
        nxt = set()
        for i in states:
            if i < len(pats):
                if pats[i] == "**":
                    nxt.add(i)  # ** takes this part too
                elif fnmatch.fnmatchcase(part, pats[i]):
                    nxt.add(i + 1)
        states = closure(nxt)
        if not states:
            return False
    return len(pats) in states
