"""Where a forward pass's outputs go, for :mod:`.no_grad`: proof that none reaches a gradient.

Starting from a forward call inside a statement, each use of the value is followed up the
expression tree and through the names it is bound to (in the statement's scope, every binding
of those names, flow-insensitively: a name reused for a graph-carrying value elsewhere is
refused rather than told apart). A use ends safely where the value stops carrying autograd
state: ``.item()``/``.tolist()``/``.detach()``/``.data`` (not of an element of a result,
``out, h = rnn(packed)`` or ``rnn(packed)[0]``: a PackedSequence's ``.data`` keeps the graph),
``int()``/``float()``/``bool()``,
math functions, integer results (``argmax``, ``max(dim)[1]``, comparisons,
``Distribution.sample()``), numeric logging (``add_scalar``), a shape or dtype read (``env.step(...)`` takes
only what these give: given the tensor, an environment converts it to numpy, raising where it
requires grad, or keeps it). Anything that could keep the value where a later loss reads it is refused: appended or put
into a container, stored into an attribute or a subscript, returned or yielded, read by another
function or a closure, bound to a name declared ``global``/``nonlocal`` or in a scope that calls
``locals()``/``eval``, passed to an unknown call; so is anything that reads autograd state
(``.requires_grad``, ``.grad_fn``, ``.backward()``) or changes the value in place (a ``_`` method
or ``torch`` function, ``x += 1`` through any name bound to it, ``inplace=True``, ``out=``: on a
leaf that requires grad, what ``hot.target_graph_cut`` makes, these raise). ``.numpy()`` and
numpy functions raise on a tensor that requires grad, and do not under ``no_grad``: they end a use
only after ``.detach()``/``.data`` or an integer result (or as ``.numpy(force=True)``). A value
turned into text (``print``, ``str``, ``repr``, an f-string, ``%``, a logger's message) is refused:
a tensor's text shows its ``grad_fn``, which the rewrite would take out of the user's output.
"""
from __future__ import annotations

import ast
import bisect
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

from .. import rewrite_caches
from ..analysis.scopes import builtin_checker
from .callees import ENGINE_EFFECTS, ENGINE_PURE, GRAD_ATTRS, clipped

#: what the reasons for values turned into text add (the text of a tensor shows its grad_fn)
TEXT_WHY = ": the text shows its grad_fn, which the rewrite would take out of the output"
#: methods whose result never carries a gradient
ENDS = frozenset({"item", "tolist", "detach", "argmax", "argmin", "argsort", "multinomial",
                  "size", "dim", "numel", "eq", "ne", "gt", "lt", "ge", "le", "bool", "long", "int"})
#: attribute reads that carry no gradient
META = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "layout"})
#: builtins whose result is a plain Python value
PLAIN_RESULT = frozenset({"int", "float", "bool", "len", "isinstance", "type", "hash"})
#: builtins writing a tensor as text: its ``grad_fn=<...>`` is part of that text
TEXT_RESULT = frozenset({"str", "repr", "print", "format", "ascii"})
#: builtins whose result may still hold the value (``round`` of a tensor is a tensor)
PASS_THROUGH = frozenset({"list", "tuple", "max", "min", "sum", "abs", "zip", "enumerate", "sorted", "reversed", "round"})
BUILTINS = PLAIN_RESULT | TEXT_RESULT | PASS_THROUGH
TORCH_ENDS = frozenset({"torch.argmax", "torch.argmin", "torch.argsort", "torch.multinomial", "torch.eq", "torch.isfinite", "torch.isnan"})
LOG_METHODS = frozenset({"add_scalar", "add_scalars", "add_histogram"})
#: logger methods writing their arguments as text (``logger.info("q %s", q)``)
TEXT_LOG_METHODS = frozenset({"log", "info", "debug", "warning", "warn", "error", "critical", "exception", "write"})
LOG_RECEIVERS = ("writer", "logger", "wandb", "logging", "tb", "summary", "log")
#: methods (and torch functions) returning (values, indices) where given a dim: ``[1]`` holds no grad
INDEXED = frozenset({"max", "min", "median", "mode", "kthvalue", "sort", "topk"})
#: torch.nn.functional functions taking ``inplace``, by its position (a test checks it against torch)
INPLACE_AT = {"alpha_dropout": 3, "celu": 2, "dropout": 3, "dropout1d": 3, "dropout2d": 3, "dropout3d": 3, "elu": 2,
              "feature_alpha_dropout": 3, "hardsigmoid": 1, "hardswish": 1, "hardtanh": 3, "leaky_relu": 2, "mish": 1,
              "relu": 1, "relu6": 1, "rrelu": 4, "selu": 1, "silu": 1, "threshold": 3}
#: in-place operator methods spelled out (``x.__iadd__(1)``, ``x.__setitem__(i, v)``)
INPLACE_DUNDERS = frozenset(f"__i{op}__" for op in (
    "add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow", "lshift", "rshift", "and", "xor", "or")) | {
    "__setitem__", "__delitem__", "__setattr__", "__delattr__", "__setstate__"}
#: calls that can read a scope's local names without naming them
DYNAMIC = frozenset({"locals", "vars", "eval", "exec", "globals"})


def _element(node: ast.expr, entry: ast.expr, elements: Set[str]) -> bool:
    """Whether ``node`` may be one element of a forward's result rather than a tensor: a name
    unpacked from it (``out, h = rnn(packed)``) or an integer index straight into the value
    followed (``rnn(packed)[0]``): an RNN given a PackedSequence returns one there."""
    if isinstance(node, ast.Name):
        return node.id in elements
    return (isinstance(node, ast.Subscript) and node.value is entry and isinstance(node.slice, ast.Constant)
            and type(node.slice.value) is int)


#: how a value handed back by ``return``/``yield`` is told (what :meth:`Flow.problem` prefers)
RETURNED = "is returned to a caller this file does not show"


class Flow:
    """Follows values of one scope. ``scope`` is a FunctionDef or the Module."""

    def __init__(self, scope: ast.AST, tree: ast.Module, imports, user_samples: bool, is_forward=None,
                 allow: frozenset = frozenset()) -> None:
        self.scope = scope
        self.tree = tree
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
        #: the calls of an allowed autograd attribute (``backward``) the followed values reached
        self.reached: List[ast.Call] = []
        self.declared: Dict[str, str] = {}  # name -> "global"/"nonlocal" (this scope's own declarations)
        self.augmented: Dict[str, List[ast.AugAssign]] = {}
        #: names bound to an element of something (``out, h = rnn(x)``, ``for o in outs``): maybe no
        #: tensor (an RNN given a PackedSequence returns one, whose ``.data`` keeps the graph)
        self.elements: Set[str] = set()
        self._dynamic: Optional[List[ast.Call]] = None  # calls reading names by their text (locals(), eval)
        self._blocks: Dict[Tuple[int, str], Any] = {}  # (id(parent), field) -> its block's facts (_place)
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
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                self.declared[name] = type(node).__name__.lower()
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            self.augmented.setdefault(node.target.id, []).append(node)
        if isinstance(node, (ast.Tuple, ast.List)) and isinstance(node.ctx, ast.Store):
            self.elements.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
        if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and isinstance(node.target, ast.Name):
            self.elements.add(node.target.id)
        for child in ast.iter_child_nodes(node):
            self._index(child, node)

    def problem(self, start: ast.expr, prefer_return: bool = False) -> Optional[str]:
        """Why ``start``'s value (or what is bound from it) might reach a gradient, or None.

        With ``prefer_return``, the walk goes on past a first problem and answers the value's
        return to a caller where it has one (else that first problem): a helper that returns its
        forward leaves the decision to its caller (:mod:`.no_grad`), whatever else happens to the
        value on its way out (pranz24's ``sample`` updates ``log_prob`` in place, then returns it)."""
        names: List[Tuple[str, Optional[ast.stmt]]] = []
        found: List[str] = []

        def answer(reason: str) -> bool:
            """Whether ``reason`` ends the walk (else it is kept and the walk goes on)."""
            if not prefer_return or RETURNED in reason:
                found.insert(0, reason)
                return True
            found.append(reason)
            return False

        reason = self._follow(start, names)
        if reason and answer(reason):
            return found[0]
        seen: Set[Tuple[str, int]] = set()
        while names:
            name, binding = names.pop()
            if (name, id(binding)) in seen:
                continue
            seen.add((name, id(binding)))
            outside = self._read_outside(name)
            if outside and answer(outside):
                return found[0]
            aug = next(iter(self.augmented.get(name, ())), None)
            if aug is not None and answer(f"`{name}` is updated in place (line {aug.lineno}: `{ast.unparse(aug)}`)"):
                return found[0]
            for other in self.outside:
                if _reads_free(other, name):
                    what = getattr(other, "name", "a lambda")
                    if answer(f"`{name}` is read in {what} (line {other.lineno}), where its use is not followed"):
                        return found[0]
                    break
            for load in _program_order(self._live(name, binding), binding):
                reason = self._follow(load, names)
                if reason and answer(f"`{name}` (line {load.lineno}) {reason}"):
                    return found[0]
        return found[0] if found else None

    def _read_outside(self, name: str) -> Optional[str]:
        """Why ``name`` may be read where its uses are not followed (beyond the functions and
        closures :meth:`problem` checks), or None: declared ``global``/``nonlocal`` here (another
        function or the enclosing one reads it), or a scope that reads names by their text."""
        if name in self.declared and self.scope is not self.tree:
            return f"`{name}` is declared {self.declared[name]} (read outside this function, where its use is not followed)"
        if self._dynamic is None:  # globals: any function of the file may call globals()/eval
            nodes = ast.walk(self.tree) if self.scope is self.tree else iter(self.parents)
            self._dynamic = [n for n in nodes if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                             and n.func.id in DYNAMIC and not (n.func.id == "vars" and n.args)
                             and (self.scope is self.tree or n.func.id != "globals")]
        if self._dynamic:
            call = self._dynamic[0]
            return f"`{name}` can be read through {call.func.id}() (line {call.lineno}), where its use is not followed"
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
        found = self._place(up, binding)
        if found is None or self._in_try(binding):
            return loads
        block, i, (jumps, rebinds) = found
        # the first later statement that rebinds the name (all targets names) and the first that
        # jumps: at one statement the rebinding comes first
        k = next((k for k in rebinds.get(name, ()) if k > i), None)
        j = jumps[bisect.bisect_right(jumps, i)] if jumps and jumps[-1] > i else None
        if k is None or (j is not None and j < k):
            return loads
        live = {id(n) for st in block[i + 1:k] for n in ast.walk(st)} | {id(n) for n in ast.walk(block[k].value)}
        return [load for load in loads if id(load) in live]

    def _place(self, up: Optional[ast.AST], st: ast.AST):
        """``(block, index of st in it, (statements that jump, name -> statements rebinding it))``
        for the block of ``up`` holding ``st``, or None; each block's facts are gathered once
        (per binding they were a scan of the rest of the block: quadratic in a long function)."""
        for f in ("body", "orelse", "finalbody"):
            block = getattr(up, f, None)
            if not isinstance(block, list):
                continue
            key = (id(up), f)
            facts = self._blocks.get(key)
            if facts is None:
                jumps = [k for k, x in enumerate(block) if _jumps(x)]
                rebinds: Dict[str, List[int]] = {}
                for k, x in enumerate(block):
                    if isinstance(x, ast.Assign) and all(isinstance(t, ast.Name) for t in x.targets):
                        for t in x.targets:
                            rebinds.setdefault(t.id, []).append(k)
                facts = self._blocks[key] = ({id(x): k for k, x in enumerate(block)}, (jumps, rebinds))
            i = facts[0].get(id(st))
            if i is not None:
                return block, i, facts[1]
        return None

    def _in_try(self, node: ast.AST) -> bool:
        up = self.parents.get(node)
        while up is not None and up is not self.scope:
            if isinstance(up, ast.Try) or type(up).__name__ == "TryStar":
                return True
            up = self.parents.get(up)
        return False

    def _follow(self, node: ast.expr, names: List[Tuple[str, Optional[ast.stmt]]]) -> Optional[str]:
        entry = node  # the forward's value, or a name bound to it whole
        packed = None  # ``out.data`` of an element followed on: the reason a later .numpy() gives
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
                    if attr == "numpy":
                        if any(k.arg == "force" and _true(k.value) for k in call.keywords):
                            self.ends.add(".numpy(force=True)")
                            return None
                        if packed is not None:  # SAC's `a, _ = self.actor(s)` then `a.data.numpy()`
                            return (f"calls .numpy() on `{packed}`: an element of the forward's result may be a "
                                    "PackedSequence, whose .data keeps the graph (it raises where the value requires grad)")
                        return "calls .numpy() before .detach() (it raises where the value requires grad)"
                    if attr.endswith("_") and not attr.endswith("__") or attr in INPLACE_DUNDERS:
                        return f"is changed in place (.{attr})"
                    if attr in self.allow and all(r is not call for r in self.reached):
                        self.reached.append(call)
                    node = call
                    continue
                if attr in META:
                    self.ends.add(f".{attr}")
                    return None
                if attr in ("data", "indices") and isinstance(p.ctx, ast.Load) and not (
                        attr == "data" and _element(node, entry, self.elements)):
                    self.ends.add(f".{attr}")
                    return None  # no graph: .data of any tensor, the indices of max(dim)/sort/topk
                # .data of an element (``out, _ = self.decoder(packed, hid)``, ``rnn(packed)[0]``)
                # may be a PackedSequence's field, the packed tensor with its graph: followed as
                # any attribute
                if isinstance(p.ctx, ast.Load):
                    packed = ast.unparse(p) if attr == "data" else packed
                    node = p
                    continue
                return f"has its attribute {attr} set"
            if isinstance(p, ast.Subscript):
                if p.value is not node:
                    self.ends.add("an index")
                    return None  # used as an index: the result holds none of its graph
                if not isinstance(p.ctx, ast.Load):
                    return "is written into by a subscript store"
                if _indices(node, p, self.imports):
                    self.ends.add("indices ([1] of a reduction over a dim)")
                    return None
                node = p
                continue
            if isinstance(p, ast.BinOp) and isinstance(p.op, ast.Mod) and p.right is node and _text(p.left):
                return f"is formatted into text (`{clipped(p)}`){TEXT_WHY}"
            if isinstance(p, ast.FormattedValue) and (p.format_spec is None or p.conversion != -1):
                return f"is formatted into an f-string (`{{{ast.unparse(node)}}}`){TEXT_WHY}"
            if isinstance(p, (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Starred, ast.Tuple, ast.List, ast.Set, ast.Dict)):
                if isinstance(getattr(p, "ctx", None), ast.Store):
                    return "is unpacked into a target"
                node = p
                continue
            if isinstance(p, ast.IfExp):
                if p.test is node:
                    self.ends.add("a test")
                    return None
                node = p
                continue
            if isinstance(p, (ast.Compare, ast.FormattedValue, ast.JoinedStr, ast.If, ast.While, ast.Assert, ast.Expr)):
                self.ends.add({"Compare": "a comparison", "FormattedValue": "a string", "JoinedStr": "a string",
                               "Expr": "a discarded expression"}.get(type(p).__name__, "a test"))
                return None
            if isinstance(p, ast.keyword):
                if p.arg == "out":
                    return "is written into (out=)"
                node = p  # the call is its parent
                p = self.parents.get(p)
                if not isinstance(p, ast.Call):
                    return "is passed as a keyword argument"
            if isinstance(p, ast.Call):
                if p.func is node:
                    return "is called"
                inplace = self._inplace(p)
                if inplace:
                    return inplace
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
                return RETURNED
            return f"is used in a {type(p).__name__} (not followed)"

    def _inplace(self, call: ast.Call) -> Optional[str]:
        """Why ``call`` may change its tensor arguments in place, or None: a ``torch`` function
        ending in ``_`` (``torch.relu_``, ``torch.Tensor.add_``, ``nn.init.zeros_``), ``inplace=``
        not spelled False, a torch.nn.functional function given ``inplace`` by position."""
        qual = self.imports.qualify(call.func) or ""
        last = qual.rsplit(".", 1)[-1]
        if qual.startswith("torch.") and last.endswith("_") and not last.endswith("__"):
            return f"is changed in place ({qual})"
        for k in call.keywords:
            if k.arg == "inplace" and not (isinstance(k.value, ast.Constant) and k.value.value is False):
                return f"may be changed in place (inplace={ast.unparse(k.value)})"
        if qual.startswith("torch.nn.functional.") and last in INPLACE_AT and len(call.args) > INPLACE_AT[last]:
            return f"may be changed in place (the inplace argument of {qual} given by position)"
        return None

    def _argument(self, call: ast.Call) -> Optional[str]:
        """What passing the value to ``call`` does: None (safe), "through" (the result holds it)
        or why it is refused."""
        func = call.func
        if self.is_forward(call):
            return "through"
        if isinstance(func, ast.Name) and func.id in BUILTINS and builtin_checker(self.tree)(func.id):
            if func.id in TEXT_RESULT:
                return f"is written as text by {func.id}(...){TEXT_WHY}"
            if func.id in PLAIN_RESULT:
                return None
            return "through"
        qual = self.imports.qualify(func)
        if qual is not None:
            top = qual.split(".")[0]
            if top == "logging" and qual.rsplit(".", 1)[-1] in TEXT_LOG_METHODS:
                return f"is logged as text by {qual}(...){TEXT_WHY}"
            if top == "numpy":
                return f"is passed to {qual}(...) before .detach() (it raises where the value requires grad)"
            if qual in ("torch.autograd.backward", "torch.autograd.grad") and "backward" in self.allow \
                    and all(r is not call for r in self.reached):
                self.reached.append(call)
            if top in ("math", "logging", "wandb") or qual in TORCH_ENDS:
                return None
            if top == "torch" or qual in ENGINE_PURE:
                return "through"
            if qual in ENGINE_EFFECTS:
                return f"is passed to code that {ENGINE_EFFECTS[qual]}"
            return f"is passed to {qual}(...), whose effects are unknown"
        if isinstance(func, ast.Attribute):
            receiver = (ast.unparse(func.value) or "").lower()
            if "env" in receiver:  # it converts to numpy (raising where the value requires grad) or keeps it
                return f"is passed to `{ast.unparse(func)}(...)` before .detach()/.item()/.numpy()"
            if func.attr in (LOG_METHODS | TEXT_LOG_METHODS) and any(r in receiver for r in LOG_RECEIVERS):
                if func.attr in LOG_METHODS or func.attr == "log" and "wandb" in receiver:
                    return None  # numbers: add_scalar takes .item(), wandb a number or a histogram
                return f"is logged as text by `{ast.unparse(func)}(...)`{TEXT_WHY}"
            return (f"is passed to `{ast.unparse(func)}(...)` without .detach()/.item(): it may keep the "
                    "value where a later loss reads it")
        if isinstance(func, ast.Name) and func.id in self._record_types():
            return "through"  # a namedtuple of this file holds the value, as a tuple does
        return f"is passed to `{ast.unparse(func)}(...)`, whose effects are unknown"

    def _record_types(self) -> Set[str]:
        """Names the module binds once, and only, to a namedtuple class (``collections.namedtuple``,
        ``typing.NamedTuple``): sweetice's ``SavedAction = namedtuple('SavedAction', ['log_prob',
        'value'])``. Building one keeps its arguments as a tuple does and runs nothing else."""
        found = getattr(self, "_records", None)
        if found is not None:
            return found
        bound: Dict[str, List[bool]] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                            call = node.value
                            ok = len(node.targets) == 1 and t is n and isinstance(call, ast.Call) \
                                and (self.imports.qualify(call.func) or "") in ("collections.namedtuple", "typing.NamedTuple")
                            bound.setdefault(n.id, []).append(ok)
            elif isinstance(node, ast.ClassDef):
                plain = all(isinstance(st, (ast.AnnAssign, ast.Pass, ast.Expr)) for st in node.body)
                ok = plain and any((self.imports.qualify(b) or "") == "typing.NamedTuple" for b in node.bases)
                bound.setdefault(node.name, []).append(ok)
            else:
                for name in _other_bindings(node):
                    bound.setdefault(name, []).append(False)
        self._records: Set[str] = {name for name, oks in bound.items() if oks == [True]}
        return self._records


def _other_bindings(node: ast.AST) -> List[str]:
    """Names ``node`` binds other than by a plain assignment or a class statement."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [a.asname or a.name.split(".")[0] for a in node.names]
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return list(node.names)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.NamedExpr, ast.comprehension)):
        return [n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)]
    if isinstance(node, ast.withitem) and node.optional_vars is not None:
        return [n.id for n in ast.walk(node.optional_vars) if isinstance(n, ast.Name)]
    return []


def _program_order(loads: List[ast.Name], binding: Optional[ast.stmt]) -> List[ast.Name]:
    """``loads`` with those after ``binding`` first (in source order), then those before it (a
    loop's next round): the first refused use a reason cites is then one the value reaches
    next, not an earlier line of the function (the analysis is flow-insensitive; the verdict is
    the same in any order)."""
    if binding is None:
        return loads
    end = binding.end_lineno or binding.lineno
    ordered = sorted(loads, key=lambda n: (n.lineno, n.col_offset))
    return [n for n in ordered if n.lineno > end] + [n for n in ordered if n.lineno <= end]


def _text(node: ast.expr) -> bool:
    """Whether ``node`` is spelled as a string (a literal or an f-string)."""
    return isinstance(node, ast.JoinedStr) or isinstance(node, ast.Constant) and isinstance(node.value, str)


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


def _true(value: ast.expr) -> bool:
    return isinstance(value, ast.Constant) and value.value is True


def _indices(node: ast.expr, sub: ast.Subscript, imports) -> bool:
    """Whether ``sub`` is ``node[1]`` with ``node`` a call returning (values, indices):
    ``q.max(1)[1]``, ``torch.max(q, dim=1)[1]``, ``q.topk(k)[1]`` (a dim given as an integer: with a
    tensor there, ``max``/``min`` are elementwise and ``[1]`` is a row of values)."""
    if not (isinstance(node, ast.Call) and isinstance(sub.slice, ast.Constant) and sub.slice.value == 1):
        return False
    qual = imports.qualify(node.func)
    if qual is not None:  # torch.max(q, 1): the tensor is the first argument
        name, args = (qual[len("torch."):] if qual.startswith("torch.") else ""), node.args[1:]
    elif isinstance(node.func, ast.Attribute):  # q.max(1)
        name, args = node.func.attr, node.args
    else:
        return False  # the builtin max(q)[1] is a row of q
    if name not in INDEXED:
        return False
    if name not in ("max", "min", "median"):
        return True  # always a (values, indices) pair
    dim = next((k.value for k in node.keywords if k.arg == "dim"), args[0] if args else None)
    if isinstance(dim, ast.UnaryOp) and isinstance(dim.op, ast.USub):
        dim = dim.operand
    return isinstance(dim, ast.Constant) and type(dim.value) is int


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
    return name in free_names(node)


def free_names(node: ast.AST) -> FrozenSet[str]:
    """The names :func:`_reads_free` is true of for ``node``, from one walk, kept for the last
    nodes asked about (held, so their ids stay theirs). ``Flow.problem`` asks of every function of
    the module for every name a value reaches: it walked each function again per name, most of
    a CleanRL file's hot.no_grad (120 ms of ppo_rnd_envpool.py's 300)."""
    hit = _FREE.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    found = frozenset(_free_names(node))
    if len(_FREE) >= 256:
        _FREE.clear()
    _FREE[id(node)] = (node, found)
    return found


_FREE: Dict[int, Tuple[ast.AST, FrozenSet[str]]] = rewrite_caches.mapping()


def _names_in(nodes: Iterable[ast.AST]) -> Set[str]:
    return {n.id for top in nodes for n in ast.walk(top) if isinstance(n, ast.Name)}


def _free_names(node: ast.AST) -> Set[str]:
    if isinstance(node, ast.ClassDef):  # its body's statements, each as below; its decorators and bases
        out = _names_in(node.decorator_list + node.bases)
        for st in node.body:
            out |= free_names(st)
        return out
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return _names_in([node])
    args = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
    body = node.body if isinstance(node.body, list) else [node.body]
    walked = [n for st in body for n in ast.walk(st)]
    declared = {d for n in walked if isinstance(n, (ast.Global, ast.Nonlocal)) for d in n.names}
    stored = {n.id for n in walked if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    local = args | (stored - declared)  # nested functions of it reading these read its own locals
    read = {n.id for n in walked if isinstance(n, ast.Name)} | _names_in(getattr(node, "decorator_list", []))
    return read - local
