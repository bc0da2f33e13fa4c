"""linediff.LineMap (a version's line map kept as the diff's stretches) answers what the
per-line dict it replaced answered, and spliced_line_map (a splice's map: copied lines one to
one, only the made text diffed against the text it replaced) keeps every made line inside the
stretch it replaced, and equals the whole-file map on the bench shapes."""
from __future__ import annotations

import os
import sys

import pytest
from hypothesis import given, settings, strategies as st

import harness
from conftest import TESTS
from scalebox_cst import linediff
from scalebox_cst.textlines import physical_lines

sys.path.insert(0, os.path.join(os.path.dirname(TESTS), "benchmarks"))
import bench_scaling  # noqa: E402


def _per_line(old: str, new: str) -> dict:
    """The map as it was written before: one entry per new line."""
    a = [line.rstrip("\r\n") for line in physical_lines(old)]
    b = [line.rstrip("\r\n") for line in physical_lines(new)]
    mapping = {}
    for tag, i1, i2, j1, j2 in linediff.opcodes(a, b):
        for k in range(j2 - j1):
            mapping[j1 + k + 1] = i1 + k + 1 if tag == "equal" else min(i1 + k, max(i2 - 1, i1)) + 1
    return mapping


def _text(lines):
    return "".join(f"line {x}\n" for x in lines)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=40), st.lists(st.integers(0, 6), max_size=40))
def test_line_map_answers_as_the_per_line_dict(old, new):
    old_text, new_text = _text(old), _text(new)
    got, want = linediff.line_map(old_text, new_text), _per_line(old_text, new_text)
    for line in range(-1, len(new) + 3):
        assert got.get(line, -7) == want.get(line, -7)
    with pytest.raises(KeyError):
        got[len(new) + 1]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=4), min_size=1, max_size=12),
       st.lists(st.booleans(), min_size=12, max_size=12), st.lists(st.integers(0, 4), max_size=5))
def test_made_lines_map_into_what_they_replaced(chunks, keep, made):
    """Old text: chunks of lines; the new text copies the kept chunks and writes ``made`` in
    place of each run of chunks that is not kept."""
    old, new, copied = "", "", []
    replaced = []  # (first old line, last old line + 1, first new line, last new line) of made text
    run_old = None
    for k, chunk in enumerate(chunks):
        text = _text(chunk)
        if keep[k]:
            if run_old is not None:
                replaced.append((run_old, old.count("\n") + 1, new.count("\n") + 1, new.count("\n") + len(made)))
                new += _text(made)
                run_old = None
            copied.append((len(old), len(old) + len(text), len(new)))
            new += text
        elif run_old is None:
            run_old = old.count("\n") + 1
        old += text
    if run_old is not None:
        replaced.append((run_old, old.count("\n") + 1, new.count("\n") + 1, new.count("\n") + len(made)))
        new += _text(made)
    got = linediff.spliced_line_map(old, new, copied)
    assert got is not None
    for o0, o1, n0 in copied:  # copied lines: one to one
        first_old, first_new = old.count("\n", 0, o0) + 1, new.count("\n", 0, n0) + 1
        for k in range(old.count("\n", o0, o1)):
            assert got[first_new + k] == first_old + k
    for first_old, next_old, first_new, last_new in replaced:
        for line in range(first_new, last_new + 1):
            assert first_old <= got[line] <= next_old


def test_copies_that_do_not_start_lines_are_refused():
    old, new = "a = 1\nb = 2\n", "a = 1\nb = 3\n"
    assert linediff.spliced_line_map(old, new, [(0, 3, 0)]) is None


@pytest.fixture
def compared(monkeypatch):
    """Every spliced map compared with the whole-file map; how many were."""
    real, count = linediff.spliced_line_map, [0]

    def spliced(old, new, copied, starts=linediff.line_starts):
        got = real(old, new, copied, starts)
        assert got is not None
        whole = linediff.line_map(old, new)
        lines = len(physical_lines(new))
        assert [got.get(k, -1) for k in range(lines + 2)] == [whole.get(k, -1) for k in range(lines + 2)]
        count[0] += 1
        return got

    monkeypatch.setattr(linediff, "spliced_line_map", spliced)
    return count


@pytest.mark.parametrize("shape", ["mixed", "loops", "sparse"])
def test_spliced_maps_of_the_bench_shapes_are_the_whole_file_maps(shape, compared):
    result = harness.pipeline().rewrite("gen.py", bench_scaling.make_source(1500, shape).encode())
    assert result.report.error is None and result.changed
    assert compared[0] >= 1
