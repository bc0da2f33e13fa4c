"""cstparse: libcst's parse without re-validating what its parser built gives the same trees,
still refuses code that does not parse, and leaves validation on for nodes made anywhere else
(in the same thread after a parse, or in another thread during one)."""
from __future__ import annotations

import glob
import os
import threading

import libcst as cst
import pytest

from conftest import TESTS
from scalebox_cst.transforms.analysis import cstparse

ROOT = os.path.dirname(TESTS)


def _sources():
    paths = sorted(glob.glob(os.path.join(TESTS, "corpus", "*.py")))
    paths += sorted(glob.glob(os.path.join(ROOT, "examples", "**", "*.py"), recursive=True))
    assert len(paths) >= 10
    for path in paths:
        with open(path, encoding="utf-8") as f:
            yield path, f.read()


class _Plain(cst.CSTTransformer):
    """Each whitespace holding a backslash continuation as libcst's parse makes it (cstparse
    keeps the indentation of its statement with it: scalebox_cst/continuation.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.homes = []

    def leave_SimpleWhitespace(self, original, updated):
        if type(updated) is cst.SimpleWhitespace:
            return updated
        assert "\\" in updated.value
        self.homes.append(updated.home)
        return cst.SimpleWhitespace(updated.value)


def test_same_trees_as_libcsts_parse():
    continued = 0
    for path, code in _sources():
        got, want = cstparse.parse_module(code), cst.parse_module(code)
        plain = _Plain()
        assert got.visit(plain).deep_equals(want), path
        assert got.code == code
        continued += len(plain.homes)
    assert continued >= 3  # (the corpus has some)


def test_continuations_know_the_indentation_of_their_statement():
    code = "x = 1 + \\\n  2\nclass A:\n\tdef f(self):\n\t\tif a and \\\n b:\n\t\t  s = 'a\\\n' + \\\n 'b'\n"
    plain = _Plain()
    module = cstparse.parse_module(code)
    module.visit(plain)
    assert plain.homes == ["", "\t\t", "\t\t  "]
    assert module.code == code
    code = "def f(x):\n  match x:\n    case 1:\n        y = 1 + \\\n 2\n"  # the cases: the match's own indent
    plain = _Plain()
    cstparse.parse_module(code).visit(plain)
    assert plain.homes == ["        "]


def test_statements_and_expressions():
    assert cstparse.parse_statement("x = (a + b)\n").deep_equals(cst.parse_statement("x = (a + b)\n"))
    assert cstparse.parse_expression("f(a)[1:2]").deep_equals(cst.parse_expression("f(a)[1:2]"))


@pytest.mark.parametrize("code", ["def f(:\n", "x = (1\n", "return return\n"])
def test_code_that_does_not_parse_still_raises(code):
    with pytest.raises(cst.ParserSyntaxError):
        cstparse.parse_module(code)


def _invalid_name():
    return cst.Name("not an identifier")


def test_nodes_made_after_a_parse_are_validated():
    cstparse.parse_module("x = 1\n")
    with pytest.raises(cst.CSTValidationError):
        _invalid_name()


def test_a_parse_that_raises_leaves_validation_on():
    with pytest.raises(cst.ParserSyntaxError):
        cstparse.parse_module("def f(:\n")
    with pytest.raises(cst.CSTValidationError):
        _invalid_name()


def test_other_threads_validate_during_a_parse(monkeypatch):
    """A node made in another thread while this one parses is checked as before."""
    started, made = threading.Event(), threading.Event()
    errors = []

    def other():
        started.wait(10)
        try:
            _invalid_name()
        except cst.CSTValidationError:
            errors.append("validated")
        made.set()

    real = cst.parse_module

    def slow_parse(code):
        started.set()
        made.wait(10)  # the other thread makes its node while this parse is under way
        return real(code)

    worker = threading.Thread(target=other)
    worker.start()
    monkeypatch.setattr(cst, "parse_module", slow_parse)
    cstparse.parse_module("x = 1\n")
    worker.join(10)
    assert errors == ["validated"]


def test_parsed_nodes_are_not_validated_again(monkeypatch):
    calls = []
    real = cst.Name._validate

    def counted(self):
        calls.append(self.value)
        return real(self)

    monkeypatch.setattr(cst.Name, "_validate", counted)
    cstparse.parse_module("x = y + z\n")
    assert calls == []
    cst.parse_module("x = y + z\n")
    assert sorted(calls) == ["x", "y", "z"]
