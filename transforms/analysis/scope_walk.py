"""The walk of a scope that finds its variable reads, and what bindings cover them.

:class:`ScopeWalk` goes through a scope's body in source order and meets each variable read with
what covers it (another loop or comprehension binding the name, a nested function binding it
locally); :mod:`.reads` answers one loop's question with it (``_Reads``) and :mod:`.read_index`
records every read of a scope once with it. Here so that both import it: neither imports the
other's module.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Set

import libcst as cst

from .bodies import target_names


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
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            names.add(star.name.value)
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


class ScopeWalk(cst.CSTVisitor):
    """The walk of a scope's body that finds variable reads, in source order, with what covers
    each: the body of another ``for`` loop (or a comprehension) whose target binds the name, a
    nested function that binds it locally. A subclass says what a read means (:meth:`_read`, and
    :meth:`_reads_all` for ``locals()``/``vars()``/``globals()`` without arguments and
    ``eval``/``exec``), what entering and leaving a loop means, and which ``for`` loop it does
    not enter (:meth:`_stop_at`): :class:`_Reads` answers for one loop, ``read_index.ReadIndex``
    records every read once for all the loops of the scope."""

    def __init__(self) -> None:
        self._covered: List[Set[str]] = []
        self._stores: Set[int] = set()
        self._skip: Set[int] = set()  # Name nodes that are not variable reads
        self._nested = 0  # inside nested functions/lambdas

    # -- what a subclass decides
    def _read(self, name: str) -> None:
        raise NotImplementedError

    def _reads_all(self) -> None:
        raise NotImplementedError

    def _loop_entered(self, node: cst.CSTNode) -> None:
        pass

    def _loop_left(self, node: cst.CSTNode) -> None:
        pass

    def _stop_at(self, node: cst.For) -> bool:
        return False

    def _is_covered(self, name: str) -> bool:
        return any(name in c for c in self._covered)

    def visit_While(self, node: cst.While) -> None:
        self._loop_entered(node)

    def leave_While(self, node: cst.While) -> None:
        self._loop_left(node)

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
        if self._stop_at(node):
            return False
        self._loop_entered(node)
        _store_names(node.target, self._stores)
        node.target.visit(self)
        node.iter.visit(self)
        bound = set(target_names(node.target) or ())
        self._covered.append(bound)
        node.body.visit(self)
        self._covered.pop()
        if node.orelse is not None:
            node.orelse.visit(self)
        self._loop_left(node)
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
                self._reads_all()

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) in self._skip or id(node) in self._stores:
            return
        self._read(node.value)

    def visit_Del(self, node: cst.Del) -> None:
        for name in _all_names(node.target):
            self._read(name)


def _all_names(node: cst.CSTNode) -> Set[str]:
    names = _Names()
    node.visit(names)
    return names.out


class _Names(cst.CSTVisitor):
    """:func:`_all_names`'s visit (module-level: a class made per call is a cycle that stays alive,
    with what it holds, until a garbage collection)."""

    def __init__(self) -> None:
        super().__init__()
        self.out: Set[str] = set()

    def visit_Name(self, n: cst.Name) -> None:
        self.out.add(n.value)
