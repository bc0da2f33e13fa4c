"""The differential harness the tests share: rewrite a snippet, load code, pair original and rewrite.

Every transform is tested the same way: rewrite a piece of code through the real pipeline (one
transform or several, a backend, options), load the original and the rewritten text as modules,
and call both on the same inputs (bitwise equal where the site says ``exact``). The three steps
were written out again in most test files (35 copies in 18 files); they live here, and a test
file binds them to its transform::

    from harness import load, pairer, rewriter

    rewrite = rewriter("vectorize.reduction")          # (output text, sites)
    pair = pairer("vectorize.reduction")               # (original fn, rewritten fn, text, sites)
"""
from __future__ import annotations

import linecache
import textwrap
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from scalebox_cst.config import Config
from scalebox_cst.pipeline import Pipeline
from scalebox_cst.report import Site

Transforms = Union[None, str, Sequence[str]]
#: the file name a documented example is rewritten as (site labels in its golden output show it)
EXAMPLE_PATH = "example.py"


def config(transforms: Transforms = None, options: Optional[Dict[str, Dict[str, Any]]] = None) -> Config:
    """A config running ``transforms`` (an id or glob, a list of them, or None: the defaults) with
    ``options`` (``{section: {key: value}}``) set."""
    cfg = Config() if transforms is None else Config(transforms=[transforms] if isinstance(transforms, str) else list(transforms))
    for section, table in (options or {}).items():
        for key, value in table.items():
            cfg.set_option(section, key, value)
    return cfg


def rewrite(src: str, transforms: Transforms = None, backend: str = "cpu", *, dedent: bool = True,
            options: Optional[Dict[str, Dict[str, Any]]] = None, path: str = "t.py",
            check: bool = True) -> Tuple[str, List[Site]]:
    """``(rewritten text, sites)`` of ``src`` through the pipeline; ``check``: the file's report
    has no error (a transform that failed would leave the file unchanged and look like a skip)."""
    text = textwrap.dedent(src) if dedent else src
    result = Pipeline(config(transforms, options), backend=backend).rewrite(path, text.encode())
    if check:
        assert result.report.error is None, result.report.error
    return result.output.decode(), list(result.report.sites)


def load(code: str, name: Optional[str] = None, filename: str = "<t>", module: Optional[str] = None,
         cache_lines: bool = False) -> Any:
    """Execute ``code`` as a fresh module: its namespace, or the object ``name`` in it.
    ``cache_lines``: its lines go to ``linecache`` under ``filename`` (tracebacks and ``inspect``
    show them)."""
    if cache_lines:
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    ns: Dict[str, Any] = {} if module is None else {"__name__": module}
    exec(compile(code, filename, "exec"), ns)
    return ns if name is None else ns[name]


def pair(src: str, name: str, transforms: Transforms = None, backend: str = "cpu", *, dedent: bool = True,
         options: Optional[Dict[str, Dict[str, Any]]] = None) -> Tuple[Any, Any, str, List[Site]]:
    """``(original name, rewritten name, rewritten text, sites)``: the objects to call side by side."""
    out, sites = rewrite(src, transforms, backend, dedent=dedent, options=options)
    original = textwrap.dedent(src) if dedent else src
    return load(original, name), load(out, name), out, sites


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
