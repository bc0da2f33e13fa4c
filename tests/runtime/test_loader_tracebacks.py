"""A traceback through an import the engine served reads as Python's own: no frame of the
engine's loaders (``exec_module``) nor the importlib frames that lead to them, as CPython leaves
out its own loaders' frames. A user module that raises at import, or imports a package that is
not installed, is the first thing a newcomer's run meets."""
from __future__ import annotations

import os
import subprocess
import sys
import traceback

import pytest

from conftest import scalebox
from scalebox_cst.runtime import loader

HELPERS = {
    "raises": "x = 1\nraise ValueError('in helper')\n",
    "missing": "import no_such_module_sbx17\n",
    # imported inside a function, after the script started
    "late": "def f():\n    import raises\n",
}


@pytest.fixture
def imports(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    for name, text in HELPERS.items():
        (root / f"{name}.py").write_text(text)
    (root / "scalebox.toml").write_text('backend = "cpu"\n')
    return root


def _python_traceback(root, main):
    """What ``python main.py`` prints on stderr: the traceback the run must show."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, main], cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.startswith("Traceback")
    return proc.stderr


@pytest.mark.parametrize("main", [
    "import raises\n",
    "import missing\n",
    "import late\nprint('started')\nlate.f()\n",
])
def test_a_run_shows_the_traceback_python_shows_for_an_import_that_raises(imports, main):
    (imports / "main.py").write_text(main)
    expected = _python_traceback(imports, "main.py")
    scalebox("rewrite", str(imports))
    for args in (("run", "main.py"), ("run", "--original", "main.py")):
        proc = scalebox(*args, cwd=imports, check=False)
        assert proc.returncode == 1
        shown = proc.stderr[proc.stderr.index("Traceback"):proc.stderr.rindex("\nscalebox: ") + 1]
        assert shown == expected, (args, proc.stderr)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("SCALEBOX_HOOK_SESSION", None)
    hooked = subprocess.run([sys.executable, "-m", "scalebox_cst", "main.py"], cwd=imports, env=env,
                            capture_output=True, text=True, timeout=120)
    assert hooked.returncode == 1 and hooked.stderr == expected  # nothing rewritten: the hook's frames too


def test_a_syntax_error_in_an_imported_module_shows_no_frame_of_the_engine(imports):
    """A SyntaxError's own lines say where it is: python leaves its import machinery out; the hook
    showed its loader's ``get_code`` frame between the importing line and the error."""
    (imports / "broken.py").write_text("x = (\n")
    (imports / "main.py").write_text("import broken\n")
    expected = _python_traceback(imports, "main.py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("SCALEBOX_HOOK_SESSION", None)
    hooked = subprocess.run([sys.executable, "-m", "scalebox_cst", "main.py"], cwd=imports, env=env,
                            capture_output=True, text=True, timeout=120)
    assert hooked.returncode == 1
    assert hooked.stderr[hooked.stderr.index("Traceback"):] == expected, hooked.stderr
    scalebox("rewrite", str(imports), check=False)  # broken.py: carried as it is, said in one line
    for args in (("run", "main.py"), ("run", "--original", "main.py")):
        proc = scalebox(*args, cwd=imports, check=False)
        assert proc.returncode == 1
        shown = proc.stderr[proc.stderr.index("Traceback"):proc.stderr.rindex("\nscalebox: ") + 1]
        assert shown == expected, (args, proc.stderr)


def test_a_script_that_does_not_compile_reads_as_pythons_own_error_under_the_hook(tmp_path):
    """``python -m scalebox_cst main.py`` of a script with a syntax error: python's own lines
    (file, line, caret, message) and status 1; the hook showed runpy's, its own entry point's and
    its compile's frames in a traceback above them."""
    (tmp_path / "main.py").write_text("x = (\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("SCALEBOX_HOOK_SESSION", None)
    plain = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    hooked = subprocess.run([sys.executable, "-m", "scalebox_cst", "main.py"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert plain.returncode == hooked.returncode == 1
    assert hooked.stderr.endswith(plain.stderr) and "Traceback" not in hooked.stderr, hooked.stderr


def _frame(filename, name, line=1):
    return traceback.FrameSummary(filename, line, name, lookup_line=False, line="")


def test_import_machinery_frames_are_left_out_only_on_the_way_to_other_frames():
    @loader.import_machinery
    def exec_module(module):
        pass

    ours = _frame(exec_module.__code__.co_filename, "exec_module")
    boot = _frame("<frozen importlib._bootstrap>", "_load_unlocked")
    user, helper = _frame("/p/main.py", "<module>"), _frame("/p/helper.py", "<module>")
    kept = loader._without_import_machinery
    assert kept([user, boot, boot, ours, helper]) == [user, helper]
    # importlib's frames alone are CPython's to trim; a frame that raised is kept with its callers
    assert kept([user, boot, helper]) == [user, boot, helper]
    assert kept([user, boot, ours]) == [user, boot, ours]
    # a function of the same name elsewhere is the user's
    other = _frame("/p/my_loader.py", "exec_module")
    assert kept([user, other, helper]) == [user, other, helper]
