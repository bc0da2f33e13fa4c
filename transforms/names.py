"""Qualified names by import resolution, and the imports a rewrite needs.

libcst's ``QualifiedNameProvider`` costs about 0.5 ms per line (it builds full scopes), too slow
for save-to-commit latency. Transforms only need to know what an expression like ``th.nn.utils.
clip_grad_norm_`` or ``clip_grad_norm_`` *means* in terms of imported modules, so we resolve
dotted names through the module's own import statements: ``import torch as th`` and ``from
torch.nn.utils import clip_grad_norm_`` both lead to ``torch.nn.utils.clip_grad_norm_``.
A name that is rebound by assignment anywhere in the module is not trusted. A star import binds
names only for the stdlib modules whose names are known (``from math import *``: ``exp`` is
``math.exp``, see :func:`analysis.scopes.star_names`); other star imports bind nothing here.
"""
from __future__ import annotations

import ast

from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

import libcst as cst

from . import statement_memo
from .analysis.astwalk import push_children
from .analysis.scopes import star_names


def dotted(expr: cst.BaseExpression) -> Optional[str]:
    """``a.b.c`` for a Name/Attribute chain, else None. (Exact types: libcst's ``Attribute`` and
    ``Name`` have no subclasses, and ``isinstance`` against them goes through ``ABCMeta``; the
    recurrence checks ask this ~50 times per loop.)"""
    if type(expr) is cst.Name:
        return expr.value
    parts: List[str] = []
    while type(expr) is cst.Attribute:
        parts.append(expr.attr.value)
        expr = expr.value
    if type(expr) is not cst.Name:
        return None
    parts.append(expr.value)
    return ".".join(reversed(parts))


def ast_dotted(expr: ast.AST) -> Optional[str]:
    """``a.b.c`` for an ``ast`` Name/Attribute chain, else None."""
    parts: List[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    parts.append(expr.id)
    return ".".join(reversed(parts))


def _ast_targets(target: ast.AST, out: Set[str]) -> None:
    if isinstance(target, ast.Name):
        out.add(target.id)
    elif isinstance(target, (ast.Tuple, ast.List)):
        for el in target.elts:
            _ast_targets(el, out)
    elif isinstance(target, ast.Starred):
        _ast_targets(target.value, out)


#: what :func:`_scan_imports` does with a node of each type (``isinstance`` chains per node were
#: most of the scan): nothing but walk below it, or one of the cases below
_OTHER, _NAME, _IMPORT, _IMPORT_FROM, _DEF, _ARG, _LOOP = range(7)
_SCAN_KINDS: Dict[type, int] = {}


def _scan_kind(t: type) -> int:
    k = (_NAME if issubclass(t, ast.Name) else _IMPORT if issubclass(t, ast.Import) else
         _IMPORT_FROM if issubclass(t, ast.ImportFrom) else
         _DEF if issubclass(t, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else
         _ARG if issubclass(t, ast.arg) else
         _LOOP if issubclass(t, (ast.For, ast.AsyncFor, ast.comprehension)) else _OTHER)
    _SCAN_KINDS[t] = k
    return k


def _scan_imports(tree: ast.AST):
    """What :class:`ImportMap` needs from one subtree: its imports as (depth, BFS order, alias,
    qualified name, in ast.walk's order within the subtree), the names it assigns and the names it uses."""
    imports: List[Tuple[int, int, str, str]] = []
    assigned: Set[str] = set()
    names: Set[str] = set()
    level: List[ast.AST] = [tree]
    depth = 0
    kinds = _SCAN_KINDS
    while level:
        below: List[ast.AST] = []
        for node in level:
            k = kinds.get(type(node))
            if k is None:
                k = _scan_kind(type(node))
            if k == _OTHER:
                push_children(node, below)
                continue
            if k == _NAME:  # its one child, the context, is none of the cases: not walked
                names.add(node.id)  # type: ignore[attr-defined]
                if isinstance(node.ctx, (ast.Store, ast.Del)):  # type: ignore[attr-defined]
                    assigned.add(node.id)  # type: ignore[attr-defined]
                continue
            push_children(node, below)
            if k == _IMPORT:
                for alias in node.names:  # type: ignore[attr-defined]
                    if alias.asname:
                        imports.append((depth, len(imports), alias.asname, alias.name))
                    else:
                        top = alias.name.split(".")[0]
                        imports.append((depth, len(imports), top, top))
            elif k == _IMPORT_FROM:
                assert isinstance(node, ast.ImportFrom)
                if node.level or not node.module:
                    if any(a.name == "*" for a in node.names):
                        imports.append((depth, len(imports), "*", "*"))  # a star import not resolved
                    continue
                for alias in node.names:
                    if alias.name != "*":
                        imports.append((depth, len(imports), alias.asname or alias.name, node.module + "." + alias.name))
                    elif star_names(node.module) is None:
                        imports.append((depth, len(imports), "*", "*"))
                    else:  # "*"-prefixed: bound by a star import (dropped if another is not resolved)
                        for name in sorted(star_names(node.module) or ()):
                            imports.append((depth, len(imports), name, "*" + node.module + "." + name))
            elif k == _DEF:
                assigned.add(node.name)  # type: ignore[attr-defined]
                names.add(node.name)  # type: ignore[attr-defined]
                if not isinstance(node, ast.ClassDef):
                    a = node.args  # type: ignore[attr-defined]
                    for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg):
                        if arg is not None:
                            assigned.add(arg.arg)
                            names.add(arg.arg)
            elif k == _ARG:
                names.add(node.arg)  # type: ignore[attr-defined]
            else:  # _LOOP
                _ast_targets(node.target, assigned)  # type: ignore[attr-defined]
        level = below
        depth += 1
    return imports, frozenset(assigned), frozenset(names)


#: array libraries other than torch, by top-level module (:meth:`ImportMap.other_framework`)
OTHER_FRAMEWORKS = ("jax", "flax", "optax", "warp", "warp_nn", "tensorflow", "keras", "mlx", "paddle", "mindspore",
                    "oneflow", "cupy")


class ImportMap:
    """Local names bound by imports → the qualified names they stand for.

    Built from Python's ``ast`` (a walk of it costs a few ms; a libcst visit of the same file
    costs ten times more), from a libcst Module (via its code) or from source text.
    """

    def __init__(self, module: Union[cst.Module, ast.AST, str]) -> None:
        if isinstance(module, cst.Module):
            module = module.code
        tree = ast.parse(module) if isinstance(module, str) else module
        # one scan per top-level statement (reused across module versions, see statement_memo);
        # the aliases are then applied in ast.walk's order: by depth, then statement, then BFS
        parts = statement_memo.per_statement(tree, "imports", _scan_imports)
        if parts is None:
            parts = [_scan_imports(tree)]
            depth0 = 0
        else:
            depth0 = 1
        found = sorted(
            (depth + depth0, index, seq, alias, full)
            for index, part in enumerate(parts)
            for depth, seq, alias, full in part[0]
        )
        aliases: Dict[str, str] = {}
        for _, _, _, alias, full in found:
            aliases[alias] = full
        assigned: Set[str] = set().union(*(part[1] for part in parts))
        names: Set[str] = set().union(*(part[2] for part in parts))
        # Names a resolved star import binds are trusted only where no other star import could
        # bind them again (an unresolved ``from mylib import *`` may export ``exp`` too).
        unresolved = aliases.pop("*", None) is not None
        for alias, full in list(aliases.items()):
            if full.startswith("*"):
                if unresolved:
                    del aliases[alias]
                else:
                    aliases[alias] = full[1:]
        # A name both imported and assigned (``torch = None``) is ambiguous: drop it (but remember
        # it was imported: ``torch.exp`` is then no method call on a value named torch).
        self.imported = frozenset(aliases)
        self.aliases = {k: v for k, v in aliases.items() if k not in assigned}
        self.names = names | set(aliases)
        self._cursor: Dict[str, int] = {}  # base -> the suffix unique_name tries first

    def other_framework(self) -> Optional[str]:
        """The other array library (jax, NVIDIA Warp, TensorFlow...) the module imports where it
        imports nothing of torch, else None: there ``x.item()`` and ``opt.step()`` are that
        library's, and a torch rewrite would only import torch into the module (skrl's JAX and
        Warp agents)."""
        roots = {full.split(".")[0] for full in self.aliases.values()}
        if "torch" in roots:
            return None
        return next((f for f in OTHER_FRAMEWORKS if f in roots), None)

    def qualify(self, expr: Union[cst.BaseExpression, ast.AST]) -> Optional[str]:
        """The qualified name of a Name/Attribute chain rooted at an imported name, else None."""
        text = dotted(expr) if isinstance(expr, cst.CSTNode) else ast_dotted(expr)
        if text is None:
            return None
        head, _, rest = text.partition(".")
        full = self.aliases.get(head)
        if full is None:
            return None
        return full + ("." + rest if rest else "")

    def local_for(self, qualname: str) -> Optional[str]:
        """A local dotted expression that means ``qualname`` (shortest), if the module has one."""
        best: Optional[str] = None
        for local, full in self.aliases.items():
            if qualname == full or qualname.startswith(full + "."):
                candidate = local + qualname[len(full):]
                if best is None or len(candidate) < len(best):
                    best = candidate
        return best

    def unique_name(self, base: str) -> str:
        """``base``, or ``base_2``... so it cannot clash with any name the module uses.

        The search for a base goes on from where its last one stopped (names are only ever
        added, so every earlier candidate is still taken): asking for ``x`` once per site made
        a file with thousands of sites quadratic (``x_2`` .. ``x_5555`` tried again each time)."""
        n = self._cursor.get(base, 1)
        name = base if n == 1 else f"{base}_{n}"
        while name in self.names:
            n += 1
            name = f"{base}_{n}"
        self._cursor[base] = n
        self.names.add(name)
        return name


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _is_future_import(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and any(
            isinstance(s, cst.ImportFrom)
            and isinstance(s.module, cst.Name)
            and s.module.value == "__future__"
            for s in stmt.body
        )
    )


def add_imports(module: cst.Module, statements: Sequence[str]) -> cst.Module:
    """Insert import lines after the docstring and ``__future__`` imports, each at most once."""
    existing = {
        module.code_for_node(s).strip()
        for s in module.body
        if isinstance(s, cst.SimpleStatementLine) and any(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body)
    }
    new = [cst.parse_statement(text + "\n") for text in dict.fromkeys(statements) if text not in existing]
    if not new:
        return module
    body = list(module.body)
    index = 0
    while index < len(body) and (
        (index == 0 and _is_docstring(body[index])) or _is_future_import(body[index])
    ):
        index += 1
    body[index:index] = new
    return module.with_changes(body=body)


def import_for(qualname: str, alias: str) -> str:
    """``from a.b import c as alias`` for ``a.b.c``."""
    mod, _, name = qualname.rpartition(".")
    return f"from {mod} import {name} as {alias}" if alias != name else f"from {mod} import {name}"


def runtime_import(imports: ImportMap, qualname: str, preferred: str) -> Tuple[str, Optional[str]]:
    """A local alias for a runtime helper and the import line that binds it (None if already bound)."""
    for local, full in imports.aliases.items():
        if full == qualname:
            return local, None
    alias = imports.unique_name(preferred)
    return alias, import_for(qualname, alias)


def expr(text: str) -> cst.BaseExpression:
    return cst.parse_expression(text)
