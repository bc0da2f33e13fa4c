"""The text the transforms see and the user's shape put back (scalebox_cst/textshape.py): a last
line without its newline. Form feeds are tested with the pipeline (test_pipeline.py)."""
from conftest import TESTS  # tests/: the corpus beside it

import glob
import os

import pytest

import harness
from scalebox_cst.textshape import Shaped
from scalebox_cst.transforms import partial

CORPUS = sorted(glob.glob(os.path.join(TESTS, "corpus", "*.py")))


def _rewritten_corpus():
    """Corpus files the default rewrite edits (a site or more, output not the input)."""
    pipeline = harness.pipeline()
    out = []
    for path in CORPUS:
        with open(path, "rb") as fh:
            data = fh.read()
        if data.endswith(b"\n") and pipeline.rewrite(path, data).output != data:
            out.append(path)
    return out


@pytest.mark.parametrize("path", _rewritten_corpus()[:12], ids=os.path.basename)
def test_a_file_without_its_last_newline_is_rewritten_as_with_it_less_that_newline(path):
    """The output and sites of the file less its last newline are those of the whole file, less
    that newline; and the rewrite took the partial modules' path (it parsed chunks), which a
    module without a trailing newline never could."""
    with open(path, "rb") as fh:
        data = fh.read()
    pipeline = harness.pipeline()
    before = partial.PARSED[0]
    whole = pipeline.rewrite(path, data)
    parsed_whole, before = partial.PARSED[0] - before, partial.PARSED[0]
    cut = pipeline.rewrite(path, data.rstrip(b"\n"))
    assert cut.report.error is None and whole.report.error is None
    assert cut.output == whole.output[:-1] and not cut.output.endswith(b"\n")
    assert [(s.transform, s.line, s.end_line, s.action, s.reason) for s in cut.report.sites] == \
        [(s.transform, s.line, s.end_line, s.action, s.reason) for s in whole.report.sites]
    assert partial.PARSED[0] - before == parsed_whole  # the same path: chunks where the whole file took them


def test_a_site_in_a_function_of_a_file_without_its_last_newline_parses_only_its_chunk():
    src = (b"import torch\n\n\ndef helper(xs):\n    return [x + 1 for x in xs]\n\n\n"
           b"def train(model, optimizer, loss):\n    loss.backward()\n    optimizer.step()\n\n\nx = 1")
    pipeline = harness.pipeline(["grad_clip"], options={"grad_clip": {"mode": "fixed"}})
    before = partial.PARSED[0]
    result = pipeline.rewrite("t.py", src)
    assert [s.line for s in result.report.sites] == [10] and result.output.endswith(b"\nx = 1")
    assert partial.PARSED[0] > before  # a partial module (a whole-module parse counts no chunk)


@pytest.mark.parametrize("text", [
    "x = 1",
    "def f():\n    return 1\n   ",  # a last line of blanks
    "import os\n# the end",  # a last comment line
    "\x0cdef f():\n    pass\n\x0cx = 1",  # form feeds too
    "x = 1;",
    "",
    "\n\n",
    "x = 1\\\n",  # ends in a continuation: Python's own error, as before
    "x = 1\r\ny = 2",  # carriage returns: left as they are
])
def test_restore_undoes_the_shape(text):
    shaped = Shaped(text)
    assert shaped.restore(shaped.code) == text
    assert shaped.code.endswith("\n") or not text or text.endswith("\\\n") or "\r" in text
    assert shaped.code.rstrip("\n") == text.rstrip("\n").replace("\x0c", "") if "\x0c" in text else True


@pytest.mark.parametrize("data, message", [
    (b"x = (1,", "t.py:1: SyntaxError: '(' was never closed"),
    (b"s = '''abc", "t.py:1: SyntaxError: unterminated triple-quoted string literal (detected at line 1)"),
    (b"def f(:", "t.py:1: SyntaxError: invalid syntax"),
])
def test_a_file_that_does_not_parse_gets_pythons_error_for_its_own_text(data, message):
    result = harness.pipeline().rewrite("t.py", data)
    assert result.report.error == message
    assert result.output == data


@pytest.mark.parametrize("data", [b"import torch\nx = 1", b"# only a comment", b"x = 1;", b"\n\n  "])
def test_a_file_with_no_site_is_left_byte_for_byte(data):
    result = harness.pipeline().rewrite("t.py", data)
    assert result.output == data and result.report.status == "unchanged"
