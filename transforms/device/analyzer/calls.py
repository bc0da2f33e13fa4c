"""Calls replaced or given a keyword: ``torch.cuda.amp.autocast`` -> ``torch.autocast("npu", ...)``,
``NpuFused*`` optimizers (requested), ``fused=`` / ``foreach=`` on optimizers and clipping."""
from __future__ import annotations

import ast
from typing import Optional

import libcst as cst

from ...analysis.calls import has_star_args, positional_args
from ...names import ast_dotted
from .. import table as T
from ..edits import _EQUAL, _SPACE_COMMA, _Target, _append_args, _keep_parens, _new_arg
from ..facts import _version_tuple


def _installed_torch():
    """The package's ``installed_torch`` (tests replace it there to stand for another torch)."""
    from scalebox_cst.transforms import device

    return device.installed_torch()


class Calls:
    """Mixin of the analyzer: call-replace and add-kwarg entries (autocast, optimizers)."""

    def _call_replace(self, entry: T.Swap, node: ast.Call) -> None:
        if has_star_args(node):
            self.claimed.add(node)
            self.skip(entry, node, "*args/**kwargs: the arguments cannot be mapped")
            return
        pos = positional_args(node)
        keywords = [k.arg for k in node.keywords]
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
        lead_texts, params = entry.lead, entry.params

        def fn(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            lead = [_new_arg(None, cst.parse_expression(text)) for text in lead_texts]
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

        self.edit(entry, _Target(node), fn)

    def _npu_fused_problem(self, entry: T.Swap, node: ast.Call, pos, keywords) -> Optional[str]:
        if len(pos) > 1 + len(entry.accepts) or any(k not in entry.accepts for k in keywords):
            return f"arguments other than {', '.join(entry.accepts)} (NpuFused* takes no others)"
        if "bfloat16" in self.ctx.code:
            return "the module uses bfloat16, which NpuFused* optimizers reject"
        target = self._assigned_to(node)
        if target is None:
            return "the optimizer is not assigned to a name, so its zero_grad calls cannot be checked"
        for receiver, set_to_none in self.facts.zero_grads(self.ctx.tree):
            if receiver != target and set_to_none != "False":
                return (f"`{receiver}.zero_grad()` sets gradients to None, which breaks the "
                        "flattened gradient buffer of NpuFused*")
            if set_to_none == "other":
                return "zero_grad(set_to_none=...) is not supported by NpuFused* optimizers"
        return None

    def _assigned_to(self, node: ast.Call) -> Optional[str]:
        line = self.lines[-1] if self.lines else None
        if line is None:
            return None
        for stmt in line.stmts:
            if isinstance(stmt, ast.Assign) and stmt.value is node and len(stmt.targets) == 1:
                return ast_dotted(stmt.targets[0])
            if isinstance(stmt, ast.AnnAssign) and stmt.value is node:
                return ast_dotted(stmt.target)
        return None

    def _add_kwarg(self, entry: T.Swap, node: ast.Call) -> None:
        self.claimed.add(node)
        chosen = [k.arg for k in node.keywords if k.arg is not None and k.arg in entry.absent]
        if chosen:
            self.skip(entry, node, f"{chosen[0]}= set by the user: left as written")
            return
        if "no-star-kwargs" in entry.conditions and has_star_args(node):
            self.skip(entry, node, f"*args/**kwargs may already hold {entry.keyword}=")
            return
        if "never" in entry.conditions:
            self.skip(entry, node, entry.reason)
            return
        if "number-lr" in entry.conditions:
            why = _tensor_lr(node, self.ctx.tree)
            if why:
                self.skip(entry, node, f"{why}: torch refuses a tensor lr with {entry.keyword}={entry.value}, left as written")
                return
        installed = _installed_torch()
        if entry.min_torch and installed is not None and installed < _version_tuple(entry.min_torch):
            self.skip(entry, node, f"{entry.keyword}={entry.value} needs torch >= {entry.min_torch} here; "
                      f"the installed torch is {'.'.join(map(str, installed))}")
            return
        self.prepare(entry)
        value_text = entry.value
        if "{npu}" in value_text:
            value_text = value_text.format(npu=self.helper_alias())
        if entry.replacement:  # a runtime helper adds the keyword where the arguments allow it
            helper = self.ctx.runtime_name(entry.replacement, "_sbx_" + entry.replacement.rsplit(".", 1)[-1])
            self.edit(entry, _Target(node), lambda u: _wrap(u, helper))
            return
        keyword = entry.keyword
        self.edit(entry, _Target(node), lambda u: _append_args(u, [_new_arg(keyword, cst.parse_expression(value_text))]))


def _wrap(call: cst.CSTNode, helper: str) -> cst.CSTNode:
    """``f(args)`` -> ``helper(f, args)`` (the callee as written, first)."""
    assert isinstance(call, cst.Call)
    callee = cst.Arg(call.func, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if call.args else cst.MaybeSentinel.DEFAULT)
    return call.with_changes(func=cst.Name(helper), args=[callee, *call.args])


#: calls that make a number of a number (a learning rate passed through them stays a number)
_NUMBER_CALLS = frozenset({"float", "int", "round", "abs", "min", "max"})


def _tensor_lr(node: ast.Call, tree: ast.Module) -> Optional[str]:
    """Why the learning rate of the optimizer call ``node`` may be a tensor, or None where it is
    absent, a number, or names and attributes no statement of the module binds to a call's result
    (LeanRL and torchrl build ``Adam(..., lr=torch.tensor(lr, device=device))``, which
    ``foreach=True`` makes raise). A tensor handed in as a parameter is not seen: the constructor
    then raises at once (found by the differential review of 9 real files)."""
    lr = next((k.value for k in node.keywords if k.arg == "lr"), None)
    if lr is None:
        pos = positional_args(node)
        lr = pos[1] if len(pos) > 1 else None
    if lr is not None:
        why = _maybe_tensor(lr, tree)
        if why:
            return why
    # a parameter group's own lr (``[{"params": ..., "lr": torch.tensor(...)}]``, ``dict(lr=...)``,
    # ``add_param_group``): any such group the module spells, wherever it flows, unless the call
    # is given ``X.parameters()`` and nothing adds a group later
    pos = positional_args(node)
    first = pos[0] if pos else next((k.value for k in node.keywords if k.arg == "params"), None)
    if isinstance(first, ast.Call) and isinstance(first.func, ast.Attribute) and first.func.attr == "parameters" \
            and not any(isinstance(n, ast.Attribute) and n.attr == "add_param_group" for n in ast.walk(tree)):
        return None
    for n in [*(ast.walk(first) if first is not None else ()), *ast.walk(tree)]:  # its own groups first
        if isinstance(n, ast.Dict):
            values = [v for k, v in zip(n.keys, n.values) if isinstance(k, ast.Constant) and k.value == "lr"]
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "dict":
            values = [k.value for k in n.keywords if k.arg == "lr"]
        else:
            continue
        for v in values:
            why = _maybe_tensor(v, tree)
            if why:
                return f"a parameter group's lr (line {n.lineno}): {why}"
    return None


def _maybe_tensor(lr: ast.expr, tree: ast.Module) -> Optional[str]:
    """Why the learning-rate expression ``lr`` may be a tensor, or None."""
    if _makes_tensor(lr):
        return f"lr={ast.unparse(lr)} is computed by a call"
    # the whole names and attribute chains it reads (``args.lr``, not the ``args`` of
    # ``args = parser.parse_args()``)
    inner = {id(n.value) for n in ast.walk(lr) if isinstance(n, ast.Attribute)}
    spelled = {ast_dotted(n) for n in ast.walk(lr) if isinstance(n, (ast.Name, ast.Attribute)) and id(n) not in inner} - {None}
    for stmt in ast.walk(tree):
        if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and stmt.value is not None and _makes_tensor(stmt.value):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:
                for n in ast.walk(t):
                    name = ast_dotted(n) if isinstance(n, (ast.Name, ast.Attribute)) else None
                    if name is not None and name in spelled:
                        return f"`{name}` is bound to a call's result (line {stmt.lineno})"
    return None


def _makes_tensor(expr: ast.expr) -> bool:
    """Whether ``expr`` calls anything but a number builtin (its result may be a tensor)."""
    for n in ast.walk(expr):
        if isinstance(n, ast.Call) and not (isinstance(n.func, ast.Name) and n.func.id in _NUMBER_CALLS):
            return True
    return False

