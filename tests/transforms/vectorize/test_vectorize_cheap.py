"""The vectorize.* transforms decide on the shared ``ast`` and touch libcst only for candidates.

Why these tests: the cheap path finds candidates on ``ast``, pairs them with libcst nodes by
statement order, takes lines from ``ast`` and rebuilds only the paths to its edits. The full
libcst transformer pass (with PositionProvider lines) is kept as the fallback, so each test here
runs both on the same code and requires the same bytes and the same sites; files without a
candidate must not be parsed by libcst at all.
"""
from conftest import TESTS  # tests/: the corpus, fake_torch_npu and the repository root beside it
import ast
import dataclasses
import os
import textwrap

import libcst as cst
import pytest

from scalebox_cst.config import Config
from scalebox_cst.report import REWRITTEN
from scalebox_cst.transforms import REGISTRY, FileContext
from scalebox_cst.transforms.analysis import reads, scopes, statements
import harness
from scalebox_cst.transforms.vectorize.elementwise import VectorizeElementwise, _joiner_lines
from scalebox_cst.transforms.vectorize.reduction import VectorizeReduction
from scalebox_cst.transforms.vectorize.target_update import VectorizeTargetUpdate

ROOT = os.path.dirname(TESTS)
TRANSFORMS = [VectorizeReduction, VectorizeElementwise, VectorizeTargetUpdate]
IDS = [t.id for t in TRANSFORMS]

HEADERS = [
    "import torch\n",
    "import torch as th\nfrom torch import stack as S, cat\n",
    '"""doc"""\nfrom __future__ import annotations\nimport torch\n',
    "import torch\nzip = zip\n",
    "import torch\nfrom torch import *\n",
]

BODIES = [
    # reduction: several loops per block, one statement consuming two lists, inner blocks first
    "a = []\nb = []\nfor x in xs:\n    a.append(x * 2)\nfor y in ys:\n    b.append(y - 1)\nr = torch.stack(a).sum() + torch.cat(b).mean()\n",
    "total = 0.0\nfor i in range(n):\n    total += (xs[i] - ys[i]) ** 2\nh = 0\nfor p in xs:\n    h = h - 0.1 * p * torch.log(p)\n",
    "vals = []\nfor x in xs: vals.append(x * 3 + 1)\nres = sum(vals)\n",
    "t = 0\nfor x in xs:\n    t = (t + x)\nfor x in xs:\n    t += model(x)\n",
    "t = 0\nfor x in xs:\n    t += x * 2\nprint(x)\n",
    "t = 0\nfor x in xs:\n    t += x * 2\n    # a comment at the end of the body\n\n# and after it\n",
    # elementwise loops and joined comprehensions
    "for i in range(len(xs)):\n    out[i] = xs[i] + 0.5 * ys[i]\nfor t in range(n):\n    out2[t] = torch.clamp(xs[t], 0.1, 0.9)\n",
    "for i in range(1, len(xs)):\n    out[i] = 0.5 * (xs[i] + xs[i - 1])\nfor [i] in range(n):\n    out[i] = xs[i] * 2\nfor i in range(n):\n    out[i,] = xs[i] * 2\n",
    "for i in range(n):\n    out[i] = torch.stack([x * 2 for x in xs])\n",
    "r = f(torch.stack([torch.tanh(x * w) for x in xs]), torch.cat([a - b for a, b in zip(xs, ys)]))\n",
    "r = torch.stack([x * 2 for x in xs]) if ok else torch.cat([y + 1 for y in ys])\n",
    "r = [torch.stack([x * 2 for x in xs]) for _ in range(3)]\nq = lambda k: torch.stack([x * k for x in xs])\n",
    "r = (torch.stack(\n    # the list\n    ([x.abs() for x in xs])\n))\ns = th.stack \\\n    ([x - 1 for x in xs])\n",
    "r = S([x * 2 for x in xs]) + cat([x * 2 for x in xs], 0)\nu = torch.stack([net(x) for net in nets], dim=1)\n",
    "if torch.stack([x * 2 for x in xs]).any(): y = torch.cat([x + 1 for x in xs]); z = 1\n",
    # target updates
    "for p, tp in zip(net.parameters(), tgt.parameters()):\n    tp.data.copy_(tau * p.data + (1 - tau) * tp.data)\n",
    "for p, tp in zip(net.parameters(), tgt.parameters()):\n    tp.data.mul_(1 - tau)\n    tp.data.add_(tau * p.data)\nfor p, tp in zip(net.state_dict().values(), tgt.state_dict().values()):\n    tp.copy_(p)\n",
]


def _indent(text, n):
    return textwrap.indent(text, " " * n)


CONTEXTS = [
    lambda b: b,
    lambda b: "def f(xs, ys, out, n):\n" + _indent(b, 4) + "    return xs\n",
    lambda b: "class C:\n    def m(self, xs, ys, out, n):\n" + _indent(b, 8),
    lambda b: "def f(xs, ys, out, n):\n    if n > 1:\n" + _indent(b, 8) + "    elif n:\n" + _indent(b, 8) + "    else:\n" + _indent(b, 8),
    lambda b: "def f(xs, ys, out, n):\n    try:\n" + _indent(b, 8) + "    except ValueError as e:\n" + _indent(b, 8) + "    finally:\n" + _indent(b, 8),
    lambda b: "def f(xs, ys, out, n):\n    with ctx() as c:\n" + _indent(b, 8) + "    while n:\n" + _indent(b, 8) + "        n -= 1\n",
    lambda b: "def f(xs, ys, out, n):\n    match n:\n        case 1:\n" + _indent(b, 12) + "        case _:\n" + _indent(b, 12),
    lambda b: "def f(xs, ys, out, n):\n    if _sb_batch is not None:\n" + _indent(b, 8) + "    else:\n" + _indent(b, 8),
    lambda b: "@deco(torch.stack([x * 2 for x in xs]))\ndef f(xs, ys, out, n, d=torch.cat([y + 1 for y in ys])):\n    def g():\n" + _indent(b, 8) + "    return g\n",
    lambda b: "async def f(xs, ys, out, n):\n" + _indent(b, 4) + "    async for i in range(n):\n        out[i] = xs[i] * 2\n",
    lambda b: "def f(xs, ys, out, n):\n    global total, t\n" + _indent(b, 4),
    lambda b: "for outer in range(3):\n" + _indent(b, 4),
]


def _programs():
    out = []
    for k, body in enumerate(BODIES):
        for j, context in enumerate(CONTEXTS):
            if (k + j) % 3:  # a third of the pairs, every body and every context several times
                continue
            extra = BODIES[(k * 7 + j) % len(BODIES)]
            src = HEADERS[(k + j) % len(HEADERS)] + context(body) + "\n" + CONTEXTS[(j + 1) % len(CONTEXTS)](extra)
            harness.compiled(src, "t.py")  # it parses
            out.append(src)
    return out


PROGRAMS = _programs()


def _run(ids, src):
    result = harness.rewrite_result(src, list(ids))
    assert result.report.error is None, result.report.error
    return result.output, [dataclasses.astuple(s) for s in result.report.sites]


@pytest.fixture
def full_pass(monkeypatch):
    """Make the statement pairing fail, so every transform takes its full libcst pass."""

    def use_full_pass():
        monkeypatch.setattr(statements.CstStatements, "matches", lambda self, stmts: False)

    return use_full_pass


@pytest.mark.parametrize("ids", [[i] for i in IDS] + [None], ids=IDS + ["all"])
def test_cheap_path_matches_full_pass(ids, full_pass):
    ids = ids or [t.id for t in REGISTRY]
    cheap = [_run(ids, src) for src in PROGRAMS]
    full_pass()
    full = [_run(ids, src) for src in PROGRAMS]
    for src, a, b in zip(PROGRAMS, cheap, full):
        assert a == b, src
    rewritten = sum(site[3] == REWRITTEN for _, sites in cheap for site in sites)
    reported = sum(len(sites) for _, sites in cheap)
    assert rewritten >= 10 and reported > rewritten  # rewrites and skips both exercised


def _context(src):
    return FileContext("t.py", None, Config(), "cpu", code=src, tree=ast.parse(src))


NO_CANDIDATE = [
    os.path.join(ROOT, "examples", "cartpole_ppo", "train.py"),
    "import torch\n"
    "def f(xs, ys, a, b):\n"
    "    h = torch.cat([a, b], dim=-1)\n"  # a joiner called with a list, not a comprehension
    "    for x, y in zip(xs, ys):\n"
    "        print(x, y)\n"  # zip loop, no parameters, no update
    "    for t in reversed(range(len(xs))):\n"
    "        xs[t] = xs[t] + 1\n"  # not a range() header
    "    for i in range(len(xs)):\n"
    "        if i:\n"
    "            xs[i] = 0\n"  # not flat
    "    return torch.stack(xs)\n",
]


@pytest.mark.parametrize("cls", TRANSFORMS, ids=IDS)
@pytest.mark.parametrize("which", range(len(NO_CANDIDATE)))
def test_no_candidate_never_parses_libcst(cls, which):
    src = NO_CANDIDATE[which]
    if os.path.exists(src):
        with open(src, encoding="utf-8") as fh:
            src = fh.read()
    ctx = _context(src)
    assert cls().rewrite(ctx) == (None, [])
    assert "module" not in ctx.__dict__


def test_candidates_parse_libcst_once_and_share_it():
    src = "import torch\ndef f(xs):\n    t = 0\n    for x in xs:\n        t += x * 2\n    return t\n"
    ctx = _context(src)
    new, sites = VectorizeReduction().rewrite(ctx)
    assert "module" in ctx.__dict__ and new is not None and new is not ctx.module
    assert [(s.line, s.end_line, s.action) for s in sites] == [(4, 5, REWRITTEN)]


@pytest.mark.parametrize(
    "src, lines",
    [
        ("import torch\nr = torch.stack([x for x in xs])\n", {2}),
        ("from torch import stack as join\nr = join(  # c\n    [x for x in xs])\n", {2}),
        ("import torch as th\nr = th.concatenate \\\n   (([x for x in xs]))\n", {2}),
        ("import torch\nr = torch.cat((a, b))\ntruncated = 1\n", set()),
        ("import torch\nr = torch.stack(xs)\n", set()),
    ],
)
def test_joiner_lines(src, lines):
    assert _joiner_lines(src) == lines


def test_aliased_joiner_with_comments_is_found():
    src = "from torch import stack as join\ndef f(xs):\n    return join(  # comment\n        [x * 2 for x in xs]\n    )\n"
    out, sites = _run([VectorizeElementwise.id], src)
    assert [(s[1], s[2], s[3]) for s in sites] == [(3, 5, REWRITTEN)]


REBINDING = [
    "x = 1\n",
    "from m import *\n",
    "import zip\nimport range.sub\nimport a.b as len\n",
    "from m import zip as sum\n",
    "def f(zip, *range, len=1, **sum): pass\n",
    "g = lambda zip: zip\n",
    "[0 for zip in y]\n{k: v for range, k in y}\n",
    "with a as (zip, *len):\n    pass\n",
    "try:\n    pass\nexcept E as zip:\n    pass\n",
    "class range: pass\ndef len(): pass\n",
    "async def sum(): pass\n",
    "(zip := 3)\n",
    "zip.x = 1\nrange[0] = 2\ndel len\nglobal sum\n",
    "for (zip, [range]) in y: pass\nsum += 1\nlen: int = 3\n",
]


@pytest.mark.parametrize("src", REBINDING)
def test_ast_rebound_agrees_with_libcst_rebinds(src):
    names, star = scopes.ast_rebound(ast.parse(src))
    module = cst.parse_module(src)
    for name in ("zip", "range", "len", "sum", "x"):
        assert (star or name in names) == scopes.rebinds(module, name), name


SCOPES = """
def f(xs):
    global g
    while cond:
        for a in xs:
            if a:
                pass
            else:
                for b in a:
                    t += b
        else:
            for c in xs:
                t += c
    try:
        for d in xs:
            t += d
    except E:
        def inner():
            nonlocal t
            for e in xs: t += e
    match xs:
        case [q]:
            for h in q:
                t += h
    class K:
        global k
"""


def test_statement_walks_agree_with_visits():
    module = cst.parse_module(SCOPES)
    fn = module.body[0]
    loops = []

    class _V(cst.CSTVisitor):
        def visit_For(self, node):
            loops.append(node)

        def visit_Global(self, node):
            found.update(n.name.value for n in node.names)

        def visit_Nonlocal(self, node):
            found.update(n.name.value for n in node.names)

    found = set()
    fn.visit(_V())
    assert len(loops) == 6
    for loop in loops:
        assert reads._enclosing_loops(fn.body, loop) == reads._enclosing_loops_visit(fn.body, loop)
    assert any(reads._enclosing_loops(fn.body, loop) for loop in loops)
    assert scopes.declares_global(fn, ["g", "t", "k", "zz"]) == found & {"g", "t", "k"} == {"g", "t", "k"}


def test_statement_pairing_covers_every_statement():
    tree = ast.parse(SCOPES)
    stmts, parents = statements.ast_statements(tree.body)
    walked = statements.CstStatements(cst.parse_module(SCOPES))
    assert walked.matches(stmts)
    assert len(stmts) == sum(isinstance(n, ast.stmt) for n in ast.walk(tree))
    for a, c in zip(stmts, walked.stmts):
        if isinstance(c, cst.For):
            assert walked.scope(c) is not walked.module
