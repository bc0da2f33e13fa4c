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


_TRICKY = '''
import torch
def f(xs, n):
    acc = 0
    for i in range(n):
        acc += xs[i]
    print(i)
    for i in range(n):
        ys = [i for i in xs]
    while n:
        for j in xs:
            t = j
        n = t - 1
    g = lambda i: i + acc
    def h(j, k=i):
        return j + k
    del t
    for k in xs:
        pass
    else:
        k = locals()
    total = sum(v for v in xs)
    for v in xs:
        total = total + v
    return eval("total")
'''


def _read_sources():
    yield "tricky", _TRICKY
    yield from _sources()
    root = os.path.dirname(TESTS)
    for dirpath, _, files in os.walk(os.path.join(root, "examples")):
        for f in sorted(files):
            if f.endswith(".py"):
                with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
                    yield f, fh.read()


def test_the_read_index_answers_what_the_visit_per_loop_did():
    """read_elsewhere walks a scope once (read_index) instead of once per loop: for every ``for``
    loop of every scope of the corpus and the examples, the names the loop holds (all together,
    and a few one by one), with and without the statement after it ignored (``also``), the
    index's answer is the visitor's."""
    from scalebox_cst.transforms.analysis import read_index, reads

    asked = differ = 0
    for name, code in _read_sources():
        try:
            module = cst.parse_module(code)
        except cst.ParserSyntaxError:
            continue
        scopes = [module] + [n for n in walk(module) if isinstance(n, (cst.FunctionDef, cst.ClassDef))]
        for scope in scopes:
            body = scope.body if isinstance(scope, (cst.FunctionDef, cst.ClassDef)) else scope
            index = read_index.ReadIndex()
            body.visit(index)
            statements = [n for n in walk(body) if isinstance(n, cst.BaseStatement)]
            for loop in (n for n in statements if isinstance(n, cst.For)):
                names = sorted(_visited_names(loop) | {"locals", "acc", "i"})
                after = statements[statements.index(loop) + 1:][:1]
                for wanted, also in [(set(names), ()), (set(names), after)] + [({n}, ()) for n in names[:3]]:
                    visitor = reads._Reads(wanted, loop, also)
                    visitor.ancestors = reads._enclosing_loops(body, loop)
                    body.visit(visitor)
                    got = index.read_elsewhere(loop, wanted, also)
                    asked += 1
                    differ += got != visitor.found
                    assert got == visitor.found, (name, cst.Module([]).code_for_node(loop)[:80], wanted)
    assert asked > 1000 and differ == 0
