"""Site reasons that say what stopped a rewrite (issue 14 part 2): one table of pure calls that
every transform consults, star imports named as such (and resolved where their names are
known), and a site for every loop that walks backward over a sequence.
"""
from __future__ import annotations

from conftest import TESTS  # tests/: the corpus, fake_torch_npu and the repository root beside it
import ast
import builtins
import glob
import os
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalebox_cst.report import REWRITTEN, SKIPPED
from scalebox_cst.transforms import statement_memo
from scalebox_cst.transforms.analysis import scopes
from scalebox_cst.transforms.analysis.purity import MODULE_INPLACE_METHODS, PURE_FUNCS, PURE_METHODS, pure_call
from scalebox_cst.transforms.names import ImportMap
from scalebox_cst.transforms.vectorize.recurrence import backward

import libcst as cst
import harness

REC, ELEM, RED, TU = "vectorize.recurrence", "vectorize.elementwise", "vectorize.reduction", "vectorize.target_update"
HERE = TESTS


def rewrite(src, *transforms):
    return harness.rewrite(src, list(transforms) or None)  # the shared differential harness (tests/harness.py)


def run(code, name, *args):
    return harness.load(code, name, filename="<t_reasons>", module="t_reasons")(*args)


# --------------------------------------------------------------------------- the pure-call table

HEADER = "import math\nimport numpy as np\nimport torch\nimport torch.nn.functional as F\n"
#: module prefixes in HEADER for each qualified prefix of the table
LOCAL = (("torch.nn.functional.", "F."), ("numpy.", "np."), ("torch.", "torch."), ("math.", "math."))


def _local(qual: str) -> str:
    for full, short in LOCAL:
        if qual.startswith(full):
            return short + qual[len(full):]
    raise AssertionError(qual)


#: every table entry as (label, call text with ARG for the per-step / per-element value)
CALLS = [(q, f"{_local(q)}(ARG)") for q in sorted(PURE_FUNCS)] + [(m, f"ARG.{m}()") for m in sorted(PURE_METHODS)]

#: look-alikes: in-place methods, a user function named like a torch one, a shadowed or unknown
#: module, random state, writing keywords
LOOKALIKES = [
    ("add_", "ARG.add_(1)"), ("clamp_", "ARG.clamp_(0, 1)"), ("copy_", "ARG.copy_(ARG)"),
    ("resize_", "ARG.resize_(3)"), ("backward", "ARG.backward()"), ("append", "ARG.append(1)"),
    ("numpy", "ARG.numpy()"), ("cuda", "ARG.cuda()"), ("user exp", "exp(ARG)"), ("mylib.sum", "mylib.sum(ARG)"),
    ("self.clamp", "self.clamp(ARG)"), ("ndarray.sort", "ARG.sort()"),
    ("rebound torch", "th.exp(ARG)"), ("torch.rand_like", "torch.rand_like(ARG)"),
    ("out=", "torch.exp(ARG, out=ARG)"), ("inplace=", "F.relu(ARG, inplace=True)"),
]
LOOKALIKE_HEADER = HEADER + "import mylib\nimport torch as th\n\n\ndef exp(v):\n    return v\n\n\nth = mylib\n"


def _module(calls, template, header):
    """One function per call, each holding the loop; returns the code and each loop's line."""
    lines = header.splitlines()
    where = []
    for k, (_, call) in enumerate(calls):
        body = textwrap.dedent(template).format(k=k, CALL="{CALL}").splitlines()
        lines.extend(["", ""])
        loop = next(j for j, l in enumerate(body) if l.lstrip().startswith("for "))
        where.append(len(lines) + loop + 1)
        lines.extend(l.replace("{CALL}", call) for l in body)
    return "\n".join(lines) + "\n", where


TEMPLATES = {
    # a backward recurrence whose per-step input calls the function
    REC: ("""\
        def f{k}(r, out, gamma, T):
            g = 0.0
            for t in reversed(range(T)):
                g = r[t] + gamma * g + {CALL}
                out[t] = g
            return out
        """, "r[t]"),
    # out[i] = f(a[i])
    ELEM: ("""\
        def f{k}(a, out, n):
            for i in range(n):
                out[i] = {CALL}
            return out
        """, "a[i]"),
    # total += f(x)
    RED: ("""\
        def f{k}(xs):
            total = 0
            for x in xs:
                total += {CALL}
            return total
        """, "x"),
}


def _reasons(transform, calls, header):
    template, arg = TEMPLATES[transform]
    code, where = _module([(n, c.replace("ARG", arg)) for n, c in calls], template, header)
    _, sites = rewrite(code, transform)
    by_line = {s.line: s for s in sites if s.transform == transform}
    out = {}
    for (name, _), line in zip(calls, where):
        site = by_line.get(line)
        assert site is not None, f"{transform}: no site for {name} (line {line})"
        out[name] = site
    return out


@pytest.mark.parametrize("transform", sorted(TEMPLATES))
def test_every_pure_call_is_accepted_by_each_transform(transform):
    """Table-driven: no call of the table is reported as having side effects; each site is
    rewritten or skipped for what the transform cannot do with the call."""
    sites = _reasons(transform, CALLS, HEADER)
    effects = sorted(n for n, s in sites.items() if "side effect" in (s.reason or ""))
    assert effects == []
    if transform == REC:  # reached the purity question: says so (casts are the vectorizer's own)
        for name, site in sites.items():
            assert site.action == REWRITTEN or "pure" in site.reason or name in ("astype", "float", "double"), \
                (name, site.reason)


@pytest.mark.parametrize("transform", sorted(TEMPLATES))
def test_lookalikes_stay_side_effects(transform):
    sites = _reasons(transform, LOOKALIKES, LOOKALIKE_HEADER)
    for name, site in sites.items():
        assert site.action == SKIPPED, (name, site.reason)
        assert "pure" not in site.reason, (name, site.reason)
        assert "side effect" in site.reason or (name.endswith("=") and f"{name} is not vectorized" in site.reason), \
            (name, site.reason)


def test_pure_call_rules():
    imports = ImportMap(LOOKALIKE_HEADER)
    call = lambda text: cst.parse_expression(text)  # noqa: E731
    assert all(pure_call(call(c.replace("ARG", "x")), ImportMap(HEADER)) for _, c in CALLS)
    assert not any(pure_call(call(c.replace("ARG", "x")), imports) for _, c in LOOKALIKES)
    assert not any(m.endswith("_") for m in PURE_METHODS)
    # nn.Module casts in place: pure only where a guard checked the receiver is a tensor
    for m in MODULE_INPLACE_METHODS:
        assert pure_call(call(f"x.{m}()"), imports) and not pure_call(call(f"net.{m}()"), imports, guarded=False)


def test_pure_range_bound_is_rewritten_and_agrees():
    """A pure call lets the analysis go on: a range bound ``a.size(0)`` (evaluated by the guard,
    again by the loop where it declines) no longer stops the elementwise and reduction rewrites."""
    src = """\
        import torch
        def f(a, out):
            for i in range(a.size(0)):
                out[i] = a[i] * 2 + 1
            return out
        def g(xs, w):
            total = 0
            for i in range(xs.size(0)):
                total += xs[i] * w
            return total
        """
    out, sites = rewrite(src)
    assert [(s.transform, s.action) for s in sites] == [(ELEM, REWRITTEN), (RED, REWRITTEN)]
    gen = torch.Generator().manual_seed(0)
    for n in (0, 1, 7, 64):
        a = torch.randn(n, 3, generator=gen, dtype=torch.float64)
        want = run(textwrap.dedent(src), "f", a, torch.zeros(n, 3, dtype=torch.float64))
        got = run(out, "f", a, torch.zeros(n, 3, dtype=torch.float64))
        assert torch.equal(want, got)
        w = torch.randn(3, generator=gen, dtype=torch.float64)
        torch.testing.assert_close(run(out, "g", a, w), run(textwrap.dedent(src), "g", a, w))


def test_impure_range_bound_stays():
    src = """\
        import torch
        def f(a, out, queue):
            for i in range(queue.pop()):
                out[i] = a[i] * 2
            return out
        """
    out, sites = rewrite(src, ELEM)
    assert out == textwrap.dedent(src)
    assert [(s.action, s.reason) for s in sites] == [(SKIPPED, "range bounds are not plain values")]


def test_pure_invariant_call_is_not_hoisted():
    """``values.mean()`` is pure but the guard would call it before it knows the loop is not
    empty (where ``.item()`` of a long tensor raises and the loop would not): left alone, saying so."""
    src = """\
        import torch
        def f(rs, values):
            total = 0
            for r in rs:
                total += r - values.mean()
            return total
        """
    out, sites = rewrite(src, RED)
    assert out == textwrap.dedent(src)
    assert "pure function on loop-invariant values: not hoisted" in sites[0].reason


# --------------------------------------------------------------------------- star imports

UPDATE = """\
    {star}
    import torch


    def update(net, target, tau):
        for p, tp in zip(net.parameters(), target.parameters()):
            tp.data.copy_(tau * p.data + (1 - tau) * tp.data)
    """


@pytest.mark.parametrize("star", ["from math import *", "from numpy import *", "from itertools import *",
                                  "from operator import *"])
def test_star_import_of_a_known_module_does_not_block(star):
    src = UPDATE.format(star=star)
    out, sites = rewrite(src, TU)
    assert [s.action for s in sites] == [REWRITTEN], [s.reason for s in sites]
    # differential: the same start, original vs rewrite
    torch.manual_seed(1)
    src_net, t1 = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    t2 = torch.nn.Linear(3, 2)
    t2.load_state_dict(t1.state_dict())
    run(textwrap.dedent(src), "update", src_net, t1, 0.25)
    run(out, "update", src_net, t2, 0.25)
    for a, b in zip(t1.parameters(), t2.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("star,text", [
    ("from mylib import *", "a star import (`from mylib import *`, a module whose names are not known without "
                            "importing it) may rebind `zip`"),
    ("from .helpers import *", "a star import (`from .helpers import *`, a relative module) may rebind `zip`"),
])
def test_star_import_of_a_user_module_says_so(star, text):
    out, sites = rewrite(UPDATE.format(star=star), TU)
    assert [(s.action, s.reason) for s in sites] == [(SKIPPED, text)]


def test_star_import_that_rebinds_a_builtin_says_which():
    """``from torch import *`` binds ``torch.range``: a range loop is no builtin range loop."""
    src = """\
        from torch import *
        def f(a, out, n):
            for i in range(n):
                out[i] = a[i] * 2
            return out
        """
    out, sites = rewrite(src, ELEM)
    assert out == textwrap.dedent(src)
    assert [s.reason for s in sites] == ["a star import (`from torch import *`) rebinds `range`"]


def test_star_import_never_imports_user_modules(tmp_path, monkeypatch):
    (tmp_path / "boom_star_mod.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out, sites = rewrite(UPDATE.format(star="from boom_star_mod import *"))
    assert "boom_star_mod" not in sys.modules
    assert any("from boom_star_mod import *" in s.reason for s in sites)


def test_star_builtins_table_matches_installed_numpy_and_torch():
    names = set(dir(builtins))
    assert set(np.__all__) & names == scopes.STAR_BUILTINS["numpy"]
    assert set(torch.__all__) & names == scopes.STAR_BUILTINS["torch"]


def test_star_names_resolve_stdlib_only():
    assert "exp" in scopes.star_names("math") and scopes.star_names("mylib") is None
    assert scopes.star_binds("math", "pow") is True and scopes.star_binds("math", "zip") is False
    assert scopes.star_binds("torch", "range") is True and scopes.star_binds("torch", "zip") is False
    assert scopes.star_binds("torch", "exp") is None  # not a builtin: torch's other exports are unknown
    q = lambda src, text: ImportMap(src).qualify(cst.parse_expression(text))  # noqa: E731
    assert q("from math import *\n", "exp") == "math.exp"
    assert q("from math import *\nfrom mylib import *\n", "exp") is None  # mylib may export exp too
    assert q("from math import *\nexp = 1\n", "exp") is None


_STAR_LINES = st.sampled_from([
    "from math import *\n", "from mylib import *\n", "from .rel import *\n", "from torch import *\n",
    "exp = 1\n", "from numpy import exp\n", "import math\n", "def f():\n    return exp(2)\n",
    "class C:\n    from cmath import *\n",
])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_STAR_LINES, min_size=1, max_size=6), st.data())
def test_star_scans_through_the_statement_memo_equal_whole_tree_scans(lines, data):
    memo = statement_memo.StatementMemo()
    with statement_memo.active(memo):
        for _ in range(2):  # a version, then an edited one reusing the unchanged statements
            code = "".join(lines)
            tree = ast.parse(code)
            memo.register(tree, code)
            shared, plain = ImportMap(tree), ImportMap(ast.parse(code))
            assert (shared.aliases, shared.names, shared.imported) == (plain.aliases, plain.names, plain.imported)
            assert scopes.star_imports(tree) == scopes.star_imports(ast.parse(code))
            checker, fresh = scopes.builtin_checker(tree), scopes.builtin_checker(ast.parse(code))
            assert [checker.reason(b) for b in ("zip", "range", "pow")] == [fresh.reason(b) for b in ("zip", "range", "pow")]
            lines = lines + [data.draw(_STAR_LINES)]


def test_star_import_math_exp_is_pure_in_a_reason():
    src = """\
        from math import *
        def f(xs):
            total = 0
            for x in xs:
                total += exp(x)
            return total
        """
    _, sites = rewrite(src, RED)
    assert sites[0].reason == "calls `exp (math.exp)`, which is pure but not known to act element by element"


def test_recurrence_with_a_known_star_import_is_rewritten_and_agrees():
    src = """\
        from math import *
        import numpy as np
        def returns(r, gamma):
            out = np.zeros_like(r)
            g = 0.0
            for t in reversed(range(len(r))):
                g = r[t] + gamma * g
                out[t] = g
            return out
        """
    out, sites = rewrite(src, REC)
    assert [s.action for s in sites] == [REWRITTEN]
    r = np.random.default_rng(0).standard_normal(300)
    assert np.array_equal(run(out, "returns", r, 0.99), run(textwrap.dedent(src), "returns", r, 0.99))
    out, sites = rewrite(src.replace("from math import *", "from mylib import *"), REC)
    assert [(s.action, s.reason) for s in sites] == [
        (SKIPPED, "a star import (`from mylib import *`, a module whose names are not known without importing it) "
                  "may rebind `range`")]


# --------------------------------------------------------------------------- backward loops

#: backward loops the planner is never given: each gets a site, with the start of its reason
BACKWARD = [
    ("for k, r in enumerate(np.flip(x)):\n    g = r + 0.5 * g\n    out[k] = g", "backward loop over `enumerate(np.flip(x))`: header not recognised"),
    # a header another form may come to know: a site with some reason, rewritten or not
    ("for t, r in enumerate(x[::-1]):\n    g = g + 0.5 * r\n    out[t] = g", None),
    ("for i in range(len(x) - 1, 0, -1):\n    out[i - 1] = x[i - 1] + 0.5 * out[i]", "backward loop over `range(len(x) - 1, 0, -1)`"),
    ("for t in reversed(range(1, n)):\n    g = x[t] + 0.5 * g\n    out[t] = g", "backward loop over `reversed(range(1, n))`"),
    ("for t in range(n)[::-1]:\n    g = x[t] + 0.5 * g", None),  # recognised (range(T)[::-1])
    ("for t in range(1, n)[::-1]:\n    g = x[t] + 0.5 * g", "backward loop over `range(1, n)[::-1]`"),
    ("for i, r in reversed(list(enumerate(sorted(x)))):\n    g = r + 0.5 * g", "backward loop over `reversed(list(enumerate(sorted(x))))`"),
    ("for t in np.arange(n - 1, -1, -1):\n    g = x[t] + 0.5 * g", "backward loop over `np.arange(n - 1, -1, -1)`"),
    ("for t in range(n, -1, -1):\n    g = x[t] + 0.5 * g", "backward loop over `range(n, -1, -1)`"),
    ("for t in range(n - 1, -1, -2):\n    g = g * 0.5 + x[t]", "backward loop over `range(n - 1, -1, -2)`"),
    ("for k in reversed(sorted(x)):\n    g = g * 2 + k", "backward loop over `reversed(sorted(x))`"),
    ("for r in x.flip(0):\n    g = r + 0.5 * g\n    out.append(g)", "backward loop over `x.flip(0)`"),
    ("for t, r in zip(range(n - 1, -1, -1), reversed(x)):\n    g = r + 0.5 * g", "backward loop over `zip(range(n - 1, -1, -1), reversed(x))`"),
    ("steps = list(range(n - 1, 0, -1))\nfor t in steps:\n    g = x[t] + 0.5 * g", "backward loop over `steps`"),
    ("for i in reversed(range(n)):\n    out[i] = x[i] * 2.0", "backward loop with no value carried between steps: nothing to vectorize"),
    ("for r in reversed(x):\n    out.insert(0, r * 2)", "backward loop with no carried value the recurrence vectorizer recognises"),
    ("for t in reversed(range(n)):\n    self.g = self.g * 0.5 + x[t]", "backward loop with no carried value the recurrence vectorizer recognises"),
    ("for t in reversed(range(n)):\n    out[t] += 0.5 * out[t + 1]", "backward loop with no carried value the recurrence vectorizer recognises"),
    ("t = n - 1\nwhile t >= 0:\n    g = x[t] + 0.5 * g\n    out[t] = g\n    t -= 1", "backward while loop (`while t >= 0:` counting `t` down)"),
    ("t = n\nwhile t:\n    t = t - 1\n    g = x[t] + 0.5 * g", "backward while loop (`while t:` counting `t` down)"),
]

#: forward loops and other look-alikes: no recurrence site
FORWARD = [
    "for i in range(0, n, 2):\n    g = g + x[i]",
    "for r in x[::2]:\n    g = g * 0.5 + r",
    "for a, b in zip(x, y):\n    g = g * a + b",
    "steps = sorted(range(n - 1, -1, -1))\nfor t in steps:\n    g = g * 0.5 + x[t]",
    "t = 0\nwhile t < n:\n    g = g + x[t]\n    t += 1",
    "while True:\n    g = step(g)\n    if g:\n        break",
    "t = n\nwhile t >= 0:\n    g = g + x[t]\n    t += 1",
]


def _in_function(snippet: str) -> str:
    body = textwrap.indent(snippet, "    ")
    return f"import numpy as np\n\n\ndef f(self, x, y, out, n, g):\n{body}\n    return g\n"


@pytest.mark.parametrize("snippet,reason", BACKWARD, ids=[(r or s)[:40] for s, r in BACKWARD])
def test_every_backward_loop_gets_a_site(snippet, reason):
    src = _in_function(snippet)
    out, sites = rewrite(src, REC)
    loops = [n for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.For, ast.While))]
    assert [s.line for s in sites] == [loops[0].lineno], sites
    if reason is not None:
        assert out == src and sites[0].action == SKIPPED
        assert sites[0].reason.startswith(reason), sites[0].reason


@pytest.mark.parametrize("snippet", FORWARD)
def test_forward_loops_get_no_recurrence_site(snippet):
    out, sites = rewrite(_in_function(snippet), REC)
    assert sites == []


def _independent_backward(node: ast.AST) -> bool:
    """A detector written apart from the engine's: reversed/flip anywhere in the header, or a
    negative literal step, or a while loop whose test is `name >= / > ...` and that decrements it."""
    if isinstance(node, ast.For):
        text = ast.unparse(node.iter)
        return "reversed(" in text or "flip" in text or "::-" in text or ", -1)" in text or ", -2)" in text
    if isinstance(node, ast.While):
        return any(isinstance(s, ast.AugAssign) and isinstance(s.op, ast.Sub) for s in node.body) and \
            isinstance(node.test, (ast.Compare, ast.Name))
    return False


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(HERE, "corpus", "*.py"))),
                         ids=lambda p: os.path.basename(p)[:-3])
def test_corpus_backward_loops_all_have_a_recurrence_site(path):
    """Public RL code: every backward loop before the harness has a vectorize.recurrence site."""
    with open(path) as f:
        text = f.read()
    harness = next(i + 1 for i, l in enumerate(text.splitlines()) if l.startswith("EXPECT = {"))
    loops = [n.lineno for n in ast.walk(ast.parse(text)) if _independent_backward(n) and n.lineno < harness]
    _, sites = rewrite(text, REC)
    lines = {s.line for s in sites}
    assert [line for line in loops if line not in lines] == []


def test_walks_backward_forms():
    yes = ["reversed(x)", "range(n, -1, -1)", "x[::-1]", "x[5:0:-2]", "np.flip(x)", "x.flip(0)",
           "torch.arange(n - 1, -1, -1)", "zip(a, reversed(b))", "enumerate(x[::-1])", "list(reversed(x))",
           "range(n - 1, -1, step=-1)"]
    no = ["range(n)", "range(0, n, 2)", "x[::2]", "zip(a, b)", "enumerate(x)", "sorted(x)", "range(n, 0, k)",
          "deck.flip()"]
    assert [t for t in yes if not backward.walks_backward(ast.parse(t, mode="eval").body)] == []
    assert [t for t in no if backward.walks_backward(ast.parse(t, mode="eval").body)] == []


def test_scatter_range_bound_through_the_table():
    """The per-row index_add_ rewrite takes its range bounds from the same table (``agg.size(0)``);
    a module's ``size`` is no method of a tensor."""
    src = """\
        import torch
        def aggregate(msg, dst, agg):
            for g in range(agg.size(0)):
                agg[g].index_add_(0, dst[g], msg[g])
            return agg
        """
    out, sites = rewrite(src, ELEM)
    assert [s.action for s in sites] == [REWRITTEN]
    gen = torch.Generator().manual_seed(3)
    for rows in (1, 5, 40):
        msg = torch.randn(rows, 6, 3, generator=gen, dtype=torch.float64)
        dst = torch.randint(0, 4, (rows, 6), generator=gen)
        want = run(textwrap.dedent(src), "aggregate", msg, dst, torch.zeros(rows, 4, 3, dtype=torch.float64))
        got = run(out, "aggregate", msg, dst, torch.zeros(rows, 4, 3, dtype=torch.float64))
        assert torch.equal(want, got)
    look = src.replace("import torch\n", "import torch\n        import shapes\n").replace("agg.size(0)", "shapes.size(0)")
    out, sites = rewrite(look, ELEM)
    assert out == textwrap.dedent(look) and [s.action for s in sites] == [SKIPPED]
    assert "range bounds are not plain values" in sites[0].reason


# ------------------------------------------------------------------ reasons in the user's spelling
@pytest.mark.parametrize("index, spelled", [
    ("idx, ...", "ratio[idx, ...]"),  # time first, then an ellipsis (DI-engine's retrace)
    (":, idx", "ratio[:, idx]"),  # time along dimension 1
    ("..., idx, :", "ratio[..., idx, :]"),
])
def test_skip_reasons_of_time_indexed_loops_quote_the_users_subscripts(index, spelled):
    """A loop indexing time in the middle is analysed through time-major views whose names are the
    engine's own: a skip reason quotes the loop's own subscript, never a view's name."""
    src = f"""
    def f(q, r, w, ratio, g, T):
        tmp = q[{index.replace('idx', '-1')}]
        for idx in reversed(range(T)):
            q[{index}] = r[{index}] + g * w[{index}] * tmp
            tmp = ratio[{index}].clamp(max=1.0) * q[{index}]
        return q
    """
    _, sites = rewrite(src, REC)
    (s,) = [s for s in sites if s.transform == REC]
    assert s.action == SKIPPED
    assert f"`{spelled}.clamp()`" in s.reason, s.reason
    assert "ratio_t" not in s.reason


@pytest.mark.parametrize("call, named", [
    ("int(not (done and t == T - 1))", "calls the builtin `int()` in the loop body"),
    ("float(masks[t])", "calls the builtin `float()` in the loop body"),
])
def test_builtins_on_numbers_are_named_as_builtins(call, named):
    src = f"""
    def f(rewards, values, done, discount, lam, masks):
        T = len(rewards)
        adv = []
        g = 0
        for t in reversed(range(T)):
            nonterminal = {call}
            g = rewards[t] + discount * lam * nonterminal * g
            adv.append(g)
        return adv
    """
    _, sites = rewrite(src, REC)
    (s,) = [s for s in sites if s.transform == REC]
    assert s.action == SKIPPED and named in s.reason and "unknown side effects" not in s.reason, s.reason
    # rebound by the module: then it is a call of unknown effect
    _, sites = rewrite("def int(x):\n    return x\n" + textwrap.dedent(src).replace("float(", "int("), REC)
    (s,) = [s for s in sites if s.transform == REC]
    assert "calls `int()` in the loop body (unknown side effects)" in s.reason, s.reason
