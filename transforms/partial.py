"""A libcst module in which only the top-level statements a transform edits are parsed.

libcst parses about 13,000 lines a second: a 50k-line file costs ~4 s before any transform
looks at it, though a transform that found its candidates on ``ast`` (parsed once for the whole
file, shared) edits a handful of statements. Each top-level statement's source is a module of its
own: its *chunk* runs from the line after the previous statement's last line to its own last line
(the first from line 1, the last to the end of the file). :func:`build` parses the chunks asked
for and puts a *filler* in place of every other statement: a bare triple-quoted string whose text
has exactly the chunk's lines, so every position libcst reports (PositionProvider, site lines) is
the line in the whole file, and ``module.body`` has one entry per statement, in order (insertions
at the top or before a statement land where they would in the whole module). The pipeline's
codegen writes each filler as its chunk's own text (:attr:`Partial.texts`), so the module's code
is the file's; a filler that a transform changed or copied shows its mark in the output and the
pipeline redoes that transform on the whole module.

Module-level facts (imports, bindings) come from the whole file's ``ast``, never from this module:
a transform that reads them from libcst must keep asking for ``ctx.module``. Only files that
libcst would parse with the defaults are split (four-space first indent, ``\\n`` newlines, a
trailing newline), so each chunk's nodes carry the same indent and newline fields as in a whole
parse; any chunk that does not parse to exactly one statement makes :func:`build` give up (None).
"""
from __future__ import annotations

import ast
import bisect
import dataclasses
import io
import tokenize
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple, Union, cast

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, MetadataWrapper, PositionProvider

from scalebox_cst import emitted
from scalebox_cst.textlines import physical_lines

from . import rewrite_caches
from .analysis import cstpieces
from .analysis.bodies import _BLOCK_FIELDS
from scalebox_cst.digits import ascii_digits

#: the start of every filler's string: a file that spells it anywhere is never split
MARK = "scalebox:elided:"
#: the indent and newline a chunk must be parsed with (libcst's defaults; see module docstring)
INDENT, NEWLINE = "    ", "\n"
#: chunks parsed by :func:`build` since the process started (the tests count parses, not time)
PARSED = [0]


@dataclasses.dataclass
class Chunks:
    """The top-level statements of one module version, grouped as libcst sees them (``a; b`` on
    one line is one statement), with each group's chunk of lines."""

    code: str
    lines: List[str]
    offsets: List[int]  # offsets[i]: where line i+1 starts in code (offsets[-1] == len(code))
    firsts: List[int]  # first line of each group's first statement (decorators included)
    starts: List[int]  # first line of each chunk
    ends: List[int]  # last line of each chunk
    tops: List[List[ast.stmt]]  # each group's ast statements
    imports: List[int]  # the groups that are top-level imports only
    indent: Optional[str] = None  # libcst's default indent for the whole file (first_indent)

    def text(self, g: int) -> str:
        return self.code[self.offsets[self.starts[g] - 1] : self.offsets[self.ends[g]]]

    def group_of(self, line: int) -> int:
        """The group holding ``line`` (a line inside some top-level statement)."""
        return max(0, bisect.bisect_right(self.firsts, line) - 1)


def chunks(code: str, tree: ast.Module) -> Optional[Chunks]:
    """The chunks of ``code`` (whose ast is ``tree``), or None where the file is not split
    (the last version's are kept: every transform that sees it asks)."""
    last = _LAST[0]
    if last is not None and last[0] is code and last[1] is tree:
        return last[2]
    found = _chunks(code, tree)
    _LAST[0] = (code, tree, found)
    return found


#: (code, tree, their chunks) of the last version asked about
_LAST: List[Optional[Tuple[str, ast.Module, Optional[Chunks]]]] = rewrite_caches.held(None)


def _chunks(code: str, tree: ast.Module) -> Optional[Chunks]:
    if not tree.body or MARK in code or "\r" in code or not code.endswith("\n") or code.endswith("\\\n"):
        return None
    lines = physical_lines(code)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    firsts: List[int] = []
    ends: List[int] = []
    tops: List[List[ast.stmt]] = []
    for st in tree.body:
        first = min([st.lineno, *(d.lineno for d in getattr(st, "decorator_list", ()))])
        end = st.end_lineno or st.lineno
        if ends and first <= ends[-1]:  # a; b on one line, or b starting where a ends
            ends[-1] = max(ends[-1], end)
            tops[-1].append(st)
            continue
        firsts.append(first)
        ends.append(end)
        tops.append([st])
    for g in range(len(ends) - 1):
        # libcst gives an indented block the comment lines after it up to the last one indented
        # (at least) to the block: they end its chunk (build checks that they do not end up in
        # the chunk's module footer, which would mean the whole parse puts them elsewhere)
        for number in range(firsts[g + 1] - 1, ends[g], -1):
            line = lines[number - 1]
            if line[:1] in (" ", "\t") and line.lstrip(" \t").startswith("#"):
                ends[g] = number
                break
    ends[-1] = len(lines)
    starts = [1, *(e + 1 for e in ends[:-1])]
    if any(s > f for s, f in zip(starts, firsts)):  # pragma: no cover - ast's lines are monotonic
        return None
    imports = [g for g, group in enumerate(tops) if all(isinstance(st, (ast.Import, ast.ImportFrom)) for st in group)]
    return Chunks(code, lines, offsets, firsts, starts, ends, tops, imports)


def first_indent(code: str) -> str:
    """The whitespace of the first INDENT token (libcst's default indent), else the default."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.INDENT:
                return tok.string
    except (tokenize.TokenError, SyntaxError):
        return ""
    return INDENT


def filler(lines: int, count: int, width: int) -> cst.SimpleStatementLine:
    """A statement of ``lines`` lines standing for a chunk of ``width`` top-level ast statements,
    ``count`` statements in all (a pre-order walk of statement lists)."""
    text = '"""' + MARK + f"{count}:{width}" + "\n" * (lines - 1) + '"""'
    return cst.SimpleStatementLine(body=[cst.Expr(cst.SimpleString(text))])


def _filler_numbers(node: cst.CSTNode) -> Optional[Tuple[int, int]]:
    if not isinstance(node, cst.SimpleStatementLine) or len(node.body) != 1:
        return None
    expr = node.body[0]
    if not isinstance(expr, cst.Expr) or not isinstance(expr.value, cst.SimpleString):
        return None
    value = expr.value.value
    if not value.startswith('"""' + MARK):
        return None
    count, _, width = value[3 + len(MARK) :].split("\n", 1)[0].rstrip('"').partition(":")
    return (int(count), int(width)) if ascii_digits(count) and ascii_digits(width) else None


def elided_count(node: cst.CSTNode) -> Optional[int]:
    """How many statements (pre-order) the filler ``node`` stands for; None: no filler."""
    numbers = _filler_numbers(node)
    return numbers[0] if numbers is not None else None


def elided_width(node: cst.CSTNode) -> Optional[int]:
    """How many top-level ast statements the filler ``node`` stands for; None: no filler."""
    numbers = _filler_numbers(node)
    return numbers[1] if numbers is not None else None


#: what a module's body holds
_Statement = Union[cst.SimpleStatementLine, cst.BaseCompoundStatement]

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def in_scope(node: ast.AST, tops: Sequence[ast.stmt]) -> bool:
    """Whether ``node`` lies in the body of a function or class inside ``tops`` (its top-level
    statements): what a transform finds out about its names there (read elsewhere, declared
    global) is then found in that statement. A node whose scope is the module is not."""
    first: int = getattr(node, "lineno", 0)
    last: int = getattr(node, "end_lineno", None) or first
    stack: List[ast.stmt] = list(tops)
    while stack:
        st = stack.pop()
        if isinstance(st, _SCOPES) and st is not node and st.body and st.body[0].lineno <= first and last <= (st.end_lineno or 0):
            return True
        for field in ("body", "orelse", "finalbody"):
            block = getattr(st, field, None)
            if isinstance(block, list):
                stack.extend(b for b in block if b.lineno <= first and last <= (b.end_lineno or b.lineno))
        for h in (*getattr(st, "handlers", ()), *getattr(st, "cases", ())):
            stack.extend(b for b in h.body if b.lineno <= first and last <= (b.end_lineno or b.lineno))
    return False


@dataclasses.dataclass
class Partial:
    """A module version's libcst tree with some statements parsed and fillers for the rest."""

    module: cst.Module
    chunks: Chunks
    real: Set[int]  # the groups parsed
    #: id(filler) -> (filler, its chunk's text): the codegen writes these for the fillers
    texts: Dict[int, Tuple[cst.CSTNode, str]]
    #: id(parsed statement) -> (statement, its code): the chunk it was parsed from, where that is
    #: all of the chunk's module but the statement (libcst's round trip: ``parse_module(t).code
    #: == t``, and a module's code is its header's, statements' and footer's in turn). The
    #: pipeline's codegen takes them as already generated: checking where an edited statement
    #: stood generated the old statement's code only to find the chunk's text again.
    sources: Dict[int, Tuple[cst.CSTNode, str]] = dataclasses.field(default_factory=dict)
    #: ids of statements holding generated text (scalebox_cst.emitted), which no transform may
    #: read: the next version realizes them where it wants them (emitted.realized), else fills them
    stale: FrozenSet[int] = frozenset()

    def covers(self, groups: Iterable[int]) -> bool:
        return all(g in self.real for g in groups)

    def holds(self, node: ast.AST) -> bool:
        """Whether the top-level statement holding ``node`` (of this version's ast) is parsed."""
        return self.chunks.group_of(getattr(node, "lineno", 1)) in self.real


def build(ch: Chunks, groups: Iterable[int], carried: Optional[Partial] = None) -> Optional[Partial]:
    """The module of ``ch.code`` with ``groups`` (and the first statement, and imports) parsed, fillers
    elsewhere; None where the file cannot be split. ``carried``: a partial module of this version
    or of the one before an edit: its statements are kept where each filler's text is still its
    chunk's (parsed statements are kept as they are)."""
    if ch.indent is None:
        ch.indent = first_indent(ch.code)
    if ch.indent != INDENT:
        return None
    # the first statement (the module's header lines) and every import: FileContext.finish adds
    # an import only where the module's top-level imports do not spell it already
    wanted = {0, *groups, *ch.imports}
    body: List[_Statement] = []
    texts: Dict[int, Tuple[cst.CSTNode, str]] = {}
    sources: Dict[int, Tuple[cst.CSTNode, str]] = {}
    real: Set[int] = set()
    old = _reusable(carried, ch)
    stale = carried.stale if carried is not None else frozenset()
    header: Sequence[cst.EmptyLine] = ()
    footer: Sequence[cst.EmptyLine] = ()
    last = len(ch.tops) - 1
    for g in range(len(ch.tops)):
        node: Optional[_Statement] = None
        parsed = False
        if old is not None:
            kept, parsed = old[g]
            if id(kept) in stale:  # generated text in it: its tree if wanted, else a filler
                parsed = g in wanted
                if parsed:
                    node = cast(_Statement, emitted.realized(kept))
            elif parsed or g not in wanted:
                node = kept
        if node is None and g in wanted:
            PARSED[0] += 1
            piece = cstpieces.parse_chunk(ch.text(g), ch.starts[g], ch.tops[g])
            if len(piece.body) != 1 or piece.default_indent != INDENT or piece.default_newline != NEWLINE:
                return None
            node, parsed = piece.body[0], True
            if g == 0:
                header = piece.header
            elif piece.header:  # comment lines above it: in a whole parse, its leading lines
                node = node.with_changes(leading_lines=[*piece.header, *node.leading_lines])
            if g == last:
                footer = piece.footer
            elif piece.footer:  # pragma: no cover - a chunk ends at its statement's last line
                return None
            if piece.has_trailing_newline and (g != 0 or not piece.header) and (g != last or not piece.footer):
                sources[id(node)] = (node, ch.text(g))  # the chunk's module is the statement alone
        elif parsed and carried is not None and id(node) in carried.sources:
            sources[id(node)] = carried.sources[id(node)]
        elif node is None:
            node = filler(ch.ends[g] - ch.starts[g] + 1, _count(ch.tops[g]), len(ch.tops[g]))
        assert node is not None
        if parsed:
            real.add(g)
        else:
            texts[id(node)] = (node, ch.text(g))
        body.append(node)
    if old is not None and carried is not None:
        header, footer = carried.module.header, carried.module.footer
    module = cst.Module(body=body, header=header, footer=footer)
    return Partial(module, ch, real, texts, sources)


def _count(stmts: Sequence[ast.stmt]) -> int:
    """How many statements analysis.statements.ast_statements lists under ``stmts`` (it imports
    this module: the same walk, counted)."""
    count = 0
    for st in stmts:
        count += 1
        for field in _BLOCK_FIELDS:
            block = getattr(st, field, None)
            if not block:
                continue
            if field in ("handlers", "cases"):
                for h in block:
                    count += _count(h.body)
            else:
                count += _count(block)
    return count


def lost(old: cst.Module, new: cst.Module, new_code: str, texts: Dict[int, Tuple[cst.CSTNode, str]]) -> bool:
    """Whether an edit of the partial module ``old`` into ``new`` (whose code, fillers written as
    ``texts``, is ``new_code``) changed, moved or dropped a filler: each must still be a
    top-level statement of ``new``, and no filler's string be written as code."""
    present = {id(n) for n in new.body}
    return MARK in new_code or any(id(n) not in present for n in old.body if id(n) in texts)


def _reusable(carried: Optional[Partial], ch: Chunks) -> Optional[List[Tuple[_Statement, bool]]]:
    """The carried module's statements, each with whether it is parsed, where they line up with
    this version's chunks (each filler's text is still its chunk's); else None."""
    if carried is None or len(carried.module.body) != len(ch.tops):
        return None
    out: List[Tuple[_Statement, bool]] = []
    for g, node in enumerate(carried.module.body):
        seen = carried.texts.get(id(node))
        if elided_count(node) is not None:
            if seen is None or seen[0] is not node or seen[1] != ch.text(g):
                return None
            out.append((node, False))
        else:
            out.append((node, True))
    return out


def statement_positions(module: cst.Module, ch: Chunks, groups: Iterable[int]) -> Optional[Dict[cst.CSTNode, CodeRange]]:
    """``PositionProvider``'s ranges, in the file, of every node of the top-level statements
    ``groups`` of the whole ``module`` (parsed from ``ch.code``, one statement per group): each
    statement is positioned in a module of its own and moved to its lines, where that module's
    text of it is the file's at those lines; None otherwise (the caller positions the whole
    module). A transform that decides a few statements of a whole module paid the positions of
    every node (~30-40% of such a transform on a 400-line script)."""
    out: Dict[cst.CSTNode, CodeRange] = {}
    for g in groups:
        statement = module.body[g]
        alone = module.with_changes(body=[statement], header=(), footer=())
        found = MetadataWrapper(alone, unsafe_skip_copy=True).resolve(PositionProvider)
        where = found[statement]
        shift = ch.tops[g][0].lineno - where.start.line  # its first token's line (ast: the same token)
        printed = physical_lines(alone.code)
        if shift < 0 or printed[where.start.line - 1 : where.end.line] != ch.lines[where.start.line - 1 + shift : where.end.line + shift]:
            return None
        for node, r in found.items():
            if node is not alone:
                out[node] = CodeRange(CodePosition(r.start.line + shift, r.start.column),
                                      CodePosition(r.end.line + shift, r.end.column))
    return out
