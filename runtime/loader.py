"""Import project modules from bytes that are not on disk (a store commit, a rewrite cache).

``SourceMapFinder`` maps ``sys.path`` entries inside a project root onto a dict of project-
relative paths, so ``import agents.ppo`` finds ``agents/ppo.py`` in a commit's tree. Modules keep
their real ``__file__``; their source is put in ``linecache`` so tracebacks and
``inspect.getsource`` show the lines that actually ran. Both the executor and the import hook use
this loader: there is one way to run code that did not come from disk.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import linecache
import os
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from scalebox_cst.textlines import physical_lines  # the one rule for line numbers, shared with the engine


#: files whose code was compiled from served (possibly rewritten) source: only their lines map
#: back through an Origin; a project file run by path (``runpy.run_path``, ``exec(open(...))``)
#: ran from disk, and its line numbers are already the user's
_served: set = set()


def served(filename: str) -> bool:
    """Whether ``filename``'s code came from :func:`register_source` (served, not read from disk)."""
    return filename in _served


def register_source(filename: str, source: str) -> None:
    """Make ``linecache`` (tracebacks, inspect) return ``source`` for ``filename``.

    An mtime of None tells ``linecache.checkcache`` never to drop or re-read the entry from disk,
    where the original (un-rewritten) file lives. Lines end where Python's do (``str.splitlines``
    would also end them at a form feed, and every later line would be quoted off by one).
    """
    linecache.cache[filename] = (len(source), None, physical_lines(source), filename)
    _served.add(filename)


def forget_source(filename: str) -> None:
    """Undo :func:`register_source` and :func:`register_origin` for ``filename``: its code comes
    from the file on disk again (a module re-imported unrewritten). The entry, kept for ever
    (mtime None), had tracebacks, inspect and the excepthook's map read the old rewrite."""
    if filename in _served:
        _served.discard(filename)
        entry = linecache.cache.get(filename)
        if entry is not None and len(entry) == 4 and entry[1] is None:
            linecache.cache.pop(filename, None)
    _origins.pop(filename, None)


class Origin:
    """Where the lines of one served, rewritten file came from: the user's text, and the sites.

    Tracebacks name the user's file and *its* line, quote the user's line, and mark frames in
    rewritten code. ``sites``: ``(line, end_line, transform)`` spans of the user's file."""

    def __init__(self, original: str, rewritten: str, sites: Sequence[Tuple[int, int, str]] = (), label: str = "") -> None:
        import difflib

        self.original = [line.rstrip("\r\n") for line in physical_lines(original)]
        self.rewritten = [line.rstrip("\r\n") for line in physical_lines(rewritten)]
        self.sites = list(sites)
        self.label = label
        self.map: Dict[int, Tuple[int, bool]] = {}  # rewritten line -> (user's line, same text)
        matcher = difflib.SequenceMatcher(None, self.original, self.rewritten, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            for k in range(j2 - j1):
                if tag == "equal":
                    self.map[j1 + k + 1] = (i1 + k + 1, True)
                else:  # inserted or replaced: the user's line it stands for (the next one)
                    self.map[j1 + k + 1] = (min(i1 + k, max(i2 - 1, i1)) + 1, False)

    def locate(self, line: int) -> Tuple[int, Optional[str], Optional[str]]:
        """(user's line, user's text, mark or None) for a line of the rewritten file."""
        old, same = self.map.get(line, (line, True))
        text = self.original[old - 1].strip() if 0 < old <= len(self.original) else None
        transform = next((t for lo, hi, t in self.sites if lo <= old <= hi), None)
        if transform is not None:
            what = f"{transform} site"
        elif not same:
            what = "rewritten code"
        else:
            return old, text, None
        return old, text, f"{self.label}, {what}" if self.label else what

    def ran(self, line: int) -> Optional[str]:
        return self.rewritten[line - 1].strip() if 0 < line <= len(self.rewritten) else None


#: filename -> Origin, or a callable giving one (or None) when a traceback first needs it
_origins: Dict[str, object] = {}
_origin_resolvers: List[Callable[[str], Optional[Origin]]] = []


def register_origin(filename: str, origin) -> None:
    """Tracebacks through ``filename`` are shown in the user's lines (``origin``: an
    :class:`Origin` or a no-argument callable returning one, called only when needed)."""
    _origins[filename] = origin


def add_origin_resolver(resolver: Callable[[str], Optional[Origin]]) -> None:
    """``resolver(filename)`` -> Origin or None, asked for files not registered one by one."""
    _origin_resolvers.append(resolver)


def origin_of(filename: str) -> Optional[Origin]:
    found = _origins.get(filename)
    if found is None:
        for resolver in _origin_resolvers:
            try:
                found = resolver(filename)
            except Exception:  # a traceback must print whatever the store says
                found = None
            if found is not None:
                break
        _origins[filename] = found if found is not None else False
    elif callable(found) and not isinstance(found, Origin):
        try:
            found = found()
        except Exception:
            found = None
        _origins[filename] = found if found is not None else False
    return found or None


#: ``(co_filename, co_name)`` of the engine's loaders' ``exec_module`` (:func:`import_machinery`)
_machinery: set = set()


def import_machinery(function):
    """Mark ``function`` (a loader's ``exec_module``) as import machinery: a traceback through an
    import the engine served leaves its frame out, with the importlib frames around it, as
    CPython leaves out its own loaders' frames (``_call_with_frames_removed``)."""
    code = function.__code__
    _machinery.add((code.co_filename, code.co_name))
    return function


def _without_import_machinery(stack, syntax: bool = False):
    """``stack`` less each run of import-machinery frames (importlib's, then the engine loader's)
    that leads to further frames: what a traceback through a plain import shows. ``syntax``: a
    SyntaxError, whose own lines show where it is: a last run of the engine loader's frames goes
    too (CPython's compile of a module runs in frames it removes)."""
    def machinery(frame):
        return frame.filename.startswith("<frozen importlib._bootstrap") or (frame.filename, frame.name) in _machinery

    frames, run = [], []
    for frame in stack:
        if machinery(frame):
            run.append(frame)
            continue
        if not any((f.filename, f.name) in _machinery for f in run):
            frames.extend(run)  # importlib's alone (CPython kept them): not ours to drop
        run = []
        frames.append(frame)
    if not (syntax and any((f.filename, f.name) in _machinery for f in run)):
        frames.extend(run)  # the exception was raised there: kept
    return frames


def user_frames(stack, syntax: bool = False):
    """``stack`` (a traceback.StackSummary) in the user's lines, frames of the engine's import
    machinery left out (``syntax``: of a SyntaxError); returns (frames, marks)."""
    import traceback

    frames, marks = [], {}
    for frame in _without_import_machinery(stack, syntax):
        origin = origin_of(frame.filename)
        if origin is None or frame.lineno is None:
            frames.append(frame)
            continue
        line, text, mark = origin.locate(frame.lineno)
        new = traceback.FrameSummary(frame.filename, line, frame.name, lookup_line=False, locals=frame.locals, line=text or "")
        if mark is not None:
            ran = origin.ran(frame.lineno)
            marks[len(frames)] = (mark, ran if ran and ran != text else None)
        frames.append(new)
    return frames, marks


def format_exception(exc_type, exc, tb, chain: bool = True) -> str:
    """The traceback as the user should read it (see :class:`Origin`), chained causes included
    (``chain=False``: left out, as Python's unraisable hook leaves them)."""
    import traceback

    class _Stack(traceback.StackSummary):
        marks: Dict[int, Tuple[str, Optional[str]]] = {}
        places: Dict[int, int] = {}  # id of a frame -> its index

        def format_frame_summary(self, frame):
            text = super().format_frame_summary(frame)
            # by the frame's place, looked up (a scan of the stack per frame took minutes to print
            # a RecursionError under a raised recursion limit: 100,000 frames)
            found = self.marks.get(self.places.get(id(frame), -1))
            if found is not None:
                mark, ran = found
                head, sep, rest = text.partition("\n")
                text = f"{head}  ({mark})\n{rest}"
                if ran:
                    text += f"    ran: {ran}\n"
            return text

    te = traceback.TracebackException(exc_type, exc, tb)
    seen, todo = set(), [te]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        frames, marks = user_frames(item.stack, issubclass(getattr(item, "exc_type", None) or type(None), SyntaxError))
        stack = _Stack(frames)  # (StackSummary.from_list makes a plain StackSummary)
        stack.marks = marks
        stack.places = {id(frame): index for index, frame in reversed(list(enumerate(frames)))}
        item.stack = stack
        todo.extend(x for x in (item.__cause__, item.__context__) if x is not None)
        todo.extend(getattr(item, "exceptions", None) or [])
    return "".join(te.format(chain=chain))


def _engine_dirs():
    """Folders of the launcher and the import hook (``python -m scalebox_cst``): their frames
    lead every traceback of a run and are not the user's."""
    dirs = {os.path.dirname(os.path.abspath(__file__))}
    package = sys.modules.get("scalebox_cst")
    if package is not None and getattr(package, "__file__", None):
        core = os.path.dirname(os.path.abspath(package.__file__))
        dirs.update((core, os.path.join(core, "importhook")))  # the hook is a package of its own
    return dirs


def _excepthook(exc_type, exc, tb) -> None:
    """Print tracebacks in the user's lines (:func:`format_exception`; the C default reads lines
    from disk), without the launcher's own frames."""
    if issubclass(exc_type, KeyboardInterrupt) and _in_a_run():
        # The usual way a run ends under the watcher (a save restarts it): one line, no traceback,
        # saying why when the executor stopped it (its "stopping" event, scalebox_cst.runner.execution.Execution.stop).
        # Elsewhere (the import hook in the user's own python) Ctrl-C shows where it stopped, as Python does.
        why = _stop_reason()
        print(f"scalebox: run stopped: {why}" if why else "scalebox: run interrupted (KeyboardInterrupt)", file=sys.stderr)
        return
    engine = _engine_dirs()
    first = tb
    while tb is not None and (
        tb.tb_frame.f_code.co_filename.startswith("<frozen")
        or os.path.dirname(os.path.abspath(tb.tb_frame.f_code.co_filename)) in engine
    ):
        tb = tb.tb_next
    tb = tb or first
    try:
        text = format_exception(exc_type, exc, tb)
    except Exception:  # never lose the user's traceback to a bug in ours
        import traceback

        text = "".join(traceback.format_exception(exc_type, exc, tb))
    sys.stderr.write(text)
    sys.stderr.flush()
    if exc_type is KeyboardInterrupt and sys._getframe().f_back is None:  # (Python's own call, at exit)
        _end_as_interrupted()


def _end_as_interrupted() -> None:
    """Python ends a process whose Ctrl-C went unhandled by SIGINT (status 130 in a shell, where a
    loop of runs stops on it). It notes the interrupt before it calls the excepthook, and code
    run from a string while the hook prints (exec or eval: a namedtuple or dataclass made by a
    module the hook imports first) clears the note: ``python -m scalebox_cst train.py`` ended
    with status 1, and a shell loop went on to its next run. A string that raises it notes it
    again (only where Python itself called the hook: nothing of the program is below it)."""
    try:
        exec("raise KeyboardInterrupt", {})  # noqa: S102 - a constant string
    except KeyboardInterrupt:
        pass


def _in_a_run() -> bool:
    """Whether this process is part of a run the executor started (it set the run's folder)."""
    from scalebox_cst.runtime.lifeline import ENV_RUN_DIR

    return bool(os.environ.get(ENV_RUN_DIR))


def _stop_reason():
    """Why the executor is stopping this run, if it is (runtime.lifeline)."""
    from scalebox_cst.runtime.lifeline import stop_reason

    return stop_reason()


def _thread_excepthook(args) -> None:
    """threading's default hook, its traceback in the user's lines: the default (C) hook reads
    each line from the file on disk, and quoted, at a rewritten line number, a line of the user's
    file that did not run (often a blank one)."""
    if args.exc_type is SystemExit:
        return  # as threading's: a thread that exits quietly
    stderr = sys.stderr if sys.stderr is not None else getattr(args.thread, "_stderr", None)
    if stderr is None:
        return
    import threading

    name = args.thread.name if args.thread is not None else threading.get_ident()
    try:
        text = format_exception(args.exc_type, args.exc_value, args.exc_traceback)
    except Exception:  # never lose the thread's traceback to a bug in ours
        import traceback

        text = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
    stderr.write(f"Exception in thread {name}:\n{text}")
    stderr.flush()


def _unraisablehook(unraisable) -> None:
    """Python's default unraisable hook (an exception in ``__del__``, a weakref callback, an atexit
    function), its traceback in the user's lines: the default (C) reads lines from the file on
    disk, at the rewritten line numbers."""
    stderr = sys.stderr
    if stderr is None:
        return
    head = ""
    if unraisable.object is not None:
        try:
            shown = repr(unraisable.object)
        except Exception:
            shown = "<object repr() failed>"
        head = f"{unraisable.err_msg or 'Exception ignored in'}: {shown}\n"
    elif unraisable.err_msg:
        head = f"{unraisable.err_msg}:\n"
    if unraisable.exc_type is None:
        stderr.write(head)
        stderr.flush()
        return
    try:
        text = format_exception(unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback, chain=False)
    except Exception:  # never lose it to a bug in ours
        sys.__unraisablehook__(unraisable)
        return
    stderr.write(head + text)
    stderr.flush()


def install_excepthook() -> None:
    """Tracebacks in the user's lines (uncaught, in the main thread and in others, and unraisable);
    warnings, log records and inspect stacks too (:mod:`scalebox_cst.runtime.user_lines`)."""
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _excepthook
    import threading

    if threading.excepthook is threading.__excepthook__:
        threading.excepthook = _thread_excepthook
    if sys.unraisablehook is sys.__unraisablehook__:
        sys.unraisablehook = _unraisablehook
    from scalebox_cst.runtime import user_lines

    user_lines.install()


def exec_source(source: bytes, filename: str, namespace: dict) -> None:
    text = importlib.util.decode_source(source)
    register_source(filename, text)
    code = compile(text, filename, "exec", dont_inherit=True)
    exec(code, namespace)


class SourceBytesLoader(importlib.abc.InspectLoader):
    """Loads one module from source bytes held in memory; reports its real file path."""

    def __init__(self, fullname: str, filename: str, source: bytes, is_package: bool) -> None:
        self.name = fullname
        self.path = filename
        self._source = source
        self._is_package = is_package

    def is_package(self, fullname: str) -> bool:
        return self._is_package

    def get_filename(self, fullname: str) -> str:
        return self.path

    def get_source(self, fullname: str) -> str:
        return importlib.util.decode_source(self._source)

    @import_machinery
    def get_code(self, fullname: str):
        text = self.get_source(fullname)
        register_source(self.path, text)
        return compile(text, self.path, "exec", dont_inherit=True)

    def get_data(self, path: str) -> bytes:  # resources next to the module come from disk
        with open(path, "rb") as fh:
            return fh.read()

    def get_resource_reader(self, fullname: str):
        """``importlib.resources.files(package)`` reads the package's folder on disk, as for a
        plain import (``FileLoader``'s reader): without it, files() of a served package had no
        reader and every resource was an "orphan path" (FileNotFoundError)."""
        from importlib.readers import FileReader

        return FileReader(self)  # it reads only ``.path``

    # exec_module is InspectLoader's, importlib's own (SourceFileLoader runs it too): it runs the
    # code through _bootstrap._call_with_frames_removed, so CPython cuts the import's frames out of
    # the traceback of an exception the module raises, for every reader (traceback.print_exc,
    # logging, pytest), as for a plain import. An exec_module of ours split importlib's frames in
    # two around its own, and every traceback caught by the program showed both.


class SourceMapFinder(importlib.abc.MetaPathFinder):
    """Finds modules under ``root`` in ``files`` (project-relative ``/`` paths → bytes getter)."""

    def __init__(self, root: str, paths: Sequence[str], read: Callable[[str], bytes]) -> None:
        self.root = os.path.realpath(root)
        self.paths = frozenset(paths)
        self.read = read
        self._rel_cache: Dict[str, Optional[str]] = {}

    def _prefix(self, entry: str) -> Optional[str]:
        cached = self._rel_cache.get(entry, False)
        if cached is not False:
            return cached
        real = os.path.realpath(entry or os.getcwd())
        rel = os.path.relpath(real, self.root)
        if rel == os.curdir:
            prefix: Optional[str] = ""
        elif rel.startswith(os.pardir) or os.path.isabs(rel):
            prefix = None
        else:
            prefix = rel.replace(os.sep, "/") + "/"
        self._rel_cache[entry] = prefix
        return prefix

    def find_spec(self, fullname: str, path=None, target=None):
        name = fullname.rpartition(".")[2]
        for entry in sys.path if path is None else path:
            if not isinstance(entry, str):
                continue
            prefix = self._prefix(entry)
            if prefix is None:
                continue
            package = f"{prefix}{name}/__init__.py"
            if package in self.paths:
                return self._spec(fullname, package, is_package=True)
            module = f"{prefix}{name}.py"
            if module in self.paths:
                return self._spec(fullname, module, is_package=False)
        return None

    def _spec(self, fullname: str, relpath: str, is_package: bool):
        filename = os.path.join(self.root, *relpath.split("/"))
        loader = SourceBytesLoader(fullname, filename, self.read(relpath), is_package)
        spec = importlib.util.spec_from_file_location(
            fullname,
            filename,
            loader=loader,
            submodule_search_locations=[os.path.dirname(filename)] if is_package else None,
        )
        return spec

    def install(self) -> "SourceMapFinder":
        sys.meta_path.insert(0, self)
        return self

    def uninstall(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
