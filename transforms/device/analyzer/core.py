"""State and shared helpers of the device analyzer (see :mod:`..analyzer`)."""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from scalebox_cst.report import REWRITTEN, SKIPPED, WARNING, Site

from ...base import FileContext
from ...names import ast_dotted
from .. import table as T
from ..edits import Edit, _Target, _keep_parens, _swap_attr
from ..facts import _Scope, _callees, _module_facts
from ..source import _Line, _span


class Core:
    """The analyzer's state for one transform over one module, and the helpers every concern uses
    (reporting sites, planning edits, naming what an edit emits, reading literals)."""

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
        self.ref_entries = [(e, m) for e, m in self.entries if e.kind in ("rename", "helper", "report-ref", "legacy-tensor")]
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
        self.legacy: Dict[ast.AST, tuple] = {}  # legacy tensor references: see .legacy
        self.kept_guards: Dict[ast.AST, str] = {}  # is_available() references kept, and why
        self.edits: List[Tuple[_Target, Edit]] = []
        self.line_drops: List[ast.stmt] = []  # first small statement of each line dropped whole
        self.module_inserts: List[Tuple[int, str]] = []
        self.scope: Optional[_Scope] = None
        self.attr_bindings: Dict[str, List[Tuple[ast.expr, _Scope]]] = {}
        self.flows: List[Tuple[_Scope, str, T.Swap, int]] = []
        self.attr_flows: List[Tuple[str, T.Swap, int]] = []
        self.device_names: Set[Tuple[int, str, str]] = set()  # (id(scope), name, literal regex)
        self.device_attrs: Set[Tuple[str, str]] = set()
        #: (scope, device value, literal, entry, the n of a ``value[:n]`` compared, or None)
        self.compares: List[Tuple[_Scope, ast.expr, ast.expr, T.Swap, Optional[ast.Constant]]] = []
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
            self._helpers = self.ctx.runtime_name(T.NPU_HELPERS, "_scalebox_npu")
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
                self.scope.bindings.setdefault(target.id, []).append((value, None))  # None: this scope
        elif isinstance(target, (ast.Tuple, ast.List)):
            for el in target.elts:
                self._bind_target(el.value if isinstance(el, ast.Starred) else el, None)
        elif isinstance(target, ast.Starred):
            self._bind_target(target.value, None)
        elif isinstance(target, ast.Attribute) and value is not None:
            text = ast_dotted(target)
            if text is not None:
                self.attr_bindings.setdefault(text, []).append((value, self.scope))
