"""cstwalk: the per-type child readers and the kept walks give what the plain field walk gives
(same nodes, same order): the analyses read their walks as they did before."""
from conftest import TESTS  # tests/: the corpus beside it
import glob
import os

import libcst as cst
import pytest

from scalebox_cst.transforms.analysis import cstwalk

SOURCES = sorted(glob.glob(os.path.join(TESTS, "corpus", "*.py")))


@pytest.mark.parametrize("path", SOURCES[:6])
def test_push_children_and_walk_match_the_field_walk(path):
    with open(path, encoding="utf-8") as fh:
        module = cst.parse_module(fh.read())
    order = []
    stack = [module]
    while stack:  # the field walk, spelled out with children()
        n = stack.pop()
        order.append(n)
        stack.extend(cstwalk.children(n))
    assert [id(n) for n in cstwalk.walk(module)] == [id(n) for n in order]
    for n in order[:3000]:
        out = []
        cstwalk.push_children(n, out)
        assert [id(c) for c in out] == [id(c) for c in cstwalk.children(n)]


def test_kept_walks_of_blocks_are_the_same_walk_each_time():
    module = cst.parse_module("def f(x):\n    for t in range(3):\n        x = x + t\n    return x\n")
    loop = module.body[0].body.body[0]
    first = [id(n) for n in cstwalk.walk(loop)]
    second = [id(n) for n in cstwalk.walk(loop)]  # from the kept list
    assert first == second == [id(n) for n in cstwalk._walk(loop)]
    assert any(hit[0] is loop for hit in cstwalk._WALKED.values())
    calls = list(cstwalk.instances(module, (cst.Call,)))
    assert [c.func.value for c in calls] == ["range"]
