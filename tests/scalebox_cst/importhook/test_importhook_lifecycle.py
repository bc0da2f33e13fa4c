"""The import hook across a module's life: a spec and a module object made without running it,
a reload after the hook is uninstalled, ``python -B``, and imports while another thread rewrites
a module or is inside an import the pipeline makes."""
import importlib
import importlib.util
import inspect
import linecache
import os
import subprocess
import sys
import traceback

import pytest

from scalebox_cst.importhook import install_import_hook
from scalebox_cst.runtime import loader as runtime_loader

from conftest import ROOT
from importhook_project import PPO, _fresh_import, proj  # noqa: F401 (proj: the fixture)

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


def test_a_reload_after_uninstall_runs_and_reports_the_users_file(proj):
    """After ``uninstall()`` a reload runs the user's file through Python's own loader: its
    tracebacks, linecache and inspect read that file, not the rewrite the hooked import
    registered (kept for ever in linecache, and the excepthook's map moved its lines)."""
    root, pkg = proj
    with install_import_hook([pkg], project=str(root)):
        ppo = importlib.import_module(f"{pkg}.ppo")
    assert ppo.__loader__.rewritten
    importlib.reload(ppo)
    assert type(ppo.__loader__) is importlib.machinery.SourceFileLoader
    user_line = PPO.splitlines().index('    raise ValueError(f"boom {value}")') + 1
    with pytest.raises(ValueError) as raised:
        ppo.fail(1)
    frame = traceback.extract_tb(raised.value.__traceback__)[-1]
    assert (frame.lineno, frame.line) == (user_line, 'raise ValueError(f"boom {value}")')
    assert linecache.getlines(ppo.__file__) == PPO.splitlines(keepends=True)
    assert CLIP not in inspect.getsource(ppo.train_step)
    assert runtime_loader.origin_of(ppo.__file__) is None
    shown = runtime_loader.format_exception(ValueError, raised.value, raised.value.__traceback__)
    assert f'line {user_line}, in fail\n    raise ValueError(f"boom {{value}}")' in shown


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



def test_without_the_fingerprint_memo_the_loader_looks_in_the_cache(proj):
    """The finder leaves the cache to the loader where the pipeline fingerprint is not known
    without building the pipeline (no memo: the first import after a config change, or the memo
    swept out): the loader works it out when the module runs, and an entry there still serves."""
    root, pkg = proj
    _fresh_import(root, pkg)
    (memo,) = (root / ".scalebox" / "pycache").glob("fingerprint-*")
    memo.unlink()
    warm, _ = _fresh_import(root, pkg)
    assert warm.__loader__.look_up and warm.__loader__._entry is not None
    assert CLIP in inspect.getsource(warm.train_step) and memo.exists()
    again, _ = _fresh_import(root, pkg)
    assert not again.__loader__.look_up and again.__loader__._entry is not None

#: run in a process of its own: a deadlock there holds Python's import lock for ever
DEADLOCK_CHECK = r'''
import _imp, faulthandler, importlib, subprocess, sys, threading, time
from scalebox_cst.importhook import install_import_hook, session
from scalebox_cst.transforms.grad_clip import GradClip

pkg, store = sys.argv[1], sys.argv[2]
faulthandler.dump_traceback_later(45, exit=True)  # deadlocked: where each thread waits, and out
holding, armed = threading.Event(), threading.Event()


def waits_to_run():
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None and frame.f_code.co_name != "_resolve":
        frame = frame.f_back
    return frame is not None


class Importing(GradClip):
    """Rewrites as GradClip; armed, it imports a module Python has not imported yet while the
    hook holds its project lock (as a transform's or the store's first use imports)."""

    def rewrite(self, ctx):
        if armed.is_set():
            holding.set()
            deadline = time.monotonic() + 30
            while not (_imp.lock_held() or waits_to_run()) and time.monotonic() < deadline:
                time.sleep(0.001)  # until the main thread is inside a finder (Python's import lock
                # held) or past it, waiting for this lock to run the module
            importlib.import_module("colorsys")
        return super().rewrite(ctx)


transform = Importing()
with install_import_hook([pkg], project=".", transforms=[transform]):
    importlib.import_module(pkg + ".m1")  # rewritten, committed and cached
for name in [m for m in sys.modules if m.startswith(pkg + ".")]:
    del sys.modules[name]
session._ROOTS.clear()
for args in (["repack", "-a", "-d", "-q"], ["prune-packed"]):  # the commit is no loose object any more
    subprocess.run(["git", "--git-dir", store, *args], check=True)
assert "colorsys" not in sys.modules
got = {}
with install_import_hook([pkg], project=".", transforms=[transform]):
    armed.set()
    cold = threading.Thread(target=lambda: got.setdefault("m0", importlib.import_module(pkg + ".m0")))
    cold.start()
    holding.wait(60)
    got["m1"] = importlib.import_module(pkg + ".m1")  # a cache hit whose commit is looked up in the pack
    cold.join()
print(sorted(got), got["m1"].__loader__._entry is not None, "_scalebox" in got["m0"].__loader__.get_source(pkg + ".m0"))
'''


def test_a_cached_import_while_another_thread_rewrites_does_not_deadlock(proj):
    """Python holds its import lock while it asks each finder for a spec. The hook's finder took
    the project lock there (to look a cached rewrite's commit up in a packed store), while another
    thread, rewriting a module under that lock, imported a module (the pipeline's and the store's
    first imports): each waited for the lock the other held, for ever."""
    root, pkg = proj
    for name in ("m0", "m1"):
        (root / pkg / f"{name}.py").write_text(PPO.replace("def train_step", f"def train_step_{name}"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALEBOX_HOOK")}
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    script = root / "deadlock_check.py"
    script.write_text(DEADLOCK_CHECK)
    try:
        proc = subprocess.run([sys.executable, str(script), pkg, str(root / ".scalebox" / "store.git")],
                              cwd=root, env=env, capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"deadlocked: {exc.stdout!r} {exc.stderr!r}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["['m0',", "'m1']", "True", "True"], proc.stdout


#: the first import after a config change, while another thread is inside an import the
#: pipeline's set-up makes too (here: a transform's version imports ``slow``, as backend
#: detection imports torch)
FIRST_IMPORT_CHECK = r'''
import _imp, faulthandler, importlib, sys, threading, time
from scalebox_cst.importhook import install_import_hook
from scalebox_cst.transforms.grad_clip import GradClip

pkg = sys.argv[1]
faulthandler.dump_traceback_later(45, exit=True)  # deadlocked: where each thread waits, and out
inside = threading.Event()


def waits_to_run():
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None and frame.f_code.co_name != "_resolve":
        frame = frame.f_back
    return frame is not None


class Probing(GradClip):
    armed = False  # (the hook's options read the version at install)

    @property
    def version(self):
        if Probing.armed:
            importlib.import_module("slow")
        return "1"


import builtins
builtins.slow_started = inside  # what slow.py signals and waits with
builtins.slow_waits = lambda: (_imp.lock_held() or waits_to_run())
hook = install_import_hook([pkg], project=".", transforms=[Probing()])
Probing.armed = True
loading = threading.Thread(target=importlib.import_module, args=("slow",))
loading.start()
inside.wait(60)
module = importlib.import_module(pkg + ".m0")  # no fingerprint memo yet: the pipeline is built
loading.join()
hook.uninstall()
print("_scalebox" in module.__loader__.get_source(pkg + ".m0"))
'''

SLOW = r'''
import builtins, time
builtins.slow_started.set()
deadline = time.monotonic() + 30
while not builtins.slow_waits() and time.monotonic() < deadline:
    time.sleep(0.001)  # until the main thread is inside a finder or past it, waiting to run m0
import colorsys  # a module not imported yet: Python's import lock is taken
'''


def test_the_first_import_after_a_config_change_while_another_thread_imports_does_not_deadlock(proj):
    """The pipeline fingerprint was worked out inside the finder, where Python holds its import
    lock, when no memo held it (the first import after a config or engine change): building the
    pipeline imports (torch, libcst), and a module another thread was importing meanwhile
    waited for the import lock for its own imports while the finder waited for that module."""
    root, pkg = proj
    (root / pkg / "m0.py").write_text(PPO)
    (root / "slow.py").write_text(SLOW)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALEBOX_HOOK")}
    env.update(PYTHONPATH=os.pathsep.join([ROOT, str(root)]), OMP_NUM_THREADS="1")
    script = root / "first_import_check.py"
    script.write_text(FIRST_IMPORT_CHECK)
    proc = subprocess.run([sys.executable, str(script), pkg], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True"], proc.stdout
