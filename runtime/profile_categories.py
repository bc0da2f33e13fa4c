"""The profile's categories, in the order reports list them, with the words a researcher uses.

One table for the sampler in the run (runtime.telemetry.profile) and the host's reader
(scalebox_cst.profile); a module of its own so that the host imports only this, not the
telemetry package.
"""
from __future__ import annotations

from typing import Dict

#: category -> what a researcher calls it (the order reports list them in)
CATEGORIES: Dict[str, str] = {
    "env": "environment step",
    "action": "acting/target forward",  # grad off: acting, and an update's no_grad targets
    "distributions": "distributions",
    "tensors": "tensor creation and copies",
    "replay": "replay/batch sampling",
    "forward": "loss forward",
    "backward": "backward",
    "optimizer": "optimizer step",
    "sync": "host-device syncs",
    "logging": "logging",
    "engine": "engine sites",
    "imports": "start-up (imports)",
    "other": "other",
}
