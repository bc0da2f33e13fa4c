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
from scalebox_cst.runtime.executor import parse_metric_line

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
    assert "run/0001" in log and "[ok " in log and "grad_norm=" in log
    stat = scalebox("diff", "--stat", cwd=project).stdout
    assert "train.py" in stat
