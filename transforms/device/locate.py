"""Finding the libcst nodes of planned edits fast.

Each edited node is reached down the statement path from the module and found by position in a
code generation of that one statement (of a compound statement, its header only), never of the
whole file (PositionProvider costs tens of ms); the whole-module search is the fallback."""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst
from libcst.metadata.position_provider import PositionProvidingCodegenState

from ..base import FileContext
from .edits import Edit, _Target

if TYPE_CHECKING:
    from .analyzer import _Analyzer
from .source import _MATCH, _NEWLINE, _SIMPLE, _Source


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

    def record_syntactic_position(self, node, *, start_node=None, end_node=None):
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
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return self._find(node, cst.Integer)  # a slice bound (placement: ``dev[:4] == "cuda"``)
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
