"""``precision.autocast``: the forward passes of each training step under ``torch.autocast`` (issue 24
part 1; off by default: ``--transform precision.autocast`` or ``[precision] mode = "bf16"``).

What is wrapped: for each ``LOSS.backward()`` statement, the statements before it in the same block
that compute LOSS, walking back from LOSS's last assignment and keeping each statement whose
assigned names the kept ones read, up to the first that does not contribute (an action selection,
``zero_grad()``, a ``with torch.no_grad()`` target block, a loop). Those statements, and only those,
go into ``with torch.autocast(device_type=..., dtype=torch.bfloat16):``; the backward pass and the
optimizer step stay outside (autocast is for forwards). Action selection and target computation
therefore stay fp32: they do not flow into the loss's statement chain, or they sit in a ``no_grad``
block, which ends the chain.

Safety: ``with`` makes no scope, so every name keeps its binding; a statement is kept only if it is
a plain assignment to names (no ``return``/``yield``/``await``/``del``/``global`` can be moved), so
control flow is unchanged; a chain whose names may be read after it anywhere in its scope (after
the step, after the loop, in the loop's next round or an enclosing loop's, by a closure or
``locals()``: :mod:`.reads_after`) is left fp32, as they would be half precision there; the reason
names the name and the line. A second ``backward()`` through the same graph after a step (or any
statement but a backward or ``zero_grad``) leaves the chain fp32: the original raises on the
weights the step changed in place, and autocast's cast copies of them would hide that. What changes is precision
(bf16 matmuls and convolutions, autocast's own fp32 list for losses and reductions): exactness
``changes-semantics``, always reported. A file that already uses AMP (``autocast``,
``GradScaler``) is left alone and its AMP reported.

fp16 (``mode = "fp16"``): one module-level ``GradScaler`` threaded through each backward/step pair
of the block: ``scale(loss).backward()``, ``unscale_(opt)`` right after it (clips and grad_clip's
guard, told ``scaler=``, then see true gradients), ``step(opt)``, ``update()``. Only where no other
backward adds to the same gradients without a ``zero_grad`` between (:mod:`.accumulation`: two
losses before one step, a loop with no ``zero_grad``): ``unscale_`` would divide the unscaled
share by the scale, so such backwards are all left fp32, each reason naming the other's line (bf16
has no scaler: it wraps each of them). With the ranges of a
calibration run (``[precision] calibration``, set by scalebox_cst.calibration), a statement whose
line overflowed fp16 or underflowed its normal range, and the chain before it (its inputs), stay
outside autocast; the site reason lists them.
"""
from __future__ import annotations

import ast
from typing import List, Optional, Sequence, Set, Tuple

import libcst as cst

from scalebox_cst.report import CHANGES_SEMANTICS, REWRITTEN, SKIPPED, WARNING, Site

from ..base import Example, FileContext, Transform
from ..grad_clip.guard import GUARD_ALIAS
from .accumulation import shared_gradients, zeroes_gradients
from .reads_after import read_after_chain

DEVICE_TYPES = {"cpu": "cpu", "cuda": "cuda", "npu": "npu"}
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
AMP_NAMES = ("autocast", "GradScaler")


def _ast_of(stmt: cst.SimpleStatementLine) -> Optional[ast.stmt]:
    try:
        body = ast.parse(cst.Module(body=[stmt]).code.strip("\n")).body
    except SyntaxError:
        return None
    return body[0] if len(body) == 1 else None


def _targets(node: ast.stmt) -> Optional[Set[str]]:
    """Names a plain assignment binds; None for any other statement (not movable into the with)."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
        targets = [node.target]
    else:
        return None
    names: Set[str] = set()
    for target in targets:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Name):
                names.add(sub.id)
            elif not isinstance(sub, (ast.Tuple, ast.List, ast.Starred, ast.Load, ast.Store)):
                return None  # x.attr = ..., x[i] = ...: a write into an object, kept outside
    if any(isinstance(sub, (ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr, ast.Lambda)) for sub in ast.walk(node)):
        return None
    return names


def _reads(node: ast.stmt) -> Set[str]:
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
        names.add(node.target.id)
    return names


def _backward_name(node: Optional[ast.stmt]) -> Optional[str]:
    """LOSS of a ``LOSS.backward(...)`` statement."""
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        func = node.value.func
        if isinstance(func, ast.Attribute) and func.attr == "backward" and isinstance(func.value, ast.Name):
            return func.value.id
    return None


def region(nodes: Sequence[Optional[ast.stmt]], backward: int, loss: str) -> Optional[Tuple[int, int]]:
    """(first, last) statement indices computing ``loss`` before ``nodes[backward]``, or None."""
    last = next((i for i in range(backward - 1, -1, -1)
                 if (node := nodes[i]) is not None and loss in (_targets(node) or set())), None)
    if last is None:
        return None
    last_node = nodes[last]
    assert last_node is not None  # chosen above for binding the loss
    needed = _reads(last_node)
    first = last
    for i in range(last - 1, -1, -1):
        node = nodes[i]
        bound = _targets(node) if node is not None else None
        if node is None or not bound or not bound & needed:
            break
        needed |= _reads(node)
        first = i
    # the loss must not be read between its assignment and the backward in a way that could
    # depend on dtype outside: it is, by design (loss.backward) - nothing more to check there
    if not any(isinstance(n, ast.Call) for node in nodes[first:last + 1] if node is not None for n in ast.walk(node)):
        return None  # no forward pass in the chain
    return first, last


def _step_after(nodes: Sequence[Optional[ast.stmt]], k: int) -> Optional[int]:
    """Index of the ``OPT.step()`` that follows the backward at ``k`` in the block (no other
    backward, no compound statement between), else None."""
    for m in range(k + 1, len(nodes)):
        node = nodes[m]
        if node is None or _backward_name(node) is not None:
            return None
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and not node.value.args
                and not node.value.keywords and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr == "step" and isinstance(node.value.func.value, (ast.Name, ast.Attribute))):
            return m
    return None


def _reused_after_update(nodes: Sequence[Optional[ast.stmt]], before: int, k: int) -> Optional[int]:
    """Index of the first statement between two backwards through one graph that is neither a
    backward nor a ``zero_grad()`` (an optimizer step, say), else None. The original raises if such
    a statement updated a weight the graph saved; under autocast the graph saved a cast copy of it,
    and the second backward would run silently on the old weights."""
    for m in range(before + 1, k):
        node = nodes[m]
        if _backward_name(node) is not None:
            continue
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr == "zero_grad"):
            continue
        return m
    return None


FP16_MAX = 65504.0
FP16_TINY = 6.1e-5  # smallest normal fp16


def _range_text(rng) -> str:
    return f"{rng[1] if rng[1] is not None else 0:.2g}..{rng[0]:.2g}"


SCALER = "_scalebox_scaler"
GUARD = GUARD_ALIAS  # grad_clip runs before this transform: its guard is told about the scaler


class _Wrap(cst.CSTTransformer):
    def __init__(self, ctx: FileContext, torch_name: str, device_type: str, dtype: str, mode: str) -> None:
        super().__init__()
        self.ctx, self.torch, self.device_type, self.dtype, self.mode = ctx, torch_name, device_type, dtype, mode
        self.sites: List[Site] = []
        self.scaled = 0  # fp16 sites that use the module's GradScaler
        self.calibration = ctx.option("precision", "calibration") or {}
        self.kept: dict = {}  # (first, last) -> what calibration kept fp32
        self.scopes: List[cst.CSTNode] = []  # the module, functions and classes around the visit

    def visit_Module(self, node: cst.Module) -> None:
        self.scopes.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scopes.append(node)

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        self.scopes.pop()
        return updated

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.scopes.append(node)

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self.scopes.pop()
        return updated

    def _line(self, node: cst.CSTNode) -> int:
        return self.ctx.span(node)[0]

    def _escaped(self, block: cst.IndentedBlock, nodes, found: Tuple[int, int], loss: str) -> Optional[str]:
        """Why the chain's names cannot be half precision: one is read after the chain somewhere
        in its scope (the reason names it and the line), else None."""
        bound: Set[str] = set()
        for k in range(found[0], found[1] + 1):
            bound |= _targets(nodes[k]) or set()
        hit = read_after_chain(self.scopes[-1], block.body[found[0]:found[1] + 1], bound, loss)
        if hit is None:
            return None
        name, node, how = hit
        if how == "read":
            return f"{name} is read after the step (line {self._line(node)}), where it would be half precision: left fp32"
        return f"{name} {how} (line {self._line(node)}) after the step, where it would be half precision: left fp32"

    def _shared(self, block: cst.IndentedBlock, k: int, loss: str) -> Optional[str]:
        """fp16: why the backward at ``k`` gets no GradScaler: another backward adds to the same
        gradients with no zero_grad between (:mod:`.accumulation`), else None."""
        scope = self.scopes[-1]
        root = scope.body if isinstance(scope, (cst.FunctionDef, cst.ClassDef)) else scope
        other = shared_gradients(root, block.body[k])
        if other is None:
            if isinstance(scope, cst.FunctionDef) and not zeroes_gradients(root, block.body[k]):
                return (f"fp16: this function never calls zero_grad around {loss}.backward() (line "
                        f"{self._line(block.body[k])}): a GradScaler would shrink gradients left from an earlier call: left fp32")
            return None
        line, at = self._line(other), self._line(block.body[k])
        if line == at:
            return (f"fp16: {loss}.backward() (line {at}) adds to its previous round's gradients (no zero_grad between); "
                    "a GradScaler would shrink them: left fp32")
        return (f"fp16: backwards at line {min(line, at)} and line {max(line, at)} add to the same gradients with no zero_grad "
                "between; a GradScaler would mis-scale one: both left fp32")

    def _calibrated(self, stmts, nodes, found):
        """fp16 with calibration: the chain from after its last statement whose line overflowed fp16
        or underflowed its normal range (it and what feeds it stay fp32: autocast casts their
        outputs itself); (None, what) where nothing of the chain is left."""
        first, last = found
        flagged = []
        for i in range(first, last + 1):
            lo, hi = self.ctx.span(stmts[i])
            for line in range(lo, hi + 1):
                user = self.ctx.original_line(line)
                rng = self.calibration.get(f"{self.ctx.path}:{user}")
                if rng and (rng[0] is not None and float(rng[0]) > FP16_MAX or rng[1] is not None and float(rng[1]) < FP16_TINY):
                    flagged.append((i, f"line {line} (|x| {_range_text(rng)})"))
        if not flagged:
            return found, ""
        what = ", ".join(text for _, text in flagged[:3]) + (f" (+{len(flagged) - 3})" if len(flagged) > 3 else "")
        start = max(i for i, _ in flagged) + 1
        if start > last or not any(isinstance(n, ast.Call) for k in range(start, last + 1) for n in ast.walk(nodes[k])):
            return None, what
        return (start, last), what

    def _scale(self, body: list, k: int, m: int) -> None:
        """fp16: ``S.scale(loss).backward()``, ``S.unscale_(opt)`` right after it (so a clip or the
        stabilizer guard between sees true gradients), ``S.step(opt)``, ``S.update()``."""
        step_call = body[m].body[0].value
        opt = cst.Module([]).code_for_node(step_call.func.value)
        for j in range(k + 1, m):  # grad_clip's guard: told the scaler skips non-finite steps itself
            stmt = body[j]
            expr = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
            if not isinstance(expr, cst.Expr) or not isinstance(expr.value, cst.Call):
                continue
            call = expr.value
            if (isinstance(call.func, cst.Name) and call.func.value == GUARD
                    and not any(a.keyword is not None and a.keyword.value == "scaler" for a in call.args)):
                arg = cst.Arg(keyword=cst.Name("scaler"), value=cst.Name(SCALER),
                              equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))
                args = [*call.args[:-1], call.args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), arg]
                body[j] = stmt.with_changes(body=[expr.with_changes(value=call.with_changes(args=args))])
        body[m:m + 1] = [cst.parse_statement(f"{SCALER}.step({opt})").with_changes(leading_lines=body[m].leading_lines),
                         cst.parse_statement(f"{SCALER}.update()")]
        line = body[k]
        call = line.body[0].value
        scaled = call.with_changes(func=call.func.with_changes(value=cst.parse_expression(f"{SCALER}.scale({call.func.value.value})")))
        body[k:k + 1] = [line.with_changes(body=[line.body[0].with_changes(value=scaled)]),
                         cst.parse_statement(f"{SCALER}.unscale_({opt})")]
        self.scaled += 1

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        nodes = [_ast_of(s) if isinstance(s, cst.SimpleStatementLine) else None for s in updated.body]
        body = list(updated.body)
        spans: List[Tuple[int, int, int, Optional[int]]] = []
        for k, node in enumerate(nodes):
            loss = _backward_name(node)
            if loss is None:
                continue
            found = region(nodes, k, loss)
            if found is None:
                self.sites.append(self.ctx.site(AutocastTransform.id, original.body[k], SKIPPED,
                                                f"{loss}.backward(): no forward chain computing {loss} right before it in this block"))
                continue
            if spans and found[0] <= spans[-1][2]:  # a second backward through the previous one's graph
                reused = _reused_after_update(nodes, spans[-1][2], k)
                if reused is None:
                    continue
                prev = spans.pop()
                self.sites.append(self.ctx.site(AutocastTransform.id, original.body[k], SKIPPED,
                                                f"{loss}.backward() at line {self._line(original.body[k])} reruns line "
                                                f"{self._line(original.body[prev[2]])}'s graph after line "
                                                f"{self._line(original.body[reused])}: left fp32 (autocast's weight "
                                                "copies would hide an in-place update)"))
                continue
            escaped = self._escaped(original, nodes, found, loss)
            if escaped:
                self.sites.append(self.ctx.site(AutocastTransform.id, original.body[found[0]], SKIPPED, escaped))
                continue
            step = _step_after(nodes, k) if self.mode == "fp16" else None
            if self.mode == "fp16" and step is None:
                self.sites.append(self.ctx.site(AutocastTransform.id, original.body[k], SKIPPED,
                                                "fp16: no OPT.step() after this backward in its block for the GradScaler"))
                continue
            shared = self._shared(original, k, loss) if self.mode == "fp16" else None
            if shared:
                self.sites.append(self.ctx.site(AutocastTransform.id, original.body[k], SKIPPED, shared))
                continue
            if self.mode == "fp16" and self.calibration:
                found, kept = self._calibrated(original.body, nodes, found)
                if found is None:
                    self.sites.append(self.ctx.site(AutocastTransform.id, original.body[k], SKIPPED,
                                                    f"calibration: {kept} outside fp16's range; the whole chain stays fp32"))
                    continue
                self.kept[found] = kept
            spans.append((*found, k, step))
        for first, last, k, step in reversed(spans):
            lo, _ = self.ctx.span(original.body[first])
            _, hi = self.ctx.span(original.body[last])
            if step is not None:
                self._scale(body, k, step)
            call = cst.parse_expression(f"{self.torch}.autocast(device_type={self.device_type!r}, dtype={self.torch}.{self.dtype})")
            head = body[first]
            assert isinstance(head, cst.SimpleStatementLine)  # a chain is simple statements (nodes)
            inner = [head.with_changes(leading_lines=()), *body[first + 1:last + 1]]
            body[first:last + 1] = [cst.With(items=[cst.WithItem(call)], body=cst.IndentedBlock(body=inner),
                                             leading_lines=head.leading_lines)]
            scaler = "; GradScaler: scale, unscale_, step, update" if step is not None else ""
            if self.kept.get((first, last)):
                scaler += f"; kept fp32 by calibration: {self.kept[(first, last)]}"
            self.sites.append(Site(AutocastTransform.id, lo, hi, REWRITTEN,
                                   f"loss forward under autocast({self.device_type}, {self.dtype}); backward, step, "
                                   f"acting and targets stay fp32{scaler}", CHANGES_SEMANTICS))
        return updated.with_changes(body=body) if spans else updated


def _add_scaler(module: cst.Module, line: str) -> cst.Module:
    """The module's one GradScaler, after its last top-level import (it lives across steps)."""
    body = list(module.body)
    at = 0
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and any(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body):
            at = i + 1
        elif not (isinstance(stmt, cst.SimpleStatementLine) and i == 0):  # a docstring may come first
            break
    body.insert(at, cst.parse_statement(line))
    return module.with_changes(body=body)


class AutocastTransform(Transform):
    id = "precision.autocast"
    triggers = (".backward(",)
    description = "Wrap each training step's loss forward in torch.autocast (bf16); off by default."

    def rewrite(self, ctx: FileContext) -> Tuple[cst.Module, List[Site]]:
        mode = ctx.option("precision", "mode", "bf16")
        device_type = DEVICE_TYPES.get(ctx.backend, "cpu")
        amp = [n for n in ast.walk(ctx.tree) if (isinstance(n, ast.Attribute) and n.attr in AMP_NAMES)
               or (isinstance(n, ast.Name) and n.id in AMP_NAMES)]
        if mode == "fp16" and SCALER in ctx.code:
            return ctx.module, [Site(self.id, 1, 1, SKIPPED, f"{SCALER} is already a name in this file")]
        if amp:
            line = min(n.lineno for n in amp)
            return ctx.module, [Site(self.id, line, line, WARNING, "AMP already in this file (autocast/GradScaler): left alone")]
        torch_name = next((alias for alias, qual in ctx.imports.aliases.items() if qual == "torch"), None)
        if torch_name is None:
            return ctx.module, []
        wrap = _Wrap(ctx, torch_name, device_type, DTYPES[mode], mode)
        _ = ctx.positions  # resolved on the module the visit starts from (its nodes key the positions)
        module = ctx.module.visit(wrap)
        if wrap.scaled:
            module = _add_scaler(module, f"{SCALER} = {torch_name}.amp.GradScaler({device_type!r})\n")
        return module, wrap.sites

    EXAMPLES = (
        Example(
            code=(
                "import torch\n"
                "def update(actor, critic, opt, obs, act, rew, nxt):\n"
                "    with torch.no_grad():\n"
                "        target = rew + 0.99 * critic(nxt, actor(nxt))\n"
                "    q = critic(obs, act)\n"
                "    loss = ((q - target) ** 2).mean()\n"
                "    opt.zero_grad()\n"
                "    loss.backward()\n"
                "    opt.step()\n"
            ),
            rewritten=True,
            note="critic loss chain under bf16 autocast, the no_grad target outside",
            expected="critic_loss_chain",
        ),
        Example(
            code=(
                "import torch\n"
                "def update(model, opt, x, scaler):\n"
                "    with torch.autocast('cuda'):\n"
                "        loss = model(x).mean()\n"
                "    scaler.scale(loss).backward()\n"
            ),
            rewritten=False,
            reason="AMP already in this file",
        ),
        Example(
            code="import torch\ndef f(loss, opt):\n    loss.backward()\n    opt.step()\n",
            rewritten=False,
            reason="no forward chain",
        ),
    )
