"""program_shapes: a fused program's normal text and parameters, found once per shape of
program, are what working the text out directly gives: on every program the corpus, the
examples and the bench shapes make, and on those programs with their names renamed."""
from __future__ import annotations

import glob
import os
import random
import sys

import pytest

import harness
from conftest import TESTS
from scalebox_cst.transforms.vectorize.recurrence import program_shapes

ROOT = os.path.dirname(TESTS)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bench_scaling  # noqa: E402


@pytest.fixture(scope="module")
def programs():
    """Every program text recurrence asks about while rewriting the corpus, the examples and
    the bench shapes."""
    asked = []
    real = program_shapes.normal_program

    def record(text):
        asked.append(text)
        return real(text)

    program_shapes.normal_program = record
    try:
        pipe = harness.pipeline()
        paths = sorted(glob.glob(os.path.join(TESTS, "corpus", "*.py")) + glob.glob(os.path.join(ROOT, "examples", "**", "*.py"), recursive=True))
        for path in paths:
            with open(path, "rb") as f:
                pipe.rewrite(os.path.basename(path), f.read())
        for shape in ("one", "mixed", "loops"):
            pipe.rewrite("gen.py", bench_scaling.make_source(300, shape).encode())
    finally:
        program_shapes.normal_program = real
    assert len(set(asked)) >= 10
    return sorted(set(asked))


def test_answers_are_the_direct_ones(programs):
    program_shapes._SHAPES.clear()
    for text in programs:
        assert program_shapes.normal_program(text) == program_shapes._work_out(text), text
    assert any(program_shapes._work_out(text) is not None for text in programs)


def test_renamed_programs_get_renamed_answers(programs):
    rng = random.Random(7)
    for text in programs:
        names = sorted({m.group(0) for m in program_shapes._IDENT.finditer(text)} - program_shapes._KEPT)
        renamed = {n: f"{n}_{rng.randrange(10 ** 6)}" for n in names}
        other = program_shapes._IDENT.sub(lambda m: renamed.get(m.group(0), m.group(0)), text)
        assert program_shapes.normal_program(other) == program_shapes._work_out(other), other


@pytest.mark.parametrize("text", [
    "s = x[t] + c * s; out[t] = s",
    "s = x[t] + 'c' * s; out[t] = s",  # a string: worked out as it is
    "s = x[t] + self.c * s; out[t] = s",  # an attribute
    "s = x[t] + _sbx_p0 * s; out[t] = s",  # a placeholder's spelling
    "s = x[t] + 1e5 * s + 0x1f; out[t] = s",  # letters inside numbers are not names
    "s = x[t] + (c * (s)); out[t] = s",  # parentheses it does not need: dropped
    "s = x[t] + T * s; out[t] = s",  # t and T are kept
    "s = x[t] +",  # does not parse
])
def test_texts_of_every_kind(text):
    assert program_shapes.normal_program(text) == program_shapes._work_out(text)
