"""The differential harness the tests share: rewrite a snippet, load code, pair original and rewrite.

Every transform is tested the same way: rewrite a piece of code through the real pipeline (one
transform or several, a backend, options), load the original and the rewritten text as modules,
and call both on the same inputs (bitwise equal where the site says ``exact``). The three steps
were written out again in most test files (35 copies in 18 files); they live here, and a test
file binds them to its transform::

    from harness import load, pairer, rewriter

    rewrite = rewriter("vectorize.reduction")          # (output text, sites)
    pair = pairer("vectorize.reduction")               # (original fn, rewritten fn, text, sites)

Running both sides at module level on copies of the same inputs is :func:`run_pair`; a test that
wants the whole :class:`FileResult` (report, error, output bytes) asks :func:`rewrite_result`, and one
that rewrites several files through one pipeline (caches, timings) asks :func:`pipeline`.
Calling two functions on clones of the same arguments is :func:`call_both`; recording what a run-time
guard answered is :func:`spy` (a context) or :class:`GuardSpy` (pytest's monkeypatch); a benchmark
or kernel file is imported by :func:`load_path`. ``tests/test_layout.py`` checks that no other test
file builds a ``Pipeline``, execs or compiles code as a module, or imports another test file.

Siblings, one concept each: ``differential.py`` compares values (bitwise, namespaces) and draws
inputs; ``recurrence_harness.py`` runs ``vectorize.recurrence`` snippets with the guard's branch
checked; ``corpus_harness.py`` reads the public-code corpus and compares its runs.
"""
from __future__ import annotations

import contextlib
import copy
import importlib.util
import linecache
import signal
import sys
import textwrap
import time
import types
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from scalebox_cst.config import Config
from scalebox_cst.pipeline import FileResult, Pipeline
from scalebox_cst.report import Site

Transforms = Union[None, str, Sequence[str], Config]
Code = Union[str, bytes, types.CodeType]
#: the file name a documented example is rewritten as (site labels in its golden output show it)
EXAMPLE_PATH = "example.py"


def config(transforms: Transforms = None, options: Optional[Dict[str, Dict[str, Any]]] = None) -> Config:
    """A config running ``transforms`` (an id or glob, a list of them, None: the defaults, or a
    ready :class:`Config`) with ``options`` (``{section: {key: value}}``) set."""
    if isinstance(transforms, Config):
        cfg = transforms
    else:
        cfg = Config() if transforms is None else Config(transforms=[transforms] if isinstance(transforms, str) else list(transforms))
    for section, table in (options or {}).items():
        for key, value in table.items():
            cfg.set_option(section, key, value)
    return cfg


def pipeline(transforms: Transforms = None, backend: str = "cpu", *,
             options: Optional[Dict[str, Dict[str, Any]]] = None, instances: Optional[Sequence[Any]] = None,
             **kwargs: Any) -> Pipeline:
    """The pipeline :func:`rewrite` uses, for a test that rewrites several files through one
    (its caches, its timings); ``instances``: transform objects to run instead of the registry's;
    ``kwargs`` go to :class:`Pipeline`."""
    if instances is not None:
        kwargs["transforms"] = list(instances)
    return Pipeline(config(transforms, options), backend=backend, **kwargs)


def rewrite_result(src: Union[str, bytes], transforms: Transforms = None, backend: str = "cpu", *,
                   dedent: bool = False, options: Optional[Dict[str, Dict[str, Any]]] = None,
                   path: str = "t.py") -> FileResult:
    """The pipeline's whole :class:`FileResult` for ``src`` (text or bytes, as given unless
    ``dedent``), rewritten as file ``path``: report, error and output bytes."""
    if isinstance(src, str):
        src = (textwrap.dedent(src) if dedent else src).encode()
    return pipeline(transforms, backend, options=options).rewrite(path, src)


def rewrite(src: str, transforms: Transforms = None, backend: str = "cpu", *, dedent: bool = True,
            options: Optional[Dict[str, Dict[str, Any]]] = None, path: str = "t.py",
            check: bool = True) -> Tuple[str, List[Site]]:
    """``(rewritten text, sites)`` of ``src`` through the pipeline; ``check``: the file's report
    has no error (a transform that failed would leave the file unchanged and look like a skip)."""
    result = rewrite_result(src, transforms, backend, dedent=dedent, options=options, path=path)
    if check:
        assert result.report.error is None, result.report.error
    return result.output.decode(), list(result.report.sites)


def compiled(code: Code, filename: str = "<t>") -> types.CodeType:
    """``code`` (text, bytes or an already compiled module) as a module's code object, compiled as
    its own module would be (no ``__future__`` flags inherited from the harness)."""
    return code if isinstance(code, types.CodeType) else compile(code, filename, "exec", dont_inherit=True)


def load(code: Code, name: Optional[str] = None, filename: str = "<t>", module: Optional[str] = None,
         cache_lines: bool = False, namespace: Optional[Dict[str, Any]] = None) -> Any:
    """Execute ``code`` as a module: its namespace, or the object ``name`` in it. The namespace is
    fresh (``__name__`` = ``module`` if given) unless ``namespace`` is given (the globals the code
    runs in: a test's inputs). ``cache_lines``: its lines go to ``linecache`` under ``filename``
    (tracebacks and ``inspect`` show them)."""
    if cache_lines:
        text = code.decode() if isinstance(code, bytes) else code
        assert isinstance(text, str), "cache_lines needs the source text"
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    ns: Dict[str, Any] = namespace if namespace is not None else {} if module is None else {"__name__": module}
    exec(compiled(code, filename), ns)
    return ns if name is None else ns[name]


def load_path(path: str, module: str, register: bool = False) -> types.ModuleType:
    """The file at ``path`` (a benchmark, a kernel table) imported as module ``module`` without
    its folder on ``sys.path``; ``register``: in ``sys.modules`` first (dataclasses look their
    module up there), an already registered one is run again."""
    spec = importlib.util.spec_from_file_location(module, path)
    assert spec is not None and spec.loader is not None, path
    loaded = importlib.util.module_from_spec(spec)
    if register:
        loaded = sys.modules.setdefault(module, loaded)
    spec.loader.exec_module(loaded)
    return loaded


def outcome(code: Code, namespace: Dict[str, Any], filename: str = "<t>") -> Optional[type]:
    """Run ``code`` in ``namespace``: None, or the type of the exception it raised (a rewrite must
    fail the way the original does)."""
    try:
        load(code, filename=filename, namespace=namespace)
    except Exception as exc:
        return type(exc)
    return None


def run_pair(original: Code, rewritten: Code, env: Dict[str, Any], *,
             clone: Callable[[Dict[str, Any]], Dict[str, Any]] = dict,
             around_rewrite: Callable[[], Any] = contextlib.nullcontext,
             around_original: Callable[[], Any] = contextlib.nullcontext) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Run ``original`` and ``rewritten`` at module level, each in ``clone(env)``, the rewrite
    inside the context ``around_rewrite()`` returns (spies, a profiler, an alarm); both must
    raise the same exception type or none. ``(original namespace, rewritten namespace)``."""
    ns1, ns2 = clone(env), clone(env)
    with around_original():
        err1 = outcome(original, ns1, "orig")
    with around_rewrite():
        err2 = outcome(rewritten, ns2, "new")
    assert err1 is err2, (err1, err2)
    # a name the test's environment lacks fails both alike: a test that checks nothing
    assert err1 is not NameError, "the original raised NameError: the test's env lacks a name the code reads"
    return ns1, ns2


@contextlib.contextmanager
def spy(owner: Any, attr: str) -> Iterator[List[Any]]:
    """Replace ``owner.attr`` (a run-time guard, a kernel) by a wrapper that records what each call
    returns, in the list this yields; restored on exit."""
    real = getattr(owner, attr)
    answers: List[Any] = []

    def spying(*args: Any, **kwargs: Any) -> Any:
        answers.append(real(*args, **kwargs))
        return answers[-1]

    setattr(owner, attr, spying)
    try:
        yield answers
    finally:
        setattr(owner, attr, real)


@contextlib.contextmanager
def deadline(seconds: float, error: Callable[[], BaseException]) -> Iterator[None]:
    """Raise ``error()`` in the main thread when the block runs past ``seconds`` (SIGALRM).

    A timer already running (pytest-timeout's for the whole test, ``timeout`` in pyproject.toml)
    is put back on exit with what is left of it, its handler too: ``signal.alarm(0)`` after the
    block cancelled it, and the rest of the test ran with no limit. It still bounds the block
    where it ends first (then the block fails with ``error()``).
    """
    def expired(signum: int, frame: Any) -> None:
        raise error()

    outer, interval = signal.setitimer(signal.ITIMER_REAL, 0)
    old = signal.signal(signal.SIGALRM, expired)
    started = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, min(seconds, outer) if outer else seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 1e-3), interval)


_REWRITES: Dict[Tuple[Any, ...], Tuple[str, List[Site]]] = {}


def pair(src: str, name: str, transforms: Transforms = None, backend: str = "cpu", *, dedent: bool = True,
         options: Optional[Dict[str, Dict[str, Any]]] = None, cached: bool = False) -> Tuple[Any, Any, str, List[Site]]:
    """``(original name, rewritten name, rewritten text, sites)``: the objects to call side by side,
    each from a fresh module (a test may patch one's globals). ``cached``: rewrite each snippet once
    per session (hypothesis pairs it per example; a transform patched by the test is not seen)."""
    key = (src, repr(transforms), backend, dedent, repr(options))
    if cached and key in _REWRITES:
        out, sites = _REWRITES[key]
    else:
        out, sites = rewrite(src, transforms, backend, dedent=dedent, options=options)
        if cached:
            _REWRITES[key] = (out, sites)
    sites = list(sites)
    original = textwrap.dedent(src) if dedent else src
    return load(original, name, filename="orig"), load(out, name, filename="new"), out, sites


def call_both(original: Callable[..., Any], rewritten: Callable[..., Any], *args: Any,
              clone: Callable[[Any], Any] = copy.deepcopy) -> Tuple[List[Any], List[Any], Any, Any]:
    """Call both sides on clones of ``args``: ``(original's args after, rewrite's args after,
    original's result, rewrite's result)``; in-place writes show in the args."""
    a, b = [clone(x) for x in args], [clone(x) for x in args]
    return a, b, original(*a), rewritten(*b)


class GuardSpy:
    """Records what the run-time guards ``names`` of ``owner`` returned while a test runs (None:
    the loop ran), patched through pytest's ``monkeypatch`` (undone after the test)."""

    def __init__(self, monkeypatch: Any, owner: Any, names: Sequence[str]) -> None:
        self.results: List[Any] = []
        for name in names:
            real = getattr(owner, name)

            def wrapped(*args: Any, _real: Callable[..., Any] = real, **kwargs: Any) -> Any:
                result = _real(*args, **kwargs)
                self.results.append(result)
                return result

            monkeypatch.setattr(owner, name, wrapped)

    @property
    def fast(self) -> bool:
        """Some guard let the vectorized branch run."""
        return any(r is not None for r in self.results)


def rewritten_sites(sites: Iterable[Site], transform: Optional[str] = None) -> List[Site]:
    """The rewritten sites (of one transform)."""
    return [s for s in sites if s.action == "rewritten" and (transform is None or s.transform == transform)]


def rewriter(transforms: Transforms = None, backend: str = "cpu", **fixed: Any) -> Callable[..., Tuple[str, List[Site]]]:
    """:func:`rewrite` bound to a test file's transform(s) and backend (overridable per call)."""
    def bound(src: str, **kwargs: Any) -> Tuple[str, List[Site]]:
        kwargs.setdefault("backend", backend)
        return rewrite(src, transforms, **{**fixed, **kwargs})
    return bound


def pairer(transforms: Transforms = None, backend: str = "cpu") -> Callable[..., Tuple[Any, Any, str, List[Site]]]:
    """:func:`pair` bound to a test file's transform(s) and backend."""
    def bound(src: str, name: str, **kwargs: Any) -> Tuple[Any, Any, str, List[Site]]:
        kwargs.setdefault("backend", backend)
        return pair(src, name, transforms, **kwargs)
    return bound


def rewrite_example(case: Any) -> Tuple[str, List[Site]]:
    """``(output, sites)`` of a documented example (a :class:`scalebox_cst.transforms.examples.Case`):
    its code byte for byte, as file ``example.py``, through its transform alone, on its backend
    with its options."""
    example = case.example
    return rewrite(example.code, case.transform.id, example.backend, dedent=False, options=case.option_tables(),
                   path=EXAMPLE_PATH)
