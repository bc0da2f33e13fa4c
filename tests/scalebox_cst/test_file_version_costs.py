"""Whole-file work is done once per file (or per module version), never per plain statement:
the ``ast`` parses (libcst parses only the statements a transform edits), and the builtin-rebinding scans, which walk only the
top-level statements that spell the names asked about (issue 19 item 13). Counted, not timed;
speed is in benchmarks/bench_scaling.py (shapes ``one`` and ``sparse``)."""
from conftest import TESTS  # tests/: the corpus, fake_torch_npu and the repository root beside it
import ast
import harness
import os

import libcst as cst

from scalebox_cst.transforms.analysis import scopes
from scalebox_cst.transforms.vectorize.recurrence import loops


def _bench():
    return harness.load_path(os.path.join(os.path.dirname(TESTS), "benchmarks", "bench_scaling.py"), "bench_scaling")


BENCH = _bench()


def _count_whole_file_parses(monkeypatch, source: str):
    """(libcst parses, ast parses) of text at least half the file's size: not snippets."""
    counts = {"cst": 0, "ast": 0}
    real_cst, real_ast = cst.parse_module, ast.parse

    def cst_parse(code, *a, **k):
        counts["cst"] += len(code) * 2 >= len(source)
        return real_cst(code, *a, **k)

    def ast_parse(code, *a, **k):
        counts["ast"] += isinstance(code, str) and len(code) * 2 >= len(source)
        return real_ast(code, *a, **k)

    monkeypatch.setattr(cst, "parse_module", cst_parse)
    monkeypatch.setattr(ast, "parse", ast_parse)
    result = harness.rewrite_result(source, path="gen.py")
    monkeypatch.undo()
    return counts, result


def test_the_whole_file_is_never_parsed_by_libcst_and_by_ast_once_per_version(monkeypatch):
    for shape in ("one", "sparse"):
        seen = []
        for lines in (600, 2400):
            counts, result = _count_whole_file_parses(monkeypatch, BENCH.make_source(lines, shape))
            assert result.changed, shape
            # only the statements a transform edits are parsed (transforms/partial.py)
            assert counts["cst"] == 0, (shape, lines, counts)
            editing = {s.transform for s in result.report.sites if s.action == "rewritten"}
            # one ast parse of the input, at most one per version a transform made (no
            # re-validation); a spliced version reuses the last one's statements (astsplice)
            assert 1 <= counts["ast"] <= 1 + len(editing) + 1, (shape, lines, counts, editing)
            seen.append(counts["ast"])
        if shape == "one":
            assert seen[0] == seen[1], seen  # the same versions, whatever the file's length


def test_builtin_rebinding_scans_walk_only_statements_that_spell_the_name(monkeypatch):
    """A file of plain functions and one GAE loop: the scans that tell a rebound ``reversed``
    or ``range`` from the builtin visit the same statements at 600 as at 2400 lines (they once
    walked the whole module), and never the module as a whole."""
    calls = []
    real_rebound, real_bound = scopes._ast_rebound_walk, loops._ast_bound

    def rebound(node):
        calls.append(node)
        return real_rebound(node)

    def bound(node):
        calls.append(node)
        return real_bound(node)

    monkeypatch.setattr(scopes, "_ast_rebound_walk", rebound)
    monkeypatch.setattr(loops, "_ast_bound", bound)
    per_size = []
    for lines in (600, 2400):
        del calls[:]
        result = harness.rewrite_result(BENCH.make_source(lines, "one"), path="gen.py")
        assert any(s.action == "rewritten" for s in result.report.sites)
        assert not any(isinstance(n, ast.Module) for n in calls)
        per_size.append(len(calls))
    assert per_size[0] == per_size[1], per_size


GAE = '''import torch


def gae(rewards, values, gamma, T):
    adv = torch.zeros_like(rewards)
    last = 0
    for t in reversed(range(T)):
        delta = rewards[t] + gamma * values[t + 1] - values[t]
        adv[t] = last = delta + gamma * last
    return adv
'''


def test_a_builtin_rebound_under_a_non_ascii_spelling_is_still_seen():
    """``ｒeversed`` (a fullwidth r) is the name ``reversed`` to Python (NFKC): the statements the
    scans skip by their text must not hide it."""
    plain = harness.rewrite_result(GAE, path="gae.py")
    assert [s.action for s in plain.report.sites if s.transform == "vectorize.recurrence"] == ["rewritten"]
    for spelled in ("reversed", "\uff52eversed"):
        source = GAE + f"\n\ndef {spelled}(xs):\n    return list(xs)[::-1]\n"
        result = harness.rewrite_result(source, path="gae.py")
        sites = [s for s in result.report.sites if s.transform == "vectorize.recurrence"]
        assert sites and all(s.action == "skipped" for s in sites), (spelled, sites)
        assert not result.changed or "linear_recurrence" not in result.output.decode(), spelled


_LINES = [
    "import torch\n", "from m import *\n", "from torch import *\n", "from .rel import *\n", "range = 3\n",
    "def f(len):\n    return len\n", "for zip in y:\n    pass\n", "class C:\n    sorted = 1\n",
    "import reversed.sub\n", "from a import b as list\n", "\uff52eversed = None\n", "x = [int for int in y]\n",
    "try:\n    pass\nexcept E as tuple:\n    pass\n", "with a as (enumerate, b):\n    pass\n",
    "lambda range: range\n", "print(reversed, range, len)\n", "s = 'range = 1'  # zip\n", "del sorted\n",
]


def test_scans_of_the_statements_that_spell_a_name_answer_as_whole_module_scans():
    """On a registered version (only the statements that spell the name are scanned) the
    checker's reasons and the bound builtins are what a walk of the whole tree finds."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    from scalebox_cst.transforms import statement_memo
    from scalebox_cst.transforms.vectorize.recurrence import quadratic
    from scalebox_cst.transforms.vectorize.recurrence.syntax import _BUILTINS

    names = (*_BUILTINS, *quadratic.BUILTINS, "float", "sum")

    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.sampled_from(_LINES), min_size=1, max_size=8))
    def check(lines):
        code = "".join(lines)
        with statement_memo.active(statement_memo.StatementMemo()) as memo:
            tree = ast.parse(code)
            memo.register(tree, code)
            shared, plain = scopes.builtin_checker(tree), scopes.builtin_checker(ast.parse(code))
            assert [shared.reason(n) for n in names] == [plain.reason(n) for n in names], code
            assert loops._ast_bound_of(tree, names) == loops._ast_bound(ast.parse(code)) & set(names), code

    check()


def _walk_work(monkeypatch, blocks: int):
    """(libcst node visits + ast child listings, sites rewritten) of rewriting one function of
    ``blocks`` blocks: the walks the analyses make, counted."""
    count = [0]
    real_visit, real_children = cst.CSTNode.visit, ast.iter_child_nodes

    def visit(self, visitor):
        count[0] += 1
        return real_visit(self, visitor)

    def children(node):
        count[0] += 1
        return real_children(node)

    # bench_scaling's ``block`` shape: one function of blocks of eight transforms' sites
    source = BENCH.BLOCK_HEAD + "".join(BENCH.BLOCK.format(i=i) for i in range(blocks)) + "    return out\n"
    with monkeypatch.context() as m:
        m.setattr(cst.CSTNode, "visit", visit)
        m.setattr(ast, "iter_child_nodes", children)
        _, sites = harness.rewrite(source, None, "cpu", dedent=False)
    return count[0], sum(s.action == "rewritten" for s in sites)


def test_one_long_function_of_many_sites_costs_walks_linear_in_its_sites(monkeypatch):
    """Found beside issue 19's fault campaign: a function of n such blocks took 4x as long for 2n
    (100 blocks, 1,600 lines: 57 CPU s): each loop walked the whole function for the names read
    after it (read_elsewhere) and for global declarations, each forward's bindings scanned the
    rest of their block (hot flow), each forward statement the function's stores (no_grad)."""
    small, small_sites = _walk_work(monkeypatch, 8)
    large, large_sites = _walk_work(monkeypatch, 24)
    per_block = (large_sites - small_sites) // 16  # every block's sites, and the function's own
    assert per_block >= 7 and large_sites - 24 * per_block == small_sites - 8 * per_block
    assert large / small < 3.6, (small, large)  # linear: 3x the blocks, ~3x the walks (quadratic: ~9x)
