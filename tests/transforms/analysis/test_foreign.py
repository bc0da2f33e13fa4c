"""A body Python does not run as written in its module (``@torch.jit.script``, ``@triton.jit``,
``@numba.njit``, a marimo cell) is never rewritten: TorchScript refused the walrus of a
recurrence guard, and a marimo notebook (Curt-Park/rainbow-is-all-you-need is nine of them) raised
NameError on ``_scalebox_stabilize``, which the rewrite imports at the top of the module and a cell
does not see. The transform's edits of that file are withdrawn, each site saying why."""
from __future__ import annotations

import textwrap

import pytest

import harness
from scalebox_cst.report import REWRITTEN, SKIPPED

RETURNS = """\
import torch
{import_}

{decorator}
def returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out
"""

MARIMO = """\
import marimo

app = marimo.App(width="full")


@app.cell
def _():
    import torch
    return (torch,)


@app.cell(hide_code=True)
def _(torch):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    model(torch.ones(4, 2)).sum().backward()
    opt.step()
    return


if __name__ == "__main__":
    app.run()
"""


@pytest.mark.parametrize("import_, decorator, who", [
    ("", "@torch.jit.script", "`@torch.jit.script` def `returns` (line 5): TorchScript compiles its body"),
    ("from torch import jit", "@jit.script", "`@jit.script` def `returns` (line 5): TorchScript"),
    ("import numba", "@numba.njit(cache=True)", "`@numba.njit` def `returns` (line 5): Numba compiles"),
    ("import triton", "@triton.jit", "`@triton.jit` def `returns` (line 5): Triton compiles"),
])
def test_a_recurrence_in_a_compiled_body_is_left_alone_and_says_why(import_, decorator, who):
    src = RETURNS.format(import_=import_, decorator=decorator)
    out, sites = harness.rewrite(src, "vectorize.recurrence", dedent=False)
    assert out == src
    (site,) = sites
    assert site.action == SKIPPED and site.reason.startswith(f"left alone: inside {who}")
    # without the decorator the same loop is rewritten: the test is not vacuous
    plain, sites = harness.rewrite(RETURNS.format(import_=import_, decorator=""), "vectorize.recurrence", dedent=False)
    assert [s.action for s in sites] == [REWRITTEN]


def test_a_plain_function_beside_a_scripted_one_is_withdrawn_with_it():
    src = RETURNS.format(import_="", decorator="@torch.jit.script") + textwrap.dedent("""\

        def plain(rewards, gamma):
            out = torch.zeros_like(rewards)
            running = torch.zeros_like(rewards[0])
            for t in range(rewards.shape[0] - 1, -1, -1):
                running = rewards[t] + gamma * running
                out[t] = running
            return out
        """)
    out, sites = harness.rewrite(src, dedent=False)
    assert out == src
    withdrawn = [s for s in sites if s.transform == "vectorize.recurrence"]
    assert [s.line for s in withdrawn] == [8, 16] and all(s.action == SKIPPED for s in withdrawn)
    assert withdrawn[1].reason.startswith("left alone with this transform's site at line 8, inside `@torch.jit.script`")


def test_a_marimo_cell_is_not_rewritten_but_code_outside_cells_and_other_decorators_are():
    out, sites = harness.rewrite(MARIMO, "grad_clip", dedent=False)
    assert out == MARIMO
    (site,) = sites
    assert site.action == SKIPPED
    assert site.reason.startswith("left alone: inside `@app.cell` def `_` (line 13): marimo runs its body as a cell")
    # a function of a module named app that is not a marimo App, and torch.jit.ignore (run by Python)
    for head in ("import app\n\n@app.cell\n", "import torch\n\n@torch.jit.ignore\n"):
        src = head + "def step(opt, loss):\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
        out, sites = harness.rewrite(src, "grad_clip", dedent=False)
        assert [s.action for s in sites] == [REWRITTEN] and "_scalebox_stabilize(opt" in out


def test_a_site_outside_the_compiled_body_is_rewritten():
    src = RETURNS.format(import_="", decorator="@torch.jit.script") + textwrap.dedent("""\

        def step(opt, loss):
            opt.zero_grad()
            loss.backward()
            opt.step()
        """)
    out, sites = harness.rewrite(src, "grad_clip", dedent=False)
    assert [s.action for s in sites] == [REWRITTEN] and "_scalebox_stabilize(opt" in out


# reduction's edits in a scripted function are withdrawn; the helper name it had registered
# (`_sb_batch_range`, shared with elementwise) stayed in the import table the next transform
# read, so elementwise's rewrite of a plain function called it without its import: NameError.
SHARED_HELPER = """\
import torch


@torch.jit.script
def dot(x, w):
    acc = torch.zeros(())
    for k in range(x.shape[0]):
        acc += x[k] * w[k]
    return acc


def scale(rewards, values, out, gamma: float):
    for k in range(len(rewards)):
        out[k] = rewards[k] + gamma * values[k]
    return out
"""


def test_a_withdrawn_transform_leaves_no_helper_name_behind(tmp_path):
    torch = pytest.importorskip("torch")
    out, sites = harness.rewrite(SHARED_HELPER, dedent=False)
    assert [(s.transform, s.action) for s in sites] == [("vectorize.reduction", SKIPPED), ("vectorize.elementwise", REWRITTEN)]
    path = tmp_path / "shared_helper_mod.py"
    path.write_text(out)  # TorchScript reads the function's source from its file
    mod = harness.load_path(str(path), "shared_helper_mod")
    got = mod.scale(torch.ones(5), torch.arange(5.0), torch.zeros(5), 0.5)
    assert torch.equal(got, 1 + 0.5 * torch.arange(5.0))
    assert torch.equal(mod.dot(torch.ones(3), torch.ones(3)), torch.tensor(3.0))
