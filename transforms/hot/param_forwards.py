"""Forwards of a module that arrives as a parameter, for :mod:`.no_grad`: Packt's
``def iterate_batches(env, net, batch_size)`` acting with ``sm(net(obs_v))``.

What ``net(obs)`` runs is not known where it is written: any caller, in this file or another,
may pass any module. It is known at run time: the rewrite runs the statement under
``torch.no_grad()`` where ``type(net)`` is exactly one of the classes of this file whose forward
the analysis checked (:meth:`.callees.Files.body_problem`: keeps nothing, reads no autograd state,
updates nothing in place), and as written otherwise (``runtime.hot_grad.checked_modules``).

A parameter qualifies where the function never rebinds it and calls it directly
(``net(x)``, with arguments). A class qualifies where it is an ``nn.Module`` defined at the top
level before the function (so its name is bound whenever the function can run), the file binds
its name nowhere else (no assignment, import, ``del``, second definition, ``global``), and every
body a call of an instance runs has no problem. The check names only the classes the file itself
is seen passing for that parameter (``iterate_batches(env, net, 16)`` with ``net = Net(...)``):
without such a call the check would be a guess (a ``callback`` parameter is rarely a network),
and one that never passes only costs.
"""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Tuple

from ..analysis.astwalk import own_nodes
from .callees import Files


class CheckedClasses:
    """The classes of a module a guarded forward may accept, per function (by where it is)."""

    def __init__(self, files: Files) -> None:
        self.files = files
        self._rebound = _names_rebound(files.tree)
        self._safe: Dict[str, bool] = {}
        self._top = [(st.lineno, st.end_lineno or st.lineno) for st in files.tree.body]
        self._calls: Optional[Dict[str, List[Tuple[ast.Call, ast.AST]]]] = None
        #: (id of the function, parameter) -> :meth:`passed`'s answer: asked for every call in
        #: every candidate statement, and again for its reason
        self._passed: Dict[Tuple[int, str], Tuple[str, ...]] = {}

    def passed(self, scope: ast.AST, param: str) -> Tuple[str, ...]:
        """The checked classes, defined at the top level before ``scope``'s top-level statement,
        of the modules this file passes to ``scope`` (a function of the module) as ``param``."""
        key = (id(scope), param)
        if key not in self._passed:
            self._passed[key] = self._passed_to(scope, param)
        return self._passed[key]

    def _passed_to(self, scope: ast.AST, param: str) -> Tuple[str, ...]:
        line = getattr(scope, "lineno", None)
        if line is None or not isinstance(scope, ast.FunctionDef) or self.files.functions.get(scope.name) is not scope:
            return ()
        start = next((a for a, b in self._top if a <= line <= b), line)
        return tuple(name for name in self._given(scope, param)
                     if name in self.files.classes and self.files.classes[name].lineno < start and self._checked(name))

    def _given(self, fn: ast.FunctionDef, param: str) -> List[str]:
        """Names of this file's classes whose instances the file passes to ``fn`` as ``param``,
        in order of first sight."""
        if self._calls is None:
            self._calls = _calls_by_name(self.files.tree)
        names = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
        at = names.index(param) if param in names else None
        out: List[str] = []
        for call, scope in self._calls.get(fn.name, ()):
            given = call.args[at] if at is not None and at < len(call.args) \
                and not any(isinstance(a, ast.Starred) for a in call.args[: at + 1]) \
                else next((k.value for k in call.keywords if k.arg == param), None)
            for name in self._classes_of(given, scope):
                if name not in out:
                    out.append(name)
        return out

    def _classes_of(self, value: Optional[ast.expr], scope: ast.AST) -> List[str]:
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in self.files.classes:
            return [value.func.id]
        if isinstance(value, ast.Name):
            kinds = self.files.kinds_of(value.id, None, scope) or []
            return [klass.name for kind, klass in kinds if kind == "class" and klass is not None]
        return []

    def _checked(self, name: str) -> bool:
        if name not in self._safe:
            klass = self.files.classes[name]
            ok = name not in self._rebound and self.files.torch_based(klass)
            if ok:
                bodies = self.files._call_of(("class", klass))
                ok = bool(bodies) and all(fn is not None and self.files.body_problem(fn, owner, set()) is None
                                          for fn, owner in bodies or ())
            self._safe[name] = ok
        return self._safe[name]


def called_parameter(node: ast.Call, scope: ast.AST, files: Files) -> Optional[str]:
    """The parameter of ``scope`` that ``node`` calls (``net(x)``), where ``scope`` never rebinds
    it; None otherwise."""
    func = node.func
    if not isinstance(func, ast.Name) or not node.args or not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    if not any(isinstance(a, ast.arg) and a.arg == func.id for a in ast.walk(scope.args)):
        return None
    if files._assigned(scope, func.id) != []:
        return None  # bound again in the function (or some other way there): not the caller's value
    return func.id


def _calls_by_name(tree: ast.Module) -> Dict[str, List[Tuple[ast.Call, ast.AST]]]:
    """Every call ``name(...)`` of the module by ``name``, with the scope (the module or a
    function) it is written in."""
    out: Dict[str, List[Tuple[ast.Call, ast.AST]]] = {}
    scopes: List[ast.AST] = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]
    for scope in scopes:
        for node in own_nodes(scope):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                out.setdefault(node.func.id, []).append((node, scope))
    return out


def _names_rebound(tree: ast.Module) -> set:
    """Names the module binds more than by one top-level class or function definition: stored,
    deleted, imported, declared global or defined twice anywhere in the file."""
    out = set()
    defined: List[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, ast.alias):
            out.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            out.update(node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name in defined:
                out.add(node.name)
            defined.append(node.name)
        elif isinstance(node, ast.arg):
            out.add(node.arg)  # a parameter of that name shadows the class in its function
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            out.add(node.name)
    return out
