"""How many kernels a method launches at most, as far as its source tells: ``accelerate.compile``
leaves a method of one kernel or none eager.

A compiled graph pays per call (dynamo's guards, and on CUDA a graph replay that copies its
inputs into static buffers) and saves by fusing kernels and launching them as one. A forward that
is one op (``GELU.forward``: ``F.gelu(x)``; a head of one ``nn.Linear``) or only views
(``Flatten.forward``) has nothing to fuse; the sweep of public code found such methods compiled
(ElegantRL, decision-transformer). Anything the source does not tell (a submodule that is not a
known one-kernel layer, a call of another method or function, a distribution) counts as many.
"""
from __future__ import annotations

import ast
from typing import Dict, Optional

#: more than any method this module calls "small" (a call it cannot see into)
MANY = 1 << 20

#: tensor methods that launch no kernel (views and metadata)
_NO_KERNEL = frozenset({
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "unsqueeze", "squeeze", "permute",
    "transpose", "t", "expand", "expand_as", "narrow", "select", "size", "dim", "unbind", "chunk", "split",
    "detach", "movedim", "swapaxes"})
#: torch.nn layers whose forward is one kernel (or none: Identity, Flatten)
_LAYER_KERNELS = {
    "Identity": 0, "Flatten": 0, "Unflatten": 0,
    "Linear": 1, "ReLU": 1, "ReLU6": 1, "Tanh": 1, "Sigmoid": 1, "GELU": 1, "ELU": 1, "SELU": 1, "CELU": 1,
    "LeakyReLU": 1, "SiLU": 1, "Mish": 1, "Softplus": 1, "Softsign": 1, "Hardtanh": 1, "Hardswish": 1,
    "Hardsigmoid": 1, "Softmax": 1, "LogSoftmax": 1, "Dropout": 1, "LayerNorm": 1, "Embedding": 1,
    "Conv1d": 1, "Conv2d": 1, "Conv3d": 1}


def layers(cls: ast.ClassDef, imports) -> Dict[str, int]:
    """``self.<name>`` -> kernels, for each attribute ``__init__`` sets once to a known torch.nn
    layer (and nothing else in the class sets)."""
    sets: Dict[str, Optional[int]] = {}
    for fn in cls.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                        kernels = None
                        if fn.name == "__init__" and isinstance(node, ast.Assign) and t is sub \
                                and isinstance(node.value, ast.Call):
                            qual = imports.qualify(node.value.func) or ""
                            if qual.startswith("torch.nn.") and qual.count(".") == 2:
                                kernels = _LAYER_KERNELS.get(qual.rsplit(".", 1)[1])
                        sets[sub.attr] = kernels if sub.attr not in sets else None
    return {name: k for name, k in sets.items() if k is not None}


def kernels(fn: ast.FunctionDef, known_layers: Dict[str, int], imports) -> int:
    """The most kernels one call of ``fn`` can launch, or :data:`MANY` where its source does not tell.
    Of an ``if``/``else`` (statement or expression) one arm runs: the larger arm counts, not both
    (``if x.dim() == 2: bias = b.view(1, -1) else: bias = b.view(1, -1, 1, 1)``, then ``x + bias``,
    is one kernel)."""
    return min(MANY, sum(_count(st, known_layers, imports) for st in fn.body))


def _count(node: ast.AST, known_layers: Dict[str, int], imports) -> int:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return MANY
    if isinstance(node, (ast.If, ast.IfExp)):
        body = node.body if isinstance(node.body, list) else [node.body]
        orelse = node.orelse if isinstance(node.orelse, list) else [node.orelse]
        arms = [sum(_count(n, known_layers, imports) for n in arm) for arm in (body, orelse)]
        return min(MANY, _count(node.test, known_layers, imports) + max(arms))
    count = 0
    if isinstance(node, (ast.BinOp, ast.BoolOp)):
        count += 1
    elif isinstance(node, ast.UnaryOp) and not isinstance(node.operand, ast.Constant):
        count += 1
    elif isinstance(node, ast.Subscript) and not _basic_index(node.slice):
        count += 1  # advanced indexing: a gather
    elif isinstance(node, ast.Call):
        count += _call_kernels(node, known_layers, imports)
    for child in ast.iter_child_nodes(node):
        if count >= MANY:
            break
        count += _count(child, known_layers, imports)
    return min(MANY, count)


def _call_kernels(call: ast.Call, known_layers: Dict[str, int], imports) -> int:
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        return known_layers.get(func.attr, MANY)  # a submodule (or another method) of this class
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call):
        inner = func.value.func
        if isinstance(inner, ast.Name) and inner.id == "super":
            return MANY  # super().forward(x): code this count does not see
        # a method of what a call returned (``self._bias.t().view(1, -1)``): the inner call is
        # counted on its own; one that is unknown (``make()(x).f``) counts as many there
        return 0 if func.attr in _NO_KERNEL else 1
    qual = imports.qualify(func) or ""
    if qual.startswith("torch."):
        name = qual.rsplit(".", 1)[1]
        if qual.startswith(("torch.distributions", "torch.nn.")) and not qual.startswith("torch.nn.functional."):
            return MANY  # a distribution's methods, a layer built per call
        return 0 if name in _NO_KERNEL else 1
    if isinstance(func, ast.Attribute) and not qual:
        return 0 if func.attr in _NO_KERNEL else 1  # a tensor's method
    return MANY  # a function of this file or another library


def _basic_index(index: ast.expr) -> bool:
    """A constant, a slice of constants or a tuple of those (a view), not a tensor index."""
    parts = index.elts if isinstance(index, ast.Tuple) else [index]
    for part in parts:
        if isinstance(part, ast.Slice):
            if any(b is not None and not _constant(b) for b in (part.lower, part.upper, part.step)):
                return False
        elif not _constant(part):
            return False
    return True


def _constant(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) or (
        isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant))


#: calls that make a new tensor from sizes and a fill value, reading no input tensor
_FACTORIES = frozenset({"zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like", "full_like",
                        "new_zeros", "new_ones", "new_empty", "new_full", "eye", "arange"})
#: builtins that launch no kernel
_BUILTINS = frozenset({"tuple", "list", "dict", "range", "len", "int", "zip", "enumerate"})


def only_factories(fn: ast.FunctionDef, imports) -> Optional[str]:
    """The first factory call (``torch.zeros``) where everything ``fn`` computes is new tensors
    made from sizes (torchbeast's ``initial_state``: ``tuple(torch.zeros(...) for _ in range(2))``)
    and views of them: a graph of such a method fuses nothing; else None."""
    first: Optional[str] = None
    for node in ast.walk(fn):
        if isinstance(node, (ast.BinOp, ast.BoolOp)) or isinstance(node, ast.UnaryOp) \
                and not isinstance(node.op, ast.Not) and not isinstance(node.operand, ast.Constant):
            return None  # arithmetic (``not`` of a setting is Python's)
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        qual = imports.qualify(func) or ""
        name = qual.rsplit(".", 1)[1] if qual.startswith("torch.") else \
            func.attr if isinstance(func, ast.Attribute) and not qual else None
        if name in _FACTORIES:
            first = first or ast.unparse(func)
        elif isinstance(func, ast.Name) and func.id in _BUILTINS:
            continue
        elif name is None or name not in _NO_KERNEL:
            return None
    return first
