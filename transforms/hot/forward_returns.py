"""A scale unpacked from a forward of this file: ``mean, std = self.actor(s)``, then
``Normal(mean, std)`` (for :mod:`.distributions`).

Actor networks in RL code usually return the mean and the standard deviation together, the
second made positive inside ``forward`` (``std = log_std.exp()``; ``return mean, std``), and the
caller builds the distribution from the pair. The scale is then as positive as what ``forward``
returns at that position: provable where every ``return`` of every body the call may run (as
:class:`.callees.Files` resolves it: a class of this file, through its attribute bindings) is a
tuple of the unpacked length whose entry there is a positive constant, ``exp(...)``,
``softplus(...)`` (positive ``beta``/``threshold``), such a value plus a positive constant, or a
local bound once to one of these and never changed in place. A ``torch.nn`` module's own forward,
a generator, a starred unpacking or return, or a forward hook registered anywhere in the file
(it may replace the output) leaves the scale unproven.
"""
from __future__ import annotations

import ast
from typing import List, Optional, Tuple

from ..analysis.astwalk import own_nodes
from .callees import Files
from .softmax_probs import changed

#: a forward hook may replace what forward returned
_HOOKS = ("register_forward_hook", "register_module_forward_hook")


def unpacked_from_call(scope: ast.AST, name: str) -> Optional[Tuple[ast.Call, int, int]]:
    """``(call, index, length)`` where ``name`` is bound in ``scope`` (its own statements) by the
    one assignment ``a, name = call(...)`` (plain names, no star); None otherwise."""
    found = None
    for node in own_nodes(scope):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if not isinstance(target, (ast.Tuple, ast.List)):
                continue
            names = [e.id if isinstance(e, ast.Name) else None for e in target.elts]
            if name not in names:
                continue
            if found is not None or not isinstance(node.value, ast.Call) or None in names or names.count(name) > 1:
                return None
            found = (node.value, names.index(name), len(names))
    return found


def positive_return(files: Files, code: str, call: ast.Call, index: int, length: int,
                    cls: Optional[str], scope: ast.AST) -> Optional[str]:
    """How entry ``index`` of what ``call`` returns is positive (a short text), or None."""
    if any(hook in code for hook in _HOOKS) or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    bodies = files.resolve(call.func, cls, scope)
    if not bodies:
        return None
    hows: List[str] = []
    for fn, _owner in bodies:
        if fn is None:  # a torch.nn module's own forward returns one tensor
            return None
        how = _returns_positive(files, fn, index, length)
        if how is None:
            return None
        hows.append(how)
    return hows[0] if len(set(hows)) == 1 else "positive in each forward it may run"


def _returns_positive(files: Files, fn: ast.FunctionDef, index: int, length: int) -> Optional[str]:
    nodes = list(own_nodes(fn))
    if any(isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await)) for n in nodes):
        return None
    returns = [n for n in nodes if isinstance(n, ast.Return)]
    if not returns:
        return None
    how = None
    for ret in returns:
        value = ret.value
        if not isinstance(value, ast.Tuple) or len(value.elts) != length \
                or any(isinstance(e, ast.Starred) for e in value.elts):
            return None
        how = _positive(files, fn, value.elts[index], 0)
        if how is None:
            return None
    return f"{how} in `{fn.name}` (line {fn.lineno})"


def _positive_literal(expr: ast.expr) -> bool:
    value = expr.value if isinstance(expr, ast.Constant) else None
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _positive(files: Files, fn: ast.FunctionDef, expr: ast.expr, depth: int) -> Optional[str]:
    """``expr`` (in ``fn``) as :meth:`.distributions._Rewriter.positive` reads a scale, on ``ast``."""
    if _positive_literal(expr):
        return "a positive constant"
    imports = files.imports
    if isinstance(expr, ast.Call) and not any(isinstance(a, ast.Starred) for a in expr.args) \
            and all(k.arg is not None for k in expr.keywords):
        func = expr.func
        if isinstance(func, ast.Attribute) and func.attr == "exp" and not expr.args and not expr.keywords \
                and imports.qualify(func) is None:
            return "exp(...)"
        name = imports.qualify(func)
        if name == "torch.exp" and len(expr.args) == 1 and not expr.keywords:
            return "exp(...)"
        if name == "torch.nn.functional.softplus" and len(expr.args) == 1 and all(
                k.arg in ("beta", "threshold") and _positive_literal(k.value) for k in expr.keywords):
            return "softplus(...)"  # a negative beta or threshold can give negative values
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        for a, b in ((expr.left, expr.right), (expr.right, expr.left)):
            how = _positive(files, fn, a, depth)
            if how is not None and _positive_literal(b):
                return how + " + a positive constant"
    if isinstance(expr, ast.Name) and depth == 0:
        values = files.local_values(expr.id, fn)
        if values is None or len(values) != 1 or changed(fn, expr.id, imports):
            return None
        how = _positive(files, fn, values[0], depth + 1)
        return f"`{expr.id}` = {how}" if how is not None else None
    return None
