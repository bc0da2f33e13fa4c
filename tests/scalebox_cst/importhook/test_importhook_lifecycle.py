"""The import hook across a module's life: a spec and a module object made without running it."""
import importlib
import importlib.util
import inspect
import subprocess

from scalebox_cst.importhook import install_import_hook

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
