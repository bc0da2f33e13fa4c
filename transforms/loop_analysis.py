"""Shared static facts about loops for the ``vectorize.*`` transforms.

What a loop rewrite must prove before it replaces a loop: the loop cannot exit early or bind
names in odd ways, its expressions are pure, and the names it binds are not read after it (a
vectorized loop does not leave its loop variables behind). Everything here is conservative: when
in doubt a function answers "unsafe" and the caller skips the loop with the returned reason.
"""
from __future__ import annotations

import ast
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import libcst as cst

from scalebox_cst.report import Site

from . import statement_memo

# --------------------------------------------------------------------------- targets and bodies

#: the fields of compound statements (and their clauses) that hold statements, in source order
_BLOCK_FIELDS = ("body", "handlers", "orelse", "finalbody", "cases")

#: What the run-time guard of a batched loop (runtime.loop_batch) needs, for the site report.
BATCH_GUARD_NOTE = ("guarded by batch_zip/batch_range: tensors or lists of equally shaped tensors, exactly "
                    "torch.Tensor or nn.Parameter, one float dtype and device; invariants Python numbers or "
                    "tensors of that dtype; tensor accumulators of that dtype; no output sharing memory with "
                    "an input; else the loop runs as written")


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
    never see what the skipped loop left behind. So is a read that no execution path reaches from
    the end of ``exclude`` (the loop itself, whose own reads are ignored): one earlier in source
    order and outside every loop that encloses ``exclude`` (nested functions count wherever they
    are: they may run later). ``locals()``/``vars()``/``globals()`` without arguments and
    ``eval``/``exec`` count as reading every name.
    """

    def __init__(self, names: Set[str], exclude: cst.CSTNode, also: Sequence[cst.CSTNode] = ()) -> None:
        self.names = names
        self.exclude = exclude
        self.also = {id(n) for n in also}
        self.found: Set[str] = set()
        self._covered: List[Set[str]] = []
        self._stores: Set[int] = set()
        self._skip: Set[int] = set()  # Name nodes that are not variable reads
        self.ancestors: Set[int] = set()  # loops (for/while) that enclose ``exclude``
        self._after = False  # past the end of ``exclude`` in source order
        self._loop_depth = 0  # inside loops that enclose ``exclude``
        self._nested = 0  # inside nested functions/lambdas

    def _is_covered(self, name: str) -> bool:
        if not (self._after or self._loop_depth or self._nested):
            return True  # runs before the loop, and never again after it
        return any(name in c for c in self._covered)

    def visit_While(self, node: cst.While) -> None:
        if id(node) in self.ancestors:
            self._loop_depth += 1

    def leave_While(self, node: cst.While) -> None:
        if id(node) in self.ancestors:
            self._loop_depth -= 1

    def on_visit(self, node: cst.CSTNode) -> bool:
        if id(node) in self.also:
            return False
        return super().on_visit(node)

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
            self._after = True
            return False
        ancestor = id(node) in self.ancestors
        self._loop_depth += ancestor
        _store_names(node.target, self._stores)
        node.target.visit(self)
        node.iter.visit(self)
        bound = set(target_names(node.target) or ())
        self._covered.append(bound)
        node.body.visit(self)
        self._covered.pop()
        if node.orelse is not None:
            node.orelse.visit(self)
        self._loop_depth -= ancestor
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        for deco in node.decorators:
            deco.visit(self)
        node.params.visit(self)  # defaults are evaluated in this scope
        self._covered.append(_locals_of(node, node.params))
        self._nested += 1
        node.body.visit(self)
        self._nested -= 1
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
        self._nested += 1
        node.body.visit(self)
        self._nested -= 1
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
        # locals()/vars()/globals() without arguments, eval/exec: any name may be read
        if isinstance(node.func, cst.Name) and node.func.value in _DYNAMIC:
            if node.func.value in ("eval", "exec") or not node.args:
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


def read_elsewhere(
    scope: cst.CSTNode, loop: cst.CSTNode, names: Iterable[str], also: Sequence[cst.CSTNode] = ()
) -> Set[str]:
    """Which of ``names`` (bound by ``loop``) may be read somewhere in ``scope`` outside the loop.

    Conservative: a read anywhere in the scope counts (before the loop too, since the scope may
    itself run in a loop), unless a rebinding ``for``/comprehension/nested function covers it.
    Reads under the nodes in ``also`` are ignored too (e.g. the one statement that consumes a
    list the loop built).
    """
    visitor = _Reads(set(names), loop, also)
    body = scope.body if isinstance(scope, (cst.FunctionDef, cst.ClassDef)) else scope
    visitor.ancestors = _enclosing_loops(body, loop)
    body.visit(visitor)
    return visitor.found


def _skeleton(node: cst.CSTNode) -> Sequence[cst.CSTNode]:
    """The children of ``node`` that can hold statements (statements are their own skeleton:
    loops, ``global`` and ``nonlocal`` sit only there, never inside an expression)."""
    if isinstance(node, (cst.Module, cst.BaseSuite, cst.SimpleStatementLine)):
        return node.body
    if isinstance(node, cst.BaseSmallStatement):
        return ()
    out: List[cst.CSTNode] = []
    for field in _BLOCK_FIELDS:
        block = getattr(node, field, None)
        if isinstance(block, (list, tuple)):
            out.extend(block)
        elif isinstance(block, cst.CSTNode):
            out.append(block)
    return out


def _skeleton_path(root: cst.CSTNode, target: cst.CSTNode) -> Optional[List[cst.CSTNode]]:
    """The skeleton nodes from ``root`` down to ``target`` (excluded), or None if it is not there."""
    parent: Dict[int, Optional[cst.CSTNode]] = {id(root): None}
    todo = [root]
    while todo:
        node = todo.pop()
        if node is target:
            path: List[cst.CSTNode] = []
            up = parent[id(node)]
            while up is not None:
                path.append(up)
                up = parent[id(up)]
            return path[::-1]
        for child in _skeleton(node):
            parent[id(child)] = node
            todo.append(child)
    return None


def _enclosing_loops(root: cst.CSTNode, target: cst.CSTNode) -> Set[int]:
    """ids of the for/while statements under ``root`` that contain ``target``."""
    path = _skeleton_path(root, target)  # a walk of statements only: ~50x cheaper than a visit
    if path is not None:
        return {id(n) for n in path if isinstance(n, (cst.For, cst.While))}
    return _enclosing_loops_visit(root, target)  # ``target`` is not a statement


def _enclosing_loops_visit(root: cst.CSTNode, target: cst.CSTNode) -> Set[int]:
    """:func:`_enclosing_loops` by a full visit (any kind of ``target``)."""
    stack: List[int] = []
    found: Set[int] = set()

    class _V(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if node is target:
                found.update(stack)
                return False
            if isinstance(node, (cst.For, cst.While)):
                stack.append(id(node))
            return True

        def on_leave(self, node: cst.CSTNode) -> None:
            if isinstance(node, (cst.For, cst.While)) and stack and stack[-1] == id(node):
                stack.pop()

    root.visit(_V())
    return found


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


def declares_global(scope: cst.CSTNode, names: Iterable[str]) -> Set[str]:
    """Which of ``names`` the scope declares ``global`` or ``nonlocal`` (reads elsewhere unknown)."""
    wanted = set(names)
    found: Set[str] = set()
    todo = [scope]
    while todo:  # statements only (where global/nonlocal are), nested functions and classes too
        node = todo.pop()
        if isinstance(node, (cst.Global, cst.Nonlocal)):
            found.update(a.name.value for a in node.names if a.name.value in wanted)
        todo.extend(_skeleton(node))
    return found


# --------------------------------------------------------------------------- elementwise expressions

#: torch functions (qualified) and tensor methods that act element by element and whose batched
#: result is bitwise the per-element result (correctly rounded IEEE operations, selections)
EXACT_FUNCS = frozenset(
    {
        "torch.abs", "torch.neg", "torch.negative", "torch.relu", "torch.nn.functional.relu",
        "torch.square", "torch.sqrt", "torch.clamp", "torch.clip", "torch.minimum", "torch.maximum",
        "torch.add", "torch.sub", "torch.subtract", "torch.mul", "torch.multiply", "torch.div",
        "torch.divide", "torch.true_divide",
    }
)
#: element by element too, but vectorized kernels (SIMD transcendental approximations) may round
#: differently from the kernels that process one element: ``reassociated`` (≤ a few ulp)
INEXACT_FUNCS = frozenset(
    {
        "torch.exp", "torch.log", "torch.log1p", "torch.expm1", "torch.tanh", "torch.sigmoid",
        "torch.sin", "torch.cos", "torch.pow", "torch.nn.functional.tanh", "torch.nn.functional.sigmoid",
        "torch.nn.functional.silu", "torch.special.expit",
    }
)
EXACT_METHODS = frozenset(
    {"abs", "neg", "negative", "relu", "square", "sqrt", "clamp", "clip", "add", "sub", "mul", "div", "minimum", "maximum"}
)
INEXACT_METHODS = frozenset({"exp", "log", "log1p", "expm1", "tanh", "sigmoid", "sin", "cos", "pow"})
#: keyword arguments allowed on the calls above (others change meaning: alpha=, rounding_mode=, out=)
ALLOWED_KEYWORDS = frozenset({"min", "max", "exponent"})


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
            return f"reads `{_code(expr)}`: not the current element (possible loop-carried dependence)"
        return f"`{_code(expr)}` is not an element-by-element operation"

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
            return f"calls `{name}`, which is not known to act element by element (or may have side effects)"
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
        found = False
        outer = self

        class _V(cst.CSTVisitor):
            def on_visit(self, n: cst.CSTNode) -> bool:
                nonlocal found
                if found:
                    return False
                if isinstance(n, cst.BaseExpression) and outer.element(n) is not None:
                    found = True
                    return False
                if isinstance(n, cst.Name) and n.value in outer.forbidden:
                    found = True
                    return False
                return True

        expr.visit(_V())
        return found

    def batched(self, expr: cst.BaseExpression, names: Dict[str, str]) -> cst.BaseExpression:
        """``expr`` with every loop element replaced by the name of its batched tensor."""
        outer = self

        class _T(cst.CSTTransformer):
            def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):
                if isinstance(original, cst.BaseExpression):
                    key = outer.element(original)
                    if key is not None:
                        new = cst.parse_expression(names[key])  # a name, or e.g. ``_sb_batch[0]``
                        return new.with_changes(lpar=original.lpar, rpar=original.rpar) if original.lpar else new
                return updated

        return expr.visit(_T())


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


# --------------------------------------------------------------------------- loop headers


class LoopHeader:
    """``for x in X`` / ``for a, b in zip(A, B)`` (mode "zip") or ``for i in range(...)`` ("range").

    ``element(node)`` recognises what the body may read per iteration: a loop variable (zip
    mode) or ``X[i]`` with ``X`` a plain reference (range mode); ``sources`` maps each element key
    to the expression it comes from (filled as elements are seen, in range mode).
    """

    def __init__(self, mode: str, names: List[str], sources: Dict[str, cst.BaseExpression], range_call=None) -> None:
        self.mode = mode
        self.names = names
        self.sources = sources
        self.range_call = range_call

    def element(self, node: cst.CSTNode) -> Optional[str]:
        if self.mode == "zip":
            if isinstance(node, cst.Name) and node.value in self.names:
                return node.value
            return None
        if (
            isinstance(node, cst.Subscript)
            and len(node.slice) == 1
            and isinstance(node.slice[0].slice, cst.Index)
            and isinstance(node.slice[0].slice.value, cst.Name)
            and node.slice[0].slice.value.value == self.names[0]
            and is_simple_ref(node.value)
            and self.names[0] not in names_read(node.value)
        ):
            key = _code(node.value)
            self.sources.setdefault(key, node.value)
            return key
        return None


def _bound_ok(expr: cst.BaseExpression, forbidden: Set[str], builtins_ok) -> bool:
    """A range bound: a pure expression, or ``len(ref)`` (arithmetic on those)."""
    if (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Name)
        and expr.func.value == "len"
        and builtins_ok("len")
        and len(expr.args) == 1
        and expr.args[0].keyword is None
        and not expr.args[0].star
        and is_simple_ref(expr.args[0].value)
        and not (names_read(expr.args[0].value) & forbidden)
    ):
        return True
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide)):
        return _bound_ok(expr.left, forbidden, builtins_ok) and _bound_ok(expr.right, forbidden, builtins_ok)
    return is_pure(expr, forbidden)


def parse_header(node: cst.For, builtins_ok) -> "LoopHeader | str":
    """The header of a vectorizable loop, or why it is not one. ``builtins_ok(name)`` says whether
    ``zip``/``range``/``len`` mean the builtins in this module."""
    if node.asynchronous is not None:
        return "async for"
    if node.orelse is not None:
        return "the loop has an else clause"
    return parse_iteration(node.target, node.iter, builtins_ok)


def parse_iteration(target: cst.BaseExpression, it: cst.BaseExpression, builtins_ok) -> "LoopHeader | str":
    """``target in it`` of a ``for`` loop or a comprehension, as a :class:`LoopHeader`, or why not."""
    names = target_names(target)
    if names is None or len(set(names)) != len(names):
        return "the loop target is not a name or a tuple of distinct names"
    if isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value in ("zip", "range"):
        func = it.func.value
        if not builtins_ok(func):
            return f"{func} is rebound in this module"
        if any(a.star or a.keyword is not None for a in it.args):
            return f"{func}(...) has keyword or unpacked arguments"
        if func == "range":
            if len(names) != 1:
                return "a range loop must bind one index"
            if not 1 <= len(it.args) <= 3 or not all(_bound_ok(a.value, set(names), builtins_ok) for a in it.args):
                return "range bounds are not plain values"
            return LoopHeader("range", names, {}, it)
        if len(it.args) != len(names):
            return "the loop target does not unpack one name per zipped iterable"
        if not all(is_simple_ref(a.value) for a in it.args):
            return "a zipped iterable is not a plain name/attribute (it would be evaluated twice)"
        return LoopHeader("zip", names, {n: a.value for n, a in zip(names, it.args)})
    if len(names) != 1:
        return "the loop unpacks its elements"
    if not is_simple_ref(it):
        return "the iterable is not a plain name/attribute (it would be evaluated twice)"
    return LoopHeader("zip", names, {names[0]: it})


def is_runtime_guard(test: cst.BaseExpression, imports) -> bool:
    """Whether an ``if`` test is a guard some transform emitted (its else branch holds original
    code kept verbatim: loops there are not rewritten again). Recognised by a call of a
    ``scalebox_cst.runtime`` helper or a ``_sb_``-prefixed name in the test."""
    found = False

    class _V(cst.CSTVisitor):
        def visit_Call(self, n: cst.Call) -> None:
            nonlocal found
            qual = imports.qualify(n.func)
            if qual is not None and qual.startswith("scalebox_cst.runtime."):
                found = True

        def visit_Name(self, n: cst.Name) -> None:
            nonlocal found
            if n.value.startswith("_sb_"):
                found = True

    test.visit(_V())
    return found


# --------------------------------------------------------------------------- cheap candidate search
#
# Deciding on Python's ``ast`` (parsed once, shared by all transforms) that a file holds no
# candidate costs well under a millisecond; parsing it with libcst costs tens. The ``vectorize.*``
# transforms therefore look for candidates on ``ast`` first and touch libcst only when there is
# one: statements are matched between the two trees by their position in a pre-order walk of
# statement lists (both parsers nest statements the same way), sites take their lines from
# ``ast`` (the same lines PositionProvider gives: neither counts parentheses, comments or
# trailing blank lines), and edits rebuild only the nodes on the way to what changed.

#: ast statement class → libcst class name where the two differ
_AST_TO_CST = {"AsyncFor": "For", "AsyncFunctionDef": "FunctionDef", "AsyncWith": "With", "Delete": "Del"}


def ast_statements(body: Sequence[ast.stmt]) -> Tuple[List[ast.stmt], Dict[ast.stmt, Optional[ast.stmt]]]:
    """Every statement under ``body`` in pre-order (an ``elif`` is a statement of its own), and
    each one's enclosing statement (None at the top)."""
    out: List[ast.stmt] = []
    parent: Dict[ast.stmt, Optional[ast.stmt]] = {}

    def walk(stmts: Sequence[ast.stmt], up: Optional[ast.stmt]) -> None:
        for st in stmts:
            out.append(st)
            parent[st] = up
            for field in _BLOCK_FIELDS:
                block = getattr(st, field, None)
                if not block:
                    continue
                if field in ("handlers", "cases"):
                    for h in block:
                        walk(h.body, st)
                else:
                    walk(block, st)

    walk(body, None)
    return out, parent


class CstStatements:
    """The libcst statements of a module in the same pre-order as :func:`ast_statements`.

    Small statements of one line (``a = 1; b = 2``) are separate entries, as in ``ast``.
    ``parent`` maps each node of the statement skeleton (statements, suites, ``else``/``except``/
    ``finally``/``case`` clauses) to the node that holds it, for :func:`replace_nodes`.
    """

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self.stmts: List[cst.CSTNode] = []
        self.parent: Dict[cst.CSTNode, cst.CSTNode] = {}
        #: the module and every indented block, inner blocks first (the order a transformer leaves them)
        self.blocks: List[cst.CSTNode] = []
        self._body(module.body, module)

    def _body(self, stmts: Sequence[cst.BaseStatement], up: cst.CSTNode) -> None:
        for st in stmts:
            self.parent[st] = up
            if isinstance(st, cst.SimpleStatementLine):
                for small in st.body:
                    self.parent[small] = st
                    self.stmts.append(small)
            else:
                self.stmts.append(st)
                self._compound(st)
        self.blocks.append(up)

    def _suite(self, suite: cst.BaseSuite, up: cst.CSTNode) -> None:
        self.parent[suite] = up
        if isinstance(suite, cst.IndentedBlock):
            self._body(suite.body, suite)
        else:
            for small in suite.body:
                self.parent[small] = suite
                self.stmts.append(small)

    def _compound(self, st: cst.CSTNode) -> None:
        for field in _BLOCK_FIELDS:
            block = getattr(st, field, None)
            if block is None:
                continue
            if isinstance(block, cst.BaseSuite):
                self._suite(block, st)
            elif isinstance(block, cst.If):  # elif
                self.parent[block] = st
                self.stmts.append(block)
                self._compound(block)
            elif isinstance(block, (cst.Else, cst.Finally)):
                self.parent[block] = st
                self._suite(block.body, block)
            elif isinstance(block, (list, tuple)):  # except handlers, match cases
                for h in block:
                    self.parent[h] = st
                    self._suite(h.body, h)

    def matches(self, ast_stmts: Sequence[ast.stmt]) -> bool:
        """Whether the two walks paired every statement with one of the same kind."""
        if len(ast_stmts) != len(self.stmts):
            return False
        for a, c in zip(ast_stmts, self.stmts):
            name = type(a).__name__
            if _AST_TO_CST.get(name, name) != type(c).__name__:
                return False
        return True

    def ancestors(self, node: cst.CSTNode) -> List[cst.CSTNode]:
        """The skeleton nodes that hold ``node``, innermost first (the module last)."""
        out: List[cst.CSTNode] = []
        up = self.parent.get(node)
        while up is not None:
            out.append(up)
            up = self.parent.get(up)
        return out

    def scope(self, node: cst.CSTNode) -> cst.CSTNode:
        """The innermost function or class that holds ``node``, else the module."""
        for up in self.ancestors(node):
            if isinstance(up, (cst.FunctionDef, cst.ClassDef)):
                return up
        return self.module

    def guarded(self, node: cst.CSTNode, imports) -> bool:
        """Whether an enclosing ``if`` is a guard an earlier rewrite emitted (see
        :func:`is_runtime_guard`)."""
        return any(isinstance(up, cst.If) and is_runtime_guard(up.test, imports) for up in self.ancestors(node))


def ast_guarded(node: ast.stmt, parent: Dict[ast.stmt, Optional[ast.stmt]], imports) -> bool:
    """``ast`` side of :meth:`CstStatements.guarded`: True only where libcst would say so too
    (a ``_sb_`` name or a ``scalebox_cst.runtime`` call in an enclosing ``if`` test)."""
    up = parent.get(node)
    while up is not None:
        if isinstance(up, ast.If):
            for n in ast.walk(up.test):
                if isinstance(n, ast.Name) and n.id.startswith("_sb_"):
                    return True
                if isinstance(n, ast.Call):
                    qual = imports.qualify(n.func)
                    if qual is not None and qual.startswith("scalebox_cst.runtime."):
                        return True
        up = parent.get(up)
    return False


def ast_is_flat(body: Sequence[ast.stmt]) -> bool:
    """``ast`` side of :func:`flat_body` (not None): no compound statement in the suite."""
    return not any(isinstance(st, _AST_COMPOUND) for st in body)


_AST_COMPOUND = tuple(
    getattr(ast, name)
    for name in (
        "If", "For", "AsyncFor", "While", "With", "AsyncWith", "Try", "TryStar", "FunctionDef",
        "AsyncFunctionDef", "ClassDef", "Match",
    )
    if hasattr(ast, name)
)


def _ast_store_names(target: ast.AST, out: Set[str]) -> None:
    if isinstance(target, ast.Name):
        out.add(target.id)
    elif isinstance(target, (ast.Tuple, ast.List)):
        for el in target.elts:
            _ast_store_names(el, out)
    elif isinstance(target, ast.Starred):
        _ast_store_names(target.value, out)


def ast_rebound(tree: ast.AST) -> Tuple[Set[str], bool]:
    """The names :func:`rebinds` finds bound in the module, from ``ast`` (one walk instead of a
    libcst visit per name), and whether a star import may bind anything."""
    parts = statement_memo.per_statement(tree, "rebound", _ast_rebound_walk)  # unchanged statements: reused
    if parts is not None:
        return set().union(*(p[0] for p in parts)), any(p[1] for p in parts)
    return _ast_rebound_walk(tree)


def _ast_rebound_walk(tree: ast.AST) -> Tuple[Set[str], bool]:
    names: Set[str] = set()
    star = False
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                _ast_store_names(t, names)
        elif isinstance(n, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor, ast.comprehension)):
            _ast_store_names(n.target, names)
        elif isinstance(n, ast.withitem):
            if n.optional_vars is not None:
                _ast_store_names(n.optional_vars, names)
        elif isinstance(n, ast.ExceptHandler):
            if n.name:
                names.add(n.name)
        elif isinstance(n, ast.Import):
            for a in n.names:
                if a.asname:
                    names.add(a.asname)
                elif "." not in a.name:
                    names.add(a.name)
        elif isinstance(n, ast.ImportFrom):
            for a in n.names:
                if a.name == "*":
                    star = True
                else:
                    names.add(a.asname or a.name)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
    return names, star


def builtin_checker(tree: ast.AST) -> Callable[[str], bool]:
    """``builtins_ok(name)`` for :func:`parse_header`: the name is not rebound in the module."""
    cache: List[Tuple[Set[str], bool]] = []

    def ok(name: str) -> bool:
        if not cache:
            cache.append(ast_rebound(tree))
        names, star = cache[0]
        return not star and name not in names

    return ok


class _PathReplacer(cst.CSTTransformer):
    def __init__(self, replacements, path: Set[cst.CSTNode]) -> None:
        super().__init__()
        self.replacements = replacements
        self.path = path

    def on_visit(self, node: cst.CSTNode) -> bool:
        return node in self.path

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):
        return self.replacements.get(original, updated)


def replace_nodes(module: cst.Module, replacements: Dict[cst.CSTNode, object], parent: Dict[cst.CSTNode, cst.CSTNode]) -> cst.Module:
    """``module`` with each key of ``replacements`` (original nodes) swapped for its value (a node
    or a ``FlattenSentinel`` of statements). ``parent`` must lead from every key to the module;
    only the nodes on those paths are rebuilt (a full transformer pass costs far more)."""
    path: Set[cst.CSTNode] = set()
    for node in replacements:
        up = parent.get(node)
        while up is not None and up not in path:
            path.add(up)
            up = parent.get(up)
    return module.visit(_PathReplacer(replacements, path))


class ScopedRewriter(cst.CSTTransformer):
    """What every vectorize.* rewriter tracks while it walks: the enclosing scopes (module,
    functions, classes) and whether each enclosing ``if`` is a guard another rewrite emitted
    (loops kept under such a guard are never rewritten again). Run over the whole module (the
    fallback) or driven node by node by the transform, which then sets ``scopes`` and ``guards``
    itself and gives the nodes' lines in ``spans`` (from the ast, so no PositionProvider)."""

    transform_id = ""

    def __init__(self, ctx, sites: List[Site], spans: Optional[Dict[cst.CSTNode, Tuple[int, int]]] = None) -> None:
        super().__init__()
        self.ctx = ctx
        self.sites = sites
        self.spans = spans
        self.scopes: List[cst.CSTNode] = []
        self.guards: List[bool] = []
        self.builtin_ok = builtin_checker(ctx.tree)

    def make_site(self, node: cst.CSTNode, action: str, reason: str, exactness: Optional[str] = None) -> Site:
        if self.spans is None:
            return self.ctx.site(self.transform_id, node, action, reason, exactness)
        line, end = self.spans[node]
        return Site(self.transform_id, line, end, action, reason, exactness)

    def visit_Module(self, node: cst.Module) -> None:
        self.scopes.append(node)

    def visit_If(self, node: cst.If) -> None:
        self.guards.append(is_runtime_guard(node.test, self.ctx.imports))

    def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
        self.guards.pop()
        return updated

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scopes.append(node)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.scopes.append(node)

    def leave_FunctionDef(self, original, updated):
        self.scopes.pop()
        return updated

    def leave_ClassDef(self, original, updated):
        self.scopes.pop()
        return updated
