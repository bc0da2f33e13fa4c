"""Replace element-by-element index loops and comprehensions with slice expressions.

``for i in range(n): out[i] = f(a[i], b[i], c)`` and ``torch.stack([f(x) for x in xs])`` run one
tiny op per element per operation; the rewrite evaluates ``f`` once on batched tensors:
``out[0:n] = f(a[0:n], b[0:n], c)``. Each element goes through the same operations in the same
order, so the values are bitwise the same (``exact``) when ``f`` uses only correctly rounded
operations (+ - * /, sqrt, abs, clamp, min/max...); transcendental functions (exp, tanh...)
may round differently in vectorized kernels (``reassociated``).

Static checks: no loop-carried dependence (``f`` does not read any output, reads only the current
element of each sequence), no early exit, nothing but element-wise assignments in the body, the
index is not read after the loop. Run-time guards (``scalebox_cst.runtime.loop_batch``): tensors
of one floating dtype and device, in-range indices, outputs that share no memory with inputs;
otherwise the original loop (or comprehension) runs, verbatim.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Tuple, Union

import libcst as cst

from scalebox_cst.report import EXACT, REASSOCIATED, REWRITTEN, SKIPPED, Site

from .base import Example, FileContext, Transform
from .loop_analysis import (
    is_runtime_guard,
    ElementwiseExpr,
    LoopHeader,
    early_exit_reason,
    flat_body,
    is_simple_ref,
    parse_header,
    parse_iteration,
    read_elsewhere,
    rebinds,
)

ID = "vectorize.elementwise"
RUNTIME = "scalebox_cst.runtime.loop_batch"
INEXACT_NOTE = "vectorized transcendental kernels may differ from per-element ones by a few ulp"


def _sanitize(key: str) -> str:
    return re.sub(r"\W+", "_", key).strip("_") or "x"


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _index_assign(stmt: cst.BaseSmallStatement, index: str) -> Optional[Tuple[cst.BaseExpression, cst.BaseExpression]]:
    """``OUT[i] = E`` → (OUT, E)."""
    if not (isinstance(stmt, cst.Assign) and len(stmt.targets) == 1):
        return None
    target = stmt.targets[0].target
    if (
        isinstance(target, cst.Subscript)
        and len(target.slice) == 1
        and isinstance(target.slice[0].slice, cst.Index)
        and isinstance(target.slice[0].slice.value, cst.Name)
        and target.slice[0].slice.value.value == index
    ):
        return target.value, stmt.value
    return None


class _Rewriter(cst.CSTTransformer):
    def __init__(self, ctx: FileContext, sites: List[Site]) -> None:
        super().__init__()
        self.ctx = ctx
        self.sites = sites
        self.scopes: List[cst.CSTNode] = []
        self.guards: List[bool] = []  # enclosing ifs: is each a guard another rewrite emitted?
        self._rebound: Dict[str, bool] = {}
        self._comprehensions = 0  # enclosing comprehensions: no := there

    def builtin_ok(self, name: str) -> bool:
        if name not in self._rebound:
            self._rebound[name] = rebinds(self.ctx.module, name)
        return not self._rebound[name]

    def visit_Module(self, node: cst.Module) -> None:
        self.scopes.append(node)

    def visit_If(self, node: cst.If) -> None:
        self.guards.append(is_runtime_guard(node.test, self.ctx.imports))

    def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
        self.guards.pop()
        return updated

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scopes.append(node)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.scopes.append(node)

    def leave_FunctionDef(self, original, updated):
        self.scopes.pop()
        return updated

    def visit_ListComp(self, node) -> None:
        self._comprehensions += 1

    def leave_ListComp(self, original, updated):
        self._comprehensions -= 1
        return updated

    def visit_SetComp(self, node) -> None:
        self._comprehensions += 1

    def leave_SetComp(self, original, updated):
        self._comprehensions -= 1
        return updated

    def visit_DictComp(self, node) -> None:
        self._comprehensions += 1

    def leave_DictComp(self, original, updated):
        self._comprehensions -= 1
        return updated

    def visit_GeneratorExp(self, node) -> None:
        self._comprehensions += 1

    def leave_GeneratorExp(self, original, updated):
        self._comprehensions -= 1
        return updated

    def leave_ClassDef(self, original, updated):
        self.scopes.pop()
        return updated

    def _site(self, node: cst.CSTNode, action: str, reason: str, exactness: Optional[str] = None) -> None:
        self.sites.append(self.ctx.site(ID, node, action, reason, exactness))

    def _invariant_args(self, analyses: Sequence[ElementwiseExpr]) -> List[str]:
        out: List[cst.BaseExpression] = []
        for a in analyses:
            for inv in a.invariants:
                if not any(inv.deep_equals(e) for e in out):
                    out.append(inv)
        return [_code(e) for e in out]

    @staticmethod
    def _tuple(items: List[str]) -> str:
        if not items:
            return "()"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"

    # ---------------------------------------------------------------- for i in range(n): out[i] = E
    def visit_IfExp(self, node: cst.IfExp) -> None:
        self.guards.append(is_runtime_guard(node.test, self.ctx.imports))

    def leave_IfExp(self, original: cst.IfExp, updated: cst.IfExp) -> cst.IfExp:
        self.guards.pop()
        return updated

    def leave_For(self, original: cst.For, updated: cst.For) -> Union[cst.For, cst.FlattenSentinel]:
        if any(self.guards):
            return updated  # original code kept under another rewrite's guard
        stmts = flat_body(original.body)
        if stmts is None or not stmts:
            return updated
        header = parse_header(original, self.builtin_ok)
        index = header.names[0] if isinstance(header, LoopHeader) and header.mode == "range" else None
        pairs = [_index_assign(s, index) if index else None for s in stmts]
        if not any(pairs):
            if isinstance(original.iter, cst.Call) and isinstance(original.iter.func, cst.Name) and original.iter.func.value == "range":
                # a range loop writing out[i]: report why it is not one
                target = original.target
                if isinstance(target, cst.Name) and any(_index_assign(s, target.value) for s in stmts):
                    self._site(original, SKIPPED, header if isinstance(header, str) else "not an element-wise loop")
            return updated
        assert isinstance(header, LoopHeader)
        why = early_exit_reason(original.body)
        if why:
            self._site(original, SKIPPED, why)
            return updated
        bad = next((s for s, p in zip(stmts, pairs) if p is None), None)
        if bad is not None:
            self._site(original, SKIPPED, f"the body also runs `{_code(bad).strip()}`, which is not an element-wise assignment")
            return updated
        outs = [p[0] for p in pairs if p is not None]
        if not all(is_simple_ref(o) for o in outs):
            self._site(original, SKIPPED, "an output is not a plain name/attribute")
            return updated
        out_codes = [_code(o) for o in outs]
        if len(set(out_codes)) != len(out_codes):
            self._site(original, SKIPPED, "the body writes the same output twice")
            return updated
        analyses: List[ElementwiseExpr] = []
        for out, (_, expr) in zip(out_codes, pairs):  # type: ignore[misc]
            analysis = ElementwiseExpr(self.ctx.imports, header.element, set(header.names))
            reason = analysis.check(expr)
            if reason is None and set(analysis.keys) & set(out_codes):
                reason = "the body reads an output it writes (possible loop-carried dependence)"
            if reason is None and any(_code(inv) in out_codes for inv in analysis.invariants):
                reason = "the body reads an output it writes (possible loop-carried dependence)"
            if reason:
                self._site(original, SKIPPED, reason)
                return updated
            analyses.append(analysis)
        live = read_elsewhere(self.scopes[-1], original, header.names)
        if live:
            self._site(original, SKIPPED, f"the loop index {', '.join(sorted(live))} may be read outside the loop")
            return updated
        return self._emit_loop(original, updated, header, outs, pairs, analyses)

    def _emit_loop(self, original, updated, header: LoopHeader, outs, pairs, analyses) -> cst.FlattenSentinel:
        ctx = self.ctx
        keys: List[str] = []
        for a in analyses:
            keys.extend(k for k in a.keys if k not in keys)
        names = {k: ctx.imports.unique_name(f"_sb_{_sanitize(k)}") for k in keys}
        batch = ctx.imports.unique_name("_sb_batch")
        rows = ctx.imports.unique_name("_sb_rows")
        helper = ctx.runtime_name(f"{RUNTIME}.batch_range", "_sb_batch_range")
        seqs = [_code(header.sources[k]) for k in keys]
        call = (
            f"{helper}({_code(header.range_call)}, {self._tuple(seqs)}, {self._tuple(self._invariant_args(analyses))}, "
            f"(), {self._tuple([_code(o) for o in outs])}, 0, True)"
        )
        unpack = ", ".join([names[k] for k in keys] + [rows])
        fast = [f"{unpack} = {batch}"]
        for out, (_, expr), analysis in zip(outs, pairs, analyses):
            fast.append(f"{_code(out)}[{rows}] = {_code(analysis.batched(expr, names))}")
        exact = all(a.exact for a in analyses)
        if_stmt = cst.If(
            test=cst.parse_expression(f"{batch} is not None"),
            body=cst.IndentedBlock(body=[cst.parse_statement(line + "\n") for line in fast]),
            orelse=cst.Else(body=cst.IndentedBlock(body=[updated.with_changes(leading_lines=())])),
        )
        assign = cst.parse_statement(f"{batch} = {call}\n").with_changes(leading_lines=updated.leading_lines)
        what = ", ".join(f"{_code(o)}[...]" for o in outs)
        if exact:
            self._site(original, REWRITTEN, f"one slice assignment per output ({what}); same ops per element", EXACT)
        else:
            self._site(original, REWRITTEN, f"one slice assignment per output ({what}); {INEXACT_NOTE}", REASSOCIATED)
        return cst.FlattenSentinel([assign, if_stmt])

    # ---------------------------------------------------------------- torch.stack([E for x in xs])
    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if any(self.guards):
            return updated
        qual = self.ctx.imports.qualify(original.func)
        if qual not in ("torch.stack", "torch.cat", "torch.concat", "torch.concatenate"):
            return updated
        args = list(original.args)
        if not args or args[0].keyword is not None or args[0].star or not isinstance(args[0].value, cst.ListComp):
            return updated
        comp = args[0].value
        kind = "stack" if qual == "torch.stack" else "cat"
        rest = args[1:]
        if len(rest) > 1 or (
            rest
            and (
                rest[0].star
                or (rest[0].keyword is not None and rest[0].keyword.value != "dim")
                or not (isinstance(rest[0].value, cst.Integer) and rest[0].value.value == "0")
            )
        ):
            self._site(original, SKIPPED, f"torch.{kind} over a dimension other than 0")
            return updated
        fo = comp.for_in
        if fo.inner_for_in is not None or fo.ifs or fo.asynchronous is not None:
            self._site(original, SKIPPED, "the comprehension has several for clauses or a filter")
            return updated
        header = parse_iteration(fo.target, fo.iter, self.builtin_ok)
        if isinstance(header, str):
            self._site(original, SKIPPED, header)
            return updated
        analysis = ElementwiseExpr(self.ctx.imports, header.element, set(header.names))
        reason = analysis.check(comp.elt)
        if reason:
            self._site(original, SKIPPED, reason)
            return updated
        if self._comprehensions:
            self._site(original, SKIPPED, "inside another comprehension (no room for the guard's :=)")
            return updated
        return self._emit_comp(original, updated, header, analysis, comp, kind)

    def _emit_comp(self, original, updated, header: LoopHeader, analysis: ElementwiseExpr, comp, kind) -> cst.BaseExpression:
        ctx = self.ctx
        batch = ctx.imports.unique_name("_sb_batch")
        names = {k: f"{batch}[{i}]" for i, k in enumerate(analysis.keys)}
        seqs = [_code(header.sources[k]) for k in analysis.keys]
        invs = self._tuple(self._invariant_args([analysis]))
        min_ndim = 1 if kind == "cat" else 0
        if header.mode == "range":
            helper = ctx.runtime_name(f"{RUNTIME}.batch_range", "_sb_batch_range")
            call = f"{helper}({_code(header.range_call)}, {self._tuple(seqs)}, {invs}, (), (), {min_ndim})"
        else:
            helper = ctx.runtime_name(f"{RUNTIME}.batch_zip", "_sb_batch_zip")
            call = f"{helper}({self._tuple(seqs)}, {invs}, (), (), {min_ndim})"
        value = _code(analysis.batched(comp.elt, names))
        shape = ".contiguous()" if kind == "stack" else ".contiguous().flatten(0, 1)"
        text = f"(({value}){shape} if ({batch} := {call}) is not None else {_code(updated)})"
        if analysis.exact:
            self._site(original, REWRITTEN, f"torch.{kind} of an element-wise comprehension → one batched expression; same ops per element", EXACT)
        else:
            self._site(original, REWRITTEN, f"torch.{kind} of an element-wise comprehension → one batched expression; {INEXACT_NOTE}", REASSOCIATED)
        return cst.parse_expression(text)


class VectorizeElementwise(Transform):
    id = ID
    version = "1"
    triggers = ("for ",)
    description = "element-wise index loops and stacked comprehensions → slice expressions (guarded)"

    EXAMPLES = [
        Example(
            code=(
                "import torch\n"
                "def scale(rewards, values, out, gamma):\n"
                "    for i in range(len(rewards)):\n"
                "        out[i] = rewards[i] + gamma * values[i]\n"
                "    return out\n"
            ),
            rewritten=True,
            note="indexed loop into a preallocated buffer",
        ),
        Example(
            code=(
                "import torch\n"
                "def clip(ratio, eps, n):\n"
                "    clipped = torch.zeros(n)\n"
                "    for t in range(n):\n"
                "        clipped[t] = torch.clamp(ratio[t], 1 - eps, 1 + eps)\n"
                "    return clipped\n"
            ),
            rewritten=True,
            note="clamp into a fresh tensor",
        ),
        Example(
            code=(
                "import torch\n"
                "def feats(xs, w):\n"
                "    return torch.stack([torch.tanh(x * w) for x in xs])\n"
            ),
            rewritten=True,
            note="stack of a comprehension (tanh: reassociated)",
        ),
        Example(
            code=(
                "import torch\n"
                "def adv(returns, values):\n"
                "    return torch.cat([r - v for r, v in zip(returns, values)])\n"
            ),
            rewritten=True,
            note="cat of a zipped comprehension",
        ),
        Example(
            code=(
                "import torch\n"
                "def smooth(x, out):\n"
                "    for i in range(1, len(x)):\n"
                "        out[i] = 0.5 * (x[i] + x[i - 1])\n"
                "    return out\n"
            ),
            rewritten=False,
            reason="not the current element",
            note="reads the previous element",
        ),
        Example(
            code=(
                "import torch\n"
                "def running(x):\n"
                "    for i in range(1, len(x)):\n"
                "        x[i] = x[i] * 0.9\n"
                "    return x\n"
            ),
            rewritten=False,
            reason="reads an output",
            note="in-place update reads the output",
        ),
        Example(
            code=(
                "import torch\n"
                "def f(obs, out, norm):\n"
                "    for i in range(len(obs)):\n"
                "        out[i] = norm(obs[i])\n"
                "    return out\n"
            ),
            rewritten=False,
            reason="not known to act element by element",
            note="calls a running normaliser per element",
        ),
        Example(
            code=(
                "import torch\n"
                "def f(nets, x):\n"
                "    return torch.stack([net(x) for net in nets])\n"
            ),
            rewritten=False,
            reason="not known to act element by element",
            note="ensemble forward passes",
        ),
        Example(
            code=(
                "import torch\n"
                "def f(x, out):\n"
                "    for i in range(len(x)):\n"
                "        out[i] = x[i] * 2\n"
                "    return i\n"
            ),
            rewritten=False,
            reason="may be read outside the loop",
            note="index used after the loop",
        ),
    ]

    def rewrite(self, ctx: FileContext) -> Tuple[cst.Module, List[Site]]:
        sites: List[Site] = []
        new = ctx.module.visit(_Rewriter(ctx, sites))
        return new, sites
