"""Device swaps (Ascend NPU through torch_npu, CUDA fused paths, CPU foreach) read from one table.

Every swap is an entry of :mod:`device_table` (data); this module is the engine that interprets an
entry's ``kind``. Matching is by qualified name through the module's imports and by argument
position (``torch.device(...)``'s first argument, any ``device=`` keyword, ``.to(...)``, ...), so
``import torch as th`` works and a ``"cuda"`` in a print is never touched. A device string held in
a variable is followed back to its assignment, parameter default or argparse default when the
variable reaches a device argument (or is passed to this module's own function or class).

Save-to-commit latency shapes the engine. Everything is decided on Python's ``ast`` (parsed once
per module version and shared by the six transforms, as are the module facts the prefilter reads):
a transform with nothing to change never makes the pipeline parse libcst, and sites take their
lines from ``ast``. Only the edits touch libcst: each edited node is reached down the statement
path from the module and found by position in a code generation of that one statement (of a
compound statement, its header only), never of the whole file (PositionProvider costs tens of ms);
one transformer pass then enters only the paths to the edits, so every other byte is kept.
"""
from __future__ import annotations

import ast
import dataclasses
import re
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst
from libcst.metadata.position_provider import PositionProvidingCodegenState

from scalebox_cst.config import installed_version
from scalebox_cst.report import REWRITTEN, SKIPPED, WARNING, Site

from . import device_table as T
from .base import Example, FileContext, Transform
from .names import ast_dotted

Edit = Callable[[cst.CSTNode], cst.CSTNode]
_OWNED = T.owned_qualnames()

_SIMPLE = (
    ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Delete, ast.Pass, ast.Break,
    ast.Continue, ast.Raise, ast.Assert, ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal,
) + ((ast.TypeAlias,) if hasattr(ast, "TypeAlias") else ())
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_MATCH = (ast.Match,) if hasattr(ast, "Match") else ()


# ---------------------------------------------------------------------------------------- source
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
_NEWLINE = re.compile(r"\r\n?|\n")


class _Source:
    """The module's text by ``ast`` line, for literal spellings and character columns."""

    def __init__(self, code: str) -> None:
        self.lines = _LINE.findall(code)

    def col(self, lineno: int, col: int) -> int:
        """``ast``'s UTF-8 byte column as a character column (libcst's)."""
        line = self.lines[lineno - 1]
        return col if line.isascii() else len(line.encode("utf-8")[:col].decode("utf-8", "replace"))

    def segment(self, node: ast.AST) -> str:
        l1, l2 = node.lineno, node.end_lineno
        c1, c2 = self.col(l1, node.col_offset), self.col(l2, node.end_col_offset)
        if l1 == l2:
            return self.lines[l1 - 1][c1:c2]
        return self.lines[l1 - 1][c1:] + "".join(self.lines[l1:l2 - 1]) + self.lines[l2 - 1][:c2]

    def raw(self, node: ast.AST) -> Optional[str]:
        """What libcst's ``SimpleString.raw_value`` is for a one-literal, non-bytes string, else
        None (an implicit concatenation is a ``ConcatenatedString`` there)."""
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
            return None
        return _raw_literal(self.segment(node))

    def starts_line(self, node: ast.AST) -> bool:
        return not self.lines[node.lineno - 1][: self.col(node.lineno, node.col_offset)].strip()


def _raw_literal(text: str, allow_bytes: bool = False) -> Optional[str]:
    """The text between the quotes when ``text`` is one string literal, else None."""
    i = 0
    while i < len(text) and text[i].isalpha():
        i += 1
    prefix = text[:i].lower()
    if ("b" in prefix and not allow_bytes) or "f" in prefix or text[i:i + 1] not in ("'", '"'):
        return None
    quote = text[i:i + 3] if text[i:i + 3] in ('"""', "'''") else text[i]
    j, n = i + len(quote), len(text)
    while j < n:
        if text[j] == "\\":
            j += 2
        elif text.startswith(quote, j):
            break
        else:
            j += 1
    if j + len(quote) != n:
        return None
    return text[i + len(quote):j]


# ------------------------------------------------------------------------------- ast helpers
def _positional(call: ast.Call) -> List[ast.expr]:
    return [a for a in call.args if not isinstance(a, ast.Starred)]


def _keyword(call: ast.Call, name: str) -> Optional[ast.keyword]:
    for k in call.keywords:
        if k.arg == name:
            return k
    return None


def _argument(call: ast.Call, index: Optional[int], keyword: Optional[str]) -> Optional[ast.expr]:
    if keyword:
        kw = _keyword(call, keyword)
        if kw is not None:
            return kw.value
    if index is not None:
        pos = _positional(call)
        if index < len(pos):
            for a in call.args:
                if a is pos[index]:
                    return a
                if isinstance(a, ast.Starred):
                    return None
    return None


def _has_star(call: ast.Call) -> bool:
    return any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)


def _call_args(call: ast.Call) -> List[ast.expr]:
    """The argument values in source order (a keyword may precede a ``*args``)."""
    if not call.keywords:
        return list(call.args)
    values = list(call.args) + [k.value for k in call.keywords]
    if call.args and any(isinstance(a, ast.Starred) for a in call.args):
        values.sort(key=lambda v: (v.lineno, v.col_offset))
    return values


def _children(node: ast.AST) -> List[ast.AST]:
    """Child nodes in source order (libcst's visiting order)."""
    t = type(node)
    if t is ast.Call:
        return [node.func, *_call_args(node)]
    if t is ast.IfExp:
        return [node.body, node.test, node.orelse]
    if t is ast.Dict:
        out: List[ast.AST] = []
        for k, v in zip(node.keys, node.values):
            if k is not None:
                out.append(k)
            out.append(v)
        return out
    out = []
    for name in _fields(t):
        value = getattr(node, name, None)
        if isinstance(value, list):
            out.extend(v for v in value if isinstance(v, ast.AST))
        elif isinstance(value, ast.AST):
            out.append(value)
    return out


_FIELDS: Dict[type, Tuple[str, ...]] = {}


def _fields(t: type) -> Tuple[str, ...]:
    found = _FIELDS.get(t)
    if found is None:
        found = _FIELDS[t] = tuple(f for f in t._fields if f not in ("ctx", "op", "type_comment", "kind"))
    return found


def _binds(stmt: ast.AST) -> Set[str]:
    """Names a statement binds anywhere inside it (assignment, loop, with, import, def...)."""
    names: Set[str] = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name):
            if not isinstance(node.ctx, ast.Load):
                names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def _is_suite(body: Sequence[ast.stmt], src: _Source) -> bool:
    """``if x: y`` (a libcst SimpleStatementSuite) rather than an indented block."""
    return bool(body) and not src.starts_line(body[0])


class _Line:
    """One libcst statement line: the small statements of a SimpleStatementLine (or a suite)."""

    __slots__ = ("stmts", "suite")

    def __init__(self, stmts: List[ast.stmt], suite: bool) -> None:
        self.stmts = stmts
        self.suite = suite


def _lines(body: Sequence[ast.stmt]) -> List[object]:
    """A block's statements as libcst sees them: compound statements, and lines of small ones."""
    out: List[object] = []
    last: Optional[_Line] = None
    for s in body:
        if not isinstance(s, _SIMPLE):
            out.append(s)
            last = None
        elif last is not None and s.lineno == last.stmts[-1].end_lineno:
            last.stmts.append(s)
        else:
            last = _Line([s], False)
            out.append(last)
    return out


# ------------------------------------------------------------------------------- libcst edits
_SPACE_COMMA = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def _new_arg(keyword: Optional[str], value: cst.BaseExpression) -> cst.Arg:
    if keyword is None:
        return cst.Arg(value=value)
    return cst.Arg(keyword=cst.Name(keyword), value=value, equal=_EQUAL)


def _append_args(call: cst.Call, new: Sequence[cst.Arg]) -> cst.Call:
    """``call`` with ``new`` arguments appended, in the call's own comma style."""
    args, new = list(call.args), list(new)
    if not args:
        return call.with_changes(args=[a.with_changes(comma=_SPACE_COMMA) for a in new[:-1]] + new[-1:])
    last = args[-1]
    if isinstance(last.comma, cst.Comma):  # a trailing comma: keep it last, copy the separator style
        between = args[-2].comma if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma) else _SPACE_COMMA
        args[-1] = last.with_changes(comma=between)
        new = [a.with_changes(comma=between) for a in new[:-1]] + [new[-1].with_changes(comma=last.comma)]
    else:
        args[-1] = last.with_changes(comma=_SPACE_COMMA)
        new = [a.with_changes(comma=_SPACE_COMMA) for a in new[:-1]] + new[-1:]
    return call.with_changes(args=args + new)


def _keep_parens(old: cst.BaseExpression, new: cst.BaseExpression) -> cst.BaseExpression:
    if getattr(old, "lpar", None) and hasattr(new, "lpar"):
        return new.with_changes(lpar=old.lpar, rpar=old.rpar)
    return new


def _swap_attr(node: cst.BaseExpression, depth: int, name: str) -> cst.BaseExpression:
    if not isinstance(node, cst.Attribute):
        raise TypeError(f"expected an attribute, found {type(node).__name__}")
    if depth == 0:
        return node.with_changes(attr=cst.Name(name))
    return node.with_changes(value=_swap_attr(node.value, depth - 1, name))


def _drop_statements(block, drops: Set[int]):
    body = list(block.body)
    kept: List[cst.BaseStatement] = []
    carry: List[cst.EmptyLine] = []
    for i, stmt in enumerate(body):
        if i in drops:
            carry.extend(getattr(stmt, "leading_lines", ()))
            continue
        if carry:
            stmt = stmt.with_changes(leading_lines=[*carry, *stmt.leading_lines])
            carry = []
        kept.append(stmt)
    if not kept and isinstance(block, cst.IndentedBlock):
        kept = [cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carry)]
    elif carry and isinstance(block, cst.Module):
        block = block.with_changes(footer=[*carry, *block.footer])
    return block.with_changes(body=kept)


class _Scope:
    """A Python scope, just enough to tell which assignment a name read refers to."""

    def __init__(self, kind: str, parent: Optional["_Scope"]) -> None:
        self.kind = kind  # module | function | class
        self.parent = parent
        self.locals: Set[str] = set()
        self.declared_global: Set[str] = set()
        self.declared_nonlocal: Set[str] = set()
        self.bindings: Dict[str, List[Tuple[ast.expr, "_Scope"]]] = {}

    @property
    def root(self) -> "_Scope":
        scope = self
        while scope.parent is not None:
            scope = scope.parent
        return scope

    def resolve(self, name: str) -> "_Scope":
        if name in self.declared_global:
            return self.root
        if name in self.locals and name not in self.declared_nonlocal:
            return self
        scope = self.parent
        while scope is not None:
            if scope.kind == "class":
                scope = scope.parent
                continue
            if scope.kind == "module" or (name in scope.locals and name not in scope.declared_nonlocal):
                return scope
            scope = scope.parent
        return self.root


class _Facts:
    """Module-wide facts, read from Python's ``ast``: what a cheap prefilter needs, and what some
    conditions need before any decision. One instance serves every transform that sees the same
    module version (see :func:`_module_facts`)."""

    def __init__(self, tree: ast.AST, aliases: Dict[str, str]) -> None:
        self.members: Set[str] = set()  # methods and self.<attr> names defined in the module
        self.bound: Set[str] = set()  # every name the module binds somewhere
        self.attrs: Set[str] = set()
        self.qualified: Set[str] = set()
        self.strings: List[str] = []
        self.imported: List[str] = []
        self._zero_grads: Optional[List[Tuple[Optional[str], str]]] = None
        members, bound, attrs, qualified, strings = self.members, self.bound, self.attrs, self.qualified, self.strings
        Name, Attribute, Constant, Store, Load = ast.Name, ast.Attribute, ast.Constant, ast.Store, ast.Load
        fields = _FIELDS
        stack: List[Tuple[ast.AST, bool]] = [(tree, False)]  # (node, inside a class)
        pop, push = stack.pop, stack.append
        while stack:
            node, in_class = pop()
            t = type(node)
            if t is Name:
                if type(node.ctx) is not Load:
                    bound.add(node.id)
                full = aliases.get(node.id)
                if full is not None:
                    qualified.add(full)
                continue
            if t is Attribute:
                # the whole chain at once: every attribute name, every qualified prefix
                if type(node.ctx) is Store and type(node.value) is Name and node.value.id in ("self", "cls"):
                    members.add(node.attr)
                parts = [node.attr]
                base = node.value
                while type(base) is Attribute:
                    parts.append(base.attr)
                    base = base.value
                attrs.update(parts)
                if type(base) is Name:
                    full = aliases.get(base.id)
                    if full is not None:
                        for k in range(len(parts)):
                            qualified.add(full + "." + ".".join(reversed(parts[k:])))
                push((base, in_class))
                continue
            if t is Constant:
                if isinstance(node.value, str):
                    strings.append(node.value)
                continue
            if t is ast.ClassDef:
                bound.add(node.name)
                in_class = True
            elif t is ast.FunctionDef or t is ast.AsyncFunctionDef:
                bound.add(node.name)
                if in_class:
                    members.add(node.name)
            elif t is ast.arg:
                bound.add(node.arg)
            elif t is ast.ExceptHandler:
                if node.name:
                    bound.add(node.name)
            elif t is ast.Import or t is ast.ImportFrom:
                for alias in node.names:
                    bound.add(alias.asname or alias.name.split(".")[0])
                    if t is ast.Import:
                        self.imported.append(alias.name)
                    elif node.module and not node.level:
                        self.imported.append(f"{node.module}.{alias.name}")
            names = fields.get(t)
            if names is None:
                names = _fields(t)
            for name in names:
                value = getattr(node, name, None)
                if type(value) is list:
                    for v in value:
                        if isinstance(v, ast.AST):
                            push((v, in_class))
                elif isinstance(value, ast.AST):
                    push((value, in_class))

    def zero_grads(self, tree: ast.AST) -> List[Tuple[Optional[str], str]]:
        """``x.zero_grad(...)`` calls in ``ast.walk`` order: (receiver, set_to_none: absent|False|other).
        Read on first use only (the facts must not hold the tree: it is their cache's weak key)."""
        if self._zero_grads is None:
            found: List[Tuple[Optional[str], str]] = []
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "zero_grad":
                    value = next((k.value for k in node.keywords if k.arg == "set_to_none"), node.args[0] if node.args else None)
                    kind = "absent" if value is None else ("False" if isinstance(value, ast.Constant) and value.value is False else "other")
                    found.append((ast_dotted(node.func.value), kind))
            self._zero_grads = found
        return self._zero_grads

    def may_match(self, entry: T.Swap) -> bool:
        """False when ``entry`` cannot match anything in this module (no analysis needed)."""
        kind = entry.kind
        if kind in ("rename", "helper", "call-replace", "add-kwarg", "report-decorator"):
            return any(q in self.qualified for q in entry.qualnames)
        if kind in ("report-ref", "drop-assign"):
            prefixes = entry.qualnames if kind == "report-ref" else (entry.pattern.rstrip("."),)
            return any(q == p or q.startswith(p + ".") for q in self.qualified for p in prefixes)
        if kind in ("method", "attribute"):
            return entry.pattern in self.attrs
        if kind in ("literal-arg", "compare"):
            return any(re.search(entry.literal[0], text) for text in self.strings)
        if kind == "swiglu":
            return ("chunk" in self.attrs or "torch.chunk" in self.qualified) and any(q in self.qualified for q in entry.qualnames)
        if kind == "report-import":
            return any(m == entry.pattern or m.startswith(entry.pattern + ".") for m in self.imported)
        return True


#: per module version (the ast tree the pipeline shares): (aliases the facts were read with, facts, source)
_TREE_CACHE: "weakref.WeakKeyDictionary[ast.AST, Tuple[Dict[str, str], _Facts, _Source]]" = weakref.WeakKeyDictionary()


def _module_facts(ctx: FileContext) -> Tuple[_Facts, _Source]:
    """The facts and source lines of ``ctx``'s module version, read once for all six transforms."""
    tree, aliases = ctx.tree, ctx.imports.aliases
    hit = _TREE_CACHE.get(tree)
    if hit is not None and hit[0] == aliases:
        return hit[1], hit[2]
    facts, src = _Facts(tree, aliases), (hit[2] if hit is not None else _Source(ctx.code))
    _TREE_CACHE[tree] = (dict(aliases), facts, src)
    return facts, src


def _argparse_dest(node: ast.Call, src: _Source) -> Optional[str]:
    kw = _keyword(node, "dest")
    if kw is not None:
        return src.raw(kw.value)
    flags = [f for f in (src.raw(a) for a in _positional(node)) if f]
    longs = [f for f in flags if f.startswith("--")]
    name = longs[0] if longs else (flags[0] if flags else None)
    return name.lstrip("-").replace("-", "_") if name else None


_CALLEES: Dict[str, Tuple[Set[str], Set[str], Set[str]]] = {}


def _callees(entry: T.Swap) -> Tuple[Set[str], Set[str], Set[str]]:
    """A literal-arg entry's callees: qualified names, method names, keywords of any call."""
    found = _CALLEES.get(entry.id)
    if found is None:
        quals = {c for c, _, _ in entry.positions if c != "*" and not c.startswith(".")}
        methods = {c[1:] for c, _, _ in entry.positions if c.startswith(".")}
        keywords = {k for c, i, k in entry.positions if c == "*" and i is None and k}
        found = _CALLEES[entry.id] = (quals, methods, keywords)
    return found


def _span(node: ast.AST) -> Tuple[int, int]:
    return node.lineno, node.end_lineno


class _Target:
    """A node an edit applies to, named by its ``ast`` node. ``expr``: the libcst node of the same
    kind at the same position; ``fpart``: the first text part of that f-string; ``stmt``: that
    small statement."""

    __slots__ = ("node", "kind")

    def __init__(self, node: ast.AST, kind: str = "expr") -> None:
        self.node = node
        self.kind = kind


def _params(a: ast.arguments) -> List[Tuple[ast.arg, Optional[ast.expr]]]:
    """Parameters with their defaults, in libcst's order (positional, *args, keyword-only, **kw)."""
    positional = [*a.posonlyargs, *a.args]
    first = len(positional) - len(a.defaults)
    out = [(p, a.defaults[i - first] if i >= first else None) for i, p in enumerate(positional)]
    if a.vararg is not None:
        out.append((a.vararg, None))
    out.extend(zip(a.kwonlyargs, a.kw_defaults))
    if a.kwarg is not None:
        out.append((a.kwarg, None))
    return out


def _class_args(node: ast.ClassDef) -> List[ast.expr]:
    values = list(node.bases) + [k.value for k in node.keywords]
    if node.bases and node.keywords and any(isinstance(b, ast.Starred) for b in node.bases):
        values.sort(key=lambda v: (v.lineno, v.col_offset))
    return values


class _Analyzer:
    """Plans the edits of one transform's active entries over the ``ast``, in libcst's visiting
    order (so sites come out in the same order), and reports every site."""

    def __init__(self, ctx: FileContext, transform_id: str, entries: Sequence[T.Swap]) -> None:
        self.ctx = ctx
        self.tid = transform_id
        self.entries: List[Tuple[T.Swap, str]] = []  # (entry, mode) mode: "apply" | "warn"
        for e in entries:
            if ctx.backend not in e.backends:
                continue
            if e.option and not ctx.option(T.SECTION, e.option, False):
                if e.without_option == "warn":
                    self.entries.append((e, "warn"))
                continue
            self.entries.append((e, "apply"))
        if not self.entries:
            return
        self.facts, self.src = _module_facts(ctx)  # shared per module version
        self.entries = [(e, m) for e, m in self.entries if self.facts.may_match(e)]
        self.imports = ctx.imports
        self.aliases = self.imports.aliases  # mutated in place when an edit binds a new name
        kinds: Dict[str, List[Tuple[T.Swap, str]]] = {}
        for e, m in self.entries:
            kinds.setdefault(e.kind, []).append((e, m))
        self.kinds = kinds
        self.call_entries = [(e, m) for e, m in self.entries if e.kind in ("method", "literal-arg", "call-replace", "add-kwarg", "helper")]
        self.ref_entries = [(e, m) for e, m in self.entries if e.kind in ("rename", "helper", "report-ref")]
        self.within_entries = [e for e, _ in self.entries if e.within]
        # what the walk must keep track of for these entries (the rest is skipped)
        self.flow = "literal-arg" in kinds or "compare" in kinds  # scopes, bindings, calls, options
        self.refs = bool(self.ref_entries) or "attribute" in kinds  # dotted references
        self.helper_refs = "helper" in kinds  # which references sit where a value is expected
        # the callees of every literal-arg entry at once: most calls have no device position
        self.literal_quals: Set[str] = set()
        self.literal_methods: Set[str] = set()
        self.literal_keywords: Set[str] = set()
        for e, _ in kinds.get("literal-arg", ()):
            quals, methods, keywords = _callees(e)
            self.literal_quals |= quals
            self.literal_methods |= methods
            self.literal_keywords |= keywords
        self.sites: List[Site] = []
        self.edits: List[Tuple[_Target, Edit]] = []
        self.line_drops: List[ast.stmt] = []  # first small statement of each line dropped whole
        self.module_inserts: List[Tuple[int, str]] = []
        self.scope: Optional[_Scope] = None
        self.attr_bindings: Dict[str, List[Tuple[ast.expr, _Scope]]] = {}
        self.flows: List[Tuple[_Scope, str, T.Swap, int]] = []
        self.attr_flows: List[Tuple[str, T.Swap, int]] = []
        self.device_names: Set[Tuple[int, str, str]] = set()  # (id(scope), name, literal regex)
        self.device_attrs: Set[Tuple[str, str]] = set()
        self.compares: List[Tuple[_Scope, ast.expr, ast.expr, T.Swap]] = []
        self.done_literals: Set[ast.AST] = set()
        self.claimed: Set[ast.AST] = set()
        self.handled_refs: Set[ast.AST] = set()
        self.dtype_tests: Set[int] = set()  # ids of ast operands of comparisons (dtype tests)
        self.ref_ok: Set[ast.AST] = set()
        self.within_depth: Dict[str, int] = {}
        self.lines: List[_Line] = []  # enclosing statement line (or suite)
        self.drop_candidates: Dict[_Line, List[ast.Assign]] = {}
        self._npu: Optional[str] = None
        self._helpers: Optional[str] = None
        # id(function scope) -> (name callers use, scope the name lives in, positional parameters)
        self.functions: Dict[int, Tuple[str, Optional[_Scope], List[str]]] = {}
        self.class_names: List[str] = []
        self.calls: Dict[str, List[Tuple[ast.Call, _Scope]]] = {}  # plain-name calls, by name
        self.arguments: Dict[str, ast.Call] = {}  # argparse dest -> its add_argument call

    # ------------------------------------------------------------------ helpers
    def by_kind(self, kind: str) -> List[Tuple[T.Swap, str]]:
        return self.kinds.get(kind, [])

    def site(self, entry: T.Swap, span: Tuple[int, int], action: str, reason: str, exactness=None, kind=None) -> None:
        self.sites.append(Site(self.tid, span[0], span[1], action, reason, exactness, kind or entry.site_kind))

    def skip(self, entry: T.Swap, node: ast.AST, why: str) -> None:
        self.site(entry, _span(node), SKIPPED, f"{entry.id}: {why}")

    def warn(self, entry: T.Swap, node: ast.AST, reason: str) -> None:
        self.site(entry, _span(node), WARNING, reason, None)

    def prepare(self, entry: T.Swap) -> None:
        """Before an edit's text is built: the fail-fast torch_npu import comes first."""
        if self._emits_npu(entry):
            self.npu_alias()

    def edit(self, entry: T.Swap, target: _Target, fn: Edit, reason: Optional[str] = None,
             site_node: Optional[ast.AST] = None, span: Optional[Tuple[int, int]] = None) -> None:
        self.prepare(entry)
        self.edits.append((target, fn))
        self.site(entry, span or _span(site_node or target.node), REWRITTEN, reason or entry.reason, entry.exactness)

    @staticmethod
    def _emits_npu(entry: T.Swap) -> bool:
        return entry.backends == ("npu",) and entry.transform in (T.PLACEMENT, T.AUTOCAST, T.FUSED_OP, T.OPTIMIZER) and entry.kind != "drop-assign"

    def npu_alias(self) -> str:
        if self._npu is None:
            self._npu = self.ctx.runtime_name(T.NPU_IMPORT, "torch_npu")
        return self._npu

    def helper_alias(self) -> str:
        self.npu_alias()
        if self._helpers is None:
            self._helpers = self.ctx.runtime_name(T.NPU_HELPERS, "scalebox_npu")
        return self._helpers

    def module_alias(self, top: str) -> str:
        for local, full in self.aliases.items():
            if full == top:
                return local
        # a name that only occurs in import paths (``from torch.cuda import x``) is free to bind
        alias = top if top not in self.facts.bound and top not in self.aliases else self.imports.unique_name(top)
        self.imports.names.add(alias)
        self.aliases[alias] = top
        self.ctx.require_import(f"import {top}" if alias == top else f"import {top} as {alias}")
        return alias

    def ref_text(self, qualname: str) -> str:
        if qualname.startswith("torch_npu."):
            return self.npu_alias() + qualname[len("torch_npu"):]
        local = self.imports.local_for(qualname)
        if local is not None:
            return local
        top, _, rest = qualname.partition(".")
        return self.module_alias(top) + ("." + rest if rest else "")

    def renamed(self, node: ast.expr, old: str, new: str) -> Edit:
        """The edit that makes ``node`` (meaning ``old``) mean ``new``: one attribute swapped where
        the source spells that component out, else a fresh reference through the imports."""
        old_parts, new_parts = old.split("."), new.split(".")
        text = ast_dotted(node)
        if text is not None and len(old_parts) == len(new_parts):
            diff = [i for i, (a, b) in enumerate(zip(old_parts, new_parts)) if a != b]
            head = text.split(".")[0]
            head_len = len(self.aliases.get(head, head).split("."))
            local_parts = text.split(".")
            if len(diff) == 1 and diff[0] >= head_len:
                k = diff[0] - head_len + 1  # index in the local chain
                depth = len(local_parts) - 1 - k  # how many .attr to walk down from node
                name = new_parts[diff[0]]
                return lambda u: _swap_attr(u, depth, name)
        text = self.ref_text(new)
        return lambda u: _keep_parens(u, cst.parse_expression(text))

    def receiver_is_module(self, func: ast.Attribute) -> bool:
        return self.imports.qualify(func.value) is not None

    def is_literal(self, node: ast.AST, *values: str) -> bool:
        """libcst's reading: a Name (True/False/None are Names there) or a string spelled so."""
        if isinstance(node, ast.Name):
            return node.id in values
        if isinstance(node, ast.Constant):
            v = node.value
            if v is True or v is False or v is None:
                return str(v) in values
            text = self.src.raw(node)
            return text is not None and text in values
        return False

    def int_text(self, node: Optional[ast.AST], text: str) -> bool:
        return isinstance(node, ast.Constant) and type(node.value) is int and self.src.segment(node) == text

    def is_minus_one(self, node: ast.AST) -> bool:
        return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and self.int_text(node.operand, "1")

    # ------------------------------------------------------------------ scopes and bindings
    def _push(self, kind: str) -> _Scope:
        self.scope = _Scope(kind, self.scope)
        return self.scope

    def _pop(self) -> None:
        assert self.scope is not None
        self.scope = self.scope.parent

    def _bind_target(self, target: ast.expr, value: Optional[ast.expr]) -> None:
        assert self.scope is not None
        if not self.flow:
            return
        if isinstance(target, ast.Name):
            self.scope.locals.add(target.id)
            if value is not None:
                self.scope.bindings.setdefault(target.id, []).append((value, self.scope))
        elif isinstance(target, (ast.Tuple, ast.List)):
            for el in target.elts:
                self._bind_target(el.value if isinstance(el, ast.Starred) else el, None)
        elif isinstance(target, ast.Starred):
            self._bind_target(target.value, None)
        elif isinstance(target, ast.Attribute) and value is not None:
            text = ast_dotted(target)
            if text is not None:
                self.attr_bindings.setdefault(text, []).append((value, self.scope))

    # ------------------------------------------------------------------ the walk
    def run(self) -> None:
        self.scope = _Scope("module", None)
        self._block(self.ctx.tree.body, module=True)
        self._finish()

    def _block(self, body: Sequence[ast.stmt], module: bool = False) -> None:
        """An indented block (or the module): scanned as a whole before its statements."""
        items = _lines(body)
        if "swiglu" in self.kinds or (module and "insert" in self.kinds):
            self._scan_block(items, module)
        for item in items:
            if type(item) is _Line:
                self.lines.append(item)
                for s in item.stmts:
                    self._stmt(s)
                self.lines.pop()
            else:
                self._stmt(item)

    def _body(self, body: Sequence[ast.stmt]) -> None:
        if _is_suite(body, self.src):
            line = _Line(list(body), True)
            self.lines.append(line)
            for s in body:
                self._stmt(s)
            self.lines.pop()
        else:
            self._block(body)

    def _orelse(self, orelse: Sequence[ast.stmt]) -> None:
        if not orelse:
            return
        first = orelse[0]
        if len(orelse) == 1 and isinstance(first, ast.If) and self.src.lines[first.lineno - 1][self.src.col(first.lineno, first.col_offset):].startswith("elif"):
            self._stmt(first)  # elif: an If in libcst's orelse, no block of its own
        else:
            self._body(orelse)

    def _stmt(self, s: ast.stmt) -> None:
        handler = _STMT.get(type(s))
        if handler is not None:
            handler(self, s)
        else:
            for child in _children(s):
                self._expr(child)

    def _expr(self, node: ast.AST) -> None:
        handler = _EXPR.get(type(node))
        if handler is not None:
            handler(self, node)
        else:
            for child in _children(node):
                self._expr(child)

    # statements
    def _s_def(self, node: ast.FunctionDef) -> None:
        assert self.scope is not None
        outer = self.scope
        outer.locals.add(node.name)
        scope = self._push("function")
        a = node.args
        params = _params(a)
        if self.flow:
            positional = [p.arg for p in (*a.posonlyargs, *a.args)]
            if outer.kind == "class" and node.name == "__init__":
                # Agent(envs, "cuda") binds __init__'s parameters after self
                self.functions[id(scope)] = (self.class_names[-1] if self.class_names else "", outer.parent, positional[1:])
            elif outer.kind != "class":
                self.functions[id(scope)] = (node.name, outer, positional)
            for p, default in params:
                if p is a.vararg or p is a.kwarg:
                    continue
                scope.locals.add(p.arg)
                if default is not None:
                    scope.bindings.setdefault(p.arg, []).append((default, outer))
            for star in (a.vararg, a.kwarg):
                if star is not None:
                    scope.locals.add(star.arg)
        for d in node.decorator_list:
            self._decorator(d)
        self._param_values(params)
        if node.returns is not None:
            self._expr(node.returns)
        self._body(node.body)
        self._pop()

    def _param_values(self, params: List[Tuple[ast.arg, Optional[ast.expr]]]) -> None:
        for p, default in params:
            if default is not None:
                self.ref_ok.add(default)
            if p.annotation is not None:
                self._expr(p.annotation)
            if default is not None:
                self._expr(default)

    def _s_class(self, node: ast.ClassDef) -> None:
        assert self.scope is not None
        self.scope.locals.add(node.name)
        self.class_names.append(node.name)
        self._push("class")
        for d in node.decorator_list:
            self._decorator(d)
        for value in _class_args(node):
            self._expr(value)
        self._body(node.body)
        self.class_names.pop()
        self._pop()

    def _decorator(self, expr: ast.expr) -> None:
        entries = self.by_kind("report-decorator")
        if entries:
            target = expr.func if isinstance(expr, ast.Call) else expr
            qual = self.imports.qualify(target)
            for entry, _ in entries:
                if qual in entry.qualnames:
                    self.handled_refs.add(target)
                    self.warn(entry, expr, f"{qual}: {entry.reason}")
        self._expr(expr)

    def _s_if(self, node: ast.If) -> None:
        self._expr(node.test)
        self._body(node.body)
        self._orelse(node.orelse)

    def _s_for(self, node: ast.For) -> None:
        self._bind_target(node.target, None)
        self._expr(node.target)
        self._expr(node.iter)
        self._body(node.body)
        if node.orelse:
            self._body(node.orelse)

    def _s_while(self, node: ast.While) -> None:
        self._expr(node.test)
        self._body(node.body)
        if node.orelse:
            self._body(node.orelse)

    def _s_with(self, node: ast.With) -> None:
        for item in node.items:
            if item.optional_vars is not None:
                self._bind_target(item.optional_vars, None)
            self._expr(item.context_expr)
            if item.optional_vars is not None:
                self._expr(item.optional_vars)
        self._body(node.body)

    def _s_try(self, node: ast.Try) -> None:
        self._body(node.body)
        for h in node.handlers:
            if h.name and type(node) is ast.Try:  # libcst's ExceptStarHandler binds nothing here
                assert self.scope is not None
                self.scope.locals.add(h.name)
            if h.type is not None:
                self._expr(h.type)
            if h.name:
                self._bare_name(h, h.name, r"\bas\s+")
            self._body(h.body)
        if node.orelse:
            self._body(node.orelse)
        if node.finalbody:
            self._body(node.finalbody)

    def _s_match(self, node: ast.AST) -> None:
        self._expr(node.subject)
        for case in node.cases:
            self._expr(case.pattern)
            if case.guard is not None:
                self._expr(case.guard)
            self._body(case.body)

    def _s_return(self, node: ast.Return) -> None:
        if node.value is not None:
            self.ref_ok.add(node.value)
            self._expr(node.value)

    def _s_assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._bind_target(t, node.value)
        self.ref_ok.add(node.value)
        for entry, mode in self.by_kind("drop-assign"):
            quals = [self.imports.qualify(t) for t in node.targets]
            if not all(q and q.startswith(entry.pattern) for q in quals):
                continue
            if not self._side_effect_free(node.value):
                self.warn(entry, node, f"{entry.id}: kept, the assigned value is not a plain name, attribute "
                          "or literal (dropping the line would skip its evaluation); the setting has no effect on NPU")
                continue
            read = next((n for q, n in self._flag_reads(entry.pattern) if q in quals), None)
            if read is not None:
                self.warn(entry, node, f"{entry.id}: kept, the module reads this flag (line "
                          f"{self.ctx.original_line(read.lineno)}): dropping the assignment could change what "
                          "it sees; the setting has no effect on NPU")
                continue
            line = self.lines[-1] if self.lines else None
            if line is None:
                continue
            self.drop_candidates.setdefault(line, []).append(node)
            self.site(entry, _span(node), REWRITTEN, entry.reason, entry.exactness)
        for t in node.targets:
            self._expr(t)
        self._expr(node.value)

    def _s_augassign(self, node: ast.AugAssign) -> None:
        self._bind_target(node.target, None)
        self._expr(node.target)
        self._expr(node.value)

    def _s_annassign(self, node: ast.AnnAssign) -> None:
        self._bind_target(node.target, node.value)
        if node.value is not None:
            self.ref_ok.add(node.value)
        self._expr(node.target)
        self._expr(node.annotation)
        if node.value is not None:
            self._expr(node.value)

    def _s_import(self, node: ast.Import) -> None:
        assert self.scope is not None
        for alias in node.names:
            self.scope.locals.add(alias.asname or alias.name.split(".")[0])
        self._report_import(node, [alias.name for alias in node.names])

    def _s_importfrom(self, node: ast.ImportFrom) -> None:
        assert self.scope is not None
        if node.level or node.module is None or node.names[0].name == "*":
            return
        full = []
        for alias in node.names:
            self.scope.locals.add(alias.asname or alias.name)
            full.append(f"{node.module}.{alias.name}")
        self._report_import(node, full)

    def _s_global(self, node: ast.Global) -> None:
        assert self.scope is not None
        self.scope.declared_global.update(node.names)
        for name in node.names:
            self._bare_name(node, name, r"\bglobal\b[^#]*?")

    def _s_nonlocal(self, node: ast.Nonlocal) -> None:
        assert self.scope is not None
        self.scope.declared_nonlocal.update(node.names)
        for name in node.names:
            self._bare_name(node, name, r"\bnonlocal\b[^#]*?")

    def _bare_name(self, owner: ast.AST, name: str, before: str) -> None:
        """A name libcst visits as a Name node but ``ast`` keeps as a string (``global x``,
        ``except E as x``): it matters only when it is an imported name (a reference)."""
        if name not in self.aliases:
            return
        pattern = re.compile(before + r"(?<![\w.])" + re.escape(name) + r"(?!\w)")
        for lineno in range(owner.lineno, (owner.end_lineno or owner.lineno) + 1):
            line = self.src.lines[lineno - 1]
            start = self.src.col(lineno, owner.col_offset) if lineno == owner.lineno else 0
            m = pattern.search(line, start)
            if m is not None:
                c = len(line[: m.end() - len(name)].encode("utf-8"))
                ref = ast.Name(id=name, ctx=ast.Load(), lineno=lineno, col_offset=c, end_lineno=lineno, end_col_offset=c + len(name.encode("utf-8")))
                self._reference(ref)
                return

    def _report_import(self, node: ast.AST, full_names: Sequence[str]) -> None:
        for entry, _ in self.by_kind("report-import"):
            hit = [f for f in full_names if f == entry.pattern or f.startswith(entry.pattern + ".")]
            if hit:
                self.warn(entry, node, f"{hit[0]}: {entry.reason}")

    def _flag_reads(self, prefix: str) -> List[Tuple[str, ast.Attribute]]:
        """Loads of attributes under ``prefix`` (``torch.backends.cudnn.benchmark`` read back by
        a print or an ``if``), by qualified name: a dropped assignment would change what they see."""
        found = self.__dict__.get("_reads")
        if found is None:
            found = self.__dict__["_reads"] = [
                (q, n)
                for n in ast.walk(self.ctx.tree)
                if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)
                for q in (self.imports.qualify(n),)
                if q and q.startswith(prefix)
            ]
        return found

    def _side_effect_free(self, value: ast.AST) -> bool:
        if isinstance(value, ast.Name):
            return True
        if isinstance(value, ast.Constant):
            v = value.value
            if v is True or v is False or v is None or type(v) in (int, float):
                return True
            if isinstance(v, (str, bytes)):  # one literal (a SimpleString), not a concatenation
                return _raw_literal(self.src.segment(value), allow_bytes=True) is not None
            return False
        if isinstance(value, ast.Attribute):
            return ast_dotted(value) is not None
        if isinstance(value, ast.UnaryOp):
            return self._side_effect_free(value.operand)
        return False

    # expressions
    def _e_name(self, node: ast.Name) -> None:
        if self.refs:
            self._reference(node)

    def _e_attribute(self, node: ast.Attribute) -> None:
        # only the value is an expression; the attribute's own name is not a reference
        if not self.refs or not self._reference(node):
            self._expr(node.value)

    def _e_call(self, node: ast.Call) -> None:
        self._visit_call(node)
        self._expr(node.func)
        for value in _call_args(node):
            self._expr(value)
        if self.within_entries:
            qual = self.imports.qualify(node.func)
            for entry in self.within_entries:
                if qual is not None and qual in entry.within:
                    self.within_depth[entry.id] -= 1

    def _e_compare(self, node: ast.Compare) -> None:
        self._compare(node)
        # dtype tests (``x.dtype == torch.float64``, ``dtype in [torch.float32, torch.float64]``)
        # make no float64 data: renaming the dtype there would turn the test's logic around
        for operand in (node.left, *node.comparators):
            items = operand.elts if isinstance(operand, (ast.List, ast.Tuple, ast.Set)) else (operand,)
            self.dtype_tests.update(id(x) for x in items)
        self._expr(node.left)
        for c in node.comparators:
            self._expr(c)

    def _e_lambda(self, node: ast.Lambda) -> None:
        scope = self._push("function")
        a = node.args
        for p in (*a.posonlyargs, *a.args, *a.kwonlyargs):
            scope.locals.add(p.arg)
        self._param_values(_params(a))
        self._expr(node.body)
        self._pop()

    def _e_leaf(self, node: ast.AST) -> None:
        pass

    def _e_binop(self, node: ast.BinOp) -> None:
        self._expr(node.left)
        self._expr(node.right)

    def _e_operand(self, node: ast.AST) -> None:  # UnaryOp, Starred, Await
        self._expr(node.operand if type(node) is ast.UnaryOp else node.value)

    def _e_values(self, node: ast.BoolOp) -> None:
        for value in node.values:
            self._expr(value)

    def _e_namedexpr(self, node: ast.NamedExpr) -> None:
        self._bind_target(node.target, node.value)
        self._expr(node.target)
        self._expr(node.value)

    def _e_dict(self, node: ast.Dict) -> None:
        for k, v in zip(node.keys, node.values):
            if k is not None:
                self.ref_ok.add(v)  # activation registries: {"gelu": nn.GELU}
                self._expr(k)
            self._expr(v)

    def _e_elements(self, node: ast.AST) -> None:
        for el in node.elts:
            if not isinstance(el, ast.Starred):
                self.ref_ok.add(el)
            self._expr(el)

    def _e_subscript(self, node: ast.Subscript) -> None:
        self._expr(node.value)
        s = node.slice
        if isinstance(s, ast.Tuple) and not self._parenthesized(s):
            for el in s.elts:  # subscript elements, not tuple elements
                self._expr(el)
        else:
            self._expr(s)

    def _parenthesized(self, node: ast.Tuple) -> bool:
        if not self.helper_refs:
            return True  # only helper references read ref_ok
        text = self.src.segment(node)
        if not (text.startswith("(") and text.endswith(")")):
            return False
        depth = 0
        for i, ch in enumerate(text):
            depth += ch in "([{"
            depth -= ch in ")]}"
            if depth == 0:
                return i == len(text) - 1
        return False

    # ------------------------------------------------------------------ calls
    def _visit_call(self, node: ast.Call) -> None:
        func = node.func
        qual = self.imports.qualify(func)
        if not self.flow:
            pass
        elif isinstance(func, ast.Name):
            assert self.scope is not None
            self.calls.setdefault(func.id, []).append((node, self.scope))
        elif isinstance(func, ast.Attribute) and func.attr == "add_argument":
            dest = _argparse_dest(node, self.src)
            if dest:
                self.arguments[dest] = node
        if not self.helper_refs or qual in ("isinstance", "issubclass") or (isinstance(func, ast.Name) and func.id in ("isinstance", "issubclass", "type")):
            pass
        else:
            self.ref_ok.update(a.value if isinstance(a, ast.Starred) else a for a in node.args)
            self.ref_ok.update(k.value for k in node.keywords)
        for entry in self.within_entries:
            if qual is not None and qual in entry.within:
                self.within_depth[entry.id] = self.within_depth.get(entry.id, 0) + 1
        literal = (
            qual in self.literal_quals
            or (isinstance(func, ast.Attribute) and func.attr in self.literal_methods)
            or (self.literal_keywords and any(k.arg in self.literal_keywords for k in node.keywords))
        )
        for entry, mode in self.call_entries:
            kind = entry.kind
            if kind == "method":
                self._method(entry, mode, node)
            elif kind == "literal-arg":
                if literal:  # a device position of some entry: check this one's
                    self._literal_arg(entry, node, qual)
            elif node in self.claimed:
                continue
            elif kind == "call-replace" and qual in entry.qualnames:
                self._call_replace(entry, node)
            elif kind == "add-kwarg" and qual in entry.qualnames:
                self._add_kwarg(entry, node)
            elif kind == "helper" and qual in entry.qualnames:
                self._helper_call(entry, node)

    def _method(self, entry: T.Swap, mode: str, node: ast.Call) -> None:
        func = node.func
        if not isinstance(func, ast.Attribute) or func.attr != entry.pattern or self.receiver_is_module(func):
            return
        if "no-args" in entry.conditions and (node.args or node.keywords):
            return
        if "no-user-member" in entry.conditions and entry.pattern in self.facts.members:
            self.skip(entry, node, f"a class in this module defines its own `{entry.pattern}`; "
                      f"`.{entry.pattern}()` may not be the tensor method")
            return
        if mode == "warn":
            self.warn(entry, node, self._warn_reason(entry))
            return
        self.edit(entry, _Target(func), lambda u: u.with_changes(attr=cst.Name(entry.replacement)), site_node=node)

    def _warn_reason(self, entry: T.Swap) -> str:
        flag = entry.option.replace("_", "-") if entry.option else ""
        return (f"{entry.reason}; not changed (set [device] {entry.option} = true, or pass "
                f"--{flag}, to rewrite it)")

    def _call_replace(self, entry: T.Swap, node: ast.Call) -> None:
        if _has_star(node):
            self.claimed.add(node)
            self.skip(entry, node, "*args/**kwargs: the arguments cannot be mapped")
            return
        pos = _positional(node)
        keywords = [k.arg for k in node.keywords]
        if "npu-fused-ok" in entry.conditions:
            why = self._npu_fused_problem(entry, node, pos, keywords)
            if why:
                self.skip(entry, node, why)
                return  # not claimed: the plain fused=True entry may still apply
        elif len(pos) > len(entry.params) or any(k not in entry.accepts for k in keywords):
            self.claimed.add(node)
            self.skip(entry, node, "unexpected arguments")
            return
        self.claimed.add(node)
        self.handled_refs.add(node.func)
        self.prepare(entry)
        replacement = self.ref_text(entry.replacement)
        lead_texts, params = entry.lead, entry.params

        def fn(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            lead = [_new_arg(None, cst.parse_expression(text)) for text in lead_texts]
            args, index = [], 0
            for a in updated.args:
                if a.keyword is None and params:
                    a = a.with_changes(keyword=cst.Name(params[index]), equal=_EQUAL)
                    index += 1
                args.append(a)
            if lead:
                head = lead if args else lead[:-1]
                args = [x.with_changes(comma=_SPACE_COMMA) for x in head] + ([] if args else lead[-1:]) + args
            return updated.with_changes(func=_keep_parens(updated.func, cst.parse_expression(replacement)), args=args)

        self.edit(entry, _Target(node), fn)

    def _npu_fused_problem(self, entry: T.Swap, node: ast.Call, pos, keywords) -> Optional[str]:
        if len(pos) > 1 + len(entry.accepts) or any(k not in entry.accepts for k in keywords):
            return f"arguments other than {', '.join(entry.accepts)} (NpuFused* takes no others)"
        if "bfloat16" in self.ctx.code:
            return "the module uses bfloat16, which NpuFused* optimizers reject"
        target = self._assigned_to(node)
        if target is None:
            return "the optimizer is not assigned to a name, so its zero_grad calls cannot be checked"
        for receiver, set_to_none in self.facts.zero_grads(self.ctx.tree):
            if receiver != target and set_to_none != "False":
                return (f"`{receiver}.zero_grad()` sets gradients to None, which breaks the "
                        "flattened gradient buffer of NpuFused*")
            if set_to_none == "other":
                return "zero_grad(set_to_none=...) is not supported by NpuFused* optimizers"
        return None

    def _assigned_to(self, node: ast.Call) -> Optional[str]:
        line = self.lines[-1] if self.lines else None
        if line is None:
            return None
        for stmt in line.stmts:
            if isinstance(stmt, ast.Assign) and stmt.value is node and len(stmt.targets) == 1:
                return ast_dotted(stmt.targets[0])
            if isinstance(stmt, ast.AnnAssign) and stmt.value is node:
                return ast_dotted(stmt.target)
        return None

    def _add_kwarg(self, entry: T.Swap, node: ast.Call) -> None:
        self.claimed.add(node)
        chosen = [k.arg for k in node.keywords if k.arg is not None and k.arg in entry.absent]
        if chosen:
            self.skip(entry, node, f"{chosen[0]}= set by the user: left as written")
            return
        if "no-star-kwargs" in entry.conditions and _has_star(node):
            self.skip(entry, node, f"*args/**kwargs may already hold {entry.keyword}=")
            return
        installed = installed_torch()
        if entry.min_torch and installed is not None and installed < _version_tuple(entry.min_torch):
            self.skip(entry, node, f"{entry.keyword}={entry.value} needs torch >= {entry.min_torch} here; "
                      f"the installed torch is {'.'.join(map(str, installed))}")
            return
        self.prepare(entry)
        value_text = entry.value
        if "{npu}" in value_text:
            value_text = value_text.format(npu=self.helper_alias())
        keyword = entry.keyword
        self.edit(entry, _Target(node), lambda u: _append_args(u, [_new_arg(keyword, cst.parse_expression(value_text))]))

    def _helper_call(self, entry: T.Swap, node: ast.Call) -> None:
        self.claimed.add(node)
        self.handled_refs.add(node.func)
        why = self._helper_problem(entry, node)
        if why:
            self.skip(entry, node, why)
            return
        self._plan_helper_ref(entry, node.func, site_node=node)

    def _helper_problem(self, entry: T.Swap, node: ast.Call) -> Optional[str]:
        if "not-tanh" in entry.conditions:
            approx = _argument(node, 1 if entry.pattern.endswith(".gelu") else 0, "approximate")
            if approx is not None and self.is_literal(approx, "tanh"):
                return "approximate='tanh' is what native gelu computes on NPU: nothing to fix"
        if "has-weight" in entry.conditions:
            weight = _argument(node, 2, "weight")
            if weight is None or self.is_literal(weight, "None"):
                return "no weight: npu_rms_norm needs one"
        if "affine" in entry.conditions:
            affine = _argument(node, 2, "elementwise_affine")
            if affine is not None and self.is_literal(affine, "False"):
                return "elementwise_affine=False: npu_rms_norm needs a weight"
        if _has_star(node):
            return "*args/**kwargs: the arguments cannot be checked"
        return None

    def _plan_helper_ref(self, entry: T.Swap, ref: ast.expr, site_node=None) -> None:
        text = f"{self.helper_alias()}.{entry.replacement}"
        self.edit(entry, _Target(ref), lambda u: _keep_parens(u, cst.parse_expression(text)), site_node=site_node)

    def _literal_arg(self, entry: T.Swap, node: ast.Call, qual: Optional[str]) -> None:
        func = node.func
        quals, methods, keywords = _callees(entry)
        if qual not in quals and not (isinstance(func, ast.Attribute) and func.attr in methods) and not (
            keywords and any(k.arg in keywords for k in node.keywords)
        ):
            return  # no device position of this call
        for callee, index, keyword in entry.positions:
            if callee == "*":
                if index is not None:
                    continue
            elif callee.startswith("."):
                if not (isinstance(func, ast.Attribute) and func.attr == callee[1:] and not self.receiver_is_module(func)):
                    continue
            elif qual != callee:
                continue
            value = _argument(node, index, keyword)
            if value is not None:
                assert self.scope is not None
                self._flow_value(entry, value, self.scope, node.lineno, 0)

    def _flow_value(self, entry: T.Swap, value: ast.expr, scope: _Scope, use_line: int, depth: int, via: str = "") -> None:
        if depth > 8:
            return
        regex, repl = entry.literal
        t = type(value)
        if t is ast.Constant:
            text = self.src.raw(value)
            if text is not None and re.search(regex, text):
                self._plan_literal(entry, _Target(value), regex, repl, use_line, via, _span(value))
        elif t is ast.JoinedStr:
            head = self._fstring_head(value)
            if head is not None and re.search(regex, head[0]):
                self._plan_literal(entry, _Target(value, "fpart"), regex, repl, use_line, via, head[1])
        elif t is ast.IfExp:
            self._flow_value(entry, value.body, scope, use_line, depth + 1, via)
            self._flow_value(entry, value.orelse, scope, use_line, depth + 1, via)
        elif t is ast.BinOp and isinstance(value.op, ast.Add):
            self._flow_value(entry, value.left, scope, use_line, depth + 1, via)
        elif t is ast.Call and isinstance(value.func, ast.Attribute) and value.func.attr == "format":
            self._flow_value(entry, value.func.value, scope, use_line, depth + 1, via)
        elif t is ast.Name:
            self.flows.append((scope, value.id, entry, use_line))
        elif t is ast.Attribute:
            text = ast_dotted(value)
            if text is not None and self.imports.qualify(value) is None:
                self.attr_flows.append((text, entry, use_line))

    def _fstring_head(self, node: ast.JoinedStr) -> Optional[Tuple[str, Tuple[int, int]]]:
        """The first text part of a one-literal f-string as libcst spells it, and its lines."""
        try:
            parsed = cst.parse_expression("(" + self.src.segment(node) + ")")
        except Exception:  # noqa: BLE001 - not an expression on its own: not a candidate
            return None
        if not isinstance(parsed, cst.FormattedString) or not parsed.parts:
            return None
        part = parsed.parts[0]
        if not isinstance(part, cst.FormattedStringText):
            return None
        return part.value, (node.lineno, node.lineno + len(_NEWLINE.findall(part.value)))

    def _plan_literal(self, entry: T.Swap, target: _Target, regex: str, repl: str, use_line: int, via: str,
                      span: Tuple[int, int]) -> None:
        if target.node in self.done_literals:
            return
        self.done_literals.add(target.node)
        reason = entry.reason
        if via:
            reason = f"{reason} ({via}, used as a device argument on line {use_line})"

        def fn(updated: cst.CSTNode) -> cst.CSTNode:
            if isinstance(updated, cst.SimpleString):
                prefix, quote = updated.prefix, updated.quote
                body = re.sub(regex, repl, updated.raw_value, count=1)
                return updated.with_changes(value=f"{prefix}{quote}{body}{quote}")
            assert isinstance(updated, cst.FormattedStringText)
            return updated.with_changes(value=re.sub(regex, repl, updated.value, count=1))

        self.edit(entry, target, fn, reason, span=span)

    def _compare(self, node: ast.Compare) -> None:
        entries = self.by_kind("compare")
        if not entries:
            return
        items = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            left, right = items[i], items[i + 1]
            if isinstance(op, (ast.Is, ast.IsNot)):
                continue
            for entry, _ in entries:
                regex = entry.literal[0]
                for side, lit in ((left, right), (right, left)):
                    lits = [lit]
                    if isinstance(op, (ast.In, ast.NotIn)) and isinstance(lit, (ast.Tuple, ast.List, ast.Set)) and side is left:
                        lits = [el.value if isinstance(el, ast.Starred) else el for el in lit.elts]
                    elif not isinstance(op, (ast.Eq, ast.NotEq)):
                        continue
                    for one in lits:
                        text = self.src.raw(one)
                        if text is None or not re.search(regex, text):
                            continue
                        if isinstance(side, ast.Attribute) and side.attr == "type" and not self.receiver_is_module(side):
                            self._plan_literal(entry, _Target(one), regex, entry.literal[1], node.lineno, "", _span(one))
                        elif isinstance(side, (ast.Name, ast.Attribute)):
                            assert self.scope is not None
                            self.compares.append((self.scope, side, one, entry))

    # ------------------------------------------------------------------ references
    def _reference(self, node: ast.expr) -> bool:
        """Plan what the table says for a dotted reference; True when it was claimed whole."""
        if isinstance(node, ast.Name):
            full = self.aliases.get(node.id)
            qual = full
        else:
            qual = self.imports.qualify(node)
            for entry, mode in self.by_kind("attribute"):
                if node.attr == entry.pattern and not self.receiver_is_module(node) and qual is None:
                    if "no-user-member" in entry.conditions and entry.pattern in self.facts.members:
                        self.skip(entry, node, f"a class in this module defines its own `{entry.pattern}`")
                    elif mode == "apply":
                        self.edit(entry, _Target(node), lambda u, e=entry: u.with_changes(attr=cst.Name(e.replacement)))
        if qual is None or node in self.handled_refs:
            return False
        for entry, mode in self.ref_entries:
            if entry.kind == "rename" and qual in entry.qualnames:
                if entry.within and not self.within_depth.get(entry.id):
                    continue
                self.handled_refs.add(node)
                if entry.transform == T.PRECISION and id(node) in self.dtype_tests:
                    return True  # compared, not created: nothing to change or report
                if mode == "warn":
                    self.warn(entry, node, self._warn_reason(entry))
                else:
                    self.prepare(entry)
                    fn = self.renamed(node, qual, entry.replacement)
                    self.edit(entry, _Target(node), fn)
                return True
            if entry.kind == "helper" and qual in entry.qualnames:
                self.handled_refs.add(node)
                if node in self.ref_ok:
                    self._plan_helper_ref(entry, node)
                else:
                    self.skip(entry, node, "referenced outside a call or argument (isinstance, comparison...): left as written")
                return True
            if entry.kind == "report-ref" and any(qual == p or qual.startswith(p + ".") for p in entry.qualnames):
                self.handled_refs.add(node)
                if qual in _OWNED:  # migratable: another device transform's business
                    return True
                self.warn(entry, node, f"{qual}: {entry.reason}")
                return True
        return False

    # ------------------------------------------------------------------ blocks
    def _scan_block(self, items: List[object], module: bool) -> None:
        for entry, mode in self.by_kind("swiglu"):
            for i, item in enumerate(items):
                match = self._chunk_assign(item)
                if match is None:
                    continue
                x, a, b = match
                for later in items[i + 1:]:
                    stmts = later.stmts if type(later) is _Line else [later]
                    rebinds: Set[str] = set()
                    for s in stmts:
                        rebinds |= _binds(s)
                    rebinds &= {x, a, b}
                    if rebinds and type(later) is not _Line:
                        break
                    for product in self._products(stmts, entry.qualnames, a, b):
                        self._plan_swiglu(entry, product, x, a, b)
                    if rebinds:
                        break
        for entry, mode in self.by_kind("insert"):
            if not module:
                continue
            last = None
            for i, item in enumerate(items):
                if type(item) is _Line and all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in item.stmts):
                    last = i
                elif i == 0 and type(item) is _Line and isinstance(item.stmts[0], ast.Expr):
                    continue
                else:
                    break
            torch_alias = next((k for k, v in self.aliases.items() if v == "torch"), None)
            if last is None or torch_alias is None:
                continue
            text = entry.replacement.format(torch=torch_alias)
            if text in self.ctx.code:  # only then can a statement be it (a rewrite of a rewrite)
                module_node = self.ctx.module
                if any(module_node.code_for_node(s).strip() == text for s in module_node.body):
                    continue
            self.module_inserts.append((last + 1, text))
            line = items[last]
            self.site(entry, (line.stmts[0].lineno, line.stmts[-1].end_lineno), REWRITTEN, entry.reason, entry.exactness)

    def _chunk_assign(self, item: object) -> Optional[Tuple[str, str, str]]:
        if type(item) is not _Line or len(item.stmts) != 1:
            return None
        assign = item.stmts[0]
        if not isinstance(assign, ast.Assign) or len(assign.targets) != 1:
            return None
        target = assign.targets[0]
        if not isinstance(target, (ast.Tuple, ast.List)) or len(target.elts) != 2:
            return None
        if not all(isinstance(n, ast.Name) for n in target.elts):
            return None
        call = assign.value
        if not isinstance(call, ast.Call) or _has_star(call):
            return None
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "chunk" and isinstance(func.value, ast.Name) and not self.receiver_is_module(func):
            x = func.value.id
            chunks = _argument(call, 0, "chunks")
            dim = _argument(call, 1, "dim")
        elif self.imports.qualify(func) == "torch.chunk":
            xs = _argument(call, 0, "input")
            if not isinstance(xs, ast.Name):
                return None
            x = xs.id
            chunks = _argument(call, 1, "chunks")
            dim = _argument(call, 2, "dim")
        else:
            return None
        if not self.int_text(chunks, "2") or dim is None or not self.is_minus_one(dim):
            return None
        a, b = target.elts[0].id, target.elts[1].id
        if len({x, a, b}) != 3:
            return None
        return x, a, b

    def _products(self, stmts: Sequence[ast.stmt], silu: Sequence[str], a: str, b: str) -> List[ast.BinOp]:
        """``silu(a) * b`` / ``b * silu(a)`` products in these statements (not inside nested defs)."""
        found: List[ast.BinOp] = []

        def is_b(e: ast.AST) -> bool:
            return isinstance(e, ast.Name) and e.id == b

        def visit(node: ast.AST) -> None:
            if isinstance(node, _SCOPES):
                return
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
                if self._silu_of_a(node.left, silu, a) and is_b(node.right):
                    found.append(node)
                elif is_b(node.left) and self._silu_of_a(node.right, silu, a):
                    found.append(node)
            for child in _children(node):
                visit(child)

        for s in stmts:
            visit(s)
        return found

    def _silu_of_a(self, node: ast.AST, silu: Sequence[str], a: str) -> bool:
        if not isinstance(node, ast.Call) or self.imports.qualify(node.func) not in silu:
            return False
        pos = _positional(node)
        if len(pos) != 1 or not isinstance(pos[0], ast.Name) or pos[0].id != a:
            return False
        if len(node.args) != 1:
            return False
        return all(k.arg == "inplace" and self.is_literal(k.value, "False") for k in node.keywords)

    def _plan_swiglu(self, entry: T.Swap, product: ast.BinOp, x: str, a: str, b: str) -> None:
        helpers = self.helper_alias()

        def fn(updated: cst.CSTNode) -> cst.CSTNode:
            new = cst.parse_expression(f"{helpers}.{entry.replacement}({x}, {a}, {b})")
            return _keep_parens(updated, new)

        self.edit(entry, _Target(product), fn)

    # ------------------------------------------------------------------ after the walk
    def _finish(self) -> None:
        """Follow device values held in names and attributes back to their literals, then the
        comparisons with a device name, then the dropped statements."""
        names_seen: Set[Tuple[int, str, str]] = set()
        attrs_seen: Set[Tuple[str, str]] = set()
        ni = ai = 0
        while ni < len(self.flows) or ai < len(self.attr_flows):
            while ni < len(self.flows):
                scope, name, entry, line = self.flows[ni]
                ni += 1
                target = scope.resolve(name)
                if (id(target), name, entry.id) in names_seen:
                    continue
                names_seen.add((id(target), name, entry.id))
                self.device_names.add((id(target), name, entry.literal[0]))
                for value, where in target.bindings.get(name, []):
                    self._flow_value(entry, value, where, line, 1, f"`{name}` holds it")
                self._argument_flow(entry, target, name, line)
            while ai < len(self.attr_flows):
                text, entry, line = self.attr_flows[ai]
                ai += 1
                if (text, entry.id) in attrs_seen:
                    continue
                attrs_seen.add((text, entry.id))
                self.device_attrs.add((text, entry.literal[0]))
                for value, where in self.attr_bindings.get(text, []):
                    self._flow_value(entry, value, where, line, 1, f"`{text}` holds it")
                self._argparse_flow(entry, text, line)
        for scope, side, lit, entry in self.compares:
            regex = entry.literal[0]
            if isinstance(side, ast.Name):
                flowing = (id(scope.resolve(side.id)), side.id, regex) in self.device_names
            else:
                flowing = (ast_dotted(side) or "", regex) in self.device_attrs
            if flowing:
                self._plan_literal(entry, _Target(lit), regex, entry.literal[1], lit.lineno, "compared with a device", _span(lit))
        for line, dropped in self.drop_candidates.items():
            if len(dropped) == len(line.stmts) and not line.suite:
                self.line_drops.append(line.stmts[0])
            elif len(dropped) == len(line.stmts):  # a one-line suite: keep it valid
                self.edits.append((_Target(dropped[0], "stmt"), lambda u: cst.Pass()))
                for n in dropped[1:]:
                    self.edits.append((_Target(n, "stmt"), lambda u: cst.RemoveFromParent()))
            else:
                for n in dropped:
                    self.edits.append((_Target(n, "stmt"), lambda u: cst.RemoveFromParent()))

    def _argument_flow(self, entry: T.Swap, scope: _Scope, name: str, line: int) -> None:
        """A parameter reaching a device argument: what this module's callers pass for it."""
        func = self.functions.get(id(scope))
        if func is None:
            return
        callee, home, positional = func
        for call, where in self.calls.get(callee, []):
            if where.resolve(callee) is not home:
                continue
            index = positional.index(name) if name in positional else None
            value = _argument(call, index, name)
            if value is not None:
                self._flow_value(entry, value, where, line, 1, f"passed as `{name}` to {callee}()")

    def _argparse_flow(self, entry: T.Swap, text: str, line: int) -> None:
        """``args.device`` reaching a device argument: the option's default and choices."""
        if "." not in text or self.scope is None:
            return
        call = self.arguments.get(text.rsplit(".", 1)[-1])
        if call is None:
            return
        default = _keyword(call, "default")
        if default is not None:
            self._flow_value(entry, default.value, self.scope, line, 1, f"default of option `{text}`")
        choices = _keyword(call, "choices")
        if choices is not None and isinstance(choices.value, (ast.List, ast.Tuple, ast.Set)):
            regex, repl = entry.literal
            for el in choices.value.elts:
                el = el.value if isinstance(el, ast.Starred) else el
                value = self.src.raw(el)
                if value is not None and re.search(regex, value):
                    self._plan_literal(entry, _Target(el), regex, repl, line, f"a choice of option `{text}`", _span(el))


_STMT = {
    ast.FunctionDef: _Analyzer._s_def,
    ast.AsyncFunctionDef: _Analyzer._s_def,
    ast.ClassDef: _Analyzer._s_class,
    ast.If: _Analyzer._s_if,
    ast.For: _Analyzer._s_for,
    ast.AsyncFor: _Analyzer._s_for,
    ast.While: _Analyzer._s_while,
    ast.With: _Analyzer._s_with,
    ast.AsyncWith: _Analyzer._s_with,
    ast.Try: _Analyzer._s_try,
    ast.Return: _Analyzer._s_return,
    ast.Assign: _Analyzer._s_assign,
    ast.AugAssign: _Analyzer._s_augassign,
    ast.AnnAssign: _Analyzer._s_annassign,
    ast.Import: _Analyzer._s_import,
    ast.ImportFrom: _Analyzer._s_importfrom,
    ast.Global: _Analyzer._s_global,
    ast.Nonlocal: _Analyzer._s_nonlocal,
}
if hasattr(ast, "TryStar"):
    _STMT[ast.TryStar] = _Analyzer._s_try
if _MATCH:
    _STMT[ast.Match] = _Analyzer._s_match

_EXPR = {
    ast.Name: _Analyzer._e_name,
    ast.Attribute: _Analyzer._e_attribute,
    ast.Call: _Analyzer._e_call,
    ast.Compare: _Analyzer._e_compare,
    ast.Lambda: _Analyzer._e_lambda,
    ast.NamedExpr: _Analyzer._e_namedexpr,
    ast.Dict: _Analyzer._e_dict,
    ast.List: _Analyzer._e_elements,
    ast.Tuple: _Analyzer._e_elements,
    ast.Set: _Analyzer._e_elements,
    ast.Subscript: _Analyzer._e_subscript,
    ast.Constant: _Analyzer._e_leaf,
    ast.BinOp: _Analyzer._e_binop,
    ast.UnaryOp: _Analyzer._e_operand,
    ast.Starred: _Analyzer._e_operand,
    ast.Await: _Analyzer._e_operand,
    ast.BoolOp: _Analyzer._e_values,
}


# ------------------------------------------------------------------------------ locating edits
class _Miss(Exception):
    """The statement-local search could not place a node: the whole-module search is used."""


class _Parents(cst.CSTVisitor):
    def __init__(self) -> None:
        self.parents: Dict[cst.CSTNode, Optional[cst.CSTNode]] = {}
        self._stack: List[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.parents[node] = self._stack[-1] if self._stack else None
        self._stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._stack.pop()


class _Recorder(PositionProvidingCodegenState):
    """What PositionProvider records (the syntactic span where a node declares one, else the
    whitespace-inclusive one) and each node's parent, for one code-generated subtree. Leaner than
    libcst's own state: a plain context manager instead of a generator-based one, and tuples."""

    def add_indent_tokens(self) -> None:
        for token in self.indent_tokens:
            self.add_token(token)

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        if "\n" in value or "\r" in value:
            segments = _NEWLINE.split(value)
            self.line += len(segments) - 1
            self.column = len(segments[-1])
        else:
            self.column += len(value)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self.starts.append((self.line, self.column))
        self.parents[node] = self.open[-1] if self.open else None
        self.open.append(node)

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self.starts.pop()
        self.open.pop()
        if node not in self.computed:
            self.computed[node] = (start, (self.line, self.column))

    def record_syntactic_position(self, node, *, start_node=None, end_node=None):  # type: ignore[override]
        return _Syntactic(self, node, start_node, end_node)


class _Syntactic:
    __slots__ = ("state", "node", "start_node", "end_node", "start")

    def __init__(self, state: _Recorder, node, start_node, end_node) -> None:
        self.state, self.node, self.start_node, self.end_node = state, node, start_node, end_node

    def __enter__(self) -> None:
        self.start = (self.state.line, self.state.column)

    def __exit__(self, *exc) -> bool:
        state = self.state
        start = state.computed[self.start_node][0] if self.start_node is not None else self.start
        end = state.computed[self.end_node][1] if self.end_node is not None else (state.line, state.column)
        state.computed[self.node] = (start, end)
        return False


def _record(module: cst.Module, root: cst.CSTNode, indents: Sequence[str], line: int, column: int, **kwargs):
    """Positions ``{node: ((line, column), (line, column))}`` and parents of ``root``'s subtree,
    generated from ``(line, column)`` inside blocks indented by ``indents``."""
    state = _Recorder(default_indent=module.default_indent, default_newline=module.default_newline, provider=None,
                      indent_tokens=list(indents))
    state.line, state.column = line, column
    state.computed, state.parents, state.open, state.starts = {}, {}, [], []
    root._codegen(state, **kwargs)
    return state.computed, state.parents


_CST_KIND = {
    ast.Call: cst.Call,
    ast.Attribute: cst.Attribute,
    ast.Name: cst.Name,
    ast.BinOp: cst.BinaryOperation,
    ast.Constant: cst.SimpleString,
    ast.JoinedStr: cst.FormattedString,
}
_SMALL_CST = {
    ast.Expr: cst.Expr, ast.Assign: cst.Assign, ast.AugAssign: cst.AugAssign, ast.AnnAssign: cst.AnnAssign,
    ast.Return: cst.Return, ast.Delete: cst.Del, ast.Pass: cst.Pass, ast.Break: cst.Break,
    ast.Continue: cst.Continue, ast.Raise: cst.Raise, ast.Assert: cst.Assert, ast.Import: cst.Import,
    ast.ImportFrom: cst.ImportFrom, ast.Global: cst.Global, ast.Nonlocal: cst.Nonlocal,
}
_COMPOUND_CST = {
    ast.If: cst.If, ast.For: cst.For, ast.AsyncFor: cst.For, ast.While: cst.While, ast.With: cst.With,
    ast.AsyncWith: cst.With, ast.Try: cst.Try, ast.FunctionDef: cst.FunctionDef,
    ast.AsyncFunctionDef: cst.FunctionDef, ast.ClassDef: cst.ClassDef,
}
if hasattr(ast, "TypeAlias") and hasattr(cst, "TypeAlias"):
    _SMALL_CST[ast.TypeAlias] = cst.TypeAlias
if _MATCH:
    _COMPOUND_CST[ast.Match] = cst.Match
if hasattr(ast, "TryStar"):
    _COMPOUND_CST[ast.TryStar] = cst.TryStar
_STUB_BODY = cst.IndentedBlock(body=[cst.SimpleStatementLine(body=[cst.Pass()])])
_DUP = object()


def _contains(s: ast.AST, key: Tuple[int, int, int, int]) -> bool:
    decorators = getattr(s, "decorator_list", None)
    start = (decorators[0].lineno, 0) if decorators else (s.lineno, s.col_offset)
    return start <= key[:2] and key[2:] <= (s.end_lineno, s.end_col_offset)


def _index(items: Sequence[object], item: object) -> int:
    for i, x in enumerate(items):
        if x is item:
            return i
    raise _Miss


class _Locator:
    """The libcst nodes of the planned edits, and every node on the way to them."""

    def __init__(self, ctx: FileContext, src: _Source, fast: bool = True) -> None:
        self.ctx = ctx
        self.module = ctx.module
        self.tree = ctx.tree
        self.src = src
        self.fast = fast
        #: the parent of every node on the way from the module to an edited node
        self.parent: Dict[cst.CSTNode, cst.CSTNode] = {}
        self._anchors: Dict[int, tuple] = {}
        self._whole: Optional[tuple] = None

    # -------------------------------------------------------------- statement path
    def _stmt_path(self, node: ast.AST) -> List[ast.AST]:
        """The statements (and except handlers) from the module down to ``node``'s innermost one."""
        key = (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)
        path: List[ast.AST] = []
        body: Sequence[ast.AST] = self.tree.body
        while True:
            for s in body:
                if s is node or _contains(s, key):
                    break
            else:
                raise _Miss
            path.append(s)
            if s is node or isinstance(s, _SIMPLE):
                return path
            inner = None
            if _MATCH and isinstance(s, _MATCH):
                for case in s.cases:  # a case has no position of its own: its body does
                    if any(c is node or _contains(c, key) for c in case.body):
                        path.append(case)
                        inner = case.body
                        break
                else:
                    raise _Miss  # subject, pattern or guard: the whole-module search
                body = inner
                continue
            for lst in (s.body, getattr(s, "orelse", ()), getattr(s, "finalbody", ())):
                if any(c is node or _contains(c, key) for c in lst):
                    inner = lst
                    break
            if inner is None:
                for h in getattr(s, "handlers", ()):
                    if _contains(h, key):
                        path.append(h)
                        if not any(c is node or _contains(c, key) for c in h.body):
                            return path
                        inner = h.body
                        break
            if inner is None:
                return path  # in the statement's header
            body = inner

    def _descend(self, path: Sequence[ast.AST]):
        """The libcst chain from the module to the last element of ``path``, the indentation of
        its block, and whether it is an ``elif``."""
        module = self.module
        chain: List[cst.CSTNode] = [module]
        indents: List[str] = []
        ast_list: Sequence[ast.AST] = self.tree.body
        cst_list: Sequence[cst.CSTNode] = module.body
        suite = is_elif = False
        for depth, s in enumerate(path):
            if depth:
                parent, pc = path[depth - 1], chain[-1]
                is_elif = False
                if isinstance(s, ast.ExceptHandler):
                    handler = pc.handlers[_index(parent.handlers, s)]
                    chain.append(handler)
                    continue
                if _MATCH and isinstance(s, ast.match_case):
                    chain.append(pc.cases[_index(parent.cases, s)])
                    continue
                if any(x is s for x in parent.body):
                    ast_list, container = parent.body, pc.body
                elif any(x is s for x in getattr(parent, "orelse", ())):
                    ast_list, orelse = parent.orelse, pc.orelse
                    if isinstance(orelse, cst.If):  # elif
                        if not isinstance(s, ast.If) or len(ast_list) != 1:
                            raise _Miss
                        chain.append(orelse)
                        is_elif = True
                        continue
                    chain.append(orelse)
                    container = orelse.body
                elif any(x is s for x in getattr(parent, "finalbody", ())):
                    ast_list = parent.finalbody
                    chain.append(pc.finalbody)
                    container = pc.finalbody.body
                else:
                    raise _Miss
                chain.append(container)
                if isinstance(container, cst.IndentedBlock):
                    indents.append(module.default_indent if container.indent is None else container.indent)
                    suite = False
                else:
                    suite = True
                cst_list = container.body
            i = _index(ast_list, s)
            if suite:
                if i >= len(cst_list):
                    raise _Miss
                chain.append(cst_list[i])
            else:
                n = 0
                for el in cst_list:
                    if isinstance(el, cst.SimpleStatementLine):
                        k = len(el.body)
                        if n <= i < n + k:
                            chain += [el, el.body[i - n]]
                            break
                        n += k
                    else:
                        if n == i:
                            chain.append(el)
                            break
                        n += 1
                else:
                    raise _Miss
            expected = _SMALL_CST.get(type(s)) or _COMPOUND_CST.get(type(s))
            if expected is None or not isinstance(chain[-1], expected):
                raise _Miss
        return chain, indents, is_elif

    # -------------------------------------------------------------- positions
    def _anchor(self, path: Sequence[ast.AST]):
        """Positions of the nodes of ``path``'s last statement (a compound statement: its header),
        from a code generation of that statement alone."""
        s = path[-1]
        hit = self._anchors.get(id(s))
        if hit is not None:
            return hit
        chain, indents, is_elif = self._descend(path)
        c = chain[-1]
        if isinstance(s, _SIMPLE):
            computed, parents = _record(self.module, c, indents, s.lineno, self.src.col(s.lineno, s.col_offset))
            root, shift = c, 0
        else:
            changes = {"body": _STUB_BODY}
            if isinstance(c, (cst.If, cst.For, cst.While)):
                changes["orelse"] = None
            if isinstance(c, (cst.Try, cst.TryStar, cst.Match)) or (_MATCH and isinstance(s, ast.match_case)):
                raise _Miss  # no header expression, or a header the whole-module search places
            root = c.with_changes(**changes)
            kwargs = {"is_elif": True} if is_elif else {}
            computed, parents = _record(self.module, root, indents, 1, 0, **kwargs)
            start = computed[root][0]
            if start[1] != self.src.col(s.lineno, s.col_offset):
                raise _Miss
            shift = s.lineno - start[0]
        index: Dict[tuple, object] = {}
        for node, ((l1, c1), (l2, c2)) in computed.items():
            k = (type(node), l1 + shift, c1, l2 + shift, c2)
            index[k] = _DUP if k in index else node
        hit = self._anchors[id(s)] = (index, parents, root, chain)
        return hit

    def _whole_module(self):
        """Every node by position (libcst's PositionProvider over the whole module) and parent."""
        if self._whole is None:
            index: Dict[tuple, object] = {}
            for node, r in self.ctx.positions.items():
                k = (type(node), r.start.line, r.start.column, r.end.line, r.end.column)
                index[k] = _DUP if k in index else node
            parents = _Parents()
            self.module.visit(parents)
            self._whole = (index, parents.parents)
        return self._whole

    def _by_text(self, node: ast.AST, kind: type) -> Optional[cst.CSTNode]:
        """The one node of that kind on those lines spelled as the source spells ``node``: where
        libcst's columns are not ``ast``'s (a form feed it does not count)."""
        text = self.src.segment(node)
        found = []
        for k, n in self._whole_module()[0].items():
            if k[0] is kind and k[1] == node.lineno and k[3] == node.end_lineno and n is not _DUP:
                bare = n.with_changes(lpar=(), rpar=()) if getattr(n, "lpar", None) else n
                if self.module.code_for_node(bare) == text:
                    found.append(n)
        return found[0] if len(found) == 1 else None

    def _key(self, node: ast.AST, kind: type) -> tuple:
        col = self.src.col
        return (kind, node.lineno, col(node.lineno, node.col_offset), node.end_lineno, col(node.end_lineno, node.end_col_offset))

    def _find(self, node: ast.AST, kind: type) -> cst.CSTNode:
        key = self._key(node, kind)
        if self.fast:
            index, parents, root, chain = self._anchor(self._stmt_path(node))
        else:
            (index, parents), root, chain = self._whole_module(), self.module, [self.module]
        found = index.get(key)
        if found is None and not self.fast:
            found = self._by_text(node, kind)
        if found is None or found is _DUP:
            raise _Miss
        up = found
        while up is not root:
            above = parents.get(up)
            if above is None:
                raise _Miss
            self.parent[up] = chain[-1] if above is root else above  # a header stub stands for its statement
            up = above
        self._link(chain)
        return found

    def _link(self, chain: Sequence[cst.CSTNode]) -> None:
        for above, node in zip(chain, chain[1:]):
            self.parent[node] = above

    # -------------------------------------------------------------- targets
    def node(self, target: _Target) -> cst.CSTNode:
        node = target.node
        if target.kind == "stmt":  # reached by structure alone, no position needed
            chain, _, _ = self._descend(self._stmt_path(node))
            self._link(chain)
            return chain[-1]
        if target.kind == "fpart":
            found = self._find(node, cst.FormattedString)
            part = found.parts[0] if found.parts else None
            if not isinstance(part, cst.FormattedStringText):
                raise _Miss
            self.parent[part] = found
            return part
        return self._find(node, _CST_KIND[type(node)])

    def line(self, stmt: ast.stmt) -> Tuple[cst.CSTNode, int]:
        """The block holding ``stmt``'s statement line, and the line's index in it."""
        chain, _, _ = self._descend(self._stmt_path(stmt))
        self._link(chain[:-2])  # down to the block: the line itself goes
        line, block = chain[-2], chain[-3]
        if not isinstance(line, cst.SimpleStatementLine) or not isinstance(block, (cst.IndentedBlock, cst.Module)):
            raise _Miss
        return block, _index(block.body, line)

    def plan(self, an: "_Analyzer"):
        edits: Dict[cst.CSTNode, List[Edit]] = {}
        for target, fn in an.edits:
            edits.setdefault(self.node(target), []).append(fn)
        drops: Dict[cst.CSTNode, Set[int]] = {}
        for stmt in an.line_drops:
            block, i = self.line(stmt)
            drops.setdefault(block, set()).add(i)
        return edits, drops


def _edited(node, fns: Sequence[Edit]):
    for fn in fns:
        if isinstance(node, cst.RemovalSentinel):
            break
        node = fn(node)
    return node


def _with_children(node: cst.CSTNode, new: Dict[cst.CSTNode, object]) -> cst.CSTNode:
    """``node`` with some of its children replaced (removed from a sequence when RemoveFromParent),
    as libcst's own transformer would rebuild it."""
    changes = {}
    seen = 0
    for field in dataclasses.fields(node):
        value = getattr(node, field.name)
        if isinstance(value, cst.CSTNode):
            if value in new:
                if isinstance(new[value], cst.RemovalSentinel):
                    raise _Miss  # not in a sequence: libcst's transformer decides
                changes[field.name] = new[value]
                seen += 1
        elif isinstance(value, (tuple, list)):
            hits = [v for v in value if isinstance(v, cst.CSTNode) and v in new]
            if hits:
                seen += len(hits)
                changes[field.name] = [
                    new.get(v, v) for v in value if not isinstance(new.get(v, v), cst.RemovalSentinel)
                ]
    if seen != len(new):
        raise _Miss
    return node.with_changes(**changes)


def _rebuild(module: cst.Module, edits, drops, inserts, parent: Dict[cst.CSTNode, cst.CSTNode]) -> cst.Module:
    """The module with the edits made, rebuilding only the edited nodes and their ancestors
    (deepest first), so nothing else is visited."""
    depth: Dict[cst.CSTNode, int] = {module: 0}

    def depth_of(node: cst.CSTNode) -> int:
        chain = []
        while node not in depth:
            chain.append(node)
            node = parent[node]  # KeyError: not linked to the module
        d = depth[node]
        for n in reversed(chain):
            d += 1
            depth[n] = d
        return depth[chain[0]] if chain else d

    nodes = set(parent) | set(edits) | set(drops) | {module}
    pending: Dict[cst.CSTNode, Dict[cst.CSTNode, object]] = {}
    for node in sorted(nodes, key=depth_of, reverse=True):
        new = node
        children = pending.pop(node, None)
        if children:
            new = _with_children(node, children)
        if node in edits:
            new = _edited(new, edits[node])
        if node in drops and not isinstance(new, cst.RemovalSentinel):
            new = _drop_statements(new, drops[node])
        if node is module:
            return _inserted(new, inserts)
        pending.setdefault(parent[node], {})[node] = new
    raise _Miss


def _inserted(module: cst.Module, inserts: Sequence[Tuple[int, str]]) -> cst.Module:
    if not inserts:
        return module
    body = list(module.body)
    for index, text in sorted(inserts, reverse=True):
        body.insert(index, cst.parse_statement(text + "\n"))
    return module.with_changes(body=body)


class _Apply(cst.CSTTransformer):
    """The same edits through libcst's transformer over the whole module (the fallback)."""

    def __init__(self, module: cst.Module, edits, drops, inserts) -> None:
        self.module, self.edits, self.drops, self.inserts = module, edits, drops, inserts

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        fns = self.edits.get(original_node)
        if fns:
            updated_node = _edited(updated_node, fns)
        drops = self.drops.get(original_node)
        if drops:
            updated_node = _drop_statements(updated_node, drops)
        if original_node is self.module:
            updated_node = _inserted(updated_node, self.inserts)
        return updated_node


def _version_tuple(text: str) -> Tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:2])


def installed_torch() -> Optional[Tuple[int, ...]]:
    """(major, minor) of the torch installed with the engine: the code it rewrites runs on it.
    Part of the pipeline fingerprint (config.py), so an upgrade re-decides these rewrites."""
    version = installed_version("torch")
    return None if version is None else _version_tuple(version)


def _apply(ctx: FileContext, an: _Analyzer) -> cst.Module:
    """The module with ``an``'s edits made: nodes found statement by statement (by positions over
    the whole module only where that cannot place one), then only their ancestors rebuilt."""
    try:
        locator = _Locator(ctx, an.src)
        edits, drops = locator.plan(an)
    except Exception:  # noqa: BLE001 - _Miss, or a libcst whose code generation this search misreads
        locator = _Locator(ctx, an.src, fast=False)
        edits, drops = locator.plan(an)
    module = ctx.module
    try:
        return _rebuild(module, edits, drops, an.module_inserts, locator.parent)
    except (_Miss, KeyError):  # an unusual shape: libcst's transformer over the whole module
        return module.visit(_Apply(module, edits, drops, an.module_inserts))


# ---------------------------------------------------------------------------------- transforms
class _DeviceTransform(Transform):
    """One transform id; its entries are the table's entries for that id."""

    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        analyzer = _Analyzer(ctx, self.id, _ENTRIES[self.id])
        if not analyzer.entries:  # nothing in the module can match: no libcst parse at all
            return ctx.__dict__.get("module"), []  # None: unchanged (the pipeline parses lazily)
        analyzer.run()
        if not analyzer.edits and not analyzer.line_drops and not analyzer.module_inserts:
            return ctx.__dict__.get("module"), analyzer.sites
        return _apply(ctx, analyzer), analyzer.sites


_ENTRIES = {t: T.entries_for(t) for t in (T.PLACEMENT, T.AUTOCAST, T.OPTIMIZER, T.FUSED_OP, T.PRECISION, T.UNSUPPORTED)}


def _backends(transform_id: str) -> Tuple[str, ...]:
    found: List[str] = []
    for e in T.entries_for(transform_id):
        for b in e.backends:
            if b not in found:
                found.append(b)
    return tuple(found)


def _examples(transform_id: str) -> Tuple[Example, ...]:
    out = []
    for e in T.entries_for(transform_id):
        if e.before and e.after != e.before:
            out.append(Example(e.before, True, note=e.id, backend=e.golden_backend, options=e.example_options))
    return tuple(out)


class DevicePlacement(_DeviceTransform):
    """Tensors, modules and device strings to the NPU; torch.cuda twins; cuDNN flags; nccl."""

    id = T.PLACEMENT
    version = "1"
    triggers = ("cuda", "cudnn", "nccl")
    backends = _backends(T.PLACEMENT)
    description = "cuda placement -> npu (torch_npu)"
    EXAMPLES = _examples(T.PLACEMENT) + (
        Example(
            "import torch\nclass Pool:\n    def cuda(self):\n        return self\npool = Pool().cuda()\n",
            False,
            reason="defines its own `cuda`",
            note="user-defined cuda method",
            backend="npu",
        ),
    )


class DeviceAutocast(_DeviceTransform):
    """CUDA autocast and GradScaler to their NPU forms."""

    id = T.AUTOCAST
    version = "1"
    triggers = ("autocast", "GradScaler")
    backends = _backends(T.AUTOCAST)
    description = "cuda autocast / GradScaler -> npu"
    EXAMPLES = _examples(T.AUTOCAST)


class DeviceOptimizer(_DeviceTransform):
    """Fused optimizers (cuda, npu), foreach optimizers (cpu), foreach clipping."""

    id = T.OPTIMIZER
    version = "1"
    triggers = ("Adam", "SGD", "clip_grad_norm")
    backends = _backends(T.OPTIMIZER)
    description = "fused / foreach optimizer and clipping paths"
    EXAMPLES = _examples(T.OPTIMIZER) + (
        Example(
            "import torch\nopt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)\n",
            False,
            reason="set by the user",
            note="user chose foreach",
            backend="cuda",
        ),
    )


class DeviceFusedOp(_DeviceTransform):
    """Guarded fused NPU kernels where the semantics are the user's: gelu, rms_norm, swiglu."""

    id = T.FUSED_OP
    version = "1"
    triggers = ("gelu", "GELU", "rms_norm", "RMSNorm", "silu")
    backends = _backends(T.FUSED_OP)
    description = "gelu / rms_norm / swiglu -> torch_npu fused kernels (guarded)"
    EXAMPLES = _examples(T.FUSED_OP) + (
        Example(
            "import torch.nn.functional as F\ny = F.gelu(h, approximate='tanh')\n",
            False,
            reason="nothing to fix",
            note="tanh gelu",
            backend="npu",
        ),
    )


class DevicePrecision(_DeviceTransform):
    """float64 sites on NPU (reported; float32 only on request) and TF32 on request on CUDA."""

    id = T.PRECISION
    version = "1"
    triggers = ("float64", "double", "Double")
    backends = _backends(T.PRECISION)
    description = "float64 on NPU; TF32 on request"
    EXAMPLES = _examples(T.PRECISION)

    def applies(self, ctx: FileContext) -> bool:
        if ctx.backend == "cuda":
            return bool(ctx.option(T.SECTION, "allow_tf32", False)) and "torch" in ctx.code
        return super().applies(ctx)


class DeviceUnsupported(_DeviceTransform):
    """What cannot be migrated to NPU, reported with a ``not-migratable:<kind>`` site kind."""

    id = T.UNSUPPORTED
    version = "1"
    triggers = ("cuda", "cupy", "triton", "cpp_extension", "transfer_to_npu")
    backends = _backends(T.UNSUPPORTED)
    description = "report what has no NPU counterpart"
    EXAMPLES = ()


DEVICE_TRANSFORMS = (DevicePlacement, DeviceAutocast, DeviceOptimizer, DeviceFusedOp, DevicePrecision, DeviceUnsupported)
