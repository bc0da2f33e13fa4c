"""``accelerate.fused_optim`` (opt in: ``[accelerate] level = "reassociated"``, ``scalebox rewrite
--fast``): ``torch.optim.Adam``/``AdamW`` built with torch's fused kernel where it takes every
parameter.

Why: every public small-network script measured builds ``optim.Adam``; on CPU torch runs its
``for``-loop implementation (``foreach`` is its default only for CUDA tensors), about ten small
ops per parameter tensor per step. The fused kernel (``fused=True``, CPU since torch 2.4) does the
step in one call: CleanRL's PPO agent (two 64-unit MLPs, 10 tensors) 467 us -> 118 us per step,
a whole forward+backward+step 1.22 ms -> 0.82 ms (benchmarks/bench_fast_cpu.py).

What is rewritten: a call that resolves to ``torch.optim.Adam`` / ``torch.optim.AdamW`` (or
their ``torch.optim.adam``/``adamw`` module paths) becomes
``fused_optimizer(<the callee>, <the same arguments>)`` (runtime/fused_optimizer.py), which adds
``fused=True`` only where every parameter is a dense floating-point tensor on CPU or CUDA and
torch has the fused CPU kernel, and otherwise builds the call as written (torch checks fused's
device and dtype only at the first ``step``: the helper checks at construction instead).

Left alone, each with its reason: a call that passes ``fused``, ``foreach``, ``capturable`` or
``differentiable`` (the user chose the implementation), or unpacks ``*args``/``**kwargs`` (one of
them could); every call in a file that calls ``.add_param_group(`` (parameters added later are
not seen at construction) or that subclasses an optimizer. CPU backend only: on CUDA ``device.optimizer``'s
table adds ``fused=True`` already; NPU has no fused kernel measured. Exactness: the same Adam formula with the operations in another order; parameters
differ in the last bits after a step (1.5e-7 after 200 steps of a 64-unit net) and, as any float
noise, more over a run: ``reassociated``. Learning curves over seeds must match within noise
(docs/accelerate.md). ``foreach=True`` is bitwise equal to the loop but only 1.3x per step;
it is not what this transform emits. A state dict saved by a fused optimizer carries
``fused: True`` in its groups (loading it into the original makes that one fused), and loading
a non-fused one makes the rewrite's optimizer non-fused again: slower, never wrong.
"""
from __future__ import annotations

import ast
from typing import List, Optional, Tuple

import libcst as cst

from scalebox_cst.report import REASSOCIATED, REWRITTEN, SKIPPED, Site

from ..base import FileContext, Transform
from ..hot.bindings import PrunedTransformer, visit_calls
from .fused_optim_examples import EXAMPLES

ID = "accelerate.fused_optim"
RUNTIME = "scalebox_cst.runtime.fused_optimizer.fused_optimizer"

_OPTIMIZERS = {
    "torch.optim.Adam": "Adam", "torch.optim.adam.Adam": "Adam",
    "torch.optim.AdamW": "AdamW", "torch.optim.adamw.AdamW": "AdamW",
}
#: keywords that choose the implementation (fused and foreach exclude each other; differentiable
#: excludes fused; capturable is kept as the user set it)
_CHOSEN = ("fused", "foreach", "capturable", "differentiable")
_MEASURED = "CleanRL's PPO agent 467 -> 118 us per step"


def _file_problem(tree: ast.Module, imports) -> Optional[Tuple[int, str]]:
    """A reason (and line) that keeps every optimizer of the file as written, or None."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_param_group":
            return node.lineno, "the file adds parameter groups later (add_param_group): not checked at construction"
        if isinstance(node, ast.ClassDef) and any(
                (imports.qualify(b) or "").startswith("torch.optim") for b in node.bases):
            return node.lineno, f"the file subclasses an optimizer ({node.name}): its step may not take fused"
    return None


class _Rewriter(PrunedTransformer):
    def __init__(self, ctx: FileContext, sites: List[Site], blocked: Optional[str]) -> None:
        super().__init__()
        self.ctx, self.sites, self.blocked = ctx, sites, blocked
        self.alias: Optional[str] = None

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name = _OPTIMIZERS.get(self.ctx.imports.qualify(original.func) or "")
        if name is None:
            return updated

        def skip(reason: str) -> cst.Call:
            self.sites.append(self.ctx.site(ID, original, SKIPPED, f"{name}(...): {reason}; kept as written"))
            return updated

        if self.blocked:
            return skip(self.blocked)
        if any(a.star for a in original.args):
            return skip("unpacked arguments (they could choose the implementation)")
        chosen = [a.keyword.value for a in original.args if a.keyword is not None and a.keyword.value in _CHOSEN]
        if chosen:
            return skip(f"{chosen[0]}= is given (the implementation is chosen)")
        if not original.args:
            return skip("no parameters given")
        if self.alias is None:
            self.alias = self.ctx.runtime_name(RUNTIME, "_sbx_fused_optimizer")
        self.sites.append(self.ctx.site(ID, original, REWRITTEN, (
            f"{name}(...) with fused=True where every parameter is a dense float tensor on CPU/CUDA (checked at "
            f"construction, else as written): one kernel per step ({_MEASURED}); same formula, another "
            "operation order (last bits differ)"), REASSOCIATED))
        callee = cst.Arg(updated.func, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return cst.Call(func=cst.Name(self.alias), args=[callee, *updated.args],
                        whitespace_before_args=updated.whitespace_before_args)


class AccelerateFusedOptim(Transform):
    id = ID
    version = "1"
    triggers = ("Adam",)
    #: CUDA: device.optimizer's table already adds fused=True there; NPU: no fused kernel measured
    backends = ("cpu",)
    description = "opt-in (level reassociated): Adam/AdamW built with torch's fused kernel where it takes every parameter"

    EXAMPLES = EXAMPLES
    options_section = "accelerate"

    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        if ctx.option("accelerate", "level", "exact") != "reassociated":
            return None, []
        tree, imports = ctx.tree, ctx.imports
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and imports.qualify(n.func) in _OPTIMIZERS]
        if not calls:
            return None, []
        problem = _file_problem(tree, imports)
        sites: List[Site] = []
        rewriter = _Rewriter(ctx, sites, problem[1] if problem else None)
        # each call is decided by itself: only the statements holding them visited and positioned
        out = visit_calls(ctx, calls, rewriter, scoped=False)
        if rewriter.alias is None:
            return None, sites
        return out, sites
