"""vectorize.elementwise, per-row ``out[i].index_add_(dim, idx[i], src[i])`` loops → one op.

Differential tests exec original and rewrite on the same inputs (hypothesis: 0..6 rows, rows of
rank 1..3, duplicate indices, every dim incl. negative, alpha, float32/float64/int64, int32 and
int64 indices, non-contiguous operands) and require bitwise equality (the sites claim ``exact`` on
CPU), and that the fast path actually ran; a stress test compares the guard's op with the loop on
larger inputs (the row-sorted CPU scatter kernel included); guard tests check that the loop runs,
raising what it raises with the same partial writes, for what the guard declines; leave-alone
tests for the look-alikes; the EXAMPLES.
"""
import functools
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalebox_cst.config import Config
from scalebox_cst.pipeline import Pipeline
from scalebox_cst.report import EXACT, REASSOCIATED, REWRITTEN, SKIPPED
from scalebox_cst.runtime import scatter
from scalebox_cst.transforms.elementwise_scatter import EXAMPLES, LEFT_ALONE_EXAMPLES
from scalebox_cst.transforms.vectorize_elementwise import ID, VectorizeElementwise


def rewrite(src, backend="cpu"):
    src = textwrap.dedent(src)
    result = Pipeline(Config(transforms=[ID]), backend=backend).rewrite("t.py", src.encode())
    assert result.report.error is None, result.report.error
    return result.output.decode(), result.report.sites


def load(code, name):
    ns = {}
    exec(compile(code, "<t>", "exec"), ns)
    return ns[name], ns


class Spy:
    """Wraps a guard helper in the rewritten module: counts calls and fast-path answers."""

    def __init__(self, fn):
        self.fn, self.calls, self.fast = fn, 0, 0

    def __call__(self, *args):
        self.calls += 1
        got = self.fn(*args)
        self.fast += got is not None
        return got


@functools.lru_cache(maxsize=None)
def _pair_cached(src, name):
    out, sites = rewrite(src)
    return out, tuple(sites)


def pair(src, name):
    """(original fn, rewritten fn, spy on its guard, rewritten code, sites)."""
    src = textwrap.dedent(src)
    out, sites = _pair_cached(src, name)
    orig, _ = load(src, name)
    new, ns = load(out, name)
    helper = next((k for k in ns if k in ("_sb_scatter_add_rows", "_sb_index_add_rows")), None)
    spy = None
    if helper:
        spy = ns[helper] = Spy(ns[helper])
    return orig, new, spy, out, list(sites)


def clone(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone().requires_grad_(x.requires_grad)
    return x


def run_both(orig, new, *args):
    """Run both on clones of ``args``; return (original's args after, rewrite's args after, results)."""
    a, b = [clone(x) for x in args], [clone(x) for x in args]
    orig(*a)
    new(*b)
    return a, b


# ------------------------------------------------------------------ EXAMPLES


def _rows(b, m, k, rest=(), dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(b, m, *rest, generator=g, dtype=dtype)
    idx = torch.randint(0, m, (b, k), generator=g)
    src = torch.randn(b, k, *rest, generator=g, dtype=dtype)
    return out, idx, src


EXAMPLE_INPUTS = {
    "per-row segment sum (index_add_ → scatter_add_)": lambda: (
        torch.randn(5, 9, dtype=torch.float64), torch.randint(0, 4, (5, 9)), 4),
    "message passing per graph, keyword arguments": lambda: (
        torch.randn(3, 11, 8), torch.randint(0, 6, (3, 11)), torch.zeros(3, 6, 8)),
    "per-row index_add_ with alpha (flattened index_add_)": lambda: _rows(4, 5, 12, (3,)) + (0.3,),
    "zip over rows, negative dim": lambda: (
        torch.randn(4, 2, 6), torch.randint(0, 6, (4, 7)), torch.randn(4, 2, 7)),
}


def test_examples_cover_both_kinds():
    assert any(e.rewritten for e in EXAMPLES) and any(not e.rewritten for e in EXAMPLES)
    assert set(EXAMPLE_INPUTS) == {e.note for e in EXAMPLES if e.rewritten}


def test_left_alone_examples_are_the_transforms():
    for e in LEFT_ALONE_EXAMPLES:
        assert e in VectorizeElementwise.EXAMPLES


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.note[:40])
def test_examples(example):
    out, sites = rewrite(example.code)
    if not example.rewritten:
        assert out == example.code
        reasons = [s.reason for s in sites if s.action == SKIPPED]
        assert any(example.reason in r for r in reasons), reasons
        return
    done = [s for s in sites if s.action == REWRITTEN]
    assert len(done) == 1 and done[0].exactness == EXACT
    name = example.code.split("def ")[1].split("(")[0]
    orig, _ = load(example.code, name)
    new, ns = load(out, name)
    args = EXAMPLE_INPUTS[example.note]()
    spy = ns["_sb_scatter_add_rows" if "_sb_scatter_add_rows" in ns else "_sb_index_add_rows"] = Spy(
        ns.get("_sb_scatter_add_rows") or ns["_sb_index_add_rows"]
    )
    a, b = [clone(x) for x in args], [clone(x) for x in args]
    ra, rb = orig(*a), new(*b)
    assert spy.fast == 1
    assert torch.equal(ra, rb)


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
        """, "only a lone per-row index_add_"),
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


def test_two_index_adds_into_the_same_rows_say_so():
    """Found by the whole-file sweep (CleanRL C51's distribution projection): two per-row
    index_add_ calls into the same output were reported as "loop-carried through it", which
    they are not; the reason now says what stops the rewrite."""
    src = (
        "def project(target, lo, hi, w_lo, w_hi):\n"
        "    for i in range(target.size(0)):\n"
        "        target[i].index_add_(0, lo[i], w_lo[i])\n"
        "        target[i].index_add_(0, hi[i], w_hi[i])\n"
    )
    out, sites = rewrite(src)
    assert out == src
    assert [s.action for s in sites] == [SKIPPED]
    assert sites[0].reason == "the body makes 2 index_add_ calls into `target`; only a lone per-row index_add_ is rewritten"
