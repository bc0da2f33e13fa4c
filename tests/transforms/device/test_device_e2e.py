"""The CUDA-first examples migrated by the device transforms, run end to end (no Ascend hardware).

Backend npu runs under the CPU stand-in ``tests/fake_torch_npu``: with only the exact swaps the
printed numbers must equal the original's (same seed, CPU); with the reassociated ones too (fused
Adam) the trajectory and returns must match and losses agree within the stated tolerance. The
rewrite for backend cuda runs on this CPU-only torch (fused Adam has a CPU kernel in torch 2.13).
Without torch_npu on the path the rewritten code stops at once with one line naming the switch.
"""
from __future__ import annotations

from conftest import TESTS  # tests/: the corpus, fake_torch_npu and the repository root beside it
import json
import os
import re
import subprocess
import sys

import pytest

from scalebox_cst.config import Config
from scalebox_cst.report import REWRITTEN, WARNING
import harness

HERE = TESTS
ROOT = os.path.dirname(HERE)
FAKE = os.path.join(HERE, "fake_torch_npu")
REINFORCE = os.path.join(ROOT, "examples", "cuda_reinforce", "train.py")
DEMO = os.path.join(ROOT, "examples", "cuda_migration_demo", "train.py")
STEPS = "1200"


def migrate(src, backend, disabled=()):
    cfg = Config(transforms=["device.*"], disabled=list(disabled))
    with open(src, "rb") as fh:
        result = harness.rewrite_result(fh.read(), cfg, backend, path=src)
    assert result.report.error is None
    return result.output.decode(), result.report.sites


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run this file checks, started together (they are single-threaded)."""
    tmp = tmp_path_factory.mktemp("device_e2e")
    broken = tmp / "broken" / "torch_npu"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")\n')
    scripts = {"reinforce": REINFORCE, "demo": DEMO}
    for name, src in list(scripts.items()):
        for variant, backend, disabled in (
            ("npu_exact", "npu", ["device.optimizer"]),
            ("npu", "npu", []),
            ("cuda", "cuda", []),
        ):
            code, _ = migrate(src, backend, disabled)
            path = tmp / f"{name}_{variant}.py"
            path.write_text(code)
            scripts[f"{name}_{variant}"] = str(path)
    base = dict(os.environ, OMP_NUM_THREADS="1")
    base.pop("PYTHONPATH", None)
    fake = dict(base, PYTHONPATH=FAKE)
    jobs = {
        "reinforce": (scripts["reinforce"], base),
        "reinforce_npu_exact": (scripts["reinforce_npu_exact"], fake),
        "reinforce_npu": (scripts["reinforce_npu"], fake),
        "reinforce_cuda": (scripts["reinforce_cuda"], base),
        "demo": (scripts["demo"], base),
        "demo_npu_exact": (scripts["demo_npu_exact"], dict(fake, FAKE_TORCH_NPU_TRACE=str(tmp / "trace.json"))),
        "demo_npu": (scripts["demo_npu"], fake),
        "demo_cuda": (scripts["demo_cuda"], base),
        "missing": (scripts["demo_npu"], base),
        "broken": (scripts["reinforce_npu"], dict(base, PYTHONPATH=str(broken.parent))),
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, script, "--total-steps", STEPS, "--seed", "0"],
            cwd=str(tmp), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for name, (script, env) in jobs.items()
    }
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        out[name] = (proc.returncode, stdout, stderr)
    trace_path = tmp / "trace.json"
    out["trace"] = json.loads(trace_path.read_text()) if trace_path.exists() else {}
    return out


def lines(stdout):
    """Printed lines without the wall-clock dependent steps-per-second figure."""
    return [re.sub(r" sps=\d+", "", line) for line in stdout.splitlines()]


def fields(line):
    return dict(part.split("=", 1) for part in line.split())


def assert_close_lines(got, want, rel=1e-4, abs_=1e-3):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        fg, fw = fields(g), fields(w)
        assert fg.keys() == fw.keys(), (g, w)
        for key in fw:
            if key in ("step", "episode", "episode_return", "return"):
                assert fg[key] == fw[key], (g, w)  # the same trajectory
            else:
                a, b = float(fg[key]), float(fw[key])
                assert abs(a - b) <= abs_ + rel * abs(b), (key, g, w)


@pytest.mark.parametrize("name", ["reinforce", "demo"])
def test_original_runs(runs, name):
    rc, stdout, stderr = runs[name]
    assert rc == 0, stderr
    assert lines(stdout)[-1].startswith("final_return=")
    assert len(lines(stdout)) > 15


@pytest.mark.parametrize("name", ["reinforce", "demo"])
def test_npu_migration_with_exact_swaps_prints_the_same_numbers(runs, name):
    rc, stdout, stderr = runs[f"{name}_npu_exact"]
    assert rc == 0, stderr
    assert lines(stdout) == lines(runs[name][1])


@pytest.mark.parametrize("name", ["reinforce", "demo"])
def test_npu_migration_with_fused_adam_matches_within_tolerance(runs, name):
    rc, stdout, stderr = runs[f"{name}_npu"]
    assert rc == 0, stderr
    assert_close_lines(lines(stdout), lines(runs[name][1]))


def test_the_migrated_demo_really_calls_the_npu_kernels(runs):
    trace = runs["trace"]
    steps = int(STEPS)
    assert trace.get("npu_gelu") == 2 * steps  # F.gelu in the trunk, nn.GELU in the value head
    assert trace.get("npu_rms_norm") == 2 * steps  # nn.RMSNorm and F.rms_norm
    assert trace.get("npu_swiglu") == steps


@pytest.mark.parametrize("name", ["reinforce", "demo"])
def test_cuda_rewrite_runs_on_cpu_only_torch(runs, name):
    rc, stdout, stderr = runs[f"{name}_cuda"]
    assert rc == 0, stderr
    assert_close_lines(lines(stdout), lines(runs[name][1]))


def test_without_torch_npu_the_rewritten_code_stops_with_one_line(runs):
    rc, stdout, stderr = runs["missing"]
    assert rc != 0
    assert stdout == ""
    err = [line for line in stderr.splitlines() if line.strip()]
    assert len(err) == 1, stderr
    assert "torch_npu is not installed" in err[0]
    assert "scalebox rewrite --backend cpu" in err[0] and 'backend = "cpu"' in err[0]


def test_broken_torch_npu_stops_with_one_line_naming_cann(runs):
    rc, stdout, stderr = runs["broken"]
    assert rc != 0
    err = [line for line in stderr.splitlines() if line.strip()]
    assert len(err) == 1, stderr
    assert "libhccl.so" in err[0] and "CANN" in err[0] and "--backend" in err[0]


def test_reinforce_migration_report():
    code, sites = migrate(REINFORCE, "npu")
    rewritten = sorted((s.line, s.transform) for s in sites if s.action == REWRITTEN)
    assert rewritten == [
        (51, "device.fused_op"),
        (52, "device.fused_op"),
        (63, "device.placement"),
        (64, "device.placement"),
        (65, "device.placement"),
        (67, "device.placement"),
        (67, "device.placement"),
        (78, "device.optimizer"),
        (79, "device.autocast"),
        (96, "device.autocast"),
    ]
    with open(REINFORCE) as fh:
        original = fh.read()
    assert 'help="\'auto\' picks cuda when available, else cpu")' in code  # strings outside devices stay
    changed = set(original.splitlines()) - set(code.splitlines())
    assert len(changed) == 9  # the 10 sites above touch 9 lines (two on line 67)


def test_demo_migration_report():
    code, sites = migrate(DEMO, "npu")
    assert [s.line for s in sites if s.action == WARNING] == [119]  # the float64 returns, reported
    assert "torch.tensor(returns, dtype=torch.float64)" in code
    assert 'default="npu", choices=["cpu", "npu"],' in code and 'help="cuda is used when available"' in code
    assert "_scalebox_npu.swiglu(h, a, b)" in code and "model = model.npu()" in code
