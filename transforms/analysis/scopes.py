"""Scopes: whether a module rebinds a name (a builtin or an import), declared globals, the names a
module binds (from ast, once per statement through statement_memo), builtins left unshadowed, and
what a star import may bind.

Star imports: a user module's public names cannot be known without running it (never imported
here), so ``from mylib import *`` may rebind any builtin. For a few stdlib modules the names are
read from the module itself (:data:`STAR_STDLIB`: importing them runs no user code and costs
nothing, they are loaded in every interpreter or nearly). ``numpy`` and ``torch`` are not imported
by the engine (about a second for torch); :data:`STAR_BUILTINS` lists the builtins their star
import binds (``from torch import *`` rebinds ``range``, ``sum``, ``max``...), taken from numpy
2.x and torch 2.x and checked against the installed versions by tests/transforms/test_reasons.py. The
assumption is that later versions add no builtin-named export; other names they bind are not
resolved (a call through one stays unknown).
"""
from __future__ import annotations

import ast
import builtins
import functools
import importlib
from typing import Callable, Dict, FrozenSet, Iterable, Optional, Sequence, Set, Tuple

import libcst as cst

from .. import rewrite_caches, statement_memo
from .astwalk import walk as ast_walk
from .reads import _skeleton, _store_names


def rebinds(module: cst.Module, name: str) -> bool:
    """Whether ``module`` may bind ``name`` anywhere (assignment, def, import, star import, parameter)."""
    finder = _Rebinds(name)
    module.visit(finder)
    return finder.found


class _Rebinds(cst.CSTVisitor):
    """:func:`rebinds`' visit (module-level: a class made per call is a cycle that stays alive, with
    what it holds, until a garbage collection)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.stores: Set[int] = set()
        self.found = False

    def visit_AssignTarget(self, n: cst.AssignTarget) -> None:
        _store_names(n.target, self.stores)

    def visit_AnnAssign(self, n: cst.AnnAssign) -> None:
        _store_names(n.target, self.stores)

    def visit_AugAssign(self, n: cst.AugAssign) -> None:
        _store_names(n.target, self.stores)

    def visit_For(self, n: cst.For) -> None:
        _store_names(n.target, self.stores)

    def visit_CompFor(self, n: cst.CompFor) -> None:
        _store_names(n.target, self.stores)

    def visit_AsName(self, n: cst.AsName) -> None:
        _store_names(n.name, self.stores)

    def visit_ImportAlias(self, n: cst.ImportAlias) -> None:
        if n.asname is None and isinstance(n.name, cst.Name):
            self.stores.add(id(n.name))

    def visit_ImportFrom(self, n: cst.ImportFrom) -> None:
        if isinstance(n.names, cst.ImportStar):
            self.found = True  # a star import may bind anything

    def visit_Param(self, n: cst.Param) -> None:
        self.stores.add(id(n.name))

    def visit_FunctionDef(self, n: cst.FunctionDef) -> None:
        self.stores.add(id(n.name))

    def visit_ClassDef(self, n: cst.ClassDef) -> None:
        self.stores.add(id(n.name))

    def visit_Name(self, n: cst.Name) -> None:
        if id(n) in self.stores and n.value == self.name:
            self.found = True


def declares_global(scope: cst.CSTNode, names: Iterable[str]) -> Set[str]:
    """Which of ``names`` the scope declares ``global`` or ``nonlocal`` (reads elsewhere unknown)."""
    known = _DECLARED.get(id(scope))
    if known is None or known[0] is not scope:  # once per scope: asked once per loop in it
        found: Set[str] = set()
        todo = [scope]
        while todo:  # statements only (where global/nonlocal are), nested functions and classes too
            node = todo.pop()
            if isinstance(node, (cst.Global, cst.Nonlocal)):
                found.update(a.name.value for a in node.names)
            todo.extend(_skeleton(node))
        known = _DECLARED[id(scope)] = (scope, frozenset(found))
    return set(names) & known[1]


#: id(scope) -> (scope, every name it or a scope inside it declares global/nonlocal); the scope
#: is held, so its id stays its own
_DECLARED: Dict[int, Tuple[cst.CSTNode, FrozenSet[str]]] = rewrite_caches.mapping()


def _ast_store_names(target: ast.AST, out: Set[str]) -> None:
    if isinstance(target, ast.Name):
        out.add(target.id)
    elif isinstance(target, (ast.Tuple, ast.List)):
        for el in target.elts:
            _ast_store_names(el, out)
    elif isinstance(target, ast.Starred):
        _ast_store_names(target.value, out)


def bound_anywhere(tree: ast.AST) -> Set[str]:
    """Every name bound anywhere under ``tree``, nested scopes included (assigned or deleted,
    defined, a parameter, imported: ``import a.b`` binds ``a``); a star import binds ``*``, which
    no name is. Enough to tell a name the file may rebind (a shadowed ``reversed``, a class name
    of its own) from one it never does."""
    out: Set[str] = set()
    for n in ast_walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in n.names)
    return out


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
    for n in ast_walk(tree):
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


#: stdlib modules whose star-imported names are read from the module at analysis time
STAR_STDLIB = frozenset({"math", "cmath", "operator", "itertools", "functools", "random", "statistics"})

#: the builtins ``from numpy import *`` / ``from torch import *`` rebind (see the module docstring)
STAR_BUILTINS = {
    "numpy": frozenset({"abs", "all", "any", "bool", "divmod", "max", "min", "pow", "round", "sum"}),
    "torch": frozenset({
        "abs", "all", "any", "bool", "compile", "complex", "float", "int", "max", "min", "pow", "range",
        "round", "sum",
    }),
}

_BUILTIN_NAMES = frozenset(dir(builtins))


@functools.lru_cache(maxsize=None)
def star_names(module: str) -> Optional[frozenset]:
    """The names ``from module import *`` binds, for a :data:`STAR_STDLIB` module; else None."""
    if module not in STAR_STDLIB:
        return None
    mod = importlib.import_module(module)
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [n for n in dir(mod) if not n.startswith("_")]
    return frozenset(names)


def star_binds(module: str, name: str) -> Optional[bool]:
    """Whether ``from module import *`` binds ``name``: True/False where that is known, None where
    it is not (a user module, a relative import, a name numpy/torch may export)."""
    names = star_names(module)
    if names is not None:
        return name in names
    if module in STAR_BUILTINS and name in _BUILTIN_NAMES:
        return name in STAR_BUILTINS[module]
    return None


def star_imports(tree: ast.AST) -> Tuple[str, ...]:
    """The modules of the module's star imports, in source order (``.mod`` for relative ones)."""
    parts = statement_memo.per_statement(tree, "stars", _star_walk)
    if parts is None:
        parts = [_star_walk(st) for st in tree.body] if isinstance(tree, ast.Module) else [_star_walk(tree)]
    return tuple(m for p in parts for m in p)


def _star_walk(stmt: ast.AST) -> Tuple[str, ...]:
    """One statement's star imports in source order (no absolute positions: the memo reuses a
    result for the same statement text wherever it moves)."""
    found = sorted(
        ((n.lineno, n.col_offset), "." * n.level + (n.module or ""))
        for n in ast.walk(stmt)
        if isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names)
    )
    return tuple(m for _, m in found)


def star_reason(stars: Sequence[str], name: str) -> Optional[str]:
    """Why a star import may take ``name`` from the builtins, or None if none of them binds it."""
    for module in stars:
        binds = star_binds(module, name)
        if binds:
            return f"a star import (`from {module} import *`) rebinds `{name}`"
        if binds is None:
            what = "a relative module" if module.startswith(".") else (
                "a module whose names are not known without importing it" if module not in STAR_BUILTINS
                else f"a module that may export `{name}`")
            return f"a star import (`from {module} import *`, {what}) may rebind `{name}`"
    return None


class BuiltinChecker:
    """``builtins_ok(name)`` for :func:`parse_header`: the name is not rebound in the module (by a
    binding, or by a star import that binds it or may); :meth:`reason` says which."""

    def __init__(self, tree: ast.AST) -> None:
        self.tree = tree
        self._cache: Optional[Tuple[Set[str], Tuple[str, ...]]] = None
        self._stars: Optional[Tuple[str, ...]] = None
        self._rebound: Dict[str, bool] = {}

    def _scan(self) -> Tuple[Set[str], Tuple[str, ...]]:
        if self._cache is None:
            names, star = ast_rebound(self.tree)
            self._cache = (names, star_imports(self.tree) if star else ())
        return self._cache

    def _is_rebound(self, name: str) -> Tuple[bool, Tuple[str, ...]]:
        """Whether ``name`` is bound in the module, and its star imports: on a registered module
        version only the statements that spell ``name`` (or ``import``) are scanned (a whole-module
        walk was a second per 50k lines for the few builtins a transform asks about)."""
        if self._cache is None and name not in self._rebound:
            parts = statement_memo.mentioning(self.tree, "rebound", _ast_rebound_walk, (name,), statement_memo.may_bind((name,)))
            if parts is None:
                self._scan()
            else:
                self._rebound[name] = any(name in p[0] for p in parts)
                if self._stars is None:
                    star = any(p[1] for p in statement_memo.mentioning(self.tree, "rebound", _ast_rebound_walk, ("import",)) or ())
                    self._stars = star_imports(self.tree) if star else ()
        if self._cache is not None:
            return name in self._cache[0], self._cache[1]
        return self._rebound[name], self._stars or ()

    def reason(self, name: str) -> Optional[str]:
        rebound, stars = self._is_rebound(name)
        if rebound:
            return f"{name} is rebound in this module"
        return star_reason(stars, name)

    def __call__(self, name: str) -> bool:
        return self.reason(name) is None


def builtin_checker(tree: ast.AST) -> BuiltinChecker:
    """A :class:`BuiltinChecker` for the module's tree: one per registered module version
    (statement_memo.per_version; its answers depend on the tree alone). Checkers were made per
    loop and per call checked (recurrence's grammar), and each first question scanned the text of
    every top-level statement."""
    return statement_memo.per_version(tree, "builtin_checker", lambda: BuiltinChecker(tree))


def rebound_reason(builtins_ok: Callable[[str], bool], name: str) -> str:
    """The reason to report when ``builtins_ok(name)`` is false (checkers given by tests are plain
    functions: they get the plain text)."""
    reason = getattr(builtins_ok, "reason", None)
    return (reason(name) if reason is not None else None) or f"{name} is rebound in this module"
