"""Shared static facts about loops for the ``vectorize.*`` transforms.

What a loop rewrite must prove before it replaces a loop: the loop cannot exit early or bind
names in odd ways, its expressions are pure, and the names it binds are not read after it (a
vectorized loop does not leave its loop variables behind). Everything here is conservative: when
in doubt a function answers "unsafe" and the caller skips the loop with the returned reason.

The analysis itself lives in :mod:`scalebox_cst.transforms.analysis` (one concept per module:
bodies, reads, purity, scopes, loops, statements, elementwise, rewriting); this module keeps the
old import path (``from scalebox_cst.transforms import loop_analysis``) leading to the same objects.
"""
from __future__ import annotations

from .analysis.bodies import (  # noqa: F401
    _BLOCK_FIELDS,
    _code,
    early_exit_reason,
    _ExitFinder,
    flat_body,
    target_names,
)
from .analysis.reads import (  # noqa: F401
    _all_names,
    _Bindings,
    _DYNAMIC,
    _enclosing_loops,
    _enclosing_loops_visit,
    _locals_of,
    names_read,
    _param_names,
    read_elsewhere,
    _Reads,
    _skeleton,
    _skeleton_path,
    _store_names,
)
from .analysis.purity import (  # noqa: F401
    ALLOWED_KEYWORDS,
    EXACT_FUNCS,
    EXACT_METHODS,
    INEXACT_FUNCS,
    INEXACT_METHODS,
    is_pure,
    is_simple_ref,
    _PURE_BINOPS,
)
from .analysis.scopes import (  # noqa: F401
    ast_rebound,
    _ast_rebound_walk,
    _ast_store_names,
    builtin_checker,
    declares_global,
    rebinds,
)
from .analysis.loops import (  # noqa: F401
    BATCH_GUARD_NOTE,
    _bound_ok,
    is_runtime_guard,
    LoopHeader,
    parse_header,
    parse_iteration,
)
from .analysis.statements import (  # noqa: F401
    _AST_COMPOUND,
    ast_guarded,
    ast_is_flat,
    ast_statements,
    _AST_TO_CST,
    CstStatements,
)
from .analysis.elementwise import (  # noqa: F401
    ElementwiseExpr,
)
from .analysis.rewriting import (  # noqa: F401
    _PathReplacer,
    replace_nodes,
    ScopedRewriter,
)
