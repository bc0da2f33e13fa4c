"""Guarded fused NPU kernels: gelu, rms_norm (calls and references to the guarded runtime
helpers) and the swiglu pattern ``a, b = x.chunk(2, -1); silu(a) * b``."""
from __future__ import annotations

import ast
from typing import List, Optional, Sequence, Set, Tuple

import libcst as cst

from ...analysis.calls import call_argument, has_star_args, positional_args
from ...analysis.nodes import bound_names, children
from .. import table as T
from ..edits import _Target, _keep_parens
from ..source import _SCOPES, _Line


class Fused:
    """Mixin of the analyzer: helper entries and the swiglu scan of a block."""

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
            approx = call_argument(node, 1 if entry.pattern.endswith(".gelu") else 0, "approximate")
            if approx is not None and self.is_literal(approx, "tanh"):
                return "approximate='tanh' is what native gelu computes on NPU: nothing to fix"
        if "has-weight" in entry.conditions:
            weight = call_argument(node, 2, "weight")
            if weight is None or self.is_literal(weight, "None"):
                return "no weight: npu_rms_norm needs one"
        if "affine" in entry.conditions:
            affine = call_argument(node, 2, "elementwise_affine")
            if affine is not None and self.is_literal(affine, "False"):
                return "elementwise_affine=False: npu_rms_norm needs a weight"
        if has_star_args(node):
            return "*args/**kwargs: the arguments cannot be checked"
        return None

    def _plan_helper_ref(self, entry: T.Swap, ref: ast.expr, site_node=None) -> None:
        text = f"{self.helper_alias()}.{entry.replacement}"
        self.edit(entry, _Target(ref), lambda u: _keep_parens(u, cst.parse_expression(text)), site_node=site_node)

    def _scan_swiglu(self, items: List[object]) -> None:
        """``a, b = x.chunk(2, -1)`` in this block, then ``silu(a) * b`` before a, b or x is rebound."""
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
                        rebinds |= bound_names(s)
                    rebinds &= {x, a, b}
                    if rebinds and type(later) is not _Line:
                        break
                    for product in self._products(stmts, entry.qualnames, a, b):
                        self._plan_swiglu(entry, product, x, a, b)
                    if rebinds:
                        break

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
        if not isinstance(call, ast.Call) or has_star_args(call):
            return None
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "chunk" and isinstance(func.value, ast.Name) and not self.receiver_is_module(func):
            x = func.value.id
            chunks = call_argument(call, 0, "chunks")
            dim = call_argument(call, 1, "dim")
        elif self.imports.qualify(func) == "torch.chunk":
            xs = call_argument(call, 0, "input")
            if not isinstance(xs, ast.Name):
                return None
            x = xs.id
            chunks = call_argument(call, 1, "chunks")
            dim = call_argument(call, 2, "dim")
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
        for s in stmts:
            self._visit_products(s, silu, a, b, found)
        return found

    def _visit_products(self, node: ast.AST, silu: Sequence[str], a: str, b: str, found: List[ast.BinOp]) -> None:
        if isinstance(node, _SCOPES):
            return
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            if self._silu_of_a(node.left, silu, a) and _is_name(node.right, b):
                found.append(node)
            elif _is_name(node.left, b) and self._silu_of_a(node.right, silu, a):
                found.append(node)
        for child in children(node):
            self._visit_products(child, silu, a, b, found)

    def _silu_of_a(self, node: ast.AST, silu: Sequence[str], a: str) -> bool:
        if not isinstance(node, ast.Call) or self.imports.qualify(node.func) not in silu:
            return False
        pos = positional_args(node)
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


def _is_name(e: ast.AST, name: str) -> bool:
    return isinstance(e, ast.Name) and e.id == name
