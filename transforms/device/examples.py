"""Each device transform's examples: every table entry's golden ``before`` (rewritten where its
``after`` differs, its output the golden file named by the entry's id; else left alone with the
entry's reason reported), and the hand-written look-alikes that must stay untouched."""
from __future__ import annotations

from typing import Dict, Tuple

from ..base import Example
from . import table as T


PLACEMENT_LOOKALIKES: Tuple[Example, ...] = (
    Example(
        "import torch\nclass Pool:\n    def cuda(self):\n        return self\npool = Pool().cuda()\n",
        False,
        reason="defines its own `cuda`",
        note="user-defined cuda method",
        backend="npu",
    ),
)

OPTIMIZER_LOOKALIKES: Tuple[Example, ...] = (
    Example(
        "import torch\nopt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)\n",
        False,
        reason="set by the user",
        note="user chose foreach",
        backend="cuda",
    ),
)

FUSED_OP_LOOKALIKES: Tuple[Example, ...] = (
    Example(
        "import torch.nn.functional as F\ny = F.gelu(h, approximate='tanh')\n",
        False,
        reason="nothing to fix",
        note="tanh gelu",
        backend="npu",
    ),
)

_LOOKALIKES: Dict[str, Tuple[Example, ...]] = {
    T.PLACEMENT: PLACEMENT_LOOKALIKES,
    T.OPTIMIZER: OPTIMIZER_LOOKALIKES,
    T.FUSED_OP: FUSED_OP_LOOKALIKES,
}


def examples(transform_id: str) -> Tuple[Example, ...]:
    """The table's golden examples for ``transform_id``, then its look-alikes."""
    out = []
    for e in T.entries_for(transform_id):
        if e.before and e.after != e.before:
            out.append(Example(e.before, True, note=e.id, backend=e.golden_backend, options=e.example_options,
                               expected=e.id))
        elif e.before:  # reported (a warning), changed nothing
            out.append(Example(e.before, False, reason=e.reason, note=e.id, backend=e.golden_backend,
                               options=e.example_options))
    return tuple(out) + _LOOKALIKES.get(transform_id, ())
