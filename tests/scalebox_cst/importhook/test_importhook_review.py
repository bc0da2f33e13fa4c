"""Attacks on today's import hook changes: how ``python -m scalebox_cst`` reads a script's links."""
import os
import subprocess
import sys

from conftest import ROOT


def _run(cwd, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALEBOX_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_python_m_follows_a_linked_folder_as_python_does(tmp_path):
    """``python linked/train.py``, linked a link to a folder of the project: CPython takes the
    script's realpath for sys.path[0] (readlink, then realpath: folders too), so its modules are
    the project's files and the project is found from there. Under the hook the link's folder was
    kept: sys.path[0] and every module's __file__ named the link, the project (scalebox.toml one
    folder up, not reachable from the link) was taken to be the linked folder, and its store was
    made there, which every later run then took for the project (.scalebox/ marks one)."""
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "scalebox.toml").write_text("")
    (root / "pkg" / "helper.py").write_text("x = 1\n")
    (root / "pkg" / "train.py").write_text("import sys, helper\nprint('path0', sys.path[0])\nprint('helper', helper.__file__)\n")
    (tmp_path / "linked").symlink_to(root / "pkg")
    plain = _run(tmp_path, "linked/train.py")
    assert plain.returncode == 0, plain.stderr
    hooked = _run(tmp_path, "-m", "scalebox_cst", "linked/train.py")
    assert hooked.returncode == 0, hooked.stderr
    assert hooked.stdout == plain.stdout
    assert f"path0 {root / 'pkg'}" in hooked.stdout
    assert not (root / "pkg" / ".scalebox").exists()


def test_python_m_of_a_link_loop_or_a_dangling_link_says_no_such_file(tmp_path):
    (tmp_path / "a.py").symlink_to(tmp_path / "b.py")
    (tmp_path / "b.py").symlink_to(tmp_path / "a.py")
    (tmp_path / "d.py").symlink_to(tmp_path / "nothere.py")
    for name in ("a.py", "d.py"):
        proc = _run(tmp_path, "-m", "scalebox_cst", name)
        assert proc.returncode == 2 and f"scalebox: {name}: no such file" in proc.stderr, proc.stderr
