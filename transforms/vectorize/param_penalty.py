"""A penalty summed over a module's parameters → one sum over the parameters laid end to end.

Policy-gradient and TRPO code adds an L2 (or L1) penalty to a loss one parameter at a time::

    for param in value_net.parameters():
        value_loss += param.pow(2).sum() * l2_reg

two or three small kernels per parameter. The parameters have different shapes, so the batched
reduction of :mod:`.reduction` (which stacks equally shaped elements) cannot take it; but the
term is additive over the parameter's elements (an element-by-element function of the parameter,
summed whole, then scaled by a loop invariant), so it is the same term of all parameters
concatenated: ``value_loss += flat.pow(2).sum() * l2_reg`` with ``flat`` the flattened parameters
end to end (``runtime.loop_batch.flat_params``, which declines mixed dtypes or devices,
non-float32/64 dtypes, tensor subclasses, an accumulator that is not a number or tensor or that
shares memory with a parameter, and an empty module: the loop runs then). The sum is regrouped,
so sites are ``reassociated``; gradients flow through the same element-wise ops.
"""
from __future__ import annotations

from typing import List, Optional

import libcst as cst

from scalebox_cst.report import REASSOCIATED, REWRITTEN

from ..analysis.elementwise import ElementwiseExpr
from ..analysis.purity import is_pure
from ..analysis.reads import names_read, read_elsewhere
from ..analysis.scopes import declares_global

RUNTIME = "scalebox_cst.runtime.loop_batch"


def _parameters_of(it: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """``m`` for ``m.parameters()`` (no arguments)."""
    if isinstance(it, cst.Call) and not it.args and isinstance(it.func, cst.Attribute) \
            and it.func.attr.value == "parameters":
        return it.func.value
    return None


def _summed(expr: cst.BaseExpression, imports) -> Optional[cst.BaseExpression]:
    """``X`` for ``X.sum()`` or ``torch.sum(X)`` (no dim, no keywords)."""
    if not isinstance(expr, cst.Call):
        return None
    if isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "sum" and not expr.args \
            and imports.qualify(expr.func) is None:
        return expr.func.value
    if imports.qualify(expr.func) == "torch.sum" and len(expr.args) == 1 \
            and expr.args[0].keyword is None and not expr.args[0].star:
        return expr.args[0].value
    return None


def _split_term(expr: cst.BaseExpression, imports, forbidden) -> Optional[cst.BaseExpression]:
    """The summed part of ``S``, ``S * c``, ``c * S`` or ``S / c`` (``c`` a pure invariant)."""
    if _summed(expr, imports) is not None:
        return expr
    if isinstance(expr, cst.BinaryOperation) and not expr.lpar:
        if isinstance(expr.operator, (cst.Multiply, cst.Divide)) and _summed(expr.left, imports) is not None \
                and is_pure(expr.right, forbidden):
            return expr.left
        if isinstance(expr.operator, cst.Multiply) and _summed(expr.right, imports) is not None \
                and is_pure(expr.left, forbidden):
            return expr.right
    return None


def try_penalty(rw, loop: cst.For, idx: int, out: list, acc) -> Optional[bool]:
    """Rewrite ``loop`` (one accumulation ``acc``) if it sums a penalty over ``m.parameters()``;
    None when the loop is not of that form (the reduction's other paths then report it)."""
    module = _parameters_of(loop.iter)
    if module is None or not isinstance(loop.target, cst.Name) or acc.kind == "append" \
            or loop.orelse is not None or loop.asynchronous is not None:
        return None
    p = loop.target.value
    imports = rw.ctx.imports
    forbidden = {p, acc.name}
    summed_call = _split_term(acc.expr, imports, forbidden)
    if summed_call is None or names_read(module) & forbidden:
        return None
    inner = _summed(summed_call, imports)
    assert inner is not None
    analysis = ElementwiseExpr(imports, lambda e: "p" if isinstance(e, cst.Name) and e.value == p else None, forbidden)
    if analysis.check(inner) is not None or analysis.invariants:
        return None  # not element by element, or broadcast against a tensor (not additive once flattened)
    scope = rw.scopes[-1]
    if read_elsewhere(scope, loop, [p]):
        return rw._skip(loop, f"sums a penalty over `{rw.ctx.module.code_for_node(module)}.parameters()`, but the "
                              f"loop variable `{p}` may be read outside the loop (the rewrite does not bind it)")
    if declares_global(scope, [p, acc.name]):
        return rw._skip(loop, "an accumulator or loop variable is declared global/nonlocal")
    ctx = rw.ctx
    code = ctx.module.code_for_node
    params = ctx.imports.unique_name("_sb_params")
    flat = ctx.imports.unique_name("_sb_flat")
    helper = ctx.runtime_name(f"{RUNTIME}.flat_params", "_sb_flat_params")
    # the invariants the term scales by: checked by the guard (numbers or plain tensors)
    invariants: List[str] = []
    if isinstance(acc.expr, cst.BinaryOperation) and summed_call is not acc.expr:
        other = acc.expr.right if summed_call is acc.expr.left else acc.expr.left
        if not isinstance(other, (cst.Integer, cst.Float)):
            invariants.append(code(other))
    inv = "(" + ", ".join(invariants) + ("," if len(invariants) == 1 else "") + ")"
    new_sum = summed_call.visit(_Rename(p, flat))
    term = acc.expr.deep_replace(summed_call, new_sum) if summed_call is not acc.expr else new_sum
    term_code = code(term)
    if acc.kind == "aug":
        fast = f"{acc.name} {acc.op}= {term_code}"
    elif acc.kind == "assign_left":
        fast = f"{acc.name} = {acc.name} {acc.op} {term_code}"
    else:
        fast = f"{acc.name} = {term_code} + {acc.name}"
    lines = [
        cst.parse_statement(f"{params} = list({code(loop.iter)})\n").with_changes(leading_lines=loop.leading_lines),
        cst.parse_statement(f"{flat} = {helper}({params}, {acc.name}, {inv}) if {params} else None\n"),
    ]
    slow = out[idx].with_changes(leading_lines=(), iter=cst.Name(params))
    if_stmt = cst.If(
        test=cst.parse_expression(f"{flat} is not None"),
        body=cst.IndentedBlock(body=[cst.parse_statement(fast + "\n")]),
        orelse=cst.Else(body=cst.IndentedBlock(body=[slow])),
    )
    out[idx] = cst.FlattenSentinel(lines + [if_stmt])
    rw.sites.append(rw.make_site(
        loop, REWRITTEN,
        f"penalty summed over `{code(module)}.parameters()` → one sum over the parameters laid end to end "
        "(float sums agree to rounding); guarded by flat_params, else the loop",
        REASSOCIATED,
    ))
    return True


class _Rename(cst.CSTTransformer):
    """Every read of the loop variable ``p`` as the flattened parameters."""

    def __init__(self, p: str, flat: str) -> None:
        super().__init__()
        self.p, self.flat = p, flat

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        return updated.with_changes(value=self.flat) if original.value == self.p else updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.Attribute:
        return updated.with_changes(attr=original.attr)  # attribute names are not reads

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)
