"""Why a guard sent a rewritten site to the code as written (runtime/guard_reasons.py), as the
run's sites.json, its end line, ``log``, ``profile`` and the monitor say it
(scalebox_cst/site_counts.py). ``guards 53%`` with no reason told a user nothing they could act
on, and two of the counts behind it were wrong: a guard calling two entry helpers counted each
evaluation twice, and an unswitched loop's ``steps(T) <= 0`` test was a site of its own that fell
back every time."""
from conftest import scalebox
import glob
import json
import textwrap
from collections import deque

import numpy as np
import pytest
import torch

from scalebox_cst import site_counts
from scalebox_cst.runtime import guard_reasons, target_update
from scalebox_cst.runtime.loop_batch import batch_zip
from scalebox_cst.runtime.scatter import scatter_add_rows
from scalebox_cst.runtime.vectorized import quadratic_ok, recurrence_ok


def _why(result):
    """The guard's result (which must be a refusal) and the reason it noted."""
    assert result is False or result is None
    return guard_reasons.take()


T32 = torch.zeros(64)
REFUSALS = [
    ("one step", lambda: recurrence_ok(1, seqs=((T32, 0),), outs=(torch.zeros(64),)), "fewer than 2 steps"),
    ("float16", lambda: recurrence_ok(64, seqs=((torch.zeros(64).half(), 0),)), "dtype float16"),
    ("short list of floats", lambda: recurrence_ok(100, seqs=(([0.5] * 100, 0),), scalars=(0.9,), lists=([],)),
     "fewer than 1024 steps of Python floats"),
    ("array next to a tensor", lambda: recurrence_ok(64, seqs=((T32, 0), (np.zeros(64), 0))), "mixed kinds"),
    ("list of floats next to float32", lambda: recurrence_ok(64, seqs=((T32, 0), (torch.zeros(64).tolist(), 0))),
     "Python numbers next to float32"),
    ("too short", lambda: recurrence_ok(64, seqs=((torch.zeros(10), 0),)), "shorter than the loop's steps"),
    ("aliased output", lambda: recurrence_ok(64, seqs=((T32, 0),), outs=(T32,)), "shares memory"),
    ("two dtypes", lambda: recurrence_ok(64, seqs=((T32, 0), (torch.zeros(64, dtype=torch.float64), 0)),
                                         outs=(torch.zeros(64),)), "different dtypes"),
    ("grad constant", lambda: recurrence_ok(64, seqs=((T32, 0),), consts=(torch.ones(1, requires_grad=True),)),
     "loop-invariant tensor requires grad"),
    ("deque", lambda: recurrence_ok(64, seqs=((T32, 0),), deques=([],)), "not a collections.deque"),
    ("quadratic big int", lambda: quadratic_ok(64, seqs=((T32, 0),), scalars=(3,)), "other than -1, 0 or 1"),
    ("rows of two shapes", lambda: batch_zip([[torch.zeros(1), torch.zeros(2)]]), "different dtypes, shapes or devices"),
    ("zip of two lengths", lambda: batch_zip([torch.zeros(3), torch.zeros(4)]), "different lengths"),
    ("soft update, no modules", lambda: target_update.soft_update(1, 2, 0.5, 0.5), "not torch modules"),
    ("soft update, tensor coefficient", lambda: target_update.soft_update(
        torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.ones(3), 0.5), "coefficient"),
    ("scatter, float16 out", lambda: scatter_add_rows(None, torch.zeros(2, 3).half(), torch.zeros(2, 1, dtype=torch.int64),
                                                      torch.zeros(2, 1).half(), 0), "float16"),
]


@pytest.mark.parametrize("case, call, said", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_each_refusal_says_why(case, call, said):
    guard_reasons.take()
    why = _why(call())
    assert why is not None and said in why, why
    assert guard_reasons.take() is None  # taken once


def test_a_pass_notes_nothing_and_a_deque_is_accepted():
    guard_reasons.take()
    assert recurrence_ok(64, seqs=((T32, 0),), outs=(torch.zeros(64),)) is True
    assert recurrence_ok(64, seqs=((T32, 0),), deques=(deque(),)) is True
    assert guard_reasons.take() is None


def test_tensors_off_the_cpu_are_named_where_the_site_is_exact_only_there():
    meta = torch.zeros(64, device="meta")
    guard_reasons.take()
    assert recurrence_ok(64, seqs=((meta, 0),), cpu=True) is False
    assert "off the CPU" in guard_reasons.take()
    np_row = np.zeros(64)
    assert recurrence_ok(64, seqs=((np_row, 0),), cpu=True) is True  # no tensor: nothing off the CPU


PROJECT = """
import torch

def gae_half(rewards, values, dones, gamma=0.99, lam=0.95):
    T = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(T)):
        if t == T - 1:
            nextvalues = 0.0
        else:
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * (1.0 - dones[t]) - values[t]
        advantages[t] = lastgaelam = delta + gamma * lam * (1.0 - dones[t]) * lastgaelam
    return advantages

def returns_listed(rewards, masks, gamma, T):
    steps = list(range(T - 1, -1, -1))
    out = torch.zeros_like(rewards)
    R = 0.0
    for t in steps:
        R = rewards[t] + gamma * R * masks[t] + T * 0
        out[t] = R
    return out

def returns_switch(rewards, masks, gamma, use_mask):
    T = len(rewards)
    out = torch.zeros_like(rewards)
    R = 0.0
    for t in reversed(range(T)):
        if use_mask:
            R = rewards[t] + gamma * R * masks[t]
        else:
            R = rewards[t] + gamma * R
        out[t] = R
    return out

for _ in range(3):
    gae_half(torch.randn(100).half(), torch.randn(100).half(), torch.zeros(100).half())
for _ in range(2):
    gae_half(torch.randn(1), torch.randn(1), torch.zeros(1))
for _ in range(4):
    returns_listed(torch.randn(50), torch.ones(50), 0.99, 50)
for _ in range(5):
    returns_switch(torch.randn(50), torch.ones(50), 0.99, True)
returns_switch(torch.randn(50), torch.ones(50), 0.99, False)
"""


def test_a_runs_sites_say_why_they_fell_back_and_count_each_evaluation_once(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text(textwrap.dedent(PROJECT).lstrip("\n"))  # the lines below count from its import
    scalebox("init", ".", cwd=root)
    scalebox("rewrite", ".", cwd=root)
    ran = scalebox("run", "train.py", cwd=root, timeout=300)
    rows = json.loads(open(glob.glob(str(root / ".scalebox/runs/**/sites.json"), recursive=True)[0]).read())["sites"]
    by_line = {}
    for row in rows:
        by_line.setdefault(row["line"], []).append(row)
    gae, = by_line[7]
    assert (gae["vectorized"], gae["fallback"]) == (0, 5)
    assert gae["fallback_why"] == [["per-step inputs of dtype float16: only float32 and float64 are vectorized", 3],
                                   ["fewer than 2 steps", 2]]
    # backward_steps(steps) >= 2 and steps(T) == T_3: one evaluation, counted once (was 4 passes, 4 fallbacks)
    listed, = by_line[20]
    assert (listed["vectorized"], listed["fallback"], listed["fallback_why"]) == (4, 0, [])
    # the unswitched loop: its two branches' guards, and no row for the test before them
    assert sorted((r["vectorized"], r["fallback"]) for r in by_line[29]) == [(1, 0), (5, 0)]
    said = ("guards 67% (fell back: 3x per-step inputs of dtype float16: only float32 and float64 are vectorized; "
            "2x fewer than 2 steps)")
    assert said in ran.stderr
    assert said in scalebox("log", cwd=root).stdout


def test_damaged_or_planted_reasons_are_dropped_or_shown_on_one_line():
    rows = [
        {"vectorized": 1, "fallback": 4, "fallback_why": [["fewer than 2 steps", 3], ["\x1b[2Jwiped\nline", 1]]},
        {"vectorized": "9", "fallback": True, "fallback_why": 5},
        {"vectorized": 2, "fallback": 1, "fallback_why": [["x" * 500, 1], [3, 1], ["neg", -1], ["ok"]]},
        {"vectorized": -3, "fallback": 1.5, "fallback_why": [["fewer than 2 steps", 2]]},
    ]
    passed, fell, whys = site_counts.totals(rows)
    assert (passed, fell) == (3, 5)
    assert whys[0] == ("fewer than 2 steps", 5)
    assert all("\x1b" not in w and "\n" not in w and len(w) <= site_counts.MAX_CHARS for w, _ in whys)
    assert "\\x1b[2Jwiped line" in [w for w, _ in whys]
    assert site_counts.guards_text(0.5, "not a list") == "guards 50%"
    assert site_counts.guards_text(float("nan"), []) is None
    assert site_counts.guards_text(1.0, [["fewer than 2 steps", 2]]) == "guards 100%"


TENSORS = """
import numpy as np
import torch


def stack(n, make):
    rows = []
    for i in range(n):
        rows.append(make(i))
    return torch.tensor(rows, dtype=torch.float)


for _ in range(3):
    stack(40, lambda i: np.ones(4, dtype=np.float32))
for _ in range(2):
    stack(300, lambda i: np.float32(i))
stack(40, lambda i: np.ones(4, dtype=np.float32 if i % 2 else np.float64))
stack(40, lambda i: float(i))
stack(300, lambda i: np.float32(i) if i % 2 else np.float64(i))
stack(40, lambda i: np.float32(i))
"""


def test_a_tensor_from_arrays_site_counts_its_one_copy_path_and_says_why_it_fell_back(tmp_path):
    """Lizhi-sjtu PPO-discrete's ``torch.tensor(adv, ...)`` of a list of numpy scalars is rewritten
    (the list is appended to) but never took the one-copy path: the run said nothing, its site had
    no counts ("no pass/fallback counts for this transform") and its end line no guards. The helper
    now reports each call (no wrapper: torch's warning on the fallback stays at the user's line),
    and a list of numpy scalars of one type now takes the one-copy path."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text(textwrap.dedent(TENSORS).lstrip("\n"))
    scalebox("init", ".", cwd=root)
    scalebox("rewrite", "train.py", cwd=root)
    ran = scalebox("run", "train.py", cwd=root, timeout=300)
    row, = json.loads(open(glob.glob(str(root / ".scalebox/runs/**/sites.json"), recursive=True)[0]).read())["sites"]
    assert (row["line"], row["transform"], row["vectorized"], row["fallback"]) == (9, "hot.tensor_from_arrays", 5, 4)
    whys = dict(row["fallback_why"])  # the three most frequent (a tie: any three of the four)
    assert len(whys) == 3 and set(whys.values()) == {1} and set(whys) <= {
        "arrays of several shapes or dtypes (or 0-d, float16, uint64 items)",
        "numpy scalars of several types, or mixed with other items",
        "the items are not numpy arrays or numpy scalars (numbers, tensors or lists)",
        "fewer than 256 numpy scalars with a dtype given (the list path is as fast)"}
    assert "guards 56% (fell back: 1x " in ran.stderr, ran.stderr
    assert "train.py:9: UserWarning: Creating a tensor from a list of numpy.ndarrays is extremely slow" in ran.stderr, ran.stderr
