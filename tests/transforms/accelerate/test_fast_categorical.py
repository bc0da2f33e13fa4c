"""accelerate.fast_categorical and runtime/fast_categorical.py: Categorical built as a subclass
with shortcut sample/log_prob/entropy (--fast, CPU).

What is checked: nothing at the default level or off CPU; each example rewritten (exact sites)
or left byte for byte with its reason; the rewrite gives bitwise the original's samples (same
random stream), log-probs, entropies and gradients; the subclass equals torch's on every shape
and argument form, including the ones it hands back to torch (sample shapes, broadcast values,
1-D logits, validation on, -inf logits).
"""
import harness
import pytest
import torch
from torch.distributions import Categorical as TorchCategorical

from scalebox_cst.report import EXACT, REWRITTEN, SKIPPED
from scalebox_cst.runtime.fast_categorical import Categorical
from scalebox_cst.transforms import REGISTRY
from scalebox_cst.transforms.accelerate.fast_categorical import ID, AccelerateFastCategorical

FAST = {"accelerate": {"level": "reassociated"}}


def rewrite(code, options=FAST, backend="cpu"):
    return harness.rewrite(code, ID, backend, dedent=False, options=options)


def test_registered_and_off_at_the_default_level_and_off_cpu():
    assert ID in [cls.id for cls in REGISTRY]
    code = AccelerateFastCategorical.EXAMPLES[0].code
    for options, backend in ((None, "cpu"), ({"accelerate": {"level": "exact"}}, "cpu"), (FAST, "cuda"), (FAST, "npu")):
        out, sites = rewrite(code, options, backend)
        assert out == code and not sites


@pytest.mark.parametrize("example", AccelerateFastCategorical.EXAMPLES, ids=lambda e: e.note[:40])
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
    assert len(done) == 1 and done[0].exactness == EXACT
    assert "_sbx_Categorical" in out


def _same(a, b):
    return type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)


@pytest.mark.parametrize("example", [e for e in AccelerateFastCategorical.EXAMPLES if e.rewritten], ids=lambda e: e.note[:40])
@pytest.mark.parametrize("rows", [1, 64])
def test_rewrite_is_bitwise_the_original(example, rows):
    out, _ = rewrite(example.code)
    x = torch.randn(rows, 3)
    actions = torch.randint(0, 3, (rows,)).float()  # stored actions come back as floats (CleanRL's buffer)
    results = []
    for code in (example.code, out):
        torch.manual_seed(7)
        results.append(harness.load(code)["act"](x, actions))
    assert all(_same(a, b) for a, b in zip(*results))


@pytest.mark.parametrize("shape,kind", [((4,), "logits"), ((2, 5), "logits"), ((3, 2, 4), "logits"), ((6, 3), "probs")])
@pytest.mark.parametrize("sample_shape", [(), (2,), torch.Size([3, 1])])
def test_subclass_equals_torch_on_every_path(shape, kind, sample_shape):
    base = torch.randn(shape)
    base[..., 0] = float("-inf") if kind == "logits" else base[..., 0]  # entropy's clamp path
    arg = base if kind == "logits" else torch.softmax(base, -1)
    outs = []
    for cls in (TorchCategorical, Categorical):
        torch.manual_seed(1)
        d = cls(**{kind: arg}, validate_args=False)
        s = d.sample(sample_shape)
        value = torch.ones(shape[:-1], dtype=torch.long)
        outs.append([s, d.log_prob(s), d.log_prob(value), d.log_prob(torch.tensor(1)), d.entropy(), d.probs, d.logits])
    assert all(_same(a, b) for a, b in zip(*outs))
    assert repr(Categorical(logits=base)) == repr(TorchCategorical(logits=base))


@pytest.mark.parametrize("sample_shape", [None, 0, [], ()])
def test_sample_shapes_torch_refuses_are_refused_alike(sample_shape):
    """``sample(None)`` and ``sample(0)`` raise TypeError in torch: the shortcut for the empty
    shape must not take them for one."""
    outs = []
    for cls in (TorchCategorical, Categorical):
        torch.manual_seed(3)
        try:
            outs.append(cls(logits=torch.zeros(2, 3)).sample(sample_shape))
        except TypeError as e:
            outs.append(type(e))
    assert outs[0] is outs[1] if isinstance(outs[0], type) else _same(*outs)


def test_validation_and_expand_stay_torchs():
    with pytest.raises(ValueError):
        Categorical(probs=torch.tensor([[0.5, -0.5]]), validate_args=True)
    d = Categorical(logits=torch.zeros(3), validate_args=True)
    with pytest.raises(ValueError):
        d.log_prob(torch.tensor(5))  # out of support: torch's check still runs
    e = Categorical(logits=torch.zeros(1, 3)).expand(torch.Size([4]))
    assert isinstance(e, Categorical) and e.batch_shape == (4,) and e.sample().shape == (4,)
    kl = torch.distributions.kl_divergence(Categorical(logits=torch.zeros(2)), TorchCategorical(logits=torch.ones(2)))
    assert torch.equal(kl, torch.zeros(()))
