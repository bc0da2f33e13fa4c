"""Expressions are compared by structure, never by their whitespace-stripped text.

The recurrence family keyed expressions by their source with every whitespace character removed,
which made ``not x`` equal ``notx`` and ``x["a b"]`` equal ``x["ab"]``: a loop whose last-step
test read ``t == (not n - 1)`` over ``range(notn)`` was taken for ``t == notn - 1`` and
rewritten into code that computes something else. :func:`structure_key` is built from the libcst
tree (layout nodes and the outer parentheses left out), so look-alikes stay apart.
"""
import libcst as cst
import pytest

from scalebox_cst.transforms.analysis.shape import same_structure, structure_key
from scalebox_cst.transforms.vectorize.recurrence.lists import _index_text
from scalebox_cst.transforms.vectorize.recurrence.syntax import _is_int, _norm
import harness

#: pairs that differ only where whitespace separates tokens or sits inside a literal
LOOK_ALIKES = [
    ("not x", "notx"),
    ('x["a b"]', 'x["ab"]'),
    ("x['a b']", "x['ab']"),
    ('f"{a} {b}"', 'f"{a}{b}"'),
    ("a if b else c", "aifbelsec"),
    ("a not in b", "anotinb"),
    ("a is not b", "aisnotb"),
    ("a or b", "aorb"),
    ("1 .real", "1.0"),
    ("x[not n - 1]", "x[notn - 1]"),
    ("[a, b]  # c d", "[a, bc]"),
]

#: pairs that are the same code laid out differently
SAME = [
    ("x[t + 1]", "x[t+1]"),
    ("len(rewards) - 1", "len( rewards )-1"),
    ("((x))", "x"),
    ("(a,\n b)", "a, b"),
    ("self . rewards", "self.rewards"),
    ("- 1", "-1"),
    ("[a,  # first\n b]", "[a, b]"),
    ("not x", "not  x"),
]


@pytest.mark.parametrize("a,b", LOOK_ALIKES)
def test_look_alikes_have_different_keys(a, b):
    na, nb = cst.parse_expression(a), cst.parse_expression(b)
    assert structure_key(na) != structure_key(nb)
    assert _norm(na) != _norm(nb)  # the recurrence family's key
    assert not same_structure(na, nb)


@pytest.mark.parametrize("a,b", SAME)
def test_layout_does_not_change_the_key(a, b):
    na, nb = cst.parse_expression(a), cst.parse_expression(b)
    assert _norm(na) == _norm(nb)
    assert same_structure(na, nb)


@pytest.mark.parametrize("text", ["self.rewards", "t+1", "-1", "len(x)-1", "x[t+1,0]", "(a)+(b)"])
def test_key_of_compact_code_is_its_text(text):
    """Callers compare keys with spelled keys (``f"{T}-1"``, ``"-1"``): compact code is its own key."""
    assert structure_key(cst.parse_expression(text)) == text


def test_key_agrees_with_deep_equals_on_the_same_layout():
    exprs = [a for pair in LOOK_ALIKES + SAME for a in pair]
    for a in exprs:
        for b in exprs:
            na, nb = cst.parse_expression(a), cst.parse_expression(b)
            if na.deep_equals(nb):
                assert same_structure(na, nb), (a, b)


def test_int_and_list_index_tests_are_structural():
    assert _is_int(cst.parse_expression("- 1"), -1)
    assert not _is_int(cst.parse_expression("~1"), -1)
    sub = cst.parse_expression("buf[ - 1 ]")
    assert _index_text(sub) == "-1"
    assert _index_text(cst.parse_expression('buf["- 1"]')) != _index_text(cst.parse_expression('buf["-1"]'))


GAE = '''import torch
def gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda, {T}, n):
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range({T})):
        if t == {LAST}:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages
'''


def _rewritten(src):
    out, sites = harness.rewrite(src, dedent=False, path="gae.py")
    return harness.rewritten_sites(sites, "vectorize.recurrence"), out


def test_last_step_test_is_recognised_by_structure():
    sites, _ = _rewritten(GAE.format(T="notn", LAST="notn - 1"))
    assert sites  # the real last-step test: rewritten


def test_last_step_look_alike_is_left_alone():
    """``not n - 1`` reads as ``notn-1`` once whitespace is stripped: not the last step of ``range(notn)``."""
    src = GAE.format(T="notn", LAST="(not n - 1)")
    sites, out = _rewritten(src)
    assert not sites
    assert "for t in reversed(range(notn))" in out
