"""Finding the backward/clip/unscale/step sites: one pass over the module's ``ast`` that reads each
scope (module level, each function, each class body) as its calls in source order, with where
each call sits (which branch of which if/try/match), and what assignments say the names hold.

It reads the stdlib ``ast`` of the same source (about 20 times faster than walking the libcst
tree, and it carries line numbers without PositionProvider); each event keeps the structural path
(:data:`Loc`) by which :mod:`.insert` reaches the same statement in the libcst tree.
"""
from __future__ import annotations

import ast
import dataclasses
from typing import Dict, List, Optional, Set, Tuple

from ..analysis.astwalk import push_children
from ..analysis.statements import _AST_COMPOUND
from ..names import ImportMap, ast_dotted
from scalebox_cst.textlines import physical_lines
from .recognise import (
    ACCELERATORS, CLIP_NAME_PREFIX, CLIP_QUALNAMES, GRAD_SCALERS, GUARD_QUALNAMES, last_name, scaler_of,
)

#: where a statement sits inside its scope: (compound statement, branch) pairs, outermost first
Path = Tuple[Tuple[ast.AST, str], ...]
#: how to reach a statement from the module: (field, index in the ast statement list) pairs
Loc = Tuple[Tuple[str, int], ...]

_TRY = (ast.Try,) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())


@dataclasses.dataclass
class Event:
    kind: str  # "backward" | "clip" | "guard" | "unscale" | "step"
    call: ast.Call
    stmt: ast.stmt  # the statement holding the call (a compound one when the call is in its header)
    loc: Optional[Loc]  # None when the call is in a compound statement's header
    path: Path
    # filled in for steps
    role: str = ""  # "optimizer" | "scaler" | "scheduler" | "unknown"
    opt_text: Optional[str] = None
    recv_text: Optional[str] = None

    @property
    def is_opt_step(self) -> bool:
        return self.kind == "step" and self.role in ("optimizer", "scaler")

    @property
    def direct(self) -> bool:
        """The call is its statement's whole value, so a statement put before it runs right before it."""
        stmt = self.stmt
        return (
            self.loc is not None
            and isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return))
            and stmt.value is self.call
        )


def exclusive(a: Path, b: Path) -> bool:
    """Whether two places can never both run in one pass (different arms of one if/match/try)."""
    for (na, ka), (nb, kb) in zip(a, b):
        if na is not nb:
            return False
        if ka != kb:
            if isinstance(na, (ast.If, ast.Match)):
                return True
            if isinstance(na, _TRY):
                return ka not in ("body", "finalbody") and kb not in ("body", "finalbody")
            return False
    return False


def dominates(a: Path, b: Path) -> bool:
    """Whether code at path ``a`` (earlier in source) runs whenever code at ``b`` runs."""
    return len(a) <= len(b) and all(x[0] is y[0] and x[1] == y[1] for x, y in zip(a, b))


def calls_in(node: ast.AST) -> List[ast.Call]:
    """Calls under ``node`` in source order, not descending into lambdas."""
    found: List[ast.Call] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Lambda):
            continue
        if isinstance(n, ast.Call):
            found.append(n)
        push_children(n, stack)
    found.sort(key=lambda c: (c.lineno, c.col_offset, -(c.end_lineno or 0), -(c.end_col_offset or 0)))
    return found


class ModuleScan:
    """One pass over the module's ast: the events of every scope, and what assignments say."""

    def __init__(self, tree: ast.Module, imports: ImportMap, code: Optional[str] = None) -> None:
        self.qualify = imports.qualify
        # Given the code, a simple statement whose lines spell none of the words a call that
        # :meth:`classify` names must spell is not walked for calls (a whole-module walk of every
        # call was most of the scan): the last part of each qualified name (called through a
        # module: ``utils.clip_grad_norm_``), the local names imported for one, the name prefix
        # and the method names. Lines that are not ASCII are walked (an identifier may normalise).
        self._lines = physical_lines(code) if code is not None else None
        named = CLIP_QUALNAMES | GUARD_QUALNAMES | {"torch.autograd.backward"}
        self._words = tuple(sorted(
            {CLIP_NAME_PREFIX, "backward", "unscale_", "step"}
            | {q.rsplit(".", 1)[-1] for q in named}
            | {local for local, full in imports.aliases.items() if full in named}
        ))
        self.assigned: Dict[str, Set[str]] = {}  # dotted target -> qualified names of the calls
        self.by_last: Dict[str, Set[str]] = {}  # last attribute -> qualified names
        self.scalers: Set[str] = set()
        self.accelerators: Set[str] = set()
        self.properties: Set[str] = set()  # attribute names a class of the module reads through a property
        self.scopes: List[List[Event]] = []
        todo: List[Tuple[List[ast.stmt], Loc]] = [(tree.body, ())]
        while todo:
            body, loc = todo.pop(0)
            events: List[Event] = []
            self._block(body, loc, "body", (), events, todo)
            self.scopes.append(events)

    # -------------------------------------------------------------- names
    def _record(self, target: ast.AST, value: Optional[ast.AST]) -> None:
        if isinstance(target, (ast.Tuple, ast.List)) or value is None:
            return
        text = ast_dotted(target)
        if text is None:
            return
        qual = (self.qualify(value.func) or "") if isinstance(value, ast.Call) else ""
        self.assigned.setdefault(text, set()).add(qual)
        self.by_last.setdefault(text.rsplit(".", 1)[-1], set()).add(qual)
        if qual in GRAD_SCALERS:
            self.scalers.add(text)
        if qual in ACCELERATORS:
            self.accelerators.add(text)

    def classify(self, call: ast.Call) -> Optional[str]:
        func = call.func
        qual = self.qualify(func)
        if qual in CLIP_QUALNAMES:
            return "clip"
        if qual in GUARD_QUALNAMES:
            return "guard"
        last = last_name(func)
        if last is None:
            return None
        if last.startswith(CLIP_NAME_PREFIX) and not (qual or "").startswith("torch."):
            return "clip"
        attr = isinstance(func, ast.Attribute)
        if qual == "torch.autograd.backward" or (attr and last == "backward"):
            scaler = scaler_of(call)
            if scaler is not None:
                self.scalers.add(scaler)
            return "backward"
        if attr and last == "unscale_":
            return "unscale"
        if attr and last == "step":
            return "step"
        return None

    def _may_call(self, stmt: ast.stmt) -> bool:
        """Whether ``stmt`` may hold a call :meth:`classify` names (see ``__init__``)."""
        lines = self._lines
        if lines is None or stmt.end_lineno is None:
            return True
        text = "".join(lines[stmt.lineno - 1 : stmt.end_lineno])
        return not text.isascii() or any(w in text for w in self._words)

    # -------------------------------------------------------------- walking
    def _header(self, node: Optional[ast.AST], stmt: ast.stmt, path: Path, events: List[Event]) -> None:
        if node is None:
            return
        for call in calls_in(node):
            kind = self.classify(call)
            if kind:
                events.append(Event(kind, call, stmt, None, path))

    def _block(self, body: List[ast.stmt], loc: Loc, field: str, path: Path, events, todo) -> None:
        for k, stmt in enumerate(body):
            here = loc + ((field, k),)
            if not isinstance(stmt, _AST_COMPOUND):
                if isinstance(stmt, ast.Assign):
                    for target in stmt.targets:
                        self._record(target, stmt.value)
                elif isinstance(stmt, ast.AnnAssign):
                    self._record(stmt.target, stmt.value)
                if self._may_call(stmt):
                    for call in calls_in(stmt):
                        kind = self.classify(call)
                        if kind:
                            events.append(Event(kind, call, stmt, here, path))
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                todo.append((stmt.body, here))  # a scope of its own
                if isinstance(stmt, ast.ClassDef):
                    self.properties.update(property_names(stmt))
            elif isinstance(stmt, ast.If):
                self._header(stmt.test, stmt, path, events)
                self._block(stmt.body, here, "body", path + ((stmt, "body"),), events, todo)
                self._block(stmt.orelse, here, "orelse", path + ((stmt, "orelse"),), events, todo)
            elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
                self._header(stmt.test if isinstance(stmt, ast.While) else stmt.iter, stmt, path, events)
                self._block(stmt.body, here, "body", path + ((stmt, "body"),), events, todo)
                self._block(stmt.orelse, here, "orelse", path + ((stmt, "orelse"),), events, todo)
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                for item in stmt.items:
                    self._header(item.context_expr, stmt, path, events)
                self._block(stmt.body, here, "body", path + ((stmt, "body"),), events, todo)
            elif isinstance(stmt, _TRY):
                self._block(stmt.body, here, "body", path + ((stmt, "body"),), events, todo)
                for i, handler in enumerate(stmt.handlers):
                    self._header(handler.type, stmt, path, events)
                    key = f"handlers.{i}"
                    self._block(handler.body, here, key, path + ((stmt, key),), events, todo)
                self._block(stmt.orelse, here, "orelse", path + ((stmt, "orelse"),), events, todo)
                self._block(stmt.finalbody, here, "finalbody", path + ((stmt, "finalbody"),), events, todo)
            elif isinstance(stmt, ast.Match):
                self._header(stmt.subject, stmt, path, events)
                for i, case in enumerate(stmt.cases):
                    self._header(case.guard, stmt, path, events)
                    key = f"cases.{i}"
                    self._block(case.body, here, key, path + ((stmt, key),), events, todo)


def property_names(cls: ast.ClassDef) -> Set[str]:
    """Names the class defines as properties (``@property``, ``@x.getter``, ``x = property(...)``):
    reading one runs code, each time it is read (``functools.cached_property`` runs it once)."""
    out: Set[str] = set()
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for deco in stmt.decorator_list:
                name = ast_dotted(deco)
                if name is not None and (name in ("property", "builtins.property", "abc.abstractproperty")
                                         or name.endswith((".getter", ".setter", ".deleter"))):
                    out.add(stmt.name)
        elif isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and ast_dotted(stmt.value.func) == "property":
            out.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
    return out
