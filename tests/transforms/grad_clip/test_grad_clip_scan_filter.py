"""grad_clip's ModuleScan, given the code, walks for calls only the simple statements whose lines
spell a word a recognised call must spell; its events are the same as walking every statement
(on the corpus, the examples and calls spelled through aliases), and statements spelling none of
the words are not walked."""
from __future__ import annotations

import ast
import glob
import os

import pytest

from conftest import TESTS
from scalebox_cst.transforms.grad_clip import events
from scalebox_cst.transforms.names import ImportMap

ROOT = os.path.dirname(TESTS)


def _events(tree, imports, code=None):
    scan = events.ModuleScan(tree, imports, code)
    return [[(e.kind, e.call.lineno, e.call.col_offset, e.loc) for e in scope] for scope in scan.scopes], scan


def _same(code):
    tree = ast.parse(code)
    imports = ImportMap(tree)
    walked, plain = _events(tree, imports)
    filtered, scan = _events(tree, imports, code)
    assert filtered == walked
    assert (scan.scalers, scan.accelerators, scan.assigned) == (plain.scalers, plain.accelerators, plain.assigned)
    return filtered


_FILES = sorted(glob.glob(os.path.join(TESTS, "corpus", "*.py")) + glob.glob(os.path.join(ROOT, "examples", "**", "*.py"), recursive=True))


@pytest.mark.parametrize("path", _FILES, ids=lambda p: os.path.relpath(p, ROOT))
def test_the_same_events_as_walking_every_statement(path):
    with open(path, encoding="utf-8") as fh:
        _same(fh.read())


ALIASED = '''\
import torch
from torch.nn.utils import clip_grad_norm_ as cg
from torch.autograd import backward as bw
from scalebox_cst.runtime import grad_clip as gc_rt
import torch.nn.utils as U


def train(model, opt, scaler, loss):
    bw(loss)
    cg(model.parameters(), 1.0)
    U.clip_grad_value_(model.parameters(), 0.5)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    opt.step()
    total = loss.item() * 2
    if torch.isfinite(loss):
        opt.step()
'''


def test_calls_through_aliases_are_found():
    found = _same(ALIASED)
    kinds = [k for scope in found for k, *_ in scope]
    assert kinds == ["backward", "clip", "clip", "backward", "unscale", "step", "step"]


def test_statements_spelling_no_word_are_not_walked(monkeypatch):
    code = "def f(x):\n    y = g(x) + h(x)\n    return y\n"
    walked = []
    real = events.calls_in
    monkeypatch.setattr(events, "calls_in", lambda n: walked.append(n) or real(n))
    tree = ast.parse(code)
    events.ModuleScan(tree, ImportMap(tree), code)
    assert walked == []
    events.ModuleScan(tree, ImportMap(tree))
    assert len(walked) == 2
