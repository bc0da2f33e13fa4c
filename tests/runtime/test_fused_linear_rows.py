"""Differential tests of fused_linear's three later extensions against the loop they replace.

Row mode (an update that is not ``S = B + A * S`` runs as written, one row at a time), memo mode
(the carried value lives in an output, ``OUT[t] = f(OUT[t + 1])``, its start OUT's row T) and the
post phase (statements after the update that read its new value). The reference is the program
text executed as ``for t in range(T - 1, stop - 1, -1):`` on clones (tails ``X[T] = NAME`` turned
into the last step's reads); every accepted call must agree with it bit for bit (dtype, shape,
bytes; any NaN equals any NaN) in the returned value and every output, rows the loop does not
write included, and leave every input as it was. A refused call returns None and writes nothing.
"""

import ast
import io
import keyword
import math
import textwrap
import tokenize

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from scalebox_cst.runtime.fused import available, fused_linear, params_of
from scalebox_cst.fused_program import LOADS, program as compiled
import harness

needs_kernel = pytest.mark.skipif(not available(), reason="scalebox_cst.runtime._fused_c not built")
INF, NAN = math.inf, math.nan
_BITS = {torch.float32: torch.int32, torch.float64: torch.int64}


# ---------------------------------------------------------------- the reference


def _is_tail(stmt):
    tg = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
    return (isinstance(tg, ast.Subscript) and isinstance(tg.slice, ast.Name) and tg.slice.id == "T"
            and isinstance(stmt.value, ast.Name))


def _names_in(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def carried_name(program):
    """The Name target of the statement that reads it (None in memo mode)."""
    for stmt in ast.parse(program).body:
        for tg in stmt.targets:
            if isinstance(tg, ast.Name) and tg.id in _names_in(stmt.value):
                return tg.id
    return None


def free_names(program):
    """The params as the spec defines them (free names by first token), independent of params_of."""
    S = carried_name(program)
    temps = {tg.id for s in ast.parse(program).body for tg in s.targets if isinstance(tg, ast.Name)} - {S}
    toks = [tk.string for tk in tokenize.generate_tokens(io.StringIO(program).readline)
            if tk.type == tokenize.NAME and not keyword.iskeyword(tk.string)]
    return tuple(dict.fromkeys(n for n in toks if n not in ("t", "T") and n not in temps))


class _Tails(ast.NodeTransformer):
    def __init__(self, tails):
        self.tails = tails

    def visit_Subscript(self, node):
        self.generic_visit(node)
        s = node.slice
        if (isinstance(node.value, ast.Name) and node.value.id in self.tails and isinstance(node.ctx, ast.Load)
                and isinstance(s, ast.BinOp) and isinstance(s.left, ast.Name) and s.left.id == "t"
                and isinstance(s.right, ast.Constant) and s.right.value == 1):
            text = f"({self.tails[node.value.id]} if t == T - 1 else {ast.unparse(node)})"
            return ast.parse(text, mode="eval").body
        return node


def loop_source(program, stop=0):
    tails = {s.targets[0].value.id: s.value.id for s in ast.parse(program).body if _is_tail(s)}
    body = [ast.fix_missing_locations(_Tails(tails).visit(s)) for s in ast.parse(program).body if not _is_tail(s)]
    return f"for t in range(T - 1, {stop - 1}, -1):\n" + textwrap.indent("\n".join(map(ast.unparse, body)), "    ")


def _clone(v):
    return v.clone() if isinstance(v, torch.Tensor) else v


def reference(program, T, env, stop=0):
    """(the loop's carried value, or True in memo mode; the namespace after the loop), on clones."""
    ns = {n: _clone(v) for n, v in env.items()}
    ns["T"] = T
    harness.load(loop_source(program, stop), filename="<loop>", namespace=ns)
    S = carried_name(program)
    return (ns[S] if S is not None else True), ns


def test_the_reference_is_the_loop():
    """ikostrikov's returns (memo) written out by hand, stop=1 included."""
    g = torch.Generator().manual_seed(1)
    T, N = 6, 3
    r, m = torch.randn(T, N, generator=g), (torch.rand(T + 1, N, generator=g) < 0.7).float()
    out = torch.randn(T + 2, N, generator=g)
    for stop in (0, 1):
        mine = out.clone()
        for step in reversed(range(stop, T)):
            mine[step] = mine[step + 1] * 0.99 * m[step + 1] + r[step]
        got, ns = reference("ret[t] = ret[t + 1] * gamma * m[t + 1] + r[t]", T,
                            {"ret": out, "gamma": 0.99, "m": m, "r": r}, stop)
        assert got is True and torch.equal(ns["ret"], mine) and not torch.equal(ns["ret"], out)
        assert torch.equal(ns["ret"][:stop], out[:stop]) and torch.equal(ns["ret"][T:], out[T:])


# ---------------------------------------------------------------- comparisons


def assert_same(got, want, what):
    """Bitwise: dtype, shape and bytes; NaN equals NaN (of any sign or payload)."""
    assert type(got) is torch.Tensor, f"{what}: {type(got).__name__}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    g, w = got.reshape(-1), want.reshape(-1)
    ok = (g.view(_BITS[g.dtype]) == w.view(_BITS[w.dtype])) | (torch.isnan(g) & torch.isnan(w))
    if not bool(ok.all()):
        i = int((~ok).nonzero()[0])
        raise AssertionError(f"{what}: {int((~ok).sum())} of {g.numel()} differ; first at flat {i}: "
                             f"got {g[i].item()!r}, want {w[i].item()!r}")


def _untouched(values, before, names):
    for n, v, b in zip(names, values, before):
        if isinstance(v, torch.Tensor):
            assert_same(v, b, f"{n} (should be untouched)")
        else:
            assert v is b, n


def _shares(a, b):
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.numel() > 0 and b.numel() > 0
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def run(program, T, env, stop=0, refuse=False, info=None):
    """Call fused_linear on the values and compare it with the loop: refused (None, nothing
    written) where ``refuse`` or the loop raises, else bitwise the loop. Returns the result."""
    names = free_names(program)
    assert params_of(program) in ((names,) if not refuse else ((), names)), (params_of(program), names)
    values = [env[n] for n in names]
    before = [_clone(v) for v in values]
    try:
        want, after = reference(program, T, env, stop)
    except (ZeroDivisionError, IndexError):  # the loop raises (a number over 0, no row T): left to it
        refuse = True
        info is None or info.update(raised=True)
    got = fused_linear(program, T, *values, stop=stop)
    if refuse:
        assert got is None, f"accepted {program!r} T={T} stop={stop}: {got!r}"
        _untouched(values, before, names)
        return None
    assert got is not None, f"refused {program!r} T={T} stop={stop}"
    if want is True:
        assert got is True, f"memo mode returns True, got {got!r}"
    else:
        assert_same(got, want, "carried value")
    outs = {tg.value.id for s in ast.parse(program).body if not _is_tail(s) for tg in s.targets
            if isinstance(tg, ast.Subscript)}
    for n, v, b in zip(names, values, before):
        if n in outs:
            assert_same(v, after[n], f"output {n}")  # every row: the ones the loop leaves as they were too
        elif isinstance(v, torch.Tensor):
            assert_same(v, b, f"input {n}")
        assert not _shares(got, v), f"the result shares memory with {n}"
    return got


def is_linear(value, S):
    """``B + A * S`` in one of its four spellings, A and B not reading S."""
    if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)):
        return False
    for b, m in ((value.left, value.right), (value.right, value.left)):
        if isinstance(m, ast.BinOp) and isinstance(m.op, ast.Mult):
            for s_side, a in ((m.right, m.left), (m.left, m.right)):
                if isinstance(s_side, ast.Name) and s_side.id == S and S not in _names_in(a) | _names_in(b):
                    return True
    return False


def _rand(shape, seed, dtype=torch.float32, mask=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    if mask:  # a mask with its zeros, else any numbers: products by exact ones would hide a regrouping
        x = torch.where(torch.rand(shape, generator=g) < 0.2, 0.0, x.abs())
    return x.to(dtype)


# ---------------------------------------------------------------- the brief's examples, by hand

ROW_EXAMPLES = [
    "ret[t] = s = s * gamma * m[t] + r[t]",  # two roundings with s: not B + A * S
    "s = r[t] - 2.0 / (s + 3.0)",
    "s = -s * m[t] + r[t]",
    "ret[t] = s = r[t] + gamma * s * m[t] / (1.0 + s * s)",
]
ROWS = [(), (1,), (3,), (2, 3), (9,), (1030,)]


def _example_env(program, T, row, dtype, start, seed=0):
    env, S = {}, carried_name(program)
    for i, n in enumerate(free_names(program)):
        if n in ("gamma", "tau"):
            env[n] = 0.99 if n == "gamma" else 0.95
        elif n == S:
            env[n] = start
        elif n in ("ret", "returns", "adv"):
            env[n] = _rand((T + 2,) + row, seed + 100 + i, dtype)
        else:
            env[n] = _rand((T + 1,) + row, seed + i, dtype, mask=n in ("m", "masks"))
    return env


@needs_kernel
@pytest.mark.parametrize("program", ROW_EXAMPLES)
@pytest.mark.parametrize("row", ROWS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_row_mode_examples_are_the_loop(program, row, dtype):
    p = compiled(program)
    assert p is not None and p.row_mode and not p.memo
    for T, stop, start in ((2, 0, "0d"), (37, 1, "row"), (300, 0, "row"), (5, 0, "wide")):
        if start == "wide" and not row:
            continue
        s0 = _rand(() if start == "0d" else (1,) * (start == "wide") + row, 7, dtype)
        run(program, T, _example_env(program, T, row, dtype, s0), stop)


@needs_kernel
@pytest.mark.parametrize("program", ROW_EXAMPLES)
@pytest.mark.parametrize("start", [0, 1, 0.0, 0.5, -2.25, True])
def test_row_mode_refuses_a_python_number_start(program, start):
    T, row = 9, (4,)
    run(program, T, _example_env(program, T, row, torch.float32, start), refuse=True)
    # the same number as a 0-d tensor is taken, and exact
    run(program, T, _example_env(program, T, row, torch.float32, torch.tensor(float(start))))


IKOSTRIKOV_RETURNS = "returns[t] = returns[t + 1] * gamma * masks[t + 1] + rewards[t]"
IKOSTRIKOV_GAE = (
    "delta = rewards[t] + gamma * value_preds[t + 1] * masks[t + 1] - value_preds[t]; "
    "gae = delta + gamma * tau * masks[t + 1] * gae; returns[t] = gae + value_preds[t]"
)
GAE_ROW = (  # the same with S inside the product: row mode with a post phase
    "delta = rewards[t] + gamma * value_preds[t + 1] * masks[t + 1] - value_preds[t]; "
    "gae = delta + gamma * gae * masks[t + 1]; returns[t] = gae + value_preds[t]; adv[t] = gae"
)


@needs_kernel
@pytest.mark.parametrize("row", ROWS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("stop", [0, 1])
def test_ikostrikov_memo_returns(row, dtype, stop):
    p = compiled(IKOSTRIKOV_RETURNS)
    assert p is not None and p.memo == "returns" and p.row_mode
    assert params_of(IKOSTRIKOV_RETURNS) == ("returns", "gamma", "masks", "rewards")
    for T in (2, 3, 130):
        env = _example_env(IKOSTRIKOV_RETURNS, T, row, dtype, None)
        assert run(IKOSTRIKOV_RETURNS, T, env, stop) is True


@needs_kernel
@pytest.mark.parametrize("program", [IKOSTRIKOV_GAE, GAE_ROW])
@pytest.mark.parametrize("row", [(), (1,), (5,), (1030,)], ids=str)
@pytest.mark.parametrize("stop", [0, 1])
def test_gae_with_a_post_phase(program, row, stop):
    assert compiled(program).row_mode == (program == GAE_ROW)
    for T, dtype in ((2, torch.float32), (200, torch.float32), (33, torch.float64)):
        env = _example_env(program, T, row, dtype, _rand(row, 3, dtype))
        run(program, T, env, stop)


@needs_kernel
@pytest.mark.parametrize("row", [(1,), (3,), (1030,)], ids=str)
@pytest.mark.parametrize("start", ["0d", "row"])
def test_a_carried_value_of_per_step_numbers_keeps_the_start_shape(row, start):
    """S computed from numbers per step only: 0-d in the loop from a 0-d start (rows of one
    element included), the row shape from a row start; x0 rows only in the other statements."""
    program = "a = x[t] * 0.5; s = p[t] - 2.0 / (s + 3.0) * p[t + 1]; o[t] = a + s; q[t] = s"
    T = 40
    env = {"x": _rand((T,) + row, 1), "p": _rand((T + 1,), 2), "o": _rand((T,) + row, 3),
           "q": _rand((T + 1,) + row, 4), "s": _rand(() if start == "0d" else row, 5)}
    for stop in (0, 1):
        got = run(program, T, env, stop)
        assert got.shape == (() if start == "0d" else row)


TAILED = [  # the last step's reads X[t + 1] of a tail (CleanRL's next_value), in row and memo mode
    "v[T] = nv; m[T] = nm; d = r[t] + g * v[t + 1] * m[t + 1] - v[t]; o[t] = s = d + g * s * m[t + 1]",
    "v[T] = nv; s = r[t] - v[t + 1] / (1.0 + s * s) + -s * v[t]; o[t] = s * v[t + 1]",
    "m[T] = nm; ret[t] = ret[t + 1] * g * m[t + 1] + r[t]",
    "v[T] = nv; ret[t] = r[t] + g * v[t + 1] - (ret[t + 1] - v[t]) / 2.0",
]


@needs_kernel
@pytest.mark.parametrize("program", TAILED)
@pytest.mark.parametrize("row,wide", [((), 0), ((3,), 0), ((3,), 1), ((1030,), 0), ((1030,), 1)], ids=str)
def test_tails_in_row_and_memo_mode(program, row, wide):
    T = 50
    env = {"g": 0.99, "r": _rand((T,) + row, 1), "v": _rand((T,) + row, 2), "m": _rand((T,) + row, 3, mask=True),
           "o": _rand((T + 1,) + row, 4), "ret": _rand((T + 2,) + row, 5), "s": _rand(row, 6)}
    env["nv"], env["nm"] = _rand((1,) * wide + row, 7), _rand((1,) * wide + row, 8, mask=True)
    env = {n: env[n] for n in free_names(program)}
    assert compiled(program).row_mode
    for stop in (0, 1):
        got = run(program, T, env, stop)
        if "s" in env:
            assert got.shape == ((1,) * wide + row)


@needs_kernel
@pytest.mark.parametrize("program", [ROW_EXAMPLES[3], IKOSTRIKOV_RETURNS, GAE_ROW])
@pytest.mark.parametrize("row", [(), (1,)], ids=str)
def test_many_blocks_of_one_column(program, row):
    """One element per row: blocks of 1024 rows, T past one and two of them."""
    for T, stop in ((1025, 1), (2049, 0)):
        run(program, T, _example_env(program, T, row, torch.float32, _rand(row, 9)), stop)


@needs_kernel
@pytest.mark.parametrize("n", [20, 64])
def test_long_row_programs_are_exact_or_refused_without_raising(n):
    """The kernel takes at most 64 row temporaries: past them a refusal, never an exception."""
    e = "s"
    for i in range(n):
        e = f"({e} * r[t] + 0.5)" if i % 2 else f"({e} / (s + 2.0))"
    program, T = f"o[t] = s = r[t] - {e}", 12
    env = {"o": _rand((T, 3), 3), "r": _rand((T, 3), 1), "s": _rand((3,), 5)}
    got = fused_linear(program, T, *[_clone(env[k]) for k in free_names(program)])
    assert got is not None or n > 20, "a row program well within the kernel's limits refused"
    run(program, T, env, refuse=got is None)


# ---------------------------------------------------------------- refusals of the new modes


@needs_kernel
@pytest.mark.parametrize("stop", [0, 1])
def test_memo_output_of_t_rows_is_refused(stop):
    T = 8
    env = _example_env(IKOSTRIKOV_RETURNS, T, (3,), torch.float32, None)
    env["returns"] = env["returns"][:T].clone()  # no row T: no start value
    run(IKOSTRIKOV_RETURNS, T, env, stop, refuse=True)
    env["returns"] = _rand((T + 1, 3), 5)  # T + 1 rows is enough
    run(IKOSTRIKOV_RETURNS, T, env, stop)


MEMO_REFUSED = [
    "ret[t] = ret[t] * g + r[t]",  # read at t
    "ret[t] = ret[t + 2] * g + r[t]",  # read at t + 2
    "ret[t] = ret[t + 1] * g + ret[t + 2]",  # at t + 1 and t + 2
    "ret[t] = ret[t + 1] * g + r[t] * ret[t]",
    "u = ret[t + 1] * 2.0; ret[t] = ret[t + 1] * g + u",  # read in another statement
    "ret[t] = ret[t + 1] * g + r[t]; o[t] = ret[t + 1] - r[t]",
    "ret[t] = ret[t + 1] * g + r[t]; o[t] = ret[t] + r[t]",
    "ret[t] = ret[t + 1] * g + r[t]; ret[t] = r[t] * 2.0",  # written by another statement too
    "ret[t] = r[t] * 2.0; ret[t] = ret[t + 1] * g + r[t]",
    "o[t] = ret[t + 1] + r[t]; ret[t] = r[t] * g",  # an output read in a statement that writes another
]


@needs_kernel
@pytest.mark.parametrize("program", MEMO_REFUSED)
def test_memo_outputs_read_or_written_elsewhere_are_refused(program):
    T = 6
    env = {"ret": _rand((T + 3, 2), 1), "o": _rand((T + 3, 2), 2), "r": _rand((T + 1, 2), 3), "g": 0.9}
    env = {n: env[n] for n in free_names(program)}
    run(program, T, env, refuse=True)


@needs_kernel
def test_memo_output_with_a_second_target_is_refused_or_exact():
    T, program = 6, "o[t] = ret[t] = ret[t + 1] * g + r[t]"
    env = {"ret": _rand((T + 1, 2), 1), "o": _rand((T, 2), 2), "r": _rand((T, 2), 3), "g": 0.9}
    run(program, T, env, refuse=compiled(program) is None)


# ---------------------------------------------------------------- random programs

OPS = [ast.Add, ast.Sub, ast.Mult, ast.Div]
LITERALS = [0.5, 2.0, 1.0, 3.0, 0.25, 1e-3, 0.99, 1, 2, 3, 0]
CONSTS = st.one_of(st.sampled_from([0.99, 0.95, 1.0, 0.0, -0.0, 2, 1, 0, -1, 3, 1e-3, 1e39, INF, NAN]),
                   st.floats(-4, 4, allow_nan=False))
SPECIAL = torch.tensor([0.0, -0.0, INF, -INF, NAN, 1e-40, 3e38, 1.0, -1.0], dtype=torch.float64)


def _n(x, ctx=ast.Load):
    return ast.Name(x, ctx())


def _sub(x, k, ctx=ast.Load):
    return ast.Subscript(_n(x), _n("t") if k == 0 else ast.BinOp(_n("t"), ast.Add(), ast.Constant(k)), ctx())


@st.composite
def cases(draw, memo=None, post=None, rows=ROWS, max_T=300):
    """(program, T, env, stop, refuse, row_mode): a program whose update (of S, or memo ``ret[t] =
    f(ret[t + 1])``) reads S anywhere; refuse: a Python-number start of a row-mode update."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    row = draw(st.sampled_from(rows))
    T, stop = draw(st.one_of(st.integers(2, 9), st.integers(2, max_T))), draw(st.sampled_from([0, 1]))
    memo, post = (draw(st.booleans()) if x is None else x for x in (memo, post))
    # seqs: name -> [per-step scalar, tailed]; x0 has the row shape
    seqs = {"x0": [False, draw(st.booleans())], "x1": [draw(st.booleans()), draw(st.booleans())],
            "p0": [True, draw(st.booleans())]}
    reads = {x: set() for x in seqs}  # the k each seq is read at
    upd_reads = set()  # (seq, k) read by the update statement itself
    consts = {"c0": draw(CONSTS), "c1": draw(CONSTS)}
    temps = {}  # name -> vector (reads a seq or S)
    outputs, S = [], "s"
    s_leaf = (lambda: _sub("ret", 1)) if memo else (lambda: _n(S))
    where = {"upd": False}

    def seq_read(x=None):
        x = x or draw(st.sampled_from(sorted(seqs)))
        k = draw(st.integers(0, 1 if seqs[x][1] else 2))
        reads[x].add(k)
        if where["upd"]:
            upd_reads.add((x, k))
        return _sub(x, k)

    def expr(depth, s_ok):
        kinds = ["seq"] * 3 + ["const", "lit"] + ["temp"] * bool(temps) + ["S"] * 3 * s_ok
        if depth > 0:
            kinds += ["bin"] * 6 + ["neg", "pos"]
        kind = draw(st.sampled_from(kinds))
        if kind == "seq":
            return seq_read()
        if kind == "const":
            return _n(draw(st.sampled_from(sorted(consts))))
        if kind == "lit":
            return ast.Constant(draw(st.sampled_from(LITERALS)))
        if kind == "temp":
            return _n(draw(st.sampled_from(sorted(temps))))
        if kind == "S":
            return s_leaf()
        if kind in ("neg", "pos"):
            return ast.UnaryOp(ast.USub() if kind == "neg" else ast.UAdd(), expr(depth - 1, s_ok))
        return ast.BinOp(expr(depth - 1, s_ok), draw(st.sampled_from(OPS))(), expr(depth - 1, s_ok))

    def vector(e):
        return any(isinstance(n, ast.Subscript) or (isinstance(n, ast.Name) and (n.id == S or temps.get(n.id)))
                   for n in ast.walk(e))

    def combine(e, leaf):
        op = draw(st.sampled_from(OPS))()
        return ast.BinOp(e, op, leaf) if draw(st.booleans()) else ast.BinOp(leaf, op, e)

    def new_out():
        outputs.append(f"o{len(outputs)}")
        return _sub(outputs[-1], 0, ast.Store)

    def assign(name, e, s_ok_store=True):
        targets = [new_out() for _ in range(draw(st.integers(0, 1)))] if vector(e) else []
        if name is None and not targets:
            targets = [new_out()] if vector(e) else []
            if not targets:
                return
        if name is not None:
            temps[name] = vector(e)
            targets.append(_n(name, ast.Store))
        stmts.append(ast.Assign(targets, e))

    stmts = []
    for i in range(draw(st.integers(0, 2))):  # before the update: temporaries and outputs, no S
        assign(draw(st.sampled_from([f"a{i}", None])), expr(2, False))
    # the carried update
    where["upd"] = True
    if draw(st.integers(0, 3)) == 0:  # B + A * S, one of its spellings (the recurrence kernel)
        a, b = expr(1, False), expr(2, False)
        if not any(isinstance(n, ast.Subscript) for n in ast.walk(ast.Tuple([a, b]))):
            b = combine(b, seq_read())
        prod = ast.BinOp(a, ast.Mult(), s_leaf()) if draw(st.booleans()) else ast.BinOp(s_leaf(), ast.Mult(), a)
        value = ast.BinOp(b, ast.Add(), prod) if draw(st.booleans()) else ast.BinOp(prod, ast.Add(), b)
    else:
        value = expr(3, True)
        if not any(ast.dump(n) == ast.dump(s_leaf()) for n in ast.walk(value)):
            value = combine(value, ast.UnaryOp(ast.USub(), s_leaf()) if draw(st.booleans()) else s_leaf())
        if not any(isinstance(n, ast.Subscript) and n.value.id != "ret" for n in ast.walk(value)):
            value = combine(value, seq_read())
    where["upd"] = False
    if memo:
        stmts.append(ast.Assign([_sub("ret", 0, ast.Store)], value))
    else:
        stmts.append(ast.Assign([new_out() for _ in range(draw(st.integers(0, 2)))] + [_n(S, ast.Store)], value))
        temps[S] = True
    if post:  # after the update: its new value (not in memo mode), temporaries, outputs
        for i in range(draw(st.integers(1, 3))):
            if not memo and draw(st.integers(0, 3)) == 0:
                stmts.append(ast.Assign([new_out()], _n(S)))
            else:
                assign(draw(st.sampled_from([f"b{i}", None])), expr(2, not memo))
    temps.pop(S, None)
    if not reads["x0"]:  # x0 gives the row shape: read it somewhere (first, so no temporaries)
        saved = dict(temps)
        temps.clear()
        stmts.insert(0, ast.Assign([new_out()], combine(expr(1, False), seq_read("x0"))))
        temps.update(saved)
    wide_tails = {x for x, k in upd_reads if k == 1 and seqs[x][1] and not seqs[x][0] and row}
    tails, env = [], dict(consts)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    p_special = draw(st.sampled_from([0.0, 0.05, 0.3]))
    scale = draw(st.sampled_from([1.0, 1e-3, 1e20]))

    def data(shape, mask=False):
        x = torch.randn(shape, generator=g, dtype=torch.float64) * scale
        if mask:
            x = (torch.rand(shape, generator=g) < 0.8).double()
        if p_special:
            pick = torch.randint(len(SPECIAL), shape, generator=g)
            x = torch.where(torch.rand(shape, generator=g) < p_special, SPECIAL[pick], x)
        return x.to(dtype)

    for x, (per_step, tailed) in seqs.items():
        if not reads[x]:
            continue
        shape = () if per_step else row
        tail = tailed and 1 in reads[x]
        env[x] = data((T + (0 if tail else max(reads[x])) + draw(st.integers(0, 2)),) + shape,
                      mask=draw(st.booleans()))
        if tail:
            tails.append(f"{x}[T] = {x}_next")
            env[f"{x}_next"] = data(shape)
            if x in wide_tails and draw(st.booleans()):  # [1, *row]: the carried value is that shape
                env[f"{x}_next"] = env[f"{x}_next"].reshape((1,) + shape)
    for o in outputs:
        env[o] = data((T + draw(st.integers(0, 2)),) + row)
    refuse = False
    if memo:
        env["ret"] = data((T + 1 + draw(st.integers(0, 2)),) + row)
        row_mode = not is_linear(ast.parse(ast.unparse(value).replace("ret[t + 1]", S), mode="eval").body, S)
    else:
        row_mode = not is_linear(value, S)
        kind = draw(st.sampled_from(["0d", "row", "wide", "int", "float"]))
        if kind in ("int", "float"):
            env[S] = draw(st.integers(-3, 3)) if kind == "int" else draw(CONSTS)
            refuse = row_mode  # as written, the first step would be Python arithmetic on a number
        else:
            env[S] = data(() if kind == "0d" else ((1,) if kind == "wide" and row else ()) + row)
    program = "; ".join(tails + [ast.unparse(ast.fix_missing_locations(s)) for s in stmts])
    return program, T, env, stop, refuse, row_mode


def _check_case(case):
    program, T, env, stop, refuse, row_mode = case
    p = compiled(program)
    assert p is not None, f"outside the grammar: {program!r}"
    assert p.row_mode == row_mode, program
    assert p.memo == ("ret" if "ret[t + 1]" in program else "")
    info = {}
    got = run(program, T, env, stop, refuse, info)
    how = "the loop raises" if info else "refused" if got is None else "exact"
    post = ", post reads S" if any(c[0] == LOADS for c in p.code_t) else ", post" if p.npre < len(p.code_t) else ""
    event(f"{'row' if row_mode else 'linear'} {'memo' if p.memo else 'named'}: {how}{post}")


@needs_kernel
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(max_T=40))
def test_random_updates_match_the_loop(case):
    _check_case(case)


@needs_kernel
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_random_updates_over_many_steps_and_blocks_match_the_loop(case):
    """T up to 300 and rows up to 1030 elements: past the kernel's blocks of about 1024 elements."""
    _check_case(case)


@needs_kernel
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(memo=True, max_T=60))
def test_random_memo_programs_match_the_loop(case):
    _check_case(case)


@needs_kernel
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(memo=False, post=True, max_T=60))
def test_random_post_phases_match_the_loop(case):
    _check_case(case)


@needs_kernel
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(memo=True, max_T=40))
def test_random_memo_with_a_short_output_is_refused(case):
    program, T, env, stop, _, _ = case
    env["ret"] = env["ret"][:T].clone()
    run(program, T, env, stop, refuse=True)


# ---------------------------------------------------------------- numpy arrays (NumPy 2)

NUMPY_PROGRAMS = ROW_EXAMPLES + [IKOSTRIKOV_RETURNS, IKOSTRIKOV_GAE, GAE_ROW,
                                 "adv[t] = s = r[t] + gamma * tau * m[t] * s",
                                 "s = r[t] * gamma + m[t + 1] * s; ret[t] = s - r[t]"]


def _np_copy(env):
    import numpy as np

    return {n: (v.copy() if isinstance(v, np.ndarray) else v) for n, v in env.items()}


def _np_same(got, want, what):
    import numpy as np

    assert type(got) is type(want), f"{what}: {type(got).__name__} != {type(want).__name__}"
    g, w = np.asarray(got), np.asarray(want)
    assert g.dtype == w.dtype and g.shape == w.shape, f"{what}: {g.dtype}{g.shape} != {w.dtype}{w.shape}"
    same = (g.view(f"i{g.itemsize}") == w.view(f"i{w.itemsize}")) | (np.isnan(g) & np.isnan(w))
    assert bool(np.all(same)), f"{what}: {int((~same).sum())} of {g.size} differ"


@needs_kernel
@pytest.mark.parametrize("program", NUMPY_PROGRAMS)
@pytest.mark.parametrize("row", [(), (1,), (3,), (1030,)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_numpy_arrays_are_the_numpy_loop(program, row, dtype):
    """The same programs over numpy arrays against the loop run by numpy itself: bitwise where
    taken (a numpy scalar where the loop leaves one), refused only where numpy computes otherwise
    (``c / x``: one division) or on NumPy 1 (value-based casting)."""
    import numpy as np

    numpy2 = int(np.__version__.split(".")[0]) >= 2
    p = compiled(program)
    for T, stop, start in ((2, 0, "0d"), (37, 1, "row"), (300, 0, "row")):
        S = carried_name(program)
        s0 = None if S is None else _rand(() if start == "0d" else row, 7, dtype).numpy()
        env = {n: (v.numpy() if isinstance(v, torch.Tensor) else v)
               for n, v in _example_env(program, T, row, dtype, s0).items()}
        names = free_names(program)
        values = [env[n] for n in names]
        loop_env = _np_copy(env)
        loop_env["T"] = T
        harness.load(loop_source(program, stop), filename="<loop>", namespace=loop_env)
        want = loop_env[S] if S is not None else True
        before = _np_copy(env)
        got = fused_linear(program, T, *values, stop=stop)
        if not numpy2 or p.recip:
            assert got is None
            for n in names:
                if isinstance(env[n], np.ndarray):
                    _np_same(env[n], before[n], f"{n} (untouched)")
            continue
        assert got is not None, (program, T, stop)
        if want is True:
            assert got is True
        else:
            _np_same(got, want, "carried value")
        for n in names:
            if isinstance(env[n], np.ndarray):  # outputs as the loop left them, inputs (the start) untouched
                _np_same(env[n], before[n] if n == S else loop_env[n], n)
