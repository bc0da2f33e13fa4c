"""precision.autocast: a name the autocast chain binds and something reads later keeps it fp32.

Under autocast the chain's names hold bf16/fp16 tensors; a read that can see them after the chain
(later in the function, after the loop, in an enclosing loop's later statements, module code after
a module-level loop, a closure, ``locals()``) would see another dtype. The whole scope is searched,
not only the chain's block; the reason names the name and the line. Reads that cannot see the
chain's value (before it and outside every loop around it, after an assignment that rebinds the
name on every path, in a function that binds the name itself) do not stop the rewrite."""
from __future__ import annotations

import pytest

from scalebox_cst.transforms.precision import AutocastTransform
import harness

torch = pytest.importorskip("torch")

ID = AutocastTransform.id


def _rewrite(code, mode="bf16"):
    out, sites = harness.rewrite(code, ID, dedent=False, path="train.py", options={"precision": {"mode": mode}})
    return out, [s for s in sites if s.transform == ID]


def _model_and_data():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(2)
    return model, opt, [(torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)) for _ in range(3)]


def _result(code, name="train"):
    return harness.load(code, name, filename="train.py")(*_model_and_data())


STEP = """\
        opt.zero_grad()
        h = model[0](x)
        z = torch.tanh(h)
        out = model[2](z)
        loss = ((out - y) ** 2).mean()
        loss.backward()
        opt.step()
"""

READ_AFTER_THE_LOOP = "import torch\n\n\ndef train(model, opt, data):\n    for x, y in data:\n" + STEP + "    return z.dtype\n"

READ_IN_AN_ENCLOSING_LOOP = ("import torch\n\n\ndef train(model, opt, data):\n    seen = []\n    for epoch in range(2):\n"
                             "        for x, y in data:\n" + STEP.replace("        ", "            ")
                             + "        seen.append(out.dtype)\n    return seen\n")

READ_BY_A_CLOSURE = ("import torch\n\n\ndef train(model, opt, data):\n    def last():\n        return z.dtype\n"
                     "    for x, y in data:\n" + STEP + "    return last()\n")

READ_BY_LOCALS = "import torch\n\n\ndef train(model, opt, data):\n    for x, y in data:\n" + STEP + "    return locals()['h'].dtype\n"

READ_IN_A_LATER_ROUND_ABOVE_AN_IF = ("import torch\n\n\ndef train(model, opt, data):\n    seen = []\n    z = torch.zeros(1)\n"
                                     "    for x, y in data:\n        seen.append(z.dtype)\n        if x.shape[0]:\n"
                                     + STEP.replace("        ", "            ") + "    return seen\n")

READ_BY_A_GENERATOR_CONSUMED_LATER = ("import torch\n\n\ndef train(model, opt, data):\n    z = torch.zeros(1)\n"
                                      "    late = (z.dtype for _ in range(1))\n    for x, y in data:\n" + STEP
                                      + "    return next(late)\n")


@pytest.mark.parametrize("code, name, line", [
    (READ_AFTER_THE_LOOP, "z", 13),
    (READ_IN_AN_ENCLOSING_LOOP, "out", 15),
    (READ_BY_A_CLOSURE, "z", 6),
    (READ_BY_LOCALS, "h", 13),
    (READ_IN_A_LATER_ROUND_ABOVE_AN_IF, "z", 8),
    (READ_BY_A_GENERATOR_CONSUMED_LATER, "z", 6),
])
def test_a_chain_name_read_outside_its_block_keeps_the_chain_fp32(code, name, line):
    out, sites = _rewrite(code)
    assert _result(out) == _result(code)  # the dtypes the code sees (float32), same on both sides
    assert out == code, out
    assert any(name in s.reason and f"line {line}" in s.reason for s in sites), sites


MODULE_LEVEL = """\
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    x, y = torch.randn(8, 6), torch.randn(8, 1)
    opt.zero_grad()
    h = model[0](x)
    loss = ((model[2](torch.tanh(h)) - y) ** 2).mean()
    loss.backward()
    opt.step()
dtype = h.dtype
"""


@pytest.mark.parametrize("mode", ["bf16", "fp16"])
def test_module_code_after_a_module_level_loop_counts(mode):
    out, sites = _rewrite(MODULE_LEVEL, mode)
    assert harness.load(out, filename="train.py")["dtype"] == torch.float32
    assert out == MODULE_LEVEL and any("h is read" in s.reason and "line 13" in s.reason for s in sites), sites


def test_fp16_differential_dtype_after_the_loop():
    out, _ = _rewrite(READ_AFTER_THE_LOOP, mode="fp16")
    assert _result(out) == _result(READ_AFTER_THE_LOOP) == torch.float32


# reads that cannot see the chain's value: the chain is still wrapped
STAYS_WRAPPED = [
    # an evaluation after training rebinds the names before it reads them
    "import torch\n\n\ndef train(model, opt, data):\n    for x, y in data:\n" + STEP
    + "    with torch.no_grad():\n        out = model(data[0][0])\n        loss = ((out - data[0][1]) ** 2).mean()\n"
    + "    return out.dtype, loss.item()\n",
    # ... in a loop of its own
    "import torch\n\n\ndef train(model, opt, data):\n    for x, y in data:\n" + STEP
    + "    errs = []\n    for x, y in data:\n        out = model(x)\n        errs.append(float((out - y).abs().mean().detach()))\n"
    + "    return errs\n",
    # read before the loop, never again after it; the loss only as loss.item()
    "import torch\n\n\ndef train(model, opt, data):\n    z = torch.zeros(1)\n    first = z.dtype\n    for x, y in data:\n"
    + STEP + "    return first, loss.item()\n",
    # a nested function that binds the name itself
    "import torch\n\n\ndef train(model, opt, data):\n    def fresh(x):\n        z = torch.tanh(x)\n        return z.dtype\n"
    + "    for x, y in data:\n" + STEP + "    return fresh(torch.ones(1))\n",
    # a comprehension variable of the same name
    "import torch\n\n\ndef train(model, opt, data):\n    for x, y in data:\n" + STEP
    + "    return [z.shape for z in (torch.ones(2),)]\n",
]


@pytest.mark.parametrize("code", STAYS_WRAPPED)
def test_reads_that_cannot_see_the_chain_value_leave_it_wrapped(code):
    out, sites = _rewrite(code)
    assert out.count("torch.autocast(") == 1 and [s.action for s in sites] == ["rewritten"], sites
    harness.load(out, "train", filename="train.py")(*_model_and_data())  # runs
