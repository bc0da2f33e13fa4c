"""Lists of Python floats are vectorized only where the loop writes at a list's front.

Measured (runtime/vectorized/recurrence_guard.py, MIN_STEPS): the list -> tensor -> list round
trip loses to a loop that appends (0.26-0.48x), and wins over one that inserts at index 0 (that
loop is quadratic) from about 768 steps. The guard used to read "walks x[::-1]" as "inserts at the
front": PPO-PyTorch's ``for r in reversed(rewards): ...; out.insert(0, R)`` stayed on the quadratic
loop at any length, and a ``rewards[::-1]`` loop that appends was vectorized where it loses.
"""
import random

import libcst as cst
import libcst.matchers as m

from harness import load, rewriter
from scalebox_cst.runtime import vectorized

rewrite = rewriter("vectorize.recurrence")

INSERT_REVERSED = """
def returns_of(rewards, gamma):
    out = []
    R = 0.0
    for r in reversed(rewards):
        R = r + gamma * R
        out.insert(0, R)
    return out
"""

APPEND_SLICED = """
def returns_of(rewards, gamma):
    out = []
    R = 0.0
    for r in rewards[::-1]:
        R = r + gamma * R
        out.append(R)
    return out
"""


def _guard_keywords(code):
    """The keyword names of the rewrite's ``recurrence_ok`` call."""
    found = m.findall(cst.parse_module(code), m.Call(func=m.Attribute(attr=m.Name("recurrence_ok"))))
    assert len(found) == 1, code
    return {a.keyword.value for a in found[0].args if a.keyword is not None}


def test_guard_admits_long_float_lists_only_when_written_at_the_front():
    T = 2048
    rewards = [random.Random(0).random() for _ in range(T)]
    seqs, lists = ((rewards, 0),), ([],)
    assert vectorized.recurrence_ok(T, seqs=seqs, scalars=(0.99,), lists=lists, front=True, cpu=True)
    assert not vectorized.recurrence_ok(T, seqs=seqs, scalars=(0.99,), lists=lists, cpu=True)
    # x[::-1] says how the loop walks, not where it writes: an appending loop stays on the loop
    assert not vectorized.recurrence_ok(T, seqs=seqs, scalars=(0.99,), lists=lists, sliced=True, cpu=True)
    # short lists stay on the loop even at the front (the round trip's fixed cost)
    assert not vectorized.recurrence_ok(64, seqs=((rewards[:64], 0),), scalars=(0.99,), lists=lists, front=True, cpu=True)


def test_rewrite_tells_the_guard_where_the_loop_writes():
    out, _ = rewrite(INSERT_REVERSED)
    assert "front" in _guard_keywords(out)
    out, _ = rewrite(APPEND_SLICED)
    assert _guard_keywords(out) >= {"sliced"} and "front" not in _guard_keywords(out)


def test_front_insert_over_reversed_runs_vectorized_and_bitwise(monkeypatch):
    out, _ = rewrite(INSERT_REVERSED)
    original, rewritten = load(INSERT_REVERSED, "returns_of"), load(out, "returns_of")
    calls = []
    real = vectorized.recurrence_ok
    monkeypatch.setattr(vectorized, "recurrence_ok", lambda *a, **k: calls.append(real(*a, **k)) or calls[-1])
    rng = random.Random(1)
    rewards = [rng.uniform(-1, 1) for _ in range(3000)]
    assert rewritten(rewards, 0.99) == original(rewards, 0.99)  # Python floats: == is bitwise here
    assert calls and calls[-1]  # the vectorized branch ran
