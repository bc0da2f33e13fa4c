"""Differential tests of scalebox_cst.runtime.fused.fused_linear against the loop it replaces.

The reference is the spec's meaning taken literally: the program text becomes
``for t in range(T - 1, -1, -1):`` + its statements (each tail ``X[T] = NAME`` turns the reads
``X[t + 1]`` into ``(NAME if t == T - 1 else X[t + 1])``) and runs with torch on clones of the same
values. Every accepted call must agree bitwise (NaN where NaN, the sign of every zero) in the
returned carried value and every output, and leave rows >= T and every input untouched; every
refused call returns None and writes nothing. Where the spec leaves acceptance open (spellings it
does not list, the implementation's extensions: ``stop=1``, [1, N] tails and init, ``del S``) a
call must be refused or exact.
"""

import ast
import io
import keyword
import math
import os
import subprocess
import sys
import textwrap
import tokenize

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from scalebox_cst.runtime.fused import available, fused_linear, params_of
import harness

HAS_KERNEL = available()
needs_kernel = pytest.mark.skipif(
    not HAS_KERNEL, reason="scalebox_cst.runtime._fused_c not built (setup.py build_ext --inplace)"
)
INF, NAN = math.inf, math.nan

GAE = (
    "dones[T] = next_done; values[T] = next_value; nextnonterminal = 1.0 - dones[t + 1]; "
    "nextvalues = values[t + 1]; delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]; "
    "advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam"
)
RETURNS = "ret[t] = running = rewards[t] + gamma * (1 - dones[t]) * running"
# S in the middle of a product: (gamma * S) * (1 - d) is not B + A * S (reading it as A = gamma * (1 - d)
# would reassociate), so the spec leaves it outside; it must be refused or computed as written
RETURNS_S_INSIDE = "ret[t] = running = rewards[t] + gamma * running * (1 - dones[t])"


# ---------------------------------------------------------------- the reference


def _tokens(program):
    return [
        tok.string
        for tok in tokenize.generate_tokens(io.StringIO(program).readline)
        if tok.type == tokenize.NAME and not keyword.iskeyword(tok.string)
    ]


def _assigned(program):
    """(carried, temporaries): the Name targets; the carried one reads itself in its statement."""
    names, carried = [], None
    for stmt in ast.parse(program).body:
        if not isinstance(stmt, ast.Assign):
            continue
        reads = {n.id for n in ast.walk(stmt.value) if isinstance(n, ast.Name)}
        for tgt in stmt.targets:
            if isinstance(tgt, ast.Name):
                names.append(tgt.id)
                if tgt.id in reads:
                    carried = tgt.id
    return carried, {n for n in names if n != carried}


def free_names(program):
    """The params as the spec defines them, computed independently of params_of."""
    _, temps = _assigned(program)
    out = []
    for name in _tokens(program):
        if name not in ("t", "T") and name not in temps and name not in out:
            out.append(name)
    return tuple(out)


def _ordered(program, values):
    """values as a list in free-name order (a dict is looked up by name)."""
    if isinstance(values, dict):
        return [values[n] for n in free_names(program)]
    return list(values)


class _Tails(ast.NodeTransformer):
    def __init__(self, tails):
        self.tails = tails

    def visit_Subscript(self, node):
        self.generic_visit(node)
        s = node.slice
        if (
            isinstance(node.value, ast.Name)
            and node.value.id in self.tails
            and isinstance(node.ctx, ast.Load)
            and isinstance(s, ast.BinOp)
            and isinstance(s.op, ast.Add)
            and isinstance(s.left, ast.Name)
            and s.left.id == "t"
            and isinstance(s.right, ast.Constant)
            and s.right.value == 1
        ):
            name = self.tails[node.value.id]
            return ast.parse(f"({name} if t == T - 1 else {ast.unparse(node)})", mode="eval").body
        return node


def loop_source(program, stop=0):
    """The loop the program is the body of, tails turned into the last step's reads."""
    tails, body, after = {}, [], ""
    stmts = ast.parse(program).body
    if stmts and isinstance(stmts[-1], ast.Delete):  # ``del S``: after the loop
        after = "\n" + ast.unparse(stmts.pop())
    for stmt in stmts:
        tgt = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
        if (
            isinstance(tgt, ast.Subscript)
            and isinstance(tgt.slice, ast.Name)
            and tgt.slice.id == "T"
            and isinstance(stmt.value, ast.Name)
        ):
            tails[tgt.value.id] = stmt.value.id
        else:
            body.append(stmt)
    rewritten = [ast.fix_missing_locations(_Tails(tails).visit(s)) for s in body]
    body = "\n".join(ast.unparse(s) for s in rewritten)
    return f"for t in range(T - 1, {stop - 1}, -1):\n" + textwrap.indent(body, "    ") + after


def _clone(v):
    return v.clone() if isinstance(v, torch.Tensor) else v


def reference(program, T, values, stop=0):
    """Run the loop itself on clones; returns (carried value, {name: value after})."""
    names = free_names(program)
    carried, _ = _assigned(program)
    ns = {name: _clone(v) for name, v in zip(names, values)}
    ns["T"] = T
    harness.load(loop_source(program, stop), filename="<loop>", namespace=ns)
    return ns.get(carried), ns  # None: no value handed back (``del S``, a recurrence through memory)


def test_the_reference_is_the_loop():
    """The reference itself, on CleanRL's own loop (no fused_linear involved)."""
    T, N = 5, 2
    vals = gae_values(T, N)
    dones, next_done, values, next_value, rewards, gamma, adv, _, lam = [_clone(v) for v in vals]
    lastgaelam = 0
    for t in reversed(range(T)):
        if t == T - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        adv[t] = lastgaelam = delta + gamma * lam * nextnonterminal * lastgaelam
    got, after = reference(GAE, T, vals)
    assert torch.equal(got, lastgaelam) and torch.equal(after["advantages"], adv)
    assert not torch.equal(vals[6], adv)  # the reference wrote clones


# ---------------------------------------------------------------- comparisons


def _shares(a, b):
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or not a.numel() or not b.numel():
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def assert_bitwise(got, want, what):
    assert type(got) is torch.Tensor, f"{what}: {type(got)}"
    want = torch.as_tensor(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{what}: {m}")
    zeros = want == 0
    assert torch.equal(torch.signbit(got[zeros]), torch.signbit(want[zeros])), f"{what}: the sign of a zero"


def assert_untouched(values, before, what="value"):
    for i, (v, b) in enumerate(zip(values, before)):
        if isinstance(v, torch.Tensor):
            assert v.dtype == b.dtype and v.shape == b.shape, f"{what} {i}"
            if v.is_meta:
                continue
            if v.is_sparse:
                v, b = v.to_dense(), b.to_dense()
            if v.is_complex():
                v, b = torch.view_as_real(v), torch.view_as_real(b)
            torch.testing.assert_close(v, b, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{what} {i}: {m}")
            assert torch.equal(torch.signbit(v), torch.signbit(b)), f"{what} {i}: the sign of a zero"
        else:
            assert v is b or v == b or (v != v and b != b), f"{what} {i}"


def output_names(program):
    outs = []
    for stmt in ast.parse(program).body:
        for tgt in getattr(stmt, "targets", []):
            if isinstance(tgt, ast.Subscript) and isinstance(tgt.slice, ast.Name) and tgt.slice.id == "t":
                outs.append(tgt.value.id)
    return set(outs)


def _call(program, T, values, stop):
    """fused_linear as the spec calls it; ``stop`` (the implementation's keyword) only where not 0."""
    if type(stop) is int and stop == 0:
        return fused_linear(program, T, *values)
    return fused_linear(program, T, *values, stop=stop)


def _compare(program, T, values, before, got, stop=0):
    want, after = reference(program, T, before, stop)
    if want is None:
        assert got is True, got
    else:
        assert_bitwise(got, want, "carried value")
        assert got.requires_grad == want.requires_grad
    outs = output_names(program)
    for name, v, b in zip(free_names(program), values, before):
        if name in outs:
            assert_bitwise(v, after[name], f"output {name}")
            if len(v) > T:
                assert_untouched([v[T:]], [b[T:]], f"output {name} rows >= T")
        else:
            assert_untouched([v], [b], f"input {name}")
        assert not _shares(got, v), f"the result shares memory with {name}"


def check(program, T, values, stop=0):
    """fused_linear accepts the call and agrees with the loop bitwise; returns its result."""
    values = _ordered(program, values)
    assert params_of(program) == free_names(program)
    before = [_clone(v) for v in values]
    got = _call(program, T, values, stop)
    assert got is not None, f"refused a supported call: {program!r}, T={T}, stop={stop}"
    _compare(program, T, values, before, got, stop)
    return got


def refused(program, T, values, note="", stop=0):
    """fused_linear returns None (no exception) and every value is as it was."""
    values = _ordered(program, values)
    before = [_clone(v) for v in values]
    got = _call(program, T, values, stop)
    assert got is None, f"accepted {program!r} ({note}): {got}"
    assert_untouched(values, before)


def refused_or_exact(program, T, values, stop=0):
    """Where the spec leaves acceptance open: None and nothing written, or the loop bitwise."""
    values = _ordered(program, values)
    before = [_clone(v) for v in values]
    got = _call(program, T, values, stop)
    if got is None:
        assert_untouched(values, before)
    else:
        _compare(program, T, values, before, got, stop)
    return got


def gae_values(T, N, dtype=torch.float32, seed=0, init=0.0, extra=0):
    """GAE's values in params_of(GAE) order."""
    g = torch.Generator().manual_seed(seed)
    shape = (T,) if N is None else (T, N)
    row = shape[1:]
    dones = (torch.rand(shape, generator=g) < 0.2).to(dtype)
    values = torch.randn(shape, generator=g, dtype=dtype)
    rewards = torch.randn(shape, generator=g, dtype=dtype)
    next_done = (torch.rand(row, generator=g) < 0.5).to(dtype)
    next_value = torch.randn(row, generator=g, dtype=dtype)
    adv = torch.full((T + extra,) + row, 123.0, dtype=dtype)
    return [dones, next_done, values, next_value, rewards, 0.99, adv, init, 0.95]


def _rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ---------------------------------------------------------------- params_of


def test_params_of_orders_free_names_by_first_token():
    assert params_of(GAE) == (
        "dones", "next_done", "values", "next_value", "rewards", "gamma", "advantages", "lastgaelam", "gae_lambda",
    )
    assert params_of(RETURNS) == ("ret", "running", "rewards", "gamma", "dones")
    assert params_of("s = b[t] + a * s") == ("s", "b", "a")
    assert params_of("d = x[t + 2] / y[t]; o[t] = d; s = d + c * s; p[t] = q[t] = s") == (
        "x", "y", "o", "s", "c", "p", "q",
    )
    assert params_of("x[T] = nx; s = -x[t + 1] + s * (k - 1)") == ("x", "nx", "s", "k")
    assert params_of("zz = aa[t] * bb; yy = zz - cc[t + 1]; out[t] = s = yy + bb * zz * s") == (
        "aa", "bb", "cc", "out", "s",
    )
    for prog in (GAE, RETURNS):
        assert params_of(prog) == free_names(prog)


# ---------------------------------------------------------------- without the kernel


@pytest.mark.skipif(HAS_KERNEL, reason="the kernel is built; this checks the unbuilt case")
def test_without_the_extension_every_call_is_refused():
    refused(GAE, 6, gae_values(6, 3), "no extension")


def test_a_failing_extension_import_gives_none_without_raising():
    code = textwrap.dedent(
        """
        import importlib.abc, sys

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "scalebox_cst.runtime._fused_c":
                    raise ImportError("blocked by the test")
                return None

        sys.meta_path.insert(0, Block())
        import torch
        from scalebox_cst.runtime.fused import available, fused_linear
        try:
            import scalebox_cst.runtime._fused_c
        except ImportError:
            pass
        else:
            raise SystemExit("the block did not work")
        assert available() is False
        ret = torch.full((7,), 5.0)
        r, d = torch.ones(6), torch.zeros(6)
        out = fused_linear("ret[t] = running = rewards[t] + gamma * (1 - dones[t]) * running",
                           6, ret, 0.0, r, 0.9, d)
        assert out is None, out
        assert torch.equal(ret, torch.full((7,), 5.0))
        print("ok")
        """
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("SCALEBOX_FUSED_C", None)  # the implementation's switch: only the import fails here
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == "ok"


# ---------------------------------------------------------------- hand-written cases


@needs_kernel
@pytest.mark.parametrize("N", [None, 1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("T", [2, 3, 17, 128])
def test_cleanrl_gae(T, N, dtype):
    check(GAE, T, gae_values(T, N, dtype, seed=T, extra=T % 3))


@needs_kernel
@pytest.mark.parametrize("init", [0, 3, 0.0, 0.7, -1.3e-3, True, False, "t0", "row"], ids=repr)
def test_cleanrl_gae_init_kinds(init):
    T, N = 9, 3
    vals = gae_values(T, N, extra=2)
    if init == "t0":
        init = torch.tensor(0.3)
    elif init == "row":
        init = _rand(N, seed=1)
    vals[7] = init
    check(GAE, T, vals)


@needs_kernel
@pytest.mark.parametrize("N", [None, 5])
def test_discounted_returns(N):
    T = 33
    shape = (T,) if N is None else (T, N)
    dones = (_rand(*shape, seed=2) > 1.2).float()
    ret = torch.full((T + 3,) + shape[1:], -7.0)
    env = dict(ret=ret, running=0.0, rewards=_rand(*shape, seed=3), gamma=0.99, dones=dones)
    check(RETURNS, T, env)
    refused_or_exact(RETURNS_S_INSIDE, T, env)
    refused_or_exact(RETURNS_S_INSIDE, T, dict(env, running=torch.tensor(0.3)))


@needs_kernel
def test_values_of_length_t_plus_one_without_tails():
    prog = (
        "delta = rewards[t] + gamma * values[t + 1] * (1.0 - dones[t]) - values[t]; "
        "advantages[t] = gae = delta + gamma * lam * (1.0 - dones[t]) * gae"
    )
    T, N = 20, 4
    env = dict(
        rewards=_rand(T, N, seed=4), gamma=0.99, values=_rand(T + 1, N, seed=5),
        dones=(_rand(T, N, seed=6) > 0.5).float(), advantages=torch.zeros(T, N), gae=0.0, lam=0.95,
    )
    check(prog, T, env)
    refused(prog, T, dict(env, values=env["values"][:T].clone()), "values one row short")


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_per_step_scalars_next_to_rows(dtype):
    prog = "d = r[t] * w[t] - v[t + 1]; out[t] = s = d + gamma * m[t] * s"
    T, N = 12, 3
    env = dict(
        r=_rand(T, N, seed=7, dtype=dtype), w=_rand(T, seed=8, dtype=dtype),  # one scalar per step
        v=_rand(T + 1, seed=9, dtype=dtype), m=_rand(T, seed=10, dtype=dtype).abs(),
        out=torch.zeros(T, N, dtype=dtype), s=0.0, gamma=0.9,
    )
    check(prog, T, env)
    check(prog, T, dict(env, s=torch.tensor(1.5, dtype=dtype)))
    check(prog, T, dict(env, s=_rand(N, seed=11, dtype=dtype)))


@needs_kernel
@pytest.mark.parametrize("row", [(1,), (3,), (2, 1)])
def test_carried_value_of_per_step_scalars_next_to_rows(row):
    """S reads only per-step scalars while another seq has rows: the loop's S is 0-d."""
    T = 5
    env = dict(o=torch.zeros((T,) + row), x=_rand(T, *row, seed=33), s=0.0, w=_rand(T, seed=34))
    check("o[t] = x[t] * 2; s = w[t] + 0.5 * s", T, env)
    check("o[t] = u = x[t] - w[t]; s = w[t] + 0.5 * s", T, env)
    check("o[t] = u = x[t] - w[t]; s = w[t] + w[t] * s", T, dict(env, s=torch.tensor(0.5)))
    # a row init makes it a row again
    check("o[t] = x[t] * 2; s = w[t] + 0.5 * s", T, dict(env, s=_rand(*row, seed=35)))
    # S stored into outputs of the row shape: the loop broadcasts it
    check("o[t] = x[t] * 2; p[t] = s = w[t] + 0.5 * s", T, dict(env, p=torch.zeros((T,) + row)))


def _float32_trap_init(r0=0.1, gamma=0.99, lam=0.95):
    """A Python-float init where r + gamma * lam * s in doubles differs from both float32 spellings."""
    r = torch.tensor([r0])
    f = lambda v: torch.tensor([v], dtype=torch.float32)  # noqa: E731
    for k in range(1, 2000):
        s = 0.1 + k * 0.0137
        exact = r + gamma * lam * s
        if not torch.equal(exact, r + f(gamma) * f(lam) * f(s)) and not torch.equal(exact, r + f(gamma * lam) * f(s)):
            return s
    raise AssertionError("no init where the roundings differ")


@needs_kernel
def test_constant_only_a_with_python_float_init_multiplies_in_doubles():
    T = 2
    s0 = _float32_trap_init()
    r = torch.full((T,), 0.1)
    out = torch.zeros(T)
    got = check("out[t] = s = r[t] + gamma * lam * s", T, dict(out=out, s=s0, r=r, gamma=0.99, lam=0.95))
    assert torch.equal(out[T - 1 : T], torch.tensor([0.1]) + 0.99 * 0.95 * s0)  # the first step itself
    assert got.shape == ()
    check("out[t] = s = r[t] + 0.99 * 0.95 * s", T, dict(out=out, s=s0, r=r))
    check("out[t] = s = r[t] + 0.99 * 0.95 * s", T, dict(out=out, s=7, r=r))
    check("out[t] = s = (gamma * lam) * s + r[t]", T, dict(out=out, s=s0, r=r, gamma=0.99, lam=0.95))
    check("out[t] = s = r[t] + s * (gamma * lam)", T, dict(out=out, s=s0, r=r, gamma=0.99, lam=0.95))
    # S nested in the product: not the spec's form; refused, or the loop's (gamma * (lam * s)) exactly
    refused_or_exact("out[t] = s = gamma * (lam * s) + r[t]", T, dict(out=out, s=s0, r=r, gamma=0.99, lam=0.95))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_first_python_product_of_ints_past_2_53_rounds_once(dtype):
    """5 * s is the Python int 2**53 + 2**29 + 1: torch rounds it to float32 once (up); by way of a
    double it lands on the float32 midpoint first and then rounds to even (down)."""
    n = 2**53 + 2**29 + 1
    assert n % 5 == 0 and n // 5 < 2**53
    assert float(torch.tensor([0.0]) + n) != float(torch.tensor([0.0]) + float(n))  # the trap is real
    T = 3
    env = dict(o=torch.zeros(T, dtype=dtype), s=n // 5, r=torch.zeros(T, dtype=dtype))
    refused_or_exact("o[t] = s = r[t] + 5 * s", T, env)
    refused_or_exact("o[t] = s = r[t] + k * s", T, dict(env, k=5))
    check("o[t] = s = r[t] + 0.5 * s", T, env)  # a float product: one rounding of a double either way


@needs_kernel
def test_a_bool_constant_subtracted_with_a_tensor_is_left_to_the_loop():
    """torch raises on ``tensor - True`` and ``True - tensor``: the loop raises, so a value from
    fused_linear would differ from it (None lets the general path raise as the loop does)."""
    T = 4
    env = dict(o=torch.zeros(T), s=0.0, c=True, x=_rand(T, seed=39))
    for prog in ["o[t] = s = c - x[t] + 0.5 * s", "o[t] = s = x[t] - c + 0.5 * s", "o[t] = s = x[t] + (x[t] - c) * s",
                 "k = c; o[t] = s = x[t] - k + 0.5 * s", "k = c; m = k; o[t] = s = m - x[t] + 0.5 * s"]:
        with pytest.raises(RuntimeError, match="bool"):
            reference(prog, T, _ordered(prog, env))
        refused(prog, T, env, "the loop raises")
    check("o[t] = s = c + x[t] / c + c * s", T, env)  # + * / take a bool
    check("o[t] = s = x[t] - (c - c) + (c - 0.5) * s", T, env)  # bool arithmetic in Python
    check("o[t] = s = x[t] * c - x[t] + 0.5 * s", T, env)


@needs_kernel
def test_outputs_written_count_as_in_place_writes_for_autograd():
    """The loop's ``out[t] = ...`` bumps out's version: autograd refuses a backward through a
    tensor saved before the writes. fused_linear's writes must be seen the same way."""
    T = 5
    prog = "adv[t] = s = r[t] + 0.5 * s"
    for run in ("loop", "fused"):
        w = torch.ones(T, requires_grad=True)
        adv = torch.zeros(T)
        y = (w * adv).sum()  # saves adv
        env = dict(adv=adv, s=0.0, r=_rand(T, seed=49))
        if run == "loop":
            ns = dict(env, T=T)
            harness.load(loop_source(prog), filename="<loop>", namespace=ns)
        else:
            assert fused_linear(prog, T, *_ordered(prog, env)) is not None
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()


@needs_kernel
def test_a_constant_only_b():
    T = 7
    env = dict(o=torch.zeros(T, 2), s=0.3, x=_rand(T, 2, seed=37), c=0.7)
    check("o[t] = s = c + x[t] * s", T, env)
    check("o[t] = s = 1.0 + s * x[t]", T, dict(env, s=2))
    check("o[t] = s = (c - 1) / 3 + x[t] * s", T, dict(env, s=torch.tensor(0.5)))


@needs_kernel
def test_views_into_larger_buffers():
    """Contiguous views with a storage offset: reads from, and writes only to, their own rows."""
    T, N = 10, 3
    buf = torch.full((T + 6, N), 8.0)
    src = _rand(T + 9, N, seed=38)
    out = buf[2 : 2 + T + 1]
    r = src[5 : 5 + T]
    check("o[t] = s = r[t] + g * s", T, dict(o=out, s=0.0, r=r, g=0.9))
    assert torch.equal(buf[:2], torch.full((2, N), 8.0)) and torch.equal(buf[2 + T :], torch.full((4, N), 8.0))
    # a tailed per-step seq ending at the buffer's end; the tail is a row of another buffer
    w = src.view(-1)[-T:]
    check("w[T] = nw; o[t] = s = w[t + 1] * r[t] + g * s", T, dict(w=w, nw=src[0, 0], o=out, s=0.0, r=r, g=0.9))


@needs_kernel
def test_inputs_may_share_memory_with_each_other():
    """Only outputs must own their memory: an init or a tail that is a row of a seq is read-only."""
    T, N = 6, 3
    v = _rand(T + 1, N, seed=56)
    check("v[T] = nv; o[t] = s = v[t + 1] - v[t] + 0.9 * s", T, dict(v=v, nv=v[T], o=torch.zeros(T, N), s=v[2]))
    check("o[t] = s = v[t] * w[t + 1] + w[t] * s", T, dict(v=v, w=v, o=torch.zeros(T, N), s=v[T]))


@needs_kernel
def test_more_outputs_or_seqs_than_the_kernel_takes_are_refused_not_raised():
    T = 4
    for n in (16, 17, 40):
        prog = " = ".join(f"o{i}[t]" for i in range(n)) + " = s = r[t] + 0.5 * s"
        env = {f"o{i}": torch.zeros(T) for i in range(n)}
        refused_or_exact(prog, T, dict(env, s=0.0, r=torch.ones(T)))
    for n in (64, 65, 70):
        prog = "o[t] = s = " + " + ".join(f"x{i}[t]" for i in range(n)) + " + 0.5 * s"
        env = {f"x{i}": _rand(T, seed=i) for i in range(n)}
        refused_or_exact(prog, T, dict(env, s=0.0, o=torch.zeros(T)))
    # a long chain that keeps every load alive (many registers)
    prog = "o[t] = s = " + "".join(f"(x{i}[t] + " for i in range(70)) + "1.0" + ")" * 70 + " + 0.5 * s"
    refused_or_exact(prog, T, dict({f"x{i}": _rand(T, seed=i) for i in range(70)}, s=0.0, o=torch.zeros(T)))


@needs_kernel
@pytest.mark.parametrize("N", [1, 4])
def test_cleanrl_tails_and_init_with_a_leading_one(N):
    """CleanRL's ``next_value = agent.get_value(next_obs).reshape(1, -1)``: the tails [1, N] make
    the loop's carried value [1, N] from the first step on (the implementation's extension)."""
    T = 9
    vals = gae_values(T, N)
    vals[1], vals[3] = vals[1].reshape(1, -1), vals[3].reshape(1, -1)
    assert check(GAE, T, vals).shape == (1, N)
    vals = gae_values(T, N)
    vals[7] = _rand(1, N, seed=50)
    assert check(GAE, T, vals).shape == (1, N)
    vals[7] = _rand(1, 1, N, seed=51)
    refused_or_exact(GAE, T, vals)


@needs_kernel
def test_a_leading_one_tail_that_does_not_reach_the_carried_value():
    T, N = 4, 3
    env = dict(v=_rand(T, N, seed=52), nv=_rand(1, N, seed=53), o=torch.zeros(T, N), s=0.0)
    refused_or_exact("v[T] = nv; o[t] = u = v[t + 1] * 2; s = v[t] + 0.5 * s", T, env)


@needs_kernel
@pytest.mark.parametrize("T", [2, 3, 40])
def test_stop_leaves_the_first_steps_to_the_caller(T):
    """The implementation's ``stop=1``: the steps T-1 .. 1 only (rows 0 of the outputs untouched)."""
    vals = gae_values(T, 3, extra=1)
    check(GAE, T, vals, stop=1)
    check(RETURNS, T, dict(ret=torch.full((T, 3), 6.0), running=torch.ones(3), rewards=_rand(T, 3, seed=54),
                           gamma=0.9, dones=torch.zeros(T, 3)), stop=1)
    for stop in (2, -1, 1.0, None, "1"):
        refused(GAE, T, gae_values(T, 3), f"stop={stop!r}", stop=stop)
    refused(GAE + "; del lastgaelam", T, gae_values(T, 3), "stop with del", stop=1)


@needs_kernel
@pytest.mark.parametrize("T,N", [(2, 3), (9, 1), (300, 9)])
def test_recurrences_through_memory(T, N):
    """The implementation's ``OUT[t] = f(OUT[t + 1])``: the value lives in OUT (its row T is the
    start), nothing is handed back (True)."""
    env = dict(o=_rand(T + 1, N, seed=57), r=_rand(T, N, seed=58), g=0.97, d=(_rand(T, N, seed=59) > 0).float(),
               w=_rand(T, seed=60))
    for prog in ["o[t] = o[t + 1] * g + r[t]", "o[t] = r[t] + g * (1 - d[t]) * o[t + 1]",
                 "o[t] = r[t] + g * o[t + 1] * (1 - d[t])", "o[t] = r[t] / o[t + 1] - w[t]",
                 "u = r[t] * w[t]; o[t] = u + g * o[t + 1]", "o[t] = -o[t + 1]"]:
        refused_or_exact(prog, T, dict(env, o=env["o"].clone()))
    assert fused_linear("o[t] = o[t + 1] * g + r[t]", T, *_ordered("o[t] = o[t + 1] * g + r[t]", env)) is True
    refused_or_exact("o[t] = o[t + 1] * g + o[t + 1]", T, env)  # OUT read twice
    for prog, more in [
        ("o[t] = o[t + 1] * g + r[t]", dict(o=_rand(T + 1, N, seed=61), r=_rand(T, seed=62))),
        ("o[t] = o[t + 2] * g + r[t]", dict(o=_rand(T + 2, N, seed=61))),
        ("o[t] = o[t + 1] * g + r[t]; p[t] = o[t]", dict(p=torch.zeros(T, N))),
        ("o[t] = o[t + 1] * g + r[t]; s = r[t] + g * s", dict(s=torch.zeros(N))),
        ("s = r[t] + g * s; o[t] = o[t + 1] * s", dict(s=torch.zeros(N))),
        ("q = o[t + 1]; o[t] = q * g + r[t]", {}),
        ("o[T] = z; o[t] = o[t + 1] * g + r[t]", dict(o=_rand(T, N, seed=61), z=_rand(N, seed=63))),
        ("o[t] = s = o[t + 1] * g + r[t] * s", dict(s=torch.ones(N))),
    ]:
        refused_or_exact(prog, T, {**env, "o": env["o"].clone(), **more})
    if N > 1:  # the loop raises (a row into a one-number slot): nothing for fused_linear to return
        refused("o[t] = o[t + 1] * g + r[t]", T, dict(env, o=_rand(T + 1, seed=64)), "the loop raises")
    refused("o[t] = o[t + 1] * g + r[t]", T, dict(env, o=env["o"][:T].clone()), "no row T to start from")


@needs_kernel
def test_del_of_the_carried_value_returns_true():
    """The implementation's ``del S`` suffix: the outputs as the loop writes them, True for S."""
    T, N = 9, 3
    vals = gae_values(T, N, extra=1)
    before = [_clone(v) for v in vals]
    assert params_of(GAE + "; del lastgaelam") == params_of(GAE)
    assert fused_linear(GAE + "; del lastgaelam", T, *vals) is True
    _, after = reference(GAE, T, before)
    assert_bitwise(vals[6], after["advantages"], "advantages")
    env = dict(o=torch.zeros(T, N), s=0.0, r=_rand(T, N, seed=36), g=0.9)
    for prog in ["del s; o[t] = s = r[t] + g * s", "o[t] = s = r[t] + g * s; del o",
                 "o[t] = s = r[t] + g * s; del s, o", "o[t] = s = r[t] + g * s; del s; del s",
                 "o[t] = s = r[t] + g * s; del g"]:
        refused(prog, T, [env[n] for n in dict.fromkeys(_tokens(prog)) if n in env], "del")


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_number_over_tensor_is_reciprocal_times_number(dtype):
    T = 64
    x = torch.rand(T, 4, generator=torch.Generator().manual_seed(12), dtype=dtype) * 10 + 0.1
    if dtype == torch.float32:  # the data separates the two spellings
        assert not torch.equal(x.reciprocal() * 3.0, torch.full_like(x, 3.0) / x)
    env = dict(o=torch.zeros(T, 4, dtype=dtype), s=0.0, x=x, c=3.0)
    check("o[t] = s = 3.0 / x[t] + 0.5 * s", T, env)
    check("o[t] = s = c / x[t] + c * s", T, env)
    check("o[t] = s = x[t] / 3.0 + s * (2 / x[t])", T, dict(env, s=1.0))
    check("o[t] = s = (c - 1) / (x[t] * c) + (1 / c) * s", T, env)


@needs_kernel
def test_number_minus_tensor_and_unary_minus():
    T = 10
    env = dict(o=torch.zeros(T, 2), x=_rand(T, 2, seed=13), y=_rand(T, 2, seed=14), s=0.25, c=0.5)
    check("o[t] = s = 1.0 - x[t] + (0.3 - y[t]) * s", T, env)
    check("o[t] = s = c - x[t] + (c - y[t]) * s", T, env)
    check("o[t] = s = -x[t] + -(y[t] * 2) * s", T, env)
    check("o[t] = s = +x[t] - +y[t] + (-0.5) * s", T, dict(env, s=-0.0))
    check("o[t] = s = -(-x[t]) + -c * s", T, env)
    check("o[t] = s = 0 - x[t] + -(c - 2) * s", T, env)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_division_by_zero_inf_nan_inputs(dtype):
    T = 12
    x = torch.tensor([0.0, -0.0, 1.0, INF, -INF, NAN, 2.0, 1e-40, 3e38, -3e38, 0.0, 5.0], dtype=dtype)
    y = torch.tensor([0.0, 1.0, -0.0, INF, 2.0, 1.0, NAN, 1e-40, 3e38, 0.5, -1.0, 0.0], dtype=dtype)
    env = dict(o=torch.zeros(T, dtype=dtype), d=torch.zeros(T, dtype=dtype), x=x, y=y, s=0.0, big=1e300)
    check("d[t] = q = x[t] / y[t]; o[t] = s = q + y[t] * s", T, env)
    check("o[t] = s = 1.0 / x[t] + -y[t] / x[t] * s", T, dict(env, s=1.0))
    check("o[t] = s = x[t] * y[t] + (x[t] - y[t]) * s", T, dict(env, s=INF))
    check("o[t] = s = x[t] * 1e300 * 1e-300 + 0.5 * s", T, env)
    check("o[t] = s = x[t] + big * s", T, dict(env, s=1.0))
    check("o[t] = s = x[t] / 0 + 0 * s", T, dict(env, s=NAN))


@needs_kernel
def test_temporary_stores_and_several_outputs():
    prog = (
        "nnt = 1.0 - dones[t]; deltas[t] = delta = rewards[t] + gamma * values[t + 1] * nnt - values[t]; "
        "weights[t] = nnt; adv[t] = last = delta + gamma * lam * nnt * last; returns[t] = last; copy[t] = last"
    )
    T, N = 15, 2
    assert free_names(prog) == (
        "dones", "deltas", "rewards", "gamma", "values", "weights", "adv", "last", "lam", "returns", "copy",
    )
    env = dict(
        dones=(_rand(T, N, seed=15) > 0.5).float(), deltas=torch.full((T + 1, N), 9.0), rewards=_rand(T, N, seed=16),
        gamma=0.99, values=_rand(T + 1, N, seed=17), weights=torch.zeros(T, N), adv=torch.zeros(T + 4, N),
        last=0.0, lam=0.95, returns=torch.zeros(T, N), copy=torch.zeros(T, N),
    )
    check(prog, T, env)
    check("a[t] = b[t] = u = x[t] * 2; c[t] = d[t] = s = u + 0.5 * s; e[t] = s", T, dict(
        a=torch.zeros(T, N), b=torch.zeros(T, N), c=torch.zeros(T, N), d=torch.zeros(T, N), e=torch.zeros(T, N),
        x=_rand(T, N, seed=18), s=1.0,
    ))


@needs_kernel
@pytest.mark.parametrize(
    "form",
    ["b[t] + a[t] * s", "a[t] * s + b[t]", "b[t] + s * a[t]", "s * a[t] + b[t]",
     "b[t] + 0.9 * s", "0.9 * s + b[t]", "b[t] + s * 0.9", "s * 0.9 + b[t]",
     "b[t] + g * a[t] * s", "(b[t] - a[t]) + (g * a[t]) * s", "b[t] - a[t] + g * s", "(b[t] + (g * s))",
     "b[t] + s * (g * a[t])", "b[t] + g * lam * s", "b[t] + s * (g * lam)", "b[t] + (g - 1) * s"],
)
@pytest.mark.parametrize("init", [0.5, 2, "t0"])
def test_spellings_of_the_affine_form(form, init):
    T = 11
    env = dict(o=torch.zeros(T, 3), s=torch.tensor(0.5) if init == "t0" else init, a=_rand(T, 3, seed=19),
               b=_rand(T, 3, seed=20), g=0.97, lam=0.93)
    check(f"o[t] = s = {form}", T, env)


@needs_kernel
def test_reads_at_t_plus_zero_and_large_k():
    T = 9
    env = dict(o=torch.zeros(T, 2), s=0.0, r=_rand(T + 5, 2, seed=21), g=0.9)
    check("o[t] = s = r[t + 0] + g * s", T, env)
    check("o[t] = s = r[t + 5] - r[t + 3] + g * s", T, env)
    refused("o[t] = s = r[t + 6] + g * s", T, env, "one row short of t + 6")


@needs_kernel
def test_tails_on_rows_and_on_a_per_step_scalar_seq():
    T = 8
    prog = "v[T] = nv; d[T] = nd; o[t] = s = v[t + 1] * (1 - d[t + 1]) - v[t] + 0.9 * (1 - d[t]) * s"
    env = dict(v=_rand(T, 3, seed=22), nv=_rand(3, seed=23), d=(_rand(T, seed=24) > 0).float(),
               nd=torch.tensor(1.0), o=torch.zeros(T, 3), s=0.0)
    check(prog, T, env)
    check(prog, T, dict(env, v=_rand(T + 3, 3, seed=25)))  # a longer tailed seq: its row T is not read


@needs_kernel
def test_row_tensor_init_and_2d_rows():
    T = 6
    d = torch.float64
    check("o[t] = s = x[t + 2] - x[t] + x[t + 1] * s", T, dict(
        o=torch.zeros(T, 2, 3, dtype=d), s=_rand(2, 3, seed=26, dtype=d), x=_rand(T + 2, 2, 3, seed=27, dtype=d),
    ))
    check("o[t] = s = w[t] * x[t] + w[t + 1] * s", T, dict(
        o=torch.zeros(T + 1, 2, 3, dtype=d), s=torch.tensor(2.0, dtype=d), x=_rand(T, 2, 3, seed=28, dtype=d),
        w=_rand(T + 1, seed=29, dtype=d),
    ))


@needs_kernel
def test_requires_grad_accepted_under_no_grad():
    T = 7
    env = dict(o=torch.zeros(T, 2), s=0.0, x=_rand(T, 2, seed=30).requires_grad_(True))
    prog = "o[t] = s = x[t] + 0.5 * s"
    refused(prog, T, env, "grad mode")
    with torch.no_grad():
        check(prog, T, env)
        # an init requiring grad: the spec's "(no grad)" may mean under grad mode only
        refused_or_exact(prog, T, dict(env, x=_rand(T, 2, seed=31), s=torch.ones(2, requires_grad=True)))


@needs_kernel
def test_constant_only_temporaries():
    T = 8
    env = dict(o=torch.zeros(T, 2), s=0.3, r=_rand(T, 2, seed=32), g=0.99, h=0.95)
    check("k = 0.5; o[t] = s = r[t] + k * s", T, env)
    check("k = g * h; m = k - 1; o[t] = s = r[t] * m + k * s", T, env)
    check("k = -g; o[t] = s = k * s + r[t] / k", T, dict(env, s=2))
    check("g2 = g; o[t] = s = r[t] + g2 * h * s", T, env)


@needs_kernel
def test_open_values_are_refused_or_exact():
    T = 6
    P = "o[t] = s = r[t] + g * s"
    refused_or_exact(P, T, dict(o=torch.zeros(T, 0), s=0.0, r=torch.zeros(T, 0), g=0.9))  # empty rows
    refused_or_exact(P, T, dict(o=torch.zeros(T, 3), s=2**60, r=_rand(T, 3), g=0.9))  # a huge int init
    refused_or_exact(P, T, dict(o=torch.zeros(T, 3), s=2**60 + 1, r=_rand(T, 3), g=0.5))
    refused_or_exact(P, T, dict(o=torch.zeros(T, 3), s=0.0, r=_rand(T, 3), g=np.float64(0.9)))  # a float subclass


# ---------------------------------------------------------------- refusals


class MyTensor(torch.Tensor):
    pass


def _refusals():
    T, N = 6, 3
    r, d = _rand(T, N, seed=40), (_rand(T, N, seed=41) > 0).float()
    r7 = _rand(T + 1, N, seed=42)
    _long = _rand(2 * T, N, seed=55)
    out = lambda n=T, dt=torch.float32: torch.full((n, N), 4.0, dtype=dt)  # noqa: E731
    P1 = "o[t] = s = r[t] + g * s"  # o, s, r, g
    P2 = "o[t] = s = r[t] + d[t] * s"  # o, s, r, d
    PT = "r[T] = nr; o[t] = s = r[t + 1] + g * s"  # r, nr, o, s, g
    o2 = out()
    o3 = out(T + 1)
    return [
        ("float64 init with float32 data", P1, T, [out(), torch.tensor(1.0, dtype=torch.float64), r, 0.9]),
        ("float64 row init with float32 data", P1, T, [out(), torch.ones(N, dtype=torch.float64), r, 0.9]),
        ("init of a third shape", P1, T, [out(), torch.ones(2), r, 0.9]),
        ("init with a leading 2", P1, T, [out(), torch.ones(2, N), r, 0.9]),
        ("init with a trailing 1", P1, T, [out(), torch.ones(N, 1), r, 0.9]),
        ("init requires grad", P1, T, [out(), torch.ones(N, requires_grad=True), r, 0.9]),
        ("init a subclass", P1, T, [out(), torch.ones(N).as_subclass(MyTensor), r, 0.9]),
        ("init a string", P1, T, [out(), "0", r, 0.9]),
        ("init None", P1, T, [out(), None, r, 0.9]),
        ("seq requires grad", P1, T, [out(), 0.0, r.clone().requires_grad_(True), 0.9]),
        ("non-contiguous seq (transpose)", P1, T, [out(), 0.0, _rand(N, T).t(), 0.9]),
        ("non-contiguous seq (stride 2)", P1, T, [out(), 0.0, _rand(T, 2 * N)[:, ::2], 0.9]),
        ("non-contiguous seq (rows stride 2)", P1, T, [out(), 0.0, _rand(2 * T, N)[::2], 0.9]),
        ("non-contiguous output", P1, T, [torch.zeros(N, T).t(), 0.0, r, 0.9]),
        ("tensor subclass seq", P1, T, [out(), 0.0, r.clone().as_subclass(MyTensor), 0.9]),
        ("Parameter seq", P1, T, [out(), 0.0, torch.nn.Parameter(r.clone(), requires_grad=False), 0.9]),
        ("tensor subclass output", P1, T, [out().as_subclass(MyTensor), 0.0, r, 0.9]),
        ("negative-bit view seq", P1, T, [out(), 0.0, torch._neg_view(r), 0.9]),
        ("negative-bit view output", P1, T, [torch._neg_view(out()), 0.0, r, 0.9]),
        ("sparse seq", P1, T, [out(), 0.0, r.to_sparse(), 0.9]),
        ("sparse output", P1, T, [out().to_sparse(), 0.0, r, 0.9]),
        ("output requires grad", P1, T, [out().requires_grad_(True), 0.0, r, 0.9]),
        ("output is the input", P2, T, [r, 0.0, r, d]),
        ("output is a view of an input", P2, T, [r[:T], 0.0, r, d]),
        ("output overlaps an input", P2, T, [r7[1:], 0.0, r7[:T], d]),
        ("output overlaps the init", P2, T, [r, r[T - 1], _rand(T, N), d]),
        ("output in an unread part of a seq", P2, T, [_long[T:], 0.0, _long, d]),
        ("output overlaps a tail", PT, T, [r, r7[T], r7[1:], 0.0, 0.9]),
        ("two outputs share memory", "o[t] = p[t] = s = r[t] + g * s", T, [o2, o2[:], 0.0, r, 0.9]),
        ("two outputs the same tensor", "o[t] = p[t] = s = r[t] + g * s", T, [o2, o2, 0.0, r, 0.9]),
        ("output read as a seq", "q = o[t + 1]; o[t] = s = r[t] + q * s", T, [o3, 0.0, r]),
        ("mixed dtypes in seqs", P2, T, [out(), 0.0, r, d.double()]),
        ("float64 output with float32 data", P2, T, [out(dt=torch.float64), 0.0, r, d]),
        ("float16 data", P2, T, [out(dt=torch.float16), 0.0, r.half(), d.half()]),
        ("bfloat16 data", P2, T, [out(dt=torch.bfloat16), 0.0, r.bfloat16(), d.bfloat16()]),
        ("complex data", P2, T, [out(dt=torch.complex64), 0.0, r.to(torch.complex64), d.to(torch.complex64)]),
        ("int seq", P2, T, [out(), 0.0, r, d.long()]),
        ("int data everywhere", P2, T, [out(dt=torch.int64), 0, r.long(), d.long()]),
        ("bool seq", P2, T, [out(), 0.0, r, d.bool()]),
        ("seq too short", P2, T, [out(), 0.0, r[: T - 1], d]),
        ("seq too short for t + 1", "o[t] = s = r[t + 1] + d[t] * s", T, [out(), 0.0, r, d]),
        ("0-d seq", P2, T, [out(), 0.0, r, torch.tensor(1.0)]),
        ("output too short", P2, T, [out(T - 1), 0.0, r, d]),
        ("output of another row shape", P2, T, [torch.zeros(T, N + 1), 0.0, r, d]),
        ("output with an extra dim", P2, T, [torch.zeros(T, 1, N), 0.0, r, d]),
        ("output of scalar rows", P2, T, [torch.zeros(T), 0.0, r, d]),
        ("seq of another row shape", P2, T, [out(), 0.0, r, torch.ones(T, N + 1)]),
        ("seq of another rank", P2, T, [out(), 0.0, r, torch.ones(T, 1, N)]),
        ("seq of rows (1,) next to (3,)", P2, T, [out(), 0.0, r, torch.ones(T, 1)]),
        ("tailed seq read at t + 2", "r[T] = nr; o[t] = s = r[t + 2] + g * s", T,
         [_rand(T + 2, N), torch.ones(N), out(), 0.0, 0.9]),
        ("tail of the wrong shape", PT, T, [r, torch.ones(N + 1), out(), 0.0, 0.9]),
        ("tail with a leading 2", PT, T, [r, torch.ones(2, N), out(), 0.0, 0.9]),
        ("tail with a trailing 1", PT, T, [r, torch.ones(N, 1), out(), 0.0, 0.9]),
        ("tail with a leading 1 on a scalar seq", "v[T] = nv; o[t] = s = v[t + 1] + r[t] + g * s", T,
         [torch.ones(T), torch.ones(1), out(), 0.0, r, 0.9]),
        ("tail of a row shape for a scalar seq", "v[T] = nv; o[t] = s = v[t + 1] + r[t] + g * s", T,
         [torch.ones(T), torch.ones(N), out(), 0.0, r, 0.9]),
        ("tail of another dtype", PT, T, [r, torch.ones(N, dtype=torch.float64), out(), 0.0, 0.9]),
        ("tail not a tensor", PT, T, [r, 1.0, out(), 0.0, 0.9]),
        ("tail requires grad", PT, T, [r, torch.ones(N, requires_grad=True), out(), 0.0, 0.9]),
        ("tail non-contiguous", PT, T, [r, _rand(N, 2)[:, 0], out(), 0.0, 0.9]),
        ("T = 1", P1, 1, [out(), 0.0, r, 0.9]),
        ("T = 0", P1, 0, [out(), 0.0, r, 0.9]),
        ("T negative", P1, -3, [out(), 0.0, r, 0.9]),
        ("T a float", P1, 6.0, [out(), 0.0, r, 0.9]),
        ("T a tensor", P1, torch.tensor(6), [out(), 0.0, r, 0.9]),
        ("tensor constant", P1, T, [out(), 0.0, r, torch.tensor(0.9)]),
        ("row tensor constant", P1, T, [out(), 0.0, r, torch.full((N,), 0.9)]),
        ("numpy float32 constant", P1, T, [out(), 0.0, r, np.float32(0.9)]),
        ("huge int constant", P1, T, [out(), 0.0, r, 2**53]),
        ("huge negative int constant", P1, T, [out(), 0.0, r, -(2**53)]),
        ("string constant", P1, T, [out(), 0.0, r, "0.9"]),
        ("complex constant", P1, T, [out(), 0.0, r, 0.9j]),
        ("list seq", P1, T, [out(), 0.0, [1.0] * T, 0.9]),
        ("numpy seq", P1, T, [out(), 0.0, r.numpy(), 0.9]),
        ("meta seq", P1, T, [out(), 0.0, torch.empty(T, N, device="meta"), 0.9]),
        ("too few values", P1, T, [out(), 0.0, r]),
        ("too many values", P1, T, [out(), 0.0, r, 0.9, 1.0]),
    ]


@needs_kernel
@pytest.mark.parametrize("prog,T,values", [pytest.param(p, T, v, id=n) for n, p, T, v in _refusals()])
def test_refused_values(prog, T, values):
    refused(prog, T, values)


OUTSIDE = [
    ("call", "o[t] = s = torch.exp(r[t]) + g * s"),
    ("method call", "o[t] = s = r[t].exp() + g * s"),
    ("read at t - 1", "o[t] = s = r[t - 1] + g * s"),
    ("read at a fixed index", "o[t] = s = r[2] + g * s"),
    ("read at t + 1.0", "o[t] = s = r[t + 1.0] + g * s"),
    ("read at t + -1", "o[t] = s = r[t + -1] + g * s"),
    ("read at t + True", "o[t] = s = r[t + True] + g * s"),
    ("read at t + g", "o[t] = s = r[t + g] + g * s"),
    ("a seq read as a constant", "o[t] = s = r[t] + r * s"),
    ("a constant read as a seq", "o[t] = s = g + g[t] * s"),
    ("an output read as a constant", "o[t] = s = r[t] + o * s"),
    ("the carried value read as a seq", "o[t] = s = r[t] + s[t] * s"),
    ("a tail that is an output", "r[T] = o; o[t] = s = r[t + 1] + g * s"),
    ("a tail that is a seq", "r[T] = p; o[t] = s = r[t + 1] + p[t] * s"),
    ("a tail named as its seq", "r[T] = r; o[t] = s = r[t + 1] + g * s"),
    ("a temporary named as an output", "o = r[t]; o[t] = s = o + g * s"),
    ("a temporary named as a seq", "r = g * 2; o[t] = s = r[t] + g * s"),
    ("a temporary named as a seq, after", "o[t] = s = r[t] + g * s; r = s"),
    ("the carried value named as an output", "s[t] = s = r[t] + g * s"),
    ("the carried value stored at t + 1", "o[t] = s = r[t] + g * s; o[t + 1] = s"),
    ("a tail named T", "r[T] = T; o[t] = s = r[t + 1] + g * s"),
    ("a tail named t", "r[T] = t; o[t] = s = r[t + 1] + g * s"),
    ("a tail that is a constant", "r[T] = g; o[t] = s = r[t + 1] + g * s"),
    ("store at t + 1", "o[t + 1] = s = r[t] + g * s"),
    ("store at T - 1", "o[T - 1] = s = r[t] + g * s"),
    ("quadratic", "s = s * s"),
    ("s * s in A", "o[t] = s = r[t] + s * s"),
    ("S in A", "o[t] = s = r[t] + (g * s) * s"),
    ("S in B", "o[t] = s = (r[t] - s) + g * s"),
    ("S divides", "o[t] = s = r[t] / s"),
    ("S over A", "o[t] = s = r[t] + s / g"),
    ("product form", "o[t] = s = (r[t] + s) * g * r[t]"),
    ("two S terms", "o[t] = s = r[t] + g * s + r[t] * s"),
    ("S in a temporary", "u = s * g; o[t] = s = r[t] + u * s"),
    ("comparison", "o[t] = s = (r[t] > 0) + g * s"),
    ("power", "o[t] = s = r[t] ** 2 + g * s"),
    ("floor division", "o[t] = s = r[t] // 2 + g * s"),
    ("modulo", "o[t] = s = r[t] % 2 + g * s"),
    ("matmul", "o[t] = s = r[t] @ r[t] + g * s"),
    ("bit not", "o[t] = s = ~r[t] + g * s"),
    ("boolean and", "o[t] = s = (r[t] and g) + g * s"),
    ("conditional", "o[t] = s = (r[t] if g else 0.0) + g * s"),
    ("attribute", "o[t] = s = r.data[t] + g * s"),
    ("string literal", "o[t] = s = r[t] + 'a' * s"),
    ("complex literal", "o[t] = s = r[t] + 1j * s"),
    ("bool literal", "o[t] = s = r[t] + True * s"),
    ("None literal", "o[t] = s = r[t] + None * s"),
    ("temporary read before assignment", "a = tmp * 2.0; tmp = r[t]; o[t] = s = r[t] + a * s"),
    ("temporary read before assignment (seq)", "a = tmp[t]; tmp = r[t]; o[t] = s = a + g * s"),
    ("carried twice", "s = r[t] + g * s; o[t] = s = r[t] + g * s"),
    ("no carried value", "o[t] = r[t] * g"),
    ("augmented assignment", "s += r[t]; o[t] = s"),
    ("annotated assignment", "s: float = r[t] + g * s; o[t] = s"),
    ("if statement", "if g: o[t] = s = r[t] + g * s"),
    ("expression statement", "r[t]; o[t] = s = r[t] + g * s"),
    ("walrus", "o[t] = s = (q := r[t]) + g * s"),
    ("tuple target", "a, b = r[t], r[t]; o[t] = s = a + g * s"),
    ("starred target", "*a, = r[t],; o[t] = s = r[t] + g * s"),
    ("attribute target", "o.x = r[t]; o[t] = s = r[t] + g * s"),
    ("assign to t", "t = 0; o[t] = s = r[t] + g * s"),
    ("assign to T", "r[T] = nr; T = 2; o[t] = s = r[t + 1] + g * s"),
    ("tail after body", "o[t] = s = r[t + 1] + g * s; r[T] = nr"),
    ("tail with an expression", "r[T] = nr * 2; o[t] = s = r[t + 1] + g * s"),
    ("tail with a number", "r[T] = 0.0; o[t] = s = r[t + 1] + g * s"),
    ("tail at T + 1", "r[T + 1] = nr; o[t] = s = r[t + 1] + g * s"),
    ("syntax error", "o[t] = s = r[t] + g * (s"),
    ("empty", ""),
    ("for loop", "for t in range(T - 1, -1, -1): o[t] = s = r[t] + g * s"),
    ("lambda", "o[t] = s = (lambda: r[t])() + g * s"),
    ("subscript slice", "o[t] = s = r[t:t + 1] + g * s"),
    ("double subscript", "o[t] = s = r[t][0] + g * s"),
    ("tuple subscript", "o[t] = s = r[t, 0] + g * s"),
    ("newline separated with a def", "def f(): pass\no[t] = s = r[t] + g * s"),
]


@needs_kernel
@pytest.mark.parametrize("prog", [pytest.param(p, id=n) for n, p in OUTSIDE])
def test_outside_the_grammar_is_refused(prog):
    T, N = 6, 3
    env = {
        "o": torch.full((T + 1, N), 4.0), "p": torch.full((T, N), 5.0), "s": 0.5, "r": _rand(T + 2, N, seed=43),
        "g": 0.9, "torch": torch, "tmp": _rand(T, N, seed=44), "nr": torch.ones(N), "a": 1.0, "b": 1.0, "q": 1.0,
        "u": 1.0,
    }
    try:
        names = list(dict.fromkeys(n for n in _tokens(prog) if n in env))
    except (tokenize.TokenError, SyntaxError):
        names = [n for n in env if n in prog]
    refused(prog, T, [env[n] for n in names], "outside the grammar")
    names = params_of(prog)  # its answer outside the grammar is open; the call is still refused
    if all(n in env for n in names):
        refused(prog, T, [env[n] for n in names], "outside the grammar, params_of's order")


@needs_kernel
@pytest.mark.parametrize(
    "prog",
    [
        # bitwise traps: a lenient parser that reads these as B + A * S would reassociate
        "o[t] = s = r[t] + g * s * h",
        "o[t] = s = r[t] + g * s * u[t]",
        "o[t] = s = r[t] + (g * s) * h",
        "o[t] = s = r[t] + s * g * h",
        "o[t] = s = r[t] + g * s + u[t]",
        "o[t] = s = r[t] + g * s - u[t]",
        "o[t] = s = (r[t] + g * s) * h",
        "o[t] = s = r[t] + g * (s * h)",
        "o[t] = s = r[t] + g * (h * s)",
        # forms the spec does not list
        "o[t] = s = r[t] + s",
        "o[t] = s = s + r[t]",
        "o[t] = s = r[t] - g * s",
        "o[t] = s = g * s",
        "o[t] = s = r[1 + t] + g * s",
        "o[t] = s = r[t] + T * s",
        "o[t] = s = r[t] + t * s",
        "o[t] = s = r[t + T] + g * s",
        "o[t] = s = r[t] + (s * g)",
        "o[t] = s = r[t] + (+s) * g",
        "o[t] = s = r[t] + -s * g",
        "o[t] = s = u = r[t] + g * s",
        "o[t] = r[t]; o[t] = s = r[t] + g * s",
        "T = 3; o[t] = s = r[t] + g * s",  # a temporary named T that nothing reads
        # statements after the update: a read of S there is the new S (the spec allows only OUT[t] = S)
        "o[t] = s = r[t] + g * s; p[t] = r[t]",
        "s = r[t] + g * s; u = s; o[t] = u",
        "s = r[t] + g * s; u = s * 2; o[t] = u",
        "s = r[t] + g * s; o[t] = s * 2",
        "s = r[t] + g * s; o[t] = s - r[t]",
        "s = r[t] + g * s; o[t] = u = r[t] * 2; p[t] = s + u",
        "u = r[t] * g; s = r[t] + u * s; o[t] = u + s",
        # a constant-only temporary stored into an output (the loop broadcasts the number)
        "k = g * h; p[t] = k; o[t] = s = r[t] + k * s",
        "p[t] = k = 2.5; o[t] = s = r[t] + g * s",
        # a tail of a seq that is never read at t + 1, or never read at all
        "r[T] = nr; o[t] = s = r[t] + g * s",
        "u[T] = nr; o[t] = s = r[t] + g * s",
        # the tail is the carried value: at t = T-1 the loop reads S's value before the loop
        "r[T] = s; o[t] = s = r[t + 1] + g * s",
    ],
)
def test_open_cases_are_refused_or_exact(prog):
    env = _open_env()
    refused_or_exact(prog, OPEN_T, [env[n] for n in free_names(prog)])
    refused_or_exact(prog, OPEN_T, [env[n] if n != "s" else env["s_row"] for n in free_names(prog)])


OPEN_T, OPEN_N = 7, 16


def _open_env():
    T, N = OPEN_T, OPEN_N
    return {"o": torch.full((T + 1, N), 4.0), "p": torch.full((T, N), 5.0), "s": 0.37, "r": _rand(T + T, N, seed=45),
            "u": _rand(T, N, seed=46), "g": 0.9123, "h": 1.0 / 3.0, "nr": _rand(N, seed=47), "s_row": _rand(N, seed=48)}


def test_open_case_data_separates_the_readings():
    """(g * s) * h != g * (s * h) and (r + g*s) + u != (r + u) + g*s here: a lenient reading can fail."""
    e = _open_env()
    r, u, s, g, h = e["r"][OPEN_T - 1], e["u"][OPEN_T - 1], e["s_row"], e["g"], e["h"]
    assert not torch.equal((g * s) * h, (g * h) * s)
    assert not torch.equal((g * s) * u, (g * u) * s)
    assert not torch.equal((r + g * s) + u, (r + u) + g * s)


@needs_kernel
def test_a_program_is_compiled_once_and_reused_with_new_values():
    T = 5
    for seed in range(4):
        check(RETURNS, T, dict(ret=torch.zeros(T), running=float(seed), rewards=_rand(T, seed=seed), gamma=0.9,
                               dones=(_rand(T, seed=seed + 9) > 0).float()))
    refused(RETURNS, T, dict(ret=torch.zeros(T), running=0.0, rewards=_rand(T, seed=1), gamma=0.9,
                             dones=torch.zeros(T, dtype=torch.float64)), "mixed after accepted calls")
    check(RETURNS, T, dict(ret=torch.zeros(T, 2), running=0.0, rewards=_rand(T, 2), gamma=0.9, dones=torch.zeros(T, 2)))


# ---------------------------------------------------------------- property tests

ROW_SHAPES = [(), (1,), (3,), (2, 3)]
SPECIAL = [0.0, -0.0, INF, -INF, NAN, 1e-40, 3e38, -3e38, 1.0, -1.0, 0.5]
LITERALS = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([0.5, 0.99, 0.95, 1.5, 2.0, 0.1, 1e-3, 3.0, 1e300, 1e-300, 1e-45, 0.0]),
    st.floats(-4, 4, allow_nan=False, width=64),
)
CONSTANTS = st.one_of(
    st.integers(-3, 3),
    st.booleans(),
    st.floats(-4, 4, allow_nan=False),
    st.sampled_from([0.99, 0.95, INF, -INF, NAN, 1e300, -1e-300, 0.1, 2**52 + 1, -(2**52) + 3]),
)
OPS = [ast.Add(), ast.Sub(), ast.Mult(), ast.Div()]
OP_TEXT = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def _name(n, ctx=ast.Load):
    return ast.Name(n, ctx())


def _read(x, k):
    sl = _name("t") if k == 0 else ast.BinOp(_name("t"), ast.Add(), ast.Constant(k))
    return ast.Subscript(_name(x), sl, ast.Load())


def _store(x):
    return ast.Subscript(_name(x), _name("t"), ast.Store())


def _literal(v):
    if v < 0 or (v == 0 and math.copysign(1, v) < 0):
        return ast.UnaryOp(ast.USub(), ast.Constant(-v))
    return ast.Constant(v)


def _full_parens(node):
    """Source with every subexpression parenthesized (ast.unparse gives the minimal spelling)."""
    if isinstance(node, ast.BinOp):
        return f"({_full_parens(node.left)} {OP_TEXT[type(node.op)]} {_full_parens(node.right)})"
    if isinstance(node, ast.UnaryOp):
        return f"({'-' if isinstance(node.op, ast.USub) else '+'}{_full_parens(node.operand)})"
    return ast.unparse(node)


@st.composite
def programs(draw, row_shapes=ROW_SHAPES, max_T=40, wide=False, ext=False):
    """(program, T, values) inside the spec: random expression trees over seqs, constants,
    literals and temporaries, random row shapes, dtypes, tails, outputs and init kinds. ext: also
    the implementation's extensions, updates of any form (row mode) and statements after the
    update that read the new S."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    row = draw(st.sampled_from(row_shapes))
    T = draw(st.integers(2, max_T))
    seqs = {}  # name -> (per-step scalar, tailed)
    for i in range(draw(st.integers(1, 3))):
        seqs[f"x{i}"] = (i > 0 and row != () and draw(st.booleans()), draw(st.booleans()))
    consts = {f"c{i}": draw(CONSTANTS) for i in range(draw(st.integers(0, 2)))}
    temps = {}  # name -> constant-only
    max_k = {x: -1 for x in seqs}  # -1: never read

    def seq_read(x=None):
        x = x or draw(st.sampled_from(sorted(seqs)))
        k = draw(st.integers(0, 1 if seqs[x][1] else 2))
        max_k[x] = max(max_k[x], k)
        return _read(x, k)

    def expr(depth, const_only, s_ok=False):
        usable = sorted(n for n, c in temps.items() if c or not const_only)
        kinds = ["lit", "lit"] + ["const"] * 2 * bool(consts) + ["seq"] * 4 * (not const_only)
        kinds += ["temp"] * 2 * bool(usable) + ["S"] * 3 * s_ok
        if depth > 0:
            kinds += ["bin"] * 5 + ["neg", "pos"]
        kind = draw(st.sampled_from(kinds))
        if kind == "lit":
            return _literal(draw(LITERALS))
        if kind == "const":
            return _name(draw(st.sampled_from(sorted(consts))))
        if kind == "seq":
            return seq_read()
        if kind == "temp":
            return _name(draw(st.sampled_from(usable)))
        if kind == "S":
            return _name("s")
        if kind == "bin":
            left = expr(depth - 1, const_only, s_ok)
            return ast.BinOp(left, draw(st.sampled_from(OPS)), expr(depth - 1, const_only, s_ok))
        return ast.UnaryOp(ast.USub() if kind == "neg" else ast.UAdd(), expr(depth - 1, const_only, s_ok))

    def is_const(node):
        return not any(
            isinstance(n, ast.Subscript)
            or (isinstance(n, ast.Name) and (n.id == "s" or n.id in temps and not temps[n.id]))
            for n in ast.walk(node)
        )

    outputs = []

    def new_outputs(maximum):
        names = [f"o{len(outputs) + i}" for i in range(draw(st.integers(0, maximum)))]
        outputs.extend(names)
        return [_store(n) for n in names]

    stmts = []
    for i in range(draw(st.integers(0, 3))):
        e = expr(draw(st.integers(0, 3)), False)
        if not is_const(e) and draw(st.integers(0, 4)) == 0:  # an output store without a temporary
            stmts.append(ast.Assign([_store(f"o{len(outputs)}")], e))
            outputs.append(f"o{len(outputs)}")
            continue
        temps[f"tmp{i}"] = is_const(e)
        stores = [] if temps[f"tmp{i}"] else new_outputs(2)  # a stored number: an open case, tested apart
        stmts.append(ast.Assign(stores + [_name(f"tmp{i}", ast.Store)], e))
    b_const = draw(st.integers(0, 5)) == 0  # a constant-only B: then A reads a seq
    a = expr(draw(st.integers(0, 2)), not b_const and draw(st.booleans()))
    b = expr(draw(st.integers(0, 3)), b_const)
    # B (or A) reads a seq (the carried value is a tensor); mostly the full-row x0 (of the row shape)
    need = "x0" if draw(st.integers(0, 3)) else draw(st.sampled_from(sorted(seqs)))
    if not any(isinstance(n, ast.Subscript) and n.value.id == need for n in ast.walk(a if b_const else b)):
        x0 = seq_read(need)
        op = draw(st.sampled_from(OPS))
        e = a if b_const else b
        e = ast.BinOp(x0, op, e) if draw(st.booleans()) else ast.BinOp(e, op, x0)
        a, b = (e, b) if b_const else (a, e)
    S = _name("s")
    form = draw(st.integers(0, 3 + 2 * ext))
    prod = ast.BinOp(a, ast.Mult(), S) if form in (0, 1) else ast.BinOp(S, ast.Mult(), a)
    rhs = ast.BinOp(b, ast.Add(), prod) if form % 2 == 0 else ast.BinOp(prod, ast.Add(), b)
    if form >= 4:  # any update reading S (row mode): B op (S-tree), an S-tree op B
        tree = expr(draw(st.integers(1, 3)), False, s_ok=True)
        if not any(isinstance(n, ast.Name) and n.id == "s" for n in ast.walk(tree)):
            tree = ast.BinOp(tree, draw(st.sampled_from(OPS)), S)
        op = draw(st.sampled_from(OPS))
        rhs = ast.BinOp(b, op, tree) if form == 4 else ast.BinOp(tree, op, b)
    stmts.append(ast.Assign(new_outputs(2) + [_name("s", ast.Store)], rhs))
    for i in range(draw(st.integers(0, 2))):
        if ext and draw(st.booleans()):  # the post phase: reads the new S
            e = expr(draw(st.integers(0, 2)), False, s_ok=True)
            name = f"post{i}"
            keep = draw(st.booleans())
            if keep:
                temps[name] = False
            stmts.append(ast.Assign(new_outputs(2) + [_name(name, ast.Store)] * keep, e))
            if not stmts[-1].targets:
                stmts[-1].targets = [_store(f"o{len(outputs)}")]
                outputs.append(f"o{len(outputs)}")
            continue
        outputs.append(f"o{len(outputs)}")
        stmts.append(ast.Assign([_store(outputs[-1])], _name("s")))

    full = draw(st.booleans())
    spell = _full_parens if full else ast.unparse
    body = [" = ".join([ast.unparse(tg) for tg in s_.targets] + [spell(s_.value)]) for s_ in stmts]
    tails = [f"{x}[T] = {x}_next" for x, (_, tailed) in seqs.items() if tailed and max_k[x] >= 0]
    program = "; ".join(tails + body)

    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    p_special = draw(st.sampled_from([0.0, 0.05, 0.3]))
    scale = draw(st.sampled_from([1.0, 1e-3, 1e20]))

    def data(shape):
        x = torch.randn(shape, generator=g, dtype=torch.float64) * scale
        if p_special:
            mask = torch.rand(shape, generator=g) < p_special
            pick = torch.randint(len(SPECIAL), shape, generator=g)
            x = torch.where(mask, torch.tensor(SPECIAL, dtype=torch.float64)[pick], x)
        return x.to(dtype)

    env = dict(consts)
    for x, (per_step, tailed) in seqs.items():
        shape_row = () if per_step else row
        if max_k[x] < 0:
            continue
        env[x] = data((T + (0 if tailed else max_k[x]) + draw(st.integers(0, 2)),) + shape_row)
        if tailed:
            env[f"{x}_next"] = data(shape_row)
            if wide and shape_row and draw(st.booleans()):  # a [1, *row] tail (the implementation's extension)
                env[f"{x}_next"] = env[f"{x}_next"].reshape((1,) + shape_row)
    for o in outputs:
        env[o] = data((T + draw(st.integers(0, 2)),) + row)
    init_kind = draw(st.sampled_from(["int", "float", "bool", "t0", "row"] + ["t0", "row"] * 2 * (form >= 4)))
    if init_kind == "int":
        env["s"] = draw(st.integers(-3, 3))
    elif init_kind == "float":
        env["s"] = draw(st.one_of(st.floats(-4, 4), st.sampled_from([0.7, 1e300, 1e-300, -0.0, INF, NAN])))
    elif init_kind == "bool":
        env["s"] = draw(st.booleans())
    else:
        env["s"] = data(() if init_kind == "t0" else row)
        if wide and init_kind == "row" and row and draw(st.booleans()):
            env["s"] = env["s"].reshape((1,) + row)
    if "x0" not in env:  # x0 unread: the row shape is that of the seqs read
        row = max((env[x].shape[1:] for x in seqs if x in env), key=len)
        for o in outputs:
            env[o] = env[o][(slice(None),) + (0,) * (env[o].dim() - 1 - len(row))].clone()
        if init_kind == "row":
            env["s"] = data(row)
    return program, T, [env[n] for n in free_names(program)]


def _big_python_ints(program, values):
    """Whether the loop's Python arithmetic (constant-only subexpressions, the first A * S) makes
    an int of 2**53 or more: torch rounds such an int to float32 once, a double can't hold it, and
    the spec leaves them open (refused, or exact)."""
    carried, _ = _assigned(program)
    env = {n: v for n, v in zip(free_names(program), values) if type(v) in (int, float, bool) and n != carried}
    init = dict(zip(free_names(program), values))[carried]

    def const(node):
        return all(
            isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop, ast.expr_context))
            or (isinstance(n, ast.Name) and n.id in env)
            for n in ast.walk(node)
        )

    def value(node):
        return eval(compile(ast.Expression(node), "<const>", "eval"), {}, dict(env))

    big = lambda v: type(v) is int and abs(v) >= 2**53  # noqa: E731
    for stmt in ast.parse(program).body:
        tg = stmt.targets[0]
        if isinstance(tg, ast.Subscript) and isinstance(tg.slice, ast.Name) and tg.slice.id == "T":
            continue  # a tail
        for node in ast.walk(stmt.value):
            if isinstance(node, ast.expr) and const(node) and big(value(node)):
                return True
        names = [tg.id for tg in stmt.targets if isinstance(tg, ast.Name)]
        if carried in names:  # S = B + A * S (any of the four spellings): the first step's A * S
            left = stmt.value.left
            reads_s = any(isinstance(n, ast.Name) and n.id == carried for n in ast.walk(left))
            is_prod = isinstance(left, ast.BinOp) and isinstance(left.op, ast.Mult) and reads_s
            prod = left if is_prod else stmt.value.right
            if not (isinstance(prod, ast.BinOp) and isinstance(prod.op, ast.Mult)):
                continue  # not the affine form
            a = prod.left if isinstance(prod.right, ast.Name) and prod.right.id == carried else prod.right
            if const(a) and type(init) in (int, bool) and big(value(a) * init):
                return True
        elif const(stmt.value):
            env.update({n: value(stmt.value) for n in names})
    return False


def test_big_python_ints_are_found():
    assert _big_python_ints("k = c * c; s = x[t] + 0.5 * s", [2**30, 0.0, None])
    assert not _big_python_ints("k = c * c; s = x[t] + 0.5 * s", [2**20, 0.0, None])
    assert _big_python_ints("s = x[t] + c * s", [3**34, None, 2])
    assert _big_python_ints("s = x[t] + s * c", [3**34, None, 2])
    assert not _big_python_ints("s = x[t] + s * c", [3**30, None, 2])
    assert not _big_python_ints("s = x[t] + s * c", [3.0**34, None, 2])
    assert _big_python_ints("o[t] = s = x[t] + 0.5 * 2 ** 0 + 3 * 2 * s", [None, 2**52, None])


def _loop_raises(program, T, values):
    try:
        reference(program, T, values)
    except (ZeroDivisionError, OverflowError, RuntimeError):  # the loop itself raises (a number / 0)
        return True
    return False


@needs_kernel
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_match_the_loop(case):
    program, T, values = case
    if _loop_raises(program, T, values):
        reject()
    (refused_or_exact if _big_python_ints(program, values) else check)(program, T, values)


@needs_kernel
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(row_shapes=[(9,), (17,), (2, 20), (1030,)], max_T=400))
def test_random_programs_over_several_blocks_match_the_loop(case):
    """The kernel works in blocks of about 1024 elements and 8 columns: T * R past them."""
    program, T, values = case
    if _loop_raises(program, T, values):
        reject()
    (refused_or_exact if _big_python_ints(program, values) else check)(program, T, values)


@needs_kernel
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(wide=True, ext=True), st.sampled_from([0, 0, 1]))
def test_random_programs_of_the_extensions(case, stop):
    """The implementation's extensions: updates of any form, statements after the update, [1, *row]
    tails and init, and ``stop=1``; refused or exact."""
    program, T, values = case
    if _loop_raises(program, T, values):
        reject()
    refused_or_exact(program, T, values, stop)


@needs_kernel
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.sampled_from(["grad", "noncontig", "short", "dtype", "alias", "subclass", "T"]))
def test_random_programs_refused_when_a_value_is_not_supported(case, how):
    program, T, values = case
    if _loop_raises(program, T, values):
        reject()
    names = free_names(program)
    if "x0" not in names:
        reject()
    i = names.index("x0")
    x = values[i]
    if how == "grad":
        values[i] = x.clone().requires_grad_(True)
    elif how == "noncontig":
        values[i] = torch.stack([x, x], dim=-1)[..., 0]
        assert not values[i].is_contiguous()
    elif how == "short":
        values[i] = x[: T - 1].clone()
    elif how == "dtype":
        others = [v for n, v in zip(names, values) if isinstance(v, torch.Tensor) and n not in ("x0", "c0", "c1")]
        if not others:
            reject()
        values[i] = x.to(torch.float64 if x.dtype == torch.float32 else torch.float32)
    elif how == "alias":
        outs = [j for j, n in enumerate(names) if n.startswith("o")]
        if not outs:
            reject()
        values[outs[0]] = x[:T]
    elif how == "subclass":
        values[i] = x.clone().as_subclass(MyTensor)
    elif how == "T":
        T = 1
    refused(program, T, values, how)
