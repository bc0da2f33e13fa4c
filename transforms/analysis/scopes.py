"""Scopes: whether a module rebinds a name (a builtin or an import), declared globals, the names a
module binds (from ast, once per statement through statement_memo), builtins left unshadowed.
"""
from __future__ import annotations

import ast
from typing import Callable, Iterable, List, Set, Tuple

import libcst as cst

from .. import statement_memo
from .reads import _skeleton, _store_names


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
