"""Rendering the body's expressions as array expressions over the vectorized steps, with the
body's operation grouping. The plan's builder: each rendering records the per-step inputs,
invariants and flags it used, and :meth:`Renderer.tables` hands them on frozen for the guard.
The recurrence renders the middle steps t = T-2 .. 1 (rows ``[1 + k : T - 1 + k]``); the
quadratic family renders the whole inner range (``window`` 0) and widens :meth:`render` for
``int(x[k])``.
"""
from __future__ import annotations

import dataclasses
import types
from typing import Callable, Dict, Mapping, Set, Tuple

import libcst as cst

from .syntax import _code, _names_read, _norm, _OP_TEXT, Skip, spells
from .body import AnyItem
from .reads import Reads, seq_label
from . import conds


@dataclasses.dataclass(frozen=True)
class Tables:
    """What the rendering used, for the guard and the bindings: per-step inputs (container key ->
    the largest offset read), their array names and nodes, the episode flags (``conds``, with
    ``cond_tests`` the extra arguments of ``truth_of``), loop invariants (``consts``; ``scalars``
    those that must be Python numbers or 0-d arrays), forwarded reads (output code -> number of
    column indices) and whether anything divides."""
    seqs: Mapping[str, int]
    seq_nodes: Mapping[str, cst.BaseExpression]
    vec_names: Mapping[str, str]
    conds: Mapping[str, int]
    cond_names: Mapping[str, str]
    cond_tests: Mapping[str, str]
    consts: Tuple[str, ...]
    scalars: Tuple[str, ...]
    fwd_reads: Mapping[str, int]
    divides: bool


class Renderer:
    """Renders one loop's expressions over its vectorized steps (see module docstring)."""

    #: the first row of a read at offset k is ``k + window``; the slices hold T - 2 rows (window 1)
    window = 1

    def __init__(self, reads: Reads, fresh: Callable[[str], str], T: str, *, body_assigned: frozenset,
                 shift: Mapping[str, AnyItem] = types.MappingProxyType({}),
                 forwarded: Mapping[int, Tuple[str, Tuple[str, ...]]] = types.MappingProxyType({})) -> None:
        self.reads, self.fresh, self.T = reads, fresh, T
        self.body_assigned, self.shift, self.forwarded = body_assigned, shift, forwarded
        self.seqs: Dict[str, int] = {}  # container key -> max offset read
        self.seq_nodes: Dict[str, cst.BaseExpression] = {}
        self.vec_names: Dict[str, str] = {}  # container key -> its array name
        self.conds: Dict[str, int] = {}
        self.cond_names: Dict[str, str] = {}
        self.cond_tests: Dict[str, str] = {}  # cond key -> truth_of's extra arguments (see conds)
        self.consts: Dict[str, None] = {}
        self.scalars: Dict[str, None] = {}
        self.fwd_reads: Dict[str, int] = {}  # out code -> number of column indices of its reads
        self.step_names: Set[str] = set()  # arrays over the vectorized steps (temporaries, results)
        self.divides = False

    def tables(self) -> Tables:
        return Tables(
            seqs=types.MappingProxyType(dict(self.seqs)), seq_nodes=types.MappingProxyType(dict(self.seq_nodes)),
            vec_names=types.MappingProxyType(dict(self.vec_names)), conds=types.MappingProxyType(dict(self.conds)),
            cond_names=types.MappingProxyType(dict(self.cond_names)),
            cond_tests=types.MappingProxyType(dict(self.cond_tests)), consts=tuple(self.consts),
            scalars=tuple(self.scalars), fwd_reads=types.MappingProxyType(dict(self.fwd_reads)),
            divides=self.divides)

    def label(self, cont: cst.BaseExpression) -> str:
        """The base of the array names of a per-step container."""
        return seq_label(cont)

    def stop(self, k: int) -> str:
        T = self.T
        return f"{T} - 1" if k == 0 else (T if k == 1 else f"{T} + {k - 1}")

    def use_seq(self, cont: cst.BaseExpression, k: int) -> str:
        key = _norm(cont)
        if key not in self.vec_names:
            self.vec_names[key] = self.fresh(f"{self.label(cont)}_v")
            self.seq_nodes[key] = cont
        self.seqs[key] = max(self.seqs.get(key, 0), k)
        return f"{self.vec_names[key]}[{self.window + k}:{self.stop(k)}]"

    def use_cond(self, cont: cst.BaseExpression, k: int, test: str = "", number: str = "") -> str:
        """The truth values of ``cont``'s steps (``test``: see :mod:`.conds`) over the middle steps."""
        base = _norm(cont)
        key = base + (f"|{conds.cond_key(test, number)}" if test else "")
        if key not in self.cond_names:
            self.cond_names[key] = self.fresh(f"{seq_label(cont)}_c")
            self.seq_nodes.setdefault(key, conds.node_for(test, cont) or cont)
            self.cond_tests[key] = conds.truth_args(test, number)
        self.conds[key] = max(self.conds.get(key, 0), k)
        return f"{self.cond_names[key]}[{self.window + k}:{self.stop(k)}]"

    def render(self, e: cst.BaseExpression, env: Dict[str, str], shift: int = 0) -> str:
        """``e`` over the middle steps: per-step reads become slices, temporaries their arrays."""
        lp, rp = "(" * len(getattr(e, "lpar", ())), ")" * len(getattr(e, "rpar", ()))
        if id(e) in self.forwarded:  # this step's stored value, already written
            if shift:
                raise Skip(f"`{_code(e).strip()}` is carried into the next step")
            code, idx = self.forwarded[id(e)]
            self.fwd_reads[code] = len(idx)
            return lp + f"{code}[1:{self.T} - 1" + "".join(f", {i}" for i in idx) + "]" + rp
        ref = self.reads.per_step(e)
        if ref is not None:
            return lp + self.use_seq(ref[0], ref[1] + shift) + rp
        if isinstance(e, cst.Name):
            if e.value in env:
                return lp + env[e.value] + rp
            if e.value in self.shift:
                return lp + "(" + self.render(self.shift[e.value].value, {}, shift + 1) + ")" + rp  # type: ignore[arg-type]
            if e.value in self.body_assigned:  # pragma: no cover - excluded by the dataflow
                raise Skip(f"`{e.value}` is used before it is computed")
            self.consts[e.value] = None
            return _code(e)
        if isinstance(e, (cst.Attribute, cst.Subscript)):
            index = self.reads.header.index
            if index is not None and index in _names_read(e):  # pragma: no cover - a safety net
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
            m_then = self.reads.parser.lsplit(e.test)
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
        if self.reads.per_step(e) is not None or self.reads.reads_written(e):
            return False
        if isinstance(e, cst.Name):
            return e.value not in env and e.value not in self.body_assigned
        if isinstance(e, cst.BinaryOperation):
            return self.invariant(e.left, env) and self.invariant(e.right, env)
        if isinstance(e, cst.UnaryOperation):
            return self.invariant(e.expression, env)
        if isinstance(e, cst.Call):
            return self.invariant(e.func.value, env)  # type: ignore[attr-defined]
        if isinstance(e, cst.IfExp):
            return False
        return True

    def has_step(self, text: str) -> bool:
        """Whether rendered ``text`` varies over the steps (reads an array of the steps)."""
        names = set(self.vec_names.values()) | set(self.cond_names.values())
        names |= self.step_names
        if any(spells(text, n, f"[1:{self.T} - 1") for n in self.fwd_reads):
            return True
        return any(spells(text, n) for n in names)
