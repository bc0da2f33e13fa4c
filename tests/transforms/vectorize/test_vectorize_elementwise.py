"""vectorize.elementwise: index loops and stacked comprehensions become slice expressions.

Differential tests exec original and rewrite on the same inputs (hypothesis: lengths 0..6 incl.
0 and 1, element shapes, dtypes incl. float16/bfloat16, containers) and require bitwise equality
where the site says ``exact``, plus equal gradients; guard tests check the original loop runs for
what the runtime declines (aliasing outputs, lists, out-of-range indices, mixed dtypes).
"""
import itertools
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalebox_cst.report import EXACT, REWRITTEN, SKIPPED
from scalebox_cst.runtime import loop_batch
from scalebox_cst.transforms import REGISTRY
from scalebox_cst.transforms.vectorize.elementwise import ID, VectorizeElementwise
import harness
from harness import pairer, rewriter


rewrite = rewriter(ID)  # (text, sites); load, pair: the shared differential harness (tests/harness.py)
pair = pairer(ID)


def clone(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone().requires_grad_(x.requires_grad)
    if isinstance(x, list):
        return [clone(t) for t in x]
    return x


def same(a, b, exact):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.shape == b.shape and a.dtype == b.dtype
        if exact:
            assert torch.equal(a, b) or (torch.isnan(a).any() and torch.equal(a.nan_to_num(), b.nan_to_num()))
        else:
            torch.testing.assert_close(a, b, equal_nan=True)
    else:
        assert a == b


def test_registered_before_grad_clip():
    ids = [cls.id for cls in REGISTRY]
    assert ID in ids
    if "grad_clip" in ids:
        assert ids.index(ID) < ids.index("grad_clip")


# ------------------------------------------------------------------ EXAMPLES

@pytest.mark.parametrize("example", [e for e in VectorizeElementwise.EXAMPLES if e.rewritten], ids=lambda e: e.note[:40])
def test_examples_rewrite_one_site(example):
    """Outputs, reasons and inputs side by side: tests/transforms/test_examples_registry.py."""
    _, sites = rewrite(example.code, dedent=False)
    assert len([s for s in sites if s.action == REWRITTEN]) == 1


def test_golden_loop():
    src = """\
    def scale(rewards, values, out, gamma):
        # bootstrap
        for i in range(len(rewards)):
            out[i] = rewards[i] + gamma * values[i]
        return out
    """
    out, sites = rewrite(src)
    assert out == textwrap.dedent(
        """\
        from scalebox_cst.runtime.loop_batch import batch_range as _sb_batch_range
        def scale(rewards, values, out, gamma):
            # bootstrap
            _sb_batch = _sb_batch_range(range(len(rewards)), (rewards, values), (gamma,), (), (out,), 0, True)
            if _sb_batch is not None:
                _sb_rewards, _sb_values, _sb_rows = _sb_batch
                out[_sb_rows] = _sb_rewards + gamma * _sb_values
            else:
                for i in range(len(rewards)):
                    out[i] = rewards[i] + gamma * values[i]
            return out
        """
    )
    assert [(s.line, s.end_line, s.action, s.exactness) for s in sites] == [(3, 4, REWRITTEN, EXACT)]


# ------------------------------------------------------------------ hypothesis differential

LOOPS = {
    "arith": ("""\
        def f(a, b, out, c):
            for i in range(len(a)):
                out[i] = (a[i] - b[i]) * c + a[i] / 3
            return out
        """, True),
    "two_outputs": ("""\
        import torch
        def f(a, b, out, c):
            out2 = torch.zeros_like(out)
            for i in range(len(a)):
                out[i] = torch.maximum(a[i], b[i])
                out2[i] = -a[i].abs() + c
            return out, out2
        """, True),
    "sqrt_clamp": ("""\
        import torch
        def f(a, b, out, c):
            for j in range(0, len(a)):
                out[j] = torch.sqrt(a[j].abs()).clamp(max=c) * b[j]
            return out
        """, True),
    "exp": ("""\
        import torch
        def f(a, b, out, c):
            for i in range(len(a)):
                out[i] = torch.exp(a[i]) * b[i]
            return out
        """, False),
}
COMPS = {
    "stack": ("""\
        import torch
        def f(a, b, out, c):
            return torch.stack([x * c - y for x, y in zip(a, b)])
        """, True),
    "stack_range": ("""\
        import torch
        def f(a, b, out, c):
            return torch.stack([a[k] / (b[k] + 10.0) for k in range(len(a))], dim=0)
        """, True),
    "cat": ("""\
        import torch as th
        def f(a, b, out, c):
            return th.cat([th.sigmoid(x) + c for x in a])
        """, False),
}


def make(kind, n, shape, dtype, grad=False):
    base = torch.randn(n, *shape, dtype=dtype)
    if kind == "list":
        return [t.clone().requires_grad_(grad) for t in base]
    return base.requires_grad_(grad)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    form=st.sampled_from(sorted(LOOPS) + sorted(COMPS)),
    n=st.integers(0, 6),
    shape=st.sampled_from([(), (1,), (3,), (2, 2)]),
    kinds=st.tuples(st.sampled_from(["tensor", "list"]), st.sampled_from(["tensor", "list"])),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
    c=st.sampled_from([0.5, 2, -1.25]),
    seed=st.integers(0, 2**16),
)
def test_forms_differential(form, n, shape, kinds, dtype, c, seed):
    src, exact_form = LOOPS.get(form) or COMPS[form]
    orig, new, _, sites = pair(src, "f")
    assert [s.action for s in sites] == [REWRITTEN]
    assert (sites[0].exactness == EXACT) == exact_form
    torch.manual_seed(seed)
    grad = form in COMPS
    a, b = make(kinds[0], n, shape, dtype, grad), make(kinds[1], n, shape, dtype)
    out = torch.zeros(n, *shape, dtype=dtype)
    args = [a, b, out, c]
    try:
        r1 = orig(*clone(args))
    except (RuntimeError, TypeError, IndexError, ValueError) as exc:  # stack([]) and friends
        with pytest.raises(type(exc)):
            new(*clone(args))
        return
    a1, a2 = clone(args), clone(args)
    r1, r2 = orig(*a1), new(*a2)
    for x, y in zip(r1 if isinstance(r1, tuple) else [r1], r2 if isinstance(r2, tuple) else [r2]):
        same(x, y, exact=exact_form)
    if grad and isinstance(r1, torch.Tensor) and r1.requires_grad:
        leaves1 = a1[0] if isinstance(a1[0], list) else [a1[0]]
        leaves2 = a2[0] if isinstance(a2[0], list) else [a2[0]]
        g1 = torch.autograd.grad(r1.float().sum(), leaves1)
        g2 = torch.autograd.grad(r2.float().sum(), leaves2)
        for x, y in zip(g1, g2):
            same(x, y, exact=exact_form)


def test_fast_path_is_taken():
    a = torch.randn(4, 3)
    out = torch.zeros(4, 3)
    got = loop_batch.batch_range(range(4), (a, list(a)), (2.0,), (), (out,), 0, True)
    assert got is not None and got[-1] == slice(0, 4, 1)


# ------------------------------------------------------------------ guards

LOOP = """\
def f(a, out):
    for i in range(len(a)):
        out[i] = a[i] * 2 + 1
    return out
"""


def test_guard_output_aliases_input():
    orig, new, _, _ = pair(LOOP, "f")
    x1, x2 = torch.arange(6.0), torch.arange(6.0)
    # out is a shifted view of a: the loop reads values it wrote one step earlier
    r1 = orig(x1[:-1], x1[1:])
    assert loop_batch.batch_range(range(5), (x2[:-1],), (), (), (x2[1:],)) is None
    r2 = new(x2[:-1], x2[1:])
    assert torch.equal(r1, r2) and torch.equal(x1, x2)


def test_guard_output_viewed_by_the_items_of_a_list_operand():
    """A list operand is batched as a stacked copy; the loop reads its items, which here view the
    output one row behind (each step reads what the last wrote): the guard declines, the loop runs.
    Items of their own memory still run batched."""
    orig, new, _, _ = pair(LOOP, "f")

    def shifted():
        out = torch.arange(5.0)
        return [out[0]] + list(out.unbind(0))[:-1], out

    (a1, o1), (a2, o2) = shifted(), shifted()
    assert loop_batch.batch_range(range(5), (a2,), (), (), (o2,)) is None
    assert torch.equal(orig(a1, o1), new(a2, o2)) and torch.equal(o1, o2)
    own = [torch.randn(()) for _ in range(5)]
    assert loop_batch.batch_range(range(5), (own,), (), (), (torch.zeros(5),)) is not None
    assert loop_batch.batch_range(range(1, 5), (own,), (), (), (own[0].reshape(1).expand(5).clone(),)) is not None


def test_guard_output_is_a_list():
    orig, new, _, _ = pair(LOOP, "f")
    a = torch.randn(3)
    r1, r2 = orig(a, [0, 0, 0]), new(a, [0, 0, 0])
    assert all(torch.equal(x, y) for x, y in zip(r1, r2))


def test_guard_output_too_short_raises_like_the_loop():
    orig, new, _, _ = pair(LOOP, "f")
    a = torch.randn(5)
    for fn in (orig, new):
        out = torch.zeros(3)
        with pytest.raises(IndexError):
            fn(a, out)
    o1, o2 = torch.zeros(3), torch.zeros(3)
    try:
        orig(a, o1)
    except IndexError:
        pass
    try:
        new(a, o2)
    except IndexError:
        pass
    assert torch.equal(o1, o2)  # same partial writes before the error


DOUBLE_INTO = """\
def f(a, out):
    for i in range(len(a)):
        out[i] = a[i] * 2
    return out
"""


def test_guard_output_dropping_leading_ones():
    orig, new, _, _ = pair(DOUBLE_INTO, "f")
    a = torch.randn(4, 1, 3)  # each a[i] is [1, 3]; out[i] is [3]: the copy drops the leading 1
    r1, r2 = orig(a, torch.zeros(4, 3)), new(a, torch.zeros(4, 3))
    assert torch.equal(r1, r2)


_ROW_SHAPES = [(), (1,), (3,), (4,), (2, 3), (1, 3), (3, 1), (4, 1)]


def _result(f, *args):
    """What ``f(*args)`` returns, or the type of what it raises."""
    try:
        return f(*args)
    except Exception as e:  # noqa: BLE001 - compared by type
        return type(e)


def test_each_value_broadcasts_into_its_row_for_every_shape(monkeypatch):
    """``out[i] = v`` broadcasts ``v`` into the row ``out[i]``: a value of lower rank than the row
    (a number into a ``[N, 1]`` buffer, a ``[3]`` value into ``[N, 2, 3]``) fills its own row, never
    the others (the batch's first dimension once met a row dimension: wrong rows, or an error)."""
    src = """\
    def f(a, b, out):
        for i in range(len(a)):
            out[i] = a[i] * 0.5 + b[i]
        return out
    """
    spy = harness.GuardSpy(monkeypatch, loop_batch, ["batch_range"])
    orig, new, _, _ = pair(src, "f")
    fast = 0
    for ea, eb, row in itertools.product(_ROW_SHAPES, _ROW_SHAPES, _ROW_SHAPES):
        a, b, out = torch.randn(4, *ea), torch.randn(4, *eb), torch.zeros(4, *row)
        spy.results.clear()
        r1, r2 = _result(orig, a, b, out.clone()), _result(new, a, b, out.clone())
        assert (r1 is r2) if isinstance(r1, type) else torch.equal(r1, r2), (ea, eb, row)
        fast += spy.fast
    assert fast >= 100  # most shapes still take the batched write


def test_guard_output_whose_elements_share_memory():
    orig, new, _, _ = pair(DOUBLE_INTO, "f")
    a = torch.arange(8.0)
    assert torch.equal(orig(a, torch.zeros(1).expand(8)), new(a, torch.zeros(1).expand(8)))
    assert loop_batch.batch_range(range(8), (a,), (), (), (torch.zeros(1).expand(8),)) is None
    assert loop_batch.batch_range(range(4), (a,), (), (), (torch.zeros(4, 6)[:, ::2],)) is not None


def test_guard_mixed_dtypes():
    src = """\
    def f(a, b, out):
        for i in range(len(a)):
            out[i] = a[i] * b[i]
        return out
    """
    orig, new, _, _ = pair(src, "f")
    a, b = torch.randn(4, dtype=torch.float16), torch.randn(4, dtype=torch.float32)
    assert torch.equal(orig(a, b, torch.zeros(4)), new(a, b, torch.zeros(4)))


def test_guard_numpy_arrays_fall_back():
    np = pytest.importorskip("numpy")
    orig, new, _, _ = pair(LOOP, "f")
    a = np.arange(4.0)
    assert np.array_equal(orig(a, np.zeros(4)), new(a, np.zeros(4)))


def test_stack_of_comprehension_in_comprehension_left_alone():
    src = """\
    import torch
    def f(batches):
        return [torch.stack([x * 2 for x in xs]) for xs in batches]
    """
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src)
    assert "inside another comprehension" in sites[0].reason


LEAVE_ALONE = [
    ("""\
    def f(x, out):
        for i in range(len(x)):
            out[i] = x[i] * 2
            print(i)
    """, "not an element-wise assignment"),
    ("""\
    def f(x, out, k):
        for i in range(len(x)):
            out[i] = x[k] * 2
    """, "does not depend on the loop element"),
    ("""\
    def f(x, out):
        for i in range(len(x) - 1):
            out[i] = x[i + 1] - x[i]
    """, "not the current element"),
    ("""\
    def f(x, out):
        for i in range(len(x)):
            out[i] = x[i] * out
    """, "reads an output"),
    ("""\
    def f(x, out):
        for i in range(len(x)):
            out[i] = x[i] * 2
            if x[i] > 0:
                break
    """, None),
    ("""\
    import torch
    def f(xs):
        return torch.stack([x for x in xs])
    """, "nothing is computed"),
    ("""\
    import torch
    def f(xs):
        return torch.stack([x * 2 for x in xs], dim=1)
    """, "other than 0"),
    ("""\
    import torch
    def f(xs):
        return torch.stack([x * 2 for x in xs if x.sum() > 0])
    """, "filter"),
    ("""\
    import torch
    def f(xs):
        return torch.tensor([x * 2 for x in xs])
    """, None),
]


@pytest.mark.parametrize("src,reason", LEAVE_ALONE)
def test_leave_alone(src, reason):
    out, sites = rewrite(src)
    assert out == textwrap.dedent(src)
    if reason is None:
        assert all(s.action != REWRITTEN for s in sites)
    else:
        assert any(reason in s.reason for s in sites if s.action == SKIPPED), sites


def test_all_three_families_compose():
    """A file with all three patterns, every vectorize transform on: each site rewritten once."""
    src = textwrap.dedent(
        """\
        import torch


        def step(net, target, tau, a, out):
            for p, tp in zip(net.parameters(), target.parameters()):
                tp.data.copy_(tau * p.data + (1 - tau) * tp.data)
            total = 0
            for i in range(len(a)):
                total += a[i] * a[i]
            for i in range(len(a)):
                out[i] = a[i] - 1
            return total, out
        """
    )
    result = harness.rewrite_result(src, "vectorize.*")
    assert result.report.error is None
    done = sorted((s.transform, s.line) for s in result.report.sites if s.action == REWRITTEN)
    assert done == [("vectorize.elementwise", 10), ("vectorize.reduction", 8), ("vectorize.target_update", 5)]
    ns1, ns2 = harness.run_pair(src, result.output, {})
    torch.manual_seed(0)
    net, target = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    a = torch.randn(5)
    t1, t2 = [torch.nn.Linear(3, 2) for _ in range(2)]
    t2.load_state_dict(t1.state_dict())
    r1 = ns1["step"](net, t1, 0.1, a, torch.zeros(5))
    r2 = ns2["step"](net, t2, 0.1, a, torch.zeros(5))
    torch.testing.assert_close(r1[0], r2[0])
    assert torch.equal(r1[1], r2[1])
    for p, q in zip(t1.parameters(), t2.parameters()):
        assert torch.equal(p, q)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("form", sorted(LOOPS) + sorted(COMPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_forms(form, dtype, capsys):
    src, exact_form = LOOPS.get(form) or COMPS[form]
    orig, new, _, sites = pair(src, "f")
    torch.manual_seed(0)
    a = torch.randn(257, 3, dtype=dtype, device="cuda")
    b = torch.randn(257, 3, dtype=dtype, device="cuda")
    out = torch.zeros(257, 3, dtype=dtype, device="cuda")
    r1, r2 = orig(a, b, out.clone(), 0.7), new(a, b, out.clone(), 0.7)
    r1 = r1 if isinstance(r1, tuple) else (r1,)
    r2 = r2 if isinstance(r2, tuple) else (r2,)
    bitwise = all(torch.equal(x, y) for x, y in zip(r1, r2))
    with capsys.disabled():
        print(f"\ncuda {form} {dtype}: claimed {sites[0].exactness}, bitwise equal: {bitwise}")
    for x, y in zip(r1, r2):
        same(x, y, exact=exact_form)


@pytest.mark.parametrize(
    "src",
    [
        """\
        import torch
        def f(net, target, tau, a, out, xs, w):
            for p, tp in zip(net.parameters(), target.parameters()):
                tp.data.copy_(tau * p.data + (1 - tau) * tp.data)
            total = 0
            for i in range(len(a)):
                total += a[i] * a[i]
            for i in range(len(a)):
                out[i] = a[i] - 1
            return torch.stack([x * w for x in xs]), total
        """,
    ],
)
def test_rewriting_rewritten_code_changes_nothing(src):
    """Loops kept verbatim under a guard are not rewritten again (idempotent pipeline)."""
    once = harness.rewrite_result(src, "vectorize.*", dedent=True)
    assert sum(s.action == REWRITTEN for s in once.report.sites) == 4
    twice = harness.rewrite_result(once.output, "vectorize.*")
    assert twice.output == once.output
    assert all(s.action != REWRITTEN for s in twice.report.sites)


def test_global_loop_index_is_left_alone():
    """The rewrite does not leave the index behind; a global index may be read by other code."""
    src = (
        "def f(x, out):\n"
        "    global i\n"
        "    for i in range(len(x)):\n"
        "        out[i] = x[i] * 2\n"
        "    return out\n"
    )
    out, sites = rewrite(src)
    assert out == src
    assert [s.action for s in sites] == [SKIPPED] and "global" in sites[0].reason


def test_comprehension_of_method_calls_says_why_before_the_dimension():
    """Found by the whole-file sweep (SB3 MultiCategoricalDistribution): a stack over dim=1 of
    per-distribution method calls was skipped for its dimension, though what rules it out is the
    call; the element check now comes first."""
    src = (
        "import torch\n"
        "def entropy(dists):\n"
        "    return torch.stack([d.entropy() for d in dists], dim=1).sum(dim=1)\n"
    )
    out, sites = rewrite(src)
    assert out == src
    assert [s.reason for s in sites] == [
        "calls `d.entropy`, which is not known to act element by element (or may have side effects)"
    ]
    # an element-wise comprehension over another dimension keeps the dimension reason
    src2 = "import torch\ndef f(xs):\n    return torch.stack([x * 2 for x in xs], dim=1)\n"
    out2, sites2 = rewrite(src2)
    assert out2 == src2 and [s.reason for s in sites2] == ["torch.stack over a dimension other than 0"]


# ------------------------------------------------------------------ items of an element (issue 20)

GATHER = """\
import torch
def collate(trajectories, keys):
    return {k: torch.cat([trajectory[k] for trajectory in trajectories]) for k in keys}
"""


def test_comprehension_gathering_items_says_there_is_nothing_to_batch():
    """A dict comprehension of torch.cat over an item of each trajectory carries nothing from one
    element to the next (was: "possible loop-carried dependence"): nothing is computed per
    element, the cat is one call already."""
    out, sites = rewrite(GATHER)
    assert out == GATHER
    assert [s.action for s in sites] == [SKIPPED]
    assert "each element contributes `trajectory[k]`, an item of it, with nothing computed" in sites[0].reason
    assert "loop-carried" not in sites[0].reason


@pytest.mark.parametrize("body, reason", [
    ("out[i] = x[i][k] * 2", "reads `x[i][k]`, an item of a loop element"),
    ("out[i] = x[i][i] * 2", "not the current element"),  # indexed by the loop index: not an invariant item
    ("out[i] = x[i + 1] - x[i]", "not the current element"),
])
def test_item_reads_in_loops_have_accurate_reasons(body, reason):
    src = f"def f(x, out, k):\n    for i in range(len(out)):\n        {body}\n"
    out, sites = rewrite(src)
    assert out == src
    assert [s.action for s in sites] == [SKIPPED] and reason in sites[0].reason, sites
