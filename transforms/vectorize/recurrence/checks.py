"""The expression grammar the vectorizer understands and the dataflow between steps (a Planner
mixin: every method raises Skip with the reason a loop is left alone).
"""
from __future__ import annotations

from typing import Dict, List, Set

import libcst as cst

from ...analysis.purity import pure_call
from ...analysis.scopes import builtin_checker
from .syntax import _CAST_METHODS, _code, _head, _names_read, _norm, _pure_container, Skip, _walk
from .body import _callee, _flatten, Item
from . import conds
from .affine import Recurrence


#: builtins a step may call on its numbers (gtml's ``int(not (done and t == T - 1))``): named as
#: builtins in the reason, not as calls of unknown effect
_NUMBER_BUILTINS = frozenset({"int", "float", "bool", "abs", "round", "min", "max", "len", "sum", "pow", "divmod"})


class BodyChecks:
    """The body's grammar and dataflow (see module docstring)."""

    def check(self, e: cst.BaseExpression) -> None:
        """The expression grammar the vectorizer understands (raises Skip with the reason)."""
        if isinstance(e, (cst.Integer, cst.Float)):
            return
        if isinstance(e, cst.Name):
            if self.h.kind == "index" and e.value == self.h.index:
                raise Skip(f"uses the loop index `{e.value}` as a value")
            return
        if isinstance(e, cst.Attribute):
            if _pure_container(e) and _head(e) not in self.body_assigned:
                return
            raise Skip(f"reads attribute `{_code(e).strip()}` of a value computed in the loop")
        if isinstance(e, cst.Subscript):
            self.check_subscript(e)
            return
        if isinstance(e, cst.BinaryOperation):
            if not isinstance(e.operator, (cst.Add, cst.Subtract, cst.Multiply, cst.Divide)):
                raise Skip(f"operator `{_code(e.operator).strip()}` in `{_code(e).strip()}`")
            self.check(e.left)
            self.check(e.right)
            return
        if isinstance(e, cst.UnaryOperation):
            if isinstance(e.operator, (cst.Minus, cst.Plus)):
                self.check(e.expression)
                return
            raise Skip(f"operator `{_code(e.operator).strip()}` in `{_code(e).strip()}`")
        if isinstance(e, cst.IfExp):
            if self.parser.lsplit(e.test) is None:
                raise Skip(f"conditional expression `{_code(e).strip()}`")
            self.check(e.body)
            self.check(e.orelse)
            return
        if isinstance(e, cst.Call):
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
        if isinstance(e, (cst.Yield, cst.Await)):
            raise Skip("`yield` / `await` in the loop body")
        raise Skip(f"unsupported expression `{_code(e).strip()}`")

    def check_subscript(self, e: cst.Subscript) -> None:
        if self.element_column(e) is not None:  # x_t[0] of a row x_t: a per-step read of x[:, 0]
            return
        base = e.value
        if not _pure_container(base):
            raise Skip(f"indexes `{_code(e).strip()}`")
        if _head(base) in self.body_assigned or _head(base) in self.elements:
            raise Skip(f"indexes `{_code(e).strip()}`, a value computed in the loop")
        k = self.parser.ref_offset(e)
        col = self.index_column(e)
        if k is None and col is not None:
            k = col[1]
        if k is not None:
            if _norm(base) in self.written and k != 0:
                raise Skip(f"reads `{_code(e).strip()}`, which the loop writes (a recurrence through memory)")
            return  # k == 0 of a written container: forward_reads decides
        names: Set[str] = set().union(*(_names_read(s) for s in e.slice))
        if self.h.kind == "index" and self.h.index in names:
            raise Skip(f"indexes `{_code(e).strip()}` (only [t] and [t + k] with k >= 0 are vectorized)")
        if names & self.body_assigned:
            raise Skip(f"indexes `{_code(e).strip()}` with a value computed in the loop")
        if _norm(base) in self.written:
            raise Skip(f"reads `{_code(e).strip()}`, which the loop writes")
        # a loop-invariant read such as next_value[0]

    def carried_copies(self, middle: List[Item]) -> List[Item]:
        """``gae = delta + c * last_gae``, ..., ``last_gae = gae`` (the carried value kept in a copy,
        as LLM fine-tuning code writes GAE): in the middle steps ``last_gae`` already equals ``gae``
        when a step starts, so the update is ``last_gae = delta + c * last_gae`` where ``gae`` was
        assigned, ``gae = last_gae`` right after it, and the copy at the end has nothing to do.
        Taken when the copy is the step's only assignment to ``last_gae``, at the top level, and
        between the update and the copy nothing assigns either name or reads ``last_gae``. The peeled
        steps run the statements as written (the first one is where ``gae`` gets its first value)."""
        out = list(middle)
        top = {id(it) for it in self.items}  # both run in every step, the peeled first one included
        for k, cp in enumerate(middle):
            if cp.kind != "assign" or cp.var is None or cp.outs or not isinstance(cp.value, cst.Name) \
                    or cp.first or cp.guarded or id(cp) not in top:
                continue
            L, X = cp.var, cp.value.value
            if L == X or any(it.var == L for it in middle if it is not cp):
                continue
            src = next((j for j in range(k - 1, -1, -1) if middle[j].var == X), None)
            if src is None:
                continue
            up = middle[src]
            if up.kind != "assign" or L not in _names_read(up.value) or up.first or up.guarded \
                    or id(up) not in top:
                continue
            between = middle[src + 1:k]
            if any(x.var in (L, X) or L in _names_read(x.value if x.value is not None else x.cond)
                   for x in between):
                continue
            i = out.index(up)
            out[i:i + 1] = [Item("assign", node=up.node, var=L, value=up.value, shown=up.value),
                            Item("assign", node=up.node, var=X, outs=up.outs, value=cst.Name(L))]
            out.remove(cp)
        return out

    def dataflow(self) -> None:
        # the branches of last-step conditional expressions run in the peeled first step, after the
        # guard: they must not undo what it checked (the grammar's rules hold for them too)
        for it in self._all_items(self.items):
            for expr in it.first:
                self.check(expr)
        middle = self.middle
        # each write into a list / deque becomes one extend of the whole block: two writes into the
        # same container per step would come out grouped by write, not interleaved by step
        seen: Set[str] = set()
        for it in middle:
            if it.container is not None:
                key = _norm(it.container)
                if key in seen:
                    raise Skip(f"writes into `{_code(it.container).strip()}` twice per step "
                               "(one extend per write would reorder its items)")
                seen.add(key)
        defined: Set[str] = set()
        assign_of: Dict[str, Item] = {}
        pre_reads: Dict[str, List[Item]] = {}
        resets: Dict[str, Item] = {}
        for it in middle:
            if it.kind == "reset":
                if it.var in resets:
                    raise Skip(f"`{it.var}` is reset twice in one step")
                if it.var in defined:
                    raise Skip(f"`{it.var}` is reset after it was assigned in the same step")
                resets[it.var] = it
                reads = _names_read(it.cond) & self.body_assigned
            else:
                reads = _names_read(it.value) & self.body_assigned
            for n in reads:
                if n not in defined:
                    pre_reads.setdefault(n, []).append(it)
            if it.kind == "assign" and it.var is not None:
                if it.var in assign_of:
                    raise Skip(f"`{it.var}` is assigned twice in one step")
                assign_of[it.var] = it
                defined.add(it.var)
        self.assign_of = assign_of
        self.recs: List[Recurrence] = []
        self.shift: Dict[str, Item] = {}
        rec_vars: List[str] = []
        for n, readers in pre_reads.items():
            own = assign_of.get(n)
            if own is None:
                raise Skip(f"`{n}` keeps its value from an earlier step (it is not assigned on every path)")
            if own in readers:
                others = [r for r in readers if r is not own]
                if others:
                    raise Skip(f"the carried value `{n}` is read before its update, outside the update")
                rec_vars.append(n)
            else:
                if not self._shiftable(own):
                    raise Skip(f"`{n}` carries a value from the previous step that is not a plain per-step read")
                self._same_in_first_step(n, own)
                self.shift[n] = own
        for n in resets:
            if n not in rec_vars:
                raise Skip(f"`{n}` is reset but it is not a carried recurrence")
        if not rec_vars:
            raise Skip("no value in the loop depends on its own previous value")
        if resets and self.has_split:
            raise Skip("an episode reset together with the last-step special case")
        self.rec_vars = rec_vars
        self.resets = resets
        self._switch_rules(middle, assign_of, resets)
        # post-update reads of a carried value: allowed; pre-update ones were refused above.
        # values read in the middle steps must be computed from per-step reads and invariants
        for it in middle:
            if it.kind == "reset":
                self.check_cond(it.cond)

    def _switch_rules(self, middle: List[Item], assign_of: Dict[str, Item], resets: Dict[str, Item]) -> None:
        """``if done: gae = 0; ret = 0 else: gae = delta + c * gae; ret = r + g * ret`` (either way
        round): an episode end stores the constants instead of updating, which the op does as the
        recurrence reset one step below with the constant stored at the reset step
        (runtime.vectorized.switch_linear_recurrence). That holds when each value reset there is
        updated in the other branch and nothing else is: a carried value updated only there would
        keep its value at a reset, a temporary computed only there would too (read later in the
        step or after the loop), and a write there would happen only on some steps. The
        reset step's constant itself would land in a list (a Python int where the op gives array
        elements): loops that write lists are left alone."""
        switched = {n for n, r in resets.items() if r.switch}
        if not switched:
            return
        if any(it.container is not None for it in middle):
            raise Skip("an episode reset as an if/else in a loop that writes a list (at an episode end the "
                       "list would get the constant itself)")
        for n in switched:
            own = assign_of.get(n)
            if own is None or not own.guarded:
                raise Skip(f"`{n}` is reset in an if/else but updated outside it")
        for it in middle:
            if not it.guarded:
                continue
            if it.kind != "assign" or it.var is None or it.outs:
                text = _code(it.node).strip()
                raise Skip(f"`{text}` runs only on steps that do not end an episode "
                           "(only assignments to names are understood there)")
            if it.var in self.rec_vars and it.var not in switched:
                raise Skip(f"`{it.var}` is updated only on steps that do not end an episode, not reset on the others")
            if it.var not in self.rec_vars:  # at an episode end it keeps an older step's value, in the loop
                raise Skip(f"`{it.var}` is computed only on steps that do not end an episode (the others "
                           "keep an older value)")  # and after it: the vectorized steps do not compute that

    def _same_in_first_step(self, n: str, own: Item) -> None:
        """A value carried into the next step is computed for step t = T-2 from the other steps'
        formula at t + 1 = T-1; the peeled step T-1 must have assigned it that way too (not in a
        last-step branch of its own, ``prev = 0.0 if t == T - 1 else values[t]``). Where the step
        assigns it more than once (``last_value = last_value * mask; ...; last_value = values[t]``),
        the last assignment is the one carried."""
        first = [x for x in _flatten(self.items, False) if x.kind == "assign" and x.var == n]
        if first and not first[-1].first and not own.first and (
                first[-1] is own or _norm(first[-1].value) == _norm(own.value)):
            return
        raise Skip(f"`{n}` carries into the next step a value the last-step case t = T-1 computes "
                   "otherwise than the other steps")

    def _reads_written(self, e: cst.BaseExpression) -> bool:
        """``e`` reads (a subscript of) a container the loop writes."""
        written = getattr(self, "written", ())
        return any(isinstance(n, cst.Subscript) and _pure_container(n.value) and _norm(n.value) in written
                   for n in _walk(e))

    def _shiftable(self, it: Item) -> bool:
        if it.outs or it.value is None:
            return False
        if self._reads_written(it.value):
            return False  # what this step stored, carried into the next one
        return not (_names_read(it.value) & self.body_assigned)

    def check_cond(self, cond: cst.BaseExpression) -> None:
        e = cond
        if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Not):
            e = e.expression
        base, test, _ = conds.split_cond(e)
        if self.per_step(base) is None:
            raise Skip(f"episode reset on `{_code(cond).strip()}` (understood: a per-step flag `x[t]`, "
                       "`x[t].item()`, `x[t] == 1` or another comparison with a number, or `not` one)")
