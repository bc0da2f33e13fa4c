"""The bundled examples, rewritten and run from a commit, as `make demo` does.

With the vectorize transforms alone every site is exact, so the rewritten run must print the
same numbers as the original (the reward curve is unchanged); with every transform on (clipping
changes semantics by design) the rewritten script must still train without error.
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, scalebox
from scalebox_cst.runner.execution import parse_metric_line

EXAMPLES = {
    "cartpole_ppo": ["--total-steps", "768"],
    "pendulum_ddpg": ["--total-steps", "1300"],
    "cuda_reinforce": ["--total-steps", "600"],
}

SPS = re.compile(r"\s*sps=\S+")


def numbers(stdout: str):
    """Progress lines without the wall-clock-dependent steps-per-second token."""
    return [SPS.sub("", line) for line in stdout.splitlines() if parse_metric_line(line)]


def copy_example(name, tmp_path):
    target = tmp_path / name
    shutil.copytree(os.path.join(ROOT, "examples", name), target)
    return target


def run_original(project, args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "train.py", *args], cwd=project, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_vectorized_example_prints_identical_numbers(name, tmp_path):
    project = copy_example(name, tmp_path)
    args = EXAMPLES[name]
    original = run_original(project, args)
    report = scalebox("rewrite", ".", "--transform", "vectorize.*", "--backend", "cpu", "--json", cwd=project).stdout
    assert '"action": "rewritten"' in report, report
    assert '"exactness": "exact"' in report
    rewritten = scalebox("run", "train.py", "--", *args, cwd=project, timeout=300).stdout
    assert numbers(rewritten) == numbers(original)
    assert "final_return=" in rewritten


def test_all_transforms_example_runs_and_records_grad_norm(tmp_path):
    project = copy_example("cartpole_ppo", tmp_path)
    scalebox("init", ".", cwd=project)
    scalebox("rewrite", ".", cwd=project)
    out = scalebox("run", "train.py", "--", "--total-steps", "512", cwd=project, timeout=300).stdout
    assert "final_return=" in out
    log = scalebox("log", cwd=project).stdout
    assert log.startswith("run/0001") and "\n  #1   ok " in log and "grad_norm=" in log
    stat = scalebox("diff", "--stat", cwd=project).stdout
    assert "train.py" in stat


#: runs a script as __main__ and then prints one digest of the final parameters and optimizer
#: state of every optimizer it made, so two runs compare on their weights, not only their prints
PARAMS_HARNESS = r'''
import hashlib, runpy, sys
import torch

_optimizers = []  # every optimizer the script makes, kept alive to read its parameters at the end
_init = torch.optim.Optimizer.__init__

def _keep(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    _optimizers.append(self)

torch.optim.Optimizer.__init__ = _keep

def _bytes(t):
    return t.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""

sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
h = hashlib.sha256()
count = 0
for opt in _optimizers:
    for group in opt.param_groups:
        for p in group["params"]:
            count += 1
            h.update(_bytes(p))
            for key, value in sorted(opt.state.get(p, {}).items()):
                if torch.is_tensor(value):
                    h.update(key.encode() + _bytes(value))
print(f"params_digest={h.hexdigest()[:32]} params={count}")
'''


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_guarded_example_is_bitwise_the_original(name, tmp_path):
    """The default grad_clip guard changes nothing on a healthy run: same printed numbers and the
    same final parameters (issue 12). The rewritten files are run directly, not from the store."""
    project = copy_example(name, tmp_path)
    args = EXAMPLES[name]
    (tmp_path / "harness.py").write_text(PARAMS_HARNESS)
    report = scalebox("rewrite", ".", "--transform", "grad_clip", "--backend", "cpu", "--json", "--out", "rewritten", cwd=project).stdout
    assert '"exactness": "exact-until-intervention"' in report, report
    env = dict(os.environ, OMP_NUM_THREADS="1")
    outs = []
    for folder in (project, project / "rewritten"):
        proc = subprocess.run([sys.executable, str(tmp_path / "harness.py"), "train.py", *args], cwd=folder,
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs.append(proc.stdout)
    assert "_scalebox_stabilize(" in (project / "rewritten" / "train.py").read_text()
    original, guarded = outs
    assert numbers(guarded) == numbers(original) and numbers(original)
    digest = [l for l in original.splitlines() if l.startswith("params_digest=")]
    assert digest and digest == [l for l in guarded.splitlines() if l.startswith("params_digest=")]
    assert "params=0" not in digest[0]
