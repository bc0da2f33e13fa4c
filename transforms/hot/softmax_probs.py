"""Whether a ``Categorical(probs)`` argument is, provably, the unmodified output of a softmax (for
:mod:`.distributions`), and over which dim.

Accepted: ``torch.softmax`` / ``F.softmax`` / ``torch.special.softmax`` calls, ``x.softmax(dim)``
(a method of that name on a value that is no class of this file: taken to be the tensor's), a call
of an ``nn.Softmax`` module (every assignment of that name or ``self.`` attribute an
``nn.Softmax(...)``), a name bound once in its scope to one of these and changed nowhere in
place there (no item/attribute store, no ``x.op_(...)``, no ``out=``, not passed to code of this
file or unknown code), and a call of a function/method of this file (:class:`.callees.Files`
resolves it; undecorated, no ``yield``) all of whose ``return`` values are such softmaxes.
Anything else -- a tensor normalised by hand, a list, a softmax then edited, a function that
sometimes returns something else, a module whose output forward hooks could change -- is not.

The answer carries the softmax's ``dim`` where it is an integer literal (None otherwise): the
run-time helper needs the softmax to be over the last dim (see runtime/hot_distributions.py).
"""
from __future__ import annotations

import ast
from typing import List, Optional, Tuple, Union

from ..names import ImportMap, ast_dotted
from .callees import Files

_FUNCS = ("torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax")
_MODULES = ("torch.nn.Softmax", "torch.nn.modules.activation.Softmax")
_SEQUENTIAL = ("torch.nn.Sequential", "torch.nn.modules.container.Sequential")
#: what changes a Sequential's layers in place (``seq[-1] = ...`` and ``del seq[i]`` aside)
_RESEQUENCING = frozenset({"append", "extend", "insert", "pop", "add_module", "register_module",
                           "__setitem__", "__delitem__", "__iadd__"})
_KEYWORDS = frozenset({"dim", "dtype", "_stacklevel"})
#: dim unknown (a parameter, a name) -- distinct from a literal
UNKNOWN = None
Found = Optional[Tuple[str, Optional[int]]]  # (how, dim literal or None); None: not a softmax


def _int(expr: Optional[ast.expr]) -> Optional[int]:
    if isinstance(expr, ast.Constant) and type(expr.value) is int:
        return expr.value
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub) and isinstance(expr.operand, ast.Constant) \
            and type(expr.operand.value) is int:
        return -expr.operand.value
    return None


def _dim_of(call: ast.Call, first: int) -> Union[bool, Optional[int]]:
    """The literal ``dim`` of a softmax call (positional ``args[first]`` or keyword), None where
    not a literal; False where the call has other arguments than a softmax takes."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None or k.arg not in _KEYWORDS
                                                                  for k in call.keywords):
        return False
    if len(call.args) > first + 2:
        return False
    dims = [k.value for k in call.keywords if k.arg == "dim"]
    if len(call.args) > first:
        dims.append(call.args[first])
    return _int(dims[0]) if len(dims) == 1 else UNKNOWN


class SoftmaxProbs:
    def __init__(self, files: Files) -> None:
        self.files = files
        self.imports = files.imports
        self.hooks = any(isinstance(n, ast.Attribute) and n.attr.startswith("register_forward")
                         for n in ast.walk(files.tree))
        #: ``m.dim = ...`` somewhere: an nn.Softmax's dim may not be the one it was built with
        self.dim_set = any(isinstance(n, ast.Attribute) and n.attr == "dim" and isinstance(n.ctx, ast.Store)
                           for n in ast.walk(files.tree))

    def of(self, expr: ast.expr, cls: Optional[str], scope: ast.AST, depth: int = 0,
           index: Optional[int] = None) -> Found:
        """(how ``expr`` is a softmax, its literal dim or None), or None where not provable;
        ``index``: element ``index`` of the tuple ``expr`` is (``probs, v = model(s)``)."""
        if depth > 4:
            return None
        if isinstance(expr, ast.Tuple) and index is not None:
            if any(isinstance(e, ast.Starred) for e in expr.elts) or index >= len(expr.elts):
                return None
            return self.of(expr.elts[index], cls, scope, depth + 1)
        if isinstance(expr, ast.Name) and index is None:
            return self._name(expr.id, cls, scope, depth)
        if not isinstance(expr, ast.Call):
            return None
        if index is not None:
            return self._called(expr, cls, scope, depth, index)
        func = expr.func
        qual = self.imports.qualify(func)
        if qual in _FUNCS:
            if len(expr.args) < 1:
                return None
            dim = _dim_of(expr, 1)
            return None if dim is False else ("a softmax", dim)
        if qual is None and isinstance(func, ast.Attribute) and func.attr == "softmax":
            if self.files.resolve(func, cls, scope) is not None:
                return None  # a method of a class of this file, not the tensor's
            if (ast_dotted(func.value) or "").partition(".")[0] in self.imports.imported:
                return None  # a module's function (a rebound ``import torch as t``): not a tensor's method
            dim = _dim_of(expr, 0)
            return None if dim is False else ("a softmax", dim)
        if qual is not None or any(isinstance(a, ast.Starred) for a in expr.args) \
                or any(k.arg is None for k in expr.keywords):
            return None
        module = self._softmax_module(func, cls, scope)
        if module is not None:
            return module
        return self._called(expr, cls, scope, depth, None)

    def _called(self, expr: ast.Call, cls: Optional[str], scope: ast.AST, depth: int, index: Optional[int]) -> Found:
        func = expr.func
        if self.imports.qualify(func) is not None or any(isinstance(a, ast.Starred) for a in expr.args) \
                or any(k.arg is None for k in expr.keywords):
            return None
        bodies = self.files.resolve(func, cls, scope)
        if not bodies:
            return None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" \
                and cls is not None and self._overridden(cls, func.attr):
            return None  # `self.pi(x)` may run a subclass's pi
        found: Found = None
        for body, owner in bodies:
            if body is None or body.decorator_list:
                return None
            if owner is not None and body.name in ("forward", "__call__") and self.hooks:
                return None  # a forward hook may replace the module's output
            got = self._returns(body, owner, depth, index)
            if got is None:
                return None
            found = got if found is None else (got[0], got[1] if got[1] == found[1] else UNKNOWN)
        what = "a softmax" if index is None else f"a softmax at [{index}]"
        return (f"{ast.unparse(func)}(...) returns {what}", found[1]) if found else None

    def _overridden(self, cls: str, method: str) -> bool:
        return any(name != cls and cls in self.files.lineage(name)
                   and any(isinstance(st, ast.FunctionDef) and st.name == method for st in klass.body)
                   for name, klass in self.files.classes.items())

    def _returns(self, fn: ast.FunctionDef, owner: Optional[str], depth: int, index: Optional[int]) -> Found:
        rets: List[ast.expr] = []
        found: Found = None
        todo: List[ast.AST] = list(fn.body)
        while todo:
            node = todo.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(node, (ast.Yield, ast.YieldFrom, ast.Await)):
                return None
            if isinstance(node, ast.Return):
                if node.value is None:
                    return None  # a bare return: None
                rets.append(node.value)
            todo.extend(ast.iter_child_nodes(node))
        if not rets or _falls_through(fn.body):
            return None
        for r in rets:
            last = _last_binding(fn, r) if isinstance(fn.body[-1], ast.Return) and r is fn.body[-1].value else None
            got = self.of(last if last is not None else r, owner, fn, depth + 1, index)
            if got is None:
                return None
            found = got if found is None else (got[0], got[1] if got[1] == found[1] else UNKNOWN)
        return found

    def _softmax_module(self, func: ast.expr, cls: Optional[str], scope: ast.AST) -> Found:
        """A call of a name or ``self.`` attribute every assignment of which is ``nn.Softmax(...)``."""
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" \
                and cls is not None:
            values = None
            for klass in self.files.lineage(cls):
                values = self.files.values.get(f"{klass}.self.{func.attr}")
                if values:
                    break
        elif isinstance(func, ast.Name):
            values = self.files.name_values(func.id, scope)
        else:
            return None
        if not values or self.dim_set:
            return None
        calls, sequential = [], False
        for v in values:
            if isinstance(v, ast.Call) and self.imports.qualify(v.func) in _SEQUENTIAL and v.args and not v.keywords \
                    and not any(isinstance(a, ast.Starred) for a in v.args):
                v, sequential = v.args[-1], True  # philtabor's nn.Sequential(..., nn.Softmax(dim=-1))
            if not (isinstance(v, ast.Call) and self.imports.qualify(v.func) in _MODULES):
                return None
            calls.append(v)
        if sequential and (self.hooks or self._resequenced(func.attr if isinstance(func, ast.Attribute) else func.id)):
            return None
        dims = set()
        for v in calls:
            dim = _dim_of(v, 0)
            if dim is False:
                return None
            dims.add(dim)
        return ("an nn.Sequential ending in nn.Softmax" if sequential else "an nn.Softmax",
                dims.pop() if len(dims) == 1 else UNKNOWN)

    def _resequenced(self, name: str) -> bool:
        """Whether the file may change the layers of a Sequential called ``name`` (any object's
        attribute or a name of that spelling): an item stored or deleted, a layer appended,
        inserted, popped or added, ``+=``, or ``setattr`` on it."""
        def named(node: ast.expr) -> bool:
            return (isinstance(node, ast.Attribute) and node.attr == name) or (isinstance(node, ast.Name) and node.id == name)

        for n in ast.walk(self.files.tree):
            if isinstance(n, ast.Subscript) and isinstance(n.ctx, (ast.Store, ast.Del)) and named(n.value):
                return True
            if isinstance(n, ast.AugAssign) and named(n.target):
                return True
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _RESEQUENCING \
                    and named(n.func.value):
                return True
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("setattr", "delattr") \
                    and n.args and named(n.args[0]):
                return True
        return False

    def at_site(self, name: str, block: list, st: ast.stmt, cls: Optional[str], scope: ast.AST) -> Found:
        """``Categorical(name)`` in statement ``st`` of ``block``: the nearest statement before it in
        the block that mentions ``name`` binds it (``name = f(...)`` / ``a, name = f(...)``) and
        ``st`` reads it once (and binds it only as its target: ``dist = Categorical(dist)``, bound after
        the call ran). Every path from that binding to the call then runs only statements that never
        mention ``name``, so nothing can change the fresh softmax in between."""
        mentions = [n for n in ast.walk(st) if isinstance(n, ast.Name) and n.id == name]
        targets = st.targets if isinstance(st, ast.Assign) else ()
        if sum(isinstance(n.ctx, ast.Load) for n in mentions) != 1 \
                or any(not isinstance(n.ctx, ast.Load) and not any(n is t for t in targets) for n in mentions) \
                or _closed_over(scope, name) \
                or any(isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names for n in ast.walk(scope)):
            return None
        for prev in reversed(block[:block.index(st)]):
            if not any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(prev)):
                continue
            if not (isinstance(prev, ast.Assign) and len(prev.targets) == 1
                    and sum(isinstance(n, ast.Name) and n.id == name for n in ast.walk(prev)) == 1):
                return None
            target, index = prev.targets[0], None
            if isinstance(target, ast.Tuple):
                names = [e.id for e in target.elts if isinstance(e, ast.Name)]
                if len(names) != len(target.elts):
                    return None
                index = names.index(name)
            elif not isinstance(target, ast.Name):
                return None
            got = self.of(prev.value, cls, scope, 1, index)
            return (f"`{name}` = {got[0]}", got[1]) if got else None
        return None

    def _name(self, name: str, cls: Optional[str], scope: ast.AST, depth: int) -> Found:
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(a.arg == name for a in ast.walk(scope.args) if isinstance(a, ast.arg)):
                return None
        elif any(isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names for n in ast.walk(scope)):
            return None
        if changed(scope, name, self.files.imports):
            return None
        values = self.files._assigned(scope, name)
        index = None
        if values is None:  # bound otherwise: once, unpacked from a call (``probs, value = model(s)``)?
            values, index = _unpacked(scope, name)
        if not values or len(values) != 1:
            return None
        got = self.of(values[0], cls, scope, depth + 1, index)
        return (f"`{name}` = {got[0]}", got[1]) if got else None


def _stores(node: ast.AST, name: str) -> int:
    """How many times ``name`` is bound in ``node`` (nested functions and classes not entered)."""
    count, todo = 0, [node]
    while todo:
        n = todo.pop()
        if n is not node and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            count += getattr(n, "name", None) == name
            continue
        if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, (ast.Store, ast.Del)):
            count += 1
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            count += any((a.asname or a.name).split(".")[0] == name for a in n.names)
        elif isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names:
            count += 2
        todo.extend(ast.iter_child_nodes(n))
    return count


def _unpacked(scope: ast.AST, name: str):
    """([call], i) where ``name``'s one binding in ``scope`` is ``a, name, ... = call(...)``."""
    if _stores(scope, name) != 1:
        return None, None
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple) \
                and isinstance(node.value, ast.Call):
            elts = node.targets[0].elts
            for i, e in enumerate(elts):
                if isinstance(e, ast.Name) and e.id == name and all(isinstance(x, ast.Name) for x in elts):
                    return [node.value], i
        todo.extend(ast.iter_child_nodes(node))
    return None, None


def _closed_over(scope: ast.AST, name: str) -> bool:
    """Whether a function or class nested in ``scope`` mentions ``name`` (a call of it, which
    need not mention the name, could change the value)."""
    for node in ast.walk(scope):
        if node is not scope and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node)):
                return True
    return False


def _last_binding(fn: ast.FunctionDef, value: Optional[ast.expr]) -> Optional[ast.expr]:
    """For ``return x`` as the last statement of ``fn``: the value of the last top-level ``x = ...``
    before it, where nothing after that assignment mentions ``x`` (``x = F.relu(..); x =
    F.softmax(..); return x``); None otherwise."""
    if not isinstance(value, ast.Name) or _closed_over(fn, value.id):
        return None
    name = value.id
    for st in reversed(fn.body[:-1]):
        mentions = any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(st))
        if not mentions:
            continue
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) \
                and st.targets[0].id == name:
            return st.value
        return None
    return None


def _falls_through(body) -> bool:
    """Whether the end of ``body`` can be reached (then the function returns None there)."""
    last = body[-1] if body else None
    if isinstance(last, (ast.Return, ast.Raise)):
        return False
    if isinstance(last, ast.If):
        return _falls_through(last.body) or _falls_through(last.orelse)
    return True


#: operators whose result is a new value, never an operand itself (``a or b`` is one of them: not here)
_ARITHMETIC = (ast.BinOp, ast.UnaryOp, ast.Compare)
_DISPLAYS = (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.Starred)


def _held_mentions(held: ast.AST):
    """The nodes of ``held`` a binding may keep a reference to: all but those reached only as an
    operand of arithmetic (``mean + std * z``: a new tensor, no alias of ``std``; SAC actors'
    ``torch.tanh(mean + std * z)`` kept their ``Normal(mean, std)`` validated). An operand inside
    a display under the arithmetic (``[std] + rest``, a list holding it) is still a mention."""
    todo = [(held, False)]
    while todo:
        node, computed = todo.pop()
        if not computed:
            yield node
        if isinstance(node, _DISPLAYS):
            computed = False
        elif isinstance(node, _ARITHMETIC):
            computed = True
        todo.extend((child, computed) for child in ast.iter_child_nodes(node))


def changed(scope: ast.AST, name: str, imports: ImportMap) -> bool:
    """Whether ``name`` may be changed in place in ``scope``: an item or attribute store through
    it, an in-place method, an ``out=`` argument, or passing it to code that is not torch's."""
    args = {id(a) for n in ast.walk(scope) if isinstance(n, ast.Call)
            for a in (*n.args, *(k.value for k in n.keywords))}  # checked by the call rule below
    args |= {id(n.value) for n in ast.walk(scope) if isinstance(n, ast.Return) and n.value is not None}
    args |= {id(e) for n in ast.walk(scope) if isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple)
             for e in n.value.elts}  # what is returned is the caller's to check
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            if name in {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}:
                return True  # read by a nested function: it may change it, whenever it runs
            continue  # (a class body runs where it stands: walked as the scope's own statements)
        todo.extend(ast.iter_child_nodes(node))
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr, ast.Tuple, ast.List, ast.Set, ast.Dict)) \
                and id(node) not in args:
            # a binding's value, a display itself (``x: T`` with no value binds nothing)
            held = node.value if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) else node
            if held is not None and any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                                        and id(n) not in args for n in _held_mentions(held)):
                return True  # an alias or a container holding it (or a view of it): changed through that, maybe
        if isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                and _root_name(node.value) == name:
            return True  # ``p[0] = x``, ``p.data[...] = x``, ``p.view(-1)[0] = x``
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and _in_place(func.attr) and _root_name(func.value) == name:
            return True  # ``p.sub_()``, and through an item, ``.data`` or a view: ``p[0].zero_()``, ``p.view(-1).sub_()``
        passed = [a.value if isinstance(a, ast.Starred) else a for a in node.args] + [k.value for k in node.keywords]
        if not any(_root_name(a, through_calls=False) == name for a in passed):  # ``f(p)``, ``f(p[0])``, ``f(p.data)``
            continue
        qual = imports.qualify(func) or ""
        if qual.startswith("torch.distributions"):
            continue  # the distribution under decision or another: they do not write their arguments
        if not qual.startswith("torch.") or qual.startswith("torch.nn.init") or _in_place(qual.rpartition(".")[2]) \
                or any(k.arg in ("out", "inplace") for k in node.keywords):
            return True  # ``torch.clamp_(p)``, ``torch.Tensor.sub_(p, 1)``, ``torch.add(p, 1, out=p)``
    return False


def _in_place(method: str) -> bool:
    """An in-place tensor method or torch function by its name (``sub_``, ``clamp_``; not ``__x__``)."""
    return method.endswith("_") and not method.endswith("__")


def _root_name(expr: ast.AST, through_calls: bool = True) -> Optional[str]:
    """The name an item, attribute or (``through_calls``) method-call chain starts at (``p`` of
    ``p.view(-1)[0].data``)."""
    kinds = (ast.Attribute, ast.Subscript, ast.Call) if through_calls else (ast.Attribute, ast.Subscript)
    while isinstance(expr, kinds):
        expr = expr.func if isinstance(expr, ast.Call) else expr.value
    return expr.id if isinstance(expr, ast.Name) else None
