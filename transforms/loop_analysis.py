"""Shared static facts about loops for the ``vectorize.*`` transforms.

What a loop rewrite must prove before it replaces a loop: the loop cannot exit early or bind
names in odd ways, its expressions are pure, and the names it binds are not read after it (a
vectorized loop does not leave its loop variables behind). Everything here is conservative: when
in doubt a function answers "unsafe" and the caller skips the loop with the returned reason.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Set

import libcst as cst

# --------------------------------------------------------------------------- targets and bodies


def target_names(target: cst.BaseExpression) -> Optional[List[str]]:
    """Names bound by a ``for`` target made only of names and tuples/lists of names, else None."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        out: List[str] = []
        for el in target.elements:
            if isinstance(el, cst.StarredElement):
                return None
            sub = target_names(el.value)
            if sub is None:
                return None
            out.extend(sub)
        return out
    return None


def flat_body(body: cst.BaseSuite) -> Optional[List[cst.BaseSmallStatement]]:
    """The small statements of a suite made only of simple statement lines, else None."""
    lines = [body] if isinstance(body, cst.SimpleStatementSuite) else list(body.body)
    out: List[cst.BaseSmallStatement] = []
    for line in lines:
        if isinstance(line, cst.SimpleStatementSuite) or isinstance(line, cst.SimpleStatementLine):
            out.extend(line.body)
        else:
            return None
    return out


class _ExitFinder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.reason: Optional[str] = None

    def _set(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def visit_Break(self, node: cst.Break) -> None:
        self._set("the loop body can exit early (break)")

    def visit_Continue(self, node: cst.Continue) -> None:
        self._set("the loop body can skip iterations (continue)")

    def visit_Return(self, node: cst.Return) -> None:
        self._set("the loop body can exit early (return)")

    def visit_Raise(self, node: cst.Raise) -> None:
        self._set("the loop body can raise")

    def visit_Yield(self, node: cst.Yield) -> None:
        self._set("the loop body yields")

    def visit_Await(self, node: cst.Await) -> None:
        self._set("the loop body awaits")

    def visit_Global(self, node: cst.Global) -> None:
        self._set("the loop body declares global names")

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self._set("the loop body declares nonlocal names")

    def visit_Del(self, node: cst.Del) -> None:
        self._set("the loop body deletes names")

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self._set("the loop body defines a function")
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self._set("the loop body defines a class")
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        self._set("the loop body creates a lambda (it may capture the loop variable)")
        return False

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._set("the loop body uses an assignment expression (:=)")


def early_exit_reason(node: cst.CSTNode) -> Optional[str]:
    """Why the statements under ``node`` cannot be run as one vectorized step (None: they can)."""
    finder = _ExitFinder()
    node.visit(finder)
    return finder.reason


# --------------------------------------------------------------------------- names


def _store_names(target: cst.BaseExpression, out: Set[int]) -> None:
    if isinstance(target, cst.Name):
        out.add(id(target))
    elif isinstance(target, (cst.Tuple, cst.List)):
        for el in target.elements:
            _store_names(el.value, out)
    elif isinstance(target, cst.StarredElement):
        _store_names(target.value, out)


def _param_names(params: cst.Parameters) -> Set[str]:
    names: Set[str] = set()
    for p in (*params.posonly_params, *params.params, *params.kwonly_params):
        names.add(p.name.value)
    for p in (params.star_arg, params.star_kwarg):
        if isinstance(p, cst.Param):
            names.add(p.name.value)
    return names


class _Bindings(cst.CSTVisitor):
    """Names a nested function binds locally (params, stores), less global/nonlocal ones."""

    def __init__(self) -> None:
        self.bound: Set[str] = set()
        self.declared: Set[str] = set()
        self._stores: Set[int] = set()

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        _store_names(node.target, self._stores)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        _store_names(node.target, self._stores)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        _store_names(node.target, self._stores)

    def visit_For(self, node: cst.For) -> None:
        _store_names(node.target, self._stores)

    def visit_AsName(self, node: cst.AsName) -> None:
        _store_names(node.name, self._stores)

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) in self._stores:
            self.bound.add(node.value)

    def visit_Global(self, node: cst.Global) -> None:
        self.declared.update(n.name.value for n in node.names)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self.declared.update(n.name.value for n in node.names)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.bound.add(node.name.value)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.bound.add(node.name.value)
        return False


def _locals_of(node: cst.CSTNode, params: Optional[cst.Parameters]) -> Set[str]:
    finder = _Bindings()
    body = node.body if isinstance(node, (cst.FunctionDef, cst.Lambda)) else node
    body.visit(finder)
    names = finder.bound | (_param_names(params) if params is not None else set())
    return names - finder.declared


_DYNAMIC = frozenset({"locals", "vars", "eval", "exec", "globals"})


class _Reads(cst.CSTVisitor):
    """Every read of ``names`` under a scope that is not covered by a rebinding.

    A read is covered when it sits in the body of another ``for`` loop (or comprehension) whose
    target binds the name, or in a nested function that binds the name locally: such a read can
    never see what the skipped loop left behind. Reads inside ``exclude`` (the loop itself) are
    ignored. A call to ``locals``/``vars``/``eval``/``exec``/``globals`` counts as reading all.
    """

    def __init__(self, names: Set[str], exclude: cst.CSTNode) -> None:
        self.names = names
        self.exclude = exclude
        self.found: Set[str] = set()
        self._covered: List[Set[str]] = []
        self._stores: Set[int] = set()
        self._skip: Set[int] = set()  # Name nodes that are not variable reads

    def _is_covered(self, name: str) -> bool:
        return any(name in c for c in self._covered)

    # -- positions that are not reads
    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._skip.add(id(node.attr))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._skip.add(id(node.keyword))

    def visit_ImportAlias(self, node: cst.ImportAlias) -> bool:
        return False

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        _store_names(node.target, self._stores)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        _store_names(node.target, self._stores)

    def visit_AsName(self, node: cst.AsName) -> None:
        _store_names(node.name, self._stores)

    # -- scopes and rebinding loops
    def visit_For(self, node: cst.For) -> bool:
        if node is self.exclude:
            return False
        _store_names(node.target, self._stores)
        node.target.visit(self)
        node.iter.visit(self)
        bound = set(target_names(node.target) or ())
        self._covered.append(bound)
        node.body.visit(self)
        self._covered.pop()
        if node.orelse is not None:
            node.orelse.visit(self)
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        for deco in node.decorators:
            deco.visit(self)
        node.params.visit(self)  # defaults are evaluated in this scope
        self._covered.append(_locals_of(node, node.params))
        node.body.visit(self)
        self._covered.pop()
        return False

    def visit_Param(self, node: cst.Param) -> bool:
        if node.default is not None:
            node.default.visit(self)
        if node.annotation is not None:
            node.annotation.visit(self)
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        node.params.visit(self)
        self._covered.append(_param_names(node.params))
        node.body.visit(self)
        self._covered.pop()
        return False

    def _comp(self, node, elts: Sequence[cst.CSTNode]) -> bool:
        fors: List[cst.CompFor] = []
        comp: Optional[cst.CompFor] = node.for_in
        while comp is not None:
            fors.append(comp)
            comp = comp.inner_for_in
        fors[0].iter.visit(self)  # the first iterable is evaluated in the enclosing scope
        bound: Set[str] = set()
        for comp in fors:
            _store_names(comp.target, self._stores)
            bound.update(target_names(comp.target) or ())
        self._covered.append(bound)
        for i, comp in enumerate(fors):
            if i:
                comp.iter.visit(self)
            for cond in comp.ifs:
                cond.visit(self)
        for elt in elts:
            elt.visit(self)
        self._covered.pop()
        return False

    def visit_ListComp(self, node: cst.ListComp) -> bool:
        return self._comp(node, [node.elt])

    def visit_SetComp(self, node: cst.SetComp) -> bool:
        return self._comp(node, [node.elt])

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> bool:
        return self._comp(node, [node.elt])

    def visit_DictComp(self, node: cst.DictComp) -> bool:
        return self._comp(node, [node.key, node.value])

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value in _DYNAMIC:
            self.found |= {n for n in self.names if not self._is_covered(n)}

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) in self._skip or id(node) in self._stores:
            return
        if node.value in self.names and not self._is_covered(node.value):
            self.found.add(node.value)

    def visit_Del(self, node: cst.Del) -> None:
        for name in _all_names(node.target):
            if name in self.names and not self._is_covered(name):
                self.found.add(name)


def _all_names(node: cst.CSTNode) -> Set[str]:
    out: Set[str] = set()

    class _V(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            out.add(n.value)

    node.visit(_V())
    return out


def read_elsewhere(scope: cst.CSTNode, loop: cst.CSTNode, names: Iterable[str]) -> Set[str]:
    """Which of ``names`` (bound by ``loop``) may be read somewhere in ``scope`` outside the loop.

    Conservative: a read anywhere in the scope counts (before the loop too, since the scope may
    itself run in a loop), unless a rebinding ``for``/comprehension/nested function covers it.
    """
    visitor = _Reads(set(names), loop)
    body = scope.body if isinstance(scope, (cst.FunctionDef, cst.ClassDef)) else scope
    body.visit(visitor)
    return visitor.found


def names_read(node: cst.CSTNode) -> Set[str]:
    """Every plain name under ``node`` other than attribute names and keyword-argument names."""
    skip: Set[int] = set()
    out: Set[str] = set()

    class _V(cst.CSTVisitor):
        def visit_Attribute(self, n: cst.Attribute) -> None:
            skip.add(id(n.attr))

        def visit_Arg(self, n: cst.Arg) -> None:
            if n.keyword is not None:
                skip.add(id(n.keyword))

        def visit_Name(self, n: cst.Name) -> None:
            if id(n) not in skip:
                out.add(n.value)

    node.visit(_V())
    return out


# --------------------------------------------------------------------------- expressions

_PURE_BINOPS = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Power, cst.Modulo)


def is_pure(expr: cst.BaseExpression, forbidden: Set[str] = frozenset()) -> bool:
    """An expression without calls or side effects: names, attributes, numbers, arithmetic.

    ``forbidden`` names (loop variables) make it impure: the value would change per iteration.
    Attribute reads are taken as pure (properties with side effects are not modelled).
    """
    if isinstance(expr, cst.Name):
        return expr.value not in forbidden and expr.value not in ("print",)
    if isinstance(expr, (cst.Integer, cst.Float, cst.Imaginary)):
        return True
    if isinstance(expr, cst.Attribute):
        return is_pure(expr.value, forbidden)
    if isinstance(expr, cst.UnaryOperation):
        return isinstance(expr.operator, (cst.Minus, cst.Plus)) and is_pure(expr.expression, forbidden)
    if isinstance(expr, cst.BinaryOperation):
        return (
            isinstance(expr.operator, _PURE_BINOPS)
            and is_pure(expr.left, forbidden)
            and is_pure(expr.right, forbidden)
        )
    if isinstance(expr, cst.Subscript):  # cfg["tau"], taus[0], taus[k]
        if len(expr.slice) != 1 or not isinstance(expr.slice[0].slice, cst.Index):
            return False
        index = expr.slice[0].slice.value
        return is_pure(expr.value, forbidden) and (
            isinstance(index, (cst.Integer, cst.SimpleString))
            or (isinstance(index, cst.Name) and index.value not in forbidden)
        )
    return False


def is_simple_ref(expr: cst.BaseExpression) -> bool:
    """``a``, ``a.b.c``, ``a[0]``, ``self.nets[i]``: cheap to evaluate twice, no side effects."""
    if isinstance(expr, cst.Name):
        return True
    if isinstance(expr, cst.Attribute):
        return is_simple_ref(expr.value)
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1:
        el = expr.slice[0].slice
        return (
            is_simple_ref(expr.value)
            and isinstance(el, cst.Index)
            and isinstance(el.value, (cst.Integer, cst.SimpleString, cst.Name))
        )
    return False


# --------------------------------------------------------------------------- scopes


def rebinds(module: cst.Module, name: str) -> bool:
    """Whether ``module`` may bind ``name`` anywhere (assignment, def, import, star import, parameter)."""
    stores: Set[int] = set()
    found = False

    class _V(cst.CSTVisitor):
        def visit_AssignTarget(self, n: cst.AssignTarget) -> None:
            _store_names(n.target, stores)

        def visit_AnnAssign(self, n: cst.AnnAssign) -> None:
            _store_names(n.target, stores)

        def visit_AugAssign(self, n: cst.AugAssign) -> None:
            _store_names(n.target, stores)

        def visit_For(self, n: cst.For) -> None:
            _store_names(n.target, stores)

        def visit_CompFor(self, n: cst.CompFor) -> None:
            _store_names(n.target, stores)

        def visit_AsName(self, n: cst.AsName) -> None:
            _store_names(n.name, stores)

        def visit_ImportAlias(self, n: cst.ImportAlias) -> None:
            if n.asname is None and isinstance(n.name, cst.Name):
                stores.add(id(n.name))

        def visit_ImportFrom(self, n: cst.ImportFrom) -> None:
            nonlocal found
            if isinstance(n.names, cst.ImportStar):
                found = True  # a star import may bind anything

        def visit_Param(self, n: cst.Param) -> None:
            stores.add(id(n.name))

        def visit_FunctionDef(self, n: cst.FunctionDef) -> None:
            stores.add(id(n.name))

        def visit_ClassDef(self, n: cst.ClassDef) -> None:
            stores.add(id(n.name))

        def visit_Name(self, n: cst.Name) -> None:
            nonlocal found
            if id(n) in stores and n.value == name:
                found = True

    module.visit(_V())
    return found
