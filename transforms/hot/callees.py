"""What a call in a rollout statement runs, and whether running it under ``torch.no_grad()`` could
change anything besides the autograd graph it would have recorded (for :mod:`.no_grad`).

``torch.no_grad()`` leaves forward values bit for bit as they are; what it changes is whether
outputs (and anything the callee stores) carry ``requires_grad``/``grad_fn``. So a callee is
acceptable only when its code is known: a ``torch.nn`` module (built in this file, directly or
by a function of this file that returns one), or a class/function of this file whose body keeps
nothing (no store to ``self`` or a global, no append to one), reads no autograd state
(``requires_grad``, ``grad_fn``, ``is_grad_enabled``...), runs no ``backward`` and updates no
parameter or buffer in place. Calls it makes are checked the same way, transitively. Anything
else (a class imported from another module, a function parameter) is unknown: refused.
"""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple

from ..analysis.astwalk import children as ast_children, push_children
from ..analysis.statements import ast_statements
from ..names import ast_dotted

#: autograd state a body must not read or change (its meaning differs under no_grad)
GRAD_ATTRS = frozenset({
    "requires_grad", "grad_fn", "grad", "is_leaf", "backward", "register_hook", "retain_grad",
    "retains_grad", "requires_grad_", "is_grad_enabled", "set_grad_enabled", "enable_grad",
    "is_inference_mode_enabled", "autograd",
})
#: methods that keep their argument in the receiver
STORING_METHODS = frozenset({"append", "extend", "insert", "add", "put", "push", "store", "update", "setdefault", "appendleft"})
#: builtins a forward may call freely
PLAIN_BUILTINS = frozenset({
    "len", "range", "int", "float", "bool", "str", "tuple", "list", "dict", "zip", "enumerate",
    "isinstance", "min", "max", "abs", "sum", "super", "getattr", "hasattr", "print", "type", "round",
    "reversed", "sorted", "map", "all", "any",
})
#: methods of tensors and distributions (an unresolved receiver calling one of these is a value)
TENSOR_METHODS = frozenset("""
    float double long int bool half byte to cpu cuda numpy item tolist detach clone view view_as reshape
    reshape_as squeeze unsqueeze flatten permute transpose t contiguous expand expand_as repeat argmax
    argmin max min sum mean std var exp log tanh sigmoid relu softmax log_softmax clamp clip abs sqrt pow
    gather index_select masked_fill type type_as new_tensor new_zeros new_ones new_full size dim numel
    sample rsample log_prob entropy cdf icdf chunk split unbind mul add sub div matmul mm bmm neg round
    floor ceil sign all any eq ne gt lt ge le astype copy square prod cumsum norm narrow select roll flip
    """.split())
# The engine's own run-time helpers that the transforms before hot.no_grad put in the code (hot.*,
# vectorize.*, grad_clip): the analysis sees the rewritten version, so each is read as the user's
# code it stands for, never as "unknown" code the user did not write. Every helper those
# transforms' examples call must be in one of the two tables (tests/transforms/hot/test_engine_helpers.py).
#: helpers that build a value from their arguments and keep or change nothing else (a tensor from
#: arrays, a recurrence, the checks and views around it): taken as the torch calls they replace
ENGINE_PURE = frozenset({
    "scalebox_cst.runtime.hot_distributions.categorical_probs", "scalebox_cst.runtime.hot_grad.checked_modules",
    "scalebox_cst.runtime.hot_tensors.tensor_from_arrays", "scalebox_cst.runtime.hot_device.tensor_on",
    "scalebox_cst.runtime.recurrence.linear_recurrence", "scalebox_cst.runtime.loop_batch.batch_range",
    "scalebox_cst.runtime.loop_batch.batch_zip", "scalebox_cst.runtime.scatter.scatter_add_rows",
    "scalebox_cst.runtime.scatter.index_add_rows", "scalebox_cst.runtime.scatter.scatter_add_calls",
    "scalebox_cst.runtime.scatter.index_add_calls", "scalebox_cst.runtime.vectorized.as_row",
    "scalebox_cst.runtime.vectorized.carry_ok", "scalebox_cst.runtime.vectorized.dim1",
    "scalebox_cst.runtime.vectorized.dim_view", "scalebox_cst.runtime.vectorized.fused_linear",
    "scalebox_cst.runtime.vectorized.int_of", "scalebox_cst.runtime.vectorized.items_of",
    "scalebox_cst.runtime.vectorized.length", "scalebox_cst.runtime.vectorized.loss_range",
    "scalebox_cst.runtime.vectorized.loss_zip", "scalebox_cst.runtime.vectorized.quadratic_ok",
    "scalebox_cst.runtime.vectorized.recurrence_ok", "scalebox_cst.runtime.vectorized.reset_linear_recurrence",
    "scalebox_cst.runtime.vectorized.restore", "scalebox_cst.runtime.vectorized.seq_of",
    "scalebox_cst.runtime.vectorized.seqs_of", "scalebox_cst.runtime.vectorized.steps", "scalebox_cst.runtime.vectorized.no_steps",
    "scalebox_cst.runtime.vectorized.switch_linear_recurrence", "scalebox_cst.runtime.vectorized.to_rank",
    "scalebox_cst.runtime.vectorized.truth_of",
})
_TARGET_UPDATE = "updates target-network parameters in place"
#: helpers that change state in place, with what the user's code there does (quoted in a reason)
ENGINE_EFFECTS = {
    "scalebox_cst.runtime.target_update.soft_update": _TARGET_UPDATE,
    "scalebox_cst.runtime.target_update.hard_update": _TARGET_UPDATE,
    "scalebox_cst.runtime.target_update.lerp_update": _TARGET_UPDATE,
    "scalebox_cst.runtime.target_update.scale_add": _TARGET_UPDATE,
    "scalebox_cst.runtime.target_update.scale_add_alpha": _TARGET_UPDATE,
    "scalebox_cst.runtime.stabilizer.stabilize": "checks and may skip an optimizer step (the gradient guard)",
    "scalebox_cst.runtime.clip.clip_grad_norm": "clips gradients in place",
}
PLAIN_MODULES = ("torch", "numpy", "math", "random", "gym", "gymnasium", "collections", "functools", "itertools", "typing")


def _pairs(targets: List[ast.expr], value: ast.expr) -> List[Tuple[ast.expr, ast.expr]]:
    """(target, the value it gets) of an assignment; ``self.a, self.b = A(), B()`` pairs each
    entry of a tuple target with its entry of an equally long tuple display. The entries of any
    other tuple target (``self.a, self.b = make()``) get an unknown value (a bare ``...``), so
    that :meth:`Files.kinds_of` calls them unknown rather than miss the binding."""
    out: List[Tuple[ast.expr, ast.expr]] = []
    for t in targets:
        if not isinstance(t, (ast.Tuple, ast.List)):
            out.append((t, value))
        elif isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(t.elts) \
                and not any(isinstance(e, ast.Starred) for e in [*t.elts, *value.elts]):
            for e, v in zip(t.elts, value.elts):
                out.extend(_pairs([e], v))
        else:
            out.extend((e, ast.Constant(...)) for e in ast.walk(t) if isinstance(e, ast.Attribute) and isinstance(e.ctx, ast.Store))
    return out


def may_hold_network(code: str, tree: ast.Module) -> bool:
    """False where no call of the module can run a network (then hot.no_grad and
    hot.target_graph_cut have no candidate, and skip their scans and the module's imports: a file
    of thousands of GAE loops holds none). A network is what a ``torch.nn`` constructor builds
    (directly, or through functions of this file that return one) or an instance of a class of
    this file; a name qualifies to ``torch.nn.`` only through an import or a ``torch.nn`` chain,
    and either spells ``nn`` in the text (in ASCII text: identifiers elsewhere normalise NFKC)."""
    if not code.isascii() or "nn" in code:
        return True
    if "class" not in code:  # a class statement spells its keyword
        return False
    return any(isinstance(st, ast.ClassDef) for st in ast_statements(tree.body)[0])  # a class is a statement


#: torch.nn modules that run the modules they are given (their forward is those modules')
_CONTAINERS = frozenset({"torch.nn.Sequential", "torch.nn.ModuleList", "torch.nn.ModuleDict",
                         "torch.nn.DataParallel", "torch.nn.modules.container.Sequential"})


def _given_back(fn: ast.FunctionDef, ret: ast.expr, call: ast.Call) -> Optional[ast.expr]:
    """The argument ``call`` gives ``fn`` for the parameter ``ret`` names, where ``ret`` (a value
    ``fn`` returns) is a parameter never rebound in ``fn``; None otherwise."""
    if not isinstance(ret, ast.Name):
        return None
    names = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if ret.id not in names or any(isinstance(n, ast.Name) and n.id == ret.id and isinstance(n.ctx, ast.Store)
                                  for n in ast.walk(fn)):
        return None
    at = names.index(ret.id)
    if at < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[: at + 1]):
        return call.args[at]
    return next((k.value for k in call.keywords if k.arg == ret.id), None)


class Files:
    """The classes and functions of one module, and what names and ``self.x`` attributes hold."""

    def __init__(self, tree: ast.Module, imports) -> None:
        self.imports = imports
        self.tree = tree
        #: id(scope) -> (scope, its _scope_table): one walk per scope, whatever the names asked
        self._scoped: Dict[int, Tuple[ast.AST, Tuple[Dict[str, List[ast.expr]], Set[str]]]] = {}
        self._declared: Optional[Set[str]] = None
        self.classes: Dict[str, ast.ClassDef] = {}
        self.functions: Dict[str, ast.FunctionDef] = {}
        for st in tree.body:
            if isinstance(st, ast.ClassDef):
                self.classes[st.name] = st
            elif isinstance(st, ast.FunctionDef):
                self.functions[st.name] = st
        #: "Class.self.attr" -> every value assigned to it in the class's methods
        self.values: Dict[str, List[ast.expr]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Assign):
                        bound = _pairs(sub.targets, sub.value)
                    elif isinstance(sub, ast.AnnAssign) and sub.value is not None:
                        bound = [(sub.target, sub.value)]
                    elif isinstance(sub, (ast.AugAssign, ast.For, ast.AsyncFor, ast.withitem, ast.comprehension)):
                        target = sub.optional_vars if isinstance(sub, ast.withitem) else sub.target
                        bound = _pairs([target], ast.Constant(...)) if target is not None else []  # unknown
                    else:
                        continue
                    for t, value in bound:
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                            self.values.setdefault(f"{node.name}.self.{t.attr}", []).append(value)

    # ---------------------------------------------------------------- what a value is

    def is_torch_module_ctor(self, call: ast.expr) -> bool:
        """Whether ``call`` builds a ``torch.nn`` module (or a function of this file returning one),
        or picks one of several so built: ``[nn.ReLU(), nn.Tanh()][args.use_tanh]`` (an
        activation chosen by a flag, as Lizhi-sjtu/DRL-code-pytorch's PPO nets do),
        ``nn.Tanh() if tanh else nn.ReLU()``: calling the result runs one of their forwards."""
        if isinstance(call, ast.Subscript) and isinstance(call.value, (ast.List, ast.Tuple)) and call.value.elts \
                and not isinstance(call.slice, ast.Slice):
            return all(self.is_torch_module_ctor(e) for e in call.value.elts)
        if isinstance(call, ast.IfExp):
            return self.is_torch_module_ctor(call.body) and self.is_torch_module_ctor(call.orelse)
        if not isinstance(call, ast.Call):
            return False
        qual = self.imports.qualify(call.func) or ""
        if qual in _CONTAINERS or qual.startswith(("torch.nn.parallel.", "torch.nn.utils.")):
            # a container or wrapper runs the modules it holds: known only where each of them is
            # (``nn.Sequential(Memo(), nn.Tanh())`` runs Memo's forward, which may keep a value)
            held = [*call.args, *(k.value for k in call.keywords if k.arg in (None, "module", "modules"))]
            return bool(held) and all(self._holds_torch_modules(a) for a in held)
        if qual.startswith("torch.nn.") and not qual.startswith("torch.nn.functional"):
            return True
        if isinstance(call.func, ast.Name) and call.func.id in self.functions:
            fn = self.functions[call.func.id]
            rets = [r.value for r in ast.walk(fn) if isinstance(r, ast.Return)]
            return bool(rets) and all(r is not None and (self.is_torch_module_ctor(r) or self._passes_through(fn, r, call))
                                      for r in rets)
        return False

    def _passes_through(self, fn: ast.FunctionDef, ret: ast.expr, call: ast.Call) -> bool:
        """Whether ``ret`` (returned by ``fn``) is the module ``call`` passed in, built here:
        CleanRL's ``layer_init(nn.Linear(...))`` initialises its argument's weights and returns it."""
        given = _given_back(fn, ret, call)
        return given is not None and self.is_torch_module_ctor(given)

    def _hands_back(self, value: ast.expr, key: str) -> bool:
        """Whether ``value`` calls a function of this file that returns the argument it is given,
        ``key`` itself: MrSyee/pg-is-all-you-need's ``self.mu_layer = init_layer_uniform(self.mu_layer)``
        (weights set in place, the module given back) holds what ``key``'s other values hold."""
        if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in self.functions):
            return False
        fn = self.functions[value.func.id]
        rets = [r.value for r in ast.walk(fn) if isinstance(r, ast.Return)]
        return bool(rets) and all(r is not None and (given := _given_back(fn, r, value)) is not None
                                  and ast_dotted(given) == key for r in rets)

    def _holds_torch_modules(self, arg: ast.expr) -> bool:
        """Whether ``arg`` (given to a container) is torch.nn modules only: a module built here, or
        a list, tuple or dict display of them (a starred list, a name, a comprehension: unknown)."""
        if isinstance(arg, (ast.List, ast.Tuple)):
            return all(self._holds_torch_modules(e) for e in arg.elts)
        if isinstance(arg, ast.Dict):
            return all(self._holds_torch_modules(v) for v in arg.values)
        return self.is_torch_module_ctor(arg)

    def name_values(self, name: str, scope: Optional[ast.AST]) -> Optional[List[ast.expr]]:
        """What ``name`` is assigned as seen from ``scope`` (a function: its own assignments, else
        the module's); None where it is a parameter of ``scope`` or bound otherwise (a loop, a
        ``with``, an augmented assignment...): unknown."""
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(isinstance(a, ast.arg) and a.arg == name for a in ast.walk(scope.args)):
                return None
            found = self._assigned(scope, name)
            if found != []:
                return found
        found = self._assigned(self.tree, name)
        return found or None

    def local_values(self, name: str, fn: ast.FunctionDef) -> Optional[List[ast.expr]]:
        """What ``name`` is assigned in ``fn`` itself; None where it is a parameter, bound some
        other way there, or not bound there at all (a global: others may rebind it)."""
        if any(isinstance(a, ast.arg) and a.arg == name for a in ast.walk(fn.args)):
            return None
        return self._assigned(fn, name) or None

    def _assigned(self, scope: ast.AST, name: str) -> Optional[List[ast.expr]]:
        table = self._scoped.get(id(scope))
        if table is None or table[0] is not scope:
            table = self._scoped[id(scope)] = (scope, _scope_table(scope))
        values, unknown = table[1]
        return None if name in unknown else list(values.get(name, ()))

    def kinds_of(self, key: str, cls: Optional[str] = None, scope: Optional[ast.AST] = None) -> Optional[List[Tuple[str, Optional[ast.ClassDef]]]]:
        """What ``key`` (a name, or ``self.attr`` inside ``cls``) may hold: ("torch", None) or
        ("class", ClassDef) per assignment; None where any assignment is unknown or it is a parameter."""
        owner = None
        if key.startswith("self.") and cls is not None:
            values = None
            for klass in self.lineage(cls):
                values = self.values.get(f"{klass}.{key}")
                if values:
                    owner = klass
                    break
        else:
            values = self.name_values(key, scope) if "." not in key else None
        if not values:
            return None
        out = []
        for v in values:
            if self._hands_back(v, key) and len(values) > 1:
                continue  # `self.fc = init(self.fc)`: the module of its other values, given back
            if self.is_torch_module_ctor(v):
                out.append(("torch", None))
            elif isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in self.classes:
                out.append(("class", self.classes[v.func.id]))
            elif isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and owner is not None:
                # BY571's IQN: `layer = NoisyLinear` / `layer = nn.Linear`, then `self.ff_1 = layer(...)`
                classes = self._classes_named(v.func.id, self.method_holding(owner, v))
                if classes is None:
                    return None
                out.extend(classes)
            elif isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "to":
                inner = v.func.value  # `Agent(envs).to(device)`
                if self.is_torch_module_ctor(inner):
                    out.append(("torch", None))
                elif isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id in self.classes:
                    out.append(("class", self.classes[inner.func.id]))
                else:
                    return None
            else:
                return None
        return out

    def method_holding(self, cls: str, node: ast.AST) -> Optional[ast.FunctionDef]:
        """The method of ``cls`` whose body holds ``node``."""
        for st in self.classes[cls].body:
            if isinstance(st, ast.FunctionDef) and any(n is node for n in ast.walk(st)):
                return st
        return None

    def _classes_named(self, name: str, scope: Optional[ast.FunctionDef]) -> Optional[List[Tuple[str, Optional[ast.ClassDef]]]]:
        """What calling ``name`` builds where every value it is assigned (in ``scope``, else the
        module) is a class: one of this file, or a torch.nn module class; None otherwise."""
        if scope is None:
            return None
        refs = self.name_values(name, scope)
        if not refs or name in self.declared_global():
            return None
        out: List[Tuple[str, Optional[ast.ClassDef]]] = []
        for ref in refs:
            qual = self.imports.qualify(ref) or ""
            last = qual.rsplit(".", 1)[-1]
            if isinstance(ref, ast.Name) and ref.id in self.classes:
                out.append(("class", self.classes[ref.id]))
            elif qual.startswith("torch.nn.") and qual.count(".") == 2 and last[:1].isupper() and qual not in _CONTAINERS:
                out.append(("torch", None))  # `nn.Linear`: a torch.nn module class, not a function
            else:
                return None
        return out

    def lineage(self, cls: str) -> List[str]:
        """``cls`` and its base classes defined in this file, nearest first."""
        out, todo = [], [cls]
        while todo:
            name = todo.pop(0)
            if name in out or name not in self.classes:
                continue
            out.append(name)
            todo.extend(b.id for b in self.classes[name].bases if isinstance(b, ast.Name))
        return out

    def method(self, cls: ast.ClassDef, name: str, seen: Optional[Set[str]] = None) -> Optional[ast.FunctionDef]:
        """``cls.name`` looked up through base classes of this file; None if not found there."""
        for st in cls.body:
            if isinstance(st, ast.FunctionDef) and st.name == name:
                return st
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id in self.classes and base.id != cls.name:
                found = self.method(self.classes[base.id], name)
                if found is not None:
                    return found
        return None

    def torch_based(self, cls: ast.ClassDef) -> bool:
        """Whether the class is an nn.Module (so calling an instance runs ``forward``)."""
        for base in cls.bases:
            if (self.imports.qualify(base) or "").startswith("torch.nn."):
                return True
            if isinstance(base, ast.Name) and base.id in self.classes and base.id != cls.name:
                if self.torch_based(self.classes[base.id]):
                    return True
        return False

    # ---------------------------------------------------------------- calls

    def resolve(self, func: ast.expr, cls: Optional[str], scope: Optional[ast.AST] = None) -> Optional[List[Tuple[Optional[ast.FunctionDef], Optional[str]]]]:
        """The bodies a call of ``func`` runs: (function, its class name) each, (None, None) for a
        torch.nn module's own forward; None if unknown."""
        if isinstance(func, ast.Name) and func.id == "self" and cls in self.classes:
            return self._call_of(("class", self.classes[cls]))  # `self(x)` inside a module
        if isinstance(func, ast.Name) and func.id in self.functions and self.name_values(func.id, scope) is None \
                and not (isinstance(scope, ast.FunctionDef) and any(a.arg == func.id for a in ast.walk(scope.args) if isinstance(a, ast.arg))):
            return [(self.functions[func.id], None)]
        key = ast_dotted(func)
        if key is None:
            return None
        head, _, rest = key.rpartition(".")
        # a module instance called: `net(x)` / `self.net(x)`
        kinds = self.kinds_of(key, cls, scope)
        if kinds is not None:
            return [b for k in kinds for b in self._call_of(k)] if all(self._call_of(k) is not None for k in kinds) else None
        # a method of an instance: `agent.act(x)` / `self.act(x)`
        if head == "self" and cls is not None and cls in self.classes:
            fn = self.method(self.classes[cls], rest)
            return [(fn, cls)] if fn is not None else None
        if head:
            kinds = self.kinds_of(head, cls, scope)
            if kinds is None:
                return None
            out = []
            for kind, klass in kinds:
                if kind == "torch":
                    # a torch.nn module's forward; any other method of one (``apply(init)``,
                    # ``add_module``, ``to``) or of a parameter (``size``) is no forward, and what
                    # it does is not known here (found on garage, DI-engine, sample-factory)
                    if rest not in ("forward", "__call__"):
                        return None
                    out.append((None, None))
                    continue
                fn = self.method(klass, rest) if "." not in rest else None
                if fn is None:
                    sub = self.kinds_of(f"self.{rest}", klass.name)  # a submodule: `policy.value(x)`
                    if sub is None or any(self._call_of(k) is None for k in sub):
                        return None
                    out.extend(b for k in sub for b in self._call_of(k))
                    continue
                out.append((fn, klass.name))
            return out
        return None

    def _call_of(self, kind: Tuple[str, Optional[ast.ClassDef]]):
        what, klass = kind
        if what == "torch":
            return [(None, None)]
        fn = self.method(klass, "__call__") or (self.method(klass, "forward") if self.torch_based(klass) else None)
        return [(fn, klass.name)] if fn is not None else None

    # ---------------------------------------------------------------- bodies

    def runs_forward(self, fn: ast.FunctionDef, cls: Optional[str], seen: Optional[Set[str]] = None) -> bool:
        """Whether ``fn`` is a module's forward or calls one (directly or through methods of this
        file): what makes a call of it worth running under no_grad."""
        seen = set() if seen is None else seen
        if f"{cls}.{fn.name}" in seen:
            return False
        seen.add(f"{cls}.{fn.name}")
        if cls in self.classes and fn.name in ("forward", "__call__") and self.torch_based(self.classes[cls]):
            return True
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and node.args:
                for body, owner in self.resolve(node.func, cls, fn) or ():
                    if body is None or self.runs_forward(body, owner, seen):
                        return True
        return False

    def body_problem(self, fn: ast.FunctionDef, cls: Optional[str], seen: Set[str]) -> Optional[str]:
        """Why running ``fn`` under no_grad could change more than the graph, or None."""
        tag = f"{cls}.{fn.name}"
        if tag in seen:
            return None
        seen.add(tag)
        where = f"`{fn.name}` (line {fn.lineno})"
        if any((self.imports.qualify(d.func if isinstance(d, ast.Call) else d) or "").startswith("torch.enable_grad")
               for d in fn.decorator_list):
            return f"{where} enables grad itself"
        local = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        local |= {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
        local -= _aliases(fn, local)
        constant = {id(n) for st in ast.walk(fn) if isinstance(st, ast.Assign) and _constant(st.value)
                    for t in st.targets for n in ast.walk(t)}
        trains = next((n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                       and n.func.attr == "backward"), None)
        if trains is not None:  # what the body is for, before whichever unknown call comes first
            return f"{where} trains: it calls {clipped(trains.func)}() (line {trains.lineno})"
        for node in ast.walk(fn):
            if isinstance(node, (ast.Global, ast.Nonlocal)):
                return f"{where} declares {', '.join(node.names)} global/nonlocal"
            if isinstance(node, ast.Attribute) and node.attr in GRAD_ATTRS:
                return f"{where} reads autograd state (.{node.attr})"
            if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                    and id(node) not in constant:  # ``self.log_std_min = -20``: a constant carries no graph
                root = _root(node)
                if root == "self" or root not in local:
                    return f"{where} stores into {ast.unparse(node)} (kept past the call: it could carry grad to a later loss)"
            if isinstance(node, ast.Call):
                problem = self._call_problem(node, fn, cls, local, where, seen)
                if problem:
                    return problem
        return None

    def _call_problem(self, node: ast.Call, fn, cls, local, where, seen) -> Optional[str]:
        func = node.func
        qual = self.imports.qualify(func)
        if qual is not None:
            if qual.split(".")[0] in PLAIN_MODULES or qual in ENGINE_PURE:
                return None
            if qual in ENGINE_EFFECTS:
                return f"{where} {ENGINE_EFFECTS[qual]}"
            return f"{where} calls {qual}, whose effects are unknown"
        if isinstance(func, ast.Attribute):
            root = _root(func.value)
            if func.attr in STORING_METHODS and (root == "self" or root not in local):
                return f"{where} keeps a value with {ast.unparse(func)}(...)"
            if func.attr.endswith("_") and not func.attr.endswith("__") and (root == "self" or root not in local):
                return f"{where} updates {ast.unparse(func.value)} in place ({func.attr})"
        if isinstance(func, ast.Name) and func.id in PLAIN_BUILTINS and self.name_values(func.id, fn) is None:
            return None
        bodies = self.resolve(func, cls, fn)
        if bodies is None:
            if isinstance(func, ast.Attribute) and func.attr in TENSOR_METHODS:
                return None  # a method of a value (a tensor, a distribution): `x.view(...)`
            values = self.name_values(func.id, fn) if isinstance(func, ast.Name) else None
            if values and isinstance(func, ast.Name) and func.id not in self.declared_global() \
                    and all(self._plain_function(v) for v in values):
                return None  # `activation = F.relu` then `activation(x)`: the torch function itself
            if values and isinstance(func, ast.Name):  # RL-Adventure's `Variable = lambda *args: ...`
                what = "a lambda" if isinstance(values[0], ast.Lambda) else f"`{clipped(values[0])}`"
                return f"{where} calls {func.id}, bound to {what} (line {values[0].lineno}), which is not followed"
            if isinstance(func, ast.Name) and isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and func.id in {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}:
                # Packt's `iterate_batches(env, net, ...)`: the code may well be in this file
                return f"{where} calls {func.id}, a parameter of `{fn.name}` (line {fn.lineno}): what it runs is not known here"
            return f"{where} calls {ast.unparse(func)}, whose code is not in this file"
        for body, owner in bodies:
            if body is not None:
                problem = self.body_problem(body, owner, seen)
                if problem:
                    return problem
        return None


    def declared_global(self) -> Set[str]:
        """Names some function of the module declares ``global`` (or ``nonlocal``): rebound where
        the module's own assignments do not show it."""
        if self._declared is None:
            self._declared = {name for n in ast.walk(self.tree) if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names}
        return self._declared

    def _plain_function(self, value: ast.expr) -> bool:
        """Whether ``value`` (bound to a name that is then called) is a function of a module whose
        calls are no problem (``F.relu``, ``torch.tanh``, ``np.clip``), or a choice between such
        functions (``F.relu if relu else torch.tanh``): Popular-RL-Algorithms' policy networks say
        ``activation = F.relu`` in ``forward``. A name on the way that touches autograd
        (``torch.autograd.grad``, ``torch.enable_grad``) or an engine helper with effects is not."""
        if isinstance(value, ast.IfExp):
            return self._plain_function(value.body) and self._plain_function(value.orelse)
        if not isinstance(value, (ast.Name, ast.Attribute)):
            return False
        qual = self.imports.qualify(value)
        if qual is None or qual in ENGINE_EFFECTS or GRAD_ATTRS.intersection(qual.split(".")) \
                or (qual.endswith("_") and not qual.endswith("__")):  # `torch.Tensor.add_`: in place
            return False
        return qual.split(".")[0] in PLAIN_MODULES or qual in ENGINE_PURE


def clipped(node: ast.expr) -> str:
    """``node``'s code for a reason, at most 40 characters (flow's reasons use it too)."""
    text = ast.unparse(node)
    return text if len(text) <= 40 else text[:37] + "..."


def _constant(value: ast.expr) -> bool:
    """A literal number, string, bool or None (a sign before it, or a tuple of them): no graph."""
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, (ast.USub, ast.UAdd)):
        value = value.operand
    if isinstance(value, ast.Tuple):
        return all(_constant(e) for e in value.elts)
    return isinstance(value, ast.Constant)


def _root(node: ast.AST) -> Optional[str]:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _aliases(fn: ast.AST, local: Set[str]) -> Set[str]:
    """Local names bound to something that outlives the call (``buf = self.buf``, ``h = STATE[0]``):
    a store or append through them is a store into that object."""
    out: Set[str] = set()
    changed = True
    while changed:
        changed = False
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Attribute, ast.Subscript)):
                root = _root(node.value)
                if root == "self" or root not in local or root in out:
                    for t in node.targets:
                        for n in ast.walk(t):
                            if isinstance(n, ast.Name) and n.id not in out:
                                out.add(n.id)
                                changed = True
    return out


def _scope_table(scope: ast.AST) -> Tuple[Dict[str, List[ast.expr]], Set[str]]:
    """What names are assigned directly in ``scope`` (not in nested functions or classes): (name
    -> the values assigned to it, in walk order; the names also bound some other way there,
    whose values are unknown). One walk for every name: a walk per name asked about walked a
    whole function once per name its calls use."""
    values: Dict[str, List[ast.expr]] = {}
    unknown: Set[str] = set()
    todo = ast_children(scope)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            if isinstance(getattr(node, "name", None), str):
                unknown.add(node.name)
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                pairs = [(t, node.value)]
                if isinstance(t, (ast.Tuple, ast.List)) and isinstance(node.value, (ast.Tuple, ast.List)) \
                        and len(t.elts) == len(node.value.elts):
                    pairs = list(zip(t.elts, node.value.elts))
                for tt, value in pairs:
                    if isinstance(tt, ast.Name):
                        values.setdefault(tt.id, []).append(value)
                    else:  # unpacked from something not paired
                        unknown.update(n.id for n in ast.walk(tt) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            unknown.add(node.id)  # bound by for / with / augmented assignment / walrus / del
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            unknown.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            unknown.update(node.names)
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            todo.extend(n for n in ast_children(node) if n is node.value)  # targets handled above
        else:
            push_children(node, todo)
    return values, unknown
