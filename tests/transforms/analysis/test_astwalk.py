"""astwalk: the same nodes in the same order as ``ast.iter_child_nodes`` / ``ast.walk`` (the
module scans that use it key results on that order: ImportMap applies aliases in walk order)."""
from conftest import TESTS  # tests/: the corpus beside it
import ast
import glob
import os

import pytest

from scalebox_cst.transforms.analysis import astwalk

SOURCES = sorted(glob.glob(os.path.join(TESTS, "corpus", "*.py")))


@pytest.mark.parametrize("path", SOURCES[:8])
def test_walk_and_children_match_the_ast_module(path):
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    assert [id(n) for n in astwalk.walk(tree)] == [id(n) for n in ast.walk(tree)]
    for node in ast.walk(tree):
        out = []
        astwalk.push_children(node, out)
        assert [id(c) for c in out] == [id(c) for c in ast.iter_child_nodes(node)]
    for node in ast.walk(tree):
        assert [id(c) for c in astwalk.children(node)] == [id(c) for c in ast.iter_child_nodes(node)]


def test_fields_not_set_and_lists_of_plain_values_are_skipped():
    node = ast.Global(names=["a", "b"])  # a list of str, no lineno
    assert astwalk.children(node) == [] == list(ast.iter_child_nodes(node))
    partial = ast.BinOp(left=ast.Name("x", ast.Load()))  # op and right never set
    assert astwalk.children(partial) == list(ast.iter_child_nodes(partial))
    assert len(astwalk.children(partial)) == 1


def test_own_nodes_stop_at_nested_scopes():
    fn = ast.parse(
        "def f(x):\n"
        "    y = x + 1\n"
        "    def g(z):\n        return z * 2\n"
        "    h = lambda w: w - 3\n"
        "    class C:\n        k = 4\n"
        "    return y\n").body[0]
    own = [n for n in astwalk.own_nodes(fn) if not isinstance(n, ast.expr_context)]  # shared singletons
    inner = {id(n) for s in fn.body if isinstance(s, (ast.FunctionDef, ast.ClassDef)) for n in ast.walk(s) if n is not s}
    inner |= {id(n) for n in ast.walk(fn.body[2].value) if n is not fn.body[2].value}
    assert {id(n) for n in own} == {id(n) for n in ast.walk(fn) if n is not fn and not isinstance(n, ast.expr_context)} - inner
    assert sum(isinstance(n, ast.Return) for n in own) == 1  # g's return is not f's
