"""cstpieces: a long def/class parsed in pieces of its body is the tree of a whole parse (every
node and whitespace field: ``deep_equals``, and the same code), split at every point it may be;
where a piece would differ (comments between, another indent, a body on the header's line) it
is not split there; and the pipeline writes the same output with pieces as without."""
from __future__ import annotations

import ast
import glob
import os
import sys
from typing import List

import pytest

import harness
from conftest import TESTS
from scalebox_cst.transforms import partial
from scalebox_cst.transforms.analysis import cstparse, cstpieces

ROOT = os.path.dirname(TESTS)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bench_scaling  # noqa: E402


def _split_everywhere(code: str):
    """(chunks split, chunks that could not be) over every top-level statement of ``code``, each
    cut at every point allowed; asserts each split one equals its whole parse."""
    tree = ast.parse(code)
    ch = partial.chunks(code, tree)
    if ch is None:
        return 0, 0
    split = refused = 0
    for g in range(len(ch.tops)):
        text = ch.text(g)
        lines = text.splitlines(keepends=True)
        cuts = cstpieces._cuts(lines, ch.starts[g], ch.tops[g], 0, 1)
        if not cuts:
            continue
        made = cstpieces._assembled(lines, cuts)
        if made is None:
            refused += 1
            continue
        whole = cstparse.parse_module(text)
        assert made.deep_equals(whole), (ch.starts[g], text[:200])
        assert made.code == text
        split += 1
    return split, refused


def _sources() -> List[str]:
    paths = sorted(glob.glob(os.path.join(TESTS, "corpus", "*.py")))
    paths += sorted(glob.glob(os.path.join(ROOT, "examples", "**", "*.py"), recursive=True))
    # this project's own modules: long classes and functions, docstrings, comments everywhere
    for folder in ("scalebox_cst", "transforms", "runtime", "benchmarks"):
        paths += sorted(glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True))
    return paths


def test_pieces_are_the_whole_parse_on_real_files():
    split = 0
    for path in _sources():
        with open(path, encoding="utf-8") as fh:
            split += _split_everywhere(fh.read())[0]
    assert split >= 300  # the test checked what it says (corpus ~50, this tree's classes ~400)


LOOK_ALIKES = [
    # comment lines between statements: owned by the block above or the statement below by their
    # indent, so no cut there
    "def f(x):\n    a = 1\n    # about b\n    b = 2\n\n    # about c\n    c = 3\n    return a\n",
    "def f(x):\n    for t in x:\n        a = t\n        # inside the loop\n    b = 2\n    return b\n",
    "def f(x):\n    if x:\n        a = 1\n  # a comment at another indent\n    b = 2\n    return b\n",
    # strings and continuation lines at other columns
    'def f(x):\n    s = """\nat column 0\n    four\n"""\n    t = (1 +\n  2)\n\n    u = 3\n    return s, t, u\n',
    # decorated and nested definitions, a; b, whitespace-only lines, a trailing comment block
    "class C:\n    x = 1\n\n    @staticmethod\n    def f():\n        return 1\n    a = 1; b = 2\n    \n    c = 3\n"
    "    def g(self):\n        pass\n        # last words\n",
    # a body on the header's line, a two-space indent, tabs
    "def f(a,\n      b): return a; b\n",
    "def f():\n  a = 1\n  b = 2\n  return a\n",
    "def f():\n\ta = 1\n\tb = 2\n\treturn a\n",
]


@pytest.mark.parametrize("code", LOOK_ALIKES)
def test_look_alikes_are_split_only_where_a_piece_parses_the_same(code):
    _split_everywhere(code)


def test_cuts_only_after_empty_lines_at_the_blocks_indent():
    code = LOOK_ALIKES[0]
    lines = code.splitlines(keepends=True)
    tree = ast.parse(code)
    cuts = cstpieces._cuts(lines, 1, tree.body, 0, 1)
    assert [lines[c] for c in cuts] == ["    return a\n"]  # the one place with no comment before it


def test_a_long_function_is_parsed_in_pieces_with_the_same_output(monkeypatch, parses):
    """A 2,000-line function (bench_scaling's ``loops``): parsed in pieces of ~150 lines, the
    rewrite's output and sites are those of the whole parse."""
    source = bench_scaling.make_source(2000, "loops")
    pieces = harness.pipeline(None, "cpu").rewrite("gen.py", source.encode())
    assert sum(1 for s in parses if s.startswith("if 1:\n")) >= 10
    monkeypatch.setattr(cstpieces, "MIN_LINES", 10 ** 9)
    whole = harness.pipeline(None, "cpu").rewrite("gen.py", source.encode())
    assert pieces.output == whole.output
    assert [(s.transform, s.line, s.action, s.reason) for s in pieces.report.sites] == \
        [(s.transform, s.line, s.action, s.reason) for s in whole.report.sites]
    assert sum(s.action == "rewritten" for s in pieces.report.sites) >= 200
