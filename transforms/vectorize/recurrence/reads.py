"""Which expressions of a loop body are per-step reads: ``x[t + k]``, an element of an iterated
sequence, a column ``x[t, j]`` / ``x_t[j]``. Every stage asks this (the analysis to check the
body, the plan to render it as arrays, the one-pass tier to spell its program), so it is one
frozen value built from the header and the containers the loop writes, with no cache of its own:
a column read is the same node text each time it is asked for (parsed once per text, below).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Mapping, Optional, Tuple

import libcst as cst

from ...analysis.cstclone import parse_expression
from .syntax import _code, _norm, _pure_container, _walk
from .body import BodyParser, _int_indices
from .headers import Header


@functools.lru_cache(maxsize=512)
def _column_text(cont: str, idx: Tuple[str, ...]) -> cst.BaseExpression:
    # libcst nodes are immutable: one parse per text serves every site that reads that column
    return parse_expression(f"__SBX__.column({cont}, ({', '.join(idx)},))")


def column_node(cont: cst.BaseExpression, idx: Tuple[str, ...]) -> cst.BaseExpression:
    """``column(x, (i, j))``, the per-step container of the column ``x[:, i, j]`` (the runtime
    gives None for what it cannot index that way, which the guard declines)."""
    return _column_text(_code(cont).strip(), idx)


def seq_label(cont: cst.BaseExpression) -> str:
    """The base of the array names for a per-step container: its last name, and for a column
    ``column(x, (0, -1))`` the container's with the indices (``x_0_m1``)."""
    key = _norm(cont)
    if isinstance(cont, cst.Call) and isinstance(cont.func, cst.Attribute) and cont.func.attr.value == "column" \
            and isinstance(cont.func.value, cst.Name) and cont.func.value.value == "__SBX__" \
            and len(cont.args) == 2 and isinstance(cont.args[1].value, cst.Tuple):
        idx = [_code(el.value).strip() for el in cont.args[1].value.elements]
        return f"{_norm(cont.args[0].value).split('.')[-1]}_" + "_".join(i.replace("-", "m") for i in idx)
    return key.split(".")[-1]


@dataclasses.dataclass(frozen=True)
class Reads:
    """Per-step reads of one loop: ``elements`` are the names bound to sequence elements
    (``for r, v in zip(reversed(rewards), ...)``), ``written`` the keys of the containers the
    loop writes (their reads are this step's output or memory, never an input)."""
    header: Header
    parser: BodyParser
    elements: Mapping[str, cst.BaseExpression]
    written: frozenset

    def per_step(self, e: cst.BaseExpression) -> Optional[Tuple[cst.BaseExpression, int]]:
        """(container, k) when ``e`` reads x[t + k] (an element of an iterated sequence: k = 0)."""
        if isinstance(e, cst.Name) and e.value in self.elements:
            return self.elements[e.value], 0
        col = self.element_column(e)
        if col is not None:
            return col, 0
        if isinstance(e, cst.Subscript) and _pure_container(e.value):
            if _norm(e.value) in self.written:
                return None  # this step's own output (forwarded) or memory: not an input
            k = self.parser.ref_offset(e)
            if k is not None:
                return e.value, k
            icol = self.index_column(e)
            if icol is not None:
                return column_node(e.value, icol[2]), icol[1]
        return None

    def element_column(self, e: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        """For ``x_t[i]`` / ``x_t[i, j]`` (``x_t`` an element of an iterated array, integer
        literal indices), the per-step container ``column(x, (i, j))``, i.e. ``x[:, i, j]``."""
        if not (isinstance(e, cst.Subscript) and isinstance(e.value, cst.Name) and e.value.value in self.elements):
            return None
        idx = _int_indices(e.slice)
        if idx is None:
            return None
        return column_node(self.elements[e.value.value], idx)

    def index_column(self, e: cst.BaseExpression) -> Optional[Tuple[cst.BaseExpression, int, Tuple[str, ...]]]:
        """(x, k, (i, ...)) for ``x[t + k, i, ...]`` (integer literal indices after the first)."""
        if self.header.kind != "index" or not isinstance(e, cst.Subscript) or len(e.slice) < 2 \
                or not _pure_container(e.value):
            return None
        k = self.parser.ref_offset(e.with_changes(slice=[e.slice[0]]))
        idx = _int_indices(e.slice[1:])
        if k is None or idx is None:
            return None
        return e.value, k, idx

    def reads_written(self, e: cst.BaseExpression) -> bool:
        """``e`` reads (a subscript of) a container the loop writes."""
        return any(isinstance(n, cst.Subscript) and _pure_container(n.value) and _norm(n.value) in self.written
                   for n in _walk(e))
