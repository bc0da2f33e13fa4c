"""The pipeline: bad input is reported in one line and never lost; transforms compose; sites map back."""
import ast
from typing import List, Tuple

import libcst as cst
import pytest

from scalebox_cst.config import Config
from scalebox_cst.pipeline import Pipeline
from scalebox_cst.report import EXACT, REWRITTEN, Site
from scalebox_cst.transforms import FileContext, Transform


class AddLineAfterImports(Transform):
    """Test transform: inserts ``X = 1`` statements at the top (shifts every later line)."""

    id = "test.insert"
    triggers = ("import",)

    def rewrite(self, ctx: FileContext) -> Tuple[cst.Module, List[Site]]:
        new = [cst.parse_statement("_INSERTED_A = 1\n"), cst.parse_statement("_INSERTED_B = 2\n")]
        return ctx.module.with_changes(body=[*new, *ctx.module.body]), []


class RenameCalls(Transform):
    """Test transform: renames calls to ``old()`` into ``new()`` and reports each as a site."""

    id = "test.rename"
    triggers = ("old(",)

    def rewrite(self, ctx: FileContext) -> Tuple[cst.Module, List[Site]]:
        sites: List[Site] = []

        class T(cst.CSTTransformer):
            def leave_Call(self, original, updated):
                if isinstance(original.func, cst.Name) and original.func.value == "old":
                    sites.append(ctx.site("test.rename", original, REWRITTEN, "old -> new", EXACT))
                    return updated.with_changes(func=cst.Name("new"))
                return updated

        return ctx.module.visit(T()), sites


class Exploding(Transform):
    id = "test.boom"

    def rewrite(self, ctx):
        raise RuntimeError("kaboom")


def run(src: bytes, *transforms: Transform, path: str = "t.py"):
    config = Config(transforms=["test.*"])
    return Pipeline(config, "cpu", transforms=list(transforms)).rewrite(path, src)


SRC = b"""import os
# a comment that must survive

def f():
    x = old(1)   # trailing comment
    return x


y = old(2)
"""


def test_comments_and_layout_preserved_outside_rewritten_spans():
    result = run(SRC, RenameCalls())
    assert result.output == SRC.replace(b"old(", b"new(")
    assert result.report.status == "rewritten"
    assert [s.line for s in result.report.sites] == [5, 9]


def test_sites_map_back_to_original_lines_after_an_earlier_transform_inserted_lines():
    result = run(SRC, AddLineAfterImports(), RenameCalls())
    assert b"_INSERTED_A = 1" in result.output
    assert [s.line for s in result.report.sites] == [5, 9]


def test_output_is_deterministic():
    outputs = {run(SRC, AddLineAfterImports(), RenameCalls()).output for _ in range(3)}
    assert len(outputs) == 1


def test_not_utf8_is_one_line_error_and_unchanged():
    data = b"x = 1\ny = '\xff'\n"
    result = run(data, RenameCalls())
    assert result.output == data
    assert result.report.status == "error" and result.bad_input
    assert result.report.error.startswith("t.py:2: not UTF-8")
    assert "\n" not in result.report.error


def test_syntax_error_is_one_line_with_line_number():
    data = b"def f(:\n    pass\n"
    result = run(data, RenameCalls(), path="pkg/mod.py")
    assert result.output == data
    assert result.report.error.startswith("pkg/mod.py:1: SyntaxError")
    assert "\n" not in result.report.error


def test_bom_is_kept_and_file_is_rewritten():
    data = b"\xef\xbb\xbfimport os\ny = old(2)\n"
    result = run(data, RenameCalls())
    assert result.output == b"\xef\xbb\xbfimport os\ny = new(2)\n"


def test_tab_plus_spaces_indentation_that_python_accepts_parses():
    data = b"if True:\n\t  x = old(1)\n"
    compile(data, "t.py", "exec")
    assert run(data, RenameCalls()).output == data.replace(b"old(", b"new(")


def test_a_transform_that_raises_leaves_the_file_unchanged_and_says_why():
    result = run(SRC, RenameCalls(), Exploding())
    assert result.output == SRC
    assert result.report.status == "error"
    assert "test.boom failed" in result.report.error and "kaboom" in result.report.error
    assert not result.bad_input


def test_trigger_text_gates_a_transform():
    calls = []

    class Spy(RenameCalls):
        def rewrite(self, ctx):
            calls.append(ctx.path)
            return super().rewrite(ctx)

    run(b"x = 1\n", Spy())
    assert calls == []


def test_disabled_transform_does_not_run():
    config = Config(transforms=["test.*"], disabled=["test.rename"])
    result = Pipeline(config, "cpu", transforms=[RenameCalls()]).rewrite("t.py", SRC)
    assert result.output == SRC and result.report.status == "unchanged"


@pytest.mark.parametrize("other", [b"", b"\n", b"# only a comment\n"])
def test_trivial_files(other):
    result = run(other, RenameCalls())
    assert result.output == other and result.report.status == "unchanged"


class QuotesLine(Transform):
    """Test transform: reports a site whose reason quotes a line number of the version it sees."""

    id = "test.quote"
    triggers = ("old(",)

    def rewrite(self, ctx):
        lines = sorted(n.lineno for n in ast.walk(ctx.tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "old")
        return None, [Site(self.id, n, n, "skipped", f"see line {ctx.original_line(n)}") for n in lines]


def test_line_numbers_quoted_in_reasons_refer_to_the_users_file():
    result = run(SRC, AddLineAfterImports(), QuotesLine())
    assert [(s.line, s.reason) for s in result.report.sites] == [(5, "see line 5"), (9, "see line 9")]
