"""The accelerator swap table: every device rewrite is one entry of data, with its golden example.

A new swap is one :class:`Swap` here (plus, when it emits a new torch_npu function, that function
in the test stand-in ``tests/fake_torch_npu``); ``tests/transforms/device/test_device_table.py`` runs each entry's
``before`` through the pipeline and compares with its ``after``. The engine that interprets the
``kind`` of an entry is :mod:`scalebox_cst.transforms.device`; the table holds no logic. One file
per transform family; :mod:`.swap` says what an entry is.
"""
from __future__ import annotations

from typing import Tuple

from .autocast import AUTOCAST_SWAPS
from .fused_op import FUSED_OP_SWAPS
from .optimizer import OPTIMIZER_SWAPS
from .placement import PLACEMENT_SWAPS
from .precision import PRECISION_SWAPS
from .swap import (  # noqa: F401 - the table's public names
    AUTOCAST, CONDITIONS, CUDA_LITERAL, DEVICE_POSITIONS, FUSED_OP, KINDS, NPU_HELPERS, NPU_IMPORT, OPTIMIZER,
    PLACEMENT, PRECISION, SECTION, UNSUPPORTED, Swap,
)
from .unsupported import UNSUPPORTED_SWAPS

TABLE: Tuple[Swap, ...] = (
    *PLACEMENT_SWAPS, *AUTOCAST_SWAPS, *OPTIMIZER_SWAPS, *FUSED_OP_SWAPS, *PRECISION_SWAPS, *UNSUPPORTED_SWAPS,
)


def entries_for(transform_id: str) -> Tuple[Swap, ...]:
    return tuple(e for e in TABLE if e.transform == transform_id)


def owned_qualnames() -> frozenset:
    """Qualified names some rewriting entry handles (not reported as "cannot be migrated")."""
    kinds = ("rename", "call-replace", "helper", "legacy-tensor")
    return frozenset(q for e in TABLE if e.kind in kinds for q in e.qualnames)
