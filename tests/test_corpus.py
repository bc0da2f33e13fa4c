"""The engine on real public RL code: each file in tests/corpus holds loops copied verbatim from a
public repository, the outcome expected at each site, and a ``run(ns, T, seed)`` that drives the
code on realistic inputs.

For every corpus file: the rewrite (all transforms, CPU backend) compiles; each expected site is
rewritten or skipped as recorded, with the recorded exactness; no other site is reported; and the
original and the rewritten module, exec'd side by side, give the same outputs (``torch.equal``
when every rewritten site claims ``exact``, ``assert_close`` otherwise) for short inputs (T = 1,
2, 3) and for inputs long enough that the vectorized branch must run, which is checked by tracing
the runtime guards. Expectations that a recorded finding says should change are
``xfail(strict=True)``: they turn red when the finding is fixed.

Corpus file layout: source text first; the line ``EXPECT = {...}`` starts the harness region
(EXPECT, FINDINGS, LENGTHS, LEAVE_ALONE, run), where no site may be reported. EXPECT maps an
anchor (a stripped source line, ``@k`` for its k-th occurrence) to (transform, action,
exactness). The default grad_clip guard (``exact-until-intervention``) runs as inserted: these
inputs are healthy, so it must change nothing, bit for bit where every other site is ``exact``.
"""
import ast
import functools
import glob
import linecache
import math
import os
import random
import sys
from collections import deque

import numpy as np
import pytest
import torch

from scalebox_cst.config import Config
from scalebox_cst.pipeline import Pipeline
from scalebox_cst.report import EXACT, EXACT_UNTIL_INTERVENTION, REWRITTEN, SKIPPED
from scalebox_cst.runtime import vectorized as runtime_vectorized

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS_DIR = os.path.join(HERE, "corpus")
NAMES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(CORPUS_DIR, "*.py")))
RUNTIME_DIR = os.path.join(os.path.dirname(HERE), "runtime")
DEFAULT_LENGTHS = (1, 2, 3, 17, 700)
ACTIONS = {"REWRITTEN": REWRITTEN, "SKIPPED": SKIPPED}
# the real code warns about its own inputs (std() of one element, tensors from lists of arrays)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
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
        name = self.name
        result = Pipeline(Config(), backend="cpu").rewrite(name + ".py", self.source)
        return result.report.error, result.output.decode(), list(result.report.sites)

    error = property(lambda self: self._rewrites[0])
    output = property(lambda self: self._rewrites[1])
    sites = property(lambda self: self._rewrites[2])

    def exec(self, code, tag):
        # a linecache entry gives the code a source, which TorchScript needs
        filename = f"<corpus {self.name} {tag}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        ns = {"__name__": "corpus_" + self.name}
        exec(compile(code, filename, "exec"), ns)
        return ns

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


def expectations():
    out = []
    for name in NAMES:
        for anchor in corpus(name).expect:
            finding = corpus(name).findings.get(anchor)  # the key "runtime" is no anchor
            marks = [pytest.mark.xfail(strict=True, reason=finding)] if finding else []
            out.append(pytest.param(name, anchor, marks=marks, id=f"{name}:{anchor[:50]}"))
    return out


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


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", NAMES)
def test_rewrite_compiles(name):
    c = corpus(name)
    assert c.error is None, c.error
    compile(c.output, name, "exec")


@pytest.mark.parametrize("name,anchor", expectations())
def test_expected_site(name, anchor):
    c = corpus(name)
    transform, action, exactness = c.expect[anchor]
    line = c.anchor_line(anchor)
    found = [s for s in c.sites if s.transform == transform and s.line == line]
    assert found, f"no {transform} site at line {line} ({anchor!r}); sites: {[(s.transform, s.line) for s in c.sites]}"
    site = found[0]
    assert (site.action, site.exactness) == (ACTIONS[action], exactness), (
        f"{transform} at line {line}: {site.action} ({site.exactness}): {site.reason}"
    )


@pytest.mark.parametrize("name", NAMES)
def test_no_other_sites(name):
    c = corpus(name)
    accounted = {(t, c.anchor_line(a)) for a, (t, _, _) in c.expect.items()}
    # EXPECT annotates the loop families and the guard; the hot.* rewrites (no_grad around acting
    # forwards, distributions, tensors from lists) are whole-script sites with their own examples
    # and differential tests (tests/transforms/hot/test_hot_*.py), and the differential tests here run them too
    loop_sites = [s for s in c.sites if not s.transform.startswith("hot.")]
    harness = [s for s in loop_sites if s.line >= c.harness_line]
    assert not harness, f"the test harness itself was rewritten or reported: {harness}"
    extra = [s for s in loop_sites if s.action in (REWRITTEN, SKIPPED) and (s.transform, s.line) not in accounted]
    assert not extra, "sites not in EXPECT:\n" + "\n".join(f"  {s.transform} {s.line} {s.action}: {s.reason}" for s in extra)


def differential_params():
    out = []
    for name in NAMES:
        for T in corpus(name).lengths:
            out.append(pytest.param(name, T, id=f"{name}-T{T}"))
    return out


@pytest.mark.parametrize("name,T", differential_params())
def test_differential(name, T):
    c = corpus(name)
    if c.leave_alone:
        assert c.output == c.text, "a file with nothing to rewrite came back changed"
        return
    assert c.output != c.text or not c.rewritten()
    orig_ns = c.exec(c.text, "original")
    run = orig_ns["run"]
    want = seeded(run, orig_ns, T, 0)
    compare_guarded(want, lambda: seeded(run, c.exec(c.output, "rewritten"), T, 0), c.exact())


def vectorized_params():
    out = []
    for name in NAMES:
        c = corpus(name)
        if c.leave_alone:
            continue
        finding = c.findings.get("runtime")
        marks = [pytest.mark.xfail(strict=True, reason=finding)] if finding else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@pytest.mark.parametrize("name", vectorized_params())
def test_vectorized_branch_runs(name, monkeypatch):
    """At the longest length every rewritten family takes its fast branch at least once (a guard
    that always declines would pass the differential test while doing nothing)."""
    c = corpus(name)
    families = sorted({s.transform for s in c.rewritten()} & set(ACCEPTORS))
    if not families:
        pytest.skip("nothing rewritten that has a run-time guard")
    T = max(c.lengths)
    orig_ns = c.exec(c.text, "original")
    run = orig_ns["run"]
    want = seeded(run, orig_ns, T, 1)
    new_ns = c.exec(c.output, "rewritten")
    # recurrences over lists of Python floats that are not inserted at the front are declined by
    # policy (the loop is faster, see runtime.vectorized.MIN_STEPS); here the branch must still work
    # (and need 1024 steps where they are), so for them the minimum lengths are lifted
    monkeypatch.setitem(runtime_vectorized.MIN_STEPS, "float_appended", 2)
    monkeypatch.setitem(runtime_vectorized.MIN_STEPS, "float", 2)
    with RuntimeTrace() as trace:
        intervened = compare_guarded(want, lambda: seeded(run, new_ns, T, 1), c.exact())
    assert not intervened, f"the guard intervened at T={T}: {intervened}"
    missing = [f for f in families if not trace.accepted(f)]
    assert not missing, f"the vectorized branch never ran at T={T} for {missing}"
