"""Comparing what the original and the rewritten code leave behind, and the inputs they run on.

A differential test runs both sides on copies of the same inputs (``harness.run_pair``) and then
asks that every value agrees: bitwise where the site says ``exact`` (a float's bits, a tensor's
bytes, not ``==``, which equates 0.0 and -0.0 and fails on NaN), within a bound scaled to the
largest value where it says ``reassociated``. The hypothesis settings and strategies here are the
ones the ``vectorize.*`` differential tests draw their inputs from.
"""
from __future__ import annotations

import math
import struct
from collections import deque

import numpy as np
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import harness

#: hypothesis settings of the differential tests (each example rewrites nothing: the rewrite is cached)
HYP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def clone(env: dict) -> dict:
    """A copy of a test's inputs: tensors, arrays and lists (deques) of tensors copied, the rest shared."""
    out = {}
    for k, v in env.items():
        if isinstance(v, (torch.Tensor, np.ndarray)):
            out[k] = v.copy() if isinstance(v, np.ndarray) else v.clone()
        elif isinstance(v, (list, deque)):
            items = [e.clone() if isinstance(e, torch.Tensor) else e for e in v]
            out[k] = items if isinstance(v, list) else deque(items, v.maxlen)
        else:
            out[k] = v
    return out


def _bits_equal_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype in (torch.float32, torch.float64):
        view = torch.int32 if a.dtype == torch.float32 else torch.int64
        return torch.equal(a.contiguous().reshape(-1).view(view), b.contiguous().reshape(-1).view(view))
    return torch.equal(a, b)


def same(a, b, exact: bool = True, where: str = "") -> None:
    """Same type, dtype, shape and value (bitwise when ``exact``)."""
    if type(a).__module__ == "builtins" and type(a).__qualname__ in ("function", "type", "module"):
        return
    if not isinstance(a, (torch.Tensor, np.ndarray, np.generic, float, int, bool, str, list, tuple, deque,
                          type(None))) and hasattr(a, "__dict__"):
        # an object of a class the snippet defines (each run defines its own class)
        assert type(a).__qualname__ == type(b).__qualname__, where
        for k, v in vars(a).items():
            same(v, vars(b)[k], exact, f"{where}.{k}")
        return
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device, f"{where}: {a!r} vs {b!r}"
        if exact:
            assert _bits_equal_tensor(a, b), f"{where}: {a} != {b}"
        else:
            # reassociated: within a bound relative to the largest value (cancellation can leave an
            # element far smaller than the terms it sums)
            scale = max(1.0, float(a.abs().max())) if a.numel() and a.is_floating_point() else 1.0
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * scale, equal_nan=True, msg=where)
    elif isinstance(a, np.ndarray) or isinstance(a, np.generic):
        assert a.dtype == b.dtype and np.shape(a) == np.shape(b), f"{where}: {a!r} vs {b!r}"
        if exact:
            assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), f"{where}: {a} != {b}"
        else:
            scale = max(1.0, float(np.abs(a).max())) if np.size(a) and np.issubdtype(np.asarray(a).dtype, np.floating) else 1.0
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * scale, err_msg=where)
    elif isinstance(a, float):
        if exact:
            assert struct.pack("d", a) == struct.pack("d", b), f"{where}: {a!r} != {b!r}"
        else:
            assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), f"{where}: {a} != {b}"
    elif isinstance(a, (list, tuple, deque)):
        assert len(a) == len(b), f"{where}: lengths {len(a)} != {len(b)}"
        assert getattr(a, "maxlen", None) == getattr(b, "maxlen", None), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, exact, f"{where}[{i}]")
    elif isinstance(a, (int, bool, str, type(None))):
        assert a == b, f"{where}: {a!r} != {b!r}"


def same_namespaces(ns1: dict, ns2: dict, exact: bool = True) -> None:
    """Every variable of the original run has the same value after the rewritten run."""
    for key, value in ns1.items():
        if key.startswith("__"):
            continue
        assert key in ns2, f"{key} missing after the rewrite"
        same(value, ns2[key], exact, key)


# ------------------------------------------------------------------ strategies

lengths = st.integers(min_value=0, max_value=64)
dtypes = st.sampled_from([torch.float32, torch.float64])


def tensor(draw_seed: int, shape, dtype, kind: str = "normal"):
    """A seeded random tensor of ``dtype``; ``kind`` "dones": 0/1 flags (about 15% ones)."""
    g = torch.Generator().manual_seed(draw_seed)
    if kind == "dones":
        return (torch.rand(shape, generator=g) < 0.15).to(dtype)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


kinds = st.sampled_from(["torch", "numpy"])


def arrays(kind: str, seed: int, shape, dtype, what: str = "normal"):
    """A tensor (``kind`` "torch") or numpy array of ``dtype`` (a torch dtype)."""
    t = tensor(seed, shape, dtype, what)
    return t if kind == "torch" else t.numpy()


# ------------------------------------------------------------------ snippets several files run

#: PyTorch's actor-critic example's loss loop over saved (log_prob, value) pairs (vectorize.reduction)
LOSS_LOOP = """\
from collections import namedtuple
import torch
import torch.nn.functional as F
SavedAction = namedtuple('SavedAction', ['log_prob', 'value'])
def f(saved_actions, returns):
    policy_losses = []
    value_losses = []
    for (log_prob, value), R in zip(saved_actions, returns):
        advantage = R - value.item()
        policy_losses.append(-log_prob * advantage)
        value_losses.append(F.smooth_l1_loss(value, torch.tensor([R])))
    return torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()
"""


def loss_spy(monkeypatch):
    """What the loss-loop guards returned (None: the loop ran) while the test ran."""
    from scalebox_cst.runtime import vectorized

    return harness.GuardSpy(monkeypatch, vectorized, ("loss_zip", "loss_range"))
