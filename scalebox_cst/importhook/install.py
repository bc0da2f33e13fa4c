"""Installing the hook (``install_import_hook``) and running a script under it
(``python -m scalebox_cst``, and its spawn children)."""
from __future__ import annotations

import builtins
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from typing import Iterable, List, Optional, Sequence

from scalebox_cst.config import find_project_root
from scalebox_cst.intake import kind_name
from scalebox_cst.oneline import error_line
from scalebox_cst.importhook.common import (
    _NEVER,
    ENV_MAIN,
    SPAWN_MAIN,
    ScaleboxImportWarning,
)
from scalebox_cst.importhook.finder import ImportHook
from scalebox_cst.importhook.loader import RewritingLoader
from scalebox_cst.importhook.session import _Options
from scalebox_cst.runtime.loader import install_excepthook


# ---------------------------------------------------------------------------- installing
def _project_names(folders: Iterable[str]) -> List[str]:
    """Top-level module and package names found directly in ``folders`` (not the stdlib's)."""
    taken = set(sys.stdlib_module_names) | set(sys.builtin_module_names) | _NEVER
    names = set()
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                continue
            try:
                if name.endswith(".py") and entry.is_file():
                    name = name[:-3]
                elif not entry.is_dir() or name == "__pycache__":
                    continue  # a folder: a package, or a namespace package of project modules
            except OSError:
                continue
            if name.isidentifier() and name not in taken:
                names.add(name)
    return sorted(names)


def _within(path: str, root: str) -> bool:
    rel = os.path.relpath(path, root)
    return not (rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel))


def _project_folders(root: str) -> List[str]:
    """``root`` and the ``sys.path`` folders inside it, less those of a Python environment kept in
    the project (``.venv/``, ``venv/``: ``sys.prefix`` and the like inside ``root``). Its
    site-packages lies inside the project, yet its torch, numpy and the rest are not the
    project's modules: selected, each of their imports went through the hook (the first one, torch,
    failed it with a RecursionError warning, and every later one paid for a lookup the config's
    exclude then refused)."""
    environments = {
        os.path.realpath(prefix)
        for prefix in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)
        if isinstance(prefix, str) and prefix
    }
    environments = {env for env in environments if env != root and _within(env, root)}
    folders = [root]
    for entry in sys.path:
        if not isinstance(entry, str):
            continue
        real = os.path.realpath(entry or os.getcwd())
        if _within(real, root) and not any(_within(real, env) for env in environments):
            folders.append(real)
    return list(dict.fromkeys(folders))


def install_import_hook(
    packages: Sequence[str] = (),
    *,
    project: Optional[str] = None,
    config=None,
    backend: Optional[str] = None,
    transforms=None,
    cache: bool = True,
) -> ImportHook:
    """Rewrite ``packages`` (top-level names) as they are imported; ``()``: the caller's project.

    ``project``: the project folder (default: found from the calling script's ``__file__``, else
    the working directory). ``config``/``backend``/``transforms`` override the project's
    (``transforms``: Transform instances instead of the registry). ``cache=False`` skips the
    bytecode cache in ``.scalebox/pycache/`` (the store's rewrite cache still applies).
    Returns the installed :class:`ImportHook`; ``hook.uninstall()`` or ``with`` removes it.
    """
    if isinstance(packages, str):
        packages = [packages]
    if project is None:
        caller = sys._getframe(1).f_globals.get("__file__")
        start = os.path.dirname(os.path.abspath(caller)) if isinstance(caller, str) else os.getcwd()
        project = find_project_root(start)
    root = os.path.realpath(project)
    rescan = None
    if packages:
        names = list(packages)
    else:
        def rescan() -> List[str]:
            return _project_names(_project_folders(root))

        names = rescan()
    hook = ImportHook(names, root, _Options(config, backend, transforms, cache), rescan=rescan)
    hook.prepare()
    hook.install()
    if not hook.is_live():
        warnings.warn(f"scalebox: the import hook is not ahead of the PathFinder on sys.meta_path: {sys.meta_path!r}", ScaleboxImportWarning, stacklevel=2)
    hook.warn_early_imports(stacklevel=3)
    return hook



# ---------------------------------------------------------------------------- scripts
def script_code(hook: ImportHook, path: str):
    """The code to run for a script file under the hook: its committed rewrite, else the original."""
    path = os.path.abspath(path)
    with open(path, "rb") as fh:
        data = fh.read()
    located = None
    try:
        located = hook._locate("__main__", path)
    except Exception as exc:  # noqa: BLE001
        hook._warn(path, f"the import hook failed ({error_line(exc)})")
    if located is not None:
        root, rel = located
        spec = importlib.machinery.ModuleSpec("__main__", importlib.machinery.SourceFileLoader("__main__", path), origin=path)
        spec.has_location = True
        try:
            hooked = hook._hooked_spec(spec, root, rel)
        except Exception as exc:  # noqa: BLE001
            hook._warn(path, f"the import hook failed ({error_line(exc)})")
            hooked = spec
        loader = hooked.loader
        if isinstance(loader, RewritingLoader) and loader.rewritten:
            return loader.get_code("__main__")
    return compile(data, path, "exec", dont_inherit=True)


def run_script(script: str, args: Sequence[str], packages: Sequence[str] = (), project: Optional[str] = None, backend: Optional[str] = None, cache: bool = True) -> None:
    """Run ``script`` as ``__main__`` with the hook on (``python -m scalebox_cst``)."""
    import json
    import types

    path = os.path.abspath(script)
    if not os.path.isfile(path):
        try:
            what = kind_name(os.stat(path).st_mode) + ", not a regular file"
        except OSError:
            what = "no such file"
        sys.stderr.write(f"scalebox: {script}: {what}\n")
        raise SystemExit(2)
    # Python puts the folder of the file a script's links lead to first on sys.path (a script
    # linked into ~/bin imports its own project's modules), and the project is that file's
    real = _link_target(path)
    root = os.path.realpath(project) if project else find_project_root(real)
    sys.argv[:] = [script, *args]
    if not getattr(sys.flags, "safe_path", False):  # -P / PYTHONSAFEPATH: Python adds no folder of the script's
        sys.path[0] = os.path.dirname(real)  # (where -m put the working directory)
    os.environ[ENV_MAIN] = json.dumps(
        {"script": path, "packages": list(packages), "project": root, "backend": backend, "cache": cache}
    )
    hook = install_import_hook(packages, project=root, backend=backend, cache=cache)
    install_excepthook()  # the script's tracebacks start at its own frames, rewritten or not
    main = types.ModuleType("__main__")
    # The spec names _spawn_main: multiprocessing's spawn children re-run the script through it.
    main.__dict__.update(
        __file__=path,
        __cached__=None,
        __builtins__=builtins,
        __spec__=importlib.machinery.ModuleSpec(SPAWN_MAIN, None, origin=path),
    )
    sys.modules["__main__"] = main
    try:
        code = script_code(hook, path)
    except SyntaxError as exc:  # as python shows a script that does not compile: its lines, no frame
        import traceback

        traceback.print_exception(type(exc), exc, None)
        raise SystemExit(1) from None
    exec(code, main.__dict__)


def _link_target(path: str) -> str:
    """The file ``path`` leads to, as CPython reads a script's path to make ``sys.path[0]``: one
    readlink, then ``realpath`` (Python/pathconfig.c), so a folder on the way that is a link is
    followed too (``python linked_folder/train.py`` puts the real folder first). Left as given
    where it cannot be read (a link loop: the open fails on it later)."""
    try:
        return os.path.realpath(path, strict=True)
    except (OSError, RuntimeError):
        return path


def _run_spawned_main(namespace: dict) -> None:
    """Body of ``scalebox_cst._spawn_main`` run as ``__mp_main__`` in a spawn child."""
    import json

    try:
        settings = json.loads(os.environ.get(ENV_MAIN, ""))
    except ValueError:
        return
    path = settings["script"]
    hook = install_import_hook(
        settings.get("packages") or (), project=settings["project"], backend=settings.get("backend"), cache=settings.get("cache", True)
    )
    namespace.update(__file__=path, __cached__=None, __package__=None)
    exec(script_code(hook, path), namespace)
