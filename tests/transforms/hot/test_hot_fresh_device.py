"""hot.fresh_on_device: which ``make(x).to(device)`` calls are rewritten, and that original and
rewrite give the same tensor, bitwise (dtype, device, values, requires_grad), or raise the same
exception type, on the same inputs; the runtime helper against the written form on arrays of
every dtype, with NaN payloads, infinities, subnormals and large integers.
"""
import warnings

import numpy as np
import pytest
import torch

from scalebox_cst.report import EXACT, REWRITTEN
from scalebox_cst.runtime import hot_device
from scalebox_cst.runtime.hot_device import tensor_on
from scalebox_cst.transforms import REGISTRY
from scalebox_cst.transforms.hot import fresh_device
import harness


rewrite = harness.rewriter(fresh_device.ID)


def load(code):
    return harness.load(code, "f", filename="<hot>")


def same(a, b):
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if not torch.is_tensor(a):
        return a == b
    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device or a.requires_grad != b.requires_grad \
            or a.is_leaf != b.is_leaf or a.stride() != b.stride() or a.storage_offset() != b.storage_offset():
        return False  # the layout too: ``.view`` works on one where it works on the other
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def aliases(result, x):
    """Whether ``result`` (a CPU tensor) shares memory with the array ``x``: what a later write to
    either shows in the other."""
    if not (torch.is_tensor(result) and isinstance(x, np.ndarray) and result.device.type == "cpu"):
        return False
    try:
        return bool(np.shares_memory(result.detach().numpy(), x))
    except (TypeError, RuntimeError):
        return False


def outcome(fn, *args):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args)
    except Exception as exc:
        return type(exc)


def arrays(seed):
    """Arrays of every dtype, with the hard float values (NaN payloads, inf, -0.0, subnormals)."""
    rng = np.random.default_rng(seed)
    out = []
    bits = rng.integers(0, 2**63, size=64, dtype=np.int64).view(np.float64)  # arbitrary doubles, NaN payloads
    hard = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 5e-324, 1e-310, 3.4028235e38, 3.4028236e38, 1e-45])
    out.append(np.concatenate([bits, hard]).reshape(2, -1))
    with np.errstate(over="ignore"):
        out.append(np.concatenate([bits, hard]).astype(np.float32))
    out.append(rng.standard_normal((3, 4)).astype(np.float16))
    for dt in (np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32, np.int64, np.uint64):
        info = np.iinfo(dt)
        out.append(rng.integers(info.min, info.max, size=7, dtype=dt, endpoint=True))
    out.append(np.array([2**53 + 1, 2**62 + 2**39 + 1], dtype=np.int64))
    out.append(rng.integers(0, 2, size=5).astype(bool))
    out.append(np.array(3.25))  # 0-d
    out.append(np.arange(12.0).reshape(3, 4)[:, ::-1])  # negative strides: both raise
    out.append(np.arange(12.0).reshape(3, 4)[::2, 1:3])  # non-contiguous
    out.append(np.arange(4.0).astype(">f8"))  # non-native byte order
    return out


DEVICES = [torch.device("cpu"), "cpu", torch.float16, torch.zeros(1, dtype=torch.float64)]


def test_registered_after_tensor_from_arrays():
    ids = [cls.id for cls in REGISTRY]
    assert ids.index(fresh_device.ID) == ids.index("hot.tensor_from_arrays") + 1


@pytest.mark.parametrize("example", [e for e in fresh_device.EXAMPLES if e.rewritten], ids=lambda e: e.note[:40])
def test_examples_on_every_dtype_and_device_form(example):
    """Outputs and reasons: tests/transforms/test_examples_registry.py. Here: exact sites, and the
    same outcome on arrays of every dtype and layout, lists, numbers and each form of device."""
    out, sites = rewrite(example.code)
    done = [s for s in sites if s.action == REWRITTEN]
    assert done and all(s.exactness == EXACT for s in done)
    orig, new = load(example.code), load(out)
    inputs = arrays(0) + [[1.0, 2.0], [[1, 2], [3, 4]], 2.5]
    for x in inputs:
        for device in DEVICES:
            a, b = outcome(orig, x, device), outcome(new, x, device)
            assert same(a, b), (x, device, a, b)
            for r, q in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
                assert aliases(r, x) == aliases(q, x), (x, device)
    # an int is a size to the legacy constructors (uninitialised memory): same shapes and dtypes
    a, b = outcome(orig, 7, "cpu"), outcome(new, 7, "cpu")
    def kinds(r):
        return r if isinstance(r, type) else [(t.dtype, t.shape) for t in (r if isinstance(r, tuple) else (r,))]
    assert kinds(a) == kinds(b)


@pytest.mark.parametrize("make", [torch.FloatTensor, torch.DoubleTensor, torch.Tensor, torch.tensor])
@pytest.mark.parametrize("seed", range(3))
def test_runtime_matches_written_form(make, seed):
    for x in arrays(seed) + [[1.5, 2.5], 2.5]:
        for device in DEVICES:
            kwargs_list = [{}] + ([{"dtype": d} for d in (torch.float32, torch.float64, torch.float16, torch.int32)]
                                  if make is torch.tensor else [])
            for kw in kwargs_list:
                a = outcome(lambda: make(x, **kw).to(device))
                b = outcome(lambda: tensor_on(make, x, device, **kw))
                assert same(a, b), (make, x, device, kw, a, b)
                assert aliases(a, x) == aliases(b, x), (make, x.dtype if hasattr(x, "dtype") else x, device, kw)


@pytest.mark.parametrize("make", [torch.FloatTensor, torch.DoubleTensor, torch.Tensor])
@pytest.mark.parametrize("dt", [np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32, np.bool_, np.float32, np.float64])
def test_a_0d_integer_array_is_a_size_as_in_the_original(make, dt):
    """To a legacy constructor a 0-d integer array is a size (uninitialised elements; -1 raises),
    a 0-d float or bool array a value: the same shapes, dtypes and errors on both paths."""
    for v in (3, 0, -1) if np.dtype(dt).kind == "i" else (3, 0):
        x = np.array(v, dtype=dt)
        a, b = outcome(lambda: make(x).to("cpu")), outcome(lambda: tensor_on(make, x, "cpu"))
        if isinstance(a, type) or isinstance(b, type):
            assert a is b, (make, dt, v)
        else:
            assert (a.shape, a.dtype) == (b.shape, b.dtype), (make, dt, v)
            if np.dtype(dt).kind in "fb":
                assert same(a, b)


def test_runtime_follows_the_default_dtype():
    x = np.linspace(0, 1, 7)
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        assert same(tensor_on(torch.Tensor, x, "cpu"), torch.Tensor(x).to("cpu"))
        assert tensor_on(torch.Tensor, x, "cpu").dtype == torch.float64
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize("default", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("dt", [np.float64, np.float32, np.int32, np.bool_])
def test_torch_Tensor_under_another_default_dtype(default, dt):
    """``torch.Tensor`` makes the default dtype, float16 and bfloat16 too: no numpy twin there
    (numpy reads a comparison with None as one with float64: a float64 array came out float64)."""
    x = (np.arange(6) * 12345.678).astype(dt)
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(default)
        for device in ("cpu", torch.device("cpu")):
            a, b = outcome(lambda: torch.Tensor(x).to(device)), outcome(lambda: tensor_on(torch.Tensor, x, device))
            assert same(a, b) and a.dtype == default, (default, dt, a, b)
            assert aliases(a, x) == aliases(b, x)
    finally:
        torch.set_default_dtype(old)


def spy_from_numpy(monkeypatch):
    """The arrays tensor_on reads through torch.from_numpy (its own path), in order."""
    calls = []
    real = torch.from_numpy

    def spy(a):
        calls.append(a)
        return real(a)

    monkeypatch.setattr(hot_device.torch, "from_numpy", spy)
    return calls


def test_own_path_taken_only_where_it_is_the_same(monkeypatch):
    """Its own path runs for arrays of the exact dtypes and device targets, never for the rest."""
    calls = spy_from_numpy(monkeypatch)
    taken = [np.zeros(3), np.zeros(3, dtype=np.float32), np.zeros((2, 3), dtype=np.int32)]
    for x in taken:
        tensor_on(torch.FloatTensor, x, torch.device("cpu"))
    assert [id(c) for c in calls] == [id(x) for x in taken]
    calls.clear()
    for x, device in [(np.zeros(3, dtype=np.int64), "cpu"), (np.zeros(3, dtype=np.float16), "cpu"),
                      ([0.0, 1.0], "cpu"), (np.zeros(3), torch.float64), (np.array(3, dtype=np.int32), "cpu")]:
        tensor_on(torch.FloatTensor, x, device)
    assert calls == []


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_a_read_only_array_takes_the_call_as_written(monkeypatch, dt):
    """The legacy constructor warns of a read-only array (once a program, cast or not): that
    warning is the user's, so such an array is never read through the rewrite's own path (its
    ``torch.tensor`` had dropped the warning)."""
    calls = spy_from_numpy(monkeypatch)
    written = []
    monkeypatch.setattr(hot_device, "call_at_caller", lambda fn, args, kw: written.append(fn) or fn(*args, **kw))
    a = np.arange(3, dtype=dt)
    a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = tensor_on(torch.FloatTensor, a, "cpu")
    assert calls == [] and written == [torch.FloatTensor] and t.dtype == torch.float32


def test_a_torch_function_mode_sees_the_call_as_written(monkeypatch):
    """Under a ``__torch_function__`` mode (a device context, fake tensors, a tracer) the call is
    the user's: a mode may see ``from_numpy`` and not the legacy constructor."""
    calls = spy_from_numpy(monkeypatch)

    class Seen(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Seen():
        t = tensor_on(torch.FloatTensor, np.zeros(3), "cpu")
    assert calls == [] and t.dtype == torch.float32


def test_torch_Tensor_with_a_gpu_default_tensor_type_takes_the_call_as_written(monkeypatch):
    """``torch.set_default_tensor_type(torch.cuda.FloatTensor)``: ``torch.Tensor(a_f32)`` copies to
    the GPU, then ``.to("cpu")`` copies back, where ``from_numpy`` would share the array."""
    calls = spy_from_numpy(monkeypatch)
    monkeypatch.setattr(hot_device.torch._C, "_get_default_device", lambda: "cuda")
    tensor_on(torch.Tensor, np.zeros(3, dtype=np.float32), "cpu")
    assert calls == []
    tensor_on(torch.FloatTensor, np.zeros(3, dtype=np.float32), "cpu")  # a CPU type whatever the default
    assert len(calls) == 1


def test_an_array_of_the_tensors_dtype_made_for_the_cpu_stays_shared():
    """Found on sample-factory / DI-engine code: ``torch.FloatTensor(a_f32).to("cpu")`` shares the
    array's memory (a later ``a[0] = 7`` shows in the tensor); the rewrite keeps that."""
    for make, dt in [(torch.FloatTensor, np.float32), (torch.DoubleTensor, np.float64), (torch.Tensor, np.float32)]:
        for device in ("cpu", torch.device("cpu")):
            a = np.zeros(3, dtype=dt)
            t = tensor_on(make, a, device)
            a[0] = 7
            assert t[0].item() == 7.0, (make, device)
            t[1] = 5
            assert a[1] == 5
        for device in ("cpu:0", torch.device("cpu", 0)):  # ``.to`` an indexed CPU device copies: both copy
            a, b = np.zeros(3, dtype=dt), np.zeros(3, dtype=dt)
            t, u = make(a).to(device), tensor_on(make, b, device)
            a[0] = b[0] = 7
            assert t[0].item() == u[0].item()
    b = np.zeros(3, dtype=np.float64)  # a cast copies on both paths: the one-call path stays
    t = tensor_on(torch.FloatTensor, b, "cpu")
    b[0] = 7
    assert t[0].item() == 0.0 and t.dtype == torch.float32


def test_rewritten_source_keeps_evaluation_order_and_arguments():
    out, _ = rewrite("import torch\ndef g(s, dev):\n    return torch.FloatTensor(s.reshape(1, -1)).to(self.dev)\n")
    assert "_sb_tensor_on(torch.FloatTensor, s.reshape(1, -1), self.dev)" in out


def test_a_newline_before_the_inner_parenthesis_leaves_no_trailing_blank():
    """Found on DI-engine: ``_sb_tensor_on(torch.Tensor, x, \\n device)`` (a comma and a space
    before the newline that stood before the constructor's ``)``)."""
    out, _ = rewrite("import torch\ndef g(x, dev):\n    return torch.Tensor(x\n                        ).to(dev)\n")
    assert "_sb_tensor_on(torch.Tensor, x, dev)" in out and " \n" not in out


def test_non_torch_to_calls_are_not_sites():
    src = "import torch\ndef g(m, x, dev):\n    return m(x).to(dev), x.float().to(dev), torch.zeros(3).to(dev)\n"
    out, sites = rewrite(src)
    assert out == src and not sites


def test_signed_literal_sizes_are_not_data():
    # a unary sign on a literal size (``-3``, ``+2``) is still a size: left alone, and it must not fail the
    # whole file (the old code read ``UnaryOperation.operand``, which libcst does not have)
    src = ("import torch\ndef g(s, dev):\n    a = torch.FloatTensor(-3).to(dev)\n    b = torch.Tensor(+2).to(dev)\n"
           "    return a, b, torch.FloatTensor(s).to(dev)\n")
    out, sites = rewrite(src)
    assert "torch.FloatTensor(-3).to(dev)" in out and "torch.Tensor(+2).to(dev)" in out
    assert "_sb_tensor_on(torch.FloatTensor, s, dev)" in out
    assert [s.action for s in sites] == [REWRITTEN]


def test_a_number_literal_given_to_torch_tensor_is_no_site():
    """pranz24/pytorch-soft-actor-critic's ``alpha_loss = torch.tensor(0.).to(self.device)`` was
    skipped with 'left alone, as a list given to it measured 0.44x': no list is given there. A
    number literal is never the array the helper serves (as a literal size is not, for the legacy
    constructors): no site; a name or a list display keeps the reason, which is true of them."""
    src = ("import torch\ndef g(s, dev):\n    a = torch.tensor(0.).to(dev)\n    b = torch.tensor(-1).to(dev)\n"
           "    return a, b, torch.tensor(s).to(dev), torch.tensor([1., 2.]).to(dev)\n")
    out, sites = rewrite(src)
    assert out == src
    assert [s.line for s in sites] == [5, 5] and all("a list given to it" in s.reason for s in sites)
