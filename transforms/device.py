"""Device swaps (Ascend NPU through torch_npu, CUDA fused paths, CPU foreach) read from one table.

Every swap is an entry of :mod:`device_table` (data); this module is the engine that interprets an
entry's ``kind``. Matching is by qualified name through the module's imports and by argument
position (``torch.device(...)``'s first argument, any ``device=`` keyword, ``.to(...)``, ...), so
``import torch as th`` works and a ``"cuda"`` in a print is never touched. A device string held in
a variable is followed back to its assignment, parameter default or argparse default when the
variable reaches a device argument (or is passed to this module's own function or class).

Each transform runs in up to three steps: an ``ast`` prefilter (a transform none of whose entries
can match returns at once, without a libcst visit), an analysis visit over the original libcst
tree that plans edits keyed by original node and reports every site, and one transformer pass
that enters only the paths leading to an edit, so every byte outside the edited nodes is kept.
"""
from __future__ import annotations

import ast
import re
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from scalebox_cst.report import REWRITTEN, SKIPPED, WARNING, Site

from . import device_table as T
from .base import Example, FileContext, Transform
from .names import dotted

Edit = Callable[[cst.CSTNode], cst.CSTNode]
_OWNED = T.owned_qualnames()


def _str_value(node: cst.CSTNode) -> Optional[str]:
    if isinstance(node, cst.SimpleString) and "b" not in node.prefix.lower():
        return node.raw_value
    return None


def _is_literal(node: cst.CSTNode, *values: str) -> bool:
    if isinstance(node, cst.Name) and node.value in values:
        return True
    text = _str_value(node)
    return text is not None and text in values


def _is_minus_one(node: cst.CSTNode) -> bool:
    return (
        isinstance(node, cst.UnaryOperation)
        and isinstance(node.operator, cst.Minus)
        and isinstance(node.expression, cst.Integer)
        and node.expression.value == "1"
    )


def _positional(call: cst.Call) -> List[cst.Arg]:
    return [a for a in call.args if a.keyword is None and not a.star]


def _keyword(call: cst.Call, name: str) -> Optional[cst.Arg]:
    for a in call.args:
        if a.keyword is not None and a.keyword.value == name:
            return a
    return None


def _argument(call: cst.Call, index: Optional[int], keyword: Optional[str]) -> Optional[cst.BaseExpression]:
    if keyword:
        arg = _keyword(call, keyword)
        if arg is not None:
            return arg.value
    if index is not None:
        pos = _positional(call)
        if index < len(pos) and not any(a.star for a in call.args[: call.args.index(pos[index])]):
            return pos[index].value
    return None


def _has_star(call: cst.Call) -> bool:
    return any(a.star for a in call.args)


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


class _Scope:
    """A Python scope, just enough to tell which assignment a name read refers to."""

    def __init__(self, kind: str, parent: Optional["_Scope"]) -> None:
        self.kind = kind  # module | function | class
        self.parent = parent
        self.locals: Set[str] = set()
        self.declared_global: Set[str] = set()
        self.declared_nonlocal: Set[str] = set()
        self.bindings: Dict[str, List[Tuple[cst.BaseExpression, "_Scope"]]] = {}

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
    """Module-wide facts, read from Python's ``ast`` (ten times cheaper than a libcst visit):
    what a cheap prefilter needs, and what some conditions need before any decision."""

    def __init__(self, tree: ast.AST, aliases: Dict[str, str]) -> None:
        self.members: Set[str] = set()  # methods and self.<attr> names defined in the module
        self.bound: Set[str] = set()  # every name the module binds somewhere
        self.zero_grads: List[Tuple[Optional[str], str]] = []  # (receiver, set_to_none: absent|False|other)
        self.attrs: Set[str] = set()
        self.qualified: Set[str] = set()
        self.strings: List[str] = []
        self.imported: List[str] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                self.bound.add(node.name)
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub is not node:
                        self.members.add(sub.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.bound.add(node.name)
            elif isinstance(node, ast.arg):
                self.bound.add(node.arg)
            elif isinstance(node, ast.Name):
                if not isinstance(node.ctx, ast.Load):
                    self.bound.add(node.id)
                self._qualify(node.id, aliases)
            elif isinstance(node, ast.Attribute):
                self.attrs.add(node.attr)
                if isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    self.members.add(node.attr)
                text = _ast_dotted(node)
                if text is not None:
                    self._qualify(text, aliases)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                self.strings.append(node.value)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                self.bound.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    self.bound.add(alias.asname or alias.name.split(".")[0])
                    if isinstance(node, ast.Import):
                        self.imported.append(alias.name)
                    elif node.module and not node.level:
                        self.imported.append(f"{node.module}.{alias.name}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "zero_grad":
                value = next((k.value for k in node.keywords if k.arg == "set_to_none"), node.args[0] if node.args else None)
                kind = "absent" if value is None else ("False" if isinstance(value, ast.Constant) and value.value is False else "other")
                self.zero_grads.append((_ast_dotted(node.func.value), kind))

    def _qualify(self, text: str, aliases: Dict[str, str]) -> None:
        head, _, rest = text.partition(".")
        full = aliases.get(head)
        if full is not None:
            self.qualified.add(full + ("." + rest if rest else ""))

    def may_match(self, entry: T.Swap) -> bool:
        """False when ``entry`` cannot match anything in this module (no libcst visit needed)."""
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


def _ast_dotted(node: ast.AST) -> Optional[str]:
    parts: List[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _argparse_dest(node: cst.Call) -> Optional[str]:
    kw = _keyword(node, "dest")
    if kw is not None:
        return _str_value(kw.value)
    flags = [f for f in (_str_value(a.value) for a in _positional(node)) if f]
    longs = [f for f in flags if f.startswith("--")]
    name = longs[0] if longs else (flags[0] if flags else None)
    return name.lstrip("-").replace("-", "_") if name else None


class _Binder(cst.CSTVisitor):
    """Names a statement binds (assignment, loop, with, import, def...), for the swiglu guard."""

    def __init__(self) -> None:
        self.names: Set[str] = set()

    def _target(self, t: cst.BaseExpression) -> None:
        if isinstance(t, cst.Name):
            self.names.add(t.value)
        elif isinstance(t, (cst.Tuple, cst.List)):
            for el in t.elements:
                self._target(el.value)
        elif isinstance(t, cst.StarredElement):
            self._target(t.value)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._target(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._target(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._target(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._target(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._target(node.target)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._target(node.asname.name)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._target(node.target)

    def visit_Del(self, node: cst.Del) -> None:
        self._target(node.target)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.names.add(node.name.value)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.names.add(node.name.value)

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        if node.asname is not None and isinstance(node.asname.name, cst.Name):
            self.names.add(node.asname.name.value)
        else:
            self.names.add(dotted(node.name).split(".")[0] if dotted(node.name) else "")

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if node.name is not None:
            self._target(node.name.name)


def _binds(stmt: cst.CSTNode) -> Set[str]:
    b = _Binder()
    stmt.visit(b)
    return b.names


class _Products(cst.CSTVisitor):
    """``silu(a) * b`` / ``b * silu(a)`` products in one statement (not inside nested defs)."""

    def __init__(self, analyzer: "_Analyzer", silu: Sequence[str], a: str, b: str) -> None:
        self.an, self.silu, self.a, self.b = analyzer, silu, a, b
        self.found: List[Tuple[cst.BinaryOperation, bool]] = []

    def _silu_of_a(self, node: cst.BaseExpression) -> bool:
        if not isinstance(node, cst.Call) or self.an.imports.qualify(node.func) not in self.silu:
            return False
        pos = _positional(node)
        if len(pos) != 1 or not isinstance(pos[0].value, cst.Name) or pos[0].value.value != self.a:
            return False
        others = [a for a in node.args if a is not pos[0]]
        return all(a.keyword is not None and a.keyword.value == "inplace" and _is_literal(a.value, "False") for a in others)

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if not isinstance(node.operator, cst.Multiply):
            return
        is_b = lambda e: isinstance(e, cst.Name) and e.value == self.b  # noqa: E731
        if self._silu_of_a(node.left) and is_b(node.right):
            self.found.append((node, False))
        elif is_b(node.left) and self._silu_of_a(node.right):
            self.found.append((node, True))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False


class _Analyzer(cst.CSTVisitor):
    """Plans the edits of one transform's active entries over the original tree."""

    def __init__(self, ctx: FileContext, transform_id: str, entries: Sequence[T.Swap]) -> None:
        self.ctx = ctx
        self.tid = transform_id
        self.imports = ctx.imports
        self.entries: List[Tuple[T.Swap, str]] = []  # (entry, mode) mode: "apply" | "warn"
        for e in entries:
            if ctx.backend not in e.backends:
                continue
            if e.option and not ctx.option(T.SECTION, e.option, False):
                if e.without_option == "warn":
                    self.entries.append((e, "warn"))
                continue
            self.entries.append((e, "apply"))
        self.facts = _Facts(ctx.tree, ctx.imports.aliases)  # ctx.tree: shared per module version
        self.entries = [(e, m) for e, m in self.entries if self.facts.may_match(e)]
        self.arguments: Dict[str, cst.Call] = {}  # argparse dest -> its add_argument call
        self.sites: List[Site] = []
        self.edits: Dict[cst.CSTNode, List[Edit]] = {}
        self.block_drops: Dict[cst.CSTNode, Set[int]] = {}
        self.module_inserts: List[Tuple[int, str]] = []
        self.scope: Optional[_Scope] = None
        self.attr_bindings: Dict[str, List[Tuple[cst.BaseExpression, _Scope]]] = {}
        self.flows: List[Tuple[_Scope, str, T.Swap, int]] = []
        self.attr_flows: List[Tuple[str, T.Swap, int]] = []
        self.device_names: Set[Tuple[int, str, str]] = set()  # (id(scope), name, literal regex)
        self.device_attrs: Set[Tuple[str, str]] = set()
        self.compares: List[Tuple[_Scope, cst.BaseExpression, cst.SimpleString, T.Swap]] = []
        self.done_literals: Set[cst.CSTNode] = set()
        self.claimed: Set[cst.CSTNode] = set()
        self.handled_refs: Set[cst.CSTNode] = set()
        self.ref_ok: Set[cst.CSTNode] = set()
        self.within_depth: Dict[str, int] = {}
        self.lines: List[cst.CSTNode] = []  # enclosing SimpleStatementLine / Suite
        self.blocks: List[cst.CSTNode] = []
        self.drop_candidates: Dict[cst.CSTNode, List[Tuple[cst.CSTNode, cst.CSTNode]]] = {}
        self._npu: Optional[str] = None
        self._helpers: Optional[str] = None
        # id(function scope) -> (name callers use, scope the name lives in, positional parameters)
        self.functions: Dict[int, Tuple[str, Optional[_Scope], List[str]]] = {}
        self.class_names: List[str] = []
        self.parents: Dict[cst.CSTNode, Optional[cst.CSTNode]] = {}
        self._stack: List[cst.CSTNode] = []
        self.calls: Dict[str, List[Tuple[cst.Call, _Scope]]] = {}  # plain-name calls, by name

    # ------------------------------------------------------------------ helpers
    def on_visit(self, node: cst.CSTNode) -> bool:
        self.parents[node] = self._stack[-1] if self._stack else None
        self._stack.append(node)
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        self._stack.pop()

    def on_path(self) -> Set[cst.CSTNode]:
        """The edited nodes and all their ancestors: the only nodes the apply pass must enter."""
        path: Set[cst.CSTNode] = set()
        for node in (*self.edits, *self.block_drops):
            while node is not None and node not in path:
                path.add(node)
                node = self.parents.get(node)
        path.add(self.ctx.module)
        return path

    def by_kind(self, *kinds: str) -> List[Tuple[T.Swap, str]]:
        return [(e, m) for e, m in self.entries if e.kind in kinds]

    def site(self, entry: T.Swap, node: cst.CSTNode, action: str, reason: str, exactness=None, kind=None) -> None:
        self.sites.append(self.ctx.site(self.tid, node, action, reason, exactness, kind or entry.site_kind))

    def skip(self, entry: T.Swap, node: cst.CSTNode, why: str) -> None:
        self.site(entry, node, SKIPPED, f"{entry.id}: {why}")

    def prepare(self, entry: T.Swap) -> None:
        """Before an edit's text is built: the fail-fast torch_npu import comes first."""
        if self._emits_npu(entry):
            self.npu_alias()

    def edit(self, entry: T.Swap, node: cst.CSTNode, fn: Edit, reason: Optional[str] = None, site_node=None) -> None:
        self.prepare(entry)
        self.edits.setdefault(node, []).append(fn)
        self.site(entry, site_node or node, REWRITTEN, reason or entry.reason, entry.exactness)

    def warn(self, entry: T.Swap, node: cst.CSTNode, reason: str) -> None:
        self.site(entry, node, WARNING, reason, None)

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
        for local, full in self.imports.aliases.items():
            if full == top:
                return local
        # a name that only occurs in import paths (``from torch.cuda import x``) is free to bind
        alias = top if top not in self.facts.bound and top not in self.imports.aliases else self.imports.unique_name(top)
        self.imports.names.add(alias)
        self.imports.aliases[alias] = top
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

    def renamed(self, node: cst.BaseExpression, old: str, new: str) -> cst.BaseExpression:
        """``node`` (meaning ``old``) rewritten to mean ``new``: one attribute swapped where the
        source spells that component out, else a fresh reference through the imports."""
        old_parts, new_parts = old.split("."), new.split(".")
        text = dotted(node)
        if text is not None and len(old_parts) == len(new_parts):
            diff = [i for i, (a, b) in enumerate(zip(old_parts, new_parts)) if a != b]
            head = text.split(".")[0]
            head_len = len(self.imports.aliases.get(head, head).split("."))
            local_parts = text.split(".")
            if len(diff) == 1 and diff[0] >= head_len:
                k = diff[0] - head_len + 1  # index in the local chain
                depth = len(local_parts) - 1 - k  # how many .attr to walk down from node
                return self._swap_attr(node, depth, new_parts[diff[0]])
        return _keep_parens(node, cst.parse_expression(self.ref_text(new)))

    def _swap_attr(self, node: cst.BaseExpression, depth: int, name: str) -> cst.BaseExpression:
        if depth == 0:
            assert isinstance(node, cst.Attribute)
            return node.with_changes(attr=cst.Name(name))
        assert isinstance(node, cst.Attribute)
        return node.with_changes(value=self._swap_attr(node.value, depth - 1, name))

    def receiver_is_module(self, func: cst.Attribute) -> bool:
        return self.imports.qualify(func.value) is not None

    # ------------------------------------------------------------------ scopes and bindings
    def _push(self, kind: str) -> _Scope:
        self.scope = _Scope(kind, self.scope)
        return self.scope

    def _pop(self) -> None:
        assert self.scope is not None
        self.scope = self.scope.parent

    def _bind_target(self, target: cst.BaseExpression, value: Optional[cst.BaseExpression]) -> None:
        assert self.scope is not None
        if isinstance(target, cst.Name):
            self.scope.locals.add(target.value)
            if value is not None:
                self.scope.bindings.setdefault(target.value, []).append((value, self.scope))
        elif isinstance(target, (cst.Tuple, cst.List)):
            for el in target.elements:
                self._bind_target(el.value, None)
        elif isinstance(target, cst.StarredElement):
            self._bind_target(target.value, None)
        elif isinstance(target, cst.Attribute) and value is not None:
            text = dotted(target)
            if text is not None:
                self.attr_bindings.setdefault(text, []).append((value, self.scope))

    def visit_Module(self, node: cst.Module) -> None:
        self._push("module")
        self.blocks.append(node)
        self._scan_block(node, node.body)

    def leave_Module(self, node: cst.Module) -> None:
        self.blocks.pop()
        self._finish()

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.blocks.append(node)
        self._scan_block(node, node.body)

    def leave_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.blocks.pop()

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self.lines.append(node)

    def leave_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self.lines.pop()

    def visit_SimpleStatementSuite(self, node: cst.SimpleStatementSuite) -> None:
        self.lines.append(node)

    def leave_SimpleStatementSuite(self, node: cst.SimpleStatementSuite) -> None:
        self.lines.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        assert self.scope is not None
        outer = self.scope
        outer.locals.add(node.name.value)
        scope = self._push("function")
        params = node.params
        positional = [p.name.value for p in (*params.posonly_params, *params.params)]
        if outer.kind == "class" and node.name.value == "__init__":
            # Agent(envs, "cuda") binds __init__'s parameters after self
            self.functions[id(scope)] = (self.class_names[-1] if self.class_names else "", outer.parent, positional[1:])
        elif outer.kind != "class":
            self.functions[id(scope)] = (node.name.value, outer, positional)
        for p in (*params.posonly_params, *params.params, *params.kwonly_params):
            scope.locals.add(p.name.value)
            if p.default is not None:
                scope.bindings.setdefault(p.name.value, []).append((p.default, outer))
        for star in (params.star_arg, params.star_kwarg):
            if isinstance(star, cst.Param):
                scope.locals.add(star.name.value)

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._pop()

    def visit_Lambda(self, node: cst.Lambda) -> None:
        scope = self._push("function")
        for p in (*node.params.posonly_params, *node.params.params, *node.params.kwonly_params):
            scope.locals.add(p.name.value)

    def leave_Lambda(self, node: cst.Lambda) -> None:
        self._pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        assert self.scope is not None
        self.scope.locals.add(node.name.value)
        self.class_names.append(node.name.value)
        self._push("class")

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.class_names.pop()
        self._pop()

    def visit_Global(self, node: cst.Global) -> None:
        assert self.scope is not None
        self.scope.declared_global.update(n.name.value for n in node.names)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        assert self.scope is not None
        self.scope.declared_nonlocal.update(n.name.value for n in node.names)

    def visit_For(self, node: cst.For) -> None:
        self._bind_target(node.target, None)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._bind_target(node.asname.name, None)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind_target(node.target, node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind_target(node.target, None)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind_target(node.target, node.value)
        if node.value is not None:
            self.ref_ok.add(node.value)

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if node.name is not None:
            self._bind_target(node.name.name, None)

    def visit_Import(self, node: cst.Import) -> bool:
        assert self.scope is not None
        for alias in node.names:
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self.scope.locals.add(alias.asname.name.value)
            else:
                self.scope.locals.add((dotted(alias.name) or "").split(".")[0])
        self._report_import(node, [dotted(a.name) or "" for a in node.names])
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        assert self.scope is not None
        if isinstance(node.names, cst.ImportStar) or node.module is None or node.relative:
            return False
        base = dotted(node.module) or ""
        full = []
        for alias in node.names:
            name = dotted(alias.name) or ""
            local = alias.asname.name.value if alias.asname is not None and isinstance(alias.asname.name, cst.Name) else name
            self.scope.locals.add(local)
            full.append(f"{base}.{name}")
        self._report_import(node, full)
        return False

    # ------------------------------------------------------------------ statements
    def visit_Assign(self, node: cst.Assign) -> None:
        for t in node.targets:
            self._bind_target(t.target, node.value)
        self.ref_ok.add(node.value)
        for entry, mode in self.by_kind("drop-assign"):
            quals = [self.imports.qualify(t.target) for t in node.targets]
            if not all(q and q.startswith(entry.pattern) for q in quals):
                continue
            if not self._side_effect_free(node.value):
                self.warn(entry, node, f"{entry.id}: kept, the assigned value is computed by a call; "
                          "the setting has no effect on NPU")
                continue
            line = self.lines[-1] if self.lines else None
            if line is None:
                continue
            self.drop_candidates.setdefault(line, []).append((node, self.blocks[-1] if self.blocks else None))
            self.site(entry, node, REWRITTEN, entry.reason, entry.exactness)

    @staticmethod
    def _side_effect_free(value: cst.BaseExpression) -> bool:
        if isinstance(value, (cst.Name, cst.Integer, cst.Float, cst.SimpleString)):
            return True
        if isinstance(value, cst.Attribute):
            return dotted(value) is not None
        if isinstance(value, cst.UnaryOperation):
            return _Analyzer._side_effect_free(value.expression)
        return False

    def _scan_block(self, block: cst.CSTNode, body: Sequence[cst.BaseStatement]) -> None:
        for entry, mode in self.by_kind("swiglu"):
            for i, stmt in enumerate(body):
                match = self._chunk_assign(stmt)
                if match is None:
                    continue
                x, a, b = match
                for later in body[i + 1:]:
                    rebinds = _binds(later) & {x, a, b}
                    if rebinds and not isinstance(later, cst.SimpleStatementLine):
                        break
                    finder = _Products(self, entry.qualnames, a, b)
                    later.visit(finder)
                    for product, _swapped in finder.found:
                        self._plan_swiglu(entry, product, x, a, b)
                    if rebinds:
                        break
        for entry, mode in self.by_kind("insert"):
            if block is not self.ctx.module:
                continue
            last = None
            for i, stmt in enumerate(body):
                if isinstance(stmt, cst.SimpleStatementLine) and all(
                    isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
                ):
                    last = i
                elif i == 0 and isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Expr):
                    continue
                else:
                    break
            torch_alias = next((k for k, v in self.imports.aliases.items() if v == "torch"), None)
            if last is None or torch_alias is None:
                continue
            text = entry.replacement.format(torch=torch_alias)
            if any(self.ctx.module.code_for_node(s).strip() == text for s in body):
                continue  # already there (a rewrite of a rewrite)
            self.module_inserts.append((last + 1, text))
            self.site(entry, body[last], REWRITTEN, entry.reason, entry.exactness)

    def _chunk_assign(self, stmt: cst.BaseStatement) -> Optional[Tuple[str, str, str]]:
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            return None
        assign = stmt.body[0]
        if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
            return None
        target = assign.targets[0].target
        if not isinstance(target, (cst.Tuple, cst.List)) or len(target.elements) != 2:
            return None
        names = [el.value for el in target.elements]
        if not all(isinstance(n, cst.Name) and not isinstance(el, cst.StarredElement) for n, el in zip(names, target.elements)):
            return None
        call = assign.value
        if not isinstance(call, cst.Call) or any(a.star for a in call.args):
            return None
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value == "chunk" and isinstance(func.value, cst.Name) and not self.receiver_is_module(func):
            x = func.value.value
            chunks = _argument(call, 0, "chunks")
            dim = _argument(call, 1, "dim")
        elif self.imports.qualify(func) == "torch.chunk":
            xs = _argument(call, 0, "input")
            if not isinstance(xs, cst.Name):
                return None
            x = xs.value
            chunks = _argument(call, 1, "chunks")
            dim = _argument(call, 2, "dim")
        else:
            return None
        if not (isinstance(chunks, cst.Integer) and chunks.value == "2") or dim is None or not _is_minus_one(dim):
            return None
        a, b = names[0].value, names[1].value
        if len({x, a, b}) != 3:
            return None
        return x, a, b

    def _plan_swiglu(self, entry: T.Swap, product: cst.BinaryOperation, x: str, a: str, b: str) -> None:
        helpers = self.helper_alias()

        def fn(updated: cst.CSTNode) -> cst.CSTNode:
            new = cst.parse_expression(f"{helpers}.{entry.replacement}({x}, {a}, {b})")
            return _keep_parens(updated, new)

        self.edit(entry, product, fn)

    # ------------------------------------------------------------------ calls
    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        qual = self.imports.qualify(func)
        if isinstance(func, cst.Name) and self.scope is not None:
            self.calls.setdefault(func.value, []).append((node, self.scope))
        elif isinstance(func, cst.Attribute) and func.attr.value == "add_argument":
            dest = _argparse_dest(node)
            if dest:
                self.arguments[dest] = node
        if qual in ("isinstance", "issubclass") or (isinstance(func, cst.Name) and func.value in ("isinstance", "issubclass", "type")):
            pass
        else:
            self.ref_ok.update(a.value for a in node.args)
        for entry, _ in self.entries:
            if qual is not None and qual in entry.within:
                self.within_depth[entry.id] = self.within_depth.get(entry.id, 0) + 1
        for entry, mode in self.entries:
            kind = entry.kind
            if kind == "method":
                self._method(entry, mode, node)
            elif kind == "literal-arg":
                self._literal_arg(entry, node, qual)
            elif node in self.claimed:
                continue
            elif kind == "call-replace" and qual in entry.qualnames:
                self._call_replace(entry, node)
            elif kind == "add-kwarg" and qual in entry.qualnames:
                self._add_kwarg(entry, node)
            elif kind == "helper" and qual in entry.qualnames:
                self._helper_call(entry, node)

    def leave_Call(self, node: cst.Call) -> None:
        qual = self.imports.qualify(node.func)
        for entry, _ in self.entries:
            if qual is not None and qual in entry.within:
                self.within_depth[entry.id] -= 1

    def _method(self, entry: T.Swap, mode: str, node: cst.Call) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute) or func.attr.value != entry.pattern or self.receiver_is_module(func):
            return
        if "no-args" in entry.conditions and node.args:
            return
        if "no-user-member" in entry.conditions and entry.pattern in self.facts.members:
            self.skip(entry, node, f"a class in this module defines its own `{entry.pattern}`; "
                      f"`.{entry.pattern}()` may not be the tensor method")
            return
        if mode == "warn":
            self.warn(entry, node, self._warn_reason(entry))
            return
        self.edit(entry, func, lambda u: u.with_changes(attr=cst.Name(entry.replacement)), site_node=node)

    def _warn_reason(self, entry: T.Swap) -> str:
        flag = entry.option.replace("_", "-") if entry.option else ""
        return (f"{entry.reason}; not changed (set [device] {entry.option} = true, or pass "
                f"--{flag}, to rewrite it)")

    def _call_replace(self, entry: T.Swap, node: cst.Call) -> None:
        if _has_star(node):
            self.claimed.add(node)
            self.skip(entry, node, "*args/**kwargs: the arguments cannot be mapped")
            return
        pos = _positional(node)
        keywords = [a.keyword.value for a in node.args if a.keyword is not None]
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
        lead = [_new_arg(None, cst.parse_expression(text)) for text in entry.lead]
        params = entry.params

        def fn(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
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

        self.edit(entry, node, fn)

    def _npu_fused_problem(self, entry: T.Swap, node: cst.Call, pos, keywords) -> Optional[str]:
        if len(pos) > 1 + len(entry.accepts) or any(k not in entry.accepts for k in keywords):
            return f"arguments other than {', '.join(entry.accepts)} (NpuFused* takes no others)"
        if "bfloat16" in self.ctx.code:
            return "the module uses bfloat16, which NpuFused* optimizers reject"
        target = self._assigned_to(node)
        if target is None:
            return "the optimizer is not assigned to a name, so its zero_grad calls cannot be checked"
        for receiver, set_to_none in self.facts.zero_grads:
            if receiver != target and set_to_none != "False":
                return (f"`{receiver}.zero_grad()` sets gradients to None, which breaks the "
                        "flattened gradient buffer of NpuFused*")
            if set_to_none == "other":
                return "zero_grad(set_to_none=...) is not supported by NpuFused* optimizers"
        return None

    def _assigned_to(self, node: cst.Call) -> Optional[str]:
        line = self.lines[-1] if self.lines else None
        if line is None:
            return None
        for stmt in getattr(line, "body", ()):
            if isinstance(stmt, cst.Assign) and stmt.value is node and len(stmt.targets) == 1:
                return dotted(stmt.targets[0].target)
            if isinstance(stmt, cst.AnnAssign) and stmt.value is node:
                return dotted(stmt.target)
        return None

    def _add_kwarg(self, entry: T.Swap, node: cst.Call) -> None:
        self.claimed.add(node)
        chosen = [a.keyword.value for a in node.args if a.keyword is not None and a.keyword.value in entry.absent]
        if chosen:
            self.skip(entry, node, f"{chosen[0]}= set by the user: left as written")
            return
        if "no-star-kwargs" in entry.conditions and _has_star(node):
            self.skip(entry, node, f"*args/**kwargs may already hold {entry.keyword}=")
            return
        self.prepare(entry)
        value_text = entry.value
        if "{npu}" in value_text:
            value_text = value_text.format(npu=self.helper_alias())
        arg = _new_arg(entry.keyword, cst.parse_expression(value_text))
        self.edit(entry, node, lambda u: _append_args(u, [arg]))

    def _helper_call(self, entry: T.Swap, node: cst.Call) -> None:
        self.claimed.add(node)
        self.handled_refs.add(node.func)
        why = self._helper_problem(entry, node)
        if why:
            self.skip(entry, node, why)
            return
        self._plan_helper_ref(entry, node.func, site_node=node)

    def _helper_problem(self, entry: T.Swap, node: cst.Call) -> Optional[str]:
        if "not-tanh" in entry.conditions:
            approx = _argument(node, 1 if entry.pattern.endswith(".gelu") else 0, "approximate")
            if approx is not None and _is_literal(approx, "tanh"):
                return "approximate='tanh' is what native gelu computes on NPU: nothing to fix"
        if "has-weight" in entry.conditions:
            weight = _argument(node, 2, "weight")
            if weight is None or _is_literal(weight, "None"):
                return "no weight: npu_rms_norm needs one"
        if "affine" in entry.conditions:
            affine = _argument(node, 2, "elementwise_affine")
            if affine is not None and _is_literal(affine, "False"):
                return "elementwise_affine=False: npu_rms_norm needs a weight"
        if _has_star(node):
            return "*args/**kwargs: the arguments cannot be checked"
        return None

    def _plan_helper_ref(self, entry: T.Swap, ref: cst.BaseExpression, site_node=None) -> None:
        helpers = self.helper_alias()
        text = f"{helpers}.{entry.replacement}"
        self.edit(entry, ref, lambda u: _keep_parens(u, cst.parse_expression(text)), site_node=site_node)

    def _literal_arg(self, entry: T.Swap, node: cst.Call, qual: Optional[str]) -> None:
        func = node.func
        for callee, index, keyword in entry.positions:
            if callee == "*":
                if index is not None:
                    continue
            elif callee.startswith("."):
                if not (isinstance(func, cst.Attribute) and func.attr.value == callee[1:] and not self.receiver_is_module(func)):
                    continue
            elif qual != callee:
                continue
            value = _argument(node, index, keyword)
            if value is not None:
                assert self.scope is not None
                self._flow_value(entry, value, self.scope, self._line(node), 0)

    def _line(self, node: cst.CSTNode) -> int:
        return self.ctx.span(node)[0]

    def _flow_value(self, entry: T.Swap, value: cst.BaseExpression, scope: _Scope, use_line: int, depth: int, via: str = "") -> None:
        if depth > 8:
            return
        regex, repl = entry.literal
        if isinstance(value, cst.SimpleString):
            text = _str_value(value)
            if text is not None and re.search(regex, text):
                self._plan_literal(entry, value, regex, repl, use_line, via)
        elif isinstance(value, cst.FormattedString):
            parts = value.parts
            if parts and isinstance(parts[0], cst.FormattedStringText) and re.search(regex, parts[0].value):
                self._plan_literal(entry, parts[0], regex, repl, use_line, via)
        elif isinstance(value, cst.IfExp):
            self._flow_value(entry, value.body, scope, use_line, depth + 1, via)
            self._flow_value(entry, value.orelse, scope, use_line, depth + 1, via)
        elif isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add):
            self._flow_value(entry, value.left, scope, use_line, depth + 1, via)
        elif isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "format":
            self._flow_value(entry, value.func.value, scope, use_line, depth + 1, via)
        elif isinstance(value, cst.Name):
            self.flows.append((scope, value.value, entry, use_line))
        elif isinstance(value, cst.Attribute):
            text = dotted(value)
            if text is not None and self.imports.qualify(value) is None:
                self.attr_flows.append((text, entry, use_line))

    def _plan_literal(self, entry: T.Swap, node: cst.CSTNode, regex: str, repl: str, use_line: int, via: str) -> None:
        if node in self.done_literals:
            return
        self.done_literals.add(node)
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

        self.edit(entry, node, fn, reason)

    def visit_Comparison(self, node: cst.Comparison) -> None:
        entries = self.by_kind("compare")
        items = [node.left] + [t.comparator for t in node.comparisons]
        for i, target in enumerate(node.comparisons):
            left, right = items[i], items[i + 1]
            if isinstance(target.operator, (cst.Is, cst.IsNot)):
                continue
            for entry, _ in entries:
                regex = entry.literal[0]
                for side, lit in ((left, right), (right, left)):
                    lits = [lit]
                    if isinstance(target.operator, (cst.In, cst.NotIn)) and isinstance(lit, (cst.Tuple, cst.List, cst.Set)) and side is left:
                        lits = [el.value for el in lit.elements]
                    elif not isinstance(target.operator, (cst.Equal, cst.NotEqual)):
                        continue
                    for one in lits:
                        text = _str_value(one)
                        if text is None or not re.search(regex, text):
                            continue
                        assert isinstance(one, cst.SimpleString)
                        if isinstance(side, cst.Attribute) and side.attr.value == "type" and not self.receiver_is_module(side):
                            self._plan_literal(entry, one, regex, entry.literal[1], self._line(node), "")
                        elif isinstance(side, (cst.Name, cst.Attribute)):
                            assert self.scope is not None
                            self.compares.append((self.scope, side, one, entry))

    # ------------------------------------------------------------------ references
    def visit_Attribute(self, node: cst.Attribute) -> bool:
        # only the value is an expression; the attribute's own Name is not a reference
        if not self._reference(node):
            node.value.visit(self)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self._reference(node)

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)  # the keyword's Name is not a reference
        return False

    def visit_DictElement(self, node: cst.DictElement) -> None:
        self.ref_ok.add(node.value)  # activation registries: {"gelu": nn.GELU}

    def visit_Element(self, node: cst.Element) -> None:
        self.ref_ok.add(node.value)

    def visit_Return(self, node: cst.Return) -> None:
        if node.value is not None:
            self.ref_ok.add(node.value)

    def visit_Param(self, node: cst.Param) -> bool:
        if node.default is not None:
            self.ref_ok.add(node.default)
        for part in (node.annotation, node.default):
            if part is not None:
                part.visit(self)
        return False

    def _reference(self, node: cst.BaseExpression) -> bool:
        """Plan what the table says for a dotted reference; True when it was claimed whole."""
        qual = self.imports.qualify(node)
        if isinstance(node, cst.Attribute):
            for entry, mode in self.by_kind("attribute"):
                if node.attr.value == entry.pattern and not self.receiver_is_module(node) and qual is None:
                    if "no-user-member" in entry.conditions and entry.pattern in self.facts.members:
                        self.skip(entry, node, f"a class in this module defines its own `{entry.pattern}`")
                    elif mode == "apply":
                        self.edit(entry, node, lambda u, e=entry: u.with_changes(attr=cst.Name(e.replacement)))
        if qual is None or node in self.handled_refs:
            return False
        for entry, mode in self.entries:
            if entry.kind == "rename" and qual in entry.qualnames:
                if entry.within and not self.within_depth.get(entry.id):
                    continue
                self.handled_refs.add(node)
                if mode == "warn":
                    self.warn(entry, node, self._warn_reason(entry))
                else:
                    self.prepare(entry)
                    new = self.renamed(node, qual, entry.replacement)
                    # a dotted reference has no edited parts inside: the planned node is final
                    self.edit(entry, node, lambda u, n=new: n)
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

    def visit_Decorator(self, node: cst.Decorator) -> None:
        expr = node.decorator.func if isinstance(node.decorator, cst.Call) else node.decorator
        qual = self.imports.qualify(expr)
        for entry, _ in self.by_kind("report-decorator"):
            if qual in entry.qualnames:
                self.handled_refs.add(expr)
                self.warn(entry, node, f"{qual}: {entry.reason}")

    def _report_import(self, node: cst.CSTNode, full_names: Sequence[str]) -> None:
        for entry, _ in self.by_kind("report-import"):
            hit = [f for f in full_names if f == entry.pattern or f.startswith(entry.pattern + ".")]
            if hit:
                self.warn(entry, node, f"{hit[0]}: {entry.reason}")

    # ------------------------------------------------------------------ after the visit
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
            if isinstance(side, cst.Name):
                flowing = (id(scope.resolve(side.value)), side.value, regex) in self.device_names
            else:
                flowing = (dotted(side) or "", regex) in self.device_attrs
            if flowing:
                self._plan_literal(entry, lit, regex, entry.literal[1], self._line(lit), "compared with a device")
        for line, drops in self.drop_candidates.items():
            small = list(line.body)
            dropped = [n for n, _ in drops]
            block = drops[0][1]
            if len(dropped) == len(small) and isinstance(line, cst.SimpleStatementLine) and block is not None:
                index = next(i for i, s in enumerate(block.body) if s is line)
                self.block_drops.setdefault(block, set()).add(index)
            elif len(dropped) == len(small):  # a one-line suite: keep it valid
                self.edits.setdefault(dropped[0], []).append(lambda u: cst.Pass())
                for n in dropped[1:]:
                    self.edits.setdefault(n, []).append(lambda u: cst.RemoveFromParent())
            else:
                for n in dropped:
                    self.edits.setdefault(n, []).append(lambda u: cst.RemoveFromParent())

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
        if choices is not None and isinstance(choices.value, (cst.List, cst.Tuple, cst.Set)):
            regex, repl = entry.literal
            for el in choices.value.elements:
                value = _str_value(el.value)
                if value is not None and re.search(regex, value):
                    self._plan_literal(entry, el.value, regex, repl, line, f"a choice of option `{text}`")


class _Apply(cst.CSTTransformer):
    def __init__(self, an: _Analyzer) -> None:
        self.an = an
        self.path = an.on_path()

    def on_visit(self, node: cst.CSTNode) -> bool:
        return node in self.path  # subtrees without an edit are kept as they are, unvisited

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        for fn in self.an.edits.get(original_node, ()):
            if isinstance(updated_node, cst.RemovalSentinel):
                break
            updated_node = fn(updated_node)
        drops = self.an.block_drops.get(original_node)
        if drops:
            updated_node = _drop_statements(updated_node, drops)
        if original_node is self.an.ctx.module and self.an.module_inserts:
            body = list(updated_node.body)
            for index, text in sorted(self.an.module_inserts, reverse=True):
                body.insert(index, cst.parse_statement(text + "\n"))
            updated_node = updated_node.with_changes(body=body)
        return updated_node


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


class _DeviceTransform(Transform):
    """One transform id; its entries are the table's entries for that id."""

    def rewrite(self, ctx: FileContext) -> Tuple[cst.Module, List[Site]]:
        analyzer = _Analyzer(ctx, self.id, T.entries_for(self.id))
        if not analyzer.entries:  # nothing in the module can match: no libcst parse or visit at all
            return ctx.__dict__.get("module"), []  # None: unchanged (the pipeline parses lazily)
        ctx.module.visit(analyzer)
        if not analyzer.edits and not analyzer.block_drops and not analyzer.module_inserts:
            return ctx.module, analyzer.sites
        return ctx.module.visit(_Apply(analyzer)), analyzer.sites


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
