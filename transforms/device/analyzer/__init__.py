"""The device analyzer: plans one transform's edits over the ``ast`` and reports every site.

One walk (:mod:`.walk`) visits the module in libcst's order; each concern is a mixin holding the
handlers for its entry kinds: references and methods (:mod:`.references`), device strings and
cuDNN flags (:mod:`.placement`), legacy tensor types and the is_available() guards around
what stays CUDA-only (:mod:`.legacy`), replaced calls and added keywords (:mod:`.calls`: autocast,
optimizers), fused kernels (:mod:`.fused`), the TF32 insert (:mod:`.precision`), reports of what
cannot be migrated (:mod:`.unsupported`). :mod:`.core` holds the state and shared helpers.
"""
from __future__ import annotations

from .calls import Calls
from .core import Core
from .fused import Fused
from .legacy import Legacy
from .placement import Placement
from .precision import Precision
from .references import References
from .unsupported import Unsupported
from .walk import Walk


class _Analyzer(Core, Walk, References, Placement, Legacy, Calls, Fused, Precision, Unsupported):
    """Plans the edits of one transform's active entries over the ``ast``, in libcst's visiting
    order (so sites come out in the same order), and reports every site."""


__all__ = ["_Analyzer"]
