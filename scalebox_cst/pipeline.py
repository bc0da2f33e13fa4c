"""source bytes → parse (ast) → enabled transforms in fixed order → new bytes + sites.

libcst parses a version at most once, and only where a transform edits: of a long file, only the
top-level statements it asks for (FileContext.module_for, transforms/partial.py); the others are
fillers, written back as the file's text by the codegen (``seed``).

The pipeline is pure: no files, no store. Bytes are read as Python reads them (BOM, PEP 263
coding comment: ``sourcefile``) and written back in the same encoding. It never loses input:
bytes that cannot be decoded or do not parse, and any transform that raises, leave the file
exactly as it was, with a one-line ``path:line: message`` error in its report.

The transforms see the file's text in the shape libcst handles best (``textshape``): without
form feeds in indentation, with a final newline; the output gets the user's shape back.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import gc
import io
import re
import threading
import time
import tokenize
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple, Union

import libcst as cst

from scalebox_cst import astsplice, emitted, fastcode, linediff, sourcefile, textshape
from scalebox_cst.config import Config
from scalebox_cst.oneline import error_line
from scalebox_cst.report import FileReport, Site
from scalebox_cst.runtime import threads
from scalebox_cst.textlines import line_starts, physical_lines
from scalebox_cst.transforms import FileContext, Transform, all_transforms, transform_ids
from scalebox_cst.transforms import contracts, rewrite_caches, statement_memo
from scalebox_cst.transforms import partial as partial_module
from scalebox_cst.transforms.analysis import foreign



#: seconds after which a file's rewrite reports progress (Pipeline.progress)
PROGRESS_AFTER = 1.5
#: at most one progress line this often (seconds) from inside one transform (FileContext.step)
PROGRESS_EVERY = 5.0
#: files of at least this many lines collect garbage after each transform (see _rewrite)
COLLECT_LINES = 3000


@dataclasses.dataclass
class FileResult:
    path: str
    source: bytes
    output: bytes
    report: FileReport
    #: the input itself is bad (not UTF-8, does not parse): a watcher makes no branch for it
    bad_input: bool = False

    @property
    def changed(self) -> bool:
        return self.output != self.source


class Pipeline:
    """The enabled transforms for one config and backend, with the fingerprint that names them."""

    def __init__(
        self,
        config: Config,
        backend: str = "cpu",
        transforms: Optional[Sequence[Transform]] = None,
    ) -> None:
        self.config = config
        self.backend = backend
        if transforms is None:
            config.check_transforms(transform_ids())  # a typo in an id would select nothing
        candidates = list(transforms) if transforms is not None else all_transforms()
        self.transforms = [t for t in candidates if config.transform_enabled(t.id)]
        self.fingerprint = config.fingerprint({t.id: t.version for t in self.transforms}, backend)
        #: called with one line (``path: N lines, transform X done after 2.1 s``) after each
        #: transform once a file's rewrite has run for PROGRESS_AFTER seconds; None: silent
        self.progress: Optional[Callable[[str], None]] = None

    def rewrite(self, path: str, data: bytes) -> FileResult:
        # libcst allocates hundreds of thousands of small objects per file; collecting them
        # mid-rewrite costs 4-8 ms on a 300-line file and frees nothing (they are all live).
        enabled = gc.isenabled()
        gc.disable()
        beat = None
        try:  # from here on: an interrupt (even while the progress thread starts) enables gc again
            beat = _Heartbeat(self.progress, path) if self.progress is not None else None
            with statement_memo.active(statement_memo.StatementMemo()):
                return self._rewrite(path, data, beat)
        except Exception as exc:  # noqa: BLE001 - one file's failure never stops the others
            return _error(path, data, f"{path}:1: the rewrite failed ({_why(exc, data)}); file left unchanged")
        finally:
            if beat is not None:
                beat.stop()
            rewrite_caches.empty()  # they hold this file's trees (a watcher keeps running)
            if _FROZEN.__dict__.pop("frozen", False):
                gc.unfreeze()
            if enabled:
                gc.enable()

    def _rewrite(self, path: str, data: bytes, beat: Optional["_Heartbeat"] = None) -> FileResult:
        try:
            decoded = sourcefile.decode(data)
        except sourcefile.SourceError as exc:
            return _error(path, data, f"{path}:{exc.line}: {exc}; left unchanged", bad_input=True)
        text = decoded.text
        if "\0" in text:  # Python refuses these anywhere; its own message names no line
            line = len(physical_lines(text[: text.index("\0") + 1]))
            return _error(path, data, f"{path}:{line}: SyntaxError: source code cannot contain null bytes", bad_input=True)
        shaped = textshape.Shaped(text)
        try:
            tree = _parse(shaped, path)
        except SyntaxError as exc:
            msg = f"{path}:{exc.lineno or 1}: {type(exc).__name__}: {exc.msg}"
            return _error(path, data, msg, bad_input=True)
        except ValueError as exc:
            return _error(path, data, f"{path}:1: {exc}", bad_input=True)
        except (RecursionError, MemoryError) as exc:
            # A 10,000-term sum, thousands of chained calls or elifs: CPython cannot compile
            # these either (the same error at import), so this is bad input, like a syntax error.
            why = "nested too deeply" if isinstance(exc, RecursionError) else "too large"
            msg = f"{path}:{_deep_statement_line(text)}: {why} for Python to compile ({type(exc).__name__}); left unchanged"
            return _error(path, data, msg, bad_input=True)
        if text.count("\n") + 1 >= COLLECT_LINES:
            _freeze()  # the tree of the input: live until the file is done
        sites: List[Site] = []
        line_maps: List[linediff.LineMap] = []  # for each version after the first: new line -> old line
        code = shaped.code
        # The libcst tree is parsed at most once per version, and only when a transform edits:
        # most transforms decide on the ast that nothing applies.
        module: Optional[cst.Module] = None
        imports = None  # shared by the transforms that see the same module version
        moved = astsplice.Memo()  # what each version's splice keeps for the next
        codegen = _Codegen(moved.starts)
        memo = statement_memo.per_file()
        memo.register(tree, code)
        carried: Optional[partial_module.Partial] = None  # the version's module, where it is partial
        started = time.perf_counter() if beat is None else beat.started
        lines = text.count("\n") + 1
        shown = [started] if beat is None else beat.shown  # when the last progress line was printed
        if beat is not None:
            beat.lines = lines
        for number, transform in enumerate(self.transforms, 1):
            if beat is not None:
                beat.phase = f"{transform.id} running"
            if self.progress is not None and number > 1:
                elapsed = time.perf_counter() - started
                if elapsed >= PROGRESS_AFTER:
                    done = self.transforms[number - 2].id
                    self.progress(f"scalebox: {path}: {lines} lines, {done} done after {elapsed:.1f}s ({number - 1}/{len(self.transforms)} transforms)")
            make = functools.partial(
                FileContext, path, config=self.config, backend=self.backend, code=code, tree=tree, imports=imports,
                line_maps=tuple(line_maps),
            )
            ctx = make(None, partial=carried) if carried is not None else make(module)
            if self.progress is not None:
                ctx.on_step = _stepper(self.progress, f"scalebox: {path}: {lines} lines, {transform.id}", started, shown)
            if not transform.applies(ctx):
                continue
            try:
                new_module, found = transform.rewrite(ctx)
                module, part = ctx.__dict__.get("module", module), ctx.partial
                new_module = ctx.finish(new_module) if new_module is not None else None
                seed = part.texts if part is not None else None
                known = {**part.sources, **part.texts} if part is not None else None  # (partial.Partial.sources)
                new_code = code if new_module is None or new_module is module else codegen.code(new_module, module, code, tree, known)
                if seed is not None and module is not None and new_module is not None and partial_module.lost(module, new_module, new_code, seed):
                    # the transform changed, moved or dropped a filler: redone on the whole module
                    ctx, on_step = make(None, imports=None), ctx.on_step
                    ctx.whole, ctx.on_step = True, on_step
                    new_module, found = transform.rewrite(ctx)
                    module, part = ctx.__dict__.get("module"), None
                    new_module = ctx.finish(new_module) if new_module is not None else None
                    new_code = code if new_module is None or new_module is module else codegen.code(new_module)
                if new_code != code and (kept := foreign.withdrawn(found, tree, code)) is not None:
                    new_module, new_code, found = None, code, kept  # a site in a body Python does not run
                    ctx.__dict__["imports"] = None  # it holds the withdrawn edits' names: made anew
                # the next transform's partial module keeps this one's statements (parsed or fillers);
                # those holding generated text (scalebox_cst.emitted) become trees where it wants them
                stale = _stale(ctx, module, new_module)
                carried = part if part is None or new_module is None else dataclasses.replace(part, module=new_module, stale=stale)
                if new_code != code:
                    if lines >= COLLECT_LINES:
                        ctx.__dict__.clear()  # this version's module is held by new_module
                        gc.collect(0)  # this transform's garbage, before the new tree exists
                    plan = codegen.plan if new_module is not None else None  # (spliced: astsplice)
                    new_tree = (plan and astsplice.parse(new_code, code, tree, plan, path, moved)) or ast.parse(new_code, filename=path)
                    if lines >= COLLECT_LINES:
                        _freeze()  # the new tree is live: later collections need not walk it
            except cst.ParserSyntaxError as exc:
                msg = f"{path}:{exc.raw_line}: libcst cannot parse this file: {exc.message}"
                return _error(path, data, msg, bad_input=True)
            except SyntaxError as exc:
                msg = f"{path}:{exc.lineno or 1}: transform {transform.id} produced invalid code ({exc.msg}); file left unchanged"
                return _error(path, data, msg)
            except Exception as exc:  # a transform bug must never break the user's run
                msg = f"{path}:1: transform {transform.id} failed ({_why(exc, text)}); file left unchanged"
                return _error(path, data, msg)
            sites.extend(_map_back(_with_details(_map_quoted(site, line_maps)), line_maps) for site in found)
            if new_code != code:
                spliced = codegen.copied and linediff.spliced_line_map(code, new_code, codegen.copied, moved.starts)
                line_maps.append(spliced or linediff.line_map(code, new_code))
                if stale and carried is None and new_module is not None:  # a whole module: the next one reads trees
                    new_module = emitted.realized_module(new_module, stale)
                module, code, tree, imports = new_module, new_code, new_tree, None
                memo.register(tree, code)
            else:  # unchanged: its import table is the next one's, unless it holds helpers never imported
                imports = None if ctx._pending_imports else ctx.__dict__.get("imports", imports)
            if lines >= COLLECT_LINES and new_code == code:
                # Visitor classes defined inside functions are reference cycles that hold their
                # closures (nodes, trees, whole modules of earlier versions); with gc off they
                # pile up until the file is done. One collection per transform bounds the peak
                # to about one version (10k lines, 505 sites: 345 MB -> see bench_scaling).
                ctx.__dict__.clear()
                gc.collect(0)  # only what this transform made (the rest was collected before)

        out_text = shaped.restore(code)
        try:
            output = data if out_text == text else sourcefile.encode(out_text, decoded)
        except sourcefile.SourceError as exc:
            return _error(path, data, f"{path}:{exc.line}: {exc}; file left unchanged")
        sites.sort(key=lambda s: (s.line, s.end_line, s.transform))
        status = "rewritten" if output != data else "unchanged"
        return FileResult(path, data, output, FileReport(path, status, None, sites))


def _parse(shaped: textshape.Shaped, path: str) -> ast.Module:
    """The ``ast`` of the code the transforms see (the same lines as the file's); where it does not
    parse, the error of the user's own text, as Python gives it."""
    try:
        return ast.parse(shaped.code, filename=path)
    except SyntaxError:
        if shaped.code != shaped.text:
            ast.parse(shaped.text, filename=path)
        raise


def _stale(ctx: FileContext, old: Optional[cst.Module], new: Optional[cst.Module]) -> FrozenSet[int]:
    """Ids of ``new``'s top-level statements that may hold generated text: those the transform
    changed, where it says it wrote some (``FileContext.wrote_text``)."""
    if not ctx.wrote_text or new is None:
        return frozenset()
    before = {id(n) for n in old.body} if old is not None else set()
    return frozenset(id(n) for n in new.body if id(n) not in before)


def _stepper(progress: Callable[[str], None], head: str, started: float, shown: List[float]) -> Callable[[int, int, str], None]:
    """``FileContext.on_step`` for one transform: a line once the file took PROGRESS_AFTER s,
    then at most one per PROGRESS_EVERY s (a transform with thousands of sites is minutes)."""

    def on_step(done: int, total: int, what: str) -> None:
        now = time.perf_counter()
        if now - started >= PROGRESS_AFTER and now - shown[0] >= PROGRESS_EVERY:
            shown[0] = now
            progress(f"{head}: {done}/{total} {what} after {now - started:.1f}s")

    return on_step


class _Heartbeat:
    """A progress line every PROGRESS_EVERY s, from a timer thread, while no other line said how
    far the rewrite is: between one transform's step lines there can be tens of seconds of set-up
    or code generation (one function of 2,500 backward loops: 9 s before the first loop, 18 s
    after the last). Started only where ``Pipeline.progress`` is set."""

    def __init__(self, progress: Callable[[str], None], path: str) -> None:
        self.progress, self.path = progress, path
        self.started = time.perf_counter()
        self.shown = [self.started]  # shared with the step lines (_stepper): one rate limit
        self.phase = "parsing"
        self.lines = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = threading.Thread(target=self._run, name="scalebox-progress", daemon=True)
        try:  # signals blocked in it: they go to the thread doing the rewrite (runtime.threads)
            threads.start(self._thread)
        except Exception:  # no thread to be had: the rewrite goes on without progress lines
            self._stop.set()
            self._thread = None
        except BaseException:  # an interrupt while it starts: it must not print on for good
            self._stop.set()
            raise

    def _run(self) -> None:
        while not self._stop.wait(max(0.05, min(PROGRESS_EVERY, 0.5))):
            now = time.perf_counter()
            if now - self.started >= PROGRESS_AFTER and now - self.shown[0] >= PROGRESS_EVERY:
                self.shown[0] = now
                lines = f"{self.lines} lines, " if self.lines else ""
                self.progress(f"scalebox: {self.path}: {lines}{self.phase} after {now - self.started:.1f}s")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


class _Codegen:
    """``module.code``, reusing the code of top-level statements already generated.

    Each transform that edits costs a full codegen (18 ms for 900 lines), though most edits touch
    one function: the other top-level statements are the very same (immutable) nodes as in the
    previous version. At the top level a node's code does not depend on its neighbours (the
    indentation is empty), so the module's code is the concatenation of its header lines,
    statements and footer lines, each generated once. Modules without a trailing newline (libcst
    then drops the last token) or with nothing in them take ``module.code``.
    """

    def __init__(self, starts: Callable[[str], List[int]] = line_starts) -> None:
        self._starts = starts  # textlines.line_starts, perhaps kept (astsplice.Memo.starts)
        self._style: Tuple[str, str] = ("", "")
        self._done: Dict[int, Tuple[cst.CSTNode, str]] = {}  # id(node) -> (node, its code)

    def code(
        self,
        module: cst.Module,
        previous: Optional[cst.Module] = None,
        previous_code: Optional[str] = None,
        previous_tree: Optional[ast.Module] = None,
        seed: Optional[Dict[int, Tuple[cst.CSTNode, str]]] = None,
    ) -> str:
        """``module.code``; given the version it was made from (with its code and ast), by
        splicing: only the statements that changed are generated (see ``_splice``). ``seed``:
        the text to write for some nodes (a partial module's fillers: transforms/partial.py)."""
        self.plan: Optional[astsplice.Plan] = None  # what the splice kept and made (astsplice)
        self.copied: List[Tuple[int, int, int]] = []  # (old start, old end, new start) of each stretch it copied
        style = (module.default_indent, module.default_newline)
        if seed:
            if style != self._style:
                self._style, self._done = style, {}
            self._done.update(seed)
        if previous is not None and previous_code is not None and previous_tree is not None:
            if style != self._style:
                self._style, self._done = style, {}
            spliced = self._splice(module, previous, previous_code, previous_tree)
            if spliced is not None:
                # keep the texts the next version can reuse: this one's statements
                done = self._done
                self._done = {id(n): done[id(n)] for n in module.body if id(n) in done and done[id(n)][0] is n}
                return spliced
        return self._concatenate(module)

    def _text(self, module: cst.Module, node: cst.CSTNode) -> str:
        hit = self._done.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        text = fastcode.code_for_node(module, node)
        self._done[id(node)] = (node, text)
        return text

    def _splice(self, module: cst.Module, old: cst.Module, old_code: str, old_tree: ast.Module) -> Optional[str]:
        """``module.code`` as ``old_code`` with the text of replaced statements swapped, or None
        where that cannot be shown to be right (then the caller concatenates).

        The first version's statements were never generated (the file was parsed): concatenating
        costs a codegen of the whole file, splicing one of the edited statements. A top-level
        statement's text starts its ``leading_lines`` (one physical line each) above the first
        line ``ast`` gives it (decorators included); each replaced stretch is checked to be
        exactly the old statements' code at that offset before it is swapped.
        """
        same = lambda a, b: len(a) == len(b) and all(x is y for x, y in zip(a, b))  # noqa: E731
        config = lambda m: (m.default_indent, m.default_newline, m.has_trailing_newline, m.encoding)  # noqa: E731
        if not old.body or not module.body or not module.has_trailing_newline or config(module) != config(old):
            return None
        if not same(module.header, old.header) or not same(module.footer, old.footer):
            return None
        firsts = sorted({min([s.lineno, *(d.lineno for d in getattr(s, "decorator_list", ()))]) for s in old_tree.body})
        if len(firsts) != len(old.body):
            return None
        where = {id(n): i for i, n in enumerate(old.body)}
        kept: List[Tuple[int, int]] = []  # (old index, new index) of statements both versions share
        for j, node in enumerate(module.body):
            i = where.get(id(node))
            if i is not None and old.body[i] is node:
                if kept and i <= kept[-1][0]:
                    return None
                kept.append((i, j))
        starts = self._starts(old_code)  # (the splice of the version before kept them)

        def offset(i: int) -> Optional[int]:
            line = firsts[i] - len(old.body[i].leading_lines)
            return starts[line - 1] if 1 <= line < len(starts) else None

        pieces: List[str] = []
        done = 0  # old_code is copied up to here
        plan, copied, at = astsplice.Plan(), [], 0  # copied: (old start, old end, new start) of each copy
        bounds = [(-1, -1), *kept, (len(old.body), len(module.body))]
        for (i0, j0), (i1, j1) in zip(bounds, bounds[1:]):
            if i1 - i0 == 1 and j1 - j0 == 1:
                continue  # nothing between two kept statements
            if i1 - i0 > 1:  # old statements i0+1 .. i1-1 replaced
                begin = offset(i0 + 1)
                old_text = "".join(self._text(old, old.body[i]) for i in range(i0 + 1, i1))
                if begin is None or begin < done or old_code[begin : begin + len(old_text)] != old_text:
                    return None
                end = begin + len(old_text)
            elif i1 < len(old.body):  # a pure insertion, before old statement i1
                begin = offset(i1)
                if begin is None or begin < done or not old_code.startswith(self._text(old, old.body[i1]), begin):
                    return None
                end = begin
            else:  # a pure insertion after the last statement: before the footer
                footer = "".join(old.code_for_node(n) for n in old.footer)
                begin = end = len(old_code) - len(footer)
                if begin < done or not old_code.endswith(footer):
                    return None
            made = "".join(self._text(module, module.body[j]) for j in range(j0 + 1, j1))
            copied.append((done, begin, at))
            at += begin - done
            if made:
                plan.made.append((j0 + 1, at, made))
            pieces += [old_code[done:begin], made]
            at, done = at + len(made), end
        pieces.append(old_code[done:])
        copied.append((done, len(old_code), at))
        self.copied = copied
        self.plan = astsplice.with_kept(plan, kept, copied, offset) if len(old_tree.body) == len(old.body) else None  # one ast each
        return "".join(pieces)

    def _concatenate(self, module: cst.Module) -> str:
        parts = (*module.header, *module.body, *module.footer)
        if not module.has_trailing_newline or not parts:
            return module.code
        style = (module.default_indent, module.default_newline)
        done = self._done if style == self._style else {}
        now: Dict[int, Tuple[cst.CSTNode, str]] = {}
        texts: List[str] = []
        for node in parts:
            hit = done.get(id(node))
            text = hit[1] if hit is not None and hit[0] is node else fastcode.code_for_node(module, node)
            now[id(node)] = (node, text)  # keeps the node alive, so its id is not reused
            texts.append(text)
        self._style, self._done = style, now
        return "".join(texts)


_FROZEN = threading.local()


def _freeze() -> None:
    """Move every object alive now out of the collector's reach until the rewrite ends (then
    ``gc.unfreeze``): each ``gc.collect(0)`` between transforms walked the ``ast`` of the new
    version (400k objects per 20k lines), though it is live until the next version. Called just
    after a collection (or on the input's tree), so little garbage is held back."""
    _FROZEN.frozen = True
    gc.freeze()


def _why(exc: BaseException, source: Union[str, bytes]) -> str:
    """A failed rewrite's cause for its one line: ``MemoryError`` carries no message (the line
    read ``failed (MemoryError: )``), so it says what ran out, on how large a file."""
    if isinstance(exc, MemoryError):  # counting copies nothing
        lines = source.count(b"\n" if isinstance(source, bytes) else "\n") + 1  # type: ignore[arg-type]
        return f"out of memory on a file of {lines} lines"
    return error_line(exc)


def _deep_statement_line(text: str) -> int:
    """The first line of the top-level statement Python cannot compile for its nesting (each
    top-level statement parsed alone; the tokenizer does not recurse), else 1."""
    starts: List[int] = []
    depth, fresh = 0, True
    continuing = ("elif", "else", "except", "finally")
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.INDENT:
                depth += 1
            elif tok.type == tokenize.DEDENT:
                depth -= 1
            elif tok.type == tokenize.NEWLINE:
                fresh = True
            elif tok.type not in (tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER) and fresh:
                fresh = False
                if depth == 0 and not (tok.type == tokenize.NAME and tok.string in continuing):
                    starts.append(tok.start[0])
    except (tokenize.TokenError, SyntaxError):
        pass
    lines = physical_lines(text)
    for first, nxt in zip(starts, [*starts[1:], len(lines) + 1]):
        try:
            ast.parse("".join(lines[first - 1 : nxt - 1]))
        except (RecursionError, MemoryError):
            return first
        except (SyntaxError, ValueError):
            continue
    return 1


def _error(path: str, data: bytes, message: str, bad_input: bool = False) -> FileResult:
    return FileResult(path, data, data, FileReport(path, "error", message, []), bad_input=bad_input)


def _with_details(site: Site) -> Site:
    """The site with a reason of one breath and, as its details, the contracts it names
    (transforms/contracts.py) and whatever did not fit the reason."""
    reason, details = contracts.site_details(site.reason, site.details)
    if (reason, details) == (site.reason, site.details):
        return site
    return dataclasses.replace(site, reason=reason, details=details)


#: a line number quoted in a reason: "line 63", "lines 51-53"
_QUOTED_LINE = re.compile(r"\b(lines?) (\d+)(?:-(\d+))?\b")


def _map_quoted(site: Site, line_maps: List[linediff.LineMap]) -> Site:
    """The site with the line numbers its reason quotes mapped back to the user's file.

    A transform sees the version the transforms before it made and quotes that version's lines
    (``node.lineno``); where those inserted lines, the numbers would name the wrong line of the
    user's file. Mapping them here, like the site's own span, holds for every transform."""
    if not line_maps or "line" not in site.reason:
        return site

    def sub(m: "re.Match[str]") -> str:
        end = f"-{_user_line(int(m.group(3)), line_maps)}" if m.group(3) else ""
        return f"{m.group(1)} {_user_line(int(m.group(2)), line_maps)}{end}"

    # code quoted between backticks (`print("line 3")`) is the user's text: left as it is
    parts = site.reason.split("`")
    reason = "`".join(_QUOTED_LINE.sub(sub, part) if i % 2 == 0 else part for i, part in enumerate(parts))
    return site if reason == site.reason else dataclasses.replace(site, reason=reason)


def _user_line(line: int, line_maps: List[linediff.LineMap]) -> int:
    """A line of the last version, as the line of the user's file it came from."""
    for mapping in reversed(line_maps):
        line = mapping.get(line, line)
    return line


def _map_back(site: Site, line_maps: List[linediff.LineMap]) -> Site:
    line, end = _user_line(site.line, line_maps), _user_line(site.end_line, line_maps)
    if (line, end) == (site.line, site.end_line):
        return site
    return dataclasses.replace(site, line=line, end_line=max(line, end))
