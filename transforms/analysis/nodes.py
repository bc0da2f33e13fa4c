"""Child nodes in source order (libcst's visiting order) and the names a statement binds."""
from __future__ import annotations

import ast
from typing import Dict, List, Set, Tuple

from .calls import call_args


def children(node: ast.AST) -> List[ast.AST]:
    """Child nodes in source order (libcst's visiting order)."""
    t = type(node)
    if t is ast.Call:
        return [node.func, *call_args(node)]
    if t is ast.IfExp:
        return [node.body, node.test, node.orelse]
    if t is ast.Dict:
        out: List[ast.AST] = []
        for k, v in zip(node.keys, node.values):
            if k is not None:
                out.append(k)
            out.append(v)
        return out
    out = []
    for name in node_fields(t):
        value = getattr(node, name, None)
        if isinstance(value, list):
            out.extend(v for v in value if isinstance(v, ast.AST))
        elif isinstance(value, ast.AST):
            out.append(value)
    return out


NODE_FIELDS: Dict[type, Tuple[str, ...]] = {}


def node_fields(t: type) -> Tuple[str, ...]:
    found = NODE_FIELDS.get(t)
    if found is None:
        found = NODE_FIELDS[t] = tuple(f for f in t._fields if f not in ("ctx", "op", "type_comment", "kind"))
    return found


def bound_names(stmt: ast.AST) -> Set[str]:
    """Names a statement binds anywhere inside it (assignment, loop, with, import, def...)."""
    names: Set[str] = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name):
            if not isinstance(node.ctx, ast.Load):
                names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names
