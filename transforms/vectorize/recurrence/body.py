"""Parsing a candidate loop's body into :class:`Item` updates (assignments, appends, episode resets,
the last-step special case), or Skip with the reason.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple, TypeVar, Union

import libcst as cst

from ...names import dotted
from .syntax import _code, _is_int, _norm, _paren, _pure_container, Skip, _stmts, _of_type
from .headers import Header


@dataclasses.dataclass
class Item:
    kind: str  # "assign" | "append" | "insert" | "appendleft" | "reset" | "split"
    node: Optional[cst.CSTNode] = None
    var: Optional[str] = None
    outs: List[cst.BaseExpression] = dataclasses.field(default_factory=list)
    value: Optional[cst.BaseExpression] = None
    container: Optional[cst.BaseExpression] = None
    cond: Optional[cst.BaseExpression] = None
    const: Optional[str] = None
    then: List["Item"] = dataclasses.field(default_factory=list)
    other: List["Item"] = dataclasses.field(default_factory=list)
    m_is_then: bool = False
    wrap: bool = False  # lst.append([x]): the value is x, each item a one-element list
    #: the branches of last-step conditional expressions (``x[t + 1] if t < T - 1 else last``) that
    #: only the peeled step t = T-1 evaluates; ``value`` holds the other steps' branch (see middle_value)
    first: List[cst.BaseExpression] = dataclasses.field(default_factory=list)
    shown: Optional[cst.BaseExpression] = None  # the value as written, when ``first`` is not empty
    #: ``if done: s = 0 else: s = f(s)``: a reset of the if/else form (``switch``, the step stores the
    #: constant instead of updating) and the items of its update branch (``guarded``)
    switch: bool = False
    guarded: bool = False
    #: ``out[t] += v`` / ``out[t] -= v``: the operator ("+=" / "-=") of an accumulating write of ``outs[0]``
    accum: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class FrozenItem:
    """An :class:`Item` as the analysis stage hands it on (:mod:`.analysis`): the same fields,
    lists as tuples, nothing assignable. The analysis rewrites its working items in place (a
    read-back becomes a carried name); the plan and the emitted code read only these."""
    kind: str
    node: Optional[cst.CSTNode] = None
    var: Optional[str] = None
    outs: Tuple[cst.BaseExpression, ...] = ()
    value: Optional[cst.BaseExpression] = None
    container: Optional[cst.BaseExpression] = None
    cond: Optional[cst.BaseExpression] = None
    const: Optional[str] = None
    then: Tuple["FrozenItem", ...] = ()
    other: Tuple["FrozenItem", ...] = ()
    m_is_then: bool = False
    wrap: bool = False
    first: Tuple[cst.BaseExpression, ...] = ()
    shown: Optional[cst.BaseExpression] = None
    switch: bool = False
    guarded: bool = False
    accum: Optional[str] = None


#: an item either way: the analysis's working one or the frozen one it hands on
AnyItem = Union[Item, FrozenItem]


#: :class:`Item`'s field names (``dataclasses.fields`` builds its tuple anew at each call)
_ITEM_FIELDS = tuple(f.name for f in dataclasses.fields(Item))


def freeze(it: AnyItem, done: Dict[int, FrozenItem]) -> FrozenItem:
    """``it`` frozen; ``done`` maps each item already frozen (by id) to its frozen copy, so an
    item reached twice (the top level and a flattened case, the middle steps and a reset table)
    is one object afterwards, as it was before."""
    if isinstance(it, FrozenItem):
        return it
    got = done.get(id(it))
    if got is None:
        fields = {name: getattr(it, name) for name in _ITEM_FIELDS}
        fields.update(outs=tuple(it.outs), first=tuple(it.first), then=tuple(freeze(x, done) for x in it.then),
                      other=tuple(freeze(x, done) for x in it.other))
        got = done[id(it)] = FrozenItem(**fields)
    return got


_ACCUMULATE = {cst.AddAssign: "+=", cst.SubtractAssign: "-="}

_FORBIDDEN_SMALL = {
    cst.Break: "`break` in the loop body",
    cst.Continue: "`continue` in the loop body",
    cst.Return: "`return` in the loop body",
    cst.Raise: "`raise` in the loop body",
    cst.Global: "`global` in the loop body",
    cst.Nonlocal: "`nonlocal` in the loop body",
    cst.Del: "`del` in the loop body",
    cst.Assert: "`assert` in the loop body",
    cst.Import: "an import in the loop body",
    cst.ImportFrom: "an import in the loop body",
    cst.AnnAssign: "an annotated assignment in the loop body",
}


class BodyParser:
    def __init__(self, header: Header) -> None:
        self.h = header

    # ---- the last-step test: t == T - 1 and its spellings
    def lsplit(self, test: cst.BaseExpression) -> Optional[bool]:
        """For a test on t == T-1: True if the other steps take the if-branch, False if they take
        the else-branch; None if ``test`` is not such a test."""
        h = self.h
        if h.kind != "index" or not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
            return None
        left, comp = _norm(test.left), test.comparisons[0]
        right, op = _norm(comp.comparator), comp.operator
        t, T = h.index, _norm(h.T)
        last = {f"{T}-1"}
        flip = {cst.LessThan: cst.GreaterThan, cst.GreaterThan: cst.LessThan,
                cst.LessThanEqual: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.LessThanEqual}
        kind = type(op)
        if (left == t and right in last) or (left == f"{t}+1" and right == T):
            pass
        elif (right == t and left in last) or (right == f"{t}+1" and left == T):
            kind = flip.get(kind, kind)
        else:
            return None
        if kind is cst.Equal or kind is cst.GreaterThanEqual:
            return False
        if kind is cst.NotEqual or kind is cst.LessThan:
            return True
        return None

    def middle_value(self, e: cst.BaseExpression) -> Tuple[cst.BaseExpression, List[cst.BaseExpression]]:
        """``e`` as the steps t = T-2 .. 0 evaluate it, and the branches only t = T-1 evaluates.

        A conditional expression whose test selects exactly the last step (``values[t + 1] if t < T - 1
        else last_value``, ``last if t == T - 1 else x[t + 1]``, ``t + 1 < T``, ``t != T - 1``) is the
        statement form ``if t == T - 1: ... else: ...`` in one expression: the peeled first step runs
        it as written, every other step takes one branch. That branch replaces it, in parentheses (an
        operand of the conditional is evaluated whole before it is used: the same grouping)."""
        first: List[cst.BaseExpression] = []
        return self.resolve_last_step(e, False, first), first

    def resolve_last_step(self, e: cst.BaseExpression, first_step: bool,
                          others: Optional[List[cst.BaseExpression]] = None) -> cst.BaseExpression:
        """``e`` with each conditional expression that selects the last step replaced, in
        parentheses, by the branch the first step t = T-1 (``first_step``) or the other steps take;
        ``others`` collects the branches left out."""
        if not _of_type(e, cst.IfExp):
            return e
        return e.visit(_Resolve(self, first_step, others))  # type: ignore[return-value]

    def block(self, stmts: Sequence[cst.BaseStatement]) -> List[Item]:
        items: List[Item] = []
        for st in stmts:
            if isinstance(st, cst.SimpleStatementLine):
                for small in st.body:
                    item = self.small(small)
                    if item is not None:
                        items.append(item)
            elif isinstance(st, cst.If):
                items.extend(self.if_(st))
            elif isinstance(st, (cst.For, cst.While)):
                raise Skip("nested loop in the loop body")
            elif isinstance(st, cst.With):
                raise Skip("`with` block in the loop body")
            elif isinstance(st, cst.Try):
                raise Skip("`try` block in the loop body")
            elif isinstance(st, (cst.FunctionDef, cst.ClassDef)):
                raise Skip("a definition in the loop body")
            else:
                raise Skip(f"unsupported statement in the loop body: `{_code(st).strip().splitlines()[0]}`")
        return items

    def if_(self, st: cst.If) -> List[Item]:
        m_then = self.lsplit(st.test)
        if m_then is not None:
            if st.orelse is None or isinstance(st.orelse, cst.If):
                raise Skip("last-step test without a plain `else:` branch")
            return [Item("split", node=st, then=self.block(_stmts(st.body)),
                         other=self.block(_stmts(st.orelse.body)), m_is_then=m_then)]
        resets = self.resets(st.body, _truth(st.test))
        if st.orelse is None and resets:  # if done: s = 0 (several carried values reset at once too)
            return resets
        if isinstance(st.orelse, cst.Else):  # if done: s = 0 else: s = f(s), either way round
            other = st.orelse.body
            if not resets:
                resets, other = self.resets(st.orelse.body, _negate(_truth(st.test))), st.body
            if resets:
                update = self.block(_stmts(other))
                for it in resets:
                    it.switch = True
                for it in update:
                    it.guarded = True
                return resets + update
        raise Skip(f"conditional `if {_code(st.test)}:` in the loop body (only the last-step case "
                   "and an episode reset `if done: s = 0` are understood)")

    def resets(self, block: cst.BaseSuite, cond: cst.BaseExpression) -> List[Item]:
        """``s = <number>`` statements, one carried value each, for an episode reset on ``cond``;
        [] if ``block`` holds anything else."""
        items: List[Item] = []
        for st in _stmts(block):
            if not isinstance(st, cst.SimpleStatementLine):
                return []
            for asg in st.body:
                if not (isinstance(asg, cst.Assign) and len(asg.targets) == 1
                        and isinstance(asg.targets[0].target, cst.Name) and _is_number(asg.value)):
                    return []
                var = asg.targets[0].target.value
                if any(it.var == var for it in items):
                    return []
                items.append(Item("reset", node=st, var=var, cond=cond, const=_code(asg.value)))
        return items

    def small(self, small: cst.BaseSmallStatement) -> Optional[Item]:
        reason = _FORBIDDEN_SMALL.get(type(small))  # (exact types: these classes have no subclasses)
        if reason is not None:
            raise Skip(reason)
        if isinstance(small, cst.Pass):
            return None
        if isinstance(small, cst.AugAssign):
            tg = small.target
            op = _ACCUMULATE.get(type(small.operator))
            if op is not None and isinstance(tg, cst.Subscript) and self.is_index_ref(tg) and _pure_container(tg.value):
                # out[t] += v: each row read once, then written once (the planner checks `out` is read
                # nowhere else); the middle steps' `out[1:T - 1] += V` is the same per element
                value, first = self.middle_value(small.value)
                return Item("assign", node=small, outs=[tg.value], value=value, first=first,
                            shown=small.value if first else None, accum=op)
            raise Skip(f"augmented assignment `{_code(small).strip()}` (updates `{_code(tg).strip()}` in place; "
                       "understood: `out[t] += v` and `out[t] -= v`)")
        if isinstance(small, cst.Assign):
            var: Optional[str] = None
            outs: List[cst.BaseExpression] = []
            for t in small.targets:
                tg = t.target
                if isinstance(tg, cst.Name):
                    if var is not None:
                        raise Skip("chained assignment to several names")
                    var = tg.value
                elif isinstance(tg, cst.Subscript) and self.is_index_ref(tg) and _pure_container(tg.value):
                    outs.append(tg.value)
                else:
                    raise Skip(f"assigns to `{_code(tg).strip()}` (only names and out[t] are understood)")
            value, first = self.middle_value(small.value)
            return Item("assign", node=small, var=var, outs=outs, value=value, first=first,
                        shown=small.value if first else None)
        if isinstance(small, cst.Expr):
            call = small.value
            if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) \
                    and _pure_container(call.func.value) and not any(a.keyword or a.star for a in call.args):
                meth = call.func.attr.value
                kind = None
                if meth == "append" and len(call.args) == 1:
                    kind, value = "append", call.args[0].value
                elif meth == "insert" and len(call.args) == 2 and _is_int(call.args[0].value, 0):
                    kind, value = "insert", call.args[1].value
                elif meth == "appendleft" and len(call.args) == 1:  # collections.deque (checked at run time)
                    kind, value = "appendleft", call.args[0].value
                if kind is not None:
                    wrap = isinstance(value, cst.List) and len(value.elements) == 1 \
                        and isinstance(value.elements[0], cst.Element)
                    if wrap:  # minimalRL: advantage_lst.append([advantage])
                        value = value.elements[0].value
                    mid, first = self.middle_value(value)
                    return Item(kind, node=small, container=call.func.value, value=mid, wrap=wrap, first=first,
                                shown=value if first else None)
            if isinstance(call, cst.Call):
                raise Skip(f"calls `{_callee(call)}()` in the loop body (unknown side effects)")
            raise Skip(f"expression statement `{_code(call).strip()}` in the loop body")
        raise Skip(f"unsupported statement `{_code(small).strip()}` in the loop body")

    def is_index_ref(self, node: cst.Subscript) -> bool:
        """``x[t]`` exactly."""
        return self.ref_offset(node) == 0

    def ref_offset(self, node: cst.Subscript) -> Optional[int]:
        """k for ``x[t + k]`` (k >= 0), None otherwise."""
        if self.h.kind != "index" or len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
            return None
        idx = node.slice[0].slice.value
        t = self.h.index
        text = _norm(idx)
        if text == t:
            return 0
        # ``t+k`` or ``k+t`` (k decimal digits: what ``\d+`` matches), without a pattern per call
        left, plus, right = text.partition("+")
        if plus:
            if left == t and right.isdecimal():
                return int(right)
            if right == t and left.isdecimal():
                return int(left)
        return None


class _Resolve(cst.CSTTransformer):
    """:meth:`BodyParser.resolve_last_step`'s pass. (A class at module level: libcst's
    ``isinstance(visitor, CSTVisitor)`` on a transformer class it has not seen walks every
    CSTVisitor subclass alive, and with the collector off during a rewrite a class made per call
    stays alive: a file of thousands of sites was quadratic.)"""

    def __init__(self, parser: "BodyParser", first_step: bool, others: Optional[List[cst.BaseExpression]]) -> None:
        super().__init__()
        self.parser, self.first_step, self.others = parser, first_step, others

    def leave_IfExp(self, original: cst.IfExp, updated: cst.IfExp) -> cst.BaseExpression:
        m_then = self.parser.lsplit(original.test)
        if m_then is None:
            return updated
        keep = updated.body if m_then != self.first_step else updated.orelse
        if self.others is not None:
            self.others.append(original.orelse if m_then != self.first_step else original.body)
        outer = list(original.lpar) or [cst.LeftParen()]
        close = list(original.rpar) or [cst.RightParen()]
        return keep.with_changes(lpar=outer + list(keep.lpar), rpar=list(keep.rpar) + close)


def _int_indices(slices: Sequence[cst.SubscriptElement]) -> Optional[Tuple[str, ...]]:
    """The integer literal indices of ``x[i, j]`` as text (``-1`` too), or None."""
    idx: List[str] = []
    for el in slices:
        v = el.slice.value if isinstance(el.slice, cst.Index) and el.slice.star is None else None
        if isinstance(v, cst.UnaryOperation) and isinstance(v.operator, cst.Minus):
            ok = isinstance(v.expression, cst.Integer)
        else:
            ok = isinstance(v, cst.Integer)
        if not ok:
            return None
        idx.append(str(int(_norm(v), 0)))
    return tuple(idx)


def _truth(test: cst.BaseExpression) -> cst.BaseExpression:
    """``x`` for ``x != 0``, ``not x`` for ``x == 0`` (either side): the same truth for a number."""
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and not test.lpar:
        comp = test.comparisons[0]
        left, right = test.left, comp.comparator
        x = left if _is_int(right, 0) else right if _is_int(left, 0) else None
        if x is not None and isinstance(comp.operator, cst.NotEqual):
            return x
        if x is not None and isinstance(comp.operator, cst.Equal):
            return cst.UnaryOperation(cst.Not(), _paren(x))
    return test


def _negate(test: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return test.expression
    return cst.UnaryOperation(cst.Not(), _paren(test))


def _is_number(node: cst.BaseExpression) -> bool:
    if isinstance(node, (cst.Integer, cst.Float)):
        return True
    return isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) \
        and isinstance(node.expression, (cst.Integer, cst.Float))


def _callee(call: cst.Call) -> str:
    text = dotted(call.func)
    if text is None and isinstance(call.func, cst.Attribute):
        text = _code(call.func).strip()
    return text or _code(call.func).strip()


ItemT = TypeVar("ItemT", Item, FrozenItem)


def _flatten(items: Sequence[ItemT], m_case: bool) -> List[ItemT]:
    """The straight-line body for the middle steps (m_case) or the last step."""
    out: List[ItemT] = []
    for it in items:
        if it.kind == "split":
            branch = it.then if it.m_is_then == m_case else it.other
            out.extend(_flatten(branch, m_case))
        else:
            out.append(it)
    return out
