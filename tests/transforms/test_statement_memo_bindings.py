"""statement_memo.may_bind: the builtin checks walk only the statements that can bind the name.

A statement that spells ``range`` only as calls (``range(n)``) or attributes (``x.range``) binds
nothing and is not walked; every form that binds a name is walked and found, with the same answer
as a walk of the whole tree (scopes.BuiltinChecker, recurrence's _ast_bound_of)."""
from __future__ import annotations

import ast
import textwrap

import pytest

from scalebox_cst.transforms import statement_memo
from scalebox_cst.transforms.analysis import scopes
from scalebox_cst.transforms.vectorize.recurrence import loops

LOOP = "def loop(xs, n):\n    for i in range(n):\n        xs[i] = xs[i] + 1\n"

#: each binds ``range`` (as the whole-tree walks see it)
BINDINGS = [
    "range = list\n",
    "range += 1\n",
    "range: int = 3\n",
    "for range in xs:\n    pass\n",
    "a, (range, *b) = c\n",
    "with open(p) as range:\n    pass\n",
    "try:\n    pass\nexcept OSError as range:\n    pass\n",
    "import range\n",
    "import range.sub\n",
    "import os as range\n",
    "from m import range\n",
    "from m import (x,\n    range)\n",
    "def range(n):\n    return n\n",
    "async def range(n):\n    return n\n",
    "def \\\n range(n):\n    return n\n",
    "class range(int):\n    pass\n",
    "class range:\n    pass\n",
    "def f(range):\n    return range(3)\n",
    "def f(*, range=1):\n    return range(3)\n",
    "g = lambda range: range(3)\n",
    "ys = [range for range in xs]\n",
    "def f():\n    global range\n    range = 3\n",
    "del range\n",
]

#: spell ``range`` without binding it
NOT_BINDINGS = [
    "ys = list(range(3))\n",
    "ys = x.range(3)\n",
    "obj.range = 3\n",
    "ys = range (3)\n",
    "def f(n):\n    return [i for i in range(n)]\n",
]


@pytest.mark.parametrize("stmt", BINDINGS)
def test_each_binding_form_is_walked_and_found(stmt):
    assert statement_memo.may_bind(["range"])(stmt)
    _same_answers(LOOP + stmt + LOOP)


@pytest.mark.parametrize("stmt", NOT_BINDINGS)
def test_calls_and_attributes_are_not_walked(stmt):
    assert not statement_memo.may_bind(["range"])(stmt)
    assert statement_memo.may_bind(["range", "zip"])(stmt + "zip = 1\n")
    _same_answers(LOOP + stmt + LOOP)
    code = LOOP + stmt
    tree = ast.parse(code)
    memo = statement_memo.StatementMemo()
    memo.register(tree, code)
    walked = []
    memo.mentioning(tree, "t", walked.append, ("range",), statement_memo.may_bind(["range"]))
    assert walked == []  # the loop's and the statement's ``range(`` are calls: nothing walked


def test_text_that_is_not_ascii_is_walked():
    assert statement_memo.may_bind(["range"])("ys = range(3)  # é\n")


def _same_answers(code):
    code = textwrap.dedent(code)
    memo = statement_memo.StatementMemo()
    with statement_memo.active(memo):
        tree = ast.parse(code)
        memo.register(tree, code)
        plain = ast.parse(code)
        for name in ("range", "zip"):
            assert scopes.builtin_checker(tree).reason(name) == scopes.builtin_checker(plain).reason(name)
        assert loops._ast_bound_of(tree, ["range", "zip"]) == loops._ast_bound(plain) & {"range", "zip"}


def test_one_builtin_checker_per_registered_version():
    code = LOOP + "range = list\n"
    memo = statement_memo.StatementMemo()
    with statement_memo.active(memo):
        tree = ast.parse(code)
        memo.register(tree, code)
        first = scopes.builtin_checker(tree)
        assert scopes.builtin_checker(tree) is first and not first("range")
        other = ast.parse(code)  # not registered: a checker of its own each time
        assert scopes.builtin_checker(other) is not scopes.builtin_checker(other)
        again = ast.parse(LOOP)
        memo.register(again, LOOP)  # the next version: the old checker is dropped with its tree
        assert scopes.builtin_checker(again) is not first and scopes.builtin_checker(again)("range")
