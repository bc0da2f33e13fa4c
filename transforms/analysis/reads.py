"""Names read and bound: the locals of a scope, whether a name a loop binds is read after it (or
elsewhere in its scope), the loops enclosing a statement, the names an expression reads.
"""
from __future__ import annotations

from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple

import libcst as cst

from .. import rewrite_caches
from .bodies import _BLOCK_FIELDS, _code, target_names
from .cstwalk import push_children, walk


def _store_names(target: cst.BaseExpression, out: Set[int]) -> None:
    if isinstance(target, cst.Name):
        out.add(id(target))
    elif isinstance(target, (cst.Tuple, cst.List)):
        for el in target.elements:
            _store_names(el.value, out)
    elif isinstance(target, cst.StarredElement):
        _store_names(target.value, out)


def _param_names(params: cst.Parameters) -> Set[str]:
    names: Set[str] = set()
    for p in (*params.posonly_params, *params.params, *params.kwonly_params):
        names.add(p.name.value)
    for p in (params.star_arg, params.star_kwarg):
        if isinstance(p, cst.Param):
            names.add(p.name.value)
    return names


class _Bindings(cst.CSTVisitor):
    """Names a nested function binds locally (params, stores), less global/nonlocal ones."""

    def __init__(self) -> None:
        self.bound: Set[str] = set()
        self.declared: Set[str] = set()
        self._stores: Set[int] = set()

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        _store_names(node.target, self._stores)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        _store_names(node.target, self._stores)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        _store_names(node.target, self._stores)

    def visit_For(self, node: cst.For) -> None:
        _store_names(node.target, self._stores)

    def visit_AsName(self, node: cst.AsName) -> None:
        _store_names(node.name, self._stores)

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) in self._stores:
            self.bound.add(node.value)

    def visit_Global(self, node: cst.Global) -> None:
        self.declared.update(n.name.value for n in node.names)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self.declared.update(n.name.value for n in node.names)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.bound.add(node.name.value)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.bound.add(node.name.value)
        return False


def _locals_of(node: cst.CSTNode, params: Optional[cst.Parameters]) -> Set[str]:
    finder = _Bindings()
    body = node.body if isinstance(node, (cst.FunctionDef, cst.Lambda)) else node
    body.visit(finder)
    names = finder.bound | (_param_names(params) if params is not None else set())
    return names - finder.declared


_DYNAMIC = frozenset({"locals", "vars", "eval", "exec", "globals"})


class ScopeWalk(cst.CSTVisitor):
    """The walk of a scope's body that finds variable reads, in source order, with what covers
    each: the body of another ``for`` loop (or a comprehension) whose target binds the name, a
    nested function that binds it locally. A subclass says what a read means (:meth:`_read`, and
    :meth:`_reads_all` for ``locals()``/``vars()``/``globals()`` without arguments and
    ``eval``/``exec``), what entering and leaving a loop means, and which ``for`` loop it does
    not enter (:meth:`_stop_at`): :class:`_Reads` answers for one loop, ``read_index.ReadIndex``
    records every read once for all the loops of the scope."""

    def __init__(self) -> None:
        self._covered: List[Set[str]] = []
        self._stores: Set[int] = set()
        self._skip: Set[int] = set()  # Name nodes that are not variable reads
        self._nested = 0  # inside nested functions/lambdas

    # -- what a subclass decides
    def _read(self, name: str) -> None:
        raise NotImplementedError

    def _reads_all(self) -> None:
        raise NotImplementedError

    def _loop_entered(self, node: cst.CSTNode) -> None:
        pass

    def _loop_left(self, node: cst.CSTNode) -> None:
        pass

    def _stop_at(self, node: cst.For) -> bool:
        return False

    def _is_covered(self, name: str) -> bool:
        return any(name in c for c in self._covered)

    def visit_While(self, node: cst.While) -> None:
        self._loop_entered(node)

    def leave_While(self, node: cst.While) -> None:
        self._loop_left(node)

    # -- positions that are not reads
    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._skip.add(id(node.attr))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._skip.add(id(node.keyword))

    def visit_ImportAlias(self, node: cst.ImportAlias) -> bool:
        return False

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        _store_names(node.target, self._stores)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        _store_names(node.target, self._stores)

    def visit_AsName(self, node: cst.AsName) -> None:
        _store_names(node.name, self._stores)

    # -- scopes and rebinding loops
    def visit_For(self, node: cst.For) -> bool:
        if self._stop_at(node):
            return False
        self._loop_entered(node)
        _store_names(node.target, self._stores)
        node.target.visit(self)
        node.iter.visit(self)
        bound = set(target_names(node.target) or ())
        self._covered.append(bound)
        node.body.visit(self)
        self._covered.pop()
        if node.orelse is not None:
            node.orelse.visit(self)
        self._loop_left(node)
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        for deco in node.decorators:
            deco.visit(self)
        node.params.visit(self)  # defaults are evaluated in this scope
        self._covered.append(_locals_of(node, node.params))
        self._nested += 1
        node.body.visit(self)
        self._nested -= 1
        self._covered.pop()
        return False

    def visit_Param(self, node: cst.Param) -> bool:
        if node.default is not None:
            node.default.visit(self)
        if node.annotation is not None:
            node.annotation.visit(self)
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        node.params.visit(self)
        self._covered.append(_param_names(node.params))
        self._nested += 1
        node.body.visit(self)
        self._nested -= 1
        self._covered.pop()
        return False

    def _comp(self, node, elts: Sequence[cst.CSTNode]) -> bool:
        fors: List[cst.CompFor] = []
        comp: Optional[cst.CompFor] = node.for_in
        while comp is not None:
            fors.append(comp)
            comp = comp.inner_for_in
        fors[0].iter.visit(self)  # the first iterable is evaluated in the enclosing scope
        bound: Set[str] = set()
        for comp in fors:
            _store_names(comp.target, self._stores)
            bound.update(target_names(comp.target) or ())
        self._covered.append(bound)
        for i, comp in enumerate(fors):
            if i:
                comp.iter.visit(self)
            for cond in comp.ifs:
                cond.visit(self)
        for elt in elts:
            elt.visit(self)
        self._covered.pop()
        return False

    def visit_ListComp(self, node: cst.ListComp) -> bool:
        return self._comp(node, [node.elt])

    def visit_SetComp(self, node: cst.SetComp) -> bool:
        return self._comp(node, [node.elt])

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> bool:
        return self._comp(node, [node.elt])

    def visit_DictComp(self, node: cst.DictComp) -> bool:
        return self._comp(node, [node.key, node.value])

    def visit_Call(self, node: cst.Call) -> None:
        # locals()/vars()/globals() without arguments, eval/exec: any name may be read
        if isinstance(node.func, cst.Name) and node.func.value in _DYNAMIC:
            if node.func.value in ("eval", "exec") or not node.args:
                self._reads_all()

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) in self._skip or id(node) in self._stores:
            return
        self._read(node.value)

    def visit_Del(self, node: cst.Del) -> None:
        for name in _all_names(node.target):
            self._read(name)


class _Reads(ScopeWalk):
    """Every read of ``names`` under a scope that is not covered by a rebinding.

    A read is covered when it sits in the body of another ``for`` loop (or comprehension) whose
    target binds the name, or in a nested function that binds the name locally: such a read can
    never see what the skipped loop left behind. So is a read that no execution path reaches from
    the end of ``exclude`` (the loop itself, whose own reads are ignored): one earlier in source
    order and outside every loop that encloses ``exclude`` (nested functions count wherever they
    are: they may run later). ``locals()``/``vars()``/``globals()`` without arguments and
    ``eval``/``exec`` count as reading every name.
    """

    def __init__(self, names: Set[str], exclude: cst.CSTNode, also: Sequence[cst.CSTNode] = ()) -> None:
        super().__init__()
        self.names = names
        self.exclude = exclude
        self.also = {id(n) for n in also}
        self.found: Set[str] = set()
        self.ancestors: Set[int] = set()  # loops (for/while) that enclose ``exclude``
        self._after = False  # past the end of ``exclude`` in source order
        self._loop_depth = 0  # inside loops that enclose ``exclude``

    def _counts(self, name: str) -> bool:
        if not (self._after or self._loop_depth or self._nested):
            return False  # runs before the loop, and never again after it
        return not self._is_covered(name)

    def _read(self, name: str) -> None:
        if name in self.names and self._counts(name):
            self.found.add(name)

    def _reads_all(self) -> None:
        self.found |= {n for n in self.names if self._counts(n)}

    def _loop_entered(self, node: cst.CSTNode) -> None:
        self._loop_depth += id(node) in self.ancestors

    def _loop_left(self, node: cst.CSTNode) -> None:
        self._loop_depth -= id(node) in self.ancestors

    def _stop_at(self, node: cst.For) -> bool:
        if node is self.exclude:
            self._after = True
            return True
        return False

    def on_visit(self, node: cst.CSTNode) -> bool:
        if id(node) in self.also:
            return False
        return super().on_visit(node)


def _all_names(node: cst.CSTNode) -> Set[str]:
    out: Set[str] = set()

    class _V(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            out.add(n.value)

    node.visit(_V())
    return out


def read_elsewhere(
    scope: cst.CSTNode, loop: cst.CSTNode, names: Iterable[str], also: Sequence[cst.CSTNode] = ()
) -> Set[str]:
    """Which of ``names`` (bound by ``loop``) may be read somewhere in ``scope`` outside the loop.

    Conservative: a read anywhere in the scope counts (before the loop too, since the scope may
    itself run in a loop), unless a rebinding ``for``/comprehension/nested function covers it.
    Reads under the nodes in ``also`` are ignored too (e.g. the one statement that consumes a
    list the loop built).
    """
    from .read_index import index_of  # it subclasses ScopeWalk above: imported here, not at the top

    wanted = set(names)
    body = scope.body if isinstance(scope, (cst.FunctionDef, cst.ClassDef)) else scope
    found = index_of(body).read_elsewhere(loop, wanted, also)  # one walk per scope, not per loop
    if found is not None:
        return found
    if not _may_read(body, wanted | set(_DYNAMIC), {id(loop), *(id(n) for n in also)}):
        return set()  # no name the visit could count is there (a field walk: ~20x cheaper)
    visitor = _Reads(wanted, loop, also)
    visitor.ancestors = _enclosing_loops(body, loop)
    body.visit(visitor)
    return visitor.found


def _may_read(body: cst.CSTNode, words: Set[str], skip: Set[int]) -> bool:
    """Whether some name under ``body``, outside the nodes whose ids are in ``skip``, is one of
    ``words``: :class:`_Reads` counts a read only at such a name (a read of one of its names, a
    ``del`` of one, a call of ``locals``/``eval``...) and never enters those nodes."""
    stack = [body]
    kinds = _READ_KINDS
    while stack:
        n = stack.pop()
        if id(n) in skip:
            continue
        k = kinds.get(type(n))
        if k is None:
            k = kinds[type(n)] = 1 if isinstance(n, cst.Name) else 2 if isinstance(n, (cst.Attribute, cst.Arg)) else 0
        if k == 1 and n.value in words:  # type: ignore[attr-defined]
            return True
        push_children(n, stack)
    return False


def _skeleton(node: cst.CSTNode) -> Sequence[cst.CSTNode]:
    """The children of ``node`` that can hold statements (statements are their own skeleton:
    loops, ``global`` and ``nonlocal`` sit only there, never inside an expression)."""
    if isinstance(node, (cst.Module, cst.BaseSuite, cst.SimpleStatementLine)):
        return node.body
    if isinstance(node, cst.BaseSmallStatement):
        return ()
    out: List[cst.CSTNode] = []
    for field in _BLOCK_FIELDS:
        block = getattr(node, field, None)
        if isinstance(block, (list, tuple)):
            out.extend(block)
        elif isinstance(block, cst.CSTNode):
            out.append(block)
    return out


def _skeleton_path(root: cst.CSTNode, target: cst.CSTNode) -> Optional[List[cst.CSTNode]]:
    """The skeleton nodes from ``root`` down to ``target`` (excluded), or None if it is not there."""
    parent: Dict[int, Optional[cst.CSTNode]] = {id(root): None}
    todo = [root]
    while todo:
        node = todo.pop()
        if node is target:
            path: List[cst.CSTNode] = []
            up = parent[id(node)]
            while up is not None:
                path.append(up)
                up = parent[id(up)]
            return path[::-1]
        for child in _skeleton(node):
            parent[id(child)] = node
            todo.append(child)
    return None


def _enclosing_loops(root: cst.CSTNode, target: cst.CSTNode) -> Set[int]:
    """ids of the for/while statements under ``root`` that contain ``target``."""
    path = _skeleton_path(root, target)  # a walk of statements only: ~50x cheaper than a visit
    if path is not None:
        return {id(n) for n in path if isinstance(n, (cst.For, cst.While))}
    return _enclosing_loops_visit(root, target)  # ``target`` is not a statement


def _enclosing_loops_visit(root: cst.CSTNode, target: cst.CSTNode) -> Set[int]:
    """:func:`_enclosing_loops` by a full visit (any kind of ``target``)."""
    stack: List[int] = []
    found: Set[int] = set()

    class _V(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if node is target:
                found.update(stack)
                return False
            if isinstance(node, (cst.For, cst.While)):
                stack.append(id(node))
            return True

        def on_leave(self, node: cst.CSTNode) -> None:
            if isinstance(node, (cst.For, cst.While)) and stack and stack[-1] == id(node):
                stack.pop()

    root.visit(_V())
    return found


def names_read(node: cst.CSTNode) -> Set[str]:
    """Every plain name under ``node`` other than attribute names and keyword-argument names
    (read from the node fields: a libcst visit costs ~50x more on small expressions)."""
    found: Set[str] = set()
    stack = [node]
    kinds = _READ_KINDS
    while stack:
        n = stack.pop()
        k = kinds.get(type(n))
        if k is None:
            k = kinds[type(n)] = 1 if isinstance(n, cst.Name) else 2 if isinstance(n, (cst.Attribute, cst.Arg)) else 0
        if k == 1:
            found.add(n.value)  # type: ignore[attr-defined]
        elif k == 2:
            stack.append(n.value)  # type: ignore[attr-defined]
        else:
            push_children(n, stack)
    return found


#: node type -> what :func:`names_read` does with it: 1 a name, 2 read its ``value`` only (an
#: attribute, an argument), 0 its children (``isinstance`` per node went through ``ABCMeta``)
_READ_KINDS: Dict[type, int] = {}


#: the node :func:`bound_names` last answered for, and its answer: the checks of one loop each
#: ask about the same body in turn (four walks of it per rewritten loop); the node is held, so
#: its id stays its own
_BOUND_LAST: List[Tuple[Optional[cst.CSTNode], FrozenSet[str]]] = rewrite_caches.held((None, frozenset()))


def bound_names(node: cst.CSTNode) -> Set[str]:
    """Names bound anywhere under ``node`` (assignments, loop targets, defs, imports, walrus)."""
    if _BOUND_LAST[0][0] is not node:
        _BOUND_LAST[0] = (node, frozenset(_bound_names(node)))
    return set(_BOUND_LAST[0][1])


def _bound_names(node: cst.CSTNode) -> Set[str]:
    found: Set[str] = set()

    def targets(t: cst.CSTNode) -> None:
        if isinstance(t, cst.Name):
            found.add(t.value)
        elif isinstance(t, (cst.Tuple, cst.List)):
            for el in t.elements:
                targets(el.value)
        elif isinstance(t, cst.StarredElement):
            targets(t.value)

    kinds = _BINDING_KINDS
    for n in walk(node):
        k = kinds.get(type(n))
        if k is None:
            k = kinds[type(n)] = _binding_kind(n)
        if k == 0:
            continue
        if k == 1:
            targets(n.target)  # type: ignore[attr-defined]
        elif k == 2:
            targets(n.name)  # type: ignore[attr-defined]
        elif k == 3:
            found.add(n.name.value)  # type: ignore[attr-defined]
        elif n.asname is None:  # type: ignore[attr-defined]
            found.add(_code(n.name).split(".")[0])  # type: ignore[attr-defined]
    return found


#: node type -> which binding :func:`_bound_names` reads of it (:func:`_binding_kind`)
_BINDING_KINDS: Dict[type, int] = {}


def _binding_kind(n: cst.CSTNode) -> int:
    """0 none, 1 its ``target``, 2 an ``as`` name, 3 a def's name, 4 an import alias."""
    if isinstance(n, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor, cst.NamedExpr)):
        return 1
    if isinstance(n, cst.AsName):
        return 2
    if isinstance(n, (cst.FunctionDef, cst.ClassDef)):
        return 3
    return 4 if isinstance(n, cst.ImportAlias) else 0
