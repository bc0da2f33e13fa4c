"""astsplice: the ast of a spliced module version, made from the previous version's kept
statements (lines shifted) and parses of the generated stretches, is ast.parse's of the new code
(attributes included), on rewritten files of every bench shape, the corpus and the examples; code
with a carriage return or a __future__ import, and files whose statements share lines, are
parsed whole."""
from __future__ import annotations

import ast
import glob
import os
import sys

import pytest

import harness
from conftest import TESTS
from scalebox_cst import astsplice

ROOT = os.path.dirname(TESTS)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bench_scaling  # noqa: E402


@pytest.fixture
def checked(monkeypatch):
    """Every spliced parse compared with ast.parse of the same code; (spliced, whole) counts."""
    real = astsplice.parse
    counts = {"spliced": 0, "whole": 0}

    def parse(new_code, old_code, old_tree, plan, filename, memo=None):
        got = real(new_code, old_code, old_tree, plan, filename, memo)
        if got is None:
            counts["whole"] += 1
            return None
        assert ast.dump(got, include_attributes=True) == ast.dump(ast.parse(new_code, filename=filename), include_attributes=True)
        counts["spliced"] += 1
        return got

    monkeypatch.setattr(astsplice, "parse", parse)
    return counts


@pytest.mark.parametrize("shape", ["mixed", "loops", "sparse", "one"])
def test_spliced_versions_are_parsed_alike(shape, checked):
    result = harness.pipeline().rewrite("gen.py", bench_scaling.make_source(1500, shape).encode())
    assert result.report.error is None and result.changed
    assert checked["spliced"] >= 1 and checked["whole"] == 0


def test_corpus_and_examples(checked):
    pipe = harness.pipeline()
    paths = sorted(glob.glob(os.path.join(TESTS, "corpus", "*.py")) + glob.glob(os.path.join(ROOT, "examples", "**", "*.py"), recursive=True))
    for path in paths:
        with open(path, "rb") as f:
            pipe.rewrite(os.path.basename(path), f.read())
    assert checked["spliced"] >= 10


GAE = bench_scaling.make_source(200, "one")


@pytest.mark.parametrize("source", [
    GAE.replace("\n", "\r\n"),  # line ends ast counts apart from the splice's
    "from __future__ import annotations\n" + GAE,  # a future import can change how code parses
])
def test_code_it_does_not_splice_is_parsed_whole(source, checked):
    result = harness.pipeline().rewrite("gen.py", source.encode())
    assert result.report.error is None and result.changed
    assert checked["spliced"] == 0 and checked["whole"] >= 1


def test_statements_sharing_a_line_are_parsed_whole(checked):
    result = harness.pipeline().rewrite("gen.py", ("a = 1; b = 2\n" + GAE).encode())
    assert result.report.error is None and result.changed
    assert checked["spliced"] == 0  # one libcst statement, two ast statements: no plan is made
