"""scalebox_cst.emitted: a rewritten recurrence loop written as rows of text writes, byte for byte,
what the libcst tree it replaces wrote (vectorize.recurrence's ``_tree``); rows that a parse would
write otherwise are refused (the tree is built then); and a later transform that edits the same
function reads it parsed again, never the rows."""
from __future__ import annotations

import ast
import glob
import os
import textwrap

import libcst as cst
import pytest

from harness import compiled, rewrite_result, run_pair, spy
from scalebox_cst import emitted, fastcode
from scalebox_cst.emitted import Emitted
from scalebox_cst.transforms.analysis import cstparse
from scalebox_cst.transforms.vectorize.recurrence import build as recurrence_build

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GAE = '''
import torch


def gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda, num_steps):
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    # the backward pass
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]  # the step after
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages


def returns(rewards, masks, gamma, R):
    out = torch.zeros_like(rewards)
    for step in reversed(range(rewards.size(0))):
        R = rewards[step] + gamma * R * masks[step]
        out[step] = R
    return out, R


class Buffer:
    def compute(self, gamma):
        ret = self.last
        for i in reversed(range(self.T)):
            ret = self.rewards[i] + gamma * ret * self.masks[i]
            self.returns[i] = ret
        return ret
'''

#: the same function edited by a later transform (vectorize.reduction: the list of losses)
SHARED = '''
import torch


def update(rewards, values, log_probs, masks, gamma, T):
    returns = torch.zeros_like(rewards)
    R = values[-1]
    for t in reversed(range(T)):
        R = rewards[t] + gamma * R * masks[t]
        returns[t] = R
    losses = []
    for lp, ret in zip(log_probs, returns):
        losses.append(-lp * ret)
    return torch.stack(losses).sum(), returns
'''

#: a backward loop at module level: its scope is the module, so it is edited on the whole module
MODULE_LEVEL = '''
import torch
rewards, masks, gamma = torch.rand(9), torch.ones(9), 0.9
out = torch.zeros(9)
R = torch.tensor(0.0)
for t in reversed(range(9)):
    R = rewards[t] + gamma * R * masks[t]
    out[t] = R
losses = []
for x, y in zip(out, rewards):
    losses.append(x * y)
total = torch.stack(losses).sum()
'''

#: SHARED with backslash continuations, one left of its statement: the rows and the tree place
#: them alike, moved with their statements (scalebox_cst/continuation.py)
CONTINUED = '''
import torch


def update(rewards, values, log_probs, masks, gamma, T):
    returns = torch.zeros_like(rewards)
    R = values[-1]
    for t in reversed(range(T)):
        R = rewards[t] + \\
            gamma * R * masks[t]
        returns[t] = \\
R
    losses = []
    for lp, ret in zip(log_probs, returns):
        losses.append(-lp * \\
            ret)
    return torch.stack(losses).sum(), returns
'''


def _indented(src: str, unit: str) -> str:
    """``src`` (four spaces a level) with ``unit`` a level."""
    lines = []
    for line in src.splitlines(keepends=True):
        body = line.lstrip(" ")
        lines.append(unit * ((len(line) - len(body)) // 4) + body)
    return "".join(lines)


def _both(src: str, monkeypatch) -> tuple:
    """(rewrite's result with text rows, with the tree, the rows each site got)."""
    with spy(recurrence_build, "_rows") as written:
        fast = rewrite_result(src)
    with monkeypatch.context() as m:
        m.setattr(recurrence_build, "_rows", lambda *a, **k: None)
        slow = rewrite_result(src)
    return fast, slow, written


def _corpus():
    paths = sorted(glob.glob(os.path.join(ROOT, "tests", "corpus", "*.py"))) + \
        sorted(glob.glob(os.path.join(ROOT, "examples", "**", "*.py"), recursive=True))
    return [p for p in paths if "reversed(" in open(p, encoding="utf-8").read() or "-1, -1" in open(p, encoding="utf-8").read()]


@pytest.mark.parametrize("path", _corpus(), ids=lambda p: os.path.relpath(p, ROOT))
def test_rows_write_what_the_tree_writes_on_the_corpus(path, monkeypatch):
    with open(path, "rb") as f:
        src = f.read()
    fast, slow, _ = _both(src, monkeypatch)
    assert fast.output == slow.output
    assert [(s.line, s.reason) for s in fast.report.sites] == [(s.line, s.reason) for s in slow.report.sites]


@pytest.mark.parametrize("unit", ["    ", "  ", "\t", "   "])
@pytest.mark.parametrize("src", [GAE, SHARED, MODULE_LEVEL, CONTINUED], ids=["functions", "shared", "module_level", "continued"])
def test_rows_write_what_the_tree_writes_under_any_indent(src, unit, monkeypatch):
    text = _indented(textwrap.dedent(src), unit)
    fast, slow, written = _both(text, monkeypatch)
    assert fast.report.error is None and slow.report.error is None
    assert fast.output != text.encode()
    assert any(w is not None for w in written), "no site was written as rows"
    assert fast.output == slow.output
    compiled(fast.output.decode(), "t.py")


def test_a_later_transform_edits_a_function_written_as_rows(monkeypatch):
    """vectorize.reduction rewrites the list of losses in the function vectorize.recurrence wrote
    as rows: it reads that function parsed again from the new text."""
    fast, slow, written = _both(textwrap.dedent(SHARED), monkeypatch)
    edited = {s.transform for s in fast.report.sites if s.action == "rewritten"}
    assert {"vectorize.recurrence", "vectorize.reduction"} <= edited
    assert fast.output == slow.output
    import torch
    env = {"torch": torch, "rewards": torch.rand(7), "values": torch.rand(7), "log_probs": torch.rand(7),
           "masks": (torch.rand(7) > 0.3).float(), "gamma": 0.95, "T": 7}
    call = "\nloss, ret = update(rewards, values, log_probs, masks, gamma, T)\n"
    a, b = run_pair(textwrap.dedent(SHARED) + call, fast.output.decode() + call, env)
    assert torch.equal(a["ret"], b["ret"]) and torch.equal(a["loss"], b["loss"])


def test_a_line_spanning_lines_builds_the_tree():
    """The loop's length spelled over two lines: the guard holds a line break, so the rows are
    refused and the tree is built (and runs as the loop does)."""
    src = textwrap.dedent('''
        import torch


        def returns(rewards, masks, gamma, R):
            out = torch.zeros_like(rewards)
            for t in reversed(range(len(
                    rewards))):
                R = rewards[t] + gamma * R * masks[t]
                out[t] = R
            return out
    ''')
    with spy(recurrence_build, "_rows") as written:
        result = rewrite_result(src)
    sites = [s for s in result.report.sites if s.transform == "vectorize.recurrence"]
    assert [s.action for s in sites] == ["rewritten"]
    assert written == [None]
    import torch
    env = {"torch": torch, "rewards": torch.rand(6), "masks": torch.ones(6), "gamma": 0.5, "R": torch.tensor(0.0)}
    call = "\nout = returns(rewards, masks, gamma, R)\n"
    a, b = run_pair(src + call, result.output.decode() + call, env)
    assert torch.equal(a["out"], b["out"])


@pytest.mark.parametrize("lines", [
    ["x = f(a,\n      b)"],  # one row, two lines
    ["x = 1", ""],  # a blank line
    ["  x = 1"],  # half a level
    ["\tx = 1"],
    ["x = 1 + \\"],  # a continuation
    ["x = 1 "],  # trailing blank space: the parse keeps it elsewhere
    ["x = 1", "# a comment nothing follows"],
])
def test_rows_refuse_what_a_parse_would_write_otherwise(lines):
    assert emitted.rows(lines, 1) is None


def test_rows_keep_levels_and_comments_that_a_statement_follows():
    assert emitted.rows(["# first", "if a:", "    # inner", "    b = 1", "c = 2"], 2) == [
        (2, "# first"), (2, "if a:"), (3, "# inner"), (3, "b = 1"), (2, "c = 2")]
    assert emitted.shifted([(1, "x = 1")], 2) == [(3, "x = 1")]


@pytest.mark.parametrize("unit", ["    ", "\t"])
def test_libcst_and_fastcode_write_an_emitted_node_alike(unit):
    module = cst.parse_module(f"def f(a):\n{unit}if a:\n{unit}{unit}a = (1 +\n{unit}{unit}     2)\n{unit}return a\n")
    func = module.body[0]
    inner = func.body.body[0]
    node = Emitted(rows=[(0, "if g(a):"), (1, "# as written"), (1, inner), (0, "else:"), (1, "pass")],
                   leading_lines=[cst.EmptyLine(comment=cst.Comment("# above"))])
    new = module.with_changes(body=[func.with_changes(body=func.body.with_changes(body=[node, func.body.body[1]]))])
    code = new.code
    assert code == fastcode.code_for_node(new, new.body[0])
    assert code == (f"def f(a):\n{unit}# above\n{unit}if g(a):\n{unit}{unit}# as written\n{unit}{unit}if a:\n"
                    f"{unit}{unit}{unit}a = (1 +\n{unit}{unit}{unit}     2)\n{unit}else:\n{unit}{unit}pass\n{unit}return a\n")
    ast.parse(code)
    assert new.visit(cst.CSTTransformer()).code == code  # a visit goes through it


def _emitted_in(node: cst.CSTNode) -> int:
    found = [0]

    class Count(cst.CSTVisitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            found[0] += isinstance(n, Emitted)
            return True

    node.visit(Count())
    return found[0]


@pytest.mark.parametrize("unit", ["    ", "  ", "\t"])
@pytest.mark.parametrize("src", [GAE, SHARED, MODULE_LEVEL, CONTINUED], ids=["functions", "shared", "module_level", "continued"])
def test_realized_statements_are_trees_of_the_same_code(src, unit):
    """What a later transform reads in place of rows: the parse of their code, written alike."""
    from scalebox_cst.config import Config
    from scalebox_cst.transforms import FileContext
    from scalebox_cst.transforms.vectorize.recurrence.transform import VectorizeRecurrence

    text = _indented(textwrap.dedent(src), unit)
    ctx = FileContext("t.py", None, Config(), "cpu", code=text, tree=ast.parse(text))
    new, sites = VectorizeRecurrence().rewrite(ctx)
    assert new is not None and ctx.wrote_text and _emitted_in(new) > 0
    every = frozenset(id(s) for s in new.body)
    real = emitted.realized_module(new, every)
    assert _emitted_in(real) == 0
    assert real.code == new.code
    # each realized statement is what a parse of the code gives (structure and layout alike)
    reparsed = cstparse.parse_module(new.code)  # (the rewrite's parse: continuations know their statement)
    for mine, theirs in zip(real.body, reparsed.body):
        assert mine.deep_equals(theirs)
    assert emitted.realized_module(reparsed, frozenset(id(s) for s in reparsed.body)) is reparsed  # nothing to do
