"""Statements positioned alone (transforms/analysis/positions.py) have the whole module's
positions, at any depth: each statement of the corpus and of odd layouts is checked node by node
against PositionProvider on the whole module, or refused (None), never placed wrong."""
from conftest import TESTS  # tests/: the corpus beside it

import ast
import glob
import os

import libcst as cst
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from libcst.metadata import MetadataWrapper, PositionProvider

import harness
from scalebox_cst.textlines import physical_lines
from scalebox_cst.transforms.analysis import positions
from scalebox_cst.transforms.analysis.statements import ast_statements, holding

CORPUS = sorted(glob.glob(os.path.join(TESTS, "corpus", "*.py")))


def _agree(code):
    """Every statement's line (and all of them at once) positioned alone: the whole module's
    positions for each node placed. Returns (placed, refused)."""
    whole = cst.parse_module(code)
    tree = ast.parse(code)
    whole_pos = MetadataWrapper(whole, unsafe_skip_copy=True).resolve(PositionProvider)
    lines = physical_lines(code)
    stmts, _ = ast_statements(tree.body)
    placed = refused = 0
    for wanted in [[a.lineno] for a in stmts] + [[a.lineno for a in stmts]]:
        units = positions.innermost(holding(whole, whole.body, tree.body, wanted))
        assert units is not None, wanted  # every statement's own line lies in a statement
        found = positions.alone(whole, units, lines)
        if found is None:
            refused += 1
            continue
        placed += 1
        for node, where in found.items():
            assert where == whole_pos[node], (wanted, node)
        for unit, _ in units:  # every node of a unit is placed, but comments above it
            assert unit in found
    return placed, refused


@pytest.mark.parametrize("path", CORPUS, ids=os.path.basename)
def test_statements_alone_have_the_whole_modules_positions_on_the_corpus(path):
    with open(path, encoding="utf-8") as fh:
        placed, _ = _agree(fh.read())
    assert placed > 0


_PIECES = [
    "import torch\n",
    "def f(x):\n    y = g(x,\n          2)  # a continuation\n    return y\n",
    "class C:\n    @staticmethod\n    @dec(1)\n    def m(a):\n        if a:\n            b = 1; c = h(a)\n        elif k(a):\n            pass\n        else:\n            with w(a) as q: r = q\n        return b\n",
    "def s():\n    t = '''one\ntwo'''\n    return t\n",
    "def c():\n    x = 1\n# at column 0, inside\n    return x\n",
    "for i in range(3):\n    try:\n        j = i\n    except (ValueError,\n            TypeError):\n        j = 0\n    finally:\n        print(j)\n",
    "if True: z = f(1)\n",
    "def tabs():\n\tif x:\n\t\ty = f(\n\t\t\t1)\n",
    "while x:\n    x -= 1\nelse:\n    x = f(x)\n",
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=6))
def test_statements_alone_have_the_whole_modules_positions_in_odd_layouts(pieces):
    code = "".join(pieces)
    try:
        harness.compiled(code, "t.py")
    except SyntaxError:  # tabs and spaces mixed across pieces
        return
    _agree(code)


def test_a_node_outside_the_placed_statements_positions_the_whole_module():
    code = "def f():\n    a = 1\n    b = g(a)\n    return b\n"
    whole = cst.parse_module(code)
    tree = ast.parse(code)
    units = positions.innermost(holding(whole, whole.body, tree.body, [3]))
    assert [a.lineno for _, a in units] == [3]
    calls = []
    found = positions.Positions(positions.alone(whole, units, physical_lines(code)),
                                lambda: calls.append(1) or MetadataWrapper(whole, unsafe_skip_copy=True).resolve(PositionProvider))
    line3 = units[0][0]
    assert found[line3].start.line == 3 and calls == []
    first = whole.body[0].body.body[0]  # ``a = 1``: not placed alone
    assert found[first].start.line == 2 and calls == [1]
    assert found[whole.body[0].body.body[2]].start.line == 4 and calls == [1]  # asked once
