"""The recurrence family's stages, each called on its own from a parsed loop (a newcomer's entry
point), and what each hands on frozen.

Header (:mod:`.headers`) -> :func:`.analysis.analyse` -> :class:`.analysis.Analysis` ->
:func:`.plan.plan` -> :class:`.plan.Plan` -> :func:`.build.build` (the rewritten statement). Why
the tests: the stages used to be one ``Planner`` whose five mixins shared ~35 attributes through
``self``; a later stage writing into an earlier one's result would bring that back, so every
result must refuse assignment and the plan must leave the analysis as it found it.
"""
from __future__ import annotations

import ast
import dataclasses

import libcst as cst
import pytest

from scalebox_cst.config import Config
from scalebox_cst.report import REWRITTEN
from scalebox_cst.transforms.analysis.shape import structure_key
from scalebox_cst.transforms.base import FileContext
from scalebox_cst.transforms.vectorize.recurrence.analysis import Analysis, analyse
from scalebox_cst.transforms.vectorize.recurrence.body import FrozenItem
from scalebox_cst.transforms.vectorize.recurrence.build import build
from scalebox_cst.transforms.vectorize.recurrence.headers import _backward_header
from scalebox_cst.transforms.vectorize.recurrence.plan import Plan, plan
from scalebox_cst.transforms.vectorize.recurrence.syntax import Skip
import harness

GAE = """\
import numpy as np
def gae(rewards, values, dones, last_value, gamma, lam, adv):
    last = 0.0
    for t in reversed(range(len(rewards))):
        nv = last_value if t == len(rewards) - 1 else values[t + 1]
        delta = rewards[t] + gamma * nv * (1.0 - dones[t]) - values[t]
        last = delta + gamma * lam * (1.0 - dones[t]) * last
        adv[t] = last
    return adv
"""

#: a carried value through memory, a read-back from a list and an episode reset: the results the
#: analysis rewrites its items for
MEMORY = """\
def returns(rewards, masks, gamma, out):
    for t in reversed(range(len(rewards))):
        out[t] = rewards[t] + gamma * out[t + 1] * masks[t]
"""
LIST = """\
def adv_of(deltas, gamma):
    adv = [deltas[-1]]
    for t in reversed(range(len(deltas) - 1)):
        adv.append(deltas[t] + gamma * adv[-1])
    return adv
"""
RESET = """\
def ret(rewards, dones, gamma, out):
    r = 0.0
    for t in reversed(range(len(rewards))):
        if dones[t]:
            r = 0.0
        r = rewards[t] + gamma * r
        out[t] = r
"""


def parsed(src: str):
    """(ctx, loop, header) for the first backward loop of ``src``, as the transform finds them."""
    ctx = FileContext("t.py", None, Config(), "cpu", code=src, tree=ast.parse(src))
    loop = next(n for n in _walk(ctx.module) if isinstance(n, cst.For))
    header = _backward_header(loop, set())
    assert header is not None
    return ctx, loop, header


def _walk(node: cst.CSTNode):
    yield node
    for child in node.children:
        yield from _walk(child)


def stages(src: str):
    ctx, loop, header = parsed(src)
    a = analyse(ctx, loop, header)
    p = plan(ctx, a, fold_last=False, reassociate=True, cpu=True, helpers="H", op="OP")
    return ctx, loop, a, p


def test_each_stage_runs_on_its_own():
    ctx, loop, header = parsed(GAE)
    assert header.kind == "index" and header.index == "t"
    a = analyse(ctx, loop, header)
    assert isinstance(a, Analysis)
    assert a.flow.rec_vars == ("last",) and a.has_split is False
    assert [it.var for it in a.middle] == ["nv", "delta", "last", None]  # None: adv[t] = last
    p = plan(ctx, a, fold_last=False, reassociate=True, cpu=True, helpers="H", op="OP")
    assert isinstance(p, Plan) and p.exact and not p.folded
    assert p.guard == f"{p.guard_head} and {p.guard_ok}"
    assert p.guard_head.startswith(f"({p.T} := H.steps(len(rewards))) >= 2")
    assert p.guard_ok.startswith(f"H.recurrence_ok({p.T}, seqs=(") and "cpu=True" in p.guard_ok
    assert any(line.startswith("last_seq, last_last = OP(") for line in p.lines)
    assert p.carry is not None and p.carry.startswith("H.carry_ok((last,)")
    assert set(p.tables.vec_names) == {structure_key(cst.parse_expression(x)) for x in ("rewards", "values", "dones")}
    # the emission stage, on a fresh parse (the plan above reserved its names in that ctx)
    ctx, loop, header = parsed(GAE)
    new, exact, reason = build(ctx, loop, analyse(ctx, loop, header))
    assert exact and reason.startswith("backward linear recurrence `last = ")
    # the statement it writes (rows of text: scalebox_cst.emitted) is an `if`
    written = cst.parse_statement(cst.Module(body=[new]).code)
    assert isinstance(written, cst.If)
    # the stages are what the transform runs: its rewrite of the file holds this statement
    out, sites = harness.rewrite(GAE, "vectorize.recurrence", dedent=False)
    assert [s.action for s in sites] == [REWRITTEN] and sites[0].reason == reason
    assert any(n.deep_equals(written) for n in _walk(cst.parse_module(out)) if isinstance(n, cst.If))


@pytest.mark.parametrize("src", [GAE, MEMORY, LIST, RESET])
def test_stage_results_are_frozen(src):
    ctx, loop, a, p = stages(src)
    for result in (a, a.flow, a.lists, a.reads, p, p.tables):
        field = dataclasses.fields(result)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(result, field, getattr(result, field))
    for items in (a.items, a.middle, a.dropped, a.readbacks):
        assert isinstance(items, tuple) and all(isinstance(it, FrozenItem) for it in items)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.middle[0].value = None  # type: ignore[misc]
    for table in (a.memo, a.memo_src, a.forwarded, a.flow.assign_of, a.flow.shift, a.flow.resets,
                  a.lists.carried, p.tables.seqs, p.tables.vec_names, p.tables.conds):
        with pytest.raises(TypeError):
            table["x"] = None  # type: ignore[index]
    assert isinstance(p.lines, tuple) and isinstance(p.notes, tuple) and isinstance(a.body_assigned, frozenset)


def test_what_each_example_needed_is_in_the_results():
    """Each example exercises the part of the analysis it names (else the frozen checks above
    would test empty tables)."""
    _, _, a, p = stages(MEMORY)
    assert list(a.memo) == ["out_next"] and "carried through memory" in p.notes[0] and p.carry is None
    _, _, a, p = stages(LIST)
    assert list(a.lists.carried) == ["adv_last"] and p.lines[0] == "adv_last = adv[-1]"
    assert "carried through the list `adv`" in p.notes[0]
    _, _, a, p = stages(RESET)
    assert list(a.flow.resets) == ["r"] and p.tables.conds and "H.reset_linear_recurrence(" in "\n".join(p.lines)


def test_shared_items_stay_shared_once_frozen():
    """An item reached from two results (the top level and the middle steps, the reset table) is
    one object after freezing, as it was before: later stages compare items by identity."""
    _, _, a, _ = stages(RESET)
    by_id = {id(it) for it in a.items}
    assert all(id(it) in by_id for it in a.middle if it.kind != "split")
    assert a.flow.resets["r"] in a.middle and a.flow.assign_of["r"] in a.middle


@pytest.mark.parametrize("src", [GAE, MEMORY, LIST, RESET])
def test_planning_leaves_the_analysis_as_it_was(src):
    ctx, loop, a, p = stages(src)
    before = [(it.kind, it.var, None if it.value is None else structure_key(it.value)) for it in a.middle]
    again = plan(ctx, a, fold_last=True, reassociate=True, cpu=False, helpers="H", op="OP")
    assert [(it.kind, it.var, None if it.value is None else structure_key(it.value)) for it in a.middle] == before
    # a second plan is the same plan under fresh names (nothing of the first one leaked into it)
    assert again.T != p.T and len(again.lines) == len(p.lines) and again.cpu is False


def test_the_analysis_stage_says_why_on_its_own():
    src = "for t in reversed(range(n)):\n    s = x[t] + g * s\nelse:\n    pass\n"
    ctx, loop, header = parsed(src)
    with pytest.raises(Skip, match="`else:` clause"):
        analyse(ctx, loop, header)
    ctx, loop, header = parsed("for t in reversed(range(n)):\n    s = x[t] * s * s\n")
    a = analyse(ctx, loop, header)  # the analysis takes it; the plan says the update is not affine
    with pytest.raises(Skip, match="non-affinely"):
        plan(ctx, a, fold_last=False, reassociate=True, cpu=True, helpers="H", op="OP")


def test_header_and_views_are_frozen():
    """The first stage's results: the header and the time-major views (``x[:, t]``) the analysis reads."""
    from scalebox_cst.transforms.vectorize.recurrence.views import _time_views

    src = ("def f(r, out, g):\n    s = 0.0\n    for t in reversed(range(r.shape[1])):\n"
           "        s = r[:, t] + g * s\n        out[:, t] = s\n")
    ctx, loop, header = parsed(src)
    viewed = _time_views(ctx, loop, header)
    assert viewed is not None
    node, views = viewed
    by_code = {v.code: v for v in views}
    assert sorted(by_code) == ["out", "r"] and dict(by_code["r"].texts) == {f"{by_code['r'].name}[t]": "r[:, t]"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        header.index = "u"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        views[0].name = "v"  # type: ignore[misc]
    with pytest.raises(TypeError):
        views[0].texts["x"] = "y"  # type: ignore[index]
    assert isinstance(header.elements, tuple)
    a = analyse(ctx, node, header, views)
    assert a.views == tuple(views) and a.flow.rec_vars == ("s",)
