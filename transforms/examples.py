"""Every transform's documented examples in one list, each with where its expected output lives.

The examples sit beside their transforms (``EXAMPLES`` on each class, see :mod:`.base`); this is
the one walk over them that the example test (tests/transforms/test_examples_registry.py), the
updater of the golden files (tests/update_examples.py) and the docs share, so none of them keeps
its own list of families.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Dict, List, Optional, Type

from .base import Example, Transform

#: a golden file's suffix (not ``.py``: the files are outputs, not modules of the package)
SUFFIX = ".expected"


@dataclasses.dataclass(frozen=True)
class Case:
    """One example of one transform, numbered in its class's ``EXAMPLES``."""

    transform: Type[Transform]
    index: int
    example: Example

    @property
    def id(self) -> str:
        """``<transform id>/<golden name>`` for a rewritten example, ``<transform id>#<index>`` else."""
        if self.example.expected:
            return f"{self.transform.id}/{self.example.expected}"
        return f"{self.transform.id}#{self.index}"

    @property
    def golden(self) -> Optional[str]:
        """The path of the expected output (rewritten examples only)."""
        if not self.example.expected:
            return None
        return os.path.join(golden_dir(self.transform), self.example.expected + SUFFIX)

    def expected_output(self) -> bytes:
        """What the transform must make of the code: the golden file's bytes, or the code itself."""
        if self.golden is None:
            return self.example.code.encode()
        with open(self.golden, "rb") as fh:
            return fh.read()

    def option_tables(self) -> Dict[str, Dict[str, Any]]:
        """The example's options as ``{section: {key: value}}``."""
        if not self.example.options:
            return {}
        return {self.transform.options_section or self.transform.id: dict(self.example.options)}


def golden_dir(cls: Type[Transform]) -> str:
    """``expected/<transform id>`` in the folder of the module defining ``cls``."""
    module = sys.modules[cls.__module__]
    return os.path.join(os.path.dirname(os.path.abspath(str(module.__file__))), "expected", cls.id)


def all_examples() -> List[Case]:
    """Every example of every registered transform, in pipeline order."""
    from . import REGISTRY  # the registry imports every family; this module is imported by none

    return [Case(cls, i, example) for cls in REGISTRY for i, example in enumerate(cls.EXAMPLES)]


def check_names(cases: List[Case]) -> List[str]:
    """What is wrong with the examples' golden names: a rewritten example without one, a
    left-alone example with one, two examples of a transform sharing one, or one that is not a
    plain file name."""
    problems: List[str] = []
    seen = set()
    for case in cases:
        name, where = case.example.expected, f"{case.transform.id} example {case.index}"
        if case.example.rewritten and not name:
            problems.append(f"{where}: rewritten, but names no expected output")
        elif not case.example.rewritten and name:
            problems.append(f"{where}: left alone, but names an expected output {name!r}")
        elif name and (os.sep in name or name.startswith(".") or not name.strip()):
            problems.append(f"{where}: expected {name!r} is not a plain file name")
        elif name and case.id in seen:
            problems.append(f"{where}: expected {name!r} is used twice")
        seen.add(case.id)
    return problems


def orphans(cases: List[Case]) -> List[str]:
    """Golden files that no example names (left behind by a renamed or removed example)."""
    named = {case.golden for case in cases if case.golden}
    out: List[str] = []
    for cls in {case.transform for case in cases}:
        folder = golden_dir(cls)
        if os.path.isdir(folder):
            out.extend(os.path.join(folder, f) for f in sorted(os.listdir(folder))
                       if os.path.join(folder, f) not in named)
    return sorted(out)
