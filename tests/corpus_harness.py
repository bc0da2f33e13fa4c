"""The corpus of public RL code (tests/corpus/*.py) and how its runs are compared.

Each corpus file holds loops copied verbatim from a public repository, the outcome expected at each
site, and a ``run(ns, T, seed)`` that drives the code on realistic inputs (layout: test_corpus.py).
Several test files run corpus code or compare the same kind of outputs, so the reading of a corpus
file, the comparison (bitwise where every site is exact) and the trace of which run-time guards let
the vectorized branch run are here, not in one test file that the others import.
"""
import ast
import functools
import glob
import math
import os
import random
import sys
from collections import deque

import types

import numpy as np
import torch

from scalebox_cst import runtime as runtime_pkg
from scalebox_cst.report import EXACT, EXACT_UNTIL_INTERVENTION, REWRITTEN, SKIPPED
import harness

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS_DIR = os.path.join(HERE, "corpus")
NAMES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(CORPUS_DIR, "*.py")))
RUNTIME_DIR = os.path.join(os.path.dirname(HERE), "runtime")
DEFAULT_LENGTHS = (1, 2, 3, 17, 700)
ACTIONS = {"REWRITTEN": REWRITTEN, "SKIPPED": SKIPPED}
#: runtime functions whose result says a rewritten site took its vectorized branch
ACCEPTORS = {
    # fused_linear (the one-pass tier): the carried value, or True where it is dead after the loop
    "vectorize.recurrence": ({"recurrence_ok", "quadratic_ok", "fused_linear"},
                             lambda r: r is True or isinstance(r, torch.Tensor)),
    "vectorize.reduction": ({"batch_zip", "batch_range", "flat_params"}, lambda r: r is not None),
    "vectorize.elementwise": ({"batch_zip", "batch_range"}, lambda r: r is not None),
    "vectorize.target_update": (
        {"soft_update", "scale_add", "scale_add_alpha", "lerp_update", "hard_update"},
        lambda r: r is True,
    ),
    "grad_clip": ({"stabilize"}, lambda r: r is not None),  # the guard measured a norm
}


class Corpus:
    """One corpus file: its source, the harness constants it records, its rewrite (all
    transforms, CPU backend, rewritten once), and its code run as a module."""

    def __init__(self, name):
        self.name = name
        with open(os.path.join(CORPUS_DIR, name + ".py"), "rb") as f:
            self.source = f.read()
        self.text = self.source.decode()
        self.lines = self.text.splitlines()
        self.harness_line = next(i + 1 for i, l in enumerate(self.lines) if l.startswith("EXPECT = {"))
        consts = {}  # the harness constants, read without running the file (collection stays cheap)
        for node in ast.parse(self.text).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if node.targets[0].id in ("EXPECT", "FINDINGS", "LENGTHS", "LEAVE_ALONE"):
                    consts[node.targets[0].id] = ast.literal_eval(node.value)
        self.expect = consts["EXPECT"]
        self.findings = consts.get("FINDINGS", {})
        self.lengths = consts.get("LENGTHS", DEFAULT_LENGTHS)
        self.leave_alone = consts.get("LEAVE_ALONE", False)

    @functools.cached_property
    def _rewrites(self):
        result = harness.rewrite_result(self.source, path=self.name + ".py")
        return result.report.error, result.output.decode(), list(result.report.sites)

    error = property(lambda self: self._rewrites[0])
    output = property(lambda self: self._rewrites[1])
    sites = property(lambda self: self._rewrites[2])

    def exec(self, code, tag):
        # a linecache entry gives the code a source, which TorchScript needs
        return harness.load(code, filename=f"<corpus {self.name} {tag}>", module="corpus_" + self.name, cache_lines=True)

    def anchor_line(self, anchor):
        text, at, k = anchor.partition("@")
        hits = [i + 1 for i, l in enumerate(self.lines[: self.harness_line - 1]) if l.strip() == text]
        assert hits, f"{self.name}: anchor {anchor!r} not in the source"
        if not at:
            assert len(hits) == 1, f"{self.name}: anchor {anchor!r} is ambiguous (add @k)"
            return hits[0]
        assert int(k) <= len(hits), f"{self.name}: anchor {anchor!r}: only {len(hits)} occurrences"
        return hits[int(k) - 1]

    def rewritten(self):
        return [s for s in self.sites if s.action == REWRITTEN]

    def exact(self):
        # the default grad_clip guard is exact until it intervenes, and these inputs are healthy
        return all(s.exactness in (EXACT, EXACT_UNTIL_INTERVENTION) for s in self.rewritten())


@functools.lru_cache(maxsize=None)
def corpus(name):
    return Corpus(name)


# --------------------------------------------------------------------------- comparison


def compare(a, b, exact, path="out"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: {type(b).__name__} instead of a tensor"
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{path}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        a, b = a.detach(), b.detach()
        if exact:
            assert torch.equal(a, b) or torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()), (
                f"{path}: not bitwise equal (max diff {(a - b).abs().max().item() if a.numel() else 0})"
            )
        else:
            torch.testing.assert_close(a, b, equal_nan=True, msg=lambda m: f"{path}: {m}")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, f"{path}: {b!r}"
        compare(torch.from_numpy(np.ascontiguousarray(a)), torch.from_numpy(np.ascontiguousarray(b)), exact, path)
    elif isinstance(a, (list, tuple, deque)):
        assert type(a) is type(b) and len(a) == len(b), f"{path}: {type(b).__name__} of {len(b)} vs {len(a)}"
        for i, (x, y) in enumerate(zip(a, b)):
            compare(x, y, exact, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert type(a) is type(b) and list(a) == list(b), f"{path}: keys differ"
        for k in a:
            compare(a[k], b[k], exact, f"{path}[{k!r}]")
    elif isinstance(a, (float, np.floating)) and not exact:
        assert type(a) is type(b), f"{path}: {type(b).__name__} vs {type(a).__name__}"
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6) or (math.isnan(a) and math.isnan(b)), f"{path}: {b} vs {a}"
    else:
        assert type(a) is type(b), f"{path}: {type(b).__name__} vs {type(a).__name__}"
        assert a == b or (a != a and b != b), f"{path}: {b!r} vs {a!r}"


def nonfinite(value):
    """Whether an output holds a NaN or an infinity anywhere."""
    if isinstance(value, torch.Tensor):
        return value.is_floating_point() and not bool(torch.isfinite(value.detach()).all())
    if isinstance(value, np.ndarray):
        return value.dtype.kind == "f" and not np.isfinite(value).all()
    if isinstance(value, (list, tuple, deque)):
        return any(nonfinite(v) for v in value)
    if isinstance(value, dict):
        return any(nonfinite(v) for v in value.values())
    return isinstance(value, float) and not math.isfinite(value)


def compare_guarded(want, run_rewritten, exact):
    """Run the rewrite and compare. Where the gradient guard intervened (a non-finite step the
    original wrote into its weights, e.g. ``returns.std()`` of one return at T = 1), the results
    differ by design: then the original must show a non-finite value and the rewrite none."""
    from scalebox_cst.runtime import stabilizer

    stabilizer.reset()
    got = run_rewritten()
    intervened = [e for e in stabilizer.events.memory if e["kind"] in ("step_skipped", "spike_clipped")]
    stabilizer.reset()
    if intervened:
        assert all(e["kind"] == "step_skipped" for e in intervened), intervened  # no spikes on these inputs
        assert nonfinite(want) and not nonfinite(got), "the guard skipped a step the original survived"
        return intervened
    compare(want, got, exact)
    return []


def seeded(run, ns, T, seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return run(ns, T, seed)


class RuntimeTrace:
    """What the runtime helpers returned while the rewritten code ran (sys.setprofile)."""

    def __init__(self):
        self.returns = []

    def __call__(self, frame, event, arg):
        if event == "return" and frame.f_code.co_filename.startswith(RUNTIME_DIR):
            self.returns.append((frame.f_code.co_name, arg))

    def __enter__(self):
        sys.setprofile(self)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)

    def accepted(self, transform):
        names, ok = ACCEPTORS[transform]
        return any(name in names and ok(value) for name, value in self.returns)


# --------------------------------------------------------------------------- the guard fuzzer's view

#: where the installed guards run from (runtime/ and its packages)
RUNTIME_PACKAGE_DIR = os.path.dirname(runtime_pkg.__file__)


class Sub(torch.Tensor):
    """A tensor subclass (no overrides): guards must not take it for a tensor."""


def same(a, b, exact, path="out"):
    """The guard fuzzer's comparison: same type, dtype, shape, device; bitwise (NaN equal to NaN)
    where ``exact``; masks, dicts, namespaces and modules' state compared too."""
    assert type(a) is type(b), f"{path}: {type(b).__name__} instead of {type(a).__name__}"
    if isinstance(a, torch.Tensor):
        assert (a.dtype, tuple(a.shape), a.device) == (b.dtype, tuple(b.shape), b.device), (
            f"{path}: {b.dtype}{tuple(b.shape)} instead of {a.dtype}{tuple(a.shape)}")
        x, y = a.detach(), b.detach()
        if exact or not (x.is_floating_point() or x.is_complex()):
            ok = torch.equal(x, y) or (x.is_floating_point() and torch.equal(x.isnan(), y.isnan())
                                       and torch.equal(x.nan_to_num(), y.nan_to_num()))
            assert ok, f"{path}: not bitwise equal (max diff {(x.double() - y.double()).abs().nan_to_num().max().item() if x.numel() else 0})"
        else:
            torch.testing.assert_close(x, y, equal_nan=True, msg=lambda m: f"{path}: {m}")
    elif isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{path}: {b.dtype}{b.shape} instead of {a.dtype}{a.shape}"
        if isinstance(a, np.ma.MaskedArray):
            assert np.array_equal(np.ma.getmaskarray(a), np.ma.getmaskarray(b)), f"{path}: masks differ"
        same(torch.from_numpy(np.array(np.asarray(a), copy=True)), torch.from_numpy(np.array(np.asarray(b), copy=True)),
             exact, path)
    elif isinstance(a, (list, tuple, deque)):
        assert len(a) == len(b), f"{path}: {len(b)} items instead of {len(a)}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, exact, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys differ"
        for k in a:
            same(a[k], b[k], exact, f"{path}[{k!r}]")
    elif isinstance(a, types.SimpleNamespace):
        same(vars(a), vars(b), exact, path)
    elif isinstance(a, (float, np.floating)):
        if math.isnan(a):
            assert math.isnan(b), f"{path}: {b} instead of nan"
        elif exact:
            assert a == b, f"{path}: {b!r} instead of {a!r}"
        else:
            assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6), f"{path}: {b!r} instead of {a!r}"
    elif isinstance(a, (int, bool, str, bytes, np.generic, type(None))):
        assert a == b, f"{path}: {b!r} instead of {a!r}"
    elif isinstance(a, torch.nn.Module):
        same(list(a.state_dict().values()), list(b.state_dict().values()), exact, path + ".state")


#: runtime functions whose answer means a vectorized branch ran
FAST = {
    "recurrence_ok": lambda r: r is True, "quadratic_ok": lambda r: r is True, "carry_ok": lambda r: r is True,
    "batch_zip": lambda r: r is not None, "batch_range": lambda r: r is not None,
    "flat_params": lambda r: r is not None,  # a penalty over parameters (vectorize.param_penalty)
    "soft_update": lambda r: r is True, "scale_add": lambda r: r is True, "scale_add_alpha": lambda r: r is True,
    "lerp_update": lambda r: r is True, "hard_update": lambda r: r is True,
    "fused_linear": lambda r: r is not None,  # the one-pass tier in front of recurrence_ok
}


class Trace:
    """Which guards answered 'vectorized' while code ran (a ``sys.setprofile`` hook; the guard
    fuzzer's view, with ``carry_ok``: :class:`RuntimeTrace` is the corpus test's)."""

    def __init__(self):
        self.calls = []

    def __call__(self, frame, event, arg):
        if event == "return" and frame.f_code.co_name in FAST and frame.f_code.co_filename.startswith(RUNTIME_PACKAGE_DIR):
            self.calls.append((frame.f_code.co_name, FAST[frame.f_code.co_name](arg)))

    def vectorized(self):
        """A guard passed (and, for recurrences, the carried values after the first step too)."""
        names = {n for n, ok in self.calls if ok}
        if "recurrence_ok" in names:
            carried = [ok for n, ok in self.calls if n == "carry_ok"]
            return not carried or any(carried)
        return bool(names)
