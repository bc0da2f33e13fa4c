"""``accelerate.defer_sync`` (opt in: ``[accelerate] level = "reassociated"``, ``scalebox rewrite --fast``):
numbers a loop only logs are read when the loop ends, not once per step.

On CUDA ``loss.item()`` is a host-device sync: the host waits for every queued kernel. CleanRL's
update (``clipfracs += [... .item()]`` per minibatch) and update functions that log
``writer.add_scalar(tag, loss.item(), step)`` per step stall the GPU each time. LeanRL removed
those syncs by hand. This transform rewrites a logging statement inside a loop to
``d.call(sink, ..., d.item(loss), ...)`` (:mod:`scalebox_cst.runtime.deferred`) and wraps the
loop in ``try: ... finally: d.flush()``; the flush reads every kept number with one sync and
makes the calls in their order. It does so only where it is proven that nothing in the loop
reads the number or the sink:

* the statement is ``W.add_scalar(...)`` / ``W.add_scalars(...)`` on a ``SummaryWriter`` the
  same scope builds, or ``L.append(...)`` / ``L.extend([...])`` / ``L += [...]`` on a list the
  scope builds (``[]``/``list()`` only); each ``x.item()`` / ``float(x)`` in it is a whole
  argument or an element of a list/tuple/dict display argument (``loss.item() * 2`` is
  arithmetic on the number: left alone, and the whole sink with it);
* inside the loop every use of the sink's name is such a statement (all calls on it are
  deferred together, so their order is kept); the name is used by no other scope (a function
  that logs to a global writer could interleave; a module's writer used by one function only
  is that function's sink, unless its loop may call it again: the module's code waits while
  the function runs), never aliased
  or passed on except to known readers (``len``, ``np.mean``, ``print``, ...) outside the
  loop; no ``globals()``/``eval``;
* the loop has no ``else``, ``return``, ``yield`` or ``await`` (a reader could run before the
  flush; ``break`` and exceptions go through the ``finally``); it is nested in another loop or
  in a function called in a loop, and steps no environment (``envs.step``): the run's outermost
  loop and a rollout/training loop are never deferred (logs would wait for the end of the run
  or a whole phase, and the kept numbers would pile up): the update's loops are;
* a writer call without ``walltime`` gets ``walltime=d.now()`` (``time.time()`` where the call
  stood): the event keeps the step's wall time, not the flush's;
* a logged tensor changed in place later in the loop (``optimizer.step()`` on a parameter,
  ``loss.mul_()``) keeps its logged value: the runtime keeps a copy made where the ``.item()``
  stood (in stream order, no sync), so no alias analysis is needed.

``print(x.item())`` in a loop is left alone: stdout interleaves with the environment's and
libraries' output, whose order cannot be proven. Values are bitwise the same; only the time the
logs are written changes (after the loop's later prints, and a writer flush sees them later):
that change of side-effect order is why the tier is ``reassociated``. Only for a device backend
(``--backend cuda``/``npu``): on CPU there is no sync to save and the sites are reported with the
measured cost, left as they are (a CPU tensor in a device rewrite is read at once by the runtime).
"""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple, Union

import libcst as cst

from scalebox_cst.report import REASSOCIATED, REWRITTEN, SKIPPED, Site

from ..base import FileContext, Transform
from .defer_sync_examples import EXAMPLES

ID = "accelerate.defer_sync"
RUNTIME = "scalebox_cst.runtime.deferred.Deferred"
WRITERS = {"torch.utils.tensorboard.SummaryWriter", "torch.utils.tensorboard.writer.SummaryWriter",
           "tensorboardX.SummaryWriter", "tensorboardX.writer.SummaryWriter"}
WRITER_METHODS = {"add_scalar", "add_scalars"}
LIST_METHODS = {"append", "extend"}
#: readers that finish with the object (a lazy one, enumerate/zip/iter, could be kept and read in the loop)
_READERS = {"len", "sum", "min", "max", "sorted", "list", "tuple", "print", "str", "repr", "any", "all"}
_READER_MODULES = ("numpy.", "statistics.", "math.")
_INTROSPECTION = {"globals", "locals", "vars", "eval", "exec"}
#: why nothing is deferred for --backend cpu (measured: benchmarks/bench_defer_sync.py)
_CPU = ("on CPU .item() is no device sync (measured: +1.7 us per number through the runtime, "
        "+12 us deferred; a PPO update 0.98-1.00x)")
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_Loop = Union[ast.For, ast.AsyncFor, ast.While]


def _sync_kind(node: ast.AST) -> Optional[str]:
    """``"item"`` for ``x.item()``, ``"float"`` for ``float(x)``, else None."""
    if isinstance(node, ast.Call) and not node.keywords:
        if isinstance(node.func, ast.Attribute) and node.func.attr == "item" and not node.args:
            return "item"
        if isinstance(node.func, ast.Name) and node.func.id == "float" and len(node.args) == 1 \
                and not isinstance(node.args[0], ast.Starred):
            return "float"
    return None


def _has_sync(node: ast.AST) -> bool:
    return any(_sync_kind(n) for n in ast.walk(node))


def _operand(call: ast.Call) -> ast.expr:
    """The tensor a sync call reads: ``x`` of ``x.item()`` / ``float(x)``."""
    if isinstance(call.func, ast.Attribute) and not call.args:
        return call.func.value
    return call.args[0]


class _Index:
    """Parents, scopes and loops of one module's ``ast``."""

    def __init__(self, tree: ast.Module) -> None:
        self.parent: Dict[ast.AST, ast.AST] = {}
        self.scope: Dict[ast.AST, ast.AST] = {}
        stack: List[Tuple[ast.AST, ast.AST]] = [(tree, tree)]
        while stack:
            node, scope = stack.pop()
            self.scope[node] = scope
            inner = node if isinstance(node, _SCOPES) else scope
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
                stack.append((child, inner))
        self.functions: Dict[str, List[ast.AST]] = {}
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(n.name, []).append(n)
        self.loop_calls: Set[str] = set()
        for loop in (n for n in ast.walk(tree) if isinstance(n, _LOOPS)):
            for stmt in loop.body:
                for n in ast.walk(stmt):
                    if isinstance(n, ast.Call):
                        f = n.func
                        self.loop_calls.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")

    def loops(self, node: ast.AST) -> List[_Loop]:
        """Loops of ``node``'s scope whose body holds it, outermost first."""
        out: List[_Loop] = []
        child, scope = node, self.scope[node]
        while child in self.parent and child is not scope:
            up = self.parent[child]
            if isinstance(up, _LOOPS) and child in up.body and self.scope[up] is scope:
                out.append(up)
            if up is scope:
                break
            child = up
        return out[::-1]

    def inside(self, node: ast.AST, loop: ast.AST) -> bool:
        while node in self.parent:
            node = self.parent[node]
            if node is loop:
                return True
        return False


def _introspects(n: ast.AST, index: _Index) -> bool:
    """``globals``/``locals``/``vars``/``eval``/``exec`` by name; ``vars(args)`` reads args' attributes, not a scope."""
    if not (isinstance(n, ast.Name) and n.id in _INTROSPECTION):
        return False
    up = index.parent.get(n)
    return not (n.id == "vars" and isinstance(up, ast.Call) and bool(up.args))


class _Stmt:
    """A logging statement on a sink: ``placeholders`` are the sync calls that become ``d.item``."""

    def __init__(self, node: ast.stmt, sink: str, func_text: str, args: List[ast.expr]) -> None:
        self.node, self.sink, self.func_text, self.args = node, sink, func_text, args
        self.placeholders: List[ast.Call] = []
        self.problem: Optional[str] = None
        self.syncs = any(_has_sync(a) for a in args)
        for arg in args:
            slots = arg.values if isinstance(arg, ast.Dict) else arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]
            if isinstance(arg, ast.Dict) and any(k is None or _has_sync(k) for k in arg.keys):
                self.problem = f"computes with the number ({ast.unparse(arg)})"
            for slot in slots:
                if isinstance(slot, ast.Call) and _sync_kind(slot):
                    if _has_sync(_operand(slot)):
                        self.problem = f"computes with the number ({ast.unparse(slot)})"
                    self.placeholders.append(slot)
                elif isinstance(slot, ast.Starred) or _has_sync(slot):
                    self.problem = f"computes with the number ({ast.unparse(slot)})"


def _statement(node: ast.AST, writers: Set[str], lists: Set[str]) -> Optional[_Stmt]:
    if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id in lists \
            and isinstance(node.op, ast.Add) and isinstance(node.value, ast.List):
        return _Stmt(node, node.target.id, f"{node.target.id}.extend", [node.value])
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return None
    call = node.value
    f = call.func
    if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)):
        return None
    name = f.value.id
    if (name in writers and f.attr in WRITER_METHODS) or (name in lists and f.attr in LIST_METHODS):
        st = _Stmt(node, name, f"{name}.{f.attr}", [*call.args, *(k.value for k in call.keywords)])
        if any(k.arg is None for k in call.keywords):
            st.problem = "passes **kwargs"
        return st
    return None


class _Sinks:
    """Names a scope binds only to a SummaryWriter it builds or to a fresh list."""

    def __init__(self, tree: ast.Module, index: _Index, imports) -> None:
        self.index = index
        self.bindings: Dict[Tuple[ast.AST, str], List[ast.AST]] = {}
        self.declared: Set[str] = set()
        self.uses: Dict[str, List[ast.Name]] = {}
        for n in ast.walk(tree):
            if isinstance(n, (ast.Global, ast.Nonlocal)):
                self.declared.update(n.names)
            elif isinstance(n, ast.Name):
                self.uses.setdefault(n.id, []).append(n)
            elif isinstance(n, ast.arg):
                self.declared.add(n.arg)
        self.borrowed: Set[str] = set()
        self.writers: Dict[ast.AST, Set[str]] = {}
        self.lists: Dict[ast.AST, Set[str]] = {}
        for name, uses in self.uses.items():
            if name in self.declared:
                continue
            scopes = {index.scope[u] for u in uses}
            stores = [u for u in uses if isinstance(u.ctx, ast.Store)]
            if len(scopes) == 2 and tree in scopes and {index.scope[u] for u in stores} == {tree}:
                scopes.discard(tree)  # a module's writer used by one function: that function's sink
                self.borrowed.add(name)
            if len(scopes) != 1 or not isinstance(next(iter(scopes)), (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            scope = scopes.pop()
            kinds = {self._binding(index.parent[u], u, imports) for u in stores}
            if kinds == {"writer"}:
                self.writers.setdefault(scope, set()).add(name)
            elif kinds and kinds <= {"list", "augment"} and "list" in kinds:
                self.lists.setdefault(scope, set()).add(name)

    @staticmethod
    def _binding(stmt: ast.AST, target: ast.Name, imports) -> Optional[str]:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and stmt.targets[0] is target:
            v = stmt.value
            if isinstance(v, ast.Call) and imports.qualify(v.func) in WRITERS:
                return "writer"
            if isinstance(v, ast.List) or (isinstance(v, ast.Call) and isinstance(v.func, ast.Name)
                                           and v.func.id == "list" and not v.args and not v.keywords):
                return "list"
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add) and isinstance(stmt.value, ast.List):
            return "augment"
        return None

    def escape(self, name: str, stmts: Dict[ast.stmt, _Stmt], imports) -> Optional[str]:
        """Where ``name`` is aliased or handed to unknown code, or None."""
        for u in self.uses[name]:
            if isinstance(u.ctx, ast.Store):
                continue
            up = self.index.parent[u]
            if isinstance(up, ast.Attribute):
                owner = self.index.parent[up]
                if (isinstance(owner, ast.Call) and owner.func is up) or self.index.parent.get(owner) in stmts \
                        or owner in stmts:
                    continue
            if isinstance(up, ast.AugAssign) and up in stmts:
                continue
            ret = self.index.parent.get(up) if isinstance(up, ast.Tuple) else up  # return xs, loss.item()
            if isinstance(ret, ast.Return) and isinstance(self.index.scope[u], (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue  # after the loop (a return inside it is refused); the frame ends there
            if isinstance(up, ast.Subscript) and up.value is u:
                continue
            if isinstance(up, ast.comprehension) and up.iter is u and \
                    isinstance(self.index.parent[up], (ast.ListComp, ast.SetComp, ast.DictComp)):
                continue
            if isinstance(up, ast.Call) and u in up.args:
                f = up.func
                if (isinstance(f, ast.Name) and f.id in _READERS) or (imports.qualify(f) or "").startswith(_READER_MODULES):
                    continue
            return f"{name} is aliased or passed on at line {u.lineno} ({ast.unparse(up)[:60]})"
        return None


def _loop_problem(loop: _Loop, index: _Index) -> Optional[str]:
    if loop.orelse:
        return "the loop has an else clause"
    for n in ast.walk(loop):
        if isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom, ast.Await)) and index.scope[n] is index.scope[loop]:
            return f"the loop can {type(n).__name__.lower()} at line {n.lineno} before the flush"
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("step", "reset") \
                and "env" in ast.unparse(n.func.value).lower():
            return f"the loop steps the environment at line {n.lineno} (a training loop's logs stay live)"
    scope = index.scope[loop]
    if index.loops(loop):
        return None
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and scope.name in index.loop_calls:
        return None
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        # a function no loop of this file calls may be the run's main loop (def train(): for ...)
        # or one a library calls per update (tianshou's _update_with_batch): which, it cannot tell
        return (f"the loop is the outermost of {scope.name}(), which no loop in this file calls "
                "(it may be the run's main loop, whose logs would wait for the end of the run)")
    return "the loop is the module's outermost (logs would wait for the end of the run)"


#: calls that read a tensor on the host (``float()`` is left out: of a Python number it reads nothing)
_STEP_SYNCS = {"item", "tolist", "numpy", "cpu"}


def _per_step_sync(loop: _Loop, deferred: Set[int], index: _Index) -> Optional[ast.Call]:
    """A host read ``loop`` still makes on every step once ``deferred`` (node ids) are deferred:
    one outside any ``if``/``match``/``except`` (decision-transformer's progress bar,
    ``pbar.set_description(f"loss {loss.item()}")``), else None. With one left, the GPU waits each
    step anyway, and deferring the others only delays their logs."""
    todo: List[ast.AST] = [*loop.body, *([loop.test] if isinstance(loop, ast.While) else [])]
    found: List[ast.Call] = []
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.If, ast.Match, ast.IfExp, *_SCOPES)):
            continue
        if isinstance(node, ast.Try):
            todo.extend([*node.body, *node.orelse, *node.finalbody])
            continue
        if isinstance(node, _LOOPS):
            heads = [node.iter] if isinstance(node, (ast.For, ast.AsyncFor)) else [node.test]
            todo.extend([*heads, *node.body])
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _STEP_SYNCS \
                and not node.args and not node.keywords and id(node) not in deferred:
            found.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return min(found, key=lambda n: (n.lineno, n.col_offset), default=None)  # the first, to name


def _reenters(loop: _Loop, index: _Index) -> Optional[str]:
    """The name of ``loop``'s function if a call in the loop may reach it again (by name, through the file's
    functions), else None (module code runs once)."""
    scope = index.scope[loop]
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    target = scope.name
    todo = [n for n in ast.walk(loop) if isinstance(n, ast.Call)]
    seen: Set[str] = set()
    while todo:
        f = todo.pop().func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        if name == target:
            return target
        if name is None or name in seen:
            continue
        seen.add(name)
        for fn in index.functions.get(name, ()):
            todo.extend(n for n in ast.walk(fn) if isinstance(n, ast.Call))
    return None


def _sink_problem(name: str, loop: _Loop, sinks: _Sinks, stmts: Dict[ast.stmt, _Stmt], escapes) -> Optional[str]:
    if escapes.get(name):
        return escapes[name]
    if name in sinks.borrowed and (again := _reenters(loop, sinks.index)):
        return f"the loop may call {again} again (a nested call would flush first)"
    for u in sinks.uses[name]:
        if not sinks.index.inside(u, loop) or isinstance(u.ctx, ast.Store):
            continue
        st = next((s for node, s in stmts.items() if s.sink == name and
                   (sinks.index.inside(u, node) or (isinstance(node, ast.AugAssign) and node.target is u))), None)
        if st is None:
            return f"{name} is read inside the loop at line {u.lineno}"
        if st.problem:
            return f"{st.func_text} at line {st.node.lineno} {st.problem}"
    return None


class _Rewrite(cst.CSTTransformer):
    def __init__(self, positions, loops: Dict[Tuple[int, int], Tuple[str, str]],
                 stmts: Dict[Tuple[int, int], Tuple[str, str, bool]], holes: Dict[Tuple[int, int, str], str]) -> None:
        self.positions, self.loops, self.stmts, self.holes = positions, loops, stmts, holes

    def _key(self, node):
        p = self.positions[node].start
        return p.line, p.column

    def leave_Call(self, original, updated):
        f = original.func
        kind = "item" if isinstance(f, cst.Attribute) and f.attr.value == "item" else \
            "float" if isinstance(f, cst.Name) and f.value == "float" else None
        var = self.holes.get((*self._key(original), kind)) if kind else None
        if not kind or not var:
            return updated
        inner = updated.func.value if kind == "item" else updated.args[0].value
        return cst.Call(func=cst.Attribute(cst.Name(var), cst.Name(kind)), args=[cst.Arg(inner)])

    def _call(self, var: str, func: cst.BaseExpression, args) -> cst.Expr:
        head = cst.Arg(func, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) if args else cst.Arg(func)
        return cst.Expr(cst.Call(func=cst.Attribute(cst.Name(var), cst.Name("call")), args=[head, *args]))

    def leave_Expr(self, original, updated):
        hit = self.stmts.get(self._key(original))
        if not hit:
            return updated
        args = list(updated.value.args)
        if hit[2] and args:  # the event keeps the wall time of the step, not of the flush
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            args.append(cst.Arg(cst.parse_expression(f"{hit[0]}.now()"), keyword=cst.Name("walltime"),
                                equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))))
        return self._call(hit[0], updated.value.func, args)

    def leave_AugAssign(self, original, updated):
        hit = self.stmts.get(self._key(original))
        if not hit:
            return updated
        return self._call(hit[0], cst.Attribute(updated.target, cst.Name("extend")), [cst.Arg(updated.value)])

    def _wrap(self, original, updated):
        hit = self.loops.get(self._key(original))
        if not hit:
            return updated
        var, site = hit
        make = cst.parse_statement(f"{var} = {site}\n").with_changes(leading_lines=updated.leading_lines)
        flush = cst.parse_statement(f"{var}.flush()\n")
        body = cst.IndentedBlock([updated.with_changes(leading_lines=())])
        return cst.FlattenSentinel([make, cst.Try(body=body, finalbody=cst.Finally(cst.IndentedBlock([flush])))])

    leave_For = _wrap
    leave_While = _wrap


class AccelerateDeferSync(Transform):
    id = ID
    version = "5"  # 5: the outermost-loop skip of a function says what is known (no loop of the file calls it); 2: a rewritten site spans the loop it wraps (was the logging statement); 3: modules of another array library (jax...) left alone; 4: a loop that still reads a number every step, and float() in a module without torch, left alone
    triggers = (".item()", "float(")
    description = "opt-in (level reassociated): .item() numbers a loop only logs are read when the loop ends"

    EXAMPLES = EXAMPLES
    options_section = "accelerate"

    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        if ctx.option("accelerate", "level", "exact") != "reassociated":
            return None, []
        tree, imports = ctx.tree, ctx.imports
        index = _Index(tree)
        sinks = _Sinks(tree, index, imports)
        stmts: Dict[ast.stmt, _Stmt] = {}
        sites: List[Site] = []
        for node in ast.walk(tree):
            scope = index.scope.get(node, tree)
            st = _statement(node, sinks.writers.get(scope, set()), sinks.lists.get(scope, set()))
            if st is not None and index.loops(node):
                stmts[st.node] = st
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print" \
                    and any(_sync_kind(a) for a in node.args) and index.loops(node):
                sites.append(Site(ID, node.lineno, node.end_lineno or node.lineno, SKIPPED,
                                  "print of a number inside a loop: left as is (stdout interleaves with other output, whose order is kept)"))
        logged = [s for s in stmts.values() if s.syncs]
        if not logged:
            return None, sites
        other = imports.other_framework()
        if other is not None:  # skrl's JAX agents: a jax array's .item(), no torch in the module
            return None, sites + [Site(ID, s.node.lineno, s.node.end_lineno or s.node.lineno, SKIPPED,
                                       f"{s.func_text}: the module imports {other}, not torch: its numbers are no "
                                       "torch tensors to read later (the runtime would import torch into it); left as is")
                                  for s in logged]
        if any(isinstance(n, ast.Name) and n.id == "float" and not isinstance(n.ctx, ast.Load) or
               isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == "float" for n in ast.walk(tree)) \
                or "float" in imports.aliases:
            for st in logged:
                if any(_sync_kind(h) == "float" for h in st.placeholders):
                    st.problem = "calls float(), which the file rebinds"
        if "torch" not in {full.split(".")[0] for full in imports.aliases.values()}:
            for st in logged:  # d3rlpy's float(i == length - 1) in a numpy-only test
                if any(_sync_kind(h) == "float" for h in st.placeholders):
                    st.problem = "calls float() in a module that imports no torch (most likely a Python or numpy number: no sync)"
        if any(_introspects(n, index) for n in ast.walk(tree)):
            return None, sites + [Site(ID, s.node.lineno, s.node.end_lineno or s.node.lineno, SKIPPED,
                                       "the file uses globals()/locals()/vars()/eval/exec: a sink could be read unseen")
                                  for s in logged]
        escapes = {name: sinks.escape(name, stmts, imports) for name in {s.sink for s in stmts.values()}}
        chosen: Dict[ast.stmt, _Loop] = {}
        for node, st in stmts.items():
            problem = None
            for loop in index.loops(node):
                problem = _loop_problem(loop, index) or _sink_problem(st.sink, loop, sinks, stmts, escapes)
                if problem is None:
                    chosen[node] = loop
                    break
            if node not in chosen and st.syncs:
                sites.append(Site(ID, node.lineno, node.end_lineno or node.lineno, SKIPPED,
                                  f"{st.func_text}: {problem}; read at once"))
        deferred = {id(h) for n, st in stmts.items() if n in chosen for h in st.placeholders}
        for loop in {chosen[n] for n, st in stmts.items() if n in chosen and st.placeholders}:
            left = _per_step_sync(loop, deferred, index)
            if left is not None:
                for n in [n for n in chosen if chosen[n] is loop]:
                    del chosen[n]
                    sites.append(Site(ID, n.lineno, n.end_lineno or n.lineno, SKIPPED, (
                        f"{stmts[n].func_text}: the loop still reads a number every step at line {left.lineno} "
                        f"({ast.unparse(left)[:40]}): deferring this one saves no wait; read at once")))
        wrapped = {chosen[n] for n, st in stmts.items() if n in chosen and st.placeholders}
        if not wrapped:
            return None, sites
        if ctx.backend == "cpu":
            return None, sites + [Site(ID, n.lineno, n.end_lineno or n.lineno, SKIPPED, (
                f"{st.func_text}: would be read after the loop, but {_CPU}; left as is")) for n, st in stmts.items()
                if n in chosen and st.placeholders]
        alias = ctx.runtime_name(RUNTIME, "_sbx_Deferred")
        loop_vars: Dict[_Loop, str] = {}
        for loop in sorted(wrapped, key=lambda n: (n.lineno, n.col_offset)):
            loop_vars[loop] = imports.unique_name("_sbx_defer")
        plan_loops: Dict[Tuple[int, int], Tuple[str, str]] = {}
        plan_stmts: Dict[Tuple[int, int], Tuple[str, str, bool]] = {}
        holes: Dict[Tuple[int, int, str], str] = {}
        for loop, var in loop_vars.items():
            where = f"{ctx.path}:{ctx.original_line(loop.lineno)}"
            plan_loops[(loop.lineno, loop.col_offset)] = (var, f"{alias}({where!r})")
        for node, st in stmts.items():
            owner = chosen.get(node)
            if owner is None or owner not in loop_vars:
                continue
            var = loop_vars[owner]
            call = node.value if isinstance(node, ast.Expr) else None  # a W.method(...) / L.method(...) statement
            walltime = isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                and call.func.attr in WRITER_METHODS and len(call.args) < 4 \
                and not any(k.arg == "walltime" for k in call.keywords)
            plan_stmts[(node.lineno, node.col_offset)] = (var, st.func_text, walltime)
            for hole in st.placeholders:
                kind = _sync_kind(hole)  # never None: placeholders are sync calls
                if kind is not None:
                    holes[(hole.lineno, hole.col_offset, kind)] = var
            if st.placeholders:
                what = ", ".join(ast.unparse(h) for h in st.placeholders)[:80]
                # the span is the loop's: the rewrite wraps the whole loop (try/finally, indented)
                sites.append(Site(ID, owner.lineno, owner.end_lineno or owner.lineno, REWRITTEN, (
                    f"{what} (line {node.lineno}) only logged ({st.func_text}): read when the loop at line {owner.lineno} "
                    "ends, one sync instead of one per step; same values (a copy kept), written after the loop's "
                    "other output"), REASSOCIATED))
        out = ctx.module.visit(_Rewrite(ctx.positions, plan_loops, plan_stmts, holes))
        return out, sites
