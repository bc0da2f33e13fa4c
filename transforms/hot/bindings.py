"""What a name is bound to in one scope (a function body or the module), for the hot.* rewrites.

Nested functions, lambdas and classes are other scopes and are not entered. A binding is the
assigned expression for ``name = expr`` (and for ``a, b = x, y`` element by element), or None
for any other binding (parameters, loop targets, augmented assignments, ``with ... as``, imports,
``del``, walrus, unpacking of something else). ``global``/``nonlocal`` declarations count as an
unknown binding too (the name may be bound elsewhere).
"""
from __future__ import annotations

import ast
import functools
import re
import weakref
from typing import TYPE_CHECKING, AbstractSet, Any, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

import libcst as cst

from libcst.metadata import PositionProvider

from ..analysis import positions
from ..analysis.cstwalk import push_children
from ..analysis.statements import Holding, holding

if TYPE_CHECKING:
    from ..base import FileContext

Scope = Union[cst.Module, cst.FunctionDef]
CSTNodeT = TypeVar("CSTNodeT", bound=cst.CSTNode)


class _Binder(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.found: Dict[str, List[Optional[cst.BaseExpression]]] = {}

    def bind(self, target: cst.BaseExpression, value: Optional[cst.BaseExpression]) -> None:
        if isinstance(target, cst.Name):
            self.found.setdefault(target.value, []).append(value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            values = None
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(target.elements) \
                    and not any(isinstance(e, cst.StarredElement) for e in (*value.elements, *target.elements)):
                values = [e.value for e in value.elements]
            for i, el in enumerate(target.elements):
                self.bind(el.value, values[i] if values is not None else value if _is_zip(value) else None)
        elif isinstance(target, cst.StarredElement):
            self.bind(target.value, None)

    def visit_Assign(self, node: cst.Assign) -> None:
        for t in node.targets:
            self.bind(t.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self.bind(node.target, node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.bind(node.target, None)

    def visit_For(self, node: cst.For) -> None:
        self.bind(node.target, None)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self.bind(node.target, None)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self.bind(node.asname.name, None)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self.bind(node.target, None)

    def visit_Del(self, node: cst.Del) -> None:
        self.bind(node.target, None)

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        name = node.asname.name if node.asname is not None else node.name
        while isinstance(name, cst.Attribute):
            name = name.value
        self.bind(name, None)

    def visit_Global(self, node: cst.Global) -> None:
        for n in node.names:
            self.bind(n.name, None)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        for n in node.names:
            self.bind(n.name, None)

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if node.name is not None:
            self.bind(node.name.name, None)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.bind(node.name, None)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.bind(node.name, None)
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


def _is_zip(value: Optional[cst.BaseExpression]) -> bool:
    return isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in ("zip", "map")


def bindings(scope: Union[Scope, cst.ClassDef], declarations: bool = True) -> Dict[str, List[Optional[cst.BaseExpression]]]:
    """Every binding of every name directly in ``scope`` (see the module docstring).
    ``declarations``: False where the file holds no ``global`` or ``nonlocal`` statement (then
    the walk of the whole scope looking for them is saved: :func:`may_declare`)."""
    binder = _Binder()
    if isinstance(scope, cst.ClassDef):  # a class body (what it binds; its methods not entered)
        _walk_binding(binder, scope.body)
    elif isinstance(scope, cst.FunctionDef):
        params = scope.params
        for p in (*params.posonly_params, *params.params, *params.kwonly_params):
            binder.bind(p.name, None)
        for p in (params.star_arg, params.star_kwarg):
            if isinstance(p, cst.Param):
                binder.bind(p.name, None)
        _walk_binding(binder, scope.body)
    else:
        for stmt in scope.body:
            _walk_binding(binder, stmt)
    # a nested function's ``global x`` / ``nonlocal x`` may rebind x here
    for name in _declared_below(scope) if declarations else ():
        binder.found.setdefault(name, []).append(None)
    return binder.found


def _walk_binding(binder: "_Binder", node: cst.CSTNode) -> None:
    """``node.visit(binder)`` without libcst's visit, which rebuilds every node it passes: the
    nodes are read from their fields (cstwalk), in the order the visit meets them, and each
    kind the binder looks at is handed to its method (those that return False are not entered).
    A module-level training loop (CleanRL's, under ``if __name__ == "__main__":``) was a visit
    of most of the file for each hot.* transform that asked."""
    stack = [node]
    methods = _BINDER_METHODS
    while stack:
        n = stack.pop()
        method = methods.get(type(n), _NO_METHOD)
        if method is _NO_METHOD:
            method = methods[type(n)] = getattr(_Binder, "visit_" + type(n).__name__, None)
        if method is not None and method(binder, n) is False:
            continue
        start = len(stack)
        push_children(n, stack)
        stack[start:] = stack[start:][::-1]  # popped in field order: the visit's order


_NO_METHOD: Any = object()
#: node type -> the binder's ``visit_`` method for it, or None
_BINDER_METHODS: Dict[type, Any] = {}


#: a ``global`` or ``nonlocal`` keyword (ASCII: Python matches keywords before normalising names)
_DECLARATION = re.compile(r"\b(?:global|nonlocal)\b")


def _whole_positions(ctx: "weakref.ref[FileContext]"):
    """The whole module's positions (a weak reference: the context holds these positions)."""
    return ctx().wrapper.resolve(PositionProvider)


def may_declare(code: str) -> bool:
    """Whether ``code`` may hold a ``global`` or ``nonlocal`` statement (its text spells one as a
    word: ``global_step`` does not)."""
    return _DECLARATION.search(code) is not None


def _declared_below(scope: Union[Scope, cst.ClassDef]) -> List[str]:
    declared = _Declarations()
    scope.visit(declared)
    return declared.names


class _Declarations(cst.CSTVisitor):
    """:func:`_declared_below`'s visit (module-level: a class made per call is a cycle that stays alive, with what it holds, until a garbage collection)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: List[str] = []

    def visit_Global(self, node: cst.Global) -> None:
        self.names.extend(n.name.value for n in node.names)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self.names.extend(n.name.value for n in node.names)


def only_value(found: Dict[str, List[Optional[cst.BaseExpression]]], name: str) -> Optional[cst.BaseExpression]:
    """The expression ``name`` is bound to where that is its one and only binding in the scope."""
    values = found.get(name, [])
    return values[0] if len(values) == 1 else None


class _Appends(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.found: Dict[str, List[cst.BaseExpression]] = {}

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "append" and isinstance(func.value, cst.Name) \
                and len(node.args) == 1 and not node.args[0].star and node.args[0].keyword is None:
            self.found.setdefault(func.value.value, []).append(node.args[0].value)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


def appended(scope: Scope) -> Dict[str, List[cst.BaseExpression]]:
    """The argument of every ``name.append(arg)`` directly in ``scope``, by name."""
    visitor = _Appends()
    body = scope.body.body if isinstance(scope, cst.FunctionDef) else scope.body
    for stmt in body if isinstance(body, (list, tuple)) else [body]:
        stmt.visit(visitor)
    return visitor.found


class PrunedTransformer(cst.CSTTransformer):
    """A transformer that does not enter the nodes whose ids are in :attr:`skip` (set by
    :func:`visit_calls`: statements holding none of the calls it decides). A skipped node is
    neither visited nor left: it stays the very node it was."""

    skip: AbstractSet[int] = frozenset()

    def on_visit(self, node: cst.CSTNode) -> bool:
        if id(node) in self.skip:
            return False
        return super().on_visit(node)

    def on_leave(self, original_node: CSTNodeT, updated_node: CSTNodeT) -> Union[CSTNodeT, cst.RemovalSentinel, cst.FlattenSentinel[CSTNodeT]]:
        if id(original_node) in self.skip:
            return updated_node
        return super().on_leave(original_node, updated_node)


class ScopedRewriter(PrunedTransformer):
    """A transformer that knows the scope (module or function body) it is in and what each
    name is bound to there (:func:`bindings`, computed once per scope), for the hot.* rewrites
    that decide a call by how its arguments were made."""

    #: whether the file visited may hold ``global``/``nonlocal`` (set by :func:`visit_calls`)
    declarations = True

    def __init__(self) -> None:
        super().__init__()
        self.scopes: List[Scope] = []
        self._bindings: Dict[object, Dict[str, List[Optional[cst.BaseExpression]]]] = {}
        #: the class bodies being visited, each with the number of scopes open when it was entered
        self._classes: List[Tuple[int, cst.ClassDef]] = []

    def visit_Module(self, node: cst.Module) -> None:
        self.scopes.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scopes.append(node)

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        self.scopes.pop()
        return updated

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._classes.append((len(self.scopes), node))

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self._classes.pop()
        return updated

    def _found(self) -> Dict[str, List[Optional[cst.BaseExpression]]]:
        """The bindings of the scope being visited. Directly in a class body, a name the class
        body binds is the class's where the binding ran first and the enclosing scope's (the
        module's) before: unknown there (one more binding, None); other names are the enclosing
        scope's, as Python reads them."""
        scope = self.scopes[-1]
        if scope not in self._bindings:
            self._bindings[scope] = bindings(scope, self.declarations)
        found = self._bindings[scope]
        classes = tuple(c for depth, c in self._classes if depth == len(self.scopes))
        if not classes:
            return found
        key = (scope, classes)
        if key not in self._bindings:
            merged = {name: list(values) for name, values in found.items()}
            for cls in classes:
                for name in bindings(cls, self.declarations):
                    merged.setdefault(name, []).append(None)
            self._bindings[key] = merged
        return self._bindings[key]


def _in_functions(tree: ast.Module, calls: Sequence[ast.AST]) -> bool:
    """Whether every node of ``calls`` lies inside a ``def`` (at any depth) of ``tree``."""
    wanted = {id(c) for c in calls}
    found = 0
    stack: List[Tuple[ast.AST, bool]] = [(n, False) for n in tree.body]  # (node, whether a def holds it)
    while stack:
        node, inside = stack.pop()
        if id(node) in wanted:
            if not inside:
                return False
            found += 1
        inner = inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))
    return found == len(wanted)


def visit_calls(ctx: "FileContext", calls: Sequence[ast.AST], rewriter: cst.CSTTransformer, scoped: bool = True) -> cst.Module:
    """``rewriter`` (deciding each of ``calls``: every node of ``ctx.tree`` it could act on) over
    the module, where possible over only the top-level statements holding them.

    On a long file the parse, the visit and the positions of the whole module were most of a
    rewrite (1.3 s of a 958-line test file with two distributions). Here only the statements
    holding the calls are parsed (``ctx.module_for``), visited and positioned (also in a whole
    module that an earlier transform parsed: partial.statement_positions); every other statement
    stays the very node it was (a visit re-creates every node it passes, and a filler re-created is a
    filler lost: the pipeline then redoes the transform on the whole module). A
    :class:`ScopedRewriter` (``scoped``) reads the bindings of a call's scope: a function's lie in
    the statement holding it, the module's (a call at module level or directly in a class body)
    anywhere in the file, so any such call takes the whole module."""
    from .. import partial

    lines = [getattr(c, "lineno", 1) for c in calls]
    if isinstance(rewriter, ScopedRewriter):
        rewriter.declarations = may_declare(ctx.code)
    module = ctx.module if scoped and not _in_functions(ctx.tree, calls) else ctx.module_for(calls)
    part = ctx.partial if ctx.partial is not None and ctx.partial.module is module else None
    ch = part.chunks if part is not None else partial.chunks(ctx.code, ctx.tree)
    if ch is None or len(module.body) != len(ch.tops):
        _pruned(rewriter, holding(module, module.body, ctx.tree.body, lines))
        return module.visit(rewriter)
    groups = sorted({ch.group_of(line) for line in lines})
    if part is not None and not part.covers(groups):
        whole = ctx.whole_module()
        _pruned(rewriter, holding(whole, whole.body, ctx.tree.body, lines))
        return whole.visit(rewriter)
    held = holding(module, [module.body[g] for g in groups], [st for g in groups for st in ch.tops[g]], lines)
    if "positions" not in ctx.__dict__ and held is not None:  # the innermost statements holding the calls, alone
        units = positions.innermost(held)
        found = positions.alone(module, units, ch.lines) if units is not None else None
        if found is not None:
            ctx.__dict__["positions"] = positions.Positions(found, functools.partial(_whole_positions, weakref.ref(ctx)))
    if part is None and "positions" not in ctx.__dict__ and 2 * sum(ch.ends[g] - ch.starts[g] + 1 for g in groups) < len(ch.lines):
        # the whole module: positions of these statements only (each costs two codegens of it,
        # so only where they are under half the file: a script's `__main__` block is most of it)
        found = partial.statement_positions(module, ch, groups)
        if found is not None:
            ctx.__dict__["positions"] = found
    if isinstance(rewriter, ScopedRewriter):
        rewriter.scopes.append(module)  # as visit_Module would
    _pruned(rewriter, held)
    visited = set(groups)
    body: List[cst.CSTNode] = []
    for g, statement in enumerate(module.body):
        if g not in visited:
            body.append(statement)
            continue
        new = statement.visit(rewriter)
        if isinstance(new, cst.FlattenSentinel):
            body.extend(new.nodes)
        elif not isinstance(new, cst.RemovalSentinel):
            body.append(new)
    return module.with_changes(body=body)


def _pruned(rewriter: cst.CSTTransformer, held: Optional[Holding]) -> None:
    """Tell a :class:`PrunedTransformer` which statements hold none of the calls (it skips them);
    nothing where the two trees did not pair."""
    if isinstance(rewriter, PrunedTransformer):
        rewriter.skip = held.not_holding() if held is not None else set()
