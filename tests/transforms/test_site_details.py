"""Site reasons of one breath; the run-time guards' contracts in ``details`` (transforms/contracts.py).

A reason says what was done and how exact in at most ``REASON_LIMIT`` characters. What the guard
that protects a rewrite accepts lives once, in the contracts table, and reaches the report as the
site's ``details`` (JSON), shown by ``scalebox diff --details``. Before, a recurrence site's reason
was up to 3,500 characters, a copy of the guard's contract in prose.
"""
import functools
import glob
import json
import os

import pytest

from conftest import ROOT, scalebox
from scalebox_cst.report import REWRITTEN, Site
from scalebox_cst.transforms import contracts
from scalebox_cst.transforms.examples import all_examples
from scalebox_cst.transforms.contracts import CONTRACTS, REASON_LIMIT
import harness

INPUTS = sorted(glob.glob(os.path.join(ROOT, "tests", "corpus", "*.py"))
                + glob.glob(os.path.join(ROOT, "examples", "**", "*.py"), recursive=True))
GAE = (
    "import torch\n"
    "def gae(rewards, values, dones, next_value, gamma, lam, T):\n"
    "    adv = torch.zeros_like(rewards)\n"
    "    last = 0\n"
    "    for t in reversed(range(T)):\n"
    "        nv = next_value if t == T - 1 else values[t + 1]\n"
    "        delta = rewards[t] + gamma * nv * (1.0 - dones[t]) - values[t]\n"
    "        adv[t] = last = delta + gamma * lam * (1.0 - dones[t]) * last\n"
    "    return adv\n"
)


def _sites(path, data, backend="cpu"):
    return harness.rewrite_result(data, None, backend, path=path).report.sites


@functools.lru_cache(maxsize=None)
def _every_site():
    out = []
    for path in INPUTS:
        with open(path, "rb") as f:
            out.append((os.path.relpath(path, ROOT), _sites(os.path.basename(path), f.read())))
    for case in all_examples():
        out.append((case.id, _sites("example.py", case.example.code.encode(), case.example.backend)))
    return out


def test_every_reason_of_the_corpus_and_examples_is_one_breath():
    long = [(where, len(s.reason), s.reason) for where, sites in _every_site() for s in sites
            if len(s.reason) > REASON_LIMIT]
    assert not long, long[:3]


def test_no_reason_repeats_a_contract():
    """The guards' contracts are said once, in the details: no reason spells out a clause."""
    clauses = [c for checks, _ in CONTRACTS.values() for c in checks if len(c) > 40]
    copies = [(where, s.reason) for where, sites in _every_site() for s in sites
              for c in clauses if c in s.reason]
    assert not copies, copies[:3]


def test_a_recurrence_site_names_its_guards_and_details_hold_their_contracts():
    (site,) = [s for s in _sites("gae.py", GAE.encode()) if s.action == REWRITTEN]
    assert "recurrence_ok" in site.reason and len(site.reason) <= REASON_LIMIT
    assert not site.reason.endswith("(more: details)")  # composed short, not cut
    got = site.details["contracts"]
    assert got["recurrence_ok"] == contracts.contract("recurrence_ok")
    assert "exact types, one float dtype, device and row shape" in got["recurrence_ok"]["checks"]
    assert json.loads(json.dumps(site.to_json()))["details"] == site.details
    assert Site.from_json(site.to_json()).details == site.details


def test_a_long_reason_is_cut_at_a_clause_and_kept_whole_in_the_details():
    whole = "; ".join(f"clause {i} " + "x" * 40 for i in range(12))
    short, details = contracts.site_details(whole)
    assert len(short) <= REASON_LIMIT and short.endswith("(more: details)")
    assert whole.startswith(short[: -len(" (more: details)")]) and short.count("; ") >= 1
    assert details == {"reason": whole}
    assert contracts.site_details("fits") == ("fits", None)


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_contract_names_are_found_as_words_only(name):
    assert contracts.details_for(f"guarded by {name}")["contracts"] == {name: contracts.contract(name)}
    assert contracts.details_for(f"_scalebox_{name}x") is None


def test_diff_details_shows_the_contracts(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "gae.py").write_text(GAE)
    scalebox("init", ".", cwd=root)
    scalebox("rewrite", ".", "--transform", "vectorize.recurrence", "--backend", "cpu", cwd=root)
    plain = scalebox("diff", "--no-color", cwd=root).stdout
    shown = scalebox("diff", "--details", "--no-color", cwd=root).stdout
    assert "recurrence_ok" in plain and '"contracts"' not in plain
    assert '#      "contracts": {' in shown and "exact types, one float dtype, device and row shape" in shown


def test_a_long_reason_is_cut_outside_parentheses():
    # sweetice's AC_CartPole: the cut fell on the '; ' inside "(no gradient; the guard ...)" and
    # the diff read "... float64 copies (no gradient (more: details)"
    whole = ("one batched evaluation: " + "; ".join(f"clause {i} " + "x" * 30 for i in range(5))
             + "; values as copies (no gradient; the guard checks " + "y" * 200 + "), cast where they meet")
    short, details = contracts.site_details(whole)
    assert len(short) <= REASON_LIMIT and short.endswith("(more: details)")
    head = short[: -len(" (more: details)")]
    assert whole.startswith(head) and head.count("(") == head.count(")"), short
    assert head.endswith("clause 4 " + "x" * 30 + "; values as copies")  # before the parenthesis: its detail goes
    assert details == {"reason": whole}


def test_a_cut_keeps_the_point_before_a_parenthesis():
    """A reason of the recurrence's read-back: the cut at its first ': ' (outside any bracket)
    said what was read and written, not why the loop was left ("through a temporary")."""
    whole = ("reads `returns[0]` in `disc_return_t = (returns[0] if len(returns) > 0 else 0)` and writes "
             "`returns.appendleft(gamma * disc_return_t + rewards[t])`: the value read back reaches the write "
             "through a temporary (understood: `returns.appendleft(f(returns[0]))`, `v = f(returns[0])` then "
             "`returns.appendleft(v)`)")
    short, _ = contracts.site_details(whole)
    assert short.endswith("reaches the write through a temporary (more: details)"), short


def test_every_cut_reason_of_the_corpus_and_examples_closes_its_brackets():
    cut = [(where, s.reason) for where, sites in _every_site() for s in sites
           if s.reason.endswith("(more: details)")
           and any(s.reason.count(a) != s.reason.count(b) for a, b in ("()", "[]", "{}"))]
    assert not cut, cut[:3]


# Khrylx/PyTorch-RL's utils/torch.py: a loop over the parameters whose body is one statement
# written over two lines; the skip printed its site line broken in two, the rest indented
FLAT_PARAMS = (
    "def set_flat_params_to(model, flat_params):\n"
    "    prev_ind = 0\n"
    "    for param in model.parameters():\n"
    "        flat_size = int(np.prod(list(param.size())))\n"
    "        param.data.copy_(\n"
    "            flat_params[prev_ind:prev_ind + flat_size].view(param.size()))\n"
    "        prev_ind += flat_size\n"
)


def test_a_reason_quoting_a_statement_over_lines_is_one_line():
    sites = _sites("utils.py", FLAT_PARAMS)
    quoting = [s for s in sites if "param.data.copy_(" in s.reason]
    assert quoting, [s.reason for s in sites]
    for s in quoting:
        assert "\n" not in s.reason, s.reason
        assert "`param.data.copy_(flat_params[prev_ind:prev_ind + flat_size].view(param.size()))`" in s.reason


def test_one_line_joins_breaks_not_inside_brackets():
    assert contracts.one_line("runs `f(\n    a,\n    b\n)`, which") == "runs `f(a, b)`, which"
    assert contracts.one_line("`x = a + \\\n    b`") == "`x = a + b`"
    assert contracts.one_line("no break") == "no break"


# Khrylx/PyTorch-RL's core/common.py: the advantage is stored, then read back into the carried
# name; the reason quoted the read-back inside the quote of the update: "`a[i] = ... (`p = a[i, 0]`)`"
KHRYLX_GAE = (
    "import torch\n"
    "def estimate_advantages(rewards, masks, values, gamma, tau):\n"
    "    deltas = torch.zeros(rewards.size(0), 1)\n"
    "    advantages = torch.zeros(rewards.size(0), 1)\n"
    "    prev_value = 0\n"
    "    prev_advantage = 0\n"
    "    for i in reversed(range(rewards.size(0))):\n"
    "        deltas[i] = rewards[i] + gamma * prev_value * masks[i] - values[i]\n"
    "        advantages[i] = deltas[i] + gamma * tau * prev_advantage * masks[i]\n"
    "        prev_value = values[i, 0]\n"
    "        prev_advantage = advantages[i, 0]\n"
    "    return advantages\n"
)


def test_a_value_read_back_from_memory_is_quoted_once():
    sites = [s for s in _sites("common.py", KHRYLX_GAE) if s.transform == "vectorize.recurrence"]
    rewritten = [s for s in sites if s.action == REWRITTEN]
    assert rewritten, [s.describe() for s in sites]
    reason = rewritten[0].reason
    assert ("`advantages[i] = deltas[i] + gamma * tau * prev_advantage * masks[i]; "
            "prev_advantage = advantages[i, 0]`, carried through memory") in reason, reason
    assert "(`" not in reason, reason
