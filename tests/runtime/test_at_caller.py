"""Fallbacks run from the user's line: what they warn is reported where the original warned.

Each case runs in a fresh interpreter: torch's C++ warnings (``TORCH_WARN_ONCE``) fire once per
process, and the once-per-location registry must start empty.
"""
import os
import subprocess
import sys
import textwrap

from conftest import ROOT

ORIGINAL = """\
import numpy as np, torch
rows = [np.ones(3, dtype=np.float64)] + [np.ones(3, dtype=np.float32) for _ in range(39)]
x = {call}
print(x.dtype, float(x.sum()))
"""


def run(tmp_path, call, prelude=""):
    script = tmp_path / "user.py"
    script.write_text(prelude + ORIGINAL.format(call=call))
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", PYTHONWARNINGS="default")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout, [line for line in done.stderr.splitlines() if line.strip()]


def test_torch_warning_of_a_fallback_is_at_the_users_line(tmp_path):
    """Mixed dtypes make tensor_from_arrays fall back to torch.tensor(list): torch's C++ warning
    names user.py and the call's line and quotes it, as the original's does."""
    out, err = run(tmp_path, "torch.tensor(rows)")
    prelude = "from scalebox_cst.runtime.hot_tensors import tensor_from_arrays\n"
    out2, err2 = run(tmp_path, "tensor_from_arrays(torch.tensor, rows)", prelude)
    assert out == out2 and out.startswith("torch.float64 120.0")
    path = str(tmp_path / "user.py")
    assert err[0].startswith(f"{path}:3: UserWarning: Creating a tensor from a list of numpy.ndarrays"), err
    assert err2[0].startswith(f"{path}:4: UserWarning: Creating a tensor from a list of numpy.ndarrays"), err2
    assert err2[1].strip() == "x = tensor_from_arrays(torch.tensor, rows)"


def test_fresh_device_fallback_warns_at_the_users_line(tmp_path):
    """``torch.FloatTensor(list of arrays).to(device)`` through tensor_on (a list: the fallback)."""
    out, err = run(tmp_path, "torch.FloatTensor(rows).to('cpu')")
    prelude = "from scalebox_cst.runtime.hot_device import tensor_on\n"
    out2, err2 = run(tmp_path, "tensor_on(torch.FloatTensor, rows, 'cpu')", prelude)
    assert out == out2 and out.startswith("torch.float32 120.0")
    path = str(tmp_path / "user.py")
    assert err[0].startswith(f"{path}:3: UserWarning: Creating a tensor from a list of numpy.ndarrays"), err
    assert err2[0].startswith(f"{path}:4: UserWarning: Creating a tensor from a list of numpy.ndarrays"), err2


def test_python_warnings_module_and_registry_are_the_callers(tmp_path):
    """A ``warnings.warn`` at stacklevel 1 inside the call: the caller's module name and registry,
    so a second call from the same line is silenced under the default filter, as in the original."""
    helper = tmp_path / "helper.py"
    helper.write_text(textwrap.dedent("""\
        import warnings
        from scalebox_cst.runtime.at_caller import call_at_caller

        def through(fn, *args):
            return call_at_caller(fn, args, {})
        """))
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent("""\
        import warnings, helper
        for _ in range(3):
            helper.through(warnings.warn, "once per line")
        assert "__warningregistry__" in globals()
        assert not hasattr(helper, "__warningregistry__")
        print(helper.through(divmod, 7, 2))
        """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, str(tmp_path)]), PYTHONWARNINGS="default")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "(3, 1)\n"
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[0] == f"{script}:3: UserWarning: once per line" and len(lines) == 2, lines
