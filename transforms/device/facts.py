"""Module-wide facts read once per module version, Python scopes, and the installed torch.

The facts are what the cheap prefilter (:meth:`_Facts.may_match`) and some conditions read before
any decision; one instance serves the six transforms that see the same module version."""
from __future__ import annotations

import ast
import re
import weakref
from typing import Dict, List, Optional, Set, Tuple

from scalebox_cst.config import installed_version

from ..analysis.calls import keyword_arg, positional_args
from ..analysis.nodes import NODE_FIELDS, node_fields
from ..base import FileContext
from ..names import ast_dotted
from . import table as T
from .source import _Source


class _Scope:
    """A Python scope, just enough to tell which assignment a name read refers to."""

    def __init__(self, kind: str, parent: Optional["_Scope"]) -> None:
        self.kind = kind  # module | function | class
        self.parent = parent
        self.locals: Set[str] = set()
        self.declared_global: Set[str] = set()
        self.declared_nonlocal: Set[str] = set()
        #: name -> [(value, the scope it is evaluated in: None for this one)] (a scope holding itself
        #: was a cycle that kept the file's tree until a garbage collection)
        self.bindings: Dict[str, List[Tuple[ast.expr, Optional["_Scope"]]]] = {}

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
        fields = NODE_FIELDS
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
                names = node_fields(t)
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
        if kind in ("rename", "helper", "call-replace", "add-kwarg", "report-decorator", "legacy-tensor"):
            return any(q in self.qualified for q in entry.qualnames)
        if kind in ("report-ref", "drop-assign"):
            prefixes = entry.qualnames if kind == "report-ref" else (entry.pattern.rstrip("."),)
            return any(q == p or q.startswith(p + ".") for q in self.qualified for p in prefixes)
        if kind in ("method", "attribute"):
            return entry.pattern in self.attrs
        if kind in ("literal-arg", "compare"):
            # a "cuda..." template that is not a device string as written may be reported (built strings)
            cuda = kind == "literal-arg" and entry.literal == T.CUDA_LITERAL
            return any(re.search(entry.literal[0], text) or (cuda and "cuda" in text) for text in self.strings)
        if kind == "swiglu":
            return ("chunk" in self.attrs or "torch.chunk" in self.qualified) and any(q in self.qualified for q in entry.qualnames)
        if kind == "report-import":
            return any(m == entry.pattern or m.startswith(entry.pattern + ".") for m in self.imported)
        return True


_TREE_CACHE: "weakref.WeakKeyDictionary[ast.AST, Tuple[Dict[str, str], _Facts, _Source]]" = weakref.WeakKeyDictionary()



def _facts_class():
    """``_Facts`` as the package exports it (the name tests replace to count the readings)."""
    from scalebox_cst.transforms import device

    return device._Facts


def _module_facts(ctx: FileContext) -> Tuple[_Facts, _Source]:
    """The facts and source lines of ``ctx``'s module version, read once for all six transforms."""
    tree, aliases = ctx.tree, ctx.imports.aliases
    hit = _TREE_CACHE.get(tree)
    if hit is not None and hit[0] == aliases:
        return hit[1], hit[2]
    facts, src = _facts_class()(tree, aliases), (hit[2] if hit is not None else _Source(ctx.code))
    _TREE_CACHE[tree] = (dict(aliases), facts, src)
    return facts, src



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


def _argparse_dest(node: ast.Call, src: _Source) -> Optional[str]:
    kw = keyword_arg(node, "dest")
    if kw is not None:
        return src.raw(kw.value)
    flags = [f for f in (src.raw(a) for a in positional_args(node)) if f]
    longs = [f for f in flags if f.startswith("--")]
    name = longs[0] if longs else (flags[0] if flags else None)
    return name.lstrip("-").replace("-", "_") if name else None


def _version_tuple(text: str) -> Tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:2])


def installed_torch() -> Optional[Tuple[int, ...]]:
    """(major, minor) of the torch installed with the engine: the code it rewrites runs on it.
    Part of the pipeline fingerprint (config.py), so an upgrade re-decides these rewrites."""
    version = installed_version("torch")
    return None if version is None else _version_tuple(version)
