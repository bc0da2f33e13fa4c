"""``accelerate.compile`` (opt in: ``[accelerate] level = "reassociated"``, ``scalebox rewrite --fast``):
the forward methods of a file's ``nn.Module`` classes run through ``torch.compile``, guarded.

Where the time of a small-network RL script goes (the policy forward in the rollout, the loss
forward and its backward in the update), one compiled graph replaces tens of small kernels and,
on CUDA, their launches (CUDA graphs, as LeanRL does by hand). A method is decorated with
``scalebox_cst.runtime.compiled.compiled`` (the run-time guard: a compile failure, a graph break
or a recompile storm runs it eager, reported) when it is provably one static graph:

* a method of a class deriving from ``torch.nn.Module``: ``forward`` of a class the file
  builds, or another method called inside a loop (``agent.get_action_and_value(obs)`` in the
  rollout or the minibatch loop; not a loop of ``__init__``, which runs once per object) that does not override one of nn.Module's own methods
  (``parameters``, ``state_dict``, ``to``, ``train``...); undecorated, no generator, no nested
  function or class;
* no host sync in its body (``.item()``, ``.cpu()``, ``.numpy()``, ``.tolist()``, ``print``,
  ``float()``/``int()``/``bool()`` of a value, numpy calls but of literals: ``np.log(2)`` is a constant);
* no data-dependent control flow: every ``if``/``while``/conditional expression/``assert`` tests
  only values fixed per graph, which dynamo guards on: ``name is None`` on a parameter (CleanRL's
  ``if action is None``), a flag parameter (a ``True``/``False`` default or a ``bool``
  annotation: SAC actors' ``if deterministic:``), ``self.training``, a setting fixed at
  construction (an attribute only ``__init__`` sets, from a literal or such a parameter:
  ``if not self.use_lstm:``), a module constant (``DETERMINISTIC = False``), ``isinstance``,
  ``x.is_cuda``, comparisons of the input's rank and sizes (``x.dim() == 2``) or of
  settings, and ``not``/``and``/``or`` of these;
  no ``for``, ``try`` or ``with`` (a ``no_grad`` block included). An earlier transform's run-time
  guard (``if not soft_update(...)``) is no branch of the user's: what it keeps is judged;
* no data-dependent shapes (``nonzero``, ``unique``, ``masked_select``, boolean-mask indexing);
* it returns a value (a method returning nothing is a stub or works by its effects on state:
  ``reset_parameters``, ``def forward(self): raise NotImplementedError``);
* it computes something from its inputs (a method that only makes new tensors, an RNN's
  ``initial_state`` of ``torch.zeros``, has nothing to fuse);
* it may launch more than one kernel (``kernel_count``: a one-op ``GELU.forward`` or a head of
  one ``nn.Linear`` has nothing to fuse, and a graph costs per call);
* no state kept (assignments to ``self.x`` or globals, in-place ops on attributes, ``.append``
  and the other container mutations on anything but a local: ``self.data.append(item)``);
* every ``torch.distributions`` object it builds has ``validate_args=False`` (validation is a
  host sync per argument; ``hot.distribution_args`` adds it where the arguments are provably
  valid, before this transform runs).

The same method may then run under grad and no grad and at two batch sizes (rollout and
minibatch): one graph each (``dynamic=False``), within the guard's budget. Results: sampled
actions keep eager's random stream (inductor's ``fallback_random``); fused kernels sum in another
order, so values differ in the last bits (``reassociated``). Only for ``--backend cuda``: on CPU
the compiled small-network calls were 1.2x faster but each graph costs seconds to compile and whole
CleanRL runs got slower (docs/accelerate.md has the figures), so CPU sites are reported and left
eager with the figure; NPU has no measured compile backend. A file that calls ``torch.compile``
or ``torch.jit`` itself is left alone. Update functions holding ``backward()`` and
``optimizer.step()`` are not compiled whole (not one graph: ``fullgraph`` would break there);
their forward passes are compiled through the methods they call.
"""
from __future__ import annotations

import ast
from typing import AbstractSet, Dict, List, Optional, Set, Tuple

import libcst as cst

from scalebox_cst.report import REASSOCIATED, REWRITTEN, SKIPPED, Site

from ..base import FileContext, Transform
from . import kernel_count
from .compile_examples import EXAMPLES

ID = "accelerate.compile"
RUNTIME = "scalebox_cst.runtime.compiled.compiled"
LEVELS = ("exact", "reassociated")

_SYNC_METHODS = {"item", "cpu", "numpy", "tolist", "backward", "nonzero", "unique", "masked_select",
                 "argwhere", "unique_consecutive", "repeat_interleave", "data_ptr", "register_hook"}
_SYNC_BUILTINS = {"print", "float", "int", "bool", "input", "open", "breakpoint"}
#: methods of Python containers that change them (no Tensor has one): on ``self.data`` or a
#: parameter, state kept across calls, and dynamo guards on the container (a list's length):
#: minimalRL's ``put_data`` (``self.data.append(item)``) recompiled at every call
_MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem",
             "discard", "appendleft", "extendleft", "popleft"}
_COMPILERS = ("torch.compile", "torch.jit.script", "torch.jit.trace", "torch.cuda.graphs", "torch.cuda.CUDAGraph")
#: nn.Module's own public methods but forward (a test checks the list against torch): an override
#: is bookkeeping that torch, dynamo and the run-time guard call themselves (an overridden
#: ``parameters()`` compiled recursed through the guard's device probe), and its results are the
#: module's own tensors, which a CUDA graph's outputs would replace by copies
MODULE_API = frozenset({
    "add_module", "apply", "bfloat16", "buffers", "children", "compile", "cpu", "cuda", "double", "eval",
    "extra_repr", "float", "get_buffer", "get_extra_state", "get_parameter", "get_submodule", "half", "ipu",
    "load_state_dict", "modules", "mtia", "named_buffers", "named_children", "named_modules", "named_parameters",
    "parameters", "register_backward_hook", "register_buffer", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_full_backward_pre_hook", "register_load_state_dict_post_hook",
    "register_load_state_dict_pre_hook", "register_module", "register_parameter", "register_state_dict_post_hook",
    "register_state_dict_pre_hook", "requires_grad_", "set_extra_state", "set_submodule", "share_memory",
    "state_dict", "to", "to_empty", "train", "type", "xpu", "zero_grad"})


#: why no method is compiled on a backend other than CUDA (measured: docs/accelerate.md)
_NOT_HERE = {
    "cpu": ("on CPU whole CleanRL runs measured 0.50-0.86x (PPO-continuous 13.1 s -> 15.2 s CPU: "
            "calls 1.2x faster, each graph ~2 s to compile)"),
    "npu": "no torch.compile backend was measured on NPU",
}


def _is_none_test(test: ast.expr, params: Set[str]) -> bool:
    return (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Is, ast.IsNot))
            and isinstance(test.left, ast.Name) and test.left.id in params
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None)


def _with_defaults(args: ast.arguments) -> List[Tuple[ast.arg, Optional[ast.expr]]]:
    """Each named parameter with its default (None where it has none)."""
    positional = args.posonlyargs + args.args
    defaults: List[Optional[ast.expr]] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    return list(zip(positional, defaults)) + list(zip(args.kwonlyargs, args.kw_defaults))


def _flag_params(fn: ast.FunctionDef) -> Set[str]:
    """Parameters that are Python flags: a ``True``/``False`` default or a ``bool`` annotation
    (``deterministic: bool = False``). dynamo guards on a flag's value, one graph per value."""
    return {a.arg for a, d in _with_defaults(fn.args)
            if (isinstance(d, ast.Constant) and isinstance(d.value, bool))
            or (isinstance(a.annotation, ast.Name) and a.annotation.id == "bool")}


def _shape_int(node: ast.expr, shapes: AbstractSet[str] = frozenset()) -> bool:
    """An int fixed by the input's shape (``x.dim()``, ``x.ndim``, ``x.shape[1]``, ``x.size(0)``,
    ``len(x.shape)``, a local bound only to such ints (``shapes``: :func:`_shape_names`), and
    ``+ - * // %`` of these) or a literal: a graph compiled with ``dynamic=False`` is specialised
    on it."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int) and not isinstance(node.value, bool)
    if isinstance(node, ast.Name):
        return node.id in shapes
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)):
        return _shape_int(node.left, shapes) and _shape_int(node.right, shapes)
    if isinstance(node, ast.Attribute):
        return node.attr == "ndim"
    if isinstance(node, ast.Subscript):
        return (isinstance(node.value, ast.Attribute) and node.value.attr == "shape"
                and isinstance(node.slice, (ast.Constant, ast.UnaryOp)))
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("dim", "ndimension") and not node.args:
            return True
        if isinstance(func, ast.Attribute) and func.attr == "size" and len(node.args) == 1:
            return _shape_int(node.args[0])
        if isinstance(func, ast.Name) and func.id == "len" and len(node.args) == 1:
            arg = node.args[0]
            return isinstance(arg, ast.Attribute) and arg.attr == "shape"
    return False


def _shape_tuple(node: ast.expr) -> bool:
    """``x.shape``, ``x.size()`` or a slice of ``x.shape`` (``x.shape[-2:]``): a tuple of ints."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Slice) and _shape_tuple(node.value) and isinstance(node.value, ast.Attribute)
    if isinstance(node, ast.Attribute):
        return node.attr == "shape"
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "size" \
        and not node.args and not node.keywords


def _shape_names(fn: ast.FunctionDef, params: AbstractSet[str]) -> Set[str]:
    """Locals of ``fn`` whose every binding is a shape int (``n = x.shape[0]``) or an element of a
    shape unpacked (``b, c, h, w = x.size()``, ``h, w = x.shape[-2:]``), and that are none of
    ``params``: ints a graph is specialised on, like the shapes they come from."""
    stores: Dict[str, int] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            stores[node.id] = stores.get(node.id, 0) + 1
    counted: Dict[str, int] = {}
    for node in ast.walk(fn):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if isinstance(target, ast.Name) and _shape_int(node.value):
            names = [target.id]
        elif isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts) \
                and _shape_tuple(node.value):
            names = [e.id for e in target.elts]  # type: ignore[attr-defined]
        else:
            continue
        for name in names:
            counted[name] = counted.get(name, 0) + 1
    return {name for name, n in counted.items() if stores.get(name) == n and name not in params}


_LITERAL_TYPES = ("bool", "int", "float", "str")


def config_attributes(cls: ast.ClassDef) -> Set[str]:
    """Attributes of ``self`` that hold a setting fixed at construction: every assignment to
    ``self.name`` in the class is a plain one in ``__init__``, of a literal or of an ``__init__``
    parameter with a literal default or a ``bool``/``int``/``float``/``str`` annotation
    (``self.use_lstm = use_lstm`` with ``use_lstm=False``; CORL's ``no_tanh: bool = False``).
    dynamo guards on such a value: one graph per setting."""
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    if init is None:
        return set()
    literal = {a.arg for a, d in _with_defaults(init.args)
               if isinstance(d, ast.Constant)
               or (isinstance(a.annotation, ast.Name) and a.annotation.id in _LITERAL_TYPES)}
    # the targets of __init__'s assignments of a literal or of such a parameter
    plain = {id(t) for a in ast.walk(init) if isinstance(a, ast.Assign) and (
        isinstance(a.value, ast.Constant) or isinstance(a.value, ast.Name) and a.value.id in literal) for t in a.targets}
    good: Set[str] = set()
    bad: Set[str] = set()
    for fn in cls.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                    and isinstance(node.value, ast.Name) and node.value.id == "self":
                (good if fn is init and id(node) in plain else bad).add(node.attr)
    return good - bad


def _submodule_training(node: ast.expr, self_name: Optional[str]) -> bool:
    """``self.<a>.<b>...training``: a submodule's training flag (CORL's AWAC: ``if
    self._mlp.training:``), a Python bool dynamo guards on, as on ``self.training``."""
    if not (isinstance(node, ast.Attribute) and node.attr == "training" and isinstance(node.value, ast.Attribute)):
        return False
    inner: ast.expr = node.value
    while isinstance(inner, ast.Attribute):
        inner = inner.value
    return isinstance(inner, ast.Name) and inner.id == self_name


def _static_test(test: ast.expr, params: Set[str], flags: Set[str], self_name: Optional[str],
                 config: AbstractSet[str] = frozenset(), shapes: AbstractSet[str] = frozenset()) -> bool:
    """A test whose value is fixed for a graph (dynamo guards on it, no graph break): ``x is None``
    on a parameter, a flag parameter (``if deterministic:``), the module's ``self.training`` and
    settings fixed at construction (:func:`config_attributes`), a comparison of shape ints
    (``if x.dim() == 2:``) or of settings, and ``not``/``and``/``or`` of these."""
    def setting(node: ast.expr) -> bool:
        return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
            and node.value.id == self_name and (node.attr == "training" or node.attr in config) \
            or _submodule_training(node, self_name)

    if _is_none_test(test, params):
        return True
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _static_test(test.operand, params, flags, self_name, config, shapes)
    if isinstance(test, ast.BoolOp):
        return all(_static_test(v, params, flags, self_name, config, shapes) for v in test.values)
    if isinstance(test, ast.Name):
        return test.id in flags
    if isinstance(test, ast.Attribute):
        return setting(test) or test.attr in ("is_cuda", "is_cpu")  # the device: guarded
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "isinstance":
        return True  # a type: guarded
    if isinstance(test, ast.Compare):
        operands = [test.left, *test.comparators]
        return all(_shape_int(x, shapes) or setting(x) or isinstance(x, ast.Constant) for x in operands) \
            and not all(isinstance(x, ast.Constant) for x in operands)
    return False


def _constant_args(call: ast.Call) -> bool:
    """Every argument a literal (``np.log(2)`` in spinningup's SAC actor): a constant dynamo folds
    while tracing, no array and no host copy."""
    values = [*call.args, *(k.value for k in call.keywords)]
    return bool(values) and all(
        isinstance(v, ast.Constant) and isinstance(v.value, (int, float)) and not isinstance(v.value, bool)
        or isinstance(v, ast.UnaryOp) and isinstance(v.operand, ast.Constant) for v in values)


def _engine_guard(test: ast.expr, imports) -> bool:
    """``test`` calls one of the engine's run-time guards (an earlier transform's ``if not
    soft_update(...)`` / ``if ... recurrence_ok(...)``, the user's statement kept verbatim in its
    else): not the user's branch, so what it guards is judged instead."""
    return any(isinstance(n, ast.Call) and (imports.qualify(n.func) or "").startswith("scalebox_cst.")
               for n in ast.walk(test))


#: context managers dynamo traces through (grad mode is part of what a graph records)
_GRAD_MODES = frozenset({"torch.no_grad", "torch.enable_grad"})


def _grad_mode_with(node: ast.With, imports) -> bool:
    """``with torch.no_grad():`` (or ``enable_grad``), the user's or the one hot.no_grad put
    around an acting forward: a graph records its grad mode, so it keeps nothing from one graph
    (the minimalRL/PPO ``act`` methods were left eager as "holds a with statement", a statement
    that, for most, an earlier transform had written)."""
    return all(isinstance(item.context_expr, ast.Call) and item.optional_vars is None
               and not item.context_expr.args and not item.context_expr.keywords
               and imports.qualify(item.context_expr.func) in _GRAD_MODES for item in node.items)


_FRESH = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)


def _fresh_locals(fn: ast.FunctionDef) -> Set[str]:
    """Names every assignment in ``fn`` binds to a container made there (``outs = []``), not to
    one that may be kept elsewhere (``buf = self.data``)."""
    fresh: Set[str] = set()
    other: Set[str] = set()
    made: Set[int] = set()  # the targets `name = [...]` (node ids)
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and isinstance(node.value, _FRESH):
            made.update(id(t) for t in node.targets if isinstance(t, ast.Name))
            fresh.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and id(node) not in made:
            other.add(node.id)
    return fresh - other


def _returns_value(fn: ast.FunctionDef) -> bool:
    """Some ``return`` of ``fn`` itself (not of a nested scope) gives a value other than ``None``."""
    stack: List[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return) and node.value is not None \
                and not (isinstance(node.value, ast.Constant) and node.value.value is None):
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))
    return False


def module_constants(tree: ast.Module) -> Set[str]:
    """Module-level names bound once, at module level, to a literal (Popular-RL-Algorithms'
    ``DETERMINISTIC = False``) and declared ``global`` nowhere: dynamo guards on such a global."""
    bound: Dict[str, int] = {}
    literal: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound[node.id] = bound.get(node.id, 0) + 1
        if isinstance(node, ast.Global):
            for name in node.names:
                bound[name] = bound.get(name, 0) + 2
    for st in tree.body:
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) \
                and isinstance(st.value, ast.Constant):
            literal.add(st.targets[0].id)
    return {name for name in literal if bound.get(name) == 1}


def body_problem(fn: ast.FunctionDef, imports, config: AbstractSet[str] = frozenset(),
                 constants: AbstractSet[str] = frozenset()) -> Optional[str]:
    """Why ``fn``'s body may not be one static graph (one breath), or None; ``config``: its class's
    settings fixed at construction (:func:`config_attributes`)."""
    params = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    self_name = fn.args.args[0].arg if fn.args.args else None
    local_names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    flags = (_flag_params(fn) | (set(constants) - params - local_names)) - ({self_name} if self_name else set())
    local = _fresh_locals(fn) - params
    shapes = _shape_names(fn, params)
    for node in ast.walk(fn):
        if node is fn:
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return "defines a function or class inside"
        if isinstance(node, (ast.Yield, ast.YieldFrom, ast.Await)):
            return "is a generator"
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            return "writes a global"
        if isinstance(node, ast.With) and _grad_mode_with(node, imports):
            continue
        if isinstance(node, (ast.For, ast.AsyncFor, ast.Try, ast.With, ast.AsyncWith)):
            return f"holds a {type(node).__name__.lower()} statement"
        if isinstance(node, ast.If) and _engine_guard(node.test, imports):
            continue
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)) \
                and not _static_test(node.test, params, flags, self_name, config, shapes):
            return f"branches on a value at line {node.lineno} (data-dependent control flow)"
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if any(isinstance(sub, (ast.Attribute, ast.Subscript)) for sub in ast.walk(t)):
                    return f"stores into {ast.unparse(t)} (keeps state)"
        if isinstance(node, ast.Subscript):
            index = node.slice
            if any(isinstance(n, ast.Compare) for n in ast.walk(index)):
                return "indexes with a mask (data-dependent shape)"
        if isinstance(node, ast.Call):
            func = node.func
            qual = imports.qualify(func) or ""
            if isinstance(func, ast.Name) and func.id in _SYNC_BUILTINS:
                return f"calls {func.id}() (a host sync)"
            if (qual == "numpy" or qual.startswith("numpy.")) and not _constant_args(node):
                return f"calls {ast.unparse(func)} (numpy: a host copy)"
            if qual.startswith("torch.distributions"):
                va = [k for k in node.keywords if k.arg == "validate_args"]
                if not va or not (isinstance(va[0].value, ast.Constant) and va[0].value.value is False):
                    return f"builds {ast.unparse(func)} with argument validation (a host sync per argument)"
            if qual in ("torch.nonzero", "torch.unique", "torch.masked_select", "torch.argwhere", "torch.where") \
                    and (qual != "torch.where" or len(node.args) == 1):
                return f"calls {ast.unparse(func)} (data-dependent shape)"
            if isinstance(func, ast.Attribute):
                if func.attr in _SYNC_METHODS:
                    return f"calls .{func.attr}() (a host sync or a data-dependent shape)"
                if func.attr in _MUTATORS and not (isinstance(func.value, ast.Name) and func.value.id in local):
                    return f"changes {ast.unparse(func.value)} (.{func.attr}: keeps state)"
                if func.attr.endswith("_") and not func.attr.endswith("__"):
                    base = func.value
                    if not (isinstance(base, ast.Name) and base.id != self_name):
                        return f"changes {ast.unparse(base)} in place (.{func.attr})"
    if not _returns_value(fn):
        # ElegantRL's ``reset_parameters`` (``self.lin.reset_parameters()``, once per epoch) and
        # ``def forward(self): raise NotImplementedError`` were compiled: a graph with no output
        # is work done for its effects on state (or a stub), and costs a compile for nothing
        return "returns no value (a stub, or a method run for its effects on state)"
    return None


def _module_classes(tree: ast.Module, imports) -> Dict[str, ast.ClassDef]:
    out: Dict[str, ast.ClassDef] = {}
    names = [st.name for st in tree.body if isinstance(st, ast.ClassDef)]
    for st in tree.body:
        if isinstance(st, ast.ClassDef) and names.count(st.name) == 1:
            if any(imports.qualify(b) in ("torch.nn.Module", "torch.nn.modules.module.Module") for b in st.bases):
                out[st.name] = st
    return out


def _loop_calls(tree: ast.Module) -> Set[str]:
    """Attribute names called (``x.name(...)``) inside a ``for``/``while`` body anywhere but in an
    ``__init__``: a loop there runs once per object built (dreamerv3-torch's ``calc_same_pad``,
    integer maths per layer, was compiled: a trace per shape at construction, for nothing)."""
    building = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                and f.name == "__init__" for n in ast.walk(f)}
    out: Set[str] = set()
    for loop in ast.walk(tree):
        if isinstance(loop, (ast.For, ast.AsyncFor, ast.While)) and id(loop) not in building:
            for stmt in loop.body:
                for node in ast.walk(stmt):
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                        out.add(node.func.attr)
    return out


class _Decorate(cst.CSTTransformer):
    """Adds the decorator to ``def name`` directly in module-level ``class C`` (the path of
    enclosing classes and functions is tracked: a same-named class inside a function is another)."""

    def __init__(self, wanted: Dict[Tuple[str, str], str]) -> None:
        self.wanted = wanted
        self.path: List[str] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.path.append("class " + node.name.value)

    def leave_ClassDef(self, original, updated):
        self.path.pop()
        return updated

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.path.append("def " + node.name.value)

    def leave_FunctionDef(self, original, updated):
        self.path.pop()
        if len(self.path) != 1 or not self.path[0].startswith("class "):
            return updated
        text = self.wanted.get((self.path[0][len("class "):], updated.name.value))
        if text is None:
            return updated
        return updated.with_changes(decorators=[*updated.decorators, cst.Decorator(cst.parse_expression(text))])


class AccelerateCompile(Transform):
    id = ID
    version = "14"  # 14: a submodule's training flag (self._mlp.training) is fixed per graph; 13: locals bound only to shape ints (h, w = x.shape[-2:]) and their arithmetic are fixed per graph; 12: a with torch.no_grad()/enable_grad() block is no reason to stay eager; 2: overrides of nn.Module's own methods (parameters, state_dict...) left eager; 3: container mutations (self.data.append) left eager; 4: a call in a loop of __init__ makes no method hot; 5: a method returning no value left eager; 6: a method of one kernel at most left eager; 7: tests fixed per graph (flag parameters, self.training, the input's rank and sizes) compiled; 8: kernels counted over the arm of an if/else that runs, views of a call's result none; 9: numpy of literals (np.log(2)) is a constant, not a host copy; 10: a method that only makes new tensors (initial_state) left eager; 11: module constants, isinstance and is_cuda tests fixed per graph
    triggers = ("Module",)
    description = "opt-in (level reassociated): forward methods of nn.Module classes run through a guarded torch.compile"

    EXAMPLES = EXAMPLES
    options_section = "accelerate"

    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        if ctx.option("accelerate", "level", "exact") != "reassociated":
            return None, []
        tree, imports = ctx.tree, ctx.imports
        classes = _module_classes(tree, imports)
        if not classes:
            return None, []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Call, ast.Attribute)):
                qual = imports.qualify(node.func if isinstance(node, ast.Call) else node) or ""
                if qual.startswith(_COMPILERS):
                    return None, [Site(ID, node.lineno, node.end_lineno or node.lineno, SKIPPED,
                                       f"the file compiles code itself ({qual}): left to it")]
        built = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        looped = _loop_calls(tree)
        constants = module_constants(tree)
        sites: List[Site] = []
        wanted: Dict[Tuple[str, str], str] = {}
        known: Dict[str, Dict[str, int]] = {}

        settings: Dict[str, Set[str]] = {}

        def layers_of(cname: str) -> Dict[str, int]:
            if cname not in known:
                known[cname] = kernel_count.layers(classes[cname], imports)
            return known[cname]

        def settings_of(cname: str) -> Set[str]:  # once per class, not per method judged
            if cname not in settings:
                settings[cname] = config_attributes(classes[cname])
            return settings[cname]

        for cname, cls in classes.items():
            defs = [st for st in cls.body if isinstance(st, ast.FunctionDef)]
            for fn in defs:
                if fn.name.startswith("__") or not fn.args.args:
                    continue
                if fn.name == "forward":
                    if cname not in built:
                        continue
                    what = f"{cname}.forward (a module this file builds)"
                elif fn.name in looped:
                    what = f"{cname}.{fn.name} (called in a loop)"
                    if fn.name in MODULE_API:
                        sites.append(Site(ID, fn.lineno, fn.end_lineno or fn.lineno, SKIPPED,
                                          f"{what}: overrides nn.Module.{fn.name} (bookkeeping torch and the guard call "
                                          "themselves; it returns the module's own objects); left eager"))
                        continue
                else:
                    continue
                end = fn.end_lineno or fn.lineno
                if [d.name for d in defs].count(fn.name) > 1:
                    sites.append(Site(ID, fn.lineno, end, SKIPPED, f"{what}: defined twice in its class"))
                    continue
                if fn.decorator_list:
                    sites.append(Site(ID, fn.lineno, end, SKIPPED, f"{what}: already decorated"))
                    continue
                problem = body_problem(fn, imports, settings_of(cname), constants)
                if problem:
                    sites.append(Site(ID, fn.lineno, end, SKIPPED, f"{what}: {problem}; left eager"))
                    continue
                made = kernel_count.only_factories(fn, imports)
                if made is not None:
                    sites.append(Site(ID, fn.lineno, end, SKIPPED, (
                        f"{what}: only makes new tensors ({made}(...)), nothing computed from its inputs to fuse "
                        "(a graph's cost per call would be all it adds); left eager")))
                    continue
                if kernel_count.kernels(fn, layers_of(cname), imports) <= 1:
                    sites.append(Site(ID, fn.lineno, end, SKIPPED, (
                        f"{what}: one kernel at most, nothing to fuse (a graph's cost per call would be "
                        "all it adds); left eager")))
                    continue
                if ctx.backend != "cuda":
                    sites.append(Site(ID, fn.lineno, end, SKIPPED, f"{what}: would compile, but {_NOT_HERE.get(ctx.backend, _NOT_HERE['cpu'])}; left eager"))
                    continue
                where = f"{ctx.path}:{ctx.original_line(fn.lineno)}"
                wanted[(cname, fn.name)] = where
                sites.append(Site(ID, fn.lineno, end, REWRITTEN, (
                    f"{what} runs through torch.compile, guarded (eager on a compile failure, graph break or "
                    "recompile storm): no host sync, data-dependent branch or shape; same random stream"), REASSOCIATED))
        backward = next((n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                         and n.func.attr == "backward" and not n.args), None)
        if backward is not None and (wanted or ctx.backend != "cuda" and sites):
            sites.append(Site(ID, backward.lineno, backward.end_lineno or backward.lineno, SKIPPED,
                              "the update step is not compiled whole (backward() and optimizer.step() end a graph); "
                              "its forwards run compiled through the methods"))
        if not wanted:
            return None, sites
        alias = ctx.runtime_name(RUNTIME, "_sbx_compiled")
        texts = {key: f"{alias}(site={where!r})" for key, where in wanted.items()}
        return ctx.module.visit(_Decorate(texts)), sites
