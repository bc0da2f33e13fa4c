"""Backend detection survives broken torch_npu installs with one clear line."""
import os
import subprocess
import sys
import textwrap

DETECT = "from scalebox_cst.runtime.backend import detect; i = detect(); print(i.name); [print('note:', n) for n in i.notes]"


def run_detect(pythonpath, extra_env=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    env.update(extra_env or {})
    proc = subprocess.run([sys.executable, "-c", DETECT], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def write_broken_torch_npu(root):
    pkg = root / "torch_npu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "raise ImportError('libhccl.so: cannot open shared object file: No such file or directory')\n"
    )


def test_no_torch_npu_means_cpu_without_notes(tmp_path):
    assert run_detect(tmp_path) == ["cpu"]


def test_torch_npu_without_cann_is_one_note(tmp_path):
    write_broken_torch_npu(tmp_path)
    lines = run_detect(tmp_path)
    assert lines[0] == "cpu"
    assert len(lines) == 2 and "libhccl.so" in lines[1] and "CANN" in lines[1]


def test_broken_backend_autoload_breaks_import_torch_and_detection_carries_on(tmp_path):
    """torch imports device backends named by the `torch.backends` entry point group."""
    write_broken_torch_npu(tmp_path)
    dist = tmp_path / "torch_npu-2.14.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.14.0\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent("""\
        [torch.backends]
        torch_npu = torch_npu:_autoload
        """))
    # first check the premise: a plain `import torch` fails in this environment
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    plain = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, env=env, timeout=120)
    assert plain.returncode != 0 and "libhccl" in plain.stderr
    lines = run_detect(tmp_path)
    assert lines[0] == "cpu"
    assert any("TORCH_DEVICE_BACKEND_AUTOLOAD=0" in line for line in lines[1:])
    assert all("\n" not in line for line in lines)
