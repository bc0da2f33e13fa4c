"""Time along dimension 1 (pymarl's ``ret[:, t]``): the loop read through time-major views.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import libcst as cst

from ...base import FileContext
from ...names import dotted
from .syntax import _bound_names, _code, _head, _names_read, _norm, _pure_container, Skip, _walk
from .headers import Header


def _is_full_slice(el: cst.SubscriptElement) -> bool:
    sl = el.slice
    return isinstance(sl, cst.Slice) and sl.lower is None and sl.upper is None and sl.step is None


def _time_views(ctx: FileContext, node: cst.For, header: Header) -> Optional[Tuple[cst.For, List[Tuple[str, str]]]]:
    """pymarl walks time along dimension 1: ``ret[:, t] = ... ret[:, t + 1] ...``. For the analysis
    the loop is read with ``x[:, i, ...]`` (``i`` reading ``t``) as ``x_t[i, ...]``, ``x_t`` the
    time-major view ``x.movedim(1, 0)`` the guard binds (runtime.vectorized.dim1: None for what
    has no dimension 1); the first, last and else-branch loops keep the original text. None when
    the loop indexes nothing that way; Skip when a container is also used otherwise (two names
    for one memory) or rebound in the loop."""
    if header.kind != "index":
        return None
    t = header.index
    found: Dict[str, cst.BaseExpression] = {}
    for n in _walk(node.body):
        if isinstance(n, cst.Subscript) and len(n.slice) >= 2 and _is_full_slice(n.slice[0]) \
                and _pure_container(n.value) and t in _names_read(n.slice[1].slice):
            found.setdefault(_norm(n.value), n.value)
    if not found:
        return None
    bound = _bound_names(node.body)
    names: Dict[str, str] = {}
    for key, cont in found.items():
        if _head(cont) in bound:
            raise Skip(f"`{_code(cont).strip()}` is indexed along dimension 1 and reassigned in the loop")
        names[key] = ctx.imports.unique_name(f"{key.split('.')[-1]}_t")

    class Sub(cst.CSTTransformer):
        def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript) -> cst.BaseExpression:
            if len(updated.slice) >= 2 and _is_full_slice(updated.slice[0]) and _pure_container(updated.value) \
                    and _norm(updated.value) in names and t in _names_read(updated.slice[1].slice):
                rest = list(updated.slice[1:])
                rest[-1] = rest[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                return cst.Subscript(value=cst.Name(names[_norm(updated.value)]), slice=rest,
                                     lpar=updated.lpar, rpar=updated.rpar)
            return updated

    new = node.with_changes(body=node.body.visit(Sub()))
    left = _names_read(new.body)
    chains = {dotted(n) for n in _walk(new.body) if isinstance(n, cst.Attribute)}
    for key, cont in found.items():
        if (key in left) if isinstance(cont, cst.Name) else (key in chains):
            raise Skip(f"`{_code(cont).strip()}` is indexed along dimension 1 and also otherwise")
    return new, [(names[k], _code(c).strip()) for k, c in found.items()]
