"""accelerate.threads and runtime/intra_op.py: one intra-op thread for small networks (--fast, CPU).

What is checked: nothing at the default level or off CPU; each example wrapped (reassociated
site) or left byte for byte with its reason; the wrapped call returns the very optimizer; the
helper caps torch at one thread only the first time, only where no thread variable is set,
torch runs several threads and the optimizer is small (a child process each: the thread count
is process-wide).
"""
import os
import subprocess
import sys

import harness
import pytest

from scalebox_cst.report import REASSOCIATED, REWRITTEN, SKIPPED
from scalebox_cst.transforms import REGISTRY
from scalebox_cst.transforms.accelerate.threads import ID, AccelerateThreads

FAST = {"accelerate": {"level": "reassociated"}}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def rewrite(code, options=FAST, backend="cpu"):
    return harness.rewrite(code, ID, backend, dedent=False, options=options)


def test_registered_and_off_at_the_default_level_and_off_cpu():
    assert ID in [cls.id for cls in REGISTRY]
    code = AccelerateThreads.EXAMPLES[0].code
    for options, backend in ((None, "cpu"), ({"accelerate": {"level": "exact"}}, "cpu"), (FAST, "cuda")):
        out, sites = rewrite(code, options, backend)
        assert out == code and not sites


@pytest.mark.parametrize("example", AccelerateThreads.EXAMPLES, ids=lambda e: e.note[:40])
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
    assert out.count("_sbx_one_thread(") == 1
    ns = harness.load(out)
    opt = next(v for k, v in ns.items() if k in ("optimizer", "opt", "sched"))
    assert type(opt).__module__.startswith("torch.optim")


_CHILD = """
import torch, torch.nn as nn
torch.set_num_threads(2)  # before the import: stands for torch's start on a machine of two cores
from scalebox_cst.runtime import intra_op
intra_op._torch_default = lambda: {default}
{after_import}
net = nn.Linear({n}, {n})
opt = torch.optim.Adam(net.parameters())
assert intra_op.one_thread_for_small_nets(opt) is opt
first = torch.get_num_threads()
torch.set_num_threads(3)
intra_op.one_thread_for_small_nets(torch.optim.Adam(nn.Linear(2, 2).parameters()))
print(first, torch.get_num_threads())
"""


@pytest.mark.parametrize("n,env,default,after_import,expect", [
    (8, {}, 2, "", "1 3"),                                    # small, nothing set: capped once, never again
    (1100, {}, 2, "", "2 3"),                                 # 1.2e6 parameters: torch's threads kept
    (8, {"OMP_NUM_THREADS": "2"}, 2, "", "2 3"),             # the user set the variable
    (8, {"MKL_NUM_THREADS": "2"}, 2, "", "2 3"),
    (8, {"SCALEBOX_THREADS": "keep"}, 2, "", "2 3"),
    (8, {}, 4, "", "2 3"),                                    # a count other than torch's default: chosen
    (8, {}, 2, "torch.set_num_threads(2)", "2 3"),            # set by the code after the import
])
def test_helper_caps_only_small_nets_with_nothing_set(n, env, default, after_import, expect):
    child_env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "SCALEBOX_THREADS")}
    child_env.update(env, PYTHONPATH=ROOT)
    code = _CHILD.format(n=n, default=default, after_import=after_import)
    out = subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == expect.split()


def test_torchs_default_is_what_a_fresh_process_starts_with():
    code = "import torch\nfrom scalebox_cst.runtime import intra_op\nprint(torch.get_num_threads(), intra_op._torch_default())"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=120)
    got, default = out.stdout.split()
    assert got == default
