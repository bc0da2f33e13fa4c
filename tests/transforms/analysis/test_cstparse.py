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


def test_same_trees_as_libcsts_parse():
    for path, code in _sources():
        got, want = cstparse.parse_module(code), cst.parse_module(code)
        assert got.deep_equals(want), path
        assert got.code == code


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
