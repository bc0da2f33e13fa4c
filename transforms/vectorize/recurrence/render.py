"""Per-step reads (``x[t + k]``, columns ``x[t, j]``) and their rendering as array expressions over
the middle steps t = T-2 .. 1, with the body's operation grouping (a Planner mixin).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import libcst as cst

from .syntax import _code, _names_read, _norm, _OP_TEXT, _pure_container, Skip
from .body import _int_indices
from . import conds


class Render:
    """Per-step reads and their rendering as arrays."""

    def per_step(self, e: cst.BaseExpression) -> Optional[Tuple[cst.BaseExpression, int]]:
        """(container, k) when ``e`` reads x[t + k] (an element of an iterated sequence: k = 0)."""
        if isinstance(e, cst.Name) and e.value in self.elements:
            return self.elements[e.value], 0
        col = self.element_column(e)
        if col is not None:
            return col, 0
        if isinstance(e, cst.Subscript) and _pure_container(e.value):
            if _norm(e.value) in getattr(self, "written", ()):
                return None  # this step's own output (forwarded) or memory: not an input
            k = self.parser.ref_offset(e)
            if k is not None:
                return e.value, k
            icol = self.index_column(e)
            if icol is not None:
                return self._column_node(e.value, icol[2]), icol[1]
        return None

    def element_column(self, e: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        """For ``x_t[i]`` / ``x_t[i, j]`` (``x_t`` an element of an iterated array, integer
        literal indices), the per-step container ``column(x, (i, j))``, i.e. ``x[:, i, j]``: the
        runtime gives None for what it cannot index that way, which the guard declines."""
        if not (isinstance(e, cst.Subscript) and isinstance(e.value, cst.Name) and e.value.value in self.elements):
            return None
        key = _norm(e)
        if key in self.columns:
            return self.columns[key]
        idx = _int_indices(e.slice)
        if idx is None:
            return None
        node = self._column_node(self.elements[e.value.value], idx)
        self.columns[key] = node
        return node

    def index_column(self, e: cst.BaseExpression) -> Optional[Tuple[cst.BaseExpression, int, Tuple[str, ...]]]:
        """(x, k, (i, ...)) for ``x[t + k, i, ...]`` (integer literal indices after the first)."""
        if self.h.kind != "index" or not isinstance(e, cst.Subscript) or len(e.slice) < 2 \
                or not _pure_container(e.value):
            return None
        k = self.parser.ref_offset(e.with_changes(slice=[e.slice[0]]))
        idx = _int_indices(e.slice[1:])
        if k is None or idx is None:
            return None
        return e.value, k, idx

    def _column_node(self, cont: cst.BaseExpression, idx: Tuple[str, ...]) -> cst.BaseExpression:
        node = cst.parse_expression(f"__SBX__.column({_code(cont).strip()}, ({', '.join(idx)},))")
        self.seq_labels[_norm(node)] = f"{_norm(cont).split('.')[-1]}_" + "_".join(i.replace("-", "m") for i in idx)
        return node

    # ---- rendering of the middle steps t = T-2 .. 1
    def stop(self, k: int) -> str:
        T = self.T
        return f"{T} - 1" if k == 0 else (T if k == 1 else f"{T} + {k - 1}")

    def use_seq(self, cont: cst.BaseExpression, k: int) -> str:
        key = _norm(cont)
        if key not in self.vec_names:
            self.vec_names[key] = self.fresh(f"{self.seq_labels.get(key, key.split('.')[-1])}_v")
            self.seq_nodes[key] = cont
        self.seqs[key] = max(self.seqs.get(key, 0), k)
        return f"{self.vec_names[key]}[{1 + k}:{self.stop(k)}]"

    def use_cond(self, cont: cst.BaseExpression, k: int, test: str = "", number: str = "") -> str:
        """The truth values of ``cont``'s steps (``test``: see :mod:`.conds`) over the middle steps."""
        base = _norm(cont)
        key = base + (f"|{conds.cond_key(test, number)}" if test else "")
        if key not in self.cond_names:
            self.cond_names[key] = self.fresh(f"{self.seq_labels.get(base, base.split('.')[-1])}_c")
            self.seq_nodes.setdefault(key, conds.node_for(test, cont) or cont)
            self.cond_tests[key] = conds.truth_args(test, number)
        self.conds[key] = max(self.conds.get(key, 0), k)
        return f"{self.cond_names[key]}[{1 + k}:{self.stop(k)}]"

    def render(self, e: cst.BaseExpression, env: Dict[str, str], shift: int = 0) -> str:
        """``e`` over the middle steps: per-step reads become slices, temporaries their arrays."""
        lp, rp = "(" * len(getattr(e, "lpar", ())), ")" * len(getattr(e, "rpar", ()))
        if id(e) in self.forwarded:  # this step's stored value, already written
            if shift:
                raise Skip(f"`{_code(e).strip()}` is carried into the next step")
            code, idx = self.forwarded[id(e)]
            self.fwd_reads[code] = len(idx)
            return lp + f"{code}[1:{self.T} - 1" + "".join(f", {i}" for i in idx) + "]" + rp
        ref = self.per_step(e)
        if ref is not None:
            return lp + self.use_seq(ref[0], ref[1] + shift) + rp
        if isinstance(e, cst.Name):
            if e.value in env:
                return lp + env[e.value] + rp
            if e.value in self.shift:
                return lp + "(" + self.render(self.shift[e.value].value, {}, shift + 1) + ")" + rp
            if e.value in self.body_assigned:  # pragma: no cover - excluded by the dataflow
                raise Skip(f"`{e.value}` is used before it is computed")
            self.consts[e.value] = None
            return _code(e)
        if isinstance(e, (cst.Attribute, cst.Subscript)):
            if self.h.index is not None and self.h.index in _names_read(e):  # pragma: no cover - a safety net
                raise Skip(f"reads `{_code(e).strip()}`, which the loop writes")
            self.consts[_code(e).strip()] = None
            return _code(e)
        if isinstance(e, (cst.Integer, cst.Float)):
            return _code(e)
        if isinstance(e, cst.BinaryOperation):
            if isinstance(e.operator, cst.Divide):
                self.divides = True
            op = _OP_TEXT[type(e.operator)]  # source text may hold a line continuation or a comment
            return f"{lp}{self.render(e.left, env, shift)} {op} {self.render(e.right, env, shift)}{rp}"
        if isinstance(e, cst.UnaryOperation):
            op = _OP_TEXT[type(e.operator)]
            return f"{lp}{op}{self.render(e.expression, env, shift)}{rp}"
        if isinstance(e, cst.IfExp):
            m_then = self.parser.lsplit(e.test)
            branch = e.body if m_then else e.orelse
            return f"{lp}({self.render(branch, env, shift)}){rp}"
        if isinstance(e, cst.Call):
            f = e.func
            assert isinstance(f, cst.Attribute)
            args = ", ".join(_code(a.value).strip() for a in e.args)
            return f"{lp}{self.render(f.value, env, shift)}.{f.attr.value}({args}){rp}"
        raise Skip(f"unsupported expression `{_code(e).strip()}`")  # pragma: no cover

    def invariant(self, e: cst.BaseExpression, env: Dict[str, str]) -> bool:
        """No per-step read, temporary or carried value under ``e``."""
        if self.per_step(e) is not None or self._reads_written(e):
            return False
        if isinstance(e, cst.Name):
            return e.value not in env and e.value not in self.body_assigned
        if isinstance(e, cst.BinaryOperation):
            return self.invariant(e.left, env) and self.invariant(e.right, env)
        if isinstance(e, cst.UnaryOperation):
            return self.invariant(e.expression, env)
        if isinstance(e, cst.Call):
            return self.invariant(e.func.value, env)
        if isinstance(e, cst.IfExp):
            return False
        return True
