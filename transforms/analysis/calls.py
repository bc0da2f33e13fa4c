"""A call's arguments and a definition's parameters, read the way Python binds them."""
from __future__ import annotations

import ast
from typing import List, Optional, Tuple


def positional_args(call: ast.Call) -> List[ast.expr]:
    return [a for a in call.args if not isinstance(a, ast.Starred)]


def keyword_arg(call: ast.Call, name: str) -> Optional[ast.keyword]:
    for k in call.keywords:
        if k.arg == name:
            return k
    return None


def call_argument(call: ast.Call, index: Optional[int], keyword: Optional[str]) -> Optional[ast.expr]:
    if keyword:
        kw = keyword_arg(call, keyword)
        if kw is not None:
            return kw.value
    if index is not None:
        pos = positional_args(call)
        if index < len(pos):
            for a in call.args:
                if a is pos[index]:
                    return a
                if isinstance(a, ast.Starred):
                    return None
    return None


def has_star_args(call: ast.Call) -> bool:
    return any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)


def call_args(call: ast.Call) -> List[ast.expr]:
    """The argument values in source order (a keyword may precede a ``*args``)."""
    if not call.keywords:
        return list(call.args)
    values = list(call.args) + [k.value for k in call.keywords]
    if call.args and any(isinstance(a, ast.Starred) for a in call.args):
        values.sort(key=lambda v: (v.lineno, v.col_offset))
    return values


def parameters(a: ast.arguments) -> List[Tuple[ast.arg, Optional[ast.expr]]]:
    """Parameters with their defaults, in libcst's order (positional, *args, keyword-only, **kw)."""
    positional = [*a.posonlyargs, *a.args]
    first = len(positional) - len(a.defaults)
    out = [(p, a.defaults[i - first] if i >= first else None) for i, p in enumerate(positional)]
    if a.vararg is not None:
        out.append((a.vararg, None))
    out.extend(zip(a.kwonlyargs, a.kw_defaults))
    if a.kwarg is not None:
        out.append((a.kwarg, None))
    return out


def class_args(node: ast.ClassDef) -> List[ast.expr]:
    values = list(node.bases) + [k.value for k in node.keywords]
    if node.bases and node.keywords and any(isinstance(b, ast.Starred) for b in node.bases):
        values.sort(key=lambda v: (v.lineno, v.col_offset))
    return values
