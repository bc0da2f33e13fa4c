"""The run-time check of a forward that ``hot.no_grad`` runs under ``torch.no_grad()`` though the
module it calls arrives as a parameter (``def iterate_batches(env, net, ...)``: ``net(obs)``).

What such a call runs is known only once the value is: the rewrite keeps the statement as written
in the else branch and takes the ``no_grad`` branch where each module is exactly one of the
classes of the file whose forward the analysis checked (``type(m) in classes``: a subclass may
override ``forward``, so it is not taken). One type look-up a module, on the acting path.
"""
from __future__ import annotations

from typing import Any, Tuple

from scalebox_cst.runtime import guard_reasons


def checked_modules(classes: Tuple[type, ...], *modules: Any) -> bool:
    """Whether every module in ``modules`` is an instance of exactly one of ``classes``."""
    for module in modules:
        if type(module) not in classes:
            return guard_reasons.no("a module of a class whose forward was not checked")
    return True
