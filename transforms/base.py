"""What every transform is: an id, a cheap text trigger, a rewrite that reports its sites.

A transform receives a :class:`FileContext` (the parsed module plus lazily resolved metadata)
and returns the new module and its :class:`~scalebox_cst.report.Site` list. Each transform class
carries its own ``EXAMPLES`` (code it rewrites and look-alikes it must leave alone), in the
manner of Fixit's ``Valid``/``Invalid(expected_replacement=...)`` and libcst's
``assertCodemod(before, after)``: an :class:`Example` holds its input, its exact output and how
the differential test calls it. One test (tests/transforms/test_examples_registry.py) runs every
example of every transform, listed by :func:`scalebox_cst.transforms.examples.all_examples`.

Where an expected output lives (one rule, no judgement per example): a rewritten example's output
is always a golden file, ``expected/<transform id>/<Example.expected>.expected`` in the folder of
the module that defines the transform class (e.g.
``transforms/vectorize/recurrence/expected/vectorize.recurrence/cleanrl_gae.expected``): byte for
byte what the transform alone makes of ``code``, as file ``example.py``, on the example's backend
with its options. A left-alone example has no file: its output is its input. Outputs run from 2 to
over 90 lines (recurrence emits guarded blocks), so none is inlined: each sits beside its family,
named in its example. ``.venv/bin/python tests/update_examples.py`` rewrites the files after an
intended change and prints the diff; the test never writes them and fails with a short diff.
"""
from __future__ import annotations

import abc
import ast
import dataclasses
import functools
from typing import Any, Callable, ClassVar, Dict, Iterable, List, Optional, Sequence, Tuple

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from scalebox_cst.config import Config
from scalebox_cst.linediff import LineMap
from scalebox_cst.report import Site

from . import partial as partial_module
from .analysis import cstparse
from .names import ImportMap, add_imports
from .partial import Partial


@dataclasses.dataclass(frozen=True)
class Inputs:
    """How the differential test calls a rewritten example: ``call(*args)``, original and rewrite.

    ``args`` is Python source for the argument tuple, read as written (``"torch.randn(5),
    torch.zeros(5), 0.99"``). For each seed it is evaluated twice, once per side, each time after
    ``torch.manual_seed(seed)``, so both sides get equal arguments they may change in place. In
    scope: ``torch``, ``nn``, ``np``, ``seed``, ``rng`` (``np.random.default_rng(seed)``) and the
    named recipes of tests/example_inputs.py (e.g. ``mlp_pair()``: a network and its target,
    ``attrs(gamma=0.99)``: a ``self`` with attributes).
    The test compares what ``call`` returns (or raises) and the arguments after the call, bitwise
    where every rewritten site says ``exact``, within float tolerance otherwise. Size the arguments
    so the run-time guard takes the fast path (recurrence: ``MIN_STEPS`` of its guard), else the
    rewrite runs the original loop and the comparison shows nothing: for the ``vectorize.*``
    transforms the test checks it (the rewrite runs fewer lines than the loop on each seed).
    """

    call: str
    args: str
    seeds: Tuple[int, ...] = (0,)


@dataclasses.dataclass(frozen=True)
class Example:
    """A piece of code and what the transform must do with it.

    ``rewritten=True``: the transform reports a rewritten site and its output is byte for byte the
    golden file named by ``expected`` (see the module docstring for where it lives); ``inputs``,
    where given, says how original and rewrite are run side by side. ``rewritten=False``: the code
    comes back byte for byte, no site is rewritten and ``reason`` (a substring, where given)
    appears among the reported skips and warnings. The example runs through its transform alone, on
    ``backend``, with ``options`` set in the transform's option section
    (:attr:`Transform.options_section`).
    """

    code: str
    rewritten: bool
    reason: str = ""
    note: str = ""
    backend: str = "cpu"
    options: Tuple[Tuple[str, Any], ...] = ()
    #: the golden file's name (without ``.expected``): set on every rewritten example
    expected: str = ""
    inputs: Optional[Inputs] = None



def at_options(examples: Iterable[Example], options: Tuple[Tuple[str, Any], ...], backend: str = "cpu") -> List[Example]:
    """``examples`` run with ``options`` on ``backend``; a rewritten one without a golden name is
    named after its note (``"CleanRL: optim.Adam"`` -> ``cleanrl_optim_adam``; a repeat gets ``_2``)."""
    out: List[Example] = []
    taken: Dict[str, int] = {}
    for e in examples:
        name = e.expected
        if e.rewritten and not name:
            base = "_".join("".join(c if c.isalnum() else " " for c in e.note.lower()).split())[:48] or "example"
            taken[base] = taken.get(base, 0) + 1
            name = base if taken[base] == 1 else f"{base}_{taken[base]}"
        out.append(dataclasses.replace(e, options=options, backend=backend, expected=name))
    return out

class FileContext:
    """One module being rewritten, with metadata resolved on first use only.

    Analysis is cheapest on Python's ``ast`` (``ctx.tree``: parsed once per module version and
    shared by every transform that sees that version); libcst is for editing. A full libcst
    visit of a 300-line file costs ~15 ms, so a transform with nothing to do should return
    ``ctx.module`` without touching it: then the file is never parsed by libcst at all. One that
    edits a few statements of a long file asks for ``ctx.module_for(their ast nodes)``: libcst then
    parses only the top-level statements holding them (a 50k-line file: ~4 s for the whole).
    """

    def __init__(
        self,
        path: str,
        module: Optional[cst.Module],
        config: Config,
        backend: str,
        code: Optional[str] = None,
        tree: Optional[ast.Module] = None,
        imports: Optional[ImportMap] = None,
        line_maps: Sequence[LineMap] = (),
        partial: Optional[Partial] = None,
    ) -> None:
        if module is None and code is None:
            raise ValueError("FileContext needs a module or its code")
        self.path = path
        self.config = config
        self.backend = backend
        self._pending_imports: List[str] = []
        self._line_maps = line_maps
        #: set by the pipeline: called as (done, total, what) by :meth:`step`
        self.on_step: Optional[Callable[[int, int, str], None]] = None
        #: the partial module ``ctx.module`` is (see :meth:`module_for`), or one carried from the
        #: previous transform; None once ``ctx.module`` is the whole module
        self.partial = partial
        #: set by the pipeline when a transform is redone: :meth:`module_for` gives the whole module
        self.whole = False
        #: set by a transform whose new statements hold generated text (scalebox_cst.emitted):
        #: the pipeline parses them again before a later transform reads them
        self.wrote_text = False
        if module is not None:
            self.__dict__["module"] = module
        if code is not None:
            self.__dict__["code"] = code
        if tree is not None:
            self.__dict__["tree"] = tree
        if imports is not None:
            self.__dict__["imports"] = imports

    @functools.cached_property
    def module(self) -> cst.Module:
        """The libcst tree, parsed on first use (a transform that only reads ``tree`` never pays)."""
        self.partial = None
        return cstparse.parse_module(self.code)

    def module_for(self, nodes: Iterable[ast.AST]) -> cst.Module:
        """``ctx.module`` with only the top-level statements holding ``nodes`` (of ``ctx.tree``)
        parsed, the others fillers of the same lines (transforms/partial.py): positions are the
        file's, edits are spliced into its text. Call it once, before anything reads
        ``ctx.module`` (which then is this module); walk only statements :meth:`parsed` says are
        and take module-level facts from ``ctx.tree``. The whole module where one is at hand
        already, where a node's scope is the module (what is read or bound in it may be anywhere
        in the file), or where the file cannot be split."""
        if "module" in self.__dict__ or self.whole:
            return self.module
        ch = partial_module.chunks(self.code, self.tree)
        if ch is not None:
            groups = set()
            for n in nodes:
                g = ch.group_of(getattr(n, "lineno", 1))
                if not partial_module.in_scope(n, ch.tops[g]):
                    return self.module
                groups.add(g)
            built = partial_module.build(ch, groups, self.partial)
            if built is not None:
                self.partial = built
                self.__dict__["module"] = built.module
                return built.module
        return self.module

    def whole_module(self) -> cst.Module:
        """The whole libcst module, even after :meth:`module_for` (a transform's fallback)."""
        if self.partial is not None:
            self.__dict__.pop("module", None)
        return self.module

    def parsed(self, node: ast.AST) -> bool:
        """Whether the top-level statement holding ``node`` (of ``ctx.tree``) is parsed in
        ``ctx.module`` (always, for the whole module)."""
        return self.partial is None or "module" not in self.__dict__ or self.partial.holds(node)

    @functools.cached_property
    def code(self) -> str:
        return self.module.code

    @functools.cached_property
    def tree(self) -> ast.Module:
        """The ``ast`` of ``code`` (line numbers are the same as libcst's)."""
        return ast.parse(self.code, filename=self.path)

    @functools.cached_property
    def wrapper(self) -> MetadataWrapper:
        # unsafe_skip_copy: nodes of self.module are the keys, so transforms can look them up.
        return MetadataWrapper(self.module, unsafe_skip_copy=True)

    @functools.cached_property
    def positions(self):
        return self.wrapper.resolve(PositionProvider)

    @functools.cached_property
    def imports(self) -> ImportMap:
        return ImportMap(self.tree)

    def resolve(self, provider):
        return self.wrapper.resolve(provider)

    def span(self, node: cst.CSTNode) -> Tuple[int, int]:
        pos = self.positions[node]
        return pos.start.line, pos.end.line

    def site(
        self,
        transform: str,
        node: cst.CSTNode,
        action: str,
        reason: str,
        exactness: Optional[str] = None,
        kind: Optional[str] = None,
    ) -> Site:
        line, end = self.span(node)
        return Site(transform, line, end, action, reason, exactness, kind)

    def original_line(self, line: int) -> int:
        """The user's line number for ``line`` of this (possibly already rewritten) version.

        For line numbers written into code or keys (``site='train.py:64'``, calibration). Site
        spans and the line numbers a reason quotes ("line N", "lines N-M") are mapped back by the
        pipeline: a reason quotes this version's lines (``node.lineno``) as they are.
        """
        for mapping in reversed(self._line_maps):
            line = mapping.get(line, line)
        return line

    def step(self, done: int, total: int, what: str = "sites") -> None:
        """How far a transform working through many sites is (the pipeline may print it: a long
        file's rewrite says it is alive)."""
        if self.on_step is not None:
            self.on_step(done, total, what)

    def option(self, section: str, key: str, default: Any = None) -> Any:
        return self.config.option(section, key, default)

    def runtime_name(self, qualname: str, preferred: str) -> str:
        """Local alias for a runtime helper; the import is added when the transform finishes."""
        from .names import runtime_import

        alias, line = runtime_import(self.imports, qualname, preferred)
        if line is not None:
            self.imports.aliases[alias] = qualname
            self._pending_imports.append(line)
        return alias

    def require_import(self, line: str) -> None:
        """An import statement the rewritten module needs (added once, after the docstring)."""
        self._pending_imports.append(line)

    def finish(self, module: cst.Module) -> cst.Module:
        return add_imports(module, self._pending_imports) if self._pending_imports else module


class Transform(abc.ABC):
    """Base class. Subclasses set ``id``, ``triggers`` and implement :meth:`rewrite`."""

    id: ClassVar[str] = ""
    version: ClassVar[str] = "1"
    #: the transform runs only when one of these substrings occurs in the source (cheap filter)
    triggers: ClassVar[Sequence[str]] = ()
    #: backends this transform applies to (None: all)
    backends: ClassVar[Optional[Sequence[str]]] = None
    description: ClassVar[str] = ""
    EXAMPLES: ClassVar[Sequence[Example]] = ()
    #: the ``[section]`` an example's ``options`` are set in ("": the transform's id)
    options_section: ClassVar[str] = ""

    def applies(self, ctx: FileContext) -> bool:
        if self.backends is not None and ctx.backend not in self.backends:
            return False
        return not self.triggers or any(t in ctx.code for t in self.triggers)

    @abc.abstractmethod
    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        """Return the new module (``ctx.module`` or None if nothing changed) and the sites."""
