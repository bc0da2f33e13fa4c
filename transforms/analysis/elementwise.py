"""Element-by-element expressions over a loop's element: whether an expression indexed by the loop
variable can be evaluated once on the whole batch, and whether that is exact.
"""
from __future__ import annotations

from typing import AbstractSet, Callable, Dict, List, Optional, Set

import libcst as cst

from .cstclone import parse_expression
from .bodies import _code
from .purity import ALLOWED_KEYWORDS, EXACT_FUNCS, EXACT_METHODS, INEXACT_FUNCS, INEXACT_METHODS, is_pure, pure_call

#: a loop-invariant operand with a pure call in it: the guard evaluates invariant operands before
#: it knows the loop is not empty, where the loop would not have called anything
NOT_HOISTED = ("`{}` calls a pure function on loop-invariant values: not hoisted out of the loop (the "
                "guard would call it before it knows the loop runs at least once)")


class ElementwiseExpr:
    """Check that an expression is an element-by-element function of loop elements, and batch it.

    ``element(node)`` maps an expression to the key of the loop element it reads (``x`` for a
    loop variable, ``X`` for ``X[i]`` in a range loop) or None. Everything else must be an
    arithmetic operator, a whitelisted torch function/method, or a pure invariant (no loop
    variable, no name in ``forbidden``). After :meth:`check`, ``keys`` lists the elements read
    (first-use order), ``invariants`` the invariant leaves a run-time guard must inspect, and
    ``exact`` whether every operation is correctly rounded.
    """

    def __init__(self, imports, element, forbidden: Set[str]) -> None:
        self.imports = imports
        self.element = element
        self.forbidden = set(forbidden)
        self.keys: List[str] = []
        self.invariants: List[cst.BaseExpression] = []
        self.exact = True
        self.ops = 0

    def check(self, expr: cst.BaseExpression) -> Optional[str]:
        """None when ``expr`` can be batched, else why not."""
        reason = self._check(expr)
        if reason is None and not self.keys:
            return "the expression does not depend on the loop element"
        if reason is None and self.ops == 0:
            return "nothing is computed per element (the result would alias the input)"
        return reason

    def _leaf_invariant(self, expr: cst.BaseExpression) -> Optional[str]:
        if not is_pure(expr, self.forbidden):
            code = _code(expr)
            if is_pure(expr, self.forbidden, self.imports):
                return NOT_HOISTED.format(code)
            return f"`{code}` is neither a loop element nor a loop-invariant value"
        if not isinstance(expr, (cst.Integer, cst.Float)):
            if not any(expr.deep_equals(e) for e in self.invariants):
                self.invariants.append(expr)
        return None

    def _check(self, expr: cst.BaseExpression) -> Optional[str]:
        key = self.element(expr)
        if key is not None:
            if key not in self.keys:
                self.keys.append(key)
            return None
        if isinstance(expr, cst.BinaryOperation):
            if isinstance(expr.operator, (cst.Add, cst.Subtract, cst.Multiply, cst.Divide)):
                exact = True
            elif isinstance(expr.operator, cst.Power):
                exact = False
            else:
                return f"operator {type(expr.operator).__name__} is not vectorized"
            if not (self._depends(expr.left) or self._depends(expr.right)):
                return self._leaf_invariant(expr)
            self.ops += 1
            self.exact &= exact
            return self._check(expr.left) or self._check(expr.right)
        if isinstance(expr, cst.UnaryOperation):
            if not isinstance(expr.operator, (cst.Minus, cst.Plus)):
                return f"operator {type(expr.operator).__name__} is not vectorized"
            if not self._depends(expr.expression):
                return self._leaf_invariant(expr)
            self.ops += isinstance(expr.operator, cst.Minus)
            return self._check(expr.expression)
        if isinstance(expr, cst.Call):
            return self._check_call(expr)
        if not self._depends(expr):
            return self._leaf_invariant(expr)
        if isinstance(expr, cst.Name):
            return f"`{expr.value}` (a loop variable or accumulator) is used as a value"
        if isinstance(expr, cst.Subscript):
            if self.item_of_element(expr):  # trajectory[k] for trajectory in trajectories
                return (f"reads `{_code(expr)}`, an item of a loop element: only element-by-element "
                        "operations on whole elements are batched")
            return f"reads `{_code(expr)}`: not the current element (possible loop-carried dependence)"
        return f"`{_code(expr)}` is not an element-by-element operation"

    def item_of_element(self, expr: cst.BaseExpression) -> bool:
        """``x[k]`` / ``x[k].a[j]``: items and attributes of a loop element, indexed by invariants."""
        while isinstance(expr, (cst.Subscript, cst.Attribute)):
            if isinstance(expr, cst.Subscript) and any(self._depends(e) for e in _slice_exprs(expr)):
                return False
            expr = expr.value
            if self.element(expr) is not None:
                return True
        return False

    def _check_call(self, call: cst.Call) -> Optional[str]:
        if any(a.star for a in call.args):
            return "a call unpacks arguments"
        if any(a.keyword is not None and a.keyword.value not in ALLOWED_KEYWORDS for a in call.args):
            bad = next(a.keyword.value for a in call.args if a.keyword is not None and a.keyword.value not in ALLOWED_KEYWORDS)
            return f"keyword argument {bad}= is not vectorized"
        qual = self.imports.qualify(call.func)
        operands: List[cst.BaseExpression] = [a.value for a in call.args]
        if qual in EXACT_FUNCS or qual in INEXACT_FUNCS:
            self.exact &= qual in EXACT_FUNCS
        elif (
            qual is None
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value in (EXACT_METHODS | INEXACT_METHODS)
            and self._depends(call.func.value)
        ):
            self.exact &= call.func.attr.value in EXACT_METHODS
            operands.insert(0, call.func.value)
        else:
            name = _code(call.func) + (f" ({qual})" if qual and qual != _code(call.func) else "")
            if not pure_call(call, self.imports):
                return f"calls `{name}`, which is not known to act element by element (or may have side effects)"
            if not self._depends(call):
                return NOT_HOISTED.format(_code(call))
            return f"calls `{name}`, which is pure but not known to act element by element"
        if not any(self._depends(o) for o in operands):
            return f"`{_code(call)}` does not depend on the loop element"
        self.ops += 1
        for operand in operands:
            reason = self._check(operand)
            if reason:
                return reason
        return None

    def _depends(self, expr: cst.BaseExpression) -> bool:
        """Whether a loop element (or a forbidden name) occurs under ``expr``."""
        if self.element(expr) is not None:
            return True
        return depends(expr, self.element, self.forbidden)

    def batched(self, expr: cst.BaseExpression, names: Dict[str, str]) -> cst.BaseExpression:
        """``expr`` with every loop element replaced by the name of its batched tensor."""
        return expr.visit(_Batched(self, names))


def depends(expr: cst.CSTNode, element: Callable[[cst.BaseExpression], object], names: AbstractSet[str]) -> bool:
    """Whether a loop element (``element(e)`` not None) or one of ``names`` occurs under ``expr``
    (:meth:`ElementwiseExpr._depends`, :meth:`..vectorize.loss_expr.LossExpr._depends`)."""
    finder = _Depends(element, names)
    expr.visit(finder)
    return finder.found


class _Depends(cst.CSTVisitor):
    """:func:`depends`' visit (module-level classes: see :class:`_Batched`)."""

    def __init__(self, element: Callable[[cst.BaseExpression], object], names: AbstractSet[str]) -> None:
        super().__init__()
        self.element, self.names = element, names
        self.found = False

    def on_visit(self, n: cst.CSTNode) -> bool:
        if not self.found and (isinstance(n, cst.BaseExpression) and self.element(n) is not None
                               or isinstance(n, cst.Name) and n.value in self.names):
            self.found = True
        return not self.found


class _Batched(cst.CSTTransformer):
    """:meth:`ElementwiseExpr.batched`'s pass.
    (A class at module level: libcst's ``isinstance(visitor, CSTVisitor)`` on a transformer
    class it has not seen walks every CSTVisitor subclass alive, and with the collector off
    during a rewrite a class made per call stays alive: a file of thousands of sites was
    quadratic.)"""

    def __init__(self, outer: "ElementwiseExpr", names: Dict[str, str]) -> None:
        super().__init__()
        self.outer, self.names = outer, names

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):
        if isinstance(original, cst.BaseExpression):
            key = self.outer.element(original)
            if key is not None:
                new = parse_expression(self.names[key])  # a name, or e.g. ``_sb_batch[0]``
                return new.with_changes(lpar=original.lpar, rpar=original.rpar) if original.lpar else new
        return updated


def _slice_exprs(sub: cst.Subscript) -> List[cst.BaseExpression]:
    """The expressions of a subscript's indices and slice bounds."""
    out: List[cst.BaseExpression] = []
    for el in sub.slice:
        sl = el.slice
        if isinstance(sl, cst.Index):
            out.append(sl.value)
        elif isinstance(sl, cst.Slice):
            out.extend(b for b in (sl.lower, sl.upper, sl.step) if b is not None)
    return out
