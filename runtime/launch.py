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

The executor passes :data:`ENV_INFO` (branch, run, variant, source commit); with it, tracebacks of
a rewrite are shown in the user's lines (runtime.loader.Origin). :data:`ENV_SEED` asks the
launcher to seed ``random``/numpy/torch and the envs gymnasium/gym would seed from the OS
(runtime.seeding) before the script runs (``scalebox run --seeds``; with ``--seed N`` appended
too: a script that takes the option often seeds torch alone). The launcher ends its process group when the executor that
started it dies (even by SIGKILL, even in its start-up: runtime.lifeline), so no run outlives
``scalebox run``.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import types

#: set by the launcher (and inherited): ``{"store", "commit", "project", "script"}`` as JSON
ENV_RUN = "SCALEBOX_RUN"
#: the import hook's own variable for ``python -m scalebox_cst`` (see scalebox_cst.importhook)
_ENV_HOOK_MAIN = "SCALEBOX_HOOK_MAIN"
SPAWN_MAIN = "scalebox_cst._spawn_main"
#: set by the executor: ``{"branch", "run", "variant", "commit", "source_commit", "seed"}`` as JSON
ENV_INFO = "SCALEBOX_RUN_INFO"
#: set by the executor for scripts that take no --seed option
ENV_SEED = "SCALEBOX_SEED"
#: notes ref of the site reports (scalebox_cst.store.REPORTS_REF; not imported: keep the child light)
_REPORTS_REF = "refs/notes/scalebox-reports"


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
    _resolve_origins(repo, commit_id, blobs, project_dir)
    return repo, blobs


def _resolve_origins(repo, commit_id: str, blobs, project_dir: str) -> None:
    """Tracebacks through rewritten files show the user's lines: the originals come from the
    source snapshot, the site spans from the stored report, both read only when a traceback is."""
    try:
        info = json.loads(os.environ.get(ENV_INFO) or "{}")
    except ValueError:
        info = {}
    if info.get("variant", "rewrite") != "rewrite":
        return
    from scalebox_cst.runtime.loader import Origin, add_origin_resolver, served

    state = {}

    def setup():
        import pygit2

        commit = repo[commit_id]
        source = info.get("source_commit")
        if not source:
            for line in commit.message.splitlines():
                if line.startswith("Scalebox-Source:"):
                    source = line.split(":", 1)[1].strip()
        if not source:
            return None
        sites = {}
        try:
            report = json.loads(repo.lookup_note(str(commit.id), _REPORTS_REF).message)
            for f in report.get("files", []):
                sites[f["path"]] = [(s["line"], s["end_line"], s["transform"]) for s in f.get("sites", []) if s.get("action") == "rewritten"]
        except (KeyError, ValueError, TypeError, RecursionError):
            pass
        return repo[source].peel(pygit2.Tree), sites

    def resolve(filename):
        if not served(filename):  # run by path from the working tree: the user's own lines
            return None
        if "tree" not in state:
            state["tree"] = setup()
        if state["tree"] is None:
            return None
        tree, sites = state["tree"]
        rel = os.path.relpath(filename, project_dir).replace(os.sep, "/")
        if rel not in blobs:
            return None
        try:
            original = tree[rel]
        except KeyError:
            return None
        if original.id == blobs[rel]:
            return None  # not rewritten: its lines are the user's
        decode = importlib.util.decode_source
        return Origin(decode(original.data), decode(repo[blobs[rel]].data), sites.get(rel, ()), info.get("branch") or "")

    add_origin_resolver(resolve)


def _seed_from_env() -> None:
    """Seed the generators a script draws from unless it seeds them itself (ENV_SEED): runtime.seeding."""
    raw = os.environ.get(ENV_SEED)
    if raw is None:
        return
    from scalebox_cst.runtime import seeding

    seeding.seed_all(int(raw))


def main(argv=None) -> None:
    from scalebox_cst.runtime import lifeline

    lifeline.hold(grace=3.0)  # first: the run ends with the executor, whatever this process imports
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 4:
        sys.exit("usage: python -m scalebox_cst.runtime.launch STORE_GIT COMMIT PROJECT_DIR SCRIPT [ARGS...]")
    store_path, commit_id, project_dir, script, args = argv[0], argv[1], argv[2], argv[3], argv[4:]

    from scalebox_cst.runtime.loader import exec_source, install_excepthook

    install_excepthook()  # before the store is read: a stop during start-up is one line too
    project_dir = os.path.realpath(project_dir)
    script_path = os.path.realpath(os.path.join(project_dir, script))
    rel = os.path.relpath(script_path, project_dir).replace(os.sep, "/")
    repo, blobs = _serve(store_path, commit_id, project_dir)
    if rel not in blobs:
        sys.exit(f"scalebox: {rel} is not in commit {commit_id[:10]} (is it included in scalebox.toml?)")

    from scalebox_cst.runtime import telemetry  # measured without the user's help (issue 10)

    telemetry.install()  # SCALEBOX_TELEMETRY=0: off
    if os.environ.get("SCALEBOX_CALIBRATE_PRECISION"):  # scalebox run --calibrate-precision (runtime.precision)
        from scalebox_cst.runtime import precision

        precision.install_from_env()
    if os.environ.get("SCALEBOX_DEVICE_MEMORY"):  # scalebox run --device-memory (runtime.limits)
        from scalebox_cst.runtime import limits

        limits.apply()
    _seed_from_env()
    # Children (and their children) that re-create __main__ run this commit's script; an import
    # hook run started inside this one sets its own variable again, and wins (see _spawn_main).
    os.environ[ENV_RUN] = json.dumps(
        {"store": os.path.realpath(store_path), "commit": str(repo[commit_id].id), "project": project_dir, "script": rel}
    )
    os.environ.pop(_ENV_HOOK_MAIN, None)
    sys.argv = [script_path, *args]
    sys.path[0] = os.path.dirname(script_path)
    import signal

    if signal.getsignal(signal.SIGINT) is lifeline.stopped_in_start_up:  # set by hold()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # from here a stop is the script's KeyboardInterrupt
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
    from scalebox_cst.runtime import telemetry

    telemetry.install_worker()  # its envs' episodes, under its worker's names
    namespace.update(__file__=script_path, __cached__=None, __package__=None)
    if sys.argv:
        sys.argv[0] = script_path  # as for a plain script (runpy restores its own value after)
    exec_source(repo[blobs[rel]].data, script_path, namespace)


if __name__ == "__main__":
    main()
