"""``hot.no_grad``: forward passes whose outputs reach only the environment, a buffer (as numbers)
or logging run under ``with torch.no_grad():``.

Acting in a rollout loop (``a = actor(torch.as_tensor(o)).detach().numpy()``,
``q = net(s).argmax().item()``, ``dist = policy(s); env.step(dist.sample().item())``) records an
autograd graph nobody differentiates: every op saves its inputs and allocates a ``grad_fn``.
Under ``torch.no_grad()`` the forward computes the same values (the same kernels on the same
inputs, bit for bit), so the rewrite is ``exact`` wherever nothing could tell the difference:

* the callee's code is known (:mod:`.callees`): a ``torch.nn`` module or a class/function of
  this file that keeps nothing, reads no autograd state and updates nothing in place;
* what the statement produces reaches no gradient (:mod:`.flow`): followed through every name
  it is bound to, each use ends in ``.item()``/``.detach()``/numpy/an integer result, the
  environment or logging, and none is stored, appended, returned, read elsewhere or asked for
  ``.requires_grad``/``.grad_fn``.

A call of a function of this file that returns only numpy or Python values (``choose_action``
ending in ``.numpy()``) is left alone with that reason: its forwards are decided inside it.

Adjacent statements that qualify share one ``with`` block. Statements already under
``no_grad``/``inference_mode`` (or in a function decorated so) are not candidates.
"""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from scalebox_cst.report import EXACT, REWRITTEN, SKIPPED, Site

from ..base import FileContext, Transform
from ..analysis.astwalk import own_nodes
from ..analysis.rewriting import replace_nodes
from ..analysis.scopes import bound_anywhere
from ..analysis.statements import CstStatements, ast_guarded, ast_statements
from .callees import GRAD_ATTRS, PLAIN_MODULES, Files, may_hold_network
from .flow import RETURNED, Flow
from .no_grad_examples import EXAMPLES
from .param_forwards import CheckedClasses, called_parameter

ID = "hot.no_grad"
RUNTIME = "scalebox_cst.runtime.hot_grad.checked_modules"
_GRAD_MODES = ("torch.no_grad", "torch.inference_mode", "torch.enable_grad", "torch.set_grad_enabled",
               "torch.autograd.no_grad", "torch.autograd.enable_grad", "torch.autograd.grad_mode.no_grad")


def _guard_key(c: "_Candidate") -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """Statements share one ``with`` block only under the same run-time check (or none: then
    both are empty, as ``classes`` are those of ``guards``)."""
    return c.guards, c.classes


class _Candidate:
    def __init__(self, stmt: ast.stmt, reason: str, ok: bool, guards: Tuple[str, ...] = (),
                 classes: Tuple[str, ...] = ()) -> None:
        self.stmt, self.reason, self.ok = stmt, reason, ok
        #: parameters whose modules are checked at run time (:mod:`.param_forwards`), against ``classes``
        self.guards, self.classes = guards, classes


#: a module's methods that are no forward (a call of one of them on an unknown network is no acting)
_MODULE_METHODS = frozenset("""
    to cpu cuda float double half bfloat16 train eval parameters named_parameters buffers named_buffers state_dict
    load_state_dict apply zero_grad modules children named_modules named_children requires_grad_ register_buffer
    register_parameter add_module share_memory type get_submodule
    """.split())
#: calls that move or cast a freshly built module and return it (``Net(...).to(device)``)
_MOVES = frozenset({"to", "cuda", "cpu", "float", "double", "half", "train"})


def _self_attribute(expr: ast.expr) -> bool:
    """``self.X``."""
    return isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self"


def _grad_mode(expr: ast.expr, imports) -> Optional[str]:
    target = expr.func if isinstance(expr, ast.Call) else expr
    qual = imports.qualify(target) or ""
    return qual if qual in _GRAD_MODES else None


_PLAIN_METHODS = frozenset({"numpy", "item", "tolist"})  # a tensor's way out to numpy / Python values
_PLAIN_CASTS = frozenset({"int", "float", "bool", "len", "str", "round"})


def _plain_returns(fn: ast.FunctionDef, imports) -> bool:
    """Whether every value ``fn`` returns is a numpy or Python value (never a tensor)."""
    nodes = list(own_nodes(fn))
    if any(isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await)) for n in nodes):
        return False
    params = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    return all(r.value is None or _plain(r.value, nodes, params, imports, 0) for r in nodes if isinstance(r, ast.Return))


def _plain(expr: ast.expr, nodes: List[ast.AST], params: Set[str], imports, depth: int) -> bool:
    """Whether ``expr`` can only be a numpy or Python value: a constant, ``.numpy()`` /
    ``.item()`` / ``.tolist()`` and any method of such a value, a ``numpy`` function's result, a
    Python cast, a tuple of these, or a local name every assignment of which is one."""
    if isinstance(expr, ast.Constant):
        return True
    if isinstance(expr, (ast.Tuple, ast.List)):
        return all(_plain(e, nodes, params, imports, depth) for e in expr.elts)
    if isinstance(expr, ast.Call):
        func = expr.func
        qual = imports.qualify(func)
        if qual is not None:
            return qual.split(".")[0] == "numpy"
        if isinstance(func, ast.Name):
            return func.id in _PLAIN_CASTS and func.id not in params and \
                not any(isinstance(n, ast.Name) and n.id == func.id and isinstance(n.ctx, ast.Store) for n in nodes)
        if isinstance(func, ast.Attribute):
            return func.attr in _PLAIN_METHODS or _plain(func.value, nodes, params, imports, depth)
        return False
    if isinstance(expr, ast.Name) and expr.id not in params and depth < 4:
        name = expr.id
        assigns = [n for n in nodes if isinstance(n, ast.Assign) and len(n.targets) == 1
                   and isinstance(n.targets[0], ast.Name) and n.targets[0].id == name]
        simple = {id(a.targets[0]) for a in assigns}
        if any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, (ast.Store, ast.Del)) and id(n) not in simple
               or isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names for n in nodes):
            return False  # bound another way too (a loop, a tuple, a walrus, a global)
        return bool(assigns) and all(_plain(a.value, nodes, params, imports, depth + 1) for a in assigns)
    return False


class _Scanner:
    """Finds the statements of a module that call a forward, and decides each."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.tree = ctx.tree
        self.imports = ctx.imports
        self.files = Files(self.tree, self.imports)
        self.checked = CheckedClasses(self.files)
        self.user_samples = any(
            isinstance(st, ast.FunctionDef) and st.name == "sample"
            for cls in self.files.classes.values() for st in cls.body
        )
        self.found: List[_Candidate] = []
        self._flows: Dict[int, Flow] = {}
        self._locals: Dict[int, Set[str]] = {}  # per scope: the names it binds
        self._parameter_reads: Optional[Set[str]] = None  # see _networks
        self._bound_names: Optional[Set[str]] = None  # see _bound

    def scan(self) -> List[_Candidate]:
        try:
            self._block(self.tree.body, self.tree, None, loop=False)
        finally:  # a flow's callback holds this scanner: a cycle keeping the tree until a collection
            self._flows.clear()
        return self.found

    def _block(self, body, scope, cls: Optional[str], loop: bool) -> None:
        for st in body:
            if isinstance(st, ast.ClassDef):
                self._block(st.body, st, st.name, loop=False)
            elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any(_grad_mode(d, self.imports) for d in st.decorator_list):
                    continue
                owner = cls if isinstance(scope, ast.ClassDef) else None
                if owner is not None and st.name in ("forward", "__call__"):
                    continue  # a module's own forward: a callee, judged where it is called
                self._block(st.body, st, owner, loop=False)
            elif isinstance(st, (ast.With, ast.AsyncWith)):
                if any(_grad_mode(item.context_expr, self.imports) for item in st.items):
                    continue
                self._block(st.body, scope, cls, loop)
            elif isinstance(st, (ast.For, ast.AsyncFor, ast.While)):
                self._block(st.body, scope, cls, True)
                self._block(st.orelse, scope, cls, loop)
            elif isinstance(st, ast.If):
                self._block(st.body, scope, cls, loop)
                self._block(st.orelse, scope, cls, loop)
            elif isinstance(st, ast.Try):
                for part in (st.body, *[h.body for h in st.handlers], st.orelse, st.finalbody):
                    self._block(part, scope, cls, loop)
            elif isinstance(st, (ast.Assign, ast.Expr, ast.Return)) and not isinstance(scope, ast.ClassDef):
                if isinstance(scope, ast.Module) and not loop:
                    continue  # runs once: nothing to gain
                self._statement(st, scope, cls)

    def _is_forward(self, node: ast.Call, cls: Optional[str], scope: ast.AST) -> bool:
        """A call of a torch.nn module or of a method of this file's nn.Module classes (whose body
        is checked separately, by :meth:`Files.body_problem`)."""
        if not node.args:
            return False
        if self._guarded(node, scope) is not None:
            return True
        return any(fn is None or self.files.runs_forward(fn, owner) for fn, owner in self.files.resolve(node.func, cls, scope) or ())

    def _label(self, forwards: List[ast.Call], cls: Optional[str], scope: ast.AST) -> str:
        """``forward`` where every call runs a module (torch's, a guarded parameter's, or a
        ``forward``/``__call__`` of the file), else ``call``: ``self.select_action(state)`` and
        ``self.update_model(next_state)`` run forwards inside, they are none themselves."""
        for c in forwards:
            if self._guarded(c, scope) is not None:
                continue
            if any(fn is not None and fn.name not in ("forward", "__call__")
                   for fn, _ in self.files.resolve(c.func, cls, scope) or ()):
                return "call"
        return "forward"

    def _guarded(self, node: ast.Call, scope: ast.AST) -> Optional[str]:
        """The parameter ``node`` calls where its module can be checked at run time against
        classes of this file (:mod:`.param_forwards`); None otherwise."""
        param = called_parameter(node, scope, self.files)
        return param if param is not None and self.checked.passed(scope, param) else None

    def _passes_through(self, node: ast.Call, cls: Optional[str], scope: ast.AST) -> bool:
        """A call whose result may hold its argument but which keeps nothing itself: a torch.nn
        module, or code of this file with no problem (:meth:`Files.body_problem`)."""
        bodies = self.files.resolve(node.func, cls, scope)
        return bool(bodies) and all(fn is None or self.files.body_problem(fn, owner, set()) is None for fn, owner in bodies)

    def _forwards(self, st: ast.stmt, cls: Optional[str], scope: ast.AST) -> List[ast.Call]:
        return [node for node in ast.walk(st) if isinstance(node, ast.Call) and self._is_forward(node, cls, scope)]

    def _statement(self, st: ast.stmt, scope, cls: Optional[str]) -> None:
        forwards = self._forwards(st, cls, scope)
        if not forwards:
            return self._unknown_module(st, scope, cls)
        names = f"{self._label(forwards, cls, scope)} of " + ", ".join(sorted({ast.unparse(c.func) for c in forwards}))
        for node in ast.walk(st):
            if isinstance(node, (ast.NamedExpr, ast.Lambda, ast.Yield, ast.YieldFrom, ast.Await)):
                return self._skip(st, f"{names}: the statement holds a {type(node).__name__}")
            if isinstance(node, ast.keyword) and node.arg == "requires_grad":
                return self._skip(st, f"{names}: the statement creates a tensor with requires_grad")
            if isinstance(node, ast.Attribute) and node.attr in GRAD_ATTRS:
                return self._skip(st, f"{names}: the statement reads autograd state (.{node.attr})")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.endswith("_") \
                    and not node.func.attr.endswith("__"):
                return self._skip(st, f"{names}: the statement changes {ast.unparse(node.func.value)} in place "
                                      f"(.{node.func.attr}: on a parameter it raises with grad, not under no_grad)")
        local = self._locals.get(id(scope))
        if local is None:  # once per scope: per forward statement it made a long function quadratic
            local = {n.id for n in ast.walk(scope) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                local |= {a.arg for a in ast.walk(scope.args) if isinstance(a, ast.arg)}
            self._locals[id(scope)] = local
        seen: Set[str] = set()
        guards: Set[str] = set()
        for node in ast.walk(st):
            if isinstance(node, ast.Call):
                param = self._guarded(node, scope)
                if param is not None:
                    guards.add(param)
                    continue
                problem = self.files._call_problem(node, scope, cls, local, "the statement", seen)
                if problem:
                    # a forward that is trained on (its output reaches .backward()) is no candidate
                    # whatever its callee: a reason about the callee's code read as if seeing it
                    # would have put the training forward under no_grad
                    trained = self._trained(forwards, scope, cls)
                    return self._skip(st, f"{names}: {trained or problem}")
        flow = self._flow(scope, cls)
        for call in forwards:
            problem = flow.problem(call, prefer_return=True)
            if problem:
                if RETURNED in problem:
                    return None  # a helper returning its forward: the caller is where to act
                plain = self._returns_no_tensor(forwards, cls, scope)
                if plain is not None:  # where the output goes cannot matter: say why instead
                    return self._skip(st, f"{names}: {plain}")
                return self._skip(st, f"{names}: its output {problem}")
        ends = ", ".join(sorted(flow.ends)) or "nothing"
        classes = tuple(dict.fromkeys(c for g in sorted(guards) for c in self.checked.passed(scope, g)))
        where = ""
        if guards:
            shown = ", ".join(classes[:3]) + (", ..." if len(classes) > 3 else "")
            where = f" where {' and '.join(f'`{g}`' for g in sorted(guards))} is a {shown} (checked at run time, else as written)"
        self.found.append(_Candidate(st, (
            f"{names} runs under torch.no_grad(){where}: its outputs end in {ends} and reach no "
            "gradient (no graph recorded; same values bit for bit)"), True, tuple(sorted(guards)), classes))

    def _unknown_module(self, st: ast.stmt, scope, cls: Optional[str]) -> None:
        """A statement acting with a network whose class arrives as a parameter
        (ericyangyu/PPO-for-Beginners: ``self.actor = policy_class(obs_dim, act_dim)`` in
        ``__init__``, ``mean = self.actor(obs)`` in ``get_action``) was no forward to the scan
        and got no site: a user saw the acting line hot in ``scalebox profile`` with no word of
        why it kept its graph. Where its output reaches no gradient (it would have been
        rewritten, were the class known), the skip says what is not known."""
        unknown = [(node, why) for node in ast.walk(st) if isinstance(node, ast.Call)
                   for why in [self._built_by_parameter(node, cls) or self._built_by_import(node, cls)] if why]
        if not unknown:
            return None
        label = "forward" if all(_self_attribute(c.func) or isinstance(c.func, ast.Attribute) and c.func.attr == "forward"
                                 for c, _ in unknown) else "call"
        names = f"{label} of " + ", ".join(sorted({ast.unparse(c.func) for c, _ in unknown}))
        flow = self._flow(scope, cls)
        for call, _ in unknown:
            if flow.problem(call):
                return None  # trained, returned or kept: no candidate whatever its class
        return self._skip(st, f"{names}: {unknown[0][1]}")

    def _built_by_parameter(self, node: ast.Call, cls: Optional[str]) -> Optional[str]:
        """Why ``self.X(...)`` runs unknown code where ``self.X`` is a network (the file passes
        ``self.X.parameters()`` somewhere) built only by calling a parameter of the method that
        builds it; None otherwise."""
        func = node.func
        if not (node.args and cls is not None and isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name) and func.value.id == "self"):
            return None
        owner = next((k for k in self.files.lineage(cls) if self.files.values.get(f"{k}.self.{func.attr}")), None)
        if owner is None:
            return None
        values = self.files.values[f"{owner}.self.{func.attr}"]
        if len(values) != 1 or not (isinstance(values[0], ast.Call) and isinstance(values[0].func, ast.Name)):
            return None
        value = values[0]
        method = self.files.method_holding(owner, value)
        if method is None or value.func.id not in {a.arg for a in ast.walk(method.args) if isinstance(a, ast.arg)}:
            return None
        if func.attr not in self._networks():
            return None
        return (f"`self.{func.attr}` is built by `{value.func.id}` (line {value.lineno}), a parameter of "
                f"`{method.name}`: what its forward runs is not known here")

    def _built_by_import(self, node: ast.Call, cls: Optional[str]) -> Optional[str]:
        """Why ``self.X(...)`` or ``self.X.method(...)`` runs unknown code where ``self.X`` is a
        network (the file passes ``self.X.parameters()`` somewhere) whose every value is made by a
        class imported from another module (``from model import GaussianPolicy``, or a name only a
        star import can bind), optionally moved (``.to(self.device)``); None otherwise.
        pranz24/pytorch-soft-actor-critic acts with ``self.policy.sample(state)`` and
        dongminlee94/deep_rl with ``self.policy(torch.Tensor(obs).to(self.device))``, each
        class in a file of its own: no site, while ``scalebox profile`` showed the forward hot."""
        func = node.func
        if not (node.args and cls is not None and isinstance(func, ast.Attribute)):
            return None
        target: ast.expr = func
        what = "forward"
        if not _self_attribute(target):
            target, what = func.value, "forward" if func.attr == "forward" else f"`{func.attr}`"
            if not _self_attribute(target) or func.attr in _MODULE_METHODS:
                return None
        assert isinstance(target, ast.Attribute)
        if target.attr not in self._networks():
            return None
        owner = next((k for k in self.files.lineage(cls) if self.files.values.get(f"{k}.self.{target.attr}")), None)
        if owner is None:
            return None
        origins: Dict[str, List[str]] = {}  # where from -> the classes named from there
        for value in self.files.values[f"{owner}.self.{target.attr}"]:
            while (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                   and value.func.attr in _MOVES and isinstance(value.func.value, ast.Call)):
                value = value.func.value
            origin = self._imported_class(value.func) if isinstance(value, ast.Call) else None
            if origin is None:
                return None
            origins.setdefault(origin, []).append(f"`{ast.unparse(value.func)}` (line {value.lineno})")
        built = "; or ".join(f"{' or '.join(dict.fromkeys(names))}, {origin}" for origin, names in origins.items())
        return f"`self.{target.attr}` is built by {built}: what its {what} runs is not known in this file"

    def _imported_class(self, expr: ast.expr) -> Optional[str]:
        """Where a class named by ``expr`` comes from when another module of the user's defines it:
        ``imported from `model``` (not torch's), ``bound by a star import (`agents.common.networks`)``
        (a name nothing in this file binds); None otherwise."""
        qual = self.imports.qualify(expr)
        if qual is not None:
            root = qual.split(".")[0]
            if root in ("torch", "numpy") or "." not in qual:
                return None
            return f"imported from `{qual.rsplit('.', 1)[0]}`"
        if not (isinstance(expr, ast.Name) and expr.id[:1].isupper()) or expr.id in self._bound():
            return None
        stars = [n.module or "." * n.level for n in ast.walk(self.tree) if isinstance(n, ast.ImportFrom)
                 and any(a.name == "*" for a in n.names) and (n.module or "").split(".")[0] not in PLAIN_MODULES]
        if not stars:
            return None
        named = [f"`{m}`" for m in dict.fromkeys(stars)]
        return f"bound by a star import ({', '.join(named[:-1]) + ' or ' if len(named) > 1 else ''}{named[-1]})"

    def _bound(self) -> Set[str]:
        """Every name this file binds itself (assigned, defined, imported by name, a parameter)."""
        if self._bound_names is None:
            self._bound_names = set(self.imports.imported) | bound_anywhere(self.tree)
        return self._bound_names

    def _networks(self) -> Set[str]:
        """The ``X`` of every ``self.X.parameters()`` in the file (a network's sign)."""
        if self._parameter_reads is None:
            self._parameter_reads = {
                n.func.value.attr for n in ast.walk(self.tree)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "parameters"
                and isinstance(n.func.value, ast.Attribute) and isinstance(n.func.value.value, ast.Name)
                and n.func.value.value.id == "self"}
        return self._parameter_reads

    def _flow(self, scope, cls: Optional[str]) -> Flow:
        flow = self._flows.get(id(scope))
        if flow is None:
            flow = self._flows[id(scope)] = Flow(scope, self.tree, self.imports, self.user_samples,
                                                 lambda call: self._passes_through(call, cls, scope))
        flow.ends = set()
        return flow

    def _trained(self, forwards: List[ast.Call], scope, cls: Optional[str]) -> Optional[str]:
        """``its output `loss` (line 9) reads .backward`` where a forward's output is
        differentiated, else None."""
        flow = self._flow(scope, cls)
        for call in forwards:
            problem = flow.problem(call)
            if problem and problem.endswith("reads .backward"):
                return f"its output {problem}"
        return None

    def _returns_no_tensor(self, forwards: List[ast.Call], cls: Optional[str], scope: ast.AST) -> Optional[str]:
        """Why the statement's calls can hand back no tensor, when each runs functions of this file
        that return only numpy or Python values (``choose_action`` ending in ``.numpy()``): then
        no graph leaves the call, whatever the caller does with the value (its forwards are
        decided inside it), and a reason about that use would mislead. None otherwise."""
        named: List[str] = []
        for call in forwards:
            bodies = self.files.resolve(call.func, cls, scope) or [(None, None)]
            for fn, _ in bodies:
                if fn is None or not _plain_returns(fn, self.imports):
                    return None
                named.append(f"`{fn.name}` (line {fn.lineno})")
        return f"{', '.join(dict.fromkeys(named))} returns no tensor (numpy or Python values); its forwards are decided inside it"

    def _skip(self, st: ast.stmt, reason: str) -> None:
        self.found.append(_Candidate(st, reason, False))


class HotNoGrad(Transform):
    id = ID
    version = "14"  # 14: a call of a method or function that runs forwards inside (`self.select_action(s)`, `self.update_model(s)`) reads "call of", not "forward of"; `self.fc = init(self.fc)` (a function of the file handing its argument back: MrSyee's init_layer_uniform) holds the module of the attribute's other values, not "whose code is not in this file"; a forward whose output a helper returns is silent also where the value meets another problem first (pranz24's `sample`: `log_prob -= ...`, then returned; was skipped with "its output `log_prob` is updated in place"); and a forward (or another method, `self.policy.sample(s)`) of `self.X` built by a class imported from another module of the user's (or bound only by a star import) whose output reaches no gradient is reported as skipped with that reason (was no site at all); 13: a forward of `self.X` built by calling a parameter (`self.actor = policy_class(...)`) whose output reaches no gradient is reported as skipped with that reason (was no site at all); 12: a value passed to a namedtuple of the file (`SavedAction(log_prob, value)`) is followed through it, not "whose effects are unknown"; 11: `self.fc = layer(...)` where `layer` is bound to classes (`layer = NoisyLinear` or `nn.Linear`) is followed into each class, not "whose code is not in this file"; 10: a forward of a module given as a parameter (`def iterate_batches(env, net, ...)`) runs under no_grad behind a run-time check that the module is exactly a checked class of the file (param_forwards; runtime.hot_grad), as written otherwise; 9: a call of a method that runs .backward() says "trains: it calls loss.backward() (line N)", not its first unknown call; 8: a called name bound only to torch/numpy functions (`activation = F.relu`) is that function, not "not followed"; 7: `.numpy()` after `.data` of an element of the result (`a, _ = actor(s)`; `a.data.numpy()`) says why `.data` was no end there, not "before .detach()"; 6: a call of a parameter (`net(obs)` in `def iterate_batches(env, net, ...)`) says so, not "whose code is not in this file"; 2: .data of an element of a forward's result (a PackedSequence's) is followed, not an end; 3: the reason names .shape-like reads, index and test uses as ends (was "nothing"); 4: a discarded output reads "end in a discarded expression" (was "end in discarded"); 5: a trained forward (output reaches .backward) says so, not its callee's code
    triggers = ("torch",)
    description = "forward passes whose outputs reach no gradient (acting, logging) run under torch.no_grad()"

    EXAMPLES = EXAMPLES

    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        if not may_hold_network(ctx.code, ctx.tree):
            return None, []  # no call can be a forward
        if "torch" not in ctx.imports.names and not any(v.startswith("torch") for v in ctx.imports.aliases.values()):
            return None, []
        astmts, parents = ast_statements(ctx.tree.body)
        found = [c for c in _Scanner(ctx).scan() if not ast_guarded(c.stmt, parents, ctx.imports)]
        if not found:
            return None, []
        sites: List[Site] = []
        for c in found:
            sites.append(Site(ID, c.stmt.lineno, c.stmt.end_lineno or c.stmt.lineno,
                              REWRITTEN if c.ok else SKIPPED, c.reason, EXACT if c.ok else None))
        chosen = [c.stmt for c in found if c.ok]
        if not chosen:
            return None, sites
        statements = CstStatements(ctx.module_for(chosen))  # only their top-level statements parsed
        if not statements.matches(astmts):
            return None, [s for s in sites if s.action == SKIPPED] + [
                Site(ID, st.lineno, st.end_lineno or st.lineno, SKIPPED, "the module's trees do not pair up") for st in chosen]
        index = {id(st): i for i, st in enumerate(astmts)}
        lines: List[cst.SimpleStatementLine] = []
        guard_of: Dict[cst.CSTNode, _Candidate] = {}
        by_stmt = {id(c.stmt): c for c in found if c.ok}
        for st in chosen:
            small = statements.stmts[index[id(st)]]
            line = statements.parent[small]
            if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
                sites = [s for s in sites if not (s.line == st.lineno and s.action == REWRITTEN)]
                sites.append(Site(ID, st.lineno, st.end_lineno or st.lineno, SKIPPED,
                                  "shares its line with other statements (`a = f(x); b = g(a)`): left alone"))
                continue
            lines.append(line)
            guard_of[line] = by_stmt[id(st)]
        if not lines:
            return None, sites
        torch_no_grad = ctx.imports.local_for("torch.no_grad")
        if torch_no_grad is None:
            ctx.require_import("import torch")
            torch_no_grad = "torch.no_grad"
        replacements: Dict[cst.CSTNode, object] = {}
        chosen_set = set(lines)
        for block in {statements.parent[line] for line in lines}:
            body = list(block.body)
            i = 0
            while i < len(body):
                if body[i] not in chosen_set:
                    i += 1
                    continue
                j = i
                key = _guard_key(guard_of[body[i]])
                while j + 1 < len(body) and body[j + 1] in chosen_set and not body[j + 1].leading_lines \
                        and _guard_key(guard_of[body[j + 1]]) == key:
                    j += 1
                group = body[i:j + 1]
                inner = [group[0].with_changes(leading_lines=())] + group[1:]
                block_with: cst.BaseCompoundStatement = cst.With(
                    items=[cst.WithItem(cst.parse_expression(f"{torch_no_grad}()"))],
                    body=cst.IndentedBlock(body=inner),
                    leading_lines=group[0].leading_lines,
                )
                if key[0]:  # a module given as a parameter: checked at run time, else as written
                    params, classes = key
                    check = ctx.runtime_name(RUNTIME, "_sb_checked_modules")
                    test = cst.parse_expression(f"{check}(({', '.join(classes)},), {', '.join(params)})")
                    block_with = cst.If(
                        test=test, body=cst.IndentedBlock(body=[block_with.with_changes(leading_lines=())]),
                        orelse=cst.Else(body=cst.IndentedBlock(body=[g.deep_clone() for g in inner])),
                        leading_lines=group[0].leading_lines,
                    )
                replacements[group[0]] = block_with
                for rest in group[1:]:
                    replacements[rest] = cst.RemovalSentinel.REMOVE
                i = j + 1
        return replace_nodes(ctx.module, replacements, statements.parent), sites
