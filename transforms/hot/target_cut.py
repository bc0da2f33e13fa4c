"""``hot.target_graph_cut``: a target network's forward whose gradients nobody reads stops
recording backward work at its output.

minimalRL's DQN trains on ``target = r + gamma * q_target(s_prime).max(1)[0].unsqueeze(1) *
done_mask`` with no ``torch.no_grad()``: ``loss.backward()`` then runs backward through every
layer of the target network as well, into the ``.grad`` of parameters that no optimizer holds and
nothing reads. ``hot.no_grad`` cannot take it (the value reaches ``backward()``). Here the forward
call ``q_target(x)`` becomes ``target_forward(q_target, x)`` and the statement building the network
``q_target = Qnet()`` becomes ``q_target = grads_unread(Qnet())``
(:mod:`scalebox_cst.runtime.hot_target`): the forward runs as written and its output comes back
as a leaf that still requires grad, where nothing else could tell (the runtime module's
docstring: a marked object, no input that requires grad, no global module hook). Measured (CPU,
one thread, a shared 2-core machine under load): one DQN update (batch 32, 4-128-128-2 MLPs, Adam)
1.13x CPU time (1395 -> 1233 us; benchmarks/bench_hot_patterns.py); the whole minimalRL DQN run
(8,000 steps, CPU time of the process, medians of 5 interleaved runs, output identical) 8.16 ->
8.01 s, 1.02x over the default rewrite without it: updates are a minority of that run, whose
start-up alone (torch, then torch._dynamo on the first optimizer) is ~3 s.

What is proven statically (:class:`_Proof`), for a name ``N`` bound once in a function to a
network built right there:

* the network is fresh, so no other network shares its parameters: a ``torch.nn`` layer
  (its arguments cannot hold a module), a ``Sequential``/``ModuleList`` of such, or an instance
  of a class of this file whose only base is ``nn.Module``, with no class attributes, whose
  ``__init__`` only calls ``super().__init__()`` and sets ``self.x`` to fresh layers or constants,
  whose methods set nothing on ``self`` afterwards, read no module-level name but imports and
  constants (a shared encoder held in a global would lose its gradient) and register no hook;
* every use of ``N`` is a forward call, ``N.load_state_dict(...)`` / ``N.eval()`` / ``N.train()`` /
  ``N.to(device)`` (and ``cpu``/``cuda``/``float``/``double``: the same object) as a statement,
  ``N.state_dict()``, or an argument of a function of this file whose parameter is used the same
  way (followed there). ``N.parameters()``, any other attribute, storing ``N`` or
  passing it to other code, and reads of it from nested functions are refused: its parameters,
  and so their gradients, are reachable through nothing else;
* each forward's output is followed (:class:`.flow.Flow`, ``backward()`` allowed): refused where
  it or an alias or view of it is changed in place (a leaf that requires grad raises there:
  ``x *= d``, ``torch.relu_(x)``, ``inplace=True``, ``out=x``), where ``.grad``/``.grad_fn``/
  ``.is_leaf`` and other autograd state is read, where it is stored, returned or passed to code
  whose effects are unknown, or where it reaches a backward that may run twice through it (the
  original raises "backward through the graph a second time", the cut leaf does not).

A function reached through an argument can be called by another file with another network: the
mark is checked at run time, so only the object built at the proven site has its graph cut.
Forwards already under ``no_grad``/``inference_mode`` and code kept as another rewrite's fallback
are not sites. Look-alikes left alone: the trained network (``q.parameters()`` goes to an
optimizer), a target built by ``copy.deepcopy``, held in ``self.target`` or at module level.
"""
from __future__ import annotations

import ast
import builtins
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from scalebox_cst.report import EXACT, REWRITTEN, SKIPPED, Site

from ..base import FileContext, Transform
from ..analysis.astwalk import own_nodes
from ..analysis.statements import ast_guarded, ast_statements
from .callees import may_hold_network
from .flow import Flow, _reads_free
from .target_cut_examples import EXAMPLES

ID = "hot.target_graph_cut"
MARK = "scalebox_cst.runtime.hot_target.grads_unread"
FORWARD = "scalebox_cst.runtime.hot_target.target_forward"

#: torch.nn layers whose constructor arguments are sizes and flags (a module given there raises)
LEAF_LAYERS = frozenset("""
    Linear Bilinear Conv1d Conv2d Conv3d ConvTranspose1d ConvTranspose2d ReLU ReLU6 Tanh Sigmoid
    Softmax LogSoftmax Softplus ELU SELU GELU SiLU Mish LeakyReLU Hardtanh Identity Flatten Dropout
    LayerNorm BatchNorm1d BatchNorm2d GroupNorm Embedding LSTM GRU RNN MaxPool2d AvgPool2d
    """.split())
CONTAINERS = frozenset({"Sequential", "ModuleList"})
#: methods of the network allowed as statements (they read no gradient and hand out no parameter)
STATEMENT_METHODS = frozenset({"load_state_dict", "eval", "train", "to", "cpu", "cuda", "float", "double"})
_GRAD_MODES = frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad"})
_BUILTINS = frozenset(dir(builtins))
_MAX_DEPTH = 4


class _Proof:
    """Which networks of one module are fresh and used only for forwards; their forward calls."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.imports = ctx.imports
        self.tree = ctx.tree
        self.functions: Dict[str, ast.FunctionDef] = {}
        self.classes: Dict[str, ast.ClassDef] = {}
        self.constants: Set[str] = set()
        assigned: Dict[str, int] = {}
        for st in self.tree.body:
            if isinstance(st, ast.FunctionDef):
                self.functions[st.name] = st
            elif isinstance(st, ast.ClassDef):
                self.classes[st.name] = st
            elif isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) \
                    and _constant(st.value):
                self.constants.add(st.targets[0].id)
        for node in ast.walk(self.tree):  # a "constant" rebound anywhere (global x; x = ...) is not one
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                assigned[node.id] = assigned.get(node.id, 0) + 1
        self.constants = {n for n in self.constants if assigned.get(n) == 1}
        self._checking: Set[str] = set()
        self.imported = set(ctx.imports.aliases)  # names bound by imports only (not reassigned)
        self.parents: Dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node

    # ------------------------------------------------------------------ fresh networks

    def network_ctor(self, value: ast.Call) -> bool:
        """Whether ``value`` builds a module (a torch.nn class or a class of this file)."""
        return _network_ctor(value, self.imports, self.classes)

    def fresh(self, value: ast.expr) -> Optional[str]:
        """Why the network ``value`` builds may share parameters with another, or None (fresh)."""
        if not isinstance(value, ast.Call):
            return "not built by a constructor call"
        qual = self.imports.qualify(value.func) or ""
        if qual.startswith("torch.nn.") and qual.count(".") == 2:
            layer = qual.rsplit(".", 1)[1]
            if layer in LEAF_LAYERS:
                if any(k.arg is None or k.arg.startswith("_") for k in value.keywords):
                    return f"nn.{layer} with **kwargs or a private argument"
                return None
            if layer in CONTAINERS:
                parts = list(value.args)
                if layer == "ModuleList" and len(parts) == 1 and isinstance(parts[0], ast.List):
                    parts = list(parts[0].elts)
                if value.keywords or any(isinstance(p, ast.Starred) for p in parts):
                    return f"nn.{layer} with unpacked or keyword arguments"
                for p in parts:
                    why = self.fresh(p)
                    if why:
                        return f"nn.{layer} holds a module that is {why}"
                return None
            return f"nn.{layer} is not a layer known to take sizes only"
        if isinstance(value.func, ast.Name) and value.func.id in self.classes:
            return self.class_problem(self.classes[value.func.id])
        return f"{ast.unparse(value.func)}(...) is not a torch.nn layer or a class of this file"

    def class_problem(self, cls: ast.ClassDef) -> Optional[str]:
        name = cls.name
        if name in self._checking:
            return f"class {name} builds itself"
        self._checking.add(name)
        try:
            return self._class_problem(cls)
        finally:
            self._checking.discard(name)

    def _class_problem(self, cls: ast.ClassDef) -> Optional[str]:
        name = cls.name
        if cls.decorator_list or cls.keywords or len(cls.bases) != 1 or self.imports.qualify(cls.bases[0]) != "torch.nn.Module":
            return f"class {name} does not derive from nn.Module alone"
        for st in cls.body:
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
                continue
            if not isinstance(st, ast.FunctionDef) or st.decorator_list:
                return f"class {name} has class attributes (shared by its instances)"
            if st.name in ("__call__", "__getattr__", "__setattr__", "__getattribute__", "_call_impl", "__new__"):
                return f"class {name} defines {st.name}"
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            local = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
            local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            for node in ast.walk(fn):
                if isinstance(node, (ast.Global, ast.Nonlocal, ast.Lambda)) or (
                        isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node is not fn):
                    return f"{name}.{fn.name} holds a {type(node).__name__}"
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in local \
                        and node.id not in self.imported and node.id not in self.constants and node.id != name \
                        and not (node.id in _BUILTINS and node.id not in ("setattr", "globals", "vars", "exec", "eval")):
                    return f"{name}.{fn.name} reads `{node.id}` from outside (it could hold a shared module)"
                if isinstance(node, ast.Attribute) and node.attr.startswith("register_"):
                    return f"{name}.{fn.name} registers a hook ({node.attr})"
            if fn.name == "__init__":
                for st in fn.body:
                    why = self._init_statement(st)
                    if why:
                        return f"{name}.__init__ {why}"
            elif any(isinstance(t, (ast.Attribute, ast.Subscript)) and _rooted_at_self(t)
                     for node in ast.walk(fn) for t in _store_targets(node)):
                return f"{name}.{fn.name} sets an attribute of self"
        return None

    def _init_statement(self, st: ast.stmt) -> Optional[str]:
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
            return None
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and isinstance(st.value.func, ast.Attribute) \
                and st.value.func.attr == "__init__":
            owner = st.value.func.value
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                return None
            if self.imports.qualify(owner) == "torch.nn.Module":
                return None
        if isinstance(st, ast.Assign) and len(st.targets) == 1:
            t = st.targets[0]
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                if _constant(st.value):
                    return None
                why = self.fresh(st.value)
                return None if why is None else f"sets self.{t.attr} to something {why}"
        return f"line {st.lineno} does more than build fresh layers and constants"

    # ------------------------------------------------------------------ uses

    def uses(self, name: str, scope: ast.FunctionDef, calls: List[Tuple[ast.Call, ast.FunctionDef]],
             depth: int = 0, seen: Optional[Set[Tuple[int, str]]] = None) -> Optional[str]:
        """Why the object ``name`` holds in ``scope`` may have its gradients read, or None; its
        forward calls (here and in the functions it is passed to) are added to ``calls``."""
        seen = set() if seen is None else seen
        if (id(scope), name) in seen:
            return None
        seen.add((id(scope), name))
        if depth > _MAX_DEPTH:
            return "passed too deep to follow"
        problem: Optional[str] = None  # scope-wide; the loads below are still visited (their forwards)
        for node in ast.walk(scope):
            if isinstance(node, ast.Name) and node.id in ("locals", "vars", "eval", "exec", "globals"):
                problem = problem or f"{scope.name}() calls {node.id}(), which can reach `{name}`"
            if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
                problem = problem or f"`{name}` is declared {type(node).__name__.lower()}"
            if node is not scope and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)) \
                    and _reads_free(node, name):
                problem = problem or f"`{name}` is read by a nested {type(node).__name__}"
        problems: List[str] = []  # every load is visited: the forwards are gathered even when refused
        for node in own_nodes(scope):
            if not (isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load)):
                continue
            why = self._use(name, node, scope, calls, depth, seen)
            if why:
                problems.append(why)
        return problem or (min(problems, key=len) if problems else None)

    def _use(self, name: str, node: ast.Name, scope: ast.FunctionDef, calls: List[Tuple[ast.Call, ast.FunctionDef]],
             depth: int, seen: Set[Tuple[int, str]]) -> Optional[str]:
        """Why this load of ``name`` may reach its parameters, or None (a forward is added to ``calls``)."""
        p = self.parents.get(node)
        if isinstance(p, ast.Call) and p.func is node:
            calls.append((p, scope))
            return None
        if isinstance(p, ast.Attribute):
            call = self.parents.get(p)
            if isinstance(call, ast.Call) and call.func is p and (
                    p.attr == "state_dict" or (p.attr in STATEMENT_METHODS and isinstance(self.parents.get(call), ast.Expr))):
                return None
            return f"`{name}.{p.attr}` is read (its parameters or gradients could be reached)"
        if isinstance(p, ast.keyword):
            p = self.parents.get(p)
        if isinstance(p, ast.Call) and isinstance(p.func, ast.Name) and p.func.id in self.functions:
            fn = self.functions[p.func.id]
            param = _parameter(fn, p, node)
            if param is None:
                return f"`{name}` is passed to {fn.name}(...) where no plain parameter takes it"
            why = self.uses(param, fn, calls, depth + 1, seen)
            return f"in {fn.name}: {why}" if why else None
        what = f"{ast.unparse(p.func)}(...)" if isinstance(p, ast.Call) else f"a {type(p).__name__}"
        return f"`{name}` is passed to {what}, which could reach its parameters"


#: torch.nn layers that hold no parameters (activations, dropout, pooling, padding, reshaping)
PARAMETERLESS = frozenset({
    "ReLU", "ReLU6", "LeakyReLU", "ELU", "SELU", "CELU", "GELU", "SiLU", "Mish", "Sigmoid", "Tanh",
    "Softmax", "Softmax2d", "LogSoftmax", "Softmin", "Softplus", "Softsign", "Softshrink", "Hardshrink",
    "Hardtanh", "Hardswish", "Hardsigmoid", "Tanhshrink", "Threshold", "GLU", "LogSigmoid",
    "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout",
    "Flatten", "Unflatten", "Identity", "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d",
    "AvgPool3d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "LPPool1d", "LPPool2d", "Upsample", "UpsamplingNearest2d",
    "UpsamplingBilinear2d", "PixelShuffle", "PixelUnshuffle", "ChannelShuffle", "ZeroPad1d", "ZeroPad2d",
    "ZeroPad3d", "ConstantPad1d", "ConstantPad2d", "ConstantPad3d", "ReflectionPad1d", "ReflectionPad2d",
    "ReflectionPad3d", "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d", "CircularPad1d",
    "CircularPad2d", "CircularPad3d", "CosineSimilarity", "PairwiseDistance",
})


def _network_ctor(value: ast.Call, imports, classes) -> bool:
    """Whether ``value`` builds a module (a torch.nn class or a class of this file: ``classes``,
    the names of its top-level classes)."""
    qual = imports.qualify(value.func) or ""
    if qual.startswith("torch.nn.") and not qual.startswith(("torch.nn.functional", "torch.nn.utils", "torch.nn.init")):
        last = qual.rsplit(".", 1)[1]
        # a loss (garage's `qf_loss = nn.MSELoss()`), a parameter or a layer without parameters
        # (Hands-On's `sm = nn.Softmax(dim=1)`: its output's graph is its input's, so the guard
        # fell back at every call) is no network to cut: not a candidate, rather than a refusal
        return not (last.endswith("Loss") or last in ("Parameter", "ParameterList", "ParameterDict")
                    or last in PARAMETERLESS)
    return isinstance(value.func, ast.Name) and value.func.id in classes


def _named_call(st: ast.AST) -> Optional[Tuple[str, ast.Call]]:
    """(name, call) of a ``name = call(...)`` statement: where the proof takes a network's
    construction from; None for any other statement."""
    if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) \
            and isinstance(st.value, ast.Call):
        return st.targets[0].id, st.value
    return None


def _constant(value: ast.expr) -> bool:
    if isinstance(value, ast.Constant):
        return True
    if isinstance(value, ast.UnaryOp):
        return _constant(value.operand)
    if isinstance(value, (ast.List, ast.Tuple)):
        return all(_constant(e) for e in value.elts)
    if isinstance(value, ast.Dict):
        return all(k is not None and _constant(k) and _constant(v) for k, v in zip(value.keys, value.values))
    return False


def _store_targets(node: ast.AST) -> List[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []


def _rooted_at_self(target: ast.expr) -> bool:
    while isinstance(target, (ast.Attribute, ast.Subscript)):
        target = target.value
    return isinstance(target, ast.Name) and target.id == "self"


def _parameter(fn: ast.FunctionDef, call: ast.Call, arg: ast.expr) -> Optional[str]:
    """The parameter of ``fn`` that ``call`` binds ``arg`` to (None where unclear or rebound there)."""
    if fn.decorator_list or any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    positional = [*fn.args.posonlyargs, *fn.args.args]
    name = None
    for i, a in enumerate(call.args):
        if a is arg:
            name = positional[i].arg if i < len(positional) else None
    for k in call.keywords:
        if k.value is arg:
            name = k.arg if k.arg in {a.arg for a in [*fn.args.args, *fn.args.kwonlyargs]} else None
    if name is None:
        return None
    stored = any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, (ast.Store, ast.Del)) for n in own_nodes(fn))
    return None if stored else name


def _bound_once(scope: ast.FunctionDef, name: str) -> bool:
    if any(a.arg == name for a in ast.walk(scope.args) if isinstance(a, ast.arg)):
        return False
    return sum(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, (ast.Store, ast.Del))
               for n in own_nodes(scope)) == 1


class HotTargetGraphCut(Transform):
    id = ID
    version = "3"  # 3: a value passed to a namedtuple of the file is followed through it (hot.flow), not "whose effects are unknown"; 2: a layer without parameters (nn.Softmax...) is no network to cut
    triggers = ("torch",)
    description = "target networks whose gradients nobody reads: their forward's graph is cut at the output"

    EXAMPLES = EXAMPLES

    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        if not may_hold_network(ctx.code, ctx.tree):
            return None, []  # no network is built here
        if "torch" not in ctx.imports.names and not any(v.startswith("torch") for v in ctx.imports.aliases.values()):
            return None, []
        statements, stmt_parents = ast_statements(ctx.tree.body)
        classes = {st.name for st in ctx.tree.body if isinstance(st, ast.ClassDef)}
        built = (_named_call(st) for st in statements)
        if not any(_network_ctor(b[1], ctx.imports, classes) for b in built if b is not None):
            return None, []  # no statement builds a network: no candidate (and no proof to build)
        proof = _Proof(ctx)
        sites: List[Site] = []
        marks: Set[int] = set()
        forwards: Dict[int, str] = {}
        flows: Dict[int, Flow] = {}
        for scope in [n for n in ast.walk(ctx.tree) if isinstance(n, ast.FunctionDef)]:
            for st in own_nodes(scope):
                if not isinstance(st, ast.Assign) or (named := _named_call(st)) is None:
                    continue
                name, value = named
                if not proof.network_ctor(value):
                    continue  # not a network built here: not a candidate at all
                calls: List[Tuple[ast.Call, ast.FunctionDef]] = []
                used = proof.uses(name, scope, calls)  # also gathers the forwards (reported either way)
                why = (proof.fresh(value) or used) if _bound_once(scope, name) else f"`{name}` is bound more than once"
                live = [(c, fn) for c, fn in calls if not self._quiet(c, fn, proof, stmt_parents, ctx)]
                if not live:
                    continue
                if why:
                    if not _trained(scope, name):
                        sites.append(Site(ID, st.lineno, st.end_lineno or st.lineno, SKIPPED,
                                          f"network `{name}`: {why}"))
                    continue
                done = 0
                for call, fn in live:
                    flow = flows.get(id(fn))
                    if flow is None:
                        flow = flows[id(fn)] = Flow(fn, ctx.tree, ctx.imports, True, allow=frozenset({"backward"}))
                    flow.reached = []
                    problem = flow.problem(call) or _backwards_problem(call, flow.reached, fn, proof.parents)
                    if problem:
                        sites.append(Site(ID, call.lineno, call.end_lineno or call.lineno, SKIPPED,
                                          f"forward of `{ast.unparse(call.func)}`: its output {problem}"))
                        continue
                    forwards[id(call)] = name
                    done += 1
                    sites.append(Site(ID, call.lineno, call.end_lineno or call.lineno, REWRITTEN, (
                        f"forward of `{ast.unparse(call.func)}` (built once in {scope.name}(), used only for forwards): "
                        "output cut from its graph where the object is the one built there and no input requires grad "
                        "(graph_cut): no backward through a network whose gradients nobody reads; values bitwise"),
                        EXACT))
                if done:
                    marks.add(id(value))
                    sites.append(Site(ID, st.lineno, st.end_lineno or st.lineno, REWRITTEN,
                                      f"network `{name}` marked where built: fresh, and used only for forwards, "
                                      "load_state_dict/state_dict/eval/train (its parameters' gradients are read nowhere)",
                                      EXACT))
        if not forwards:
            return None, sites
        nodes = {id(n): n for n in ast.walk(ctx.tree) if isinstance(n, ast.expr)}
        lines = ctx.code.splitlines()

        def key(node: ast.expr) -> Tuple[int, int, int, int]:
            def col(line: int, offset: int) -> int:
                return len(lines[line - 1].encode()[:offset].decode(errors="replace"))
            end = node.end_lineno or node.lineno
            return node.lineno, col(node.lineno, node.col_offset), end, col(end, node.end_col_offset or 0)

        want_forward = {key(nodes[i]): i for i in forwards}
        want_mark = {key(nodes[i]) for i in marks}
        mark = ctx.runtime_name(MARK, "_sb_grads_unread")
        forward = ctx.runtime_name(FORWARD, "_sb_target_forward")
        return ctx.module.visit(_Editor(ctx, want_forward, want_mark, mark, forward)), sites

    @staticmethod
    def _quiet(call: ast.Call, fn: ast.FunctionDef, proof: _Proof, stmt_parents, ctx: FileContext) -> bool:
        """A forward with nothing to gain (already under no_grad) or in another rewrite's kept code."""
        if any((ctx.imports.qualify(d.func if isinstance(d, ast.Call) else d) or "") in _GRAD_MODES for d in fn.decorator_list):
            return True
        node: Optional[ast.AST] = call
        stmt = None
        while node is not None and node is not fn:
            if isinstance(node, (ast.With, ast.AsyncWith)) and any(
                    (ctx.imports.qualify(i.context_expr.func if isinstance(i.context_expr, ast.Call) else i.context_expr) or "")
                    in _GRAD_MODES for i in node.items):
                return True
            if stmt is None and isinstance(node, ast.stmt):
                stmt = node
            node = proof.parents.get(node)
        return stmt is not None and ast_guarded(stmt, stmt_parents, ctx.imports)


def _loops(node: ast.AST, fn: ast.FunctionDef, parents: Dict[ast.AST, ast.AST]) -> Set[int]:
    """The loops of ``fn`` whose body or test holds ``node``."""
    found: Set[int] = set()
    at: Optional[ast.AST] = node
    while at is not fn and at is not None:
        up = parents.get(at)
        if isinstance(up, (ast.For, ast.AsyncFor, ast.While)) and at not in up.orelse and at is not getattr(up, "iter", None):
            found.add(id(up))
        at = up
    return found


def _backwards_problem(call: ast.Call, reached: List[ast.Call], fn: ast.FunctionDef,
                       parents: Dict[ast.AST, ast.AST]) -> Optional[str]:
    """Why a backward the output reaches may run twice through its graph, or None. The original
    then raises ('backward through the graph a second time': the target's saved tensors are
    freed), the cut output does not: refused unless the output reaches one backward call, run at
    most once per forward (in no loop the forward is outside)."""
    if len(reached) > 1:
        lines = ", ".join(str(r.lineno) for r in reached)
        return f"reaches more than one backward (lines {lines}): a second one through it raises, not once cut"
    if reached and not _loops(reached[0], fn, parents) <= _loops(call, fn, parents):
        return (f"reaches a backward (line {reached[0].lineno}) in a loop the forward is outside: "
                "a second one through it raises, not once cut")
    return None


def _trained(scope: ast.FunctionDef, name: str) -> bool:
    """Whether ``scope`` hands out ``name``'s parameters (a trained or inspected network, not a
    target: refused without a report, or every model of every file would carry one)."""
    return any(isinstance(n, ast.Attribute) and n.attr in ("parameters", "named_parameters")
               and isinstance(n.value, ast.Name) and n.value.id == name for n in ast.walk(scope))


class _Editor(cst.CSTTransformer):
    def __init__(self, ctx: FileContext, forwards: Dict[Tuple[int, int, int, int], int], marks: Set[Tuple[int, int, int, int]],
                 mark: str, forward: str) -> None:
        super().__init__()
        self.ctx, self.forwards, self.marks, self.mark, self.forward = ctx, forwards, marks, mark, forward

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        pos = self.ctx.positions[original]
        at = (pos.start.line, pos.start.column, pos.end.line, pos.end.column)
        space = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        if at in self.forwards:
            args = [cst.Arg(updated.func, comma=space if updated.args else cst.MaybeSentinel.DEFAULT), *updated.args]
            return updated.with_changes(func=cst.Name(self.forward), args=args)
        if at in self.marks:
            return cst.Call(func=cst.Name(self.mark), args=[cst.Arg(updated)])
        return updated
