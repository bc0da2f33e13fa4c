"""The walk of the device analyzer: one pass over the ``ast``, dispatching by node type."""
from __future__ import annotations

import ast
import re
from typing import List, Optional, Sequence, Tuple

from ...analysis.calls import call_args, class_args, parameters
from ...analysis.nodes import children
from ..facts import _Scope, _argparse_dest
from ..source import _MATCH, _Line, _is_suite, _lines


class Walk:
    """The walk over the module's ``ast`` in libcst's visiting order: scopes and bindings kept,
    every statement and expression handed to the concern that plans for it."""

    # ------------------------------------------------------------------ the walk
    def run(self) -> None:
        self.scope = _Scope("module", None)
        self._legacy_prepass()
        self._block(self.ctx.tree.body, module=True)
        self._finish()

    def _block(self, body: Sequence[ast.stmt], module: bool = False) -> None:
        """An indented block (or the module): scanned as a whole before its statements."""
        items = _lines(body)
        if "swiglu" in self.kinds:
            self._scan_swiglu(items)
        if module and "insert" in self.kinds:
            self._scan_insert(items)
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
            for child in children(s):
                self._expr(child)

    def _expr(self, node: ast.AST) -> None:
        handler = _EXPR.get(type(node))
        if handler is not None:
            handler(self, node)
        else:
            for child in children(node):
                self._expr(child)

    # statements
    def _s_def(self, node: ast.FunctionDef) -> None:
        assert self.scope is not None
        outer = self.scope
        outer.locals.add(node.name)
        scope = self._push("function")
        a = node.args
        params = parameters(a)
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
        for value in class_args(node):
            self._expr(value)
        self._body(node.body)
        self.class_names.pop()
        self._pop()

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
        if self.kinds.get("drop-assign"):
            self._drop_assign(node)
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
        self._prefix_test(node)
        self._expr(node.func)
        for value in call_args(node):
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
        self._param_values(parameters(a))
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


_STMT = {
    ast.FunctionDef: Walk._s_def,
    ast.AsyncFunctionDef: Walk._s_def,
    ast.ClassDef: Walk._s_class,
    ast.If: Walk._s_if,
    ast.For: Walk._s_for,
    ast.AsyncFor: Walk._s_for,
    ast.While: Walk._s_while,
    ast.With: Walk._s_with,
    ast.AsyncWith: Walk._s_with,
    ast.Try: Walk._s_try,
    ast.Return: Walk._s_return,
    ast.Assign: Walk._s_assign,
    ast.AugAssign: Walk._s_augassign,
    ast.AnnAssign: Walk._s_annassign,
    ast.Import: Walk._s_import,
    ast.ImportFrom: Walk._s_importfrom,
    ast.Global: Walk._s_global,
    ast.Nonlocal: Walk._s_nonlocal,
}

if hasattr(ast, "TryStar"):
    _STMT[ast.TryStar] = Walk._s_try
if _MATCH:
    _STMT[ast.Match] = Walk._s_match

_EXPR = {
    ast.Name: Walk._e_name,
    ast.Attribute: Walk._e_attribute,
    ast.Call: Walk._e_call,
    ast.Compare: Walk._e_compare,
    ast.Lambda: Walk._e_lambda,
    ast.NamedExpr: Walk._e_namedexpr,
    ast.Dict: Walk._e_dict,
    ast.List: Walk._e_elements,
    ast.Tuple: Walk._e_elements,
    ast.Set: Walk._e_elements,
    ast.Subscript: Walk._e_subscript,
    ast.Constant: Walk._e_leaf,
    ast.BinOp: Walk._e_binop,
    ast.UnaryOp: Walk._e_operand,
    ast.Starred: Walk._e_operand,
    ast.Await: Walk._e_operand,
    ast.BoolOp: Walk._e_values,
}
