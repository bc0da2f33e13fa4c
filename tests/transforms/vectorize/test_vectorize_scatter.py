"""vectorize.elementwise, per-row ``out[i].index_add_(dim, idx[i], src[i])`` loops → one op.

Differential tests exec original and rewrite on the same inputs (hypothesis: 0..6 rows, rows of
rank 1..3, duplicate indices, every dim incl. negative, alpha, float32/float64/int64, int32 and
int64 indices, non-contiguous operands) and require bitwise equality (the sites claim ``exact`` on
CPU), and that the fast path actually ran; a stress test compares the guard's op with the loop on
larger inputs (the row-sorted CPU scatter kernel included); guard tests check that the loop runs,
raising what it raises with the same partial writes, for what the guard declines; leave-alone
tests for the look-alikes; the EXAMPLES. Several calls per row: CleanRL C51's projection verbatim
(hypothesis over its inputs, integral b so l == u, clamps), two/three calls with cast index rows
(float, narrow integers), a stress test of the batched calls against the loop (duplicates, calls
hitting the same targets, 1 and 2 threads), and fallbacks where only a later call is bad.
"""
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalebox_cst.report import EXACT, REASSOCIATED, REWRITTEN, SKIPPED
from scalebox_cst.runtime import scatter
from scalebox_cst.transforms.vectorize.scatter_examples import EXAMPLES
from scalebox_cst.transforms.vectorize.elementwise import ID, VectorizeElementwise
import harness
from harness import rewriter
from example_inputs import arguments


rewrite = rewriter(ID)  # the shared differential harness (tests/harness.py)


class Spy:
    """Wraps a guard helper in the rewritten module: counts calls and fast-path answers."""

    def __init__(self, fn):
        self.fn, self.calls, self.fast = fn, 0, 0

    def __call__(self, *args):
        self.calls += 1
        got = self.fn(*args)
        self.fast += got is not None
        return got


HELPERS = ("_sb_scatter_add_rows", "_sb_index_add_rows", "_sb_scatter_add_calls", "_sb_index_add_calls")


def pair(src, name):
    """(original fn, rewritten fn, spy on its guard, rewritten code, sites)."""
    orig, new, out, sites = harness.pair(src, name, ID, cached=True)
    ns = new.__globals__
    helper = next((k for k in ns if k in HELPERS), None)
    spy = None
    if helper:
        spy = ns[helper] = Spy(ns[helper])
    return orig, new, spy, out, sites


def clone(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone().requires_grad_(x.requires_grad)
    return x


def run_both(orig, new, *args):
    """Run both on clones of ``args``: (original's args after, rewrite's args after)."""
    return harness.call_both(orig, new, *args, clone=clone)[:2]


# ------------------------------------------------------------------ EXAMPLES


def _rows(b, m, k, rest=(), dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(b, m, *rest, generator=g, dtype=dtype)
    idx = torch.randint(0, m, (b, k), generator=g)
    src = torch.randn(b, k, *rest, generator=g, dtype=dtype)
    return out, idx, src


def test_every_example_is_the_transforms():
    """The rewrite's examples (and look-alikes) are vectorize.elementwise's: the example test
    (tests/transforms/test_examples_registry.py) checks their outputs, reasons and inputs."""
    assert any(e.rewritten for e in EXAMPLES) and any(not e.rewritten for e in EXAMPLES)
    for e in EXAMPLES:
        assert e in VectorizeElementwise.EXAMPLES
        assert e.inputs is not None or not e.rewritten


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.rewritten], ids=lambda e: e.note[:40])
def test_examples_take_the_fast_path_exactly(example):
    """On the example's own inputs the guard answers once, with the fast path, and the site is exact."""
    out, sites = rewrite(example.code, dedent=False)
    done = [s for s in sites if s.action == REWRITTEN]
    assert len(done) == 1 and done[0].exactness == EXACT
    ns = harness.load(out)
    new = ns[example.inputs.call]
    helper = next(k for k in ns if k in HELPERS)
    spy = ns[helper] = Spy(ns[helper])
    new(*arguments(example.inputs.args, example.inputs.seeds[0]))
    assert spy.fast == 1


def test_golden():
    src = """\
    import torch
    def f(out, idx, src, n):
        # per env
        for i in range(n):
            out[i].index_add_(0, idx[i], src[i])
        return out
    """
    out, sites = rewrite(src)
    assert out == textwrap.dedent(
        """\
        from scalebox_cst.runtime.scatter import scatter_add_rows as _sb_scatter_add_rows
        import torch
        def f(out, idx, src, n):
            # per env
            _sb_scatter = _sb_scatter_add_rows(range(n), out, idx, src, 0)
            if _sb_scatter is not None:
                _sb_target, _sb_dim, _sb_index, _sb_source = _sb_scatter
                _sb_target.scatter_add_(_sb_dim, _sb_index, _sb_source)
            else:
                for i in range(n):
                    out[i].index_add_(0, idx[i], src[i])
            return out
        """
    )
    assert [(s.line, s.end_line, s.action, s.exactness) for s in sites] == [(4, 5, REWRITTEN, EXACT)]


def test_cuda_sites_are_reassociated():
    _, sites = rewrite(EXAMPLES[0].code, backend="cuda")
    (site,) = sites
    assert site.action == REWRITTEN and site.exactness == REASSOCIATED and "atomics" in site.reason


# ------------------------------------------------------------------ hypothesis differential

FORMS = {
    "range_n": """\
        def f(out, idx, src, n, dim, alpha):
            for i in range(n):
                out[i].index_add_(dim, idx[i], src[i])
        """,
    "len_keywords": """\
        def f(out, idx, src, n, dim, alpha):
            for b in range(len(out)):
                out[b].index_add_(dim=dim, index=idx[b], source=src[b])
        """,
    "shape_mixed": """\
        def f(out, idx, src, n, dim, alpha):
            for i in range(out.shape[0]):
                out[i].index_add_(dim, index=idx[i], source=src[i], alpha=1)
        """,
    "size_start": """\
        def f(out, idx, src, n, dim, alpha):
            for i in range(1, out.size(0)):
                out[i].index_add_(dim, idx[i], src[i])
        """,
    "zip": """\
        def f(out, idx, src, n, dim, alpha):
            for o, j, s in zip(out, idx, src):
                o.index_add_(dim, j, s)
        """,
    "alpha": """\
        def f(out, idx, src, n, dim, alpha):
            for i in range(n):
                out[i].index_add_(dim, idx[i], src[i], alpha=alpha)
        """,
}


def _noncontiguous(t, how):
    """``t``'s values in another layout: 0 contiguous, 1 every other element of a wider buffer,
    2 a permuted buffer."""
    if how == 0 or t.dim() == 0:
        return t
    if how == 1:
        wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
        wide[..., ::2] = t
        return wide[..., ::2]
    perm = list(range(t.dim()))[::-1]
    return t.permute(*perm).contiguous().permute(*perm)


@st.composite
def scatter_case(draw):
    form = draw(st.sampled_from(sorted(FORMS)))
    rows = draw(st.integers(0, 6))
    rank = draw(st.integers(1, 3))
    d = draw(st.integers(0, rank - 1))
    m = draw(st.integers(1, 5))
    k = draw(st.integers(0, 9))
    rest = [draw(st.sampled_from([1, 2, 3, 17])) for _ in range(rank - 1)]
    row_shape = rest[:d] + [m] + rest[d:]
    src_shape = list(row_shape)
    src_shape[d] = k
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.int64]))
    if form == "alpha":
        d = 0  # the alpha form is fast only along dim 0 of each row (tested apart below)
        row_shape = [m] + rest
        src_shape = [k] + rest
        alpha = draw(st.sampled_from([2, -3, 1]) if dtype == torch.int64 else st.sampled_from([0.3, -1.7, 2, 1.0]))
    else:
        alpha = 1
    dim = d - rank if draw(st.booleans()) else d
    extra = draw(st.integers(0, 2))  # out/idx/src longer than the loop's range
    n = rows
    seed = draw(st.integers(0, 2**31 - 1))
    layouts = draw(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)))
    index_dtype = draw(st.sampled_from([torch.int64, torch.int32]))
    g = torch.Generator().manual_seed(seed)
    total = rows + (0 if form in ("len_keywords", "shape_mixed", "size_start", "zip") else extra)
    if dtype.is_floating_point:
        # wide magnitudes: a different order of additions would show in the last bits
        out = torch.randn(total, *row_shape, generator=g, dtype=dtype)
        src = torch.randn(total, *src_shape, generator=g, dtype=dtype) * torch.exp(
            4 * torch.randn(total, *src_shape, generator=g, dtype=dtype))
    else:
        out = torch.randint(-1000, 1000, (total, *row_shape), generator=g, dtype=dtype)
        src = torch.randint(-(2**40), 2**40, (total, *src_shape), generator=g, dtype=dtype)
    idx = torch.randint(0, m, (total, k), generator=g).to(index_dtype)
    if form == "zip" and extra:
        src = torch.cat([src, src[:extra]]) if total else src  # zip stops at the shortest
    out, idx, src = (_noncontiguous(t, how) for t, how in zip((out, idx, src), layouts))
    return form, out, idx, src, n, dim, alpha


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scatter_case())
def test_differential_bitwise(case):
    form, out, idx, src, n, dim, alpha = case
    orig, new, spy, _, sites = pair(FORMS[form], "f")
    assert [s.exactness for s in sites if s.action == REWRITTEN] == [EXACT]
    a, b = run_both(orig, new, out, idx, src, n, dim, alpha)
    assert torch.equal(a[0], b[0])
    visited = {"range_n": n, "alpha": n, "size_start": max(0, len(out) - 1)}.get(form, min(len(out), len(idx), len(src)))
    assert spy.calls == 1
    # the guard takes every valid case with something to add (else the loop ran: no evidence)
    fast = visited > 0 and idx.shape[1] > 0 and out[0].numel() > 0
    if form == "alpha" and fast:  # index_add_ over flattened rows: the rows must view flat
        try:
            out[:n].view(-1, *out.shape[2:])
        except RuntimeError:
            fast = False
    assert spy.fast == fast


@pytest.fixture
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("threads, trials", [(1, 120), (2, 12)], indirect=["threads"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_stress_exact_with_duplicates(dtype, threads, trials):
    """Many random inputs, heavy duplicates (K >> M), rows wide enough for the row-sorted CPU
    scatter kernel (>= 16 channels): the guard's op equals the loop bitwise. Mostly on one
    thread (intra-op threads spin on this shared 2-core machine); a few on two (parallel kernels)."""
    g = torch.Generator().manual_seed(threads)
    for trial in range(trials):
        b = int(torch.randint(1, 9, (), generator=g))
        m = int(torch.randint(1, 6, (), generator=g))
        k = int(torch.randint(1, 80, (), generator=g))
        rest = [[], [16], [33], [3, 16]][trial % 4]
        d = int(torch.randint(0, len(rest) + 1, (), generator=g))
        row = rest[:d] + [m] + rest[d:]
        srow = rest[:d] + [k] + rest[d:]
        out = torch.randn(b, *row, generator=g, dtype=dtype)
        src = torch.randn(b, *srow, generator=g, dtype=dtype) * torch.exp(6 * torch.randn(b, *srow, generator=g, dtype=dtype))
        idx = torch.randint(0, m, (b, k), generator=g)
        loop = out.clone()
        for i in range(b):
            loop[i].index_add_(d, idx[i], src[i])
        fast = out.clone()
        target, dim, index, source = scatter.scatter_add_rows(range(b), fast, idx, src, d)
        target.scatter_add_(dim, index, source)
        assert torch.equal(loop, fast), (trial, b, m, k, row, d)
        if d == 0:
            alpha = float(torch.randn((), generator=g))
            loop = out.clone()
            for i in range(b):
                loop[i].index_add_(0, idx[i], src[i], alpha=alpha)
            fast = out.clone()
            target, index, source, a = scatter.index_add_rows(range(b), fast, idx, src, 0, alpha)
            target.index_add_(0, index, source, alpha=a)
            assert torch.equal(loop, fast), (trial, "alpha", b, m, k, row)


# ------------------------------------------------------------------ guards: the loop runs

LOOP = """\
    import torch
    def f(out, idx, src, n):
        for i in range(n):
            out[i].index_add_(0, idx[i], src[i])
        return out
    """


def raised(fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - the type is what is compared
        return type(exc)
    return None


@pytest.mark.parametrize("bad", [7, -1])
def test_out_of_range_index_raises_like_the_loop(bad):
    orig, new, spy, _, _ = pair(LOOP, "f")
    out, idx, src = _rows(4, 5, 6, (3,))
    idx[2, 3] = bad  # rows 0, 1 and half of row 2 are added before the loop raises
    a, b = [clone(x) for x in (out, idx, src)], [clone(x) for x in (out, idx, src)]
    ea, eb = raised(orig, *a, 4), raised(new, *b, 4)
    assert ea is not None and ea is eb
    assert spy.fast == 0
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], out)


def test_range_past_the_rows_raises_like_the_loop():
    orig, new, spy, _, _ = pair(LOOP, "f")
    args = _rows(3, 4, 5)
    a, b = [clone(x) for x in args], [clone(x) for x in args]
    assert raised(orig, *a, 5) is IndexError and raised(new, *b, 5) is IndexError
    assert spy.fast == 0 and torch.equal(a[0], b[0])


def test_requires_grad_leaf_output_raises_like_the_loop():
    orig, new, spy, _, _ = pair(LOOP, "f")
    out, idx, src = _rows(3, 4, 5)
    out.requires_grad_(True)
    ea, eb = raised(orig, out, idx, src, 3), raised(new, out, idx, src, 3)
    assert ea is RuntimeError and eb is RuntimeError and spy.fast == 0
    with torch.no_grad():  # a parameter updated in place without grad: fast path
        a, b = out.detach().clone(), out.detach().clone()
        orig(a, idx, src, 3)
        new(b, idx, src, 3)
    assert spy.fast == 1 and torch.equal(a, b)


def test_source_requiring_grad_gives_the_same_gradients():
    orig, new, spy, _, _ = pair(LOOP, "f")
    _, idx, src = _rows(4, 5, 9, (16,), seed=3)
    w = torch.randn(4, 5, 16, dtype=torch.float64)
    grads = []
    for fn in (orig, new):
        s = src.clone().requires_grad_(True)
        x = s * 1.5  # a non-leaf source, as messages from a network
        out = fn(torch.zeros(4, 5, 16, dtype=torch.float64), idx, x, 4)
        (out * w).sum().backward()
        grads.append((out.detach(), s.grad))
    assert spy.fast == 1
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_dtype_mismatch_raises_like_the_loop():
    orig, new, spy, _, _ = pair(LOOP, "f")
    out, idx, src = _rows(3, 4, 5)
    ea, eb = raised(orig, out.float(), idx, src, 3), raised(new, out.float(), idx, src, 3)
    assert ea is not None and ea is eb and spy.fast == 0


def test_float_alpha_on_integers_as_the_loop():
    # index_add_ truncates a float alpha for integer tensors; the one op gets the same alpha
    orig, new, spy, _, _ = pair(FORMS["alpha"], "f")
    out, idx, src = (t.mul(100).long() if t.is_floating_point() else t for t in _rows(3, 4, 5))
    for alpha in (0.5, 2.7, -1.5):
        a, b = out.clone(), out.clone()
        assert raised(orig, a, idx, src, 3, 0, alpha) is raised(new, b, idx, src, 3, 0, alpha)
        assert torch.equal(a, b)
    assert spy.fast == 3


def _declined(form, args, expect_fast=0):
    orig, new, spy, _, _ = pair(form, "f")
    a, b = run_both(orig, new, *args)
    assert spy.calls == 1 and spy.fast == expect_fast
    assert torch.equal(a[0], b[0])


def test_source_sharing_memory_with_the_output_runs_the_loop():
    orig, new, spy, _, _ = pair(FORMS["range_n"], "f")
    out, idx, _ = _rows(3, 4, 4)
    a, b = out.clone(), out.clone()
    # the same tensor under another name: the loop raises (overlap), after nothing was written
    assert raised(orig, a, idx, a, 3, 0, 1) is RuntimeError
    assert raised(new, b, idx, b, 3, 0, 1) is RuntimeError
    assert torch.equal(a, b)
    # disjoint parts of one buffer: the loop works; the guard declines (same storage)
    buf_a, buf_b = torch.randn(6, 4, dtype=torch.float64), None
    buf_b = buf_a.clone()
    orig(buf_a[:3], idx, buf_a[3:], 3, 0, 1)
    new(buf_b[:3], idx, buf_b[3:], 3, 0, 1)
    assert spy.fast == 0 and torch.equal(buf_a, buf_b)


def test_rows_sharing_memory_run_the_loop():
    _, idx, src = _rows(3, 4, 5)
    base = torch.zeros(4, dtype=torch.float64)
    orig, new, spy, _, _ = pair(FORMS["range_n"], "f")
    a, b = base.clone(), base.clone()
    orig(a.expand(3, 4), idx, src, 3, 0, 1)
    new(b.expand(3, 4), idx, src, 3, 0, 1)
    assert spy.fast == 0 and torch.equal(a, b)


def test_half_precision_runs_the_loop():
    out, idx, src = _rows(3, 4, 5, (16,))
    _declined(FORMS["range_n"], (out.half(), idx, src.half(), 3, 0, 1))


def test_lists_run_the_loop():
    out, idx, src = _rows(3, 4, 5)
    orig, new, spy, _, _ = pair(FORMS["range_n"], "f")
    a, b = out.clone(), out.clone()
    orig(a, list(idx), list(src), 3, 0, 1)
    new(b, list(idx), list(src), 3, 0, 1)
    assert spy.fast == 0 and torch.equal(a, b)


def test_alpha_off_the_first_dim_runs_the_loop():
    # alpha fused into index_add_'s add cannot be reproduced by one op along another dim
    out = torch.randn(3, 2, 5, dtype=torch.float64)
    idx = torch.randint(0, 5, (3, 7))
    src = torch.randn(3, 2, 7, dtype=torch.float64)
    _declined(FORMS["alpha"], (out, idx, src, 3, 1, 0.7))


def test_alpha_on_unviewable_rows_runs_the_loop():
    out, idx, src = _rows(3, 4, 5, (2,))
    _declined(FORMS["alpha"], (out.transpose(0, 1).contiguous().transpose(0, 1), idx, src, 3, 0, 0.7))


def test_empty_range_and_empty_index():
    out, idx, src = _rows(3, 4, 0)
    _declined(FORMS["range_n"], (out, idx, src, 3, 0, 1))
    out, idx, src = _rows(3, 4, 2)
    _declined(FORMS["range_n"], (out, idx, src, 0, 0, 1))


def test_guard_never_raises():
    for args in [
        (range(2), None, None, None, 0),
        (range(2), torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2), "0"),
        (range(-1, 2), torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2), 0),
        (range(0, 2, -1), torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2), 0),
        ([0, 1], torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2), 0),
        (range(2), torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 3), 0),
        (range(2), torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.float), torch.zeros(2, 2), 0),
        (range(2), torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), torch.zeros(2), 0),
        (range(2), torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2), 1),
    ]:
        assert scatter.scatter_add_rows(*args) is None
        assert scatter.index_add_rows(*args, 0.5) is None
    ok = (range(2), torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2), 0)
    assert scatter.scatter_add_rows(*ok) is not None
    assert scatter.index_add_rows(*ok, True) is None  # bool alpha: the loop decides
    assert scatter.index_add_rows(*ok, 0.5) is not None


# ------------------------------------------------------------------ left alone

LEFT_ALONE = {
    "index used after the loop": ("""\
        def f(out, idx, src, n):
            for i in range(n):
                out[i].index_add_(0, idx[i], src[i])
            return i
        """, "may be read outside the loop"),
    "global loop variable": ("""\
        def f(out, idx, src, n):
            global i
            for i in range(n):
                out[i].index_add_(0, idx[i], src[i])
        """, "declared global/nonlocal"),
    "shifted index row": ("""\
        def f(out, idx, src, n):
            for i in range(n):
                out[i].index_add_(0, idx[i + 1], src[i])
        """, "not the current row `idx[i]`"),
    "source is the output": ("""\
        def f(out, idx, n):
            for i in range(n):
                out[i].index_add_(0, idx[i], out[i])
        """, "which the loop writes"),
    "positional alpha": ("""\
        def f(out, idx, src, n):
            for i in range(n):
                out[i].index_add_(0, idx[i], src[i], 2)
        """, "alpha is keyword-only"),
    "other statement": ("""\
        def f(out, idx, src, cnt, n):
            for i in range(n):
                out[i].index_add_(0, idx[i], src[i])
                cnt[i] += 1
        """, "only per-row index_add_ calls are rewritten"),
    "enumerate": ("""\
        def f(out, idx, src):
            for i, o in enumerate(out):
                o.index_add_(0, idx[i], src[i])
        """, "neither `for i in range(...)`"),
    "range rebound": ("""\
        from mylib import range
        def f(out, idx, src, n):
            for i in range(n):
                out[i].index_add_(0, idx[i], src[i])
        """, "range is rebound"),
    "dim per row": ("""\
        def f(out, idx, src, dims, n):
            for i in range(n):
                out[i].index_add_(dims[i], idx[i], src[i])
        """, "not a plain value"),
    "computed range bound": ("""\
        def f(out, idx, src):
            for i in range(next_n()):
                out[i].index_add_(0, idx[i], src[i])
        """, "range bounds are not plain values"),
    "zip with strict": ("""\
        def f(out, idx, src):
            for o, j, s in zip(out, idx, src, strict=True):
                o.index_add_(0, j, s)
        """, "keyword or unpacked"),
    "nested loop": ("""\
        def f(out, idx, src, n, t):
            for b in range(n):
                for k in range(t):
                    out[b].index_add_(0, idx[b, k], src[b, k])
        """, "compound statements"),
    "continue": ("""\
        def f(out, idx, src, n, skip):
            for i in range(n):
                if skip[i]:
                    continue
                out[i].index_add_(0, idx[i], src[i])
        """, "skip iterations (continue)"),
}


@pytest.mark.parametrize("name", sorted(LEFT_ALONE))
def test_left_alone(name):
    src, reason = LEFT_ALONE[name]
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src)
    reasons = [s.reason for s in sites if s.action == SKIPPED]
    assert any(reason in r for r in reasons), reasons


def test_not_a_candidate_no_site():
    src = """\
    def f(agg, edges):
        for e in edges:
            agg.index_add_(0, e.dst, e.msg)
    """
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src) and sites == []


def test_rewrite_is_idempotent():
    out, _ = rewrite(EXAMPLES[0].code)
    again, sites = rewrite(out)
    assert again == out and not [s for s in sites if s.action == REWRITTEN]


def test_with_an_assignment_loop_in_the_same_file():
    src = """\
    import torch
    def f(out, idx, src, r, v, buf):
        for i in range(len(r)):
            buf[i] = r[i] + 0.5 * v[i]
        for i in range(len(out)):
            out[i].index_add_(0, idx[i], src[i])
        return out, buf
    """
    orig, new, spy, code, sites = pair(src, "f")
    assert [(s.line, s.action) for s in sites] == [(3, REWRITTEN), (5, REWRITTEN)]
    assert "_sb_batch_range" in code and "scatter_add_" in code
    out, idx, s = _rows(3, 4, 6)
    r, v = torch.randn(5), torch.randn(5)
    ra = orig(out.clone(), idx, s, r, v, torch.zeros(5))
    rb = new(out.clone(), idx, s, r, v, torch.zeros(5))
    assert spy.fast == 1 and all(torch.equal(x, y) for x, y in zip(ra, rb))


def test_mixed_body_reported_once():
    src = """\
    def f(out, idx, src, buf, r):
        for i in range(len(r)):
            buf[i] = r[i] * 2
            out[i].index_add_(0, idx[i], src[i])
    """
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src)
    assert len(sites) == 1 and sites[0].action == SKIPPED


# ------------------------------------------------------------------ several calls per row (C51)

#: CleanRL c51.py's projection (the body of its training step), verbatim from `with torch.no_grad()`
C51 = """\
    import torch
    def project(next_pmfs, rewards, dones, atoms, gamma, v_min, v_max, n_atoms):
        with torch.no_grad():
            next_atoms = rewards + gamma * atoms * (1 - dones)
            # projection
            delta_z = atoms[1] - atoms[0]
            tz = next_atoms.clamp(v_min, v_max)

            b = (tz - v_min) / delta_z
            l = b.floor().clamp(0, n_atoms - 1)
            u = b.ceil().clamp(0, n_atoms - 1)
            # (l == u).float() handles the case where bj is exactly an integer
            # example bj = 1, then the upper ceiling should be uj= 2, and lj= 1
            d_m_l = (u + (l == u).float() - b) * next_pmfs
            d_m_u = (b - l) * next_pmfs
            target_pmfs = torch.zeros_like(next_pmfs)
            for i in range(target_pmfs.size(0)):
                target_pmfs[i].index_add_(0, l[i].long(), d_m_l[i])
                target_pmfs[i].index_add_(0, u[i].long(), d_m_u[i])
        return target_pmfs, l, u
    """


def test_c51_golden():
    out, sites = rewrite(C51)
    loop = (
        "        for i in range(target_pmfs.size(0)):\n"
        "            target_pmfs[i].index_add_(0, l[i].long(), d_m_l[i])\n"
        "            target_pmfs[i].index_add_(0, u[i].long(), d_m_u[i])\n"
    )
    src = textwrap.dedent(C51)
    assert loop in src
    assert out == "from scalebox_cst.runtime.scatter import scatter_add_calls as _sb_scatter_add_calls\n" + src.replace(loop, (
        "        _sb_scatter = _sb_scatter_add_calls(range(target_pmfs.size(0)), target_pmfs, 0, (l, \"long\", d_m_l), (u, \"long\", d_m_u))\n"
        "        if _sb_scatter is not None:\n"
        "            _sb_target, _sb_dim, _sb_index, _sb_source, _sb_index_2, _sb_source_2 = _sb_scatter\n"
        "            _sb_target.scatter_add_(_sb_dim, _sb_index, _sb_source)\n"
        "            _sb_target.scatter_add_(_sb_dim, _sb_index_2, _sb_source_2)\n"
        "        else:\n"
        + "".join("    " + line + "\n" for line in loop.splitlines())
    ))
    (site,) = sites
    assert (site.line, site.end_line, site.action, site.exactness) == (17, 19, REWRITTEN, EXACT)
    assert "×2 → 2 `scatter_add_`" in site.reason and "call by call" in site.reason and "`.long()`" in site.reason
    (cuda,) = rewrite(C51, backend="cuda")[1]
    assert cuda.action == REWRITTEN and cuda.exactness == REASSOCIATED


@st.composite
def c51_case(draw):
    """CleanRL's inputs: a batch of rewards/dones, atoms = linspace(v_min, v_max, n_atoms), next
    pmfs a softmax. Rewards are drawn so that b = (tz - v_min) / delta_z is often exactly
    integral (l == u): multiples of delta_z with done = 1, or past either end (clamped)."""
    bsz = draw(st.integers(1, 12))
    n_atoms = draw(st.sampled_from([2, 3, 11, 51]))
    v_max = draw(st.sampled_from([1.0, 10.0, 100.0, 7.3]))
    v_min = -v_max if draw(st.booleans()) else draw(st.sampled_from([0.0, -3.0]))
    gamma = draw(st.sampled_from([0.99, 1.0, 0.5]))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    atoms = torch.linspace(v_min, v_max, n_atoms, dtype=dtype)
    delta_z = float(atoms[1] - atoms[0])
    kind = torch.randint(0, 3, (bsz, 1), generator=g)
    grid = v_min + delta_z * torch.randint(-2, n_atoms + 2, (bsz, 1), generator=g).to(dtype)
    noise = (v_max - v_min) * (2 * torch.rand(bsz, 1, generator=g, dtype=dtype) - 0.5)
    rewards = torch.where(kind == 0, grid, noise)
    dones = torch.where(kind == 0, torch.ones((), dtype=dtype), (torch.rand(bsz, 1, generator=g) < 0.2).to(dtype))
    logits = 3 * torch.randn(bsz, n_atoms, generator=g, dtype=dtype)
    next_pmfs = torch.softmax(logits, dim=1)
    return next_pmfs, rewards, dones, atoms, gamma, v_min, v_max, n_atoms


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c51_case())
def test_c51_differential_bitwise(case):
    orig, new, spy, _, _ = pair(C51, "project")
    (ta, la, ua), (tb, lb, ub) = orig(*case), new(*case)
    assert spy.fast == 1
    assert torch.equal(la, lb) and torch.equal(ua, ub)
    assert torch.equal(ta, tb)


def test_c51_integral_b_and_collisions():
    """l == u (b exactly integral: grid rewards with done, and the clamps at v_min/v_max) and many
    atoms landing on the same target (duplicate indices in both calls): bitwise."""
    orig, new, spy, _, _ = pair(C51, "project")
    for dtype in (torch.float32, torch.float64):
        atoms = torch.linspace(-10, 10, 41, dtype=dtype)  # delta_z = 0.5: grid rewards give integral b
        rewards = torch.tensor([[0.0], [-10.0], [10.0], [2.4], [500.0], [-500.0], [3.3], [0.8]], dtype=dtype)
        dones = torch.tensor([[1.0], [1.0], [1.0], [1.0], [0.0], [0.0], [0.0], [0.0]], dtype=dtype)
        next_pmfs = torch.softmax(torch.randn(8, 41, dtype=dtype, generator=torch.Generator().manual_seed(5)), 1)
        args = (next_pmfs, rewards, dones, atoms, 0.99, -10.0, 10.0, 41)
        (ta, l, u), (tb, _, _) = orig(*args), new(*args)
        assert (l == u).any(dim=1).sum() >= 5  # done rows on the grid, clamped rows
        assert (l[4] == 40).all() and (l[5] == 0).all()  # every atom projected onto one target
        assert torch.equal(ta, tb)
    assert spy.fast == 2


MULTI = {
    "two_long": """\
        def f(out, i1, s1, i2, s2, i3, s3, n, dim):
            for i in range(n):
                out[i].index_add_(dim, i1[i].long(), s1[i])
                out[i].index_add_(dim, i2[i], s2[i])
        """,
    "three_mixed": """\
        import torch as th
        def f(out, i1, s1, i2, s2, i3, s3, n, dim):
            for r in range(1, out.size(0)):
                out[r].index_add_(dim, i1[r].to(th.long), s1[r])
                out[r].index_add_(dim, index=i2[r].int(), source=s2[r])
                out[r].index_add_(dim, i3[r].to(dtype=th.int64), s3[r], alpha=1)
        """,
    "two_alpha": """\
        def f(out, i1, s1, i2, s2, i3, s3, n, dim):
            for i in range(n):
                out[i].index_add_(dim, i1[i].long(), s1[i], alpha=0.37)
                out[i].index_add_(dim, i2[i], s2[i])
        """,
}


def _index_rows(draw, g, total, k, m, cast):
    """Index rows in [0, m): a cast row may be float (fractional parts truncate) or a narrow
    integer type; an uncast row is int64/int32."""
    base = torch.randint(0, m, (total, k), generator=g)
    choices = [torch.int64, torch.int32] + ([torch.float32, torch.float64, torch.uint8] if cast else [])
    dtype = draw(st.sampled_from(choices))
    if dtype.is_floating_point:
        frac = torch.rand(total, k, generator=g, dtype=dtype) * (torch.rand(total, k, generator=g) < 0.5)
        return base.to(dtype) + frac * 0.999
    return base.to(dtype)


@st.composite
def multi_case(draw):
    form = draw(st.sampled_from(sorted(MULTI)))
    rows = draw(st.integers(0, 6))
    rank = draw(st.integers(1, 3))
    d = 0 if form == "two_alpha" else draw(st.integers(0, rank - 1))
    m = draw(st.integers(1, 5))
    rest = [draw(st.sampled_from([1, 2, 3, 17])) for _ in range(rank - 1)]
    row_shape = rest[:d] + [m] + rest[d:]
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.int64]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    total = rows + (draw(st.integers(0, 2)) if form != "three_mixed" else 0)
    casts = {"two_long": (True, False, False), "three_mixed": (True, True, True), "two_alpha": (True, False, False)}[form]
    ks = [draw(st.integers(0, 9)) for _ in range(3)]
    ops = []
    for c in range(3):
        shape = list(row_shape)
        shape[d] = ks[c]
        if dtype.is_floating_point:
            src = torch.randn(total, *shape, generator=g, dtype=dtype) * torch.exp(4 * torch.randn(total, *shape, generator=g, dtype=dtype))
        else:
            src = torch.randint(-(2**40), 2**40, (total, *shape), generator=g, dtype=dtype)
        idx = _index_rows(draw, g, total, ks[c], m, casts[c])
        if c == 1 and draw(st.booleans()) and ks[1] == ks[0]:
            idx = ops[0][0].clone().to(idx.dtype) if not ops[0][0].is_floating_point() else ops[0][0].long().to(idx.dtype)
        ops.append((idx, src))
    if dtype.is_floating_point:
        out = torch.randn(total, *row_shape, generator=g, dtype=dtype)
    else:
        out = torch.randint(-1000, 1000, (total, *row_shape), generator=g, dtype=dtype)
    layout = draw(st.integers(0, 2))
    out = _noncontiguous(out, layout if form != "two_alpha" else 0)
    dim = d - rank if draw(st.booleans()) else d
    ncalls = 3 if form == "three_mixed" else 2
    return form, out, ops, rows, dim, ks[:ncalls]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(multi_case())
def test_several_calls_differential_bitwise(case):
    form, out, ops, n, dim, ks = case
    orig, new, spy, code, sites = pair(MULTI[form], "f")
    assert [s.exactness for s in sites if s.action == REWRITTEN] == [EXACT]
    assert code.count("_sb_target.scatter_add_(" if form != "two_alpha" else "_sb_target.index_add_(") == len(ks)
    args = (out, *[t for pair_ in ops for t in pair_], n, dim)
    a, b = [clone(x) for x in args], [clone(x) for x in args]
    ea, eb = raised(orig, *a), raised(new, *b)
    assert ea is None and eb is None
    assert torch.equal(a[0], b[0])
    visited = max(0, len(out) - 1) if form == "three_mixed" else n
    assert spy.fast == (visited > 0 and all(ks) and out[0].numel() > 0)


@pytest.mark.parametrize("threads, trials", [(1, 100), (2, 10)], indirect=["threads"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_stress_several_calls_exact(dtype, threads, trials):
    """Two and three calls per row, heavy duplicates within a call (K >> M) and the same targets
    hit by every call (l == u collisions: call 2's index row equal to call 1's in some rows), rows
    wide enough for the row-sorted CPU kernel: the guard's batched calls equal the loop bitwise."""
    g = torch.Generator().manual_seed(10 + threads)
    for trial in range(trials):
        b = int(torch.randint(1, 9, (), generator=g))
        m = int(torch.randint(1, 6, (), generator=g))
        ncalls = 2 + trial % 2
        rest = [[], [16], [33], [3, 16]][trial % 4]
        d = int(torch.randint(0, len(rest) + 1, (), generator=g))
        row = rest[:d] + [m] + rest[d:]
        out = torch.randn(b, *row, generator=g, dtype=dtype)
        calls = []
        for c in range(ncalls):
            k = int(torch.randint(1, 80, (), generator=g))
            if c and trial % 3 == 0:
                k = calls[0][0].shape[1]
            srow = rest[:d] + [k] + rest[d:]
            src = torch.randn(b, *srow, generator=g, dtype=dtype) * torch.exp(6 * torch.randn(b, *srow, generator=g, dtype=dtype))
            idx = torch.randint(0, m, (b, k), generator=g).to(dtype) + 0.5 * torch.rand(b, k, generator=g, dtype=dtype)
            if c and trial % 3 == 0:
                idx[::2] = calls[0][0][::2]  # the same targets as call 1 in every other row
            calls.append((idx, "long", src))
        loop = out.clone()
        for i in range(b):
            for idx, _, src in calls:
                loop[i].index_add_(d, idx[i].long(), src[i])
        fast = out.clone()
        got = scatter.scatter_add_calls(range(b), fast, d, *calls)
        target, dim = got[:2]
        for c in range(ncalls):
            target.scatter_add_(dim, got[2 + 2 * c], got[3 + 2 * c])
        assert torch.equal(loop, fast), (trial, b, m, ncalls, row, d)
        if d == 0:
            alphas = [float(torch.randn((), generator=g)), 1]
            loop = out.clone()
            for i in range(b):
                for (idx, _, src), alpha in zip(calls, alphas + [1]):
                    loop[i].index_add_(0, idx[i].long(), src[i], alpha=alpha)
            fast = out.clone()
            got = scatter.index_add_calls(range(b), fast, 0, *[c + (a,) for c, a in zip(calls, alphas + [1])])
            for c in range(ncalls):
                got[0].index_add_(0, got[1 + 3 * c], got[2 + 3 * c], alpha=got[3 + 3 * c])
            assert torch.equal(loop, fast), (trial, "alpha", b, m, ncalls, row)


TWO = """\
    import torch
    def f(out, l, u, w_l, w_u, n):
        for i in range(n):
            out[i].index_add_(0, l[i].long(), w_l[i])
            out[i].index_add_(0, u[i].long(), w_u[i])
        return out
    """


def _two(b=4, m=6, k=5, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(b, m, dtype=dtype, generator=g)
    l = torch.randint(0, m, (b, k), generator=g).double()
    u = torch.randint(0, m, (b, k), generator=g).double()
    return out, l, u, torch.randn(b, k, dtype=dtype, generator=g), torch.randn(b, k, dtype=dtype, generator=g)


def _same_as_loop(form, args, fast):
    orig, new, spy, _, _ = pair(form, "f")
    a, b = [clone(x) for x in args], [clone(x) for x in args]
    ea, eb = raised(orig, *a), raised(new, *b)
    assert ea is eb
    assert spy.calls == 1 and spy.fast == fast
    assert torch.equal(a[0], b[0])
    return ea, a[0]


@pytest.mark.parametrize("bad", [6.0, 6.5, -1.0, -7.0, float("nan"), float("inf"), float("-inf"), 1e30])
def test_bad_index_in_the_second_call_only_raises_like_the_loop(bad):
    """Rows 0, 1, row 2's first call (and part of its second) are written before the loop raises;
    the guard declines (NaN/inf: the cast's value is not defined by the data), the loop runs."""
    out, l, u, wl, wu = _two()
    u[2, 3] = bad
    err, after = _same_as_loop(TWO, (out, l, u, wl, wu, 4), fast=0)
    assert err is not None and not torch.equal(after, out)


def test_fractional_indices_truncate_as_in_the_loop():
    out, l, u, wl, wu = _two()
    l[0, 0], l[1, 1], u[2, 2], u[3, 0] = -0.75, 5.999, 0.5, -0.0  # truncate into [0, m)
    _same_as_loop(TWO, (out, l, u, wl, wu, 4), fast=1)


def test_integer_index_casts_as_in_the_loop():
    out, l, u, wl, wu = _two()
    wrap = l.long().to(torch.int32)
    wrap[1, 2] += 2**32  # int64 → .int() wraps back into range, row by row or as a batch
    src = TWO.replace("l[i].long()", "l[i].int()")
    _same_as_loop(src, (out, l.long() + wrap.long() * 0 + (wrap.long() - l.long()), u.to(torch.uint8), wl, wu, 4), fast=1)
    _same_as_loop(TWO, (out, l.bool(), u.int(), wl, wu, 4), fast=1)
    # int32 wrap-around to a negative index: both raise
    big = l.long()
    big[1, 2] = 2**31 + 3
    _same_as_loop(src, (out, big, u, wl, wu, 4), fast=0)


@pytest.mark.filterwarnings("ignore:Casting complex values")
def test_second_call_problems_run_the_loop():
    out, l, u, wl, wu = _two()
    # dtype mismatch in the second source: the loop raises after row 0's first call
    err, after = _same_as_loop(TWO, (out, l, u, wl, wu.float(), 4), fast=0)
    assert err is RuntimeError and not torch.equal(after, out)
    # second source of the wrong width
    err, _ = _same_as_loop(TWO, (out, l, u, wl, torch.randn(4, 4, dtype=torch.float64), 4), fast=0)
    assert err is not None
    # second index shorter than the range: IndexError at row 3, after rows 0-2
    err, after = _same_as_loop(TWO, (out, l, u[:3], wl, wu, 4), fast=0)
    assert err is IndexError and not torch.equal(after, out)
    # complex index: not a dtype the guard casts
    _same_as_loop(TWO, (out, l, u.to(torch.complex128), wl, wu, 4), fast=0)


def test_aliasing_with_any_call_runs_the_loop():
    out, l, u, wl, wu = _two(k=6)
    buf = torch.cat([out, wu])  # the second source shares out's storage
    a, b = buf.clone(), buf.clone()
    orig, new, spy, _, _ = pair(TWO, "f")
    orig(a[:4], l, u, wl, a[4:], 4)
    new(b[:4], l, u, wl, b[4:], 4)
    assert spy.fast == 0 and torch.equal(a, b)
    # the second (float) index row read from out itself, after the first call wrote it (values
    # leave [0, m) and the loop raises part-way; the guard must not batch it)
    for scale in (1.0, 0.0):
        a, b = out.abs().floor().clamp(0, 5), out.abs().floor().clamp(0, 5)
        assert raised(orig, a, l, a, wl * scale, wu, 4) is raised(new, b, l, b, wl * scale, wu, 4)
        assert spy.fast == 0 and torch.equal(a, b)


def test_guard_checks_before_writing():
    out, l, u, wl, wu = _two()
    before = out.clone()
    assert scatter.scatter_add_calls(range(4), out, 0, (l, "long", wl), (u, "long", wu.float())) is None
    u[3, 4] = float("nan")
    assert scatter.scatter_add_calls(range(4), out, 0, (l, "long", wl), (u, "long", wu)) is None
    assert scatter.scatter_add_calls(range(4), out, 0, (l, "short", wl)) is None
    assert scatter.scatter_add_calls(range(4), out, 0) is None
    assert scatter.index_add_calls(range(4), out, 0, (l, "long", wl, 0.5), (u, "long", wu, None)) is None
    assert torch.equal(out, before)


LEFT_ALONE_MULTI = {
    "different dims": ("""\
        def f(out, a, x, b, y, n):
            for i in range(n):
                out[i].index_add_(0, a[i], x[i])
                out[i].index_add_(1, b[i], y[i])
        """, "the index_add_ calls index different dims (`0` and `1`)"),
    "another output": ("""\
        def f(out, other, a, x, b, y, n):
            for i in range(n):
                out[i].index_add_(0, a[i], x[i])
                other[i].index_add_(0, b[i], y[i])
        """, "the index_add_ calls write different outputs (`out` and `other`)"),
    "a call on another row": ("""\
        def f(out, a, x, b, y, n):
            for i in range(n):
                out[i].index_add_(0, a[i], x[i])
                out[i + 1].index_add_(0, b[i], y[i])
        """, "not the current row `out[i]`"),
    "statement reading out between calls": ("""\
        def f(out, a, x, b, y, n):
            for i in range(n):
                out[i].index_add_(0, a[i], x[i])
                out[i] /= out[i].sum()
                out[i].index_add_(0, b[i], y[i])
        """, "uses `out` (loop-carried through it)"),
    "statement between calls": ("""\
        def f(out, a, x, b, y, cnt, n):
            for i in range(n):
                out[i].index_add_(0, a[i], x[i])
                cnt[i] += 1
                out[i].index_add_(0, b[i], y[i])
        """, "the body also runs `cnt[i] += 1`; only per-row index_add_ calls are rewritten"),
    "second index reads out": ("""\
        def f(out, a, x, y, n):
            for i in range(n):
                out[i].index_add_(0, a[i], x[i])
                out[i].index_add_(0, out[i].argmax().view(1).long(), y[i])
        """, "reads `out`, which the loop writes"),
    "second source reads out": ("""\
        def f(out, a, b, x, n):
            for i in range(n):
                out[i].index_add_(0, a[i], x[i])
                out[i].index_add_(0, b[i], out[i] * 0.5)
        """, "reads `out`, which the loop writes"),
    "float cast": ("""\
        def f(out, a, x, n):
            for i in range(n):
                out[i].index_add_(0, a[i].float(), x[i])
        """, "only `.long()`, `.int()` and `.to(torch.long/int64/int32)` are taken"),
    "to a device": ("""\
        def f(out, a, x, n, dev):
            for i in range(n):
                out[i].index_add_(0, a[i].to(dev), x[i])
        """, "not to int64/int32"),
    "to int16": ("""\
        import torch
        def f(out, a, x, n):
            for i in range(n):
                out[i].index_add_(0, a[i].to(torch.int16), x[i])
        """, "not to int64/int32"),
    "cast with arguments": ("""\
        import torch
        def f(out, a, x, n):
            for i in range(n):
                out[i].index_add_(0, a[i].long(memory_format=torch.preserve_format), x[i])
        """, "has arguments"),
    "cast before the row": ("""\
        def f(out, l, x, n):
            for i in range(n):
                out[i].index_add_(0, l.long()[i], x[i])
        """, "is not a row `X[i]` of a plain name/attribute"),
    "zip with two calls": ("""\
        def f(out, idx, src):
            for o, j, s in zip(out, idx, src):
                o.index_add_(0, j, s)
                o.index_add_(0, j, s)
        """, "several calls are rewritten in `for i in range(...)` loops only"),
    "alpha per row in the second call": ("""\
        def f(out, a, x, b, y, w, n):
            for i in range(n):
                out[i].index_add_(0, a[i], x[i])
                out[i].index_add_(0, b[i], y[i], alpha=w[i])
        """, "alpha `w[i]` is not a plain value"),
}


@pytest.mark.parametrize("name", sorted(LEFT_ALONE_MULTI))
def test_left_alone_several_calls(name):
    src, reason = LEFT_ALONE_MULTI[name]
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src)
    reasons = [s.reason for s in sites if s.action == SKIPPED]
    assert len(reasons) == 1 and reason in reasons[0], reasons


@pytest.mark.parametrize("method", ["scatter_add_", "scatter_", "index_copy_"])
def test_per_row_scatters_it_does_not_batch_are_reported(method):
    """A C51 projection written with ``m[i].scatter_add_`` (or another per-row in-place scatter):
    left as written, with a site that says so, never silently."""
    src = textwrap.dedent(f"""\
        import torch

        def project(m, l, u, b, next_dist, n):
            for i in range(n):
                m[i].{method}(0, l[i], next_dist[i] * (u[i] - b[i]))
            return m
        """)
    out, sites = rewrite(src)
    assert out == src
    assert [(s.line, s.action) for s in sites] == [(4, SKIPPED)], sites
    assert f"per-row `.{method}(...)` calls: not batched" in sites[0].reason
