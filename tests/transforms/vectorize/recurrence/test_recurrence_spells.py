"""syntax.spells is the regex search it replaced (``(?<![\\w.])WORD TAIL\\b``) on any text."""
from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from scalebox_cst.transforms.vectorize.recurrence.syntax import spells

_ALPHABET = st.sampled_from(list("ab_1. [:]-T\té²x"))
_TEXT = st.text(_ALPHABET, max_size=40)
_WORD = st.text(st.sampled_from(list("ab_1.[:]- é²")), min_size=0, max_size=4)


def _regex(text: str, word: str, tail: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(word)}{re.escape(tail)}\b", text) is not None


@settings(max_examples=3000, deadline=None)
@given(_TEXT, _WORD, st.sampled_from(["", "[1:T - 1", "[", "]", " - 1"]))
def test_spells_is_the_regex_search(text, word, tail):
    assert spells(text, word, tail) == _regex(text, word, tail)


def test_examples():
    assert spells("x = adv_1[t] + 1", "adv_1")
    assert not spells("x = adv_12[t]", "adv_1")
    assert not spells("x = self.adv_1", "adv_1")
    assert not spells("x = _adv_1", "adv_1")
    assert spells("v = rew[1:T - 1]", "rew", "[1:T - 1")
    assert not spells("v = rew[1:T - 12]", "rew", "[1:T - 1")
