"""runtime.telemetry.imports: a callback runs once the watched module is imported.

``scalebox run --seeds`` seeds torch before the script runs, and runtime.seeding asks
``importlib.util.find_spec("torch")`` first; the finder used the watch up when the spec was
found, so the ``import torch`` that followed ran no callback: the run had no
``losses/backward``, ``grad_norm_preclip`` nor optimizer steps/s (XinJingHao's PPO-discrete).
"""
import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    import importlib, importlib.util
    from scalebox_cst.runtime.telemetry import imports

    seen = []
    imports.when_imported("probed_mod", lambda m: seen.append(("first", m.VALUE)))
    assert importlib.util.find_spec("probed_mod") is not None  # found, not loaded
    assert seen == []
    imports.when_imported("probed_mod", lambda m: seen.append(("second", m.VALUE)))
    importlib.import_module("probed_mod")
    importlib.import_module("probed_mod")  # imported already: nothing runs again
    imports.when_imported("probed_mod", lambda m: seen.append(("late", m.VALUE)))  # now, at once
    importlib.import_module("plain_mod")  # not watched: untouched
    print(seen)
    """
)


def test_a_spec_found_before_the_import_still_runs_the_callbacks_once(tmp_path):
    (tmp_path / "probed_mod.py").write_text("VALUE = 7\n")
    (tmp_path / "plain_mod.py").write_text("VALUE = 1\n")
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[('first', 7), ('second', 7), ('late', 7)]"


def test_a_watched_module_warning_at_import_names_the_importing_line(tmp_path):
    """A library's ``warnings.warn(..., stacklevel=2)`` at import names the line that imports it,
    and Python skips its import machinery's frames to find it. The watch's loader put a frame of
    its own among them: the warning named ``runtime/telemetry/imports.py``, and a
    DeprecationWarning, shown when it names ``__main__``, was hidden under every ``scalebox run``
    of a script importing a watched library (gym, gymnasium, torch, tensorboard) that warns so."""
    (tmp_path / "noisy_mod.py").write_text("import warnings\nwarnings.warn('old API', DeprecationWarning, stacklevel=2)\n")
    watched = "from scalebox_cst.runtime.telemetry import imports\nimports.when_imported('noisy_mod', lambda m: None)\n"
    plain = "import sys\nimport noisy_mod  # the importing line\n"
    (tmp_path / "plain.py").write_text(plain)
    (tmp_path / "watched.py").write_text(watched + plain)
    shown = {}
    for script in ("plain.py", "watched.py"):
        proc = subprocess.run([sys.executable, script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0, proc.stderr
        shown[script] = proc.stderr.replace(script, "SCRIPT")
    assert "SCRIPT:2: DeprecationWarning: old API" in shown["plain.py"], shown
    assert shown["watched.py"].replace("SCRIPT:4:", "SCRIPT:2:") == shown["plain.py"], shown
