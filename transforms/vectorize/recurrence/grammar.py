"""The expression grammar the vectorizer understands: every method raises Skip with the reason a
loop is left alone. A frozen value over what the analysis knows when it asks (the header, the
per-step reads, the names the body assigns), so the quadratic family checks its inner loop with
the same rules by subclassing the one entry point it widens (``int(x[k])``).
"""
from __future__ import annotations

import dataclasses
from typing import Set

import libcst as cst

from ...analysis.purity import pure_call
from ...analysis.scopes import builtin_checker
from ...base import FileContext
from .syntax import _CAST_METHODS, _code, _head, _names_read, _norm, _pure_container, Skip
from .body import _callee
from .headers import Header
from .reads import Reads
from . import conds


#: builtins a step may call on its numbers (gtml's ``int(not (done and t == T - 1))``): named as
#: builtins in the reason, not as calls of unknown effect
_NUMBER_BUILTINS = frozenset({"int", "float", "bool", "abs", "round", "min", "max", "len", "sum", "pow", "divmod"})


#: what the operator reasons add: the only arithmetic the vectorized recurrence is built from
_ONLY = ": the vectorized recurrence is built from + - * / and dtype casts only"


#: the binary operators :meth:`Grammar.check` admits (exact types: none has a subclass)
_ARITHMETIC = frozenset((cst.Add, cst.Subtract, cst.Multiply, cst.Divide))


@dataclasses.dataclass(frozen=True)
class Grammar:
    """The grammar's checks for one loop (``body_assigned``: the names its body binds)."""
    ctx: FileContext
    header: Header
    reads: Reads
    body_assigned: frozenset

    def check(self, e: cst.BaseExpression) -> None:
        """The expression grammar the vectorizer understands (raises Skip with the reason).
        (Exact types where the common cases are tested: libcst's concrete expression classes
        have no subclasses, and ``isinstance`` against them goes through ``ABCMeta``.)"""
        if type(e) is cst.Integer or type(e) is cst.Float:
            return
        if type(e) is cst.Name:
            if self.header.kind == "index" and e.value == self.header.index:
                raise Skip(f"uses the loop index `{e.value}` as a value")
            return
        if type(e) is cst.Attribute:
            if _pure_container(e) and _head(e) not in self.body_assigned:
                return
            raise Skip(f"reads attribute `{_code(e).strip()}` of a value computed in the loop")
        if type(e) is cst.Subscript:
            self.check_subscript(e)
            return
        if type(e) is cst.BinaryOperation:
            if type(e.operator) not in _ARITHMETIC:
                raise Skip(f"operator `{_code(e.operator).strip()}` in `{_code(e).strip()}`{_ONLY}")
            self.check(e.left)
            self.check(e.right)
            return
        if isinstance(e, cst.UnaryOperation):
            if isinstance(e.operator, (cst.Minus, cst.Plus)):
                self.check(e.expression)
                return
            raise Skip(f"operator `{_code(e.operator).strip()}` in `{_code(e).strip()}`{_ONLY}")
        if isinstance(e, cst.IfExp):
            if self.reads.parser.lsplit(e.test) is None:
                raise Skip(f"conditional expression `{_code(e).strip()}`: only one whose test picks out the last "
                           "step (`t < T - 1`, `t == T - 1`) is vectorized")
            self.check(e.body)
            self.check(e.orelse)
            return
        if isinstance(e, cst.Call):
            self._check_call(e)
            return
        if isinstance(e, (cst.Yield, cst.Await)):
            raise Skip("`yield` / `await` in the loop body")
        raise Skip(f"unsupported expression `{_code(e).strip()}`")

    def _check_call(self, e: cst.Call) -> None:
        f = e.func
        if isinstance(f, cst.Attribute) and f.attr.value in _CAST_METHODS and not any(a.star for a in e.args):
            if f.attr.value == "astype" and len(e.args) != 1:
                raise Skip(f"call `{_code(e).strip()}`")
            if f.attr.value != "astype" and e.args:
                raise Skip(f"call `{_code(e).strip()}`")
            for a in e.args:
                if not (_pure_container(a.value) or isinstance(a.value, cst.SimpleString)):
                    raise Skip(f"call `{_code(e).strip()}`")
            self.check(f.value)
            return
        if pure_call(e, self.ctx.imports):
            raise Skip(f"calls `{_callee(e)}()`, which is pure, but the vectorized recurrence is built from "
                       "+ - * / and dtype casts only")
        if isinstance(f, cst.Name) and f.value in _NUMBER_BUILTINS and builtin_checker(self.ctx.tree)(f.value):
            raise Skip(f"calls the builtin `{f.value}()` in the loop body (the vectorized recurrence is built "
                       "from + - * / and dtype casts only)")
        raise Skip(f"calls `{_callee(e)}()` in the loop body (unknown side effects)")

    def check_subscript(self, e: cst.Subscript) -> None:
        reads = self.reads
        if reads.element_column(e) is not None:  # x_t[0] of a row x_t: a per-step read of x[:, 0]
            return
        base = e.value
        if not _pure_container(base):
            raise Skip(f"indexes `{_code(e).strip()}`")
        if _head(base) in self.body_assigned or _head(base) in reads.elements:
            raise Skip(f"indexes `{_code(e).strip()}`, a value computed in the loop")
        k = reads.parser.ref_offset(e)
        col = reads.index_column(e)
        if k is None and col is not None:
            k = col[1]
        if k is not None:
            if _norm(base) in reads.written and k != 0:
                raise Skip(f"reads `{_code(e).strip()}`, which the loop writes (a recurrence through memory)")
            return  # k == 0 of a written container: forward_reads decides
        names: Set[str] = set().union(*(_names_read(s) for s in e.slice))
        if self.header.kind == "index" and self.header.index in names:
            raise Skip(f"indexes `{_code(e).strip()}` (only [t] and [t + k] with k >= 0 are vectorized)")
        if names & self.body_assigned:
            raise Skip(f"indexes `{_code(e).strip()}` with a value computed in the loop")
        if _norm(base) in reads.written:
            raise Skip(f"reads `{_code(e).strip()}`, which the loop writes")
        # a loop-invariant read such as next_value[0]

    def check_cond(self, cond: cst.BaseExpression) -> None:
        """An episode reset's condition: a per-step flag, ``.item()`` of one, a comparison with a
        number, or ``not`` one of these (see :mod:`.conds`)."""
        e = cond
        if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Not):
            e = e.expression
        base, test, _ = conds.split_cond(e)
        if self.reads.per_step(base) is None:
            raise Skip(f"episode reset on `{_code(cond).strip()}` (understood: a per-step flag `x[t]`, "
                       "`x[t].item()`, `x[t] == 1` or another comparison with a number, or `not` one)")
