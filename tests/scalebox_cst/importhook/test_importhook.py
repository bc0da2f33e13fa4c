"""The import hook: selected modules rewritten on import, committed before they run, cached, safe.

Each test gets a fresh project (and a fresh package name, since ``sys.modules`` is shared by the
tests that import in-process). Warm-cache, spawn and ``python -m`` behaviour run in subprocesses,
as a user's training run would.
"""
import importlib
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import textwrap
import threading
import traceback
import warnings

import pytest
import torch

from scalebox_cst import importhook
from scalebox_cst.importhook import cache as hook_cache
from scalebox_cst.importhook import install as hook_install
from scalebox_cst.importhook import session as hook_session
from scalebox_cst import pipeline
from scalebox_cst.importhook import ENV_MAIN, ENV_SESSION, ScaleboxImportWarning, install_import_hook

from conftest import ROOT
from importhook_project import CONFIG, PPO, _fresh_import, proj  # noqa: F401 (proj: the fixture)

CLIP = "_scalebox_clip_grad_norm"


def git(root, *args) -> str:
    return subprocess.run(
        ["git", "--git-dir", str(root / ".scalebox" / "store.git"), *args], capture_output=True, check=True, text=True
    ).stdout


def hook_branches(root):
    out = git(root, "for-each-ref", "--format=%(refname:short)", "refs/heads/hook/")
    return out.split()


def child_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in (ENV_SESSION, ENV_MAIN)}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=ROOT, **extra)
    return env


def run_py(cwd, *args, env=None, timeout=120):
    proc = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env or child_env(), capture_output=True, text=True, timeout=timeout
    )
    return proc


def tiny_model():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(8, 4) * 100


# ---------------------------------------------------------------------------- in process
def test_selected_module_is_rewritten_committed_and_runs_the_commit(proj):
    root, pkg = proj
    with install_import_hook([pkg], project=str(root)) as hook:
        assert sys.meta_path[0] is hook and hook.is_live()
        ppo = importlib.import_module(f"{pkg}.ppo")
        plain = importlib.import_module(f"{pkg}.plain")
    assert hook not in sys.meta_path
    assert CLIP in inspect.getsource(ppo.train_step)
    assert ppo.__file__ == str(root / pkg / "ppo.py") and ppo.__loader__.rewritten
    assert plain.double(3) == 6 and "clip" not in inspect.getsource(plain)
    assert CLIP not in (root / pkg / "ppo.py").read_text()  # the user's file is untouched
    # the code that ran is the committed blob, on this process's branch
    assert hook.branch in hook_branches(root)
    committed = git(root, "show", f"{hook.branch}:{pkg}/ppo.py")
    assert committed == ppo.__loader__.get_source(ppo.__name__)
    assert CLIP in committed
    # and it clips: the step moves the weights by at most lr * max_norm
    model, opt, x = tiny_model()
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    ppo.train_step(model, opt, x)
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert torch.linalg.vector_norm(after - before) <= 0.1 * 1.0 + 1e-5


def test_unselected_names_bail_out_before_any_lookup(proj, monkeypatch):
    root, pkg = proj
    hook = install_import_hook([pkg], project=str(root))
    lookups = []
    real = hook._find_next
    monkeypatch.setattr(hook, "_find_next", lambda *a: lookups.append(a[0]) or real(*a))
    for name in ("colorsys", "json.tool", "numpy", "torch.nn"):
        assert hook.find_spec(name) is None
    sys.modules.pop("colorsys", None)
    importlib.import_module("colorsys")
    assert lookups == []
    importlib.import_module(f"{pkg}.plain")
    assert lookups == [pkg, f"{pkg}.plain"]


def test_traceback_and_getsource_show_the_rewritten_lines(proj):
    root, pkg = proj
    with install_import_hook([pkg], project=str(root)):
        ppo = importlib.import_module(f"{pkg}.ppo")
    text = ppo.__loader__.get_source(ppo.__name__).splitlines()
    try:
        ppo.fail(1)
    except ValueError as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
    assert frame.filename == ppo.__file__
    assert frame.line == 'raise ValueError(f"boom {value}")'
    assert text[frame.lineno - 1].strip() == frame.line
    assert frame.lineno != PPO.splitlines().index('    raise ValueError(f"boom {value}")') + 1  # lines moved
    source = inspect.getsource(ppo.train_step)
    assert CLIP in source and source.startswith("def train_step(")
    assert inspect.getsourcelines(ppo.fail)[1] == text.index("def fail(n):") + 1


def test_package_resources_of_a_hooked_package_read_its_folder(proj):
    """importlib.resources.files() of a package whose ``__init__`` the hook loads (rewritten, or
    cold and not yet known to be unchanged) reads the files beside it, as a plain import does."""
    import importlib.resources
    import pkgutil

    root, pkg = proj
    (root / pkg / "__init__.py").write_text(PPO)  # rewritten: the hook's loader runs it
    (root / pkg / "data.txt").write_text("weights: 3\n")
    with install_import_hook([pkg], project=str(root)):
        package = importlib.import_module(pkg)
    assert package.__loader__.rewritten
    assert importlib.resources.files(pkg).joinpath("data.txt").read_text() == "weights: 3\n"
    assert sorted(p.name for p in importlib.resources.files(pkg).iterdir() if p.name.endswith(".txt")) == ["data.txt"]
    assert pkgutil.get_data(pkg, "data.txt") == b"weights: 3\n"


def test_an_error_raised_while_a_hooked_module_runs_shows_no_import_frames(proj):
    """An exception a rewritten module raises at import, caught and printed by the program, shows
    the importing line and the module's, as for a plain import: CPython leaves importlib's frames
    out only where the module ran through its own exec_module."""
    root, pkg = proj
    (root / pkg / "bad.py").write_text(PPO + '\n\nraise LookupError("at import")\n')
    with install_import_hook([pkg], project=str(root)):
        with pytest.raises(LookupError) as caught:
            __import__(f"{pkg}.bad")  # an import statement (importlib.import_module keeps the frames)
    frames = traceback.extract_tb(caught.value.__traceback__)
    assert [(os.path.basename(f.filename), f.name) for f in frames][-2:] == [
        ("test_importhook.py", "test_an_error_raised_while_a_hooked_module_runs_shows_no_import_frames"),
        ("bad.py", "<module>"),
    ]
    assert not [f for f in frames if f.filename.startswith("<frozen") or f.filename.endswith("loader.py")], frames
    assert frames[-1].line == 'raise LookupError("at import")'
    assert frames[-1].lineno != (PPO + '\n\nraise LookupError("at import")\n').count("\n")  # it ran rewritten


def test_a_warning_a_hooked_module_gives_its_importer_names_the_importing_line(proj):
    """``warnings.warn(..., stacklevel=2)`` at a module's top (a deprecated module) names the line
    that imported it, as for a plain import (warnings skips importlib's frames), not a frame of the
    hook's loader: that also decides whether a DeprecationWarning is shown by default."""
    root, pkg = proj
    (root / pkg / "old.py").write_text(PPO + '\n\nimport warnings\nwarnings.warn("old is deprecated", DeprecationWarning, stacklevel=2)\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with install_import_hook([pkg], project=str(root)):
            line = inspect.currentframe().f_lineno + 1
            __import__(f"{pkg}.old")
    assert sys.modules[f"{pkg}.old"].__loader__.rewritten
    (warning,) = [w for w in caught if "deprecated" in str(w.message)]
    assert (warning.filename, warning.lineno) == (__file__, line)


def test_a_hooked_module_python_refuses_raises_the_plain_syntax_error(proj):
    """A selected module mid-edit (it does not compile) is left to Python, and its SyntaxError,
    caught and printed by the program, shows no frame of importlib's or the hook's: as a plain
    import's, the importing line, then the module's own line and caret."""
    root, pkg = proj
    (root / pkg / "broken.py").write_text(PPO + "\n\ndef half(:\n    pass\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with install_import_hook([pkg], project=str(root)):
            with pytest.raises(SyntaxError) as raised:
                __import__(f"{pkg}.broken")  # an import statement (importlib.import_module keeps the frames)
    assert not [w for w in caught if issubclass(w.category, ScaleboxImportWarning)]
    assert raised.value.filename == str(root / pkg / "broken.py") and raised.value.text.strip() == "def half(:"
    frames = traceback.extract_tb(raised.value.__traceback__)
    assert [f.name for f in frames] == ["test_a_hooked_module_python_refuses_raises_the_plain_syntax_error"], frames


def test_a_module_reloaded_unrewritten_shows_its_own_lines(proj):
    """A rewritten module edited so that nothing in it is rewritten any more, then reloaded (a
    notebook, a dev loop): inspect and tracebacks read the file that now runs, not the rewrite the
    first import registered (kept for ever in linecache and the excepthook's map)."""
    from scalebox_cst.runtime import loader as runtime_loader

    root, pkg = proj
    with install_import_hook([pkg], project=str(root)):
        ppo = importlib.import_module(f"{pkg}.ppo")
        assert ppo.__loader__.rewritten
        (root / pkg / "ppo.py").write_text("def fail(n):\n    raise ValueError('edited')\n")
        importlib.reload(ppo)
    assert not ppo.__loader__.rewritten
    assert inspect.getsource(ppo.fail) == "def fail(n):\n    raise ValueError('edited')\n"
    with pytest.raises(ValueError) as raised:
        ppo.fail(1)
    frame = traceback.extract_tb(raised.value.__traceback__)[-1]
    assert (frame.lineno, frame.line) == (2, "raise ValueError('edited')")
    assert runtime_loader.origin_of(ppo.__file__) is None
    assert "raise ValueError('edited')" in runtime_loader.format_exception(ValueError, raised.value, raised.value.__traceback__)


def test_pipeline_failure_runs_the_original_with_one_warning(proj):
    from scalebox_cst.transforms import Transform

    class Broken(Transform):
        id = "test.broken"
        triggers = ("backward",)

        def rewrite(self, ctx):
            raise RuntimeError("kaboom")

    root, pkg = proj
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with install_import_hook([pkg], project=str(root), transforms=[Broken()]):
            ppo = importlib.import_module(f"{pkg}.ppo")
            importlib.reload(ppo)  # the cached failure warns too, once per file and message
    ours = [w for w in caught if issubclass(w.category, ScaleboxImportWarning)]
    assert len(ours) == 1
    message = str(ours[0].message)
    assert str(root / pkg / "ppo.py") in message and "kaboom" in message
    assert CLIP not in inspect.getsource(ppo)
    assert ppo.train_step is not None


def test_an_import_the_hooks_own_set_up_makes_takes_the_plain_route(proj):
    """The hook's set-up on a module's first import (the project, its pipeline and fingerprint)
    may import a selected module itself, as backend detection looks torch up: that import takes the
    plain route, as the cold path's own imports do, instead of re-entering the set-up it is part of
    (a RecursionError, caught as 'the import hook failed' and the module run unrewritten)."""
    from scalebox_cst.transforms import Transform
    from scalebox_cst.transforms.grad_clip import GradClip

    root, pkg = proj

    class Probing(GradClip):  # the pipeline reads each transform's version when it is built
        armed = False

        @property
        def version(self):
            if Probing.armed:
                importlib.import_module(f"{pkg}.plain")
            return "1"

    assert issubclass(Probing, Transform)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with install_import_hook([pkg], project=str(root), transforms=[Probing()]):
            Probing.armed = True
            ppo = importlib.import_module(f"{pkg}.ppo")
    assert [str(w.message) for w in caught if issubclass(w.category, ScaleboxImportWarning)] == []
    assert ppo.__loader__.rewritten and CLIP in inspect.getsource(ppo)
    assert sys.modules[f"{pkg}.plain"].double(2) == 4


def test_unreadable_store_runs_the_original_uncommitted_code_with_a_warning(proj):
    root, pkg = proj
    (root / ".scalebox").mkdir()
    (root / ".scalebox" / "store.git").write_text("not a repository\n")
    with pytest.warns(ScaleboxImportWarning, match="ppo.py"):
        with install_import_hook([pkg], project=str(root)):
            ppo = importlib.import_module(f"{pkg}.ppo")
    assert CLIP not in inspect.getsource(ppo.train_step)


def test_modules_imported_before_install_are_named(proj):
    root, pkg = proj
    importlib.import_module(f"{pkg}.plain")
    with pytest.warns(ScaleboxImportWarning, match=rf"before the import hook.*{pkg}\.plain"):
        hook = install_import_hook([pkg], project=str(root))
    hook.uninstall()


def test_is_live_reports_a_finder_order_that_bypasses_it(proj):
    root, pkg = proj
    with install_import_hook([pkg], project=str(root)) as hook:
        assert hook.is_live()
        sys.meta_path.remove(hook)
        sys.meta_path.append(hook)
        try:
            assert not hook.is_live()
        finally:
            sys.meta_path.remove(hook)
            sys.meta_path.insert(0, hook)


def test_coexists_with_pytests_assertion_rewriting(proj):
    root, pkg = proj
    rewriters = [f for f in sys.meta_path if type(f).__name__ == "AssertionRewritingHook"]
    with install_import_hook([pkg], project=str(root)):
        assert all(f in sys.meta_path for f in rewriters)
        ppo = importlib.import_module(f"{pkg}.ppo")
    assert CLIP in inspect.getsource(ppo)


def test_threads_importing_different_modules_at_once(proj):
    root, pkg = proj
    for i in range(6):
        (root / pkg / f"m{i}.py").write_text(PPO.replace("def train_step", f"def train_step_{i}"))
    errors, modules = [], {}
    barrier = threading.Barrier(6)

    def work(i):
        try:
            barrier.wait()
            modules[i] = importlib.import_module(f"{pkg}.m{i}")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    with install_import_hook([pkg], project=str(root)) as hook:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors
    for i, module in modules.items():
        assert CLIP in inspect.getsource(getattr(module, f"train_step_{i}"))
        assert git(root, "show", f"{hook.branch}:{pkg}/m{i}.py") == module.__loader__.get_source(module.__name__)


def test_project_names_select_top_level_modules_not_the_stdlib(tmp_path):
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "__init__.py").write_text("")
    (tmp_path / "train.py").write_text("")
    (tmp_path / "json.py").write_text("")  # shadows the stdlib: never selected by default
    (tmp_path / "my-script.py").write_text("")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "scalebox_cst").mkdir()
    assert hook_install._project_names([str(tmp_path)]) == ["agents", "train"]


def test_default_packages_leave_out_an_environment_kept_in_the_project(proj, monkeypatch):
    """A virtual environment inside the project (``venv/``, ``.venv/``): its site-packages is on
    sys.path and inside the project folder, but what it holds is installed, not the project's."""
    root, pkg = proj
    env = root / "venv"
    site = env / "lib" / "python3" / "site-packages"
    (site / "installedlib").mkdir(parents=True)
    (site / "installedlib" / "__init__.py").write_text("X = 1\n")
    (site / "installedmod.py").write_text("X = 1\n")
    (root / "src").mkdir()
    (root / "src" / "srcmod.py").write_text("X = 1\n")
    monkeypatch.setattr(sys, "prefix", str(env))
    monkeypatch.setattr(sys, "exec_prefix", str(env))
    monkeypatch.setattr(sys, "path", [*sys.path, str(site), str(root / "src")])
    assert hook_install._project_folders(str(root)) == [str(root), str(root / "src")]
    with install_import_hook(project=str(root)) as hook:
        assert pkg in hook.names and "srcmod" in hook.names
        assert not hook.names & {"installedlib", "installedmod"}


def test_default_packages_follow_project_folders_put_on_sys_path_later(proj):
    """``install_import_hook()`` first, then the script puts its project's ``src`` on sys.path (a
    src layout): the modules found there are the project's, and rewritten, as those on sys.path at
    install are; a folder outside the project adds nothing."""
    root, pkg = proj
    late = f"{pkg}_late"
    (root / "src" / late).mkdir(parents=True)
    (root / "src" / late / "__init__.py").write_text("")
    (root / "src" / late / "ppo.py").write_text(PPO)
    try:
        with install_import_hook(project=str(root)) as hook:
            assert late not in hook.names
            sys.path.insert(0, str(root / "src"))
            ppo = importlib.import_module(f"{late}.ppo")
            assert late in hook.names
        assert ppo.__loader__.rewritten and CLIP in inspect.getsource(ppo)
    finally:
        if str(root / "src") in sys.path:
            sys.path.remove(str(root / "src"))
        for name in [m for m in sys.modules if m == late or m.startswith(late + ".")]:
            del sys.modules[name]


def test_find_project_root(tmp_path):
    from scalebox_cst.config import find_project_root

    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "scalebox.toml").write_text("")
    (tmp_path / "a" / "b" / "x.py").write_text("")
    assert find_project_root(str(tmp_path / "a" / "b" / "x.py")) == str(tmp_path / "a")
    assert find_project_root(str(tmp_path / "a" / "b")) == str(tmp_path / "a")
    assert find_project_root(str(tmp_path)) == str(tmp_path)


def test_session_branch_is_a_chain_from_a_snapshot_and_hash_checks_edits(proj):
    root, pkg = proj
    with install_import_hook([pkg], project=str(root)) as hook:
        ppo = importlib.import_module(f"{pkg}.ppo")
        (root / pkg / "more.py").write_text(PPO.replace("train_step", "other_step"))
        importlib.import_module(f"{pkg}.more")
        # an edit keeps size and mtime: only the source hash tells the cache it changed
        path = root / pkg / "ppo.py"
        stat = path.stat()
        path.write_text(PPO.replace("boom", "bang"))
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        importlib.reload(ppo)
    assert "bang" in inspect.getsource(ppo.fail) and CLIP in inspect.getsource(ppo.train_step)
    chain = git(root, "rev-list", "--parents", hook.branch).split("\n")
    commits = [line.split() for line in chain if line]
    assert len(commits) == 4  # ppo, more, ppo edited; then the snapshot they start from
    for (child, parent), (nxt, *_rest) in zip(commits, commits[1:]):
        assert parent == nxt  # each commit's parent is the previous one on the branch
    # it starts from a source snapshot; new files and edits took newer ones, named in the trailer
    git(root, "merge-base", "--is-ancestor", commits[-1][0], "source")
    tip_message = git(root, "log", "-1", "--format=%B", hook.branch)
    assert f"Scalebox-Source: {git(root, 'rev-parse', 'source').strip()}" in tip_message
    log = git(root, "log", "--format=%B", hook.branch)
    assert f"Scalebox-Session: {hook.session.id}" in log and "Scalebox-Pipeline: " in log
    assert "grad_clip rewritten [changes-semantics]" in log
    assert "bang" in git(root, "show", f"{hook.branch}:{pkg}/ppo.py")


def test_dotted_packages_select_a_subtree_and_uninstall_stops_rewriting(proj):
    root, pkg = proj
    (root / pkg / "sub").mkdir()
    (root / pkg / "sub" / "__init__.py").write_text("")
    (root / pkg / "sub" / "deep.py").write_text(PPO)
    (root / pkg / "later.py").write_text(PPO)
    hook = install_import_hook([f"{pkg}.sub"], project=str(root))
    ppo = importlib.import_module(f"{pkg}.ppo")
    deep = importlib.import_module(f"{pkg}.sub.deep")
    assert CLIP not in inspect.getsource(ppo) and CLIP in inspect.getsource(deep)
    hook.uninstall()
    with pytest.warns(ScaleboxImportWarning, match=rf"unrewritten: {pkg}, {pkg}\.ppo$"):
        with install_import_hook([pkg], project=str(root)):
            pass
    later = importlib.import_module(f"{pkg}.later")
    assert CLIP not in inspect.getsource(later)


def test_two_hooks_on_one_package_rewrite_once(proj):
    root, pkg = proj
    outer = install_import_hook([pkg], project=str(root))
    inner = install_import_hook([pkg], project=str(root))
    try:
        ppo = importlib.import_module(f"{pkg}.ppo")
    finally:
        inner.uninstall()
        outer.uninstall()
    source = inspect.getsource(ppo)
    assert source.count(CLIP) == 2  # the import and one call: not rewritten twice
    assert len(hook_branches(root)) == 1


def test_a_module_with_a_coding_declaration_is_rewritten_and_reads_as_python_reads_it(proj):
    """PEP 263: a latin-1 module is valid Python (issue 9, item 10): it is rewritten, not refused,
    and its text means what it meant."""
    root, pkg = proj
    (root / pkg / "latin.py").write_bytes(
        b"# -*- coding: latin-1 -*-\nNAME = '\xe9t\xe9'\n" + PPO.encode()
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScaleboxImportWarning)
        with install_import_hook([pkg], project=str(root)):
            latin = importlib.import_module(f"{pkg}.latin")
    assert latin.NAME == "\u00e9t\u00e9"
    assert any(name.startswith("_scalebox_") for name in vars(latin))  # the rewrite ran


def test_a_module_the_pipeline_cannot_read_runs_as_python_reads_it(proj, monkeypatch):
    """Bytes that are not valid in the declared encoding, a syntax error, code nested too deeply:
    the import fails as plain Python's does, and only Python says so (a warning of ours before its
    error repeated the path three times and said nothing more). A module Python compiles but the
    pipeline refuses still gets the warning: it runs unrewritten."""
    root, pkg = proj
    broken = {"encoding": b"NAME = '\xff\xfe'\n" + PPO.encode(), "syntax": b"x = (\n" + PPO.encode(),
              "deep": b"x = " + b"+".join([b"1"] * 20000) + b"\n"}
    for name, data in broken.items():
        (root / pkg / f"broken_{name}.py").write_bytes(data)
    with install_import_hook([pkg], project=str(root)):
        for name in broken:
            with warnings.catch_warnings():
                warnings.simplefilter("error", ScaleboxImportWarning)
                with pytest.raises((SyntaxError, RecursionError, MemoryError)) as raised:
                    importlib.import_module(f"{pkg}.broken_{name}")
            assert not isinstance(raised.value, ScaleboxImportWarning)

    def refused(self, path, data):  # as libcst refuses a file Python takes (libcst 1.9: some tab indents)
        return pipeline._error(path, data, f"{path}:1: libcst cannot parse this file: tabs", bad_input=True)

    (root / pkg / "tabbed.py").write_bytes(b"y = 2\n")
    monkeypatch.setattr(pipeline.Pipeline, "rewrite", refused)
    with install_import_hook([pkg], project=str(root)):
        with pytest.warns(ScaleboxImportWarning, match=r"tabbed\.py.*libcst"):
            tabbed = importlib.import_module(f"{pkg}.tabbed")
    assert tabbed.y == 2


def test_modules_reached_through_links_out_of_the_project_run_unrewritten_and_are_never_committed(proj, tmp_path):
    """A link to a file or folder outside the project: Python imports it as it would; the hook
    names it, and nothing of it reaches the store (scalebox_cst.intake's rule, as snapshots)."""
    root, pkg = proj
    secret = "SECRET-outside-3b9e"
    outside = tmp_path / "outside"
    (outside / "lib").mkdir(parents=True)
    (outside / "stolen.py").write_text(PPO + f"# {secret}\n")
    (outside / "lib" / "__init__.py").write_text("")
    (outside / "lib" / "steps.py").write_text(PPO + f"# {secret}\n")
    (root / pkg / "stolen.py").symlink_to(outside / "stolen.py")
    (root / pkg / "linked").symlink_to(outside / "lib", target_is_directory=True)
    (root / pkg / "alias.py").symlink_to("ppo.py")  # inside the project, to a snapshotted file: rewritten
    with install_import_hook([pkg], project=str(root)):
        with pytest.warns(ScaleboxImportWarning) as caught:
            stolen = importlib.import_module(f"{pkg}.stolen")
            steps = importlib.import_module(f"{pkg}.linked.steps")
        alias = importlib.import_module(f"{pkg}.alias")
    assert CLIP not in inspect.getsource(stolen.train_step) and CLIP not in inspect.getsource(steps.train_step)
    assert CLIP in inspect.getsource(alias.train_step)
    said = sorted(str(w.message) for w in caught)
    assert said == [
        f"scalebox: {root / pkg / 'linked' / '__init__.py'}: {pkg}/linked/__init__.py: a folder on its path is a symbolic link or a file; not rewritten",
        f"scalebox: {root / pkg / 'linked' / 'steps.py'}: {pkg}/linked/steps.py: a folder on its path is a symbolic link or a file; not rewritten",
        f"scalebox: {root / pkg / 'stolen.py'}: {pkg}/stolen.py: a symbolic link to {outside / 'stolen.py'}, outside the project (never read); not rewritten",
    ]
    objects = subprocess.run(
        ["git", "--git-dir", str(root / ".scalebox" / "store.git"), "cat-file", "--batch-all-objects", "--batch"],
        capture_output=True, check=True,
    ).stdout
    assert b"_scalebox_clip_grad_norm" in objects and secret.encode() not in objects


def test_store_commit_to_branch_appends_dedupes_and_survives_racing_writers(tmp_path):
    from scalebox_cst.store import Store, StoreError

    store = Store.init(str(tmp_path))
    base, _ = store.snapshot({"a.py": b"a = 1\n", "b.py": b"b = 1\n"}, "base")
    first, made = store.commit_to_branch("hook/t", {"a.py": b"a = 2\n"}, "one", base)
    assert made and store.read_file(first, "a.py") == b"a = 2\n" and store.read_file(first, "b.py") == b"b = 1\n"
    same, made = store.commit_to_branch("hook/t", {"a.py": Store.blob_id(b"a = 2\n")}, "again", base)
    assert (same, made) == (first, False)
    with pytest.raises(StoreError):
        store.commit_to_branch("run/0001", {"a.py": b""}, "no", base)
    with pytest.raises(StoreError):
        store.commit_to_branch("hook/t", {"a.py": "0" * 40}, "unknown blob", base)

    errors = []

    def writer(i):
        try:
            Store.open(str(tmp_path)).commit_to_branch("hook/t", {f"w{i}.py": b"%d\n" % i}, f"w{i}", base)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    tip = Store.open(str(tmp_path)).repo.references["refs/heads/hook/t"].target
    paths = Store.open(str(tmp_path)).tree_paths(str(tip))
    assert {f"w{i}.py" for i in range(8)} <= paths and {"a.py", "b.py"} <= paths


# ---------------------------------------------------------------------------- subprocesses
WARM_CHECK = textwrap.dedent(
    """\
    import inspect, sys, warnings
    warnings.simplefilter("error", UserWarning)
    import scalebox_cst
    hook = scalebox_cst.install_import_hook(["{pkg}"])
    import {pkg}.ppo as ppo
    print("rewritten", "_scalebox_clip_grad_norm" in inspect.getsource(ppo.train_step))
    print("max_norm", "max_norm={max_norm}" in inspect.getsource(ppo.train_step))
    print("libcst", "libcst" in sys.modules, "pygit2", "pygit2" in sys.modules)
    print("branch", hook.branch)
    """
)


def _parse(out):
    return dict(line.split(" ", 1) for line in out.strip().splitlines() if " " in line)


def test_warm_import_loads_cached_bytecode_and_is_committed_at_exit(proj):
    root, pkg = proj
    script = root / "check.py"
    script.write_text(WARM_CHECK.format(pkg=pkg, max_norm=1.0))
    cold = run_py(root, str(script))
    assert cold.returncode == 0, cold.stderr
    got = _parse(cold.stdout)
    assert got["rewritten"] == "True" and got["libcst"].startswith("True")
    cache = list((root / ".scalebox" / "pycache").rglob("*.pyc"))
    assert [p.name.split(".")[0] for p in cache] == ["ppo"]  # plain.py was not imported, __init__.py is empty
    assert all(p.parent == root / ".scalebox" / "pycache" / pkg for p in cache)
    assert not list((root / ".scalebox" / "pycache").rglob("*.tmp"))

    for _ in range(3):  # an edit of the engine's transform modules in between re-checks the fingerprint
        warm = run_py(root, str(script))
        assert warm.returncode == 0, warm.stderr
        got = _parse(warm.stdout)
        if got["libcst"] == "False pygit2 False":
            break
    # a cache hit: rewritten code, without parsing (no libcst) and without opening the store
    assert got == {"rewritten": "True", "max_norm": "True", "libcst": "False pygit2 False", "branch": got["branch"]}
    # ... and still recorded on its own branch, at exit, pointing at the committed blob
    assert got["branch"] in hook_branches(root)
    assert CLIP in git(root, "show", f"{got['branch']}:{pkg}/ppo.py")

    # changing the config invalidates the cache: the new max_norm is rewritten in
    (root / "scalebox.toml").write_text(CONFIG.format(max_norm=0.5))
    script.write_text(WARM_CHECK.format(pkg=pkg, max_norm=0.5))
    changed = run_py(root, str(script))
    assert changed.returncode == 0, changed.stderr
    got = _parse(changed.stdout)
    assert got["max_norm"] == "True" and got["libcst"].startswith("True")


def test_a_cached_rewrite_reached_by_another_path_runs_under_that_path(proj, tmp_path):
    """A cache entry's code was compiled under the path of the import that wrote it; served to an
    import of the same module by another path (the project moved, or reached through a link), its
    code names the path it runs from, as CPython's ``_fix_co_filename`` does for ``__pycache__``:
    tracebacks, ``inspect`` and torch.jit read the rewritten source registered for that path."""
    root, pkg = proj
    cold, _ = _fresh_import(root, pkg)
    assert cold.fail.__code__.co_filename == cold.__file__
    link = tmp_path / "link"
    link.symlink_to(root, target_is_directory=True)
    sys.path.insert(0, str(link))
    try:
        warm, _ = _fresh_import(root, pkg)
    finally:
        sys.path.remove(str(link))
    assert warm.__file__ == str(link / pkg / "ppo.py") and warm.__loader__._entry is not None  # a cache hit
    assert warm.fail.__code__.co_filename == warm.__file__
    assert warm.train_step.__code__.co_filename == warm.__file__
    text = warm.__loader__.get_source(warm.__name__).splitlines()
    lines, start = inspect.getsourcelines(warm.fail)
    assert lines[0] == "def fail(n):\n" and start == text.index("def fail(n):") + 1
    try:
        warm.fail(1)
    except ValueError as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
    assert frame.filename == warm.__file__ and frame.line == 'raise ValueError(f"boom {value}")'


def test_cache_is_not_trusted_without_its_commit_and_write_errors_are_not_fatal(proj, caplog):
    import shutil

    root, pkg = proj
    ppo, _ = _fresh_import(root, pkg)
    (entry,) = (root / ".scalebox" / "pycache").rglob("ppo.*.pyc")
    shutil.rmtree(root / ".scalebox" / "store.git")  # the cache file remains; its commit does not
    ppo, hook = _fresh_import(root, pkg)
    assert CLIP in inspect.getsource(ppo)  # rewritten, committed again, and only then run
    assert git(root, "show", f"{hook.branch}:{pkg}/ppo.py") == ppo.__loader__.get_source(ppo.__name__)

    shutil.rmtree(root / ".scalebox" / "pycache")
    (root / ".scalebox" / "pycache").write_text("a file where the cache folder goes\n")
    with caplog.at_level("WARNING", logger="scalebox_cst.importhook"):
        ppo, _ = _fresh_import(root, pkg)
    assert CLIP in inspect.getsource(ppo)
    assert "cannot write" in caplog.text and "continuing without it" in caplog.text


def test_modules_found_by_other_finders_are_rewritten_through_them(proj, tmp_path):
    """An editable install's finder (after the PathFinder) serves the package; the hook still rewrites it."""
    root, pkg = proj
    elsewhere = root / "src"
    elsewhere.mkdir()
    (root / pkg).rename(elsewhere / pkg)

    class EditableFinder:
        @staticmethod
        def find_spec(fullname, path=None, target=None):
            if fullname == pkg:
                init = elsewhere / pkg / "__init__.py"
                return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])
            return None

    sys.meta_path.append(EditableFinder)
    try:
        with install_import_hook([pkg], project=str(root)):
            ppo = importlib.import_module(f"{pkg}.ppo")
    finally:
        sys.meta_path.remove(EditableFinder)
    assert CLIP in inspect.getsource(ppo)
    assert ppo.__file__ == str(elsewhere / pkg / "ppo.py")
    (branch,) = hook_branches(root)
    assert CLIP in git(root, "show", f"{branch}:src/{pkg}/ppo.py")


def test_default_packages_are_the_calling_scripts_project(proj):
    root, pkg = proj
    (root / "train.py").write_text(
        "import inspect, scalebox_cst\n"
        "scalebox_cst.install_import_hook()\n"
        f"import {pkg}.ppo, {pkg}.plain\n"
        f"print('_scalebox_clip_grad_norm' in inspect.getsource({pkg}.ppo))\n"
    )
    proc = run_py(root / pkg, str(root / "train.py"))  # the working directory does not matter
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


SPAWN_SCRIPT = textwrap.dedent(
    """\
    import multiprocessing as mp, sys
    {install}
    import workers

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        with ctx.Pool(2) as pool:
            results = pool.map(workers.probe, range(4))
        for pid, rewritten in results:
            print("child", pid, rewritten)
        import {pkg}.ppo, inspect
        print("parent", "_scalebox_clip_grad_norm" in inspect.getsource({pkg}.ppo))
    """
)

WORKERS = textwrap.dedent(
    """\
    import importlib, inspect, os, time

    def probe(i):
        time.sleep(0.05)
        ppo = importlib.import_module("{pkg}.ppo")
        return os.getpid(), "_scalebox_clip_grad_norm" in inspect.getsource(ppo.train_step)
    """
)


@pytest.mark.parametrize("how", ["install", "python -m"])
def test_spawn_pool_children_import_the_rewrite_concurrently(proj, how):
    root, pkg = proj
    install = f"import scalebox_cst; scalebox_cst.install_import_hook(['{pkg}'])" if how == "install" else ""
    (root / "train.py").write_text(SPAWN_SCRIPT.format(install=install, pkg=pkg))
    (root / "workers.py").write_text(WORKERS.format(pkg=pkg))
    args = [str(root / "train.py")] if how == "install" else ["-m", "scalebox_cst", "-p", pkg, str(root / "train.py")]
    proc = run_py(root, *args, timeout=240)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    children = [line.split() for line in lines if line.startswith("child")]
    assert len(children) == 4 and all(c[2] == "True" for c in children), proc.stdout
    assert "parent True" in lines
    assert "Traceback" not in proc.stderr and "scalebox:" not in proc.stderr, proc.stderr
    # one session: parent and workers recorded on a single branch, which holds the rewrite
    branches = hook_branches(root)
    assert len(branches) == 1, branches
    assert CLIP in git(root, "show", f"{branches[0]}:{pkg}/ppo.py")


def test_python_m_runs_the_script_rewritten_with_its_arguments(proj):
    root, pkg = proj
    (root / "train.py").write_text(
        textwrap.dedent(
            f"""\
            import inspect, sys
            import torch
            from {pkg}.plain import double

            def main():
                model = torch.nn.Linear(4, 1)
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                loss = model(torch.ones(2, 4)).sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

            if __name__ == "__main__":
                main()
                print("argv", sys.argv[1:], double(2))
                print("script rewritten", "_scalebox_clip_grad_norm" in inspect.getsource(main))
            """
        )
    )
    proc = run_py(root, "-m", "scalebox_cst", "train.py", "--steps", "3", "-p", "x")
    assert proc.returncode == 0, proc.stderr
    assert "argv ['--steps', '3', '-p', 'x'] 4" in proc.stdout
    assert "script rewritten True" in proc.stdout
    (branch,) = hook_branches(root)
    assert CLIP in git(root, "show", f"{branch}:train.py")
    missing = run_py(root, "-m", "scalebox_cst", "nope.py")
    assert missing.returncode == 2 and "nope.py" in missing.stderr


def test_python_m_runs_a_linked_script_from_the_folder_it_links_to(proj, tmp_path):
    """``python bin/train.py``, train.py a link to the project's script: Python puts the folder of
    the linked file first on sys.path, so the script imports its project's modules; under the
    hook too, with the script's project (not the link's folder) rewritten."""
    root, pkg = proj
    (root / "train.py").write_text(f"import sys, inspect\nimport {pkg}.ppo\nprint('path0', sys.path[0])\n"
                                   f"print('rewritten', {CLIP!r} in inspect.getsource({pkg}.ppo))\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "train.py").symlink_to(root / "train.py")
    env = child_env()  # the project is not on the path (PYTHONPATH is the engine): only sys.path[0] finds it
    plain = run_py(tmp_path, str(bin_dir / "train.py"), env=env)
    assert plain.returncode == 0 and f"path0 {root}" in plain.stdout, plain.stderr
    hooked = run_py(tmp_path, "-m", "scalebox_cst", str(bin_dir / "train.py"), env=env)
    assert hooked.returncode == 0, hooked.stderr
    assert f"path0 {root}\nrewritten True" in hooked.stdout


@pytest.mark.skipif(sys.version_info < (3, 11), reason="-P is new in Python 3.11")
def test_python_m_under_safe_path_leaves_sys_path_as_python_does(proj):
    """``python -P script.py`` puts no folder of the script's on sys.path, and ``-m`` none of the
    working directory's: run under the hook, sys.path is the same (its first entry was replaced)."""
    root, pkg = proj
    (root / "show.py").write_text("import json, sys\nprint(json.dumps(sys.path))\n")
    plain = run_py(root, "-P", "show.py")
    hooked = run_py(root, "-P", "-m", "scalebox_cst", "show.py")
    assert plain.returncode == 0 and hooked.returncode == 0, hooked.stderr
    assert json.loads(hooked.stdout) == json.loads(plain.stdout)
    assert str(root) not in json.loads(hooked.stdout)


def test_ctrl_c_under_the_hook_shows_where_the_script_stopped(proj, tmp_path):
    """The import hook's excepthook maps tracebacks to the user's lines; a KeyboardInterrupt (Ctrl-C
    in a training loop, the way to see where it hangs) keeps its traceback, as in plain Python. The
    one-line 'run interrupted' stays for runs the executor started (their folder in the env)."""
    root, pkg = proj
    (root / "train.py").write_text(
        f"import scalebox_cst\nscalebox_cst.install_import_hook([{pkg!r}])\nimport {pkg}.ppo\n\n\n"
        "def loop():\n    raise KeyboardInterrupt\n\n\nloop()\n"
    )
    hooked = run_py(root, "train.py")
    assert hooked.returncode in (-2, 130)  # killed by SIGINT, as Python ends on an unhandled Ctrl-C
    assert "Traceback (most recent call last)" in hooked.stderr and "    raise KeyboardInterrupt\n" in hooked.stderr
    assert hooked.stderr.rstrip().endswith("KeyboardInterrupt") and "scalebox: run interrupted" not in hooked.stderr
    in_run = run_py(root, "train.py", env=child_env(SCALEBOX_RUN_DIR=str(tmp_path)))
    assert in_run.stderr == "scalebox: run interrupted (KeyboardInterrupt)\n"


def test_an_exception_ending_a_thread_is_shown_in_the_users_lines(proj):
    """An uncaught exception in a thread running rewritten code: as the main thread's, its traceback
    names the user's line and quotes it (threading's C hook read the file on disk at the rewritten
    line number, and quoted another line, here a blank one)."""
    root, pkg = proj
    (root / "train.py").write_text(
        f"import threading, scalebox_cst\nscalebox_cst.install_import_hook([{pkg!r}])\nimport {pkg}.ppo as ppo\n"
        "t = threading.Thread(target=ppo.fail, args=(1,), name='worker')\nt.start()\nt.join()\nprint('joined')\n"
    )
    proc = run_py(root, "train.py")
    assert proc.returncode == 0 and proc.stdout == "joined\n", proc.stderr
    line = PPO.splitlines().index('    raise ValueError(f"boom {value}")') + 1
    assert proc.stderr.startswith("Exception in thread worker:\nTraceback (most recent call last):\n"), proc.stderr
    assert f'ppo.py", line {line}, in fail\n    raise ValueError(f"boom {{value}}")\n' in proc.stderr, proc.stderr
    assert proc.stderr.endswith("ValueError: boom 2\n")


def test_an_exception_python_cannot_raise_is_shown_in_the_users_lines(proj):
    """An exception in a ``__del__`` of rewritten code ('Exception ignored in'), shown as Python
    shows it but in the user's lines (the default C hook read the file on disk at the rewritten
    line number: past its end here, so no line was quoted)."""
    root, pkg = proj
    tail = "\n\nclass Holder:\n    def __del__(self):\n        raise RuntimeError('in del')\n"
    (root / pkg / "ppo.py").write_text(PPO + tail)
    (root / "train.py").write_text(
        f"import scalebox_cst\nscalebox_cst.install_import_hook([{pkg!r}])\nimport {pkg}.ppo as ppo\n"
        "h = ppo.Holder()\ndel h\nprint('after')\n"
    )
    proc = run_py(root, "train.py")
    assert proc.returncode == 0 and proc.stdout == "after\n", proc.stderr
    line = (PPO + tail).splitlines().index("        raise RuntimeError('in del')") + 1
    assert proc.stderr.startswith("Exception ignored in: <function Holder.__del__ at "), proc.stderr
    assert proc.stderr.endswith(
        f'ppo.py", line {line}, in __del__\n    raise RuntimeError(\'in del\')\nRuntimeError: in del\n'
    ), proc.stderr


def test_pytest_run_with_the_hook_keeps_assertion_rewriting(proj):
    root, pkg = proj
    (root / "conftest.py").write_text("import scalebox_cst\nscalebox_cst.install_import_hook()\n")
    (root / "test_it.py").write_text(
        textwrap.dedent(
            f"""\
            import inspect
            import {pkg}.ppo as ppo

            def test_rewritten():
                assert "_scalebox_clip_grad_norm" in inspect.getsource(ppo.train_step)

            def test_introspection():
                value = [1, 2]
                assert value == [1, 3]
            """
        )
    )
    proc = run_py(root, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_it.py")
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout + proc.stderr
    assert "At index 1 diff: 2 != 3" in proc.stdout  # pytest's rewritten assertion, not a bare one


DATALOADER_SCRIPT = textwrap.dedent(
    """\
    import inspect, scalebox_cst, torch
    hook = scalebox_cst.install_import_hook(["{pkg}"])

    class Probe(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            import {pkg}.ppo as ppo  # first imported in the workers, two at once
            return torch.tensor(float("_scalebox_clip_grad_norm" in inspect.getsource(ppo.train_step)))

    if __name__ == "__main__":
        loader = torch.utils.data.DataLoader(Probe(), batch_size=1, num_workers=2, multiprocessing_context="fork")
        print("workers", [int(x) for x in loader])
        print("branch", hook.branch)
    """
)


def test_dataloader_fork_workers_rewrite_and_record(proj):
    root, pkg = proj
    (root / "train.py").write_text(DATALOADER_SCRIPT.format(pkg=pkg))
    proc = run_py(root, str(root / "train.py"))
    assert proc.returncode == 0, proc.stderr
    got = _parse(proc.stdout)
    assert got["workers"] == "[1, 1, 1, 1]"
    assert hook_branches(root) == [got["branch"]]
    assert CLIP in git(root, "show", f"{got['branch']}:{pkg}/ppo.py")


# ---------------------------------------------------------------------------- corrupt cache
CORRUPT_CHECK = textwrap.dedent(
    """\
    import inspect
    import scalebox_cst
    hook = scalebox_cst.install_import_hook(["{pkg}"])
    import {pkg}.ppo as ppo
    print("rewritten", inspect.getsource(ppo) != open(ppo.__file__).read())
    print("planted", getattr(ppo, "PLANTED", False))
    print("fail", hasattr(ppo, "fail") and hasattr(ppo, "train_step"))
    """
)


def _entry_parts(data):
    """(start with source hash, MAC, rest up to the code, code) of an SBX3 cache entry."""
    meta_end = 52 + int.from_bytes(data[48:52], "little")
    text_end = meta_end + 4 + int.from_bytes(data[meta_end : meta_end + 4], "little")
    return data[:16], data[16:48], data[48:text_end], data[text_end:]


def test_a_corrupt_or_planted_cache_entry_is_rewritten_again_and_replaced(proj):
    """Truncated, cut in the code, random or empty code under a valid header, a planted code
    object: each import still runs the committed rewrite, and the entry is replaced by one that
    verifies. An entry that verifies but holds unreadable code (the key was read) too."""
    import marshal

    root, pkg = proj
    script = root / "check_cache.py"
    script.write_text(CORRUPT_CHECK.format(pkg=pkg))
    first = run_py(root, str(script))
    assert first.returncode == 0, first.stderr
    assert _parse(first.stdout) == {"rewritten": "True", "planted": "False", "fail": "True"}
    (entry,) = (root / ".scalebox" / "pycache").rglob("ppo.*.pyc")
    good = entry.read_bytes()
    start, mac, middle, code = _entry_parts(good)
    key = hook_cache._cache_key(str(root / ".scalebox" / "store.git"), create=False)
    planted = marshal.dumps(compile("PLANTED = True\ndef train_step(*a): pass\ndef fail(n): pass\n", str(root / pkg / "ppo.py"), "exec"))
    wrong_key = b"\1" * 32
    cases = {
        "truncated": good[: len(good) // 2],
        "cut in the code": good[:-9],
        "random code, copied MAC": start + mac + middle + os.urandom(len(code)),
        "empty code, copied MAC": start + mac + middle,
        "planted code, copied MAC": start + mac + middle + planted,
        "planted code, MAC by another key": start + hook_cache._mac(wrong_key, start, middle + planted) + middle + planted,
        "random code, MAC by the store's key": start + hook_cache._mac(key, start, middle + b"\xff" * 40) + middle + b"\xff" * 40,
        "header only": good[:60],
    }
    source_hash = start[8:16]
    for name, data in cases.items():
        entry.write_bytes(data)
        proc = run_py(root, str(script))
        assert proc.returncode == 0, f"{name}: {proc.stderr}"
        assert _parse(proc.stdout) == {"rewritten": "True", "planted": "False", "fail": "True"}, name
        replaced = entry.read_bytes()
        assert replaced != data, f"{name}: the entry was not replaced"
        again = hook_cache._read_entry(str(entry), source_hash, key)
        assert again is not None and marshal.loads(again.code_data).co_filename == str(root / pkg / "ppo.py"), name
    # and a valid entry is used as it is (the warm path): served without rewriting again
    before = entry.read_bytes()
    proc = run_py(root, str(script))
    assert proc.returncode == 0 and entry.read_bytes() == before


def test_fingerprint_memo_is_checked_against_every_engine_file(proj):
    """The memo of the pipeline fingerprint is stamped with every file the fingerprint's digest
    reads (transforms/ subpackages and runtime/ included): an edited nested module, as in an
    editable install, invalidates it instead of serving rewrites made by the old code."""
    import scalebox_cst.fused_program as fused_program
    import scalebox_cst.runtime.fused as fused
    import scalebox_cst.transforms.vectorize.recurrence.plan as plan
    from scalebox_cst.config import engine_files

    root, pkg = proj
    _fresh_import(root, pkg)
    (state,) = [r for r in hook_session._ROOTS.values() if r.root == os.path.realpath(root)]
    with open(state._memo_path(), encoding="utf-8") as fh:
        value, *stamps = fh.read().split("\n")
    stamped = {line.split("\t", 1)[0] for line in stamps}
    folders, files = engine_files()
    assert stamped == set(folders) | {path for path, _ in files}
    for module in (plan, fused_program, fused):
        assert any(os.path.samefile(path, module.__file__) for path in stamped), module.__name__
    assert state._memo_fingerprint() == value

    (line,) = [s for s in stamps if os.path.samefile(s.split("\t", 1)[0], plan.__file__)]
    path, size, mtime = line.split("\t")
    edited = [f"{path}\t{size}\t{int(mtime) - 1}" if s == line else s for s in stamps]
    with open(state._memo_path(), "w", encoding="utf-8") as fh:
        fh.write("\n".join([value, *edited]))
    assert state._memo_fingerprint() is None  # plan.py changed since the memo was written
