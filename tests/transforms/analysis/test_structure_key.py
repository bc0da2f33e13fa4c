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


# ---------------------------------------------------------------- code emitted or compared as text
# The same defect in two more forms: code the rewrite emits was the source with its whitespace
# collapsed (string literals included: ``sizes["n  steps"]`` became ``sizes["n steps"]``, another
# key; a comment swallowed the rest of the line), and outputs were compared with reads by their
# text (``s . a`` was not ``s.a``). Each test fails on the old code.

QUAD_BOUND = '''
def f(sizes, rewards, out):
    for t in range(sizes["n  steps"]):
        total = 0
        for k in range(t, sizes["n  steps"]):
            total = total + rewards[k]
        out[t] = total
'''


@pytest.mark.parametrize("keys", [{"n  steps": 6}, {"n  steps": 6, "n steps": 3}])
def test_quadratic_guard_reads_the_bound_as_written(keys):
    import numpy as np

    from scalebox_cst.runtime import vectorized

    original, rewritten, out, sites = harness.pair(QUAD_BOUND, "f", "vectorize.recurrence", dedent=False)
    assert [s.action for s in sites] == ["rewritten"]
    assert '_sbx.steps(sizes["n  steps"])' in out  # was: sizes["n steps"]
    rewards = np.arange(1.0, 7.0)
    saved = dict(vectorized.QUAD_MIN_STEPS)
    vectorized.QUAD_MIN_STEPS.update({k: 2 for k in saved})  # vectorized from 2 steps on
    try:
        a, b = np.zeros(6), np.zeros(6)
        original(dict(keys), rewards, a)
        rewritten(dict(keys), rewards, b)  # raised KeyError, or summed over the other key's 3 steps
    finally:
        vectorized.QUAD_MIN_STEPS.update(saved)
    np.testing.assert_allclose(b, a, rtol=1e-12)


def test_hoisted_chain_keeps_its_string_literals():
    src = ('adv = []\na = 0.0\nfor delta, done in zip(deltas[::-1], x.astype("float  64")[::-1]):\n'
           '    a = delta + gamma * (1.0 - done) * a\n    adv.append(a)\n')
    out, sites = harness.rewrite(src, "vectorize.recurrence", dedent=False)
    assert [s.action for s in sites] == ["rewritten"]
    assert 'zipped = x.astype("float  64")\n' in out and "`x.astype(\"float  64\")` into `zipped`" in sites[0].reason


def test_read_back_with_a_comment_inside_is_emitted_as_code():
    """``prev_return = returns[i,  # ...\\n 0]`` re-run at t = 1: its one-line text was
    ``returns[i, # ... 0]``, a comment eating the index (the rewrite failed: not analysed)."""
    import torch

    src = '''
def f(rewards, masks, gamma, returns):
    prev_return = 0
    for i in reversed(range(rewards.size(0))):
        returns[i] = rewards[i] + gamma * masks[i] * prev_return
        prev_return = returns[i,  # the first column
                              0]
    return returns, prev_return
'''
    original, rewritten, out, sites = harness.pair(src, "f", "vectorize.recurrence", dedent=False)
    assert [(s.action, s.exactness) for s in sites] == [("rewritten", "exact")], [s.reason for s in sites]
    assert "            prev_return = returns[i, 0]\n" in out
    g = torch.Generator().manual_seed(0)
    for T in (1, 2, 3, 7):
        r, m = torch.randn(T, generator=g), (torch.rand(T, generator=g) > 0.2).float()
        want, got = original(r, m, 0.9, torch.zeros(T, 1)), rewritten(r, m, 0.9, torch.zeros(T, 1))
        assert torch.equal(want[0], got[0]) and float(want[1]) == float(got[1])


@pytest.mark.parametrize("body, reason", [
    ("s.a[i] = x[i] * 2.0\n        b[i] = s . a[i] + 1.0", "the body reads an output it writes"),
    ("s.a[i] = x[i] * 2.0\n        s . a[i] = x[i] * 3.0", "the body writes the same output twice"),
])
def test_elementwise_outputs_compared_by_structure(body, reason):
    """Spelled ``s . a`` the read of an output was taken for another array: the loop was rewritten
    (its guard then ran the loop, which is why no value was wrong), its plain spelling skipped."""
    for spelled in (body, body.replace("s . a", "s.a")):
        src = f"def f(x, s, b, n):\n    for i in range(n):\n        {spelled}\n"
        out, sites = harness.rewrite(src, "vectorize.elementwise", dedent=False)
        assert [(s.action, s.reason.startswith(reason)) for s in sites] == [("skipped", True)], spelled
