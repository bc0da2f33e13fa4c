"""``device.optimizer`` never gives ``torch.optim.SGD`` ``fused=True`` (cuda and npu tiers).

Found by a sweep of unseen code: with the model's ``nn.Embedding(sparse=True)`` in another module,
the rewrite's ``SGD(..., fused=True)`` raised "`_fused_sgd` does not support sparse gradients" at
``step()`` where the original trains (the old check read only the optimizer's own file). Checked on
CPU with torch 2.13, the same Python ``_fused_sgd`` every device runs: fused SGD also refuses complex
parameters, and with momentum keeps ``empty_like`` momentum buffers when a GradScaler skips its
first step (the kernel honours ``found_inf`` but the buffers are made before it), where the default
skips the step and makes none. None of the three can be seen from the optimizer's call, so SGD is
left as written, reported; Adam/AdamW refuse sparse gradients on every path and keep fused=True.
The rewrites below run on this CPU-only torch: fused Adam has a CPU kernel since 2.4.
"""
from __future__ import annotations

import textwrap

import pytest
import torch

from scalebox_cst.report import REWRITTEN, SKIPPED
import harness


def rw(src, backend="cuda"):
    return harness.rewrite(textwrap.dedent(src), ["device.optimizer"], backend, options={"device": {}})


MODEL = textwrap.dedent("""\
    import torch
    from torch import nn
    import torch.nn.functional as F


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4, sparse=True)
            self.bag = nn.EmbeddingBag(10, 4, mode="sum", sparse=True)
            self.table = nn.Parameter(torch.randn(10, 4))
            self.rot = nn.Parameter(torch.randn(4, dtype=torch.complex64))
            self.head = nn.Linear(12, 1)

        def forward(self, idx):
            h = torch.cat([self.emb(idx), self.bag(idx.view(-1, 1)), F.embedding(idx, self.table, sparse=True)], -1)
            return self.head(h).sum() + (self.rot * self.rot.conj()).real.sum()
    """)

TRAIN = """\
    import torch
    from {module} import Net


    def train(steps=5):
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        head_opt = torch.optim.Adam(model.head.parameters(), lr=1e-3)
        for _ in range(steps):
            idx = torch.randint(0, 10, (8,))
            opt.zero_grad()
            head_opt.zero_grad()
            model(idx).backward()
            opt.step()
            head_opt.step()
        return [p.detach().clone() for p in model.parameters()]
    """


@pytest.mark.parametrize("backend", ["cuda", "npu"])
def test_sgd_is_left_as_written_with_the_reason(backend):
    src = "import torch\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nadam = torch.optim.Adam(model.parameters())\n"
    out, sites = rw(src, backend)
    assert "torch.optim.SGD(model.parameters(), lr=0.1)\n" in out
    (sgd,) = [s for s in sites if s.line == 2]
    assert sgd.action == SKIPPED and "sparse gradients" in sgd.reason and "GradScaler" in sgd.reason, sgd
    assert [s.action for s in sites if s.line == 3] == [REWRITTEN]  # Adam refuses sparse grads anyway
    # the user's own choice is still reported as such
    out, sites = rw("import torch\nopt = torch.optim.SGD(p, lr=0.1, fused=True)\n", backend)
    assert "fused= set by the user" in sites[0].reason


def test_a_sparse_embedding_in_another_module_trains_as_the_original(tmp_path, monkeypatch):
    """Differential: the model (sparse Embedding, EmbeddingBag, F.embedding, a complex parameter)
    lives in another module; the rewrite for cuda, run here, trains without raising, the SGD
    parameters bitwise equal to the original's and the fused Adam's head within its tolerance."""
    (tmp_path / "sbx_sparse_model.py").write_text(MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    src = textwrap.dedent(TRAIN.format(module="sbx_sparse_model"))
    out, sites = rw(src)
    original = harness.load(src, filename="train.py")["train"]()
    rewritten = harness.load(out, filename="train.py")["train"]()  # fused SGD: RuntimeError here
    assert "torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)\n" in out
    assert "_sbx_fused_optimizer(torch.optim.Adam, model.head.parameters(), lr=1e-3)" in out
    names = [n for n, _ in harness.load(MODEL, filename="m.py")["Net"]().named_parameters()]
    for name, a, b in zip(names, original, rewritten):
        if name.startswith("head."):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(a, b), name


def test_sgd_with_momentum_under_a_grad_scaler_that_skips_its_first_step(monkeypatch):
    """Differential: fp16-style overflow on the first step (the GradScaler skips it). Fused SGD
    would step with uninitialised momentum buffers afterwards; the rewrite equals the original."""
    src = textwrap.dedent("""\
        import torch


        def train():
            torch.manual_seed(0)
            net = torch.nn.Linear(16, 16)
            opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
            scaler = torch.amp.GradScaler("cpu")
            for i in range(4):
                loss = net(torch.randn(4, 16)).pow(2).sum() * (1e38 if i == 0 else 1.0)
                opt.zero_grad()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            return [p.detach().clone() for p in net.parameters()]
        """)
    out, _ = rw(src)
    original = harness.load(src, filename="t.py")["train"]()
    rewritten = harness.load(out, filename="t.py")["train"]()
    assert all(torch.equal(a, b) for a, b in zip(original, rewritten))  # fused SGD: garbage
    assert out == src


def test_look_alikes_are_not_sites():
    """A class of the file named SGD, SparseAdam and Adagrad (which take sparse gradients and are
    not in the table) are not touched or reported."""
    src = """\
        import torch
        class SGD:
            def __init__(self, params, lr):
                self.params = params
        a = SGD([], lr=0.1)
        b = torch.optim.SparseAdam(emb.parameters(), lr=0.1)
        c = torch.optim.Adagrad(emb.parameters(), lr=0.1)
        """
    out, sites = rw(src)
    assert out == textwrap.dedent(src) and sites == []


def test_the_cuda_reason_speaks_of_cuda():
    """The reason of a CUDA-tier fused site named a CPU measurement as its speed-up; on CUDA
    torch's default is foreach, and the speed-up is not measured here."""
    _, sites = rw("import torch\nopt = torch.optim.Adam(model.parameters())\n")
    (site,) = sites
    assert "foreach" in site.reason and "not timed here" in site.reason and "(more" not in site.reason


def test_fused_adam_keeps_a_complex_parameter_on_the_default_path():
    """Found with the SGD review: Adam/AdamW(fused=True) raise "`fused=True` requires all the params
    to be floating point Tensors" at step() on a complex parameter, which the default takes. On
    CUDA the call is built through runtime.fused_optimizer, which adds fused=True only where every
    parameter is a dense float tensor: differential run, bitwise equal where it keeps the default,
    within the fused tolerance where it fuses."""
    src = textwrap.dedent("""\
        import torch


        def train(cls, complex_too):
            torch.manual_seed(0)
            w = torch.nn.Parameter(torch.randn(4))
            c = torch.nn.Parameter(torch.randn(4, dtype=torch.complex64))
            opt = cls([w, c] if complex_too else [w], lr=1e-2)
            for _ in range(5):
                opt.zero_grad()
                (w.pow(2).sum() + (c * c.conj()).real.sum()).backward()
                opt.step()
            return opt.param_groups[0]["fused"], w.detach().clone(), c.detach().clone()
        """).replace("cls(", "torch.optim.Adam(").replace("train(cls, ", "train(")
    out, sites = rw(src)
    for complex_too in (True, False):
        f0, w0, c0 = harness.load(src, filename="t.py")["train"](complex_too)
        f1, w1, c1 = harness.load(out, filename="t.py")["train"](complex_too)  # fused=True: raises
        assert (f0, f1) == (None, None if complex_too else True)
        if complex_too:
            assert torch.equal(w0, w1) and torch.equal(c0, c1)
        else:
            torch.testing.assert_close(w0, w1, rtol=1e-5, atol=1e-6)
    assert "_sbx_fused_optimizer(torch.optim.Adam, [w, c] if complex_too else [w], lr=1e-2)" in out, out
