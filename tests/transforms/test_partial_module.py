"""Partial libcst modules (transforms/partial.py, FileContext.module_for): a transform that edits a
few statements of a long file has libcst parse only the top-level statements holding them, and
the rewrite (bytes and sites) is the one the whole module gives. Parses are counted, not timed."""
import ast
import itertools
import os
import sys
from typing import List, Tuple

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from scalebox_cst.config import Config
import harness
from scalebox_cst.pipeline import _Codegen
from scalebox_cst.report import Site
from scalebox_cst.transforms import FileContext, Transform, partial
from scalebox_cst.transforms.analysis.statements import ast_statements

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import bench_scaling  # noqa: E402


def _rewrite(source: str, whole: bool = False, transforms=None):
    """The pipeline's result; ``whole``: as before partial modules (no file is ever split)."""
    pipeline = harness.pipeline([t.id for t in transforms] if transforms else None, "cpu", instances=transforms)
    if not whole:
        return pipeline.rewrite("gen.py", source.encode())
    real = partial.chunks
    partial.chunks = lambda code, tree: None
    try:
        return pipeline.rewrite("gen.py", source.encode())
    finally:
        partial.chunks = real


def _sites(result) -> List[Tuple]:
    return [(s.transform, s.line, s.end_line, s.action, s.reason) for s in result.report.sites]


def test_one_site_in_5k_lines_parses_only_its_function(parses):
    source = bench_scaling.make_source(5000, "one")
    result = _rewrite(source)
    assert any(s.action == "rewritten" for s in result.report.sites)
    # the docstring's chunk (the module header), the import and the GAE function; nothing else
    assert max(len(s) for s in parses) < 2000, [len(s) for s in parses]
    assert sum("def gae_0(" in s for s in parses) == 1
    assert sum("def helper_" in s for s in parses) == 0
    parses.clear()
    whole = _rewrite(source, whole=True)
    assert any(len(s) == len(source) for s in parses)  # the baseline did parse the whole file
    assert result.output == whole.output and _sites(result) == _sites(whole)


def test_sparse_sites_parse_only_their_statements_and_write_what_the_whole_module_does(parses):
    source = bench_scaling.make_source(2500, "sparse")
    result = _rewrite(source)
    parsed = sum(s.count("\n") for s in parses)
    site_lines = sum(s.end_line - s.line + 1 for s in result.report.sites)
    assert {s.transform for s in result.report.sites if s.action == "rewritten"} >= {
        "vectorize.recurrence", "vectorize.target_update", "vectorize.reduction", "grad_clip"}
    # each transform parses the functions holding its own candidates: a few times the sites' lines
    assert parsed < 6 * site_lines + 200 < len(source.splitlines()), (parsed, site_lines)
    whole = _rewrite(source, whole=True)
    assert result.output == whole.output and _sites(result) == _sites(whole)


def test_a_candidate_whose_scope_is_the_module_gets_the_whole_module(parses):
    # a reduction at the top level: names it binds may be read by any statement of the file
    plain = "".join(bench_scaling.PLAIN.format(i=i) for i in range(30))
    source = "import torch\n" + plain + "losses = []\nfor x in xs:\n    losses.append(x * 2)\ntotal = torch.stack(losses).sum()\n"
    result = _rewrite(source)
    assert any(s.transform == "vectorize.reduction" for s in result.report.sites)
    assert any(len(s) == len(source) for s in parses)
    whole = _rewrite(source, whole=True)
    assert result.output == whole.output and _sites(result) == _sites(whole)


_PIECES = [
    '"""Doc."""\nimport torch\n',
    "\n\n# a comment above\n@decorator(1)\n@other\ndef f(x):\n    return x\n",
    "a = 1; b = 2\n",
    "\nclass C:\n    def m(self):\n        pass\n    # indented comment after the body\n",
    "if __name__ == '__main__':\n    main()\n",
    "x = (1,\n     2)\n",
    "\n\ndef g():\n    '''Doc\n\n    string.'''\n    return [\n        1,\n    ]\n# the last comment\n\n",
]


def test_partial_modules_write_back_the_file_and_keep_its_positions():
    """Every subset of statements parsed: the codegen (fillers written as their chunks) gives the
    file back, and each parsed statement has the positions it has in the whole module."""
    code = "".join(_PIECES)
    tree = ast.parse(code)
    whole = cst.parse_module(code)
    whole_pos = MetadataWrapper(whole, unsafe_skip_copy=True).resolve(PositionProvider)
    ch = partial.chunks(code, tree)
    assert ch is not None and len(ch.tops) == len(whole.body)
    assert ch.imports == [1]  # always parsed: FileContext.finish adds only the imports not there
    for tops in ch.tops:  # what a filler stands for, as CstStatements and grad_clip count
        assert partial._count(tops) == len(ast_statements(tops)[0])
    for size in range(len(ch.tops) + 1):
        for groups in itertools.combinations(range(len(ch.tops)), size):
            built = partial.build(ch, groups)
            assert built is not None and built.real == {0, *groups, *ch.imports}
            module = built.module
            assert len(module.body) == len(whole.body)
            assert _Codegen().code(module, seed=built.texts) == code
            assert module.code.count("\n") == code.count("\n")
            pos = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
            for g in built.real:
                assert pos[module.body[g]] == whole_pos[whole.body[g]], g
                assert module.code_for_node(module.body[g]) == whole.code_for_node(whole.body[g])
            for node, text in built.sources.values():  # what the codegen takes as already generated
                assert module.code_for_node(node) == text
            assert {id(n) for n, _ in built.sources.values()} <= {id(module.body[g]) for g in built.real}


def _statement_positions_agree(code):
    """statement_positions of every single statement and of all of them: the whole module's
    positions of each of their nodes (or None, never a wrong line). Returns how many were placed."""
    whole = cst.parse_module(code)
    whole_pos = MetadataWrapper(whole, unsafe_skip_copy=True).resolve(PositionProvider)
    ch = partial.chunks(code, ast.parse(code))
    assert ch is not None and len(ch.tops) == len(whole.body)
    placed = 0
    for groups in [[g] for g in range(len(ch.tops))] + [list(range(len(ch.tops)))]:
        found = partial.statement_positions(whole, ch, groups)
        if found is None:
            continue
        placed += 1
        inside = set()
        for g in groups:
            stack = [whole.body[g]]
            while stack:
                node = stack.pop()
                inside.add(node)
                stack.extend(node.children)
        assert set(found) == inside & set(whole_pos)
        for node, where in found.items():
            assert where == whole_pos[node], (groups, node)
    return placed


def test_statement_positions_are_the_whole_modules():
    """Decorators, header comments, ``a; b``, indented comments after a body, a last comment:
    each statement positioned alone and moved to its lines has the whole module's positions."""
    code = "".join(_PIECES)
    assert _statement_positions_agree(code) == len(partial.chunks(code, ast.parse(code)).tops) + 1


def _split_corpus():
    """The corpus files the partial parser splits into chunks (the others hold one statement)."""
    found = []
    for path in sorted(__import__("glob").glob(os.path.join(os.path.dirname(__file__), "..", "corpus", "*.py"))):
        with open(path, encoding="utf-8") as fh:
            code = fh.read()
        ch = partial.chunks(code, ast.parse(code))
        if ch is not None and partial.build(ch, range(len(ch.tops))) is not None:
            found.append(path)
    return found


SPLIT_CORPUS = _split_corpus()


def test_most_of_the_corpus_is_split():
    assert len(SPLIT_CORPUS) >= 40


@pytest.mark.parametrize("path", SPLIT_CORPUS)
def test_statement_positions_on_the_corpus(path):
    with open(path, encoding="utf-8") as fh:
        assert _statement_positions_agree(fh.read()) > 0


@pytest.mark.parametrize("path", SPLIT_CORPUS)
def test_a_parsed_statement_is_known_to_print_its_chunk(path):
    """Partial.sources: the code of each parsed statement it holds is its chunk's text (the
    codegen takes it without generating it); the first and last statement hold it only where the
    chunk's module has no header or footer lines besides the statement."""
    with open(path, encoding="utf-8") as fh:
        code = fh.read()
    ch = partial.chunks(code, ast.parse(code))
    built = partial.build(ch, range(len(ch.tops)))
    assert built is not None
    assert len(built.sources) >= len(ch.tops) - 2
    for node, text in built.sources.values():
        assert built.module.code_for_node(node) == text
    # carried into the next build: the same statements keep their texts
    again = partial.build(ch, [], carried=built)
    assert again is not None and {k: v[1] for k, v in again.sources.items()} == {k: v[1] for k, v in built.sources.items()}


@pytest.mark.parametrize("code", [
    "def f():\n  return 1\n",  # two-space indent: blocks would carry libcst's default
    "def f():\r\n    return 1\r\n",  # \r\n newlines
    "def f():\n    return 1",  # no trailing newline
    "x = '" + partial.MARK + "'\ndef f():\n    return 1\n",  # spells the filler mark
])
def test_files_libcst_would_parse_differently_in_pieces_are_not_split(code):
    tree = ast.parse(code)
    ch = partial.chunks(code, tree)
    assert ch is None or partial.build(ch, {len(ch.tops) - 1}) is None


class _DropStrings(Transform):
    """Test transform: asks for one function, then drops every top-level string statement (the
    fillers among them): the pipeline must notice and redo it on the whole module."""

    id = "test.drop_strings"

    def rewrite(self, ctx: FileContext) -> Tuple[cst.Module, List[Site]]:
        module = ctx.module_for([ctx.tree.body[-1].body[0]])
        body = [
            s for s in module.body
            if not (isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Expr)
                    and isinstance(s.body[0].value, cst.SimpleString))
        ]
        return module.with_changes(body=body), []


def test_a_transform_that_drops_fillers_is_redone_on_the_whole_module():
    code = '"""Doc."""\n' + "".join(bench_scaling.PLAIN.format(i=i) for i in range(5)) + "'a string'\ndef last():\n    return 1\n"
    result = _rewrite(code, transforms=[_DropStrings()])
    assert result.report.error is None
    # the whole module has one string statement besides the docstring: only it goes
    assert result.output.decode() == code.replace("\n\n'a string'\n", "").replace('"""Doc."""\n', "")
    assert _rewrite(code, whole=True, transforms=[_DropStrings()]).output == result.output


def test_rewrite_prints_rate_limited_progress_on_stderr(tmp_path, monkeypatch):
    """``scalebox rewrite`` of a file with many backward loops says how far it is, on stderr,
    at most once per PROGRESS_EVERY (issue 19 item 13: 2,500 loops, 240 s without a word)."""
    from click.testing import CliRunner

    import scalebox_cst.pipeline as pipeline_module
    from scalebox_cst.cli import cli

    (tmp_path / "loops.py").write_text(bench_scaling.make_source(200, "loops"))
    monkeypatch.setattr(pipeline_module, "PROGRESS_AFTER", 0.0)
    monkeypatch.setattr(pipeline_module, "PROGRESS_EVERY", 0.0)
    result = CliRunner().invoke(cli, ["rewrite", str(tmp_path), "--project", str(tmp_path), "--backend", "cpu"])
    assert result.exit_code == 0, result.output
    steps = [line for line in result.stderr.splitlines() if "backward loops after" in line]
    assert len(steps) >= 20 and steps[0].startswith("scalebox: loops.py: ")
    assert "backward loops" not in result.stdout
    monkeypatch.setattr(pipeline_module, "PROGRESS_EVERY", 3600.0)
    again = tmp_path / "again"  # a project of its own: the first one's store has this rewrite
    again.mkdir()
    (again / "loops.py").write_text(bench_scaling.make_source(200, "loops"))
    result = CliRunner().invoke(cli, ["rewrite", str(again), "--project", str(again), "--backend", "cpu"])
    assert result.exit_code == 0, result.output
    assert not [line for line in result.stderr.splitlines() if "backward loops after" in line]
    assert "vectorize.recurrence done after" in result.stderr  # one line per transform still
