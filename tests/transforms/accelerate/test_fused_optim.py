"""accelerate.fused_optim and runtime/fused_optimizer.py: Adam/AdamW built fused on CPU (--fast).

What is checked: nothing at the default level; at level "reassociated" each example is rewritten
(reassociated sites) or left byte for byte with its reason; the rewrite trains to the original's
parameters within float tolerance, its optimizers are fused; the helper keeps the call as
written where fused cannot take a parameter (complex, integer, sparse, a lone tensor: the
optimizer's own TypeError) or the user chose; generators are listed once (no parameter lost);
``--fast`` turns the transform on.
"""
import harness
import pytest
import torch

from scalebox_cst.config import Config
from scalebox_cst.report import REASSOCIATED, REWRITTEN, SKIPPED
from scalebox_cst.runtime.fused_optimizer import fused_optimizer
from scalebox_cst.transforms import REGISTRY
from scalebox_cst.transforms.accelerate.fused_optim import ID, AccelerateFusedOptim

FAST = {"accelerate": {"level": "reassociated"}}


def rewrite(code, options=FAST, backend="cpu"):
    return harness.rewrite(code, ID, backend, dedent=False, options=options)


def test_registered_and_off_at_the_default_level():
    assert ID in [cls.id for cls in REGISTRY]
    assert Config().transform_enabled(ID)
    for example in AccelerateFusedOptim.EXAMPLES:
        for options in (None, {"accelerate": {"level": "exact"}}):
            out, sites = rewrite(example.code, options)
            assert out == example.code and not sites


@pytest.mark.parametrize("example", AccelerateFusedOptim.EXAMPLES, ids=lambda e: e.note[:40])
def test_examples(example):
    out, sites = rewrite(example.code)
    done = [s for s in sites if s.action == REWRITTEN]
    if not example.rewritten:
        assert out == example.code and not done
        if example.reason:
            assert any(example.reason in s.reason for s in sites if s.action == SKIPPED), [s.reason for s in sites]
        else:
            assert not sites
        return
    assert len(done) == 1 and done[0].exactness == REASSOCIATED
    assert "_sbx_fused_optimizer(" in out and "import fused_optimizer as _sbx_fused_optimizer" in out


@pytest.mark.parametrize("example", [e for e in AccelerateFusedOptim.EXAMPLES if e.rewritten], ids=lambda e: e.note[:40])
def test_rewrite_trains_like_the_original(example):
    out, _ = rewrite(example.code)
    original = harness.load(example.code)["train"]()
    rewritten_ns = harness.load(out)
    made = []
    real = rewritten_ns["_sbx_fused_optimizer"]
    rewritten_ns["_sbx_fused_optimizer"] = lambda *a, **k: made.append(real(*a, **k)) or made[-1]
    again = rewritten_ns["train"]()
    assert made and all(g["fused"] for opt in made for g in opt.param_groups)
    assert sum(len(g["params"]) for g in made[0].param_groups) == 4  # generators listed once: no parameter lost
    for a, b in zip(original, again):
        assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_other_backends_have_no_sites():
    code = AccelerateFusedOptim.EXAMPLES[0].code
    for backend in ("cuda", "npu"):
        out, sites = rewrite(code, backend=backend)
        assert not [s for s in sites if s.transform == ID and s.action == REWRITTEN]


def _params(dtype=torch.float32, n=2):
    return [torch.nn.Parameter(torch.randn(3, dtype=dtype)) for _ in range(n)]


@pytest.mark.parametrize("make,fused", [
    (lambda: (iter(_params()),), True),
    (lambda: ([{"params": iter(_params())}, {"params": _params()[0], "lr": 0.1}],), True),
    (lambda: ([("a", _params()[0]), ("b", _params()[0])],), True),
    (lambda: (_params(torch.complex64),), None),     # fused takes no complex parameter: torch raises at step
    (lambda: ([*_params(), *_params(torch.float64)],), True),  # mixed float dtypes: one kernel per dtype
])
def test_helper_fuses_only_what_the_kernel_takes(make, fused):
    opt = fused_optimizer(torch.optim.Adam, *make(), lr=1e-3)
    assert all(g["fused"] is fused for g in opt.param_groups)
    for g in opt.param_groups:
        for p in g["params"]:
            p = p[1] if isinstance(p, tuple) else p
            p.grad = torch.ones_like(p)
    opt.step()  # where fused was refused, the step would have raised


def test_helper_keeps_the_users_choice_and_the_optimizers_errors():
    assert fused_optimizer(torch.optim.Adam, _params(), foreach=True).param_groups[0]["fused"] is None
    assert fused_optimizer(torch.optim.AdamW, params=_params()).param_groups[0]["fused"] is True
    with pytest.raises(TypeError, match="iterable of Tensors"):
        fused_optimizer(torch.optim.Adam, torch.nn.Parameter(torch.zeros(3)))
    with pytest.raises(TypeError):
        fused_optimizer(torch.optim.Adam, [{"params": set(_params())}])


@pytest.mark.parametrize("where", ["keyword", "group"])
def test_capturable_on_cpu_parameters_still_raises_at_step(where):
    """Found by a differential review: ``capturable=True`` with CPU parameters raises at
    ``step()`` on the for-loop path; with fused=True added the step succeeded."""
    params = _params()
    opt = fused_optimizer(torch.optim.Adam, params, capturable=True) if where == "keyword" \
        else fused_optimizer(torch.optim.Adam, [{"params": params, "capturable": True}])
    assert opt.param_groups[0]["fused"] is None
    for p in params:
        p.grad = torch.ones_like(p)
    with pytest.raises(Exception) as raised:
        opt.step()
    with pytest.raises(type(raised.value)):
        torch.optim.Adam(_params_with_grads(), capturable=True).step()


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
def test_a_differentiable_group_is_built_as_written(cls):
    """Found by a differential review: a parameter group with ``differentiable: True`` (a group's
    options override the defaults) made the fused optimizer raise RuntimeError at construction,
    where the original builds and steps. Groups that leave it off, or set it False, still fuse."""
    params = _params()
    opt = fused_optimizer(cls, [{"params": params, "differentiable": True}], lr=1e-3)
    assert opt.param_groups[0]["fused"] is None and opt.param_groups[0]["differentiable"] is True
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    first, second = _params(), _params()
    mixed = fused_optimizer(cls, [{"params": first, "differentiable": False}, {"params": second}], lr=1e-3)
    assert [g["fused"] for g in mixed.param_groups] == [True, True]


def _params_with_grads():
    out = _params()
    for p in out:
        p.grad = torch.ones_like(p)
    return out


def test_fused_state_matches_the_loop_within_float_noise():
    """The formula is the same: 50 steps of the fused kernel stay within 1e-5 relative of the loop."""
    torch.manual_seed(0)
    start = [torch.randn(64, 4), torch.randn(64)]
    grads = [[torch.randn_like(t) for t in start] for _ in range(50)]
    out = []
    for fuse in (False, True):
        ps = [torch.nn.Parameter(t.clone()) for t in start]
        opt = fused_optimizer(torch.optim.Adam, ps, lr=1e-2) if fuse else torch.optim.Adam(ps, lr=1e-2)
        for gs in grads:
            for p, g in zip(ps, gs):
                p.grad = g.clone()
            opt.step()
        out.append(ps)
    for a, b in zip(*out):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_fast_turns_it_on(tmp_path):
    from scalebox_cst.cli._common import _fast

    cfg = Config()
    cfg.disabled = ["accelerate.*"]
    _fast(cfg, True)
    assert cfg.transform_enabled(ID) and cfg.option("accelerate", "level") == "reassociated"


def test_the_whole_fast_pipeline_composes_on_cpu():
    """Default transforms plus the CPU tier: the optimizer is built fused inside the thread cap
    (device.optimizer's foreach swap no longer sees a bare Adam call: no fused+foreach clash),
    Categorical is the subclass, and the script runs."""
    code = (
        "import torch\nimport torch.nn as nn\nimport torch.optim as optim\n"
        "from torch.distributions.categorical import Categorical\n\n"
        "torch.manual_seed(0)\nnet = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))\n"
        "optimizer = optim.Adam(net.parameters(), lr=1e-3, eps=1e-5)\n"
        "for _ in range(3):\n"
        "    d = Categorical(logits=net(torch.randn(5, 4)))\n"
        "    loss = -(d.log_prob(d.sample()) + d.entropy()).mean()\n"
        "    optimizer.zero_grad()\n    loss.backward()\n    optimizer.step()\n"
    )
    out, sites = harness.rewrite(code, None, "cpu", dedent=False, options=FAST)
    assert "_sbx_one_thread(_sbx_fused_optimizer(optim.Adam, net.parameters(), lr=1e-3, eps=1e-5))" in out
    assert "foreach" not in out and "_sbx_Categorical(logits=" in out
    ns = harness.load(out)
    assert all(g["fused"] for g in ns["optimizer"].param_groups)


@pytest.mark.parametrize("transform", [ID, "accelerate.threads"])
def test_only_the_statements_building_an_optimizer_are_visited_and_positioned(monkeypatch, transform):
    """higgsfield's RL-Adventure notebooks (300 lines, one ``optim.Adam``): fused_optim and threads
    each visited the whole module and positioned all of it (libcst's PositionProvider) for one
    call: the --fast tier cost 253 ms per file on CPU against 84 ms at the default level. They
    now visit and position only the statements holding an optimizer (hot.bindings.visit_calls):
    the same code and sites, no whole-module positions."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper

    from scalebox_cst.transforms import FileContext, all_transforms

    plain = "".join(f"def plain_{i}(x):\n    y = x + {i}\n    return y * 2\n\n\n" for i in range(30))
    source = ("import torch\nimport torch.optim as optim\n\n\n" + plain + "model = torch.nn.Linear(4, 2)\n"
              "optimizer = optim.Adam(model.parameters(), lr=1e-3)  # a comment\n\n\n" + plain.replace("plain_", "more_"))
    resolved = []
    real = MetadataWrapper.resolve

    def spy(self, provider):
        resolved.append(len(self.module.body))
        return real(self, provider)

    monkeypatch.setattr(MetadataWrapper, "resolve", spy)
    (t,) = [t for t in all_transforms() if t.id == transform]
    module = cst.parse_module(source)
    ctx = FileContext("f.py", module, Config.from_dict({"accelerate": {"level": "reassociated"}}), "cpu", code=source)
    new, sites = t.rewrite(ctx)
    assert [s.action for s in sites] == [REWRITTEN] and sites[0].line == source.splitlines().index(
        "optimizer = optim.Adam(model.parameters(), lr=1e-3)  # a comment") + 1
    assert max(resolved, default=0) <= 2, resolved  # statements positioned alone, never the module
    out = ctx.finish(new).code
    assert "(optim.Adam, model.parameters(), lr=1e-3)" in out or "_sbx_one_thread(optim.Adam(" in out
    assert all(a is b for a, b in zip(module.body[:-31], new.body[:-31]))  # statements not entered
