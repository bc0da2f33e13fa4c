"""The import hook across a module's life: a spec and a module object made without running it,
and ``python -B``."""
import importlib
import importlib.util
import inspect
import os
import subprocess
import sys

from scalebox_cst.importhook import install_import_hook

from conftest import ROOT
from importhook_project import _fresh_import, proj  # noqa: F401 (proj: the fixture)

CLIP = "_scalebox_clip_grad_norm"


def _hook_branches(root):
    """The store's hook branches ([] while there is no store)."""
    store = root / ".scalebox" / "store.git"
    if not store.exists():
        return []
    out = subprocess.run(["git", "--git-dir", str(store), "for-each-ref", "--format=%(refname:short)", "refs/heads/hook/"],
                         capture_output=True, check=True, text=True).stdout
    return out.split()


def _cache_entries(root):
    return sorted(p.name for p in (root / ".scalebox" / "pycache").rglob("*.pyc"))


def test_a_module_made_from_its_spec_is_rewritten_and_committed_only_when_it_runs(proj, monkeypatch):
    """``importlib.util.module_from_spec`` makes a module object (tools that look a module over
    without running it, lazy importers): nothing is rewritten, cached or committed until the
    module's code runs (``exec_module``); a plain import, a reload and the cache work as before."""
    root, pkg = proj
    with install_import_hook([pkg], project=str(root)) as hook:
        colds = []
        cold = hook._cold
        monkeypatch.setattr(hook, "_cold", lambda *a: colds.append(a[1]) or cold(*a))
        spec = importlib.util.find_spec(f"{pkg}.ppo")
        module = importlib.util.module_from_spec(spec)
        assert colds == [] and _hook_branches(root) == [] and _cache_entries(root) == []
        assert not hasattr(module, "train_step")
        spec.loader.exec_module(module)
        assert colds == [f"{pkg}/ppo.py"]
        assert CLIP in inspect.getsource(module.train_step) and hook.branch in _hook_branches(root)
        assert len(_cache_entries(root)) == 1
        # the plain import and a reload: the cache written by the run above serves them
        imported = importlib.import_module(f"{pkg}.ppo")
        assert imported.__loader__.rewritten and CLIP in inspect.getsource(imported.train_step)
        importlib.reload(imported)
        assert imported.__loader__._entry is not None and CLIP in inspect.getsource(imported.train_step)
    assert colds == [f"{pkg}/ppo.py"]
    warm, _ = _fresh_import(root, pkg)
    assert warm.__loader__._entry is not None and CLIP in inspect.getsource(warm.train_step)


def test_dont_write_bytecode_reads_the_cache_and_writes_none(proj):
    """``python -B`` (``sys.dont_write_bytecode``) keeps the hook from writing ``.scalebox/pycache``,
    as it keeps Python from writing ``__pycache__``; an entry already there is still read."""
    root, pkg = proj
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALEBOX_HOOK")}
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    check = (f"import sys; from scalebox_cst.importhook import install_import_hook\n"
             f"with install_import_hook(['{pkg}'], project='.'):\n"
             f"    import {pkg}.ppo as m\n"
             f"print(m.__loader__.rewritten, m.__loader__._entry is not None)\n")

    def run(*flags):
        proc = subprocess.run([sys.executable, *flags, "-c", check], cwd=root, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert run("-B") == ["True", "False"]  # rewritten and committed, nothing cached
    assert _cache_entries(root) == [] and not list((root / ".scalebox" / "pycache").glob("fingerprint-*"))
    assert run() == ["True", "False"]  # written now
    (entry,) = (root / ".scalebox" / "pycache").rglob("*.pyc")
    stamp = entry.stat().st_mtime_ns
    assert run("-B") == ["True", "True"]  # read
    assert _cache_entries(root) == [entry.name] and entry.stat().st_mtime_ns == stamp  # and not even touched
