"""A statement a transform puts deeper takes its backslash continuation lines along
(scalebox_cst/continuation.py): each keeps its column relative to the statement, whichever
transform moved it (vectorize.recurrence's rows, a guard's ``else``, a ``with`` or ``try``
around it); statements not moved, and string literals holding a backslash-newline, keep their
bytes."""
from __future__ import annotations

import io
import textwrap
import tokenize
from typing import List, Tuple

import libcst as cst
import pytest

from harness import compiled, rewrite
from scalebox_cst import continuation, fastcode
from scalebox_cst.emitted import Emitted
from scalebox_cst.transforms.analysis import cstparse
from scalebox_cst.transforms.examples import all_examples


def _continued(text: str) -> List[Tuple[int, int, str]]:
    """(indentation of the statement, of its continuation line, that line stripped) for each
    line a backslash continues (outside strings: tokenized)."""
    lines = text.splitlines(keepends=True)
    out, first, last = [], None, None
    layout = (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in layout:
            if tok.type == tokenize.NEWLINE:
                first = None
            last = tok.end
            continue
        if first is None:
            first = tok.start[0]
        if last is not None and tok.start[0] > last[0] and lines[last[0] - 1].rstrip("\r\n").endswith("\\"):
            head, line = lines[first - 1], lines[tok.start[0] - 1]
            out.append((len(head) - len(head.lstrip(" ")), len(line) - len(line.lstrip(" ")), line.strip()))
        last = tok.end
    return out


def _offsets(text: str) -> List[Tuple[int, str]]:
    return [(line - stmt, what) for stmt, line, what in _continued(text)]


RECURRENCE = '''\
import torch


def returns(rewards, masks, gamma, T):
    out = torch.zeros(T)
    R = 0
    for t in reversed(range(T)):
        R = rewards[t] + \\
            gamma * masks[t] * R
        out[t] = R
    return out
'''


def test_recurrence_writes_each_copy_of_the_body_with_its_continuation_line():
    out, sites = rewrite(RECURRENCE, "vectorize.recurrence", dedent=False)
    assert [s.action for s in sites] == ["rewritten"]
    found = _continued(out)
    assert len(found) == 3 and {line - stmt for stmt, line, _ in found} == {4}, out
    assert len({stmt for stmt, _, _ in found}) == 2  # at two depths: steps as written, the loops kept
    compiled(out, "t.py")


@pytest.mark.parametrize("statement, offsets", [
    ("        losses.append(-logp[i] * \\\n            adv[i])\n", [4]),
    # a line left of its statement (inside brackets): moved by as many columns
    ("        losses.append(-logp[i] * \\\n adv[i])\n", [-7]),
])
def test_a_guard_keeps_the_loop_in_its_else_branch_with_its_continuation_lines(statement, offsets):
    src = "import torch\ndef loss(logp, adv):\n    losses = []\n    for i in range(len(adv)):\n" + statement + \
        "    return torch.stack(losses).mean()\n"
    out, sites = rewrite(src, "vectorize.reduction", dedent=False)
    assert [s.action for s in sites] == ["rewritten"]
    kept = out[out.index("    else:\n"):]
    assert "            for i in range(len(adv)):\n" in kept or "        for i in range(len(adv)):\n" in kept
    assert [off for off, _ in _offsets(kept)] == offsets, out
    assert [stmt for stmt, _, _ in _continued(kept)] == [12]  # the statement moved one level
    compiled(out, "t.py")


def test_a_with_around_a_statement_takes_its_continuation_line():
    src = textwrap.dedent('''\
        import numpy as np
        import torch
        import torch.nn as nn
        from torch.distributions import Categorical
        class Policy(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)
            def forward(self, x):
                return torch.softmax(self.fc(x), dim=-1)
        def run(seed):
            policy = Policy()
            out = []
            obs = np.ones(4, dtype=np.float32)
            for t in range(5):
                probs = policy(torch.from_numpy(obs) \\
                    .float())
                a = Categorical(probs).sample().item()
                out.append(a)
                obs = obs * 0.5 + \\
                    a
            return out
        ''')
    out, sites = rewrite(src, "hot.no_grad", dedent=False)
    assert any(s.action == "rewritten" for s in sites)
    assert "        with torch.no_grad():\n            probs = policy(torch.from_numpy(obs) \\\n                .float())\n" in out
    assert "        obs = obs * 0.5 + \\\n            a\n" in out  # not moved: as it was
    assert [off for off, _ in _offsets(out)] == [4, 4]
    compiled(out, "t.py")


def test_a_try_around_a_loop_takes_its_continuation_lines_and_keeps_strings():
    case = next(c for c in all_examples() if c.id == "accelerate.defer_sync/an_update_function")
    body = "        loss = (x @ w).pow(2).mean()\n"
    assert body in case.example.code
    src = case.example.code.replace(body, "        loss = (x @ w).pow(2) \\\n            .mean()\n"
                                    "        tag = 'a \\\n    b' + \\\n  'c'\n")
    out, sites = rewrite(src, case.transform.id, case.example.backend, dedent=False, options=case.option_tables())
    assert sites and all(s.action == "rewritten" for s in sites)
    assert "    try:\n        for x in data:\n            loss = (x @ w).pow(2) \\\n                .mean()\n" in out
    # the string's own backslash-newline and the spaces after it are the string's
    assert "            tag = 'a \\\n    b' + \\\n      'c'\n" in out
    compiled(out, "t.py")


def test_statements_not_moved_keep_their_bytes():
    """Continuation lines at any column (left of the statement, tabs) and strings with a
    backslash-newline, in a file a transform rewrites elsewhere: those lines are as they were."""
    untouched = (
        "def keep(a, b):\n"
        "    x = a + \\\n"
        "b\n"
        "    if a and \\\n"
        "\t  b:\n"
        "        s = 'one \\\n"
        "  two' \\\n"
        "                    + 'three'\n"
        "        y = [a, \\\n"
        "   b]\n"
        "    return x, s, y\n"
    )
    src = "import torch\n" + untouched + RECURRENCE.split("import torch\n", 1)[1]
    out, sites = rewrite(src, dedent=False)
    assert any(s.action == "rewritten" for s in sites)
    assert untouched in out
    compiled(out, "t.py")


def _moved_into_if(code: str) -> cst.Module:
    """The module's first function with its body under ``if a:`` (one level deeper)."""
    module = cstparse.parse_module(code)
    func = module.body[0]
    block = cst.IndentedBlock(body=[cst.If(test=cst.Name("a"), body=func.body)])
    return module.with_changes(body=[func.with_changes(body=block), *module.body[1:]])


CODE = (
    "def f(a, b):\n"
    "    x = a + \\\n"
    "        b\n"
    "    for i in \\\n"
    "            range(3):\n"
    "        s = 'x\\\n    y' + \\\n  'z'\n"
    "    return x\n"
)


def test_libcst_and_fastcode_move_a_continuation_alike():
    module = _moved_into_if(CODE)
    code = module.code
    assert code == fastcode.code_for_node(module, module.body[0])
    assert code == (
        "def f(a, b):\n"
        "    if a:\n"
        "        x = a + \\\n"
        "            b\n"
        "        for i in \\\n"
        "                range(3):\n"
        "            s = 'x\\\n    y' + \\\n      'z'\n"
        "        return x\n"
    )
    # parsed where it stands: as written; an expression written alone: as parsed
    assert cstparse.parse_module(code).code == code
    x = module.body[0].body.body[0].body.body[0].body[0].value
    assert module.code_for_node(x) == fastcode.code_for_node(module, x) == "a + \\\n        b"


@pytest.mark.parametrize("line", ["        b", " b", "\tb"])
def test_emitted_rows_place_a_continuation_at_each_depth(line):
    """fastcode writes an Emitted node's statement once and places it at each depth; a line left
    of its statement (its column depends on the depth) is written at each depth."""
    module = cstparse.parse_module(f"def f(a, b):\n    x = a + \\\n{line}\n")
    stmt = module.body[0].body.body[0]
    node = Emitted(rows=((0, "if a:"), (1, stmt), (0, "else:"), (2, stmt), (0, stmt)))
    func = module.body[0]
    new = module.with_changes(body=[func.with_changes(body=func.body.with_changes(body=[node]))])
    code = new.code
    assert fastcode.code_for_node(new, new.body[0]) == code
    ws = line[:-1]
    for indent in ("        ", "            ", "    "):
        assert f"\n{indent}x = a + \\\n{continuation.moved(ws, '    ', indent)}b\n" in code
    assert code.count("x = a + ") == 3


@pytest.mark.parametrize("spaces, home, now, want", [
    ("        ", "    ", "        ", "            "),  # relative to the statement
    ("  ", "    ", "        ", "      "),  # left of it: by as many columns
    ("  ", "        ", "    ", ""),  # left of it, moved left: not past column 0
    ("\t\t", "\t", "\t\t", "\t\t\t"),  # tabs, lined up
    ("", "\t", "\t\t", ""),  # left of its statement, tabs: as it was
    ("\t  ", "    ", "        ", "\t  "),
    ("    ", "\t", "\t\t", "    "),
])
def test_moved(spaces, home, now, want):
    assert continuation.moved(spaces, home, now) == want


def test_text_without_a_backslash_newline_is_not_walked():
    module = cst.parse_module("x = 'a\\\\b'\n")
    assert continuation.tagged(module, "x = 'a\\\\b'\n") is module
