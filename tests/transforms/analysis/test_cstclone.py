"""Fresh copies of libcst trees and generated code parsed once per shape (cstclone): a copy is
the tree ``deep_clone`` makes (same code, equal structure, no node shared), and text parsed
through a cached shape is the tree ``parse_module`` makes of that very text."""
from conftest import TESTS  # tests/: the corpus, fake_torch_npu and the repository root beside it
import glob
import os

import libcst as cst
import pytest

from scalebox_cst.transforms.analysis import cstclone, cstwalk

HERE = TESTS


def _ids(node):
    return {id(n) for n in cstwalk.walk(node)}


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(HERE, "corpus", "*.py")))[:6])
def test_a_clone_is_deep_clone_with_no_node_shared(path):
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    module = cst.parse_module(text)
    copy = cstclone.clone(module)
    assert copy.code == text
    assert copy.deep_equals(module.deep_clone())
    assert not _ids(copy) & _ids(module)


TEXTS = [
    "if x_1 > 0:  # about x_1\n    y = f'{x_1}' + 'a' \"b\" + rb'c'\nelse:\n    z = [q for q in x_1]\n",
    "# step t = T_2 - 1, as written\nadv_2[t] = last = delta + gamma * lam * masks[t] * last\npass\n",
    "if (T := _sbx.steps(rewards)) >= 2 and ok(T, out=((adv_3, 0),), exact=True):\n    pass\n",
    "def f(a, *, b=1, **kw):\n    return lambda c: a.b(c, key=kw)  # done\n",
    "x = '''many\nlines''' + u'u' + B'b'\n",
]


def _counting_parse(monkeypatch):
    calls = []
    real = cst.parse_module

    def parse(text, *a, **k):
        calls.append(text)
        return real(text, *a, **k)

    monkeypatch.setattr(cst, "parse_module", parse)
    return calls


@pytest.mark.parametrize("text", TEXTS)
def test_parsed_statements_are_the_texts_own(text, monkeypatch):
    cstclone._SHAPES.clear()
    calls = _counting_parse(monkeypatch)
    renamed = text.replace("x_1", "x_9").replace("adv_2", "ret_7").replace("T_2", "n_steps").replace("adv_3", "ret_3")
    renamed = renamed.replace("'a'", "'zz'").replace("# done", "# fin")
    for t in (text, renamed, text):
        got = cst.Module(cstclone.parse_statements(t))
        expected = cst.Module(list(cst.parse_module(t).body))  # what the callers took before
        assert got.code == expected.code and got.deep_equals(expected)
    shapes = 2 if "f'{x_1}'" in text else 1  # an f-string's names are part of its shape
    assert len(calls) == shapes + 3  # the shapes' parses (and one per check above)
    first, second = cstclone.parse_statements(text), cstclone.parse_statements(text)
    assert not set().union(*map(_ids, first)) & set().union(*map(_ids, second))  # fresh nodes each time


def test_texts_not_sure_to_parse_alike_are_parsed_as_they_are(monkeypatch):
    cstclone._SHAPES.clear()
    calls = _counting_parse(monkeypatch)
    for text in ("match = f(x)\n", "print(type)\n", "y = _sbx_shape_0\n"):
        assert cst.Module(cstclone.parse_statements(text)).code == text
    assert len(calls) == 3 and not cstclone._SHAPES
    # an f-string's inside is parsed: its names are part of the shape
    a, b = "v = f'{x}'\n", "v = f'{y}'\n"
    assert cst.Module(cstclone.parse_statements(a)).code == a and cst.Module(cstclone.parse_statements(b)).code == b
    assert len(cstclone._SHAPES) == 2


def _sources():
    """The corpus and example files, whole and cut into top-level stretches, and TEXTS."""
    paths = sorted(glob.glob(os.path.join(HERE, "corpus", "*.py")))
    paths += sorted(glob.glob(os.path.join(os.path.dirname(HERE), "examples", "**", "*.py"), recursive=True))
    out = list(TEXTS)
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        out.append(text)
        out.extend(part + "\n" for part in text.split("\n\n\n") if part.strip())
    return out


@pytest.mark.skipif(cstclone._TokenizerIter is None or __import__("sys").version_info[:2] != (3, 11),
                    reason="the C tokenizer path is taken on CPython 3.11 only")
def test_the_c_tokenizer_finds_the_spans_the_tokenize_module_finds():
    used = 0
    for text in _sources():
        fast = cstclone._fast_spans(text)
        if fast is not None:
            assert fast == cstclone._spans(text), text[:200]
            used += 1
    assert used > 100  # the fast path is taken on most of them (ASCII, valid Python)
    # comments anywhere between tokens, continuations, strings spanning lines, comment-only lines
    text = "x = (a +  # one\n     b)  # two\n# three\ny = '''s\n#t''' \\\n    + c\n\n  # four\nz = 1\n"
    assert cstclone._fast_spans(text) == cstclone._spans(text)
    assert [s[1] for s in cstclone._fast_spans(text) if s[0] == "#{}"] == ["# one", "# two", "# three", "# four"]
    # not taken: non-ASCII text, form feeds, carriage returns (the tokenize module decides)
    for text in ("é = 1\n", "x = 1\f\ny = 2\n", "x = 1\r\ny = 2\r\n"):
        assert cstclone._fast_spans(text) is None


#: one-line statements and expressions as the vectorize transforms generate them per site
LINES = [
    ("statement", "_sb_batch_3 = _sb_batch_zip((xs, ys), (), (), (), 1)\n"),
    ("statement", "out[_sb_idx] = torch.where(mask, a * 2.5 + b, c)\n"),
    ("statement", "total_2 = total_2 + _sb_batch_1[0].sum(0)  # done\n"),
    ("statement", "if _sb_batch is not None:\n    y = 'a'\n"),
    ("expression", "_sb_batch_7 is not None"),
    ("expression", "not _sb_soft_update(target, source, 0.005)"),
    ("expression", "((x_1 * 2).contiguous() if (_sb_b := _sb_batch_zip((xs,), (), (), (), 1)) is not None else [x_1 * 2 for x_1 in xs])"),
]


@pytest.mark.parametrize("how,text", LINES)
def test_one_statement_or_expression_is_the_parsers_own(how, text, monkeypatch):
    cstclone._SHAPES.clear()
    real = getattr(cst, f"parse_{how}")
    mine = getattr(cstclone, f"parse_{how}")
    calls = []
    monkeypatch.setattr(cst, f"parse_{how}", lambda t, *a, **k: calls.append(t) or real(t, *a, **k))
    renamed = text.replace("_sb_batch", "_sb_other").replace("x_1", "x_9").replace("'a'", "'zz'").replace("# done", "# fin")
    for t in (text, renamed, text):
        got, expected = mine(t), real(t)
        assert got.deep_equals(expected) and cst.Module([]).code_for_node(got) == cst.Module([]).code_for_node(expected)
    assert len(calls) == 1  # the shape's parse only: the texts differ in names, strings and comments
    assert not _ids(mine(text)) & _ids(mine(text))  # fresh nodes each time
