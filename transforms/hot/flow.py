"""Where a forward pass's outputs go, for :mod:`.no_grad`: proof that none reaches a gradient.

Starting from a forward call inside a statement, each use of the value is followed up the
expression tree and through the names it is bound to (in the statement's scope, every binding
of those names, flow-insensitively: a name reused for a graph-carrying value elsewhere is
refused rather than told apart). A use ends safely where the value stops carrying autograd
state: ``.item()``/``.tolist()``/``.detach()``/``.numpy()``, ``int()``/``float()``/``bool()``,
numpy and math functions, integer results (``argmax``, comparisons, ``Distribution.sample()``),
``env.step(...)`` and friends, printing and logging, a shape or dtype read. Anything that could
keep the value where a later loss reads it is refused: appended or put into a container, stored
into an attribute or a subscript, returned or yielded, read by another function or a closure,
passed to an unknown call; so is anything that reads autograd state (``.requires_grad``,
``.grad_fn``, ``.backward()``) or changes the value in place.
"""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple

from .callees import ENGINE_EFFECTS, ENGINE_PURE, GRAD_ATTRS

#: methods whose result never carries a gradient
ENDS = frozenset({"item", "tolist", "detach", "numpy", "argmax", "argmin", "argsort", "multinomial",
                  "size", "dim", "numel", "eq", "ne", "gt", "lt", "ge", "le", "bool", "long", "int"})
#: attribute reads that carry no gradient
META = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "layout"})
#: builtins whose result is a plain Python value
PLAIN_RESULT = frozenset({"int", "float", "bool", "str", "repr", "print", "len", "round", "format", "isinstance", "type", "hash"})
#: builtins whose result may still hold the value
PASS_THROUGH = frozenset({"list", "tuple", "max", "min", "sum", "abs", "zip", "enumerate", "sorted", "reversed"})
TORCH_ENDS = frozenset({"torch.argmax", "torch.argmin", "torch.argsort", "torch.multinomial", "torch.eq", "torch.isfinite", "torch.isnan"})
LOG_METHODS = frozenset({"add_scalar", "add_scalars", "add_histogram", "log", "info", "debug", "warning", "write"})
LOG_RECEIVERS = ("writer", "logger", "wandb", "logging", "tb", "summary", "log")


class Flow:
    """Follows values of one scope. ``scope`` is a FunctionDef or the Module."""

    def __init__(self, scope: ast.AST, tree: ast.Module, imports, user_samples: bool, is_forward=None,
                 allow: frozenset = frozenset()) -> None:
        self.scope = scope
        #: autograd attributes a value may reach (hot.target_graph_cut: ``backward``, since its
        #: rewrite keeps ``requires_grad``; hot.no_grad: none)
        self.allow = allow
        self.is_forward = is_forward or (lambda call: False)  # a module call: its result holds the value
        self.imports = imports
        self.user_samples = user_samples  # a class of this file defines sample(): not grad-free
        self.parents: Dict[ast.AST, ast.AST] = {}
        self.loads: Dict[str, List[ast.Name]] = {}
        self.nested: List[ast.AST] = []
        #: where followed values ended (for the site's reason)
        self.ends: Set[str] = set()
        body = scope.body
        for st in body:
            self._index(st, scope)
        # module scope: functions of the file read globals; function scope: closures
        self.outside: List[ast.AST] = self.nested if scope is not tree else [
            n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        ] + self.nested

    def _index(self, node: ast.AST, up: ast.AST) -> None:
        self.parents[node] = up
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            self.nested.append(node)
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            self.loads.setdefault(node.id, []).append(node)
        for child in ast.iter_child_nodes(node):
            self._index(child, node)

    def problem(self, start: ast.expr) -> Optional[str]:
        """Why ``start``'s value (or what is bound from it) might reach a gradient, or None."""
        names: List[Tuple[str, Optional[ast.stmt]]] = []
        reason = self._follow(start, names)
        if reason:
            return reason
        seen: Set[Tuple[str, int]] = set()
        while names:
            name, binding = names.pop()
            if (name, id(binding)) in seen:
                continue
            seen.add((name, id(binding)))
            for other in self.outside:
                if _reads_free(other, name):
                    what = getattr(other, "name", "a lambda")
                    return f"`{name}` is read in {what} (line {other.lineno}), where its use is not followed"
            for load in self._live(name, binding):
                reason = self._follow(load, names)
                if reason:
                    return f"`{name}` (line {load.lineno}) {reason}"
        return None

    def _live(self, name: str, binding: Optional[ast.stmt]) -> List[ast.Name]:
        """The loads of ``name`` that may see the value ``binding`` gives it: all of them, unless a
        later statement of the same block rebinds the name unconditionally with nothing between
        that could jump past it (``continue``/``break``, an enclosing ``try``): then only the loads
        between the two (``a = actor(o); a = a.detach().numpy()`` kills the tensor binding)."""
        loads = self.loads.get(name, [])
        if not isinstance(binding, ast.Assign):
            return loads
        up = self.parents.get(binding)
        block = next((getattr(up, f) for f in ("body", "orelse", "finalbody")
                      if any(x is binding for x in getattr(up, f, None) or ())), None)
        if block is None or self._in_try(binding):
            return loads
        i = next(k for k, x in enumerate(block) if x is binding)
        for k in range(i + 1, len(block)):
            r = block[k]
            if isinstance(r, ast.Assign) and all(isinstance(t, ast.Name) for t in r.targets) \
                    and any(t.id == name for t in r.targets):
                live = {id(n) for st in block[i + 1:k] for n in ast.walk(st)} | {id(n) for n in ast.walk(r.value)}
                return [load for load in loads if id(load) in live]
            if _jumps(r):
                return loads
        return loads

    def _in_try(self, node: ast.AST) -> bool:
        up = self.parents.get(node)
        while up is not None and up is not self.scope:
            if isinstance(up, ast.Try) or type(up).__name__ == "TryStar":
                return True
            up = self.parents.get(up)
        return False

    def _follow(self, node: ast.expr, names: List[Tuple[str, Optional[ast.stmt]]]) -> Optional[str]:
        while True:
            p = self.parents.get(node)
            if isinstance(p, ast.Attribute):
                attr = p.attr
                if attr in GRAD_ATTRS and attr not in self.allow:
                    return f"reads .{attr}"
                call = self.parents.get(p)
                if isinstance(call, ast.Call) and call.func is p:
                    if attr in ENDS or (attr == "sample" and not self.user_samples):
                        self.ends.add(f".{attr}()")
                        return None
                    if attr.endswith("_") and not attr.endswith("__"):
                        return f"is changed in place (.{attr})"
                    node = call
                    continue
                if attr in META:
                    return None
                if isinstance(p.ctx, ast.Load):
                    node = p
                    continue
                return f"has its attribute {attr} set"
            if isinstance(p, ast.Subscript):
                if p.value is not node:
                    return None  # used as an index: the result holds none of its graph
                if not isinstance(p.ctx, ast.Load):
                    return "is written into by a subscript store"
                node = p
                continue
            if isinstance(p, (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Starred, ast.Tuple, ast.List, ast.Set, ast.Dict)):
                if isinstance(getattr(p, "ctx", None), ast.Store):
                    return "is unpacked into a target"
                node = p
                continue
            if isinstance(p, ast.IfExp):
                if p.test is node:
                    return None
                node = p
                continue
            if isinstance(p, (ast.Compare, ast.FormattedValue, ast.JoinedStr, ast.If, ast.While, ast.Assert, ast.Expr)):
                self.ends.add({"Compare": "a comparison", "FormattedValue": "a string", "JoinedStr": "a string",
                               "Expr": "discarded"}.get(type(p).__name__, "a test"))
                return None
            if isinstance(p, ast.keyword):
                node = p  # the call is its parent
                p = self.parents.get(p)
                if not isinstance(p, ast.Call):
                    return "is passed as a keyword argument"
            if isinstance(p, ast.Call):
                if p.func is node:
                    return "is called"
                verdict = self._argument(p)
                if verdict is None:
                    self.ends.add(f"{ast.unparse(p.func)}(...)")
                if verdict == "through":
                    node = p
                    continue
                return verdict
            if isinstance(p, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
                targets = p.targets if isinstance(p, ast.Assign) else [p.target]
                if isinstance(p, ast.AugAssign) and p.target is node:
                    return "is updated in place (augmented assignment)"
                bound = []
                for t in targets:
                    found = _names(t)
                    if found is None:
                        return f"is stored into `{ast.unparse(t)}` (a later loss could read it with its graph)"
                    bound.extend(found)
                names.extend((n, p) for n in bound)
                if isinstance(p, ast.NamedExpr):
                    node = p
                    continue
                return None
            if isinstance(p, (ast.For, ast.comprehension)):
                if p.iter is not node:
                    return None
                found = _names(p.target)
                if found is None:
                    return f"is iterated into `{ast.unparse(p.target)}`"
                names.extend((n, None) for n in found)
                if isinstance(p, ast.comprehension):
                    return "is iterated in a comprehension (its result is not followed)"
                return None
            if isinstance(p, (ast.Return, ast.Yield, ast.YieldFrom)):
                return "is returned to a caller this file does not show"
            return f"is used in a {type(p).__name__} (not followed)"

    def _argument(self, call: ast.Call) -> Optional[str]:
        """What passing the value to ``call`` does: None (safe), "through" (the result holds it)
        or why it is refused."""
        func = call.func
        if self.is_forward(call):
            return "through"
        if isinstance(func, ast.Name) and func.id not in self.imports.names:
            if func.id in PLAIN_RESULT:
                return None
            if func.id in PASS_THROUGH:
                return "through"
        qual = self.imports.qualify(func)
        if qual is not None:
            top = qual.split(".")[0]
            if top in ("numpy", "math", "logging", "wandb") or qual in TORCH_ENDS:
                return None
            if top == "torch" or qual in ENGINE_PURE:
                return "through"
            if qual in ENGINE_EFFECTS:
                return f"is passed to code that {ENGINE_EFFECTS[qual]}"
            return f"is passed to {qual}(...), whose effects are unknown"
        if isinstance(func, ast.Attribute):
            receiver = (ast.unparse(func.value) or "").lower()
            if "env" in receiver:
                return None  # the environment: converted to numpy on its side
            if func.attr in LOG_METHODS and any(r in receiver for r in LOG_RECEIVERS):
                return None
            return (f"is passed to `{ast.unparse(func)}(...)` without .detach()/.item(): it may keep the "
                    "value where a later loss reads it")
        return f"is passed to `{ast.unparse(func)}(...)`, whose effects are unknown"


def _names(target: ast.expr) -> Optional[List[str]]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        out: List[str] = []
        for elt in target.elts:
            sub = _names(elt.value if isinstance(elt, ast.Starred) else elt)
            if sub is None:
                return None
            out.extend(sub)
        return out
    return None


def _jumps(st: ast.stmt) -> bool:
    """Whether ``st`` holds a ``continue``/``break`` of an enclosing loop (not of a loop inside it)."""
    todo = [st]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Continue, ast.Break)):
            return True
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                todo.append(child)
            elif isinstance(child, (ast.For, ast.AsyncFor, ast.While)):
                todo.extend(child.orelse)  # a loop's else runs in the enclosing loop
    return False


def _reads_free(node: ast.AST, name: str) -> bool:
    """Whether a function, lambda or class reads ``name`` from outside (a global or a closure
    variable): read somewhere in it without being a parameter or assigned in that function."""
    if isinstance(node, ast.ClassDef):
        return any(_reads_free(st, name) for st in node.body) or any(
            isinstance(n, ast.Name) and n.id == name for d in node.decorator_list + node.bases for n in ast.walk(d))
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))
    args = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
    body = node.body if isinstance(node.body, list) else [node.body]
    declared = any(isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names for st in body for n in ast.walk(st))
    local = name in args or (not declared and any(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, (ast.Store, ast.Del))
        for st in body for n in ast.walk(st)))
    if local:
        return False  # nested functions of it reading `name` read its own local
    return any(isinstance(n, ast.Name) and n.id == name for st in body for n in ast.walk(st)) or any(
        isinstance(n, ast.Name) and n.id == name for d in getattr(node, "decorator_list", []) for n in ast.walk(d))
