"""Device swaps (Ascend NPU through torch_npu, CUDA fused paths, CPU foreach) read from one table.

Every swap is an entry of :mod:`.table` (data); this package is the engine that interprets an
entry's ``kind``. Matching is by qualified name through the module's imports and by argument
position (``torch.device(...)``'s first argument, any ``device=`` keyword, ``.to(...)``, ...), so
``import torch as th`` works and a ``"cuda"`` in a print is never touched. A device string held in
a variable is followed back to its assignment, parameter default or argparse default when the
variable reaches a device argument (or is passed to this module's own function or class).

Save-to-commit latency shapes the engine. Everything is decided on Python's ``ast`` (parsed once
per module version and shared by the six transforms, as are the module facts the prefilter reads):
a transform with nothing to change never makes the pipeline parse libcst, and sites take their
lines from ``ast``. Only the edits touch libcst: each edited node is reached down the statement
path from the module and found by position in a code generation of that one statement (of a
compound statement, its header only), never of the whole file (PositionProvider costs tens of ms);
one transformer pass then enters only the paths to the edits, so every other byte is kept.


Layout (one concept per module): :mod:`.table` the swap table (one file per family), :mod:`.facts`
module facts, scopes and the installed torch, :mod:`.source` the text as ``ast`` positions read it,
:mod:`.analyzer` the planning walk (a mixin per concern), :mod:`.edits` what an edit is,
:mod:`.locate` the fast libcst locator, :mod:`.apply` the rebuild, :mod:`.examples`,
:mod:`.transforms` the six transform classes. Call-argument and node helpers shared with the other
families are in :mod:`scalebox_cst.transforms.analysis`.
"""
from __future__ import annotations

from . import table  # noqa: F401
from .analyzer import _Analyzer  # noqa: F401
from .apply import _apply  # noqa: F401
from .facts import _Facts, _Scope, _module_facts, installed_torch  # noqa: F401 - tests replace _Facts, installed_torch here
from .locate import _Locator, _Miss  # noqa: F401
from .transforms import (
    DEVICE_TRANSFORMS,
    DeviceAutocast,
    DeviceFusedOp,
    DeviceOptimizer,
    DevicePlacement,
    DevicePrecision,
    DeviceUnsupported,
)

__all__ = [
    "DEVICE_TRANSFORMS", "DeviceAutocast", "DeviceFusedOp", "DeviceOptimizer", "DevicePlacement", "DevicePrecision",
    "DeviceUnsupported", "installed_torch", "table",
]
