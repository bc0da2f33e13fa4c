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


def test_a_generated_stretch_that_does_not_parse_raises_with_the_new_codes_line():
    """The stretches are parsed at their lines: the error names the line of the new code."""
    old_code = "a = 1\nb = 2\nc = 3\n"
    new_code = "a = 1\nb = (\nc = 3\n"
    old_tree = ast.parse(old_code)
    plan = astsplice.Plan(kept=[(0, 0, 0), (2, 12, 12)], made=[(1, 6, "b = (\n")], kept_at=[0, 2])
    with pytest.raises(SyntaxError) as info:
        astsplice.parse(new_code, old_code, old_tree, plan, "x.py")
    assert info.value.lineno == 2
    assert [s.lineno for s in old_tree.body] == [1, 2, 3]  # nothing moved before the parse failed


def test_many_short_stretches_between_kept_statements():
    old_code = "".join(f"x{i} = {i}\n" for i in range(40))
    lines = old_code.splitlines(keepends=True)
    new_lines, plan, at = [], astsplice.Plan(), 0
    for i, line in enumerate(lines):
        if i % 3 == 0:  # replaced by two statements over three lines
            text = f"if x{i}:\n    y{i} = {i}\nz{i} = 0\n"
            plan.made.append((len(new_lines), at, text))
            new_lines.append(text)
        else:
            plan.kept.append((i, sum(map(len, lines[:i])), at))
            plan.kept_at.append(len(new_lines))
            new_lines.append(line)
        at += len(new_lines[-1])
    new_code = "".join(new_lines)
    got = astsplice.parse(new_code, old_code, ast.parse(old_code), plan, "x.py")
    assert ast.dump(got, include_attributes=True) == ast.dump(ast.parse(new_code), include_attributes=True)
