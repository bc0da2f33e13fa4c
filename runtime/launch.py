"""Child-process entry point: run a script exactly as committed in the store.

``python -m scalebox_cst.runtime.launch STORE_GIT COMMIT PROJECT_DIR SCRIPT [ARGS...]``

The script and every project module it imports are served from COMMIT's tree (nothing is
written into the project); ``__file__`` is the real path, the working directory is the project,
so data and config files are read from disk as usual.

multiprocessing's spawn and forkserver children start a fresh interpreter and re-create the
parent's ``__main__`` themselves: from its file on disk, without our finder. So the script's
``__spec__`` names ``scalebox_cst._spawn_main`` (which such children import as ``__mp_main__``)
and :data:`ENV_RUN` says which commit to serve; the child installs the same finder and runs the
committed script. Fork children inherit the finder and need neither.
"""
from __future__ import annotations

import json
import os
import sys
import types

#: set by the launcher (and inherited): ``{"store", "commit", "project", "script"}`` as JSON
ENV_RUN = "SCALEBOX_RUN"
#: the import hook's own variable for ``python -m scalebox_cst`` (see scalebox_cst.importhook)
_ENV_HOOK_MAIN = "SCALEBOX_HOOK_MAIN"
SPAWN_MAIN = "scalebox_cst._spawn_main"


def _serve(store_path: str, commit_id: str, project_dir: str):
    """Install the finder serving COMMIT's tree for PROJECT_DIR; returns (repo, {relpath: blob id})."""
    import pygit2

    from scalebox_cst.runtime.loader import SourceMapFinder

    repo = pygit2.Repository(store_path)
    tree = repo[commit_id].peel(pygit2.Tree)
    blobs = {}
    stack = [("", tree)]
    while stack:
        prefix, node = stack.pop()
        for entry in node:
            if entry.type_str == "tree":
                stack.append((prefix + entry.name + "/", repo[entry.id]))
            else:
                blobs[prefix + entry.name] = entry.id
    SourceMapFinder(project_dir, blobs, lambda p: repo[blobs[p]].data).install()
    return repo, blobs


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 4:
        sys.exit("usage: python -m scalebox_cst.runtime.launch STORE_GIT COMMIT PROJECT_DIR SCRIPT [ARGS...]")
    store_path, commit_id, project_dir, script, args = argv[0], argv[1], argv[2], argv[3], argv[4:]

    from scalebox_cst.runtime.loader import exec_source, install_excepthook

    project_dir = os.path.realpath(project_dir)
    script_path = os.path.realpath(os.path.join(project_dir, script))
    rel = os.path.relpath(script_path, project_dir).replace(os.sep, "/")
    repo, blobs = _serve(store_path, commit_id, project_dir)
    if rel not in blobs:
        sys.exit(f"scalebox: {rel} is not in commit {commit_id[:10]} (is it included in scalebox.toml?)")

    install_excepthook()
    # Children (and their children) that re-create __main__ run this commit's script; an import
    # hook run started inside this one sets its own variable again, and wins (see _spawn_main).
    os.environ[ENV_RUN] = json.dumps(
        {"store": os.path.realpath(store_path), "commit": str(repo[commit_id].id), "project": project_dir, "script": rel}
    )
    os.environ.pop(_ENV_HOOK_MAIN, None)
    sys.argv = [script_path, *args]
    sys.path[0] = os.path.dirname(script_path)
    main_module = types.ModuleType("__main__")
    main_module.__dict__.update(
        __file__=script_path,
        __builtins__=__builtins__,
        __cached__=None,
        __spec__=_main_spec(script_path),
    )
    sys.modules["__main__"] = main_module
    exec_source(repo[blobs[rel]].data, script_path, main_module.__dict__)


def _main_spec(script_path: str):
    """``__main__.__spec__``: multiprocessing re-creates the main module from this name."""
    import importlib.machinery

    return importlib.machinery.ModuleSpec(SPAWN_MAIN, None, origin=script_path)


def run_spawned_main(namespace: dict) -> None:
    """Body of ``scalebox_cst._spawn_main`` as ``__mp_main__`` in a spawn/forkserver child of a run:
    serve the commit named by :data:`ENV_RUN` and run its script in ``namespace``."""
    from scalebox_cst.runtime.loader import exec_source, install_excepthook

    settings = json.loads(os.environ[ENV_RUN])
    project_dir, rel = settings["project"], settings["script"]
    script_path = os.path.join(project_dir, *rel.split("/"))
    repo, blobs = _serve(settings["store"], settings["commit"], project_dir)
    install_excepthook()
    namespace.update(__file__=script_path, __cached__=None, __package__=None)
    if sys.argv:
        sys.argv[0] = script_path  # as for a plain script (runpy restores its own value after)
    exec_source(repo[blobs[rel]].data, script_path, namespace)


if __name__ == "__main__":
    main()
