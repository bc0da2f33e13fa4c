"""``explore.yaml`` / ``explore.toml``: a study's script, metric, budget and search space.

Read strictly: an unknown key, a wrong type or a range of the wrong kind is one line naming the
key (``explore.yaml: params.LR.loguniform: expects [low, high] numbers with 0 < low < high``),
before anything is committed or run. Parameter names are checked against the tunable places
of the code later (:func:`bind`), when the project's files are read.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Dict, List, Optional, Sequence

from scalebox_cst.options import SEED_LIMIT, seed_ok, shown
from scalebox_cst.explore.places import Place, PlaceError, lookup, resolve

SAMPLERS = ("tpe", "random", "cmaes", "qmc", "gp")
PRUNERS = ("median", "none")
_KEYS = {"study", "script", "args", "metric", "direction", "trials", "seeds", "parallel", "launcher", "address",
         "sampler", "prune", "prune_warmup_steps", "files", "params", "timeout"}
_SPEC_KINDS = ("uniform", "loguniform", "int", "choice")
_STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # \Z: $ matches before a last newline


class ExploreConfigError(ValueError):
    """One line naming the file and the key."""


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    key: str  # as written under params:
    kind: str  # uniform | loguniform | int | choice
    low: Any = None
    high: Any = None
    log: bool = False
    choices: tuple = ()

    def describe(self) -> str:
        if self.kind == "choice":
            return f"choice {list(self.choices)}"
        return f"{self.kind} [{self.low}, {self.high}]" + (" log" if self.log and self.kind == "int" else "")


@dataclasses.dataclass
class ExploreConfig:
    path: str
    study: str
    script: str
    args: List[str]
    metric: str
    direction: str = "maximize"
    trials: int = 20
    seeds: List[Optional[int]] = dataclasses.field(default_factory=lambda: [None])
    parallel: int = 1
    launcher: str = "local"
    address: Optional[str] = None
    sampler: str = "tpe"
    prune: str = "none"
    prune_warmup_steps: int = 0
    files: List[str] = dataclasses.field(default_factory=list)
    params: List[ParamSpec] = dataclasses.field(default_factory=list)
    timeout: Optional[float] = None  # seconds per run; None: no limit


def _read(path: str) -> Dict[str, Any]:
    from scalebox_cst.config import MAX_CONFIG_BYTES
    from scalebox_cst.intake import NotRead, read_named

    name = os.path.basename(path)
    try:  # a FIFO or a link to /dev/zero: one line, never a hang
        raw = read_named(path, limit=MAX_CONFIG_BYTES)
    except NotRead as exc:
        raise ExploreConfigError(f"{path}: {exc}; not read") from None
    if path.endswith(".toml"):
        try:
            import tomllib
        except ImportError:  # Python 3.10
            import tomli as tomllib
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ExploreConfigError(f"{name}: not valid TOML ({str(exc).splitlines()[0]})") from None
    else:
        import yaml

        try:
            data = yaml.load(raw, Loader=_unique_keys_loader())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f":{mark.line + 1}" if mark is not None else ""
            raise ExploreConfigError(f"{name}{where}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(data, dict):
        raise ExploreConfigError(f"{name}: expects a mapping of keys (script:, metric:, params: ...)")
    return data


def _unique_keys_loader() -> Any:
    """PyYAML's safe loader, refusing a key given twice in one mapping (``lr:`` twice kept the
    last in silence: TOML refuses it itself)."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: the base loader says so
                    break
                if duplicate:
                    raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
            return super().construct_mapping(node, deep=deep)

    # YAML 1.1 (PyYAML) reads `1e-4` (no dot) as a string, the way most people write a learning
    # rate: `loguniform: [1e-4, 1e-2]` was refused as "got ['1e-4', '1e-2']". Read as YAML 1.2
    # and every other tool read it: a float.
    UniqueKeys.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))
    return UniqueKeys


#: ``1e-4``, ``-3E+2``, ``2_5e3``: an exponent without a dot (YAML 1.2's float)
_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+\Z")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _spec(name: str, key: str, raw: Any) -> ParamSpec:
    where = f"{name}: params.{key}"
    if not isinstance(raw, dict):
        raise ExploreConfigError(f"{where}: expects one of {', '.join(k + ': [...]' for k in _SPEC_KINDS)}")
    kinds = [k for k in raw if k in _SPEC_KINDS]
    extra = [k for k in raw if k not in _SPEC_KINDS and k != "log"]
    if extra:
        raise ExploreConfigError(f"{where}.{extra[0]}: unknown key (expected {', '.join(_SPEC_KINDS)}, log)")
    if len(kinds) != 1:
        raise ExploreConfigError(f"{where}: expects exactly one of {', '.join(_SPEC_KINDS)}")
    kind = kinds[0]
    value = raw[kind]
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise ExploreConfigError(f"{where}.log: expects true or false")
    if log and kind != "int":
        raise ExploreConfigError(f"{where}.log: only for int ranges (use loguniform for floats)")
    if kind == "choice":
        if not isinstance(value, list) or not value or any(isinstance(v, (list, dict)) or v is None for v in value):
            raise ExploreConfigError(f"{where}.choice: expects a non-empty list of numbers, strings or booleans")
        if any(isinstance(v, float) and not math.isfinite(v) for v in value):  # no literal writes them
            raise ExploreConfigError(f"{where}.choice: expects finite numbers, got {value}")
        return ParamSpec(key, kind, choices=tuple(value))
    if not isinstance(value, list) or len(value) != 2:
        raise ExploreConfigError(f"{where}.{kind}: expects [low, high]")
    low, high = value
    if kind == "int":
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ExploreConfigError(f"{where}.int: expects [low, high] integers, got {value}")
        if low > high or (log and low <= 0):
            raise ExploreConfigError(f"{where}.int: expects low <= high{' and low > 0 (log)' if log else ''}, got {value}")
    else:
        if not all(_number(v) for v in value):
            raise ExploreConfigError(f"{where}.{kind}: expects [low, high] numbers, got {value}")
        if not all(math.isfinite(v) for v in value) or not math.isfinite(float(high) - float(low)):
            # Optuna draws from [low, high) with numpy, which raises OverflowError on such a range
            raise ExploreConfigError(f"{where}.{kind}: expects finite low and high a float can span, got {value}")
        if not low < high or (kind == "loguniform" and low <= 0):
            raise ExploreConfigError(f"{where}.{kind}: expects {'0 < ' if kind == 'loguniform' else ''}low < high, got {value}")
        low, high = float(low), float(high)
    return ParamSpec(key, kind, low, high, log)


def load(path: str) -> ExploreConfig:
    """The validated config at ``path`` (YAML, or TOML by its .toml suffix)."""
    try:
        return _load(path)
    except RecursionError:  # a file nested thousands deep: the parsers recurse per level
        raise ExploreConfigError(f"{os.path.basename(path)}: values nested too deeply to read") from None


def _load(path: str) -> ExploreConfig:
    name = os.path.basename(path)
    data = _read(path)
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ExploreConfigError(f"{name}: {unknown[0]}: unknown key (expected one of {', '.join(sorted(_KEYS))})")
    for required in ("script", "metric", "params"):
        if required not in data:
            raise ExploreConfigError(f"{name}: {required}: missing")

    def want(key, check, what):
        if key in data and not check(data[key]):
            raise ExploreConfigError(f"{name}: {key}: expects {what}, got {shown(data[key])}")

    want("script", lambda v: isinstance(v, str) and v.endswith(".py"), "a .py path")
    want("metric", lambda v: isinstance(v, str) and v.strip(), "a metric name")
    want("script", lambda v: "\0" not in v, "a path without NUL bytes")
    want("args", lambda v: isinstance(v, list) and all(isinstance(a, (str, int, float)) and "\0" not in str(a) for a in v),
         "a list of strings (without NUL bytes: a command line cannot hold one)")
    want("direction", lambda v: v in ("maximize", "minimize"), "maximize or minimize")
    want("trials", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1")
    want("parallel", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1")
    want("seeds", lambda v: isinstance(v, list) and v and all(seed_ok(s) for s in v), f"a non-empty list of integers from 0 to {SEED_LIMIT - 1}")
    want("launcher", lambda v: v in ("local", "ray"), "local or ray")
    want("address", lambda v: isinstance(v, str), "a Ray address")
    want("sampler", lambda v: v in SAMPLERS, " or ".join(SAMPLERS))
    want("prune", lambda v: v in PRUNERS or v is False, "median or none")
    want("prune_warmup_steps", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer >= 0")
    want("files", lambda v: isinstance(v, list) and all(isinstance(f, str) and "\0" not in f for f in v), "a list of .py paths")
    want("timeout", lambda v: _number(v) and v > 0, "seconds > 0")
    want("params", lambda v: isinstance(v, dict) and v, "a mapping of parameter: range")
    want("study", lambda v: isinstance(v, str) and _STUDY_NAME.match(v), "a name of letters, digits, _ . -")
    if "address" in data and data.get("launcher") != "ray":
        raise ExploreConfigError(f"{name}: address: only with launcher: ray")
    stem = os.path.splitext(name)[0]
    study = data.get("study") or (stem if _STUDY_NAME.match(stem) else "study")
    params = [_spec(name, str(key), raw) for key, raw in data["params"].items()]
    prune = data.get("prune", "none")
    return ExploreConfig(
        path=os.path.abspath(path), study=study, script=data["script"], args=[str(a) for a in data.get("args", [])],
        metric=data["metric"].strip(), direction=data.get("direction", "maximize"), trials=data.get("trials", 20),
        seeds=list(data.get("seeds", [None])), parallel=data.get("parallel", 1), launcher=data.get("launcher", "local"),
        address=data.get("address"), sampler=data.get("sampler", "tpe"), prune="none" if prune is False else prune,
        prune_warmup_steps=data.get("prune_warmup_steps", 0), files=list(data.get("files", [])), params=params,
        timeout=data.get("timeout"),
    )


def bind(config: ExploreConfig, places: Sequence[Place]) -> Dict[str, Place]:
    """params key -> the place it names, with each range checked against the place's value:
    a float range on an int place (``type=int``) or a numeric range on a string is an error."""
    name = os.path.basename(config.path)
    bound: Dict[str, Place] = {}
    for spec in config.params:
        try:
            place = resolve(spec.key, places)
        except PlaceError as exc:
            if lookup(spec.key, places):
                raise ExploreConfigError(f"{name}: params.{spec.key}: {exc}") from None
            # only the script's places and those of `files:` are looked at: `explore --list
            # model.py` shows a place that the study cannot name until model.py is listed there
            searched = ", ".join(dict.fromkeys([config.script, *config.files]))
            names = ", ".join(sorted({p.qualified for p in places})) or "(none)"
            raise ExploreConfigError(f"{name}: params.{spec.key}: unknown parameter {spec.key!r} in {searched} "
                                     f"(tunable places: {names}); a place of another file: list it under files:") from None
        current = place.value
        numeric = _number(current)
        if spec.kind != "choice" and not numeric:
            raise ExploreConfigError(f"{name}: params.{spec.key}: {spec.kind} gives numbers but {place.qualified} ({place.where}) holds {current!r}; use choice: [...]")
        if spec.kind in ("uniform", "loguniform") and isinstance(current, int):
            raise ExploreConfigError(f"{name}: params.{spec.key}: {spec.kind} gives floats but {place.qualified} ({place.where}) is an int ({place.text}); use int: [low, high]")
        if spec.kind == "choice" and numeric and not all(_number(c) for c in spec.choices):
            raise ExploreConfigError(f"{name}: params.{spec.key}: choice holds non-numbers but {place.qualified} ({place.where}) is a number ({place.text})")
        if spec.kind == "choice" and isinstance(current, int) and numeric and any(isinstance(c, float) for c in spec.choices):
            raise ExploreConfigError(f"{name}: params.{spec.key}: choice holds floats but {place.qualified} ({place.where}) is an int ({place.text})")
        taken = [k for k, p in bound.items() if p == place]
        if taken:
            raise ExploreConfigError(f"{name}: params.{spec.key}: the same place as params.{taken[0]} ({place.ref})")
        bound[spec.key] = place
    return bound
