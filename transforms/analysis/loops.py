"""Loop headers (``for i in range(n)``, ``for x in xs``, ``zip``/``enumerate``) and run-time guards
that make a loop conditional; what the batched loop's guard needs, for the site report.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Set

import libcst as cst

from .bodies import _code, target_names
from .reads import names_read
from .purity import is_pure, is_simple_ref
from .scopes import rebound_reason


#: The run-time guard of a batched loop (runtime.loop_batch), for the site report: what it accepts
#: is its contract (transforms/contracts.py), the site's details.
BATCH_GUARD_NOTE = "guarded by batch_zip/batch_range, else the loop as written"


class LoopHeader:
    """``for x in X`` / ``for a, b in zip(A, B)`` (mode "zip") or ``for i in range(...)`` ("range").

    ``element(node)`` recognises what the body may read per iteration: a loop variable (zip
    mode) or ``X[i]`` with ``X`` a plain reference (range mode); ``sources`` maps each element key
    to the expression it comes from (filled as elements are seen, in range mode).
    """

    def __init__(self, mode: str, names: List[str], sources: Dict[str, cst.BaseExpression], range_call=None) -> None:
        self.mode = mode
        self.names = names
        self.sources = sources
        self.range_call = range_call

    def element(self, node: cst.CSTNode) -> Optional[str]:
        if self.mode == "zip":
            if isinstance(node, cst.Name) and node.value in self.names:
                return node.value
            return None
        if (
            isinstance(node, cst.Subscript)
            and len(node.slice) == 1
            and isinstance(node.slice[0].slice, cst.Index)
            and isinstance(node.slice[0].slice.value, cst.Name)
            and node.slice[0].slice.value.value == self.names[0]
            and is_simple_ref(node.value)
            and self.names[0] not in names_read(node.value)
        ):
            key = _code(node.value)
            self.sources.setdefault(key, node.value)
            return key
        return None


def _bound_ok(expr: cst.BaseExpression, forbidden: Set[str], builtins_ok, imports=None) -> bool:
    """A range bound (evaluated by the guard, then again by the loop if it declines): a pure
    expression (pure calls from :mod:`.purity`'s table when ``imports`` is given: ``x.size(0)``),
    or ``len(ref)`` (arithmetic on those)."""
    if (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Name)
        and expr.func.value == "len"
        and builtins_ok("len")
        and len(expr.args) == 1
        and expr.args[0].keyword is None
        and not expr.args[0].star
        and is_simple_ref(expr.args[0].value)
        and not (names_read(expr.args[0].value) & forbidden)
    ):
        return True
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide)):
        return _bound_ok(expr.left, forbidden, builtins_ok, imports) and _bound_ok(expr.right, forbidden, builtins_ok, imports)
    return is_pure(expr, forbidden, imports)


def parse_header(node: cst.For, builtins_ok, imports=None) -> "LoopHeader | str":
    """The header of a vectorizable loop, or why it is not one. ``builtins_ok(name)`` says whether
    ``zip``/``range``/``len`` mean the builtins in this module."""
    if node.asynchronous is not None:
        return "async for"
    if node.orelse is not None:
        return "the loop has an else clause"
    return parse_iteration(node.target, node.iter, builtins_ok, imports)


def parse_iteration(target: cst.BaseExpression, it: cst.BaseExpression, builtins_ok, imports=None) -> "LoopHeader | str":
    """``target in it`` of a ``for`` loop or a comprehension, as a :class:`LoopHeader`, or why not."""
    names = target_names(target)
    if names is None or len(set(names)) != len(names):
        return "the loop target is not a name or a tuple of distinct names"
    if isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value in ("zip", "range"):
        func = it.func.value
        if not builtins_ok(func):
            return rebound_reason(builtins_ok, func)
        if any(a.star or a.keyword is not None for a in it.args):
            return f"{func}(...) has keyword or unpacked arguments"
        if func == "range":
            if len(names) != 1:
                return "a range loop must bind one index"
            if not 1 <= len(it.args) <= 3 or not all(_bound_ok(a.value, set(names), builtins_ok, imports) for a in it.args):
                return "range bounds are not plain values"
            return LoopHeader("range", names, {}, it)
        if len(it.args) != len(names):
            return "the loop target does not unpack one name per zipped iterable"
        bad = next((a.value for a in it.args if not is_simple_ref(a.value)), None)
        if bad is not None:
            return not_a_name(bad, "a zipped iterable")
        return LoopHeader("zip", names, {n: a.value for n, a in zip(names, it.args)})
    if len(names) != 1:
        return "the loop unpacks its elements"
    if not is_simple_ref(it):
        return not_a_name(it, "the iterable")
    return LoopHeader("zip", names, {names[0]: it})


def not_a_name(expr: cst.BaseExpression, what: str) -> str:
    """Why an iterable that is an expression is not batched, and what to write instead."""
    code = " ".join(_code(expr).split())
    if len(code) > 60:
        code = code[:57] + "..."
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and not expr.args \
            and expr.func.attr.value in ("parameters", "named_parameters"):
        return (f"iterates `{code}`: parameters of different shapes, which one batched expression cannot "
                "take (understood over parameters: a penalty `acc += p.pow(2).sum() * c`)")
    return (f"{what} `{code}` is an expression, not a name/attribute (the guard and the loop kept as "
            f"fallback would each evaluate it): bind it to a name before the loop (`items = {code}`, "
            "`list(...)` of a generator)")


def is_runtime_guard(test: cst.BaseExpression, imports) -> bool:
    """Whether an ``if`` test is a guard some transform emitted (its else branch holds original
    code kept verbatim: loops there are not rewritten again). Recognised by a call of a
    ``scalebox_cst.runtime`` helper or a ``_sb_``-prefixed name in the test."""
    finder = _GuardCall(imports)
    test.visit(finder)
    return finder.found


class _GuardCall(cst.CSTVisitor):
    """:func:`is_runtime_guard`'s visit (a class made per call stays alive, with what it holds,
    until a garbage collection: the pipeline turns the collector off while it rewrites)."""

    def __init__(self, imports) -> None:
        super().__init__()
        self.imports = imports
        self.found = False

    def visit_Call(self, n: cst.Call) -> None:
        qual = self.imports.qualify(n.func)
        if qual is not None and qual.startswith("scalebox_cst.runtime."):
            self.found = True

    def visit_Name(self, n: cst.Name) -> None:
        if n.value.startswith("_sb_"):
            self.found = True
