"""What an example's ``Inputs`` evaluate to, and how original and rewrite are compared on them.

An :class:`~scalebox_cst.transforms.base.Inputs` holds the argument tuple as Python source; it is
evaluated here once per seed and side, after ``torch.manual_seed(seed)``, in a namespace with
``torch``, ``nn``, ``np``, ``seed``, ``rng`` and the recipes below (arguments too long to read
inline: networks, batches of transitions). Each side gets its own, equal, arguments, so in-place
writes on one side never reach the other.
"""
from __future__ import annotations

import copy
import inspect
import sys
import types
import math
from collections import deque
from typing import Any, Dict, List, Tuple

import numpy as np
import torch
from torch import nn


# ------------------------------------------------------------------ recipes


def mlp(sizes=(3, 16, 16, 1), dtype=torch.float32) -> nn.Module:
    """A tanh-free MLP (Linear / ReLU) of ``sizes``, from the current torch seed."""
    layers: List[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).to(dtype)


def mlp_pair(dtype=torch.float32) -> Tuple[nn.Module, nn.Module]:
    """A network and its target: a copy moved off it by unit noise (a soft update changes it)."""
    net = mlp(dtype=dtype)
    target = copy.deepcopy(net)
    with torch.no_grad():
        for p in target.parameters():
            p.add_(torch.randn_like(p))
    return net, target


def transitions(seed: int, n: int = 8) -> list:
    """``n`` (observation, action, reward) tuples, the observation a numpy array whose dtype
    cycles with the seed (float64, float32, int64, uint8)."""
    rng = np.random.default_rng(seed)
    dtype = (np.float64, np.float32, np.int64, np.uint8)[seed % 4]
    return [((rng.standard_normal(4) * 100).astype(dtype), int(rng.integers(2)), float(rng.standard_normal()))
            for _ in range(n)]


def attrs(**values: Any) -> types.SimpleNamespace:
    """An object with these attributes (a method's ``self`` reading ``self.gamma``)."""
    return types.SimpleNamespace(**values)


RECIPES: Dict[str, Any] = {"mlp": mlp, "mlp_pair": mlp_pair, "transitions": transitions, "attrs": attrs}


def arguments(args: str, seed: int) -> tuple:
    """The tuple ``args`` (source) evaluates to under ``seed``."""
    torch.manual_seed(seed)
    scope = {"torch": torch, "nn": nn, "np": np, "seed": seed, "rng": np.random.default_rng(seed), **RECIPES}
    return tuple(eval(f"({args},)", scope)) if args.strip() else ()  # noqa: S307 (the example's own text)


# ------------------------------------------------------------------ comparing


def outcome(fn, args: tuple) -> Any:
    """What ``fn(*args)`` returns, or the type of what it raises."""
    try:
        return fn(*args)
    except Exception as exc:  # the same exception type on both sides
        return type(exc)


def leaves(value: Any) -> List[torch.Tensor]:
    """The leaf tensors needing grad in ``value`` (nested in lists, tuples, dicts, modules)."""
    if isinstance(value, torch.Tensor):
        return [value] if value.requires_grad and value.is_leaf else []
    if isinstance(value, nn.Module):
        return [p for p in value.parameters() if p.requires_grad]
    if isinstance(value, (list, tuple, deque)):
        return [t for v in value for t in leaves(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in leaves(v)]
    return []


def outputs_with_grad(value: Any) -> List[torch.Tensor]:
    """The tensors in ``value`` that carry a graph (gradients of their sum are compared)."""
    if isinstance(value, torch.Tensor):
        return [value] if value.requires_grad and value.is_floating_point() else []
    if isinstance(value, (list, tuple, deque)):
        return [t for v in value for t in outputs_with_grad(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in outputs_with_grad(v)]
    return []


def same(a: Any, b: Any, exact: bool, where: str = "result") -> None:
    """``a`` and ``b`` are the same: bitwise (NaN payloads aside) where ``exact``, else close."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert (a.shape, a.dtype, a.device, a.requires_grad) == (b.shape, b.dtype, b.device, b.requires_grad), where
        x, y = a.detach(), b.detach()
        if exact:
            if x.is_floating_point() or x.is_complex():
                assert torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(), y.nan_to_num()), where
            else:
                assert torch.equal(x, y), where
        else:
            torch.testing.assert_close(x, y, equal_nan=True, msg=where)
    elif isinstance(a, nn.Module):
        sa, sb = a.state_dict(), b.state_dict()
        assert list(sa) == list(sb), where
        for key in sa:
            same(sa[key], sb[key], exact, f"{where}.{key}")
    elif isinstance(a, np.ndarray):
        assert (a.shape, a.dtype) == (b.shape, b.dtype), where
        if exact:
            assert a.tobytes() == b.tobytes(), where
        else:
            np.testing.assert_allclose(a, b, equal_nan=True, err_msg=where)
    elif isinstance(a, (list, tuple, deque)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, exact, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            same(a[key], b[key], exact, f"{where}[{key!r}]")
    elif isinstance(a, float):
        if exact:
            assert a == b or (math.isnan(a) and math.isnan(b)), f"{where}: {a!r} vs {b!r}"
        else:
            assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) or (math.isnan(a) and math.isnan(b)), where
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def compare_calls(original, rewritten, args: str, seed: int, exact: bool) -> None:
    """Call both on equal arguments from ``args``; compare results (or raised types), the
    arguments after the call (in-place writes) and the gradients of the results' sum."""
    mine, theirs = arguments(args, seed), arguments(args, seed)
    ra, rb = outcome(original, mine), outcome(rewritten, theirs)
    same(ra, rb, exact)
    same(mine, theirs, exact, "arguments after the call")
    graph_a, graph_b = outputs_with_grad(ra), outputs_with_grad(rb)
    wrt_a, wrt_b = leaves(mine), leaves(theirs)
    if graph_a and wrt_a:
        ga = torch.autograd.grad(sum(t.sum() for t in graph_a), wrt_a, allow_unused=True)
        gb = torch.autograd.grad(sum(t.sum() for t in graph_b), wrt_b, allow_unused=True)
        for i, (x, y) in enumerate(zip(ga, gb)):
            assert (x is None) == (y is None), f"gradient {i}"
            if x is not None:
                same(x, y, exact, f"gradient {i}")


def lines_run(fn, args: tuple) -> int:
    """How many lines of ``fn``'s own file (its module, comprehensions included) one call runs.

    A vectorized loop runs a few lines where the loop ran its body once per step, and its fallback
    runs the guard and then the whole loop: fewer lines than the original means the fast path ran."""
    filename = inspect.unwrap(fn).__code__.co_filename  # through decorators (@torch.no_grad())
    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename == filename else None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        outcome(fn, args)
    finally:
        sys.settrace(previous)
    return count
