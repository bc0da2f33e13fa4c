"""analysis.reads.names_read reads node fields instead of a libcst visit (the recurrence family's
fast walk, now shared): on every node of the corpus and of every transform's examples it finds
exactly what the visitor finds; bound_names finds what each binding form binds."""
from __future__ import annotations

from conftest import TESTS  # tests/: the corpus, fake_torch_npu and the repository root beside it
import os

import libcst as cst
import pytest

from scalebox_cst.transforms.examples import all_examples
from scalebox_cst.transforms.analysis.cstwalk import walk
from scalebox_cst.transforms.analysis.reads import bound_names, names_read

CORPUS = os.path.join(TESTS, "corpus")


def _visited_names(node: cst.CSTNode):
    """The reference: every Name a libcst visit meets, but attribute and keyword names."""
    skip, out = set(), set()

    class V(cst.CSTVisitor):
        def visit_Attribute(self, n: cst.Attribute) -> None:
            skip.add(id(n.attr))

        def visit_Arg(self, n: cst.Arg) -> None:
            if n.keyword is not None:
                skip.add(id(n.keyword))

        def visit_Name(self, n: cst.Name) -> None:
            if id(n) not in skip:
                out.add(n.value)

    node.visit(V())
    return out


def _sources():
    for name in sorted(os.listdir(CORPUS)):
        if name.endswith(".py"):
            with open(os.path.join(CORPUS, name), encoding="utf-8") as fh:
                yield name, fh.read()
    for case in all_examples():
        yield case.id, case.example.code


@pytest.mark.parametrize("name,code", list(_sources()), ids=lambda v: v if isinstance(v, str) and "\n" not in v else "")
def test_names_read_equals_a_visit_on_every_node(name, code):
    module = cst.parse_module(code)
    nodes = [n for n in walk(module) if isinstance(n, (cst.BaseExpression, cst.BaseSmallStatement, cst.BaseStatement))]
    assert nodes
    for node in nodes:
        assert names_read(node) == _visited_names(node), (name, cst.Module(body=[]).code_for_node(node))


@pytest.mark.parametrize("code,bound", [
    ("a = b.c + d(e=f)\n", {"a"}),
    ("x, (y, *z) = w\n", {"x", "y", "z"}),
    ("q += 1\nr: int = 2\n", {"q", "r"}),
    ("for i, j in k:\n    pass\n", {"i", "j"}),
    ("with open(p) as fh:\n    pass\n", {"fh"}),
    ("import os.path, numpy as np\nfrom m import n as o\n", {"os", "np", "o"}),
    ("def f(arg):\n    pass\nclass C:\n    pass\n", {"f", "C"}),
    ("ys = [v for v in vs if (u := v)]\n", {"ys", "v", "u"}),
    ("print(a.b, c[d], e=f)\n", set()),
])
def test_bound_names(code, bound):
    assert bound_names(cst.parse_module(code)) == bound
