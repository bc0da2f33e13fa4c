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
from typing import Any, Dict, List, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from scalebox_cst._version import __version__

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
DEFAULT_TRANSFORMS = ["grad_clip", "vectorize.*", "device.*"]

DEFAULT_TOML = """\
# scalebox_cst configuration. Every key is optional; the values below are the defaults.
# The engine rewrites copies of these files into .scalebox/store.git; your files are never edited.

# Files to snapshot and rewrite (glob patterns relative to this directory; ** matches folders).
include = ["**/*.py"]
# Files to leave out (.scalebox/, .git/ and __pycache__/ are always left out).
exclude = [".venv/**", "venv/**", "env/**", "build/**", "dist/**"]

# Transforms to run, by id or glob: "grad_clip", "vectorize.*", "device.*".
transforms = ["grad_clip", "vectorize.*", "device.*"]
# Transforms to switch off even if matched above, e.g. ["vectorize.elementwise"].
disabled = []

# Target backend for device.* transforms: "auto" (detected), "cpu", "cuda" or "npu".
backend = "auto"

[grad_clip]
# Inserted clipping: torch.nn.utils.clip_grad_norm_ over each optimizer's parameters.
max_norm = 1.0
"""


class ConfigError(ValueError):
    """A configuration file that cannot be read or holds an invalid value."""


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
        path = os.path.join(project_dir, CONFIG_FILE)
        if os.path.isfile(path):
            return cls.from_dict(_read_toml(path), source=path)
        pyproject = os.path.join(project_dir, "pyproject.toml")
        if os.path.isfile(pyproject):
            table = _read_toml(pyproject).get("tool", {}).get("scalebox")
            if table is not None:
                return cls.from_dict(table, source=pyproject + " [tool.scalebox]")
        return cls()

    @classmethod
    def from_dict(cls, data: Dict[str, Any], source: Optional[str] = None) -> "Config":
        cfg = cls(source=source)
        where = source or "config"
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
                cfg.options[key] = dict(value)
            else:
                raise ConfigError(f"{where}: unknown key {key!r}")
        max_norm = cfg.option("grad_clip", "max_norm", 1.0)
        if not isinstance(max_norm, (int, float)) or isinstance(max_norm, bool) or max_norm <= 0:
            raise ConfigError(f"{where}: grad_clip.max_norm must be a positive number")
        return cfg

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
            "options": self.options,
        }
        blob = json.dumps(payload, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def engine_digest() -> str:
    """Digest of the code that decides a rewrite's bytes (the pipeline and the transform modules).
    Part of the fingerprint, so an edited or upgraded engine never serves a rewrite cached by
    an older one, whether or not anyone bumped a transform's version."""
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.join(here, "pipeline.py")]
    spec = importlib.util.find_spec("scalebox_cst.transforms")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        paths += sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".py"))
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as fh:
            digest.update(os.path.basename(path).encode() + b"\0" + fh.read() + b"\0")
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


def _read_toml(path: str) -> Dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _id_matches(transform_id: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(transform_id, pattern) or transform_id.startswith(pattern + ".")


def _glob_match(relpath: str, pattern: str) -> bool:
    """Glob with ``**`` spanning folders; a pattern without ``/`` matches the file name anywhere."""
    if "/" not in pattern and "**" not in pattern:
        return fnmatch.fnmatchcase(relpath.rsplit("/", 1)[-1], pattern)
    return _match_parts(relpath.split("/"), pattern.split("/"))


def _match_parts(parts: List[str], pats: List[str]) -> bool:
    if not pats:
        return not parts
    head, rest = pats[0], pats[1:]
    if head == "**":
        return any(_match_parts(parts[i:], rest) for i in range(len(parts) + 1))
    if not parts:
        return False
    return fnmatch.fnmatchcase(parts[0], head) and _match_parts(parts[1:], rest)
