"""Child-process entry point: run a script exactly as committed in the store.

``python -m scalebox_cst.runtime.launch STORE_GIT COMMIT PROJECT_DIR SCRIPT [ARGS...]``

The script and every project module it imports are served from COMMIT's tree (nothing is
written into the project); ``__file__`` is the real path, the working directory is the project,
so data and config files are read from disk as usual.
"""
from __future__ import annotations

import os
import sys
import types


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 4:
        sys.exit("usage: python -m scalebox_cst.runtime.launch STORE_GIT COMMIT PROJECT_DIR SCRIPT [ARGS...]")
    store_path, commit_id, project_dir, script, args = argv[0], argv[1], argv[2], argv[3], argv[4:]

    import pygit2

    from scalebox_cst.runtime.loader import SourceMapFinder, exec_source, install_excepthook

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

    project_dir = os.path.realpath(project_dir)
    script_path = os.path.realpath(os.path.join(project_dir, script))
    rel = os.path.relpath(script_path, project_dir).replace(os.sep, "/")
    if rel not in blobs:
        sys.exit(f"scalebox: {rel} is not in commit {commit_id[:10]} (is it included in scalebox.toml?)")

    SourceMapFinder(project_dir, blobs, lambda p: repo[blobs[p]].data).install()
    install_excepthook()
    sys.argv = [script_path, *args]
    sys.path[0] = os.path.dirname(script_path)
    main_module = types.ModuleType("__main__")
    main_module.__dict__.update(__file__=script_path, __builtins__=__builtins__, __cached__=None)
    sys.modules["__main__"] = main_module
    exec_source(repo[blobs[rel]].data, script_path, main_module.__dict__)


if __name__ == "__main__":
    main()
