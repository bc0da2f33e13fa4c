"""Issue 14's NPU migration gaps: device strings built at run time, ``torch.cuda.device``, the
legacy tensor types (``torch.cuda.FloatTensor`` ...) and the ``is_available()`` guards around
what stays CUDA-only. Differential runs: the original on a CPU host against the rewrite on the
NPU stand-in (tests/fake_torch_npu), same outputs; look-alikes stay untouched."""
from __future__ import annotations

from conftest import TESTS  # tests/: the corpus, fake_torch_npu and the repository root beside it
import ast
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from scalebox_cst.report import REWRITTEN, SKIPPED
import harness

HERE = TESTS
FAKE = os.path.join(HERE, "fake_torch_npu")
LOOKUP = "placement.legacy."


def rewrite(src, backend="npu", **options):
    return harness.rewrite(src, "device.*", backend, dedent=False, options={"device": options})  # tests/harness.py


def run(code, tmp_path, name, fake):
    """Run ``code`` in a fresh interpreter (on the stand-in when ``fake``); its stdout as JSON."""
    path = tmp_path / f"{name}.py"
    path.write_text(code)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    if fake:
        env["PYTHONPATH"] = FAKE
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ device strings built at run time

FORMS = [
    '"cuda:%d" % i',
    '"cuda:%i" % (i,)',
    '"cuda:" + str(i)',
    '"cuda:{}".format(i)',
    '"{}:{}".format("cuda", i)',
    '"%s:%d" % ("cuda", i)',
    'f"cuda:{i}"',
    '"cuda" if i < 0 else "cuda:%d" % i',
]
NOT_PROVABLE = ['"cuda%d" % i', '"cuda:%d,%d" % (i, i)', '"cuda:{}{}".format(i, i)', '"cuda_" + str(i)']
LOOKALIKES = ['"gpu:%d" % i', '"%s:%d" % ("cpu", i)', '"{}:{}".format(kind, i)']


def _device_arg(code):
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.device":
            return ast.unparse(node.args[0])
    raise AssertionError(code)


@settings(max_examples=40, deadline=None)
@given(form=st.sampled_from(FORMS), i=st.integers(0, 15))
def test_built_device_strings_migrate_to_the_same_string_on_npu(form, i):
    src = f"import torch\ni = {i}\nd = torch.device({form})\nprint({form})\n"
    out, sites = rewrite(src)
    before, after = eval(form, {"i": i}), eval(_device_arg(out), {"i": i})  # noqa: S307 - our own test forms
    assert before.startswith("cuda") and after == "npu" + before[len("cuda"):]
    assert f"print({form})" in out  # the same string outside a device argument is left alone
    assert any(s.action == REWRITTEN and s.line == 3 for s in sites)


@pytest.mark.parametrize("form", NOT_PROVABLE)
def test_built_device_strings_that_are_not_provably_an_index_are_reported(form):
    src = f"import torch\ni = 0\nd = torch.device({form})\n"
    out, sites = rewrite(src)
    assert out == src
    (site,) = [s for s in sites if s.line == 3]
    assert site.action == SKIPPED and "not provably 'cuda' or 'cuda:<index>'" in site.reason


@pytest.mark.parametrize("form", LOOKALIKES)
def test_built_strings_without_cuda_are_untouched_and_unreported(form):
    src = f"import torch\ni = 0\nkind = 'cpu'\nd = torch.device({form})\n"
    out, sites = rewrite(src)
    assert out == src and not [s for s in sites if s.line == 4]


def test_cuda_device_context_manager_becomes_the_npu_one(tmp_path):
    src = "import torch\nwith torch.cuda.device(0):\n    x = torch.zeros(2, device='cuda')\nprint(json.dumps(x.tolist()))\n"
    out, sites = rewrite("import json\n" + src)
    assert "with torch.npu.device(0):" in out and "device='npu'" in out
    assert not [s for s in sites if s.kind == "not-migratable:torch.cuda"]
    assert run(out, tmp_path, "ctx", fake=True) == [0.0, 0.0]


# ------------------------------------------------------------------ legacy tensor types

def test_constructor_forms():
    src = (
        "import torch as th\n"
        "from torch.cuda import LongTensor\n"
        "a = th.cuda.FloatTensor(3, 4)\n"
        "b = th.cuda.FloatTensor((1.5, 2))\n"
        "c = LongTensor(idx)\n"
        "d = th.cuda.ByteTensor(*shape)\n"
        "e = th.cuda.HalfTensor()\n"
        "f = x.cuda().type(th.cuda.IntTensor, non_blocking=True)\n"
    )
    out, sites = rewrite(src)
    assert 'a = th.empty(3, 4, dtype=th.float32, device="npu")' in out
    assert 'b = th.tensor((1.5, 2), dtype=th.float32, device="npu")' in out
    assert "c = th.LongTensor(idx).npu()" in out
    assert "d = th.ByteTensor(*shape).npu()" in out
    assert 'e = th.empty(0, dtype=th.float16, device="npu")' in out
    assert 'f = x.npu().to(device="npu", dtype=th.int32, non_blocking=True)' in out
    assert sum(s.action == REWRITTEN and s.reason.startswith("torch.cuda.") and "Tensor" in s.reason for s in sites) == 6


def test_double_tensor_needs_the_precision_option():
    src = "import torch\nx = torch.cuda.DoubleTensor([1.0, 2.0])\n"
    out, sites = rewrite(src)
    assert out == src
    (site,) = [s for s in sites if s.transform == "device.placement"]
    assert site.action == SKIPPED and site.kind == "not-migratable:float64" and "no float64" in site.reason
    out, sites = rewrite(src, allow_precision_change=True)
    assert 'torch.tensor([1.0, 2.0], dtype=torch.float32, device="npu")' in out


def test_lookalikes_stay_untouched():
    src = (
        "import torch\n"
        "import mylib.cuda as cuda\n"
        "a = torch.FloatTensor(3)\n"  # the CPU type
        "b = cuda.FloatTensor(3)\n"  # not torch's
        "c = x.type(torch.FloatTensor)\n"
        "d = torch.tensor([1.0], dtype=torch.float32)\n"
    )
    out, sites = rewrite(src)
    assert out == src and not [s for s in sites if s.action == REWRITTEN]


LEGACY_SCRIPT = '''import json
import numpy as np
import torch
use_cuda = torch.cuda.is_available()
FloatTensor = torch.cuda.FloatTensor if use_cuda else torch.FloatTensor
LongTensor = torch.cuda.LongTensor if use_cuda else torch.LongTensor
rng = np.random.default_rng(0)
out = {}
for k in range(20):
    state = rng.standard_normal((4, 3)).astype(np.float32)
    s = FloatTensor(state)
    a = LongTensor(rng.integers(0, 3, size=(4,)).tolist())
    q = s.gather(1, a.unsqueeze(1)).squeeze(1)
    out[k] = [q.cpu().tolist(), str(q.dtype), str(a.dtype)]
if torch.cuda.is_available():
    e = torch.cuda.FloatTensor(2, 3)
    t = torch.cuda.ByteTensor([1, 0, 1])
    u = s.type(torch.cuda.FloatTensor)
else:
    e = torch.FloatTensor(2, 3)
    t = torch.ByteTensor([1, 0, 1])
    u = s.type(torch.FloatTensor)
out["shapes"] = [list(e.shape), str(e.dtype), t.tolist(), str(t.dtype), u.cpu().tolist(), str(u.dtype)]
out["branch_is_device"] = bool(use_cuda)
print(json.dumps(out))
'''


def test_legacy_types_run_on_the_npu_as_the_original_on_the_cpu(tmp_path):
    out, sites = rewrite(LEGACY_SCRIPT)
    assert "torch.cuda" not in out
    assert not [s for s in sites if s.action == SKIPPED]
    original = run(LEGACY_SCRIPT, tmp_path, "original", fake=False)
    migrated = run(out, tmp_path, "migrated", fake=True)
    assert original.pop("branch_is_device") is False and migrated.pop("branch_is_device") is True
    assert migrated == original  # bitwise: the same values, dtypes and shapes


# ------------------------------------------------------------------ guards around what stays

GUARDED = '''import json
import torch
USE_CUDA = torch.cuda.is_available()
if torch.cuda.is_available():
    x = torch.cuda.FloatTensor([1.0, 2.0], device=0)
    cap = torch.cuda.get_device_capability()
else:
    x = torch.FloatTensor([1.0, 2.0])
Tensor = torch.cuda.FloatTensor if USE_CUDA else torch.FloatTensor
ok = isinstance(x, Tensor)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
y = torch.ones(2, device=device)
print(json.dumps([x.tolist(), ok, y.tolist()]))
'''


def test_a_guard_around_code_that_stays_is_not_migrated(tmp_path):
    out, sites = rewrite(GUARDED)
    assert "USE_CUDA = torch.cuda.is_available()" in out
    assert "if torch.cuda.is_available():" in out
    assert 'torch.device("npu" if torch.npu.is_available() else "cpu")' in out  # its branch migrates
    kept = [s for s in sites if s.action == SKIPPED and "kept: the branch it opens" in s.reason]
    assert sorted(s.line for s in kept) == [3, 4]
    assert any("get_device_capability" in s.reason or "device=" in s.reason for s in kept if s.line == 4)
    assert any("alias `Tensor`" in s.reason for s in kept if s.line == 3)
    original = run(GUARDED, tmp_path, "original", fake=False)
    assert run(out, tmp_path, "migrated", fake=True) == original  # the CPU branch, as the original took


def test_a_guard_whose_branch_migrates_whole_is_migrated():
    src = "import torch\nif torch.cuda.is_available():\n    x = torch.cuda.FloatTensor(2)\n    torch.cuda.synchronize()\n"
    out, sites = rewrite(src)
    assert "if torch.npu.is_available():" in out and 'torch.empty(2, dtype=torch.float32, device="npu")' in out
    assert "torch.npu.synchronize()" in out
    assert not [s for s in sites if s.action == SKIPPED]


def test_a_negated_guard_is_kept_when_its_else_branch_stays():
    src = (
        "import torch\n"
        "if not torch.cuda.is_available():\n"
        "    x = torch.zeros(2)\n"
        "else:\n"
        "    x = torch.zeros(2).cuda()\n"
        "    torch.cuda.nvtx.range_push('step')\n"
    )
    out, sites = rewrite(src)
    assert "if not torch.cuda.is_available():" in out and "x = torch.zeros(2).npu()" in out
    (kept,) = [s for s in sites if s.action == SKIPPED]
    assert kept.line == 2 and "torch.cuda.nvtx.range_push" in kept.reason


# rl_games' GAE: `x.is_cuda` picked a Triton kernel; swapped to `x.is_npu` alone, an NPU host
# launched the CUDA-only kernel (through a flag, and a function of the file reaching it).
TRITON_GATE = '''import torch
USE_TRITON = True
try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None
if triton is not None:
    @triton.jit
    def _kernel(x_ptr, n: tl.constexpr):
        pass
def _triton_gae(x):
    _kernel[(1,)](x, 4)
    return x
def _torch_gae(x):
    return x * 2
def compute(x):
    use_triton = USE_TRITON and x.is_cuda
    if use_triton:
        return _triton_gae(x)
    return _torch_gae(x)
def direct(x):
    if x.is_cuda:
        return triton.cdiv(4, 2)
    return 0
'''


def test_an_is_cuda_test_of_a_cuda_only_library_is_kept():
    out, sites = rewrite(TRITON_GATE)
    assert "use_triton = USE_TRITON and x.is_cuda" in out and "    if x.is_cuda:" in out
    kept = sorted((s.line, s.reason) for s in sites if s.action == SKIPPED and "kept: the branch it opens" in s.reason)
    assert [line for line, _ in kept] == [18, 23], kept
    assert "`_triton_gae` (line 20), which reaches the CUDA-only `triton.jit` (line 9)" in kept[0][1]
    assert "`triton.cdiv` (line 24), CUDA-only" in kept[1][1]


@pytest.mark.parametrize("body", [
    "return torch.nn.utils.clip_grad_norm_(ps, 1.0)",  # pfrl: the fast path runs on an NPU too
    "return _torch_gae(x)",
])
def test_an_is_cuda_test_of_code_that_migrates_is_swapped(body):
    src = TRITON_GATE.replace("        return triton.cdiv(4, 2)", f"        {body}")
    out, sites = rewrite(src)
    assert "    if x.is_npu:" in out
    assert "use_triton = USE_TRITON and x.is_cuda" in out  # the Triton one stays


# ------------------------------------------------------------------ text tests of a migrated device string

TEXT_TESTS = '''import json
import torch
dev = "cuda" if torch.cuda.is_available() else "cpu"
idx = "cuda:0" if torch.cuda.is_available() else "cpu"
x = torch.ones(2, device=dev)
y = torch.ones(2, device=idx)
print(json.dumps({"in": "cuda" in dev, "not_in": "cuda" not in idx, "str_in": "cuda" in str(dev),
                  "prefix": idx.startswith("cuda:"), "prefixes": dev.startswith(("mps", "cuda")),
                  "type": idx.split(":")[0] == "cuda", "parts": "cuda" in idx.split(":"),
                  "partition": idx.partition(":")[0] != "cuda", "slice": idx[:4] == "cuda",
                  "sum": (x + y).tolist()}))
'''


def test_substring_and_prefix_tests_of_a_device_string_migrate_with_it(tmp_path):
    """``"cuda" in device`` and ``device.startswith("cuda")`` (pin_memory / AMP switches) answered
    True on a CUDA host; with the string migrated and the test not, they answered False on the NPU."""
    out, sites = rewrite(TEXT_TESTS)
    assert '"npu" in dev' in out and '"npu" not in idx' in out and '"npu" in str(dev)' in out
    assert 'idx.startswith("npu:")' in out and 'dev.startswith(("mps", "npu"))' in out
    assert 'idx.split(":")[0] == "npu"' in out and '"npu" in idx.split(":")' in out and 'idx.partition(":")[0] != "npu"' in out
    assert 'idx[:3] == "npu"' in out  # the slice's bound follows the literal's length
    original = run(TEXT_TESTS, tmp_path, "original", fake=False)
    migrated = run(out, tmp_path, "migrated", fake=True)
    # the NPU host takes the device branch, which the CPU host does not: each test says so
    assert original == {"in": False, "not_in": True, "str_in": False, "prefix": False, "prefixes": False,
                        "type": False, "parts": False, "partition": True, "slice": False, "sum": [2.0, 2.0]}
    assert migrated == {"in": True, "not_in": False, "str_in": True, "prefix": True, "prefixes": True,
                        "type": True, "parts": True, "partition": False, "slice": True, "sum": [2.0, 2.0]}


@pytest.mark.parametrize("line", [
    'ok = "cuda" in log_line',  # not a device string
    'ok = name.startswith("cuda")',
    'ok = dev.endswith("cuda")',  # only prefixes and substrings
    'ok = "cuda" in dev.split("/")',  # parts at another separator
    'ok = dev.split(":")[1] == "cuda"',  # not the type
    'ok = dev[:5] == "cuda"',  # a bound that is not the literal's length
    'ok = dev.startswith("cpu")',
])
def test_text_tests_that_are_not_of_a_device_string_stay(line):
    src = f'import torch\ndev = "cuda"\nx = torch.ones(1, device=dev)\nname = "cuda_kernels"\n{line}\n'
    out, _ = rewrite(src)
    assert line in out and 'dev = "npu"' in out


def test_a_rebound_str_is_not_the_builtin():
    src = 'import torch\nstr = repr\ndev = "cuda"\nx = torch.ones(1, device=dev)\nok = "cuda" in str(dev)\n'
    out, _ = rewrite(src)
    assert 'ok = "cuda" in str(dev)' in out
