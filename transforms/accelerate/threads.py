"""``accelerate.threads`` (opt in: ``[accelerate] level = "reassociated"``, ``scalebox rewrite
--fast``; CPU): one intra-op thread where the networks are small and the user set no thread count.

Why: with ``OMP_NUM_THREADS`` unset (the default on a user's machine) torch spreads every op
over all cores; a small MLP's ops are too short to split, and the threads spin at barriers.
Measured on this project's 2-core machine: minimalRL's ``dqn.py`` with ``OMP_NUM_THREADS`` unset,
96.6 s CPU / 101.6 s wall as written against 6.5 s / 6.7 s with ``--fast`` (runtime/intra_op.py).

What is rewritten: the construction of a ``torch.optim`` optimizer (``optim.Adam(...)``, any
class of ``torch.optim``, or ``accelerate.fused_optim``'s wrapped call) becomes
``one_thread_for_small_nets(<the call>)``, which returns the optimizer unchanged and, the first
time only, calls ``torch.set_num_threads(1)`` if ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` are
unset, torch runs several threads, and the optimizer holds at most 1e6 parameters (the
optimizer is where the program says which networks it trains, and how big they are).

Left alone: an optimizer already built inside ``one_thread_for_small_nets`` (this transform's own
output, rewritten again); every call of a file that sets threads itself (``torch.set_num_threads``,
``set_num_interop_threads``, ``os.environ[...]`` / ``putenv`` of a thread variable): the user
chose. Not seen: such a call in another file of the program (the environment variables are
seen at run time). Exactness: the same ops; a reduction split over one thread instead of
several may round differently, so ``reassociated``. What is not measured: wall time on an idle
many-core machine for a small net trained on large batches (threads may help there);
``SCALEBOX_THREADS=keep`` keeps torch's threads.
"""
from __future__ import annotations

import ast
from typing import List, Optional, Tuple

import libcst as cst

from scalebox_cst.report import REASSOCIATED, REWRITTEN, SKIPPED, Site

from ..base import FileContext, Transform
from ..hot.bindings import PrunedTransformer, visit_calls
from .threads_examples import EXAMPLES

ID = "accelerate.threads"
RUNTIME = "scalebox_cst.runtime.intra_op.one_thread_for_small_nets"
_FUSED = "scalebox_cst.runtime.fused_optimizer.fused_optimizer"
_SETTERS = ("torch.set_num_threads", "torch.set_num_interop_threads", "os.putenv", "os.environ.setdefault")
_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
REASON = ("optimizer built inside one_thread_for_small_nets: with OMP_NUM_THREADS unset and at most 1e6 "
          "parameters, one intra-op thread (small-net ops spin on more: dqn.py unset 96.6 s -> 6.5 s CPU)")


def _is_optimizer(qual: str) -> bool:
    parts = qual.split(".")
    return (qual.startswith("torch.optim.") and len(parts) in (3, 4) and parts[-1][:1].isupper()
            and parts[2] not in ("lr_scheduler", "swa_utils", "Optimizer")) or qual == _FUSED


def _file_problem(tree: ast.Module, imports) -> Optional[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (imports.qualify(node.func) or "") in _SETTERS:
            return f"the file sets threads itself ({ast.unparse(node.func)})"
        if isinstance(node, ast.Constant) and node.value in _VARS:
            return f"the file names {node.value} (threads chosen by the user)"
    return None


class _Rewriter(PrunedTransformer):
    def __init__(self, ctx: FileContext, sites: List[Site], blocked: Optional[str]) -> None:
        super().__init__()
        self.ctx, self.sites, self.blocked = ctx, sites, blocked
        self.alias: Optional[str] = None
        self.inside = 0  # an optimizer call nested in another (fused_optimizer's callee is a Name: none)
        self.wrapped: List[cst.CSTNode] = []  # calls this transform wrapped before (its output rewritten again)

    def visit_Call(self, node: cst.Call) -> None:
        qual = self.ctx.imports.qualify(node.func) or ""
        if qual == RUNTIME and len(node.args) == 1:
            self.wrapped.append(node.args[0].value)
        if _is_optimizer(qual):
            self.inside += 1

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not _is_optimizer(self.ctx.imports.qualify(original.func) or ""):
            return updated
        self.inside -= 1
        if self.inside or any(original is w for w in self.wrapped):
            return updated
        if self.blocked:
            self.sites.append(self.ctx.site(ID, original, SKIPPED, f"optimizer: {self.blocked}; threads kept"))
            return updated
        if self.alias is None:
            self.alias = self.ctx.runtime_name(RUNTIME, "_sbx_one_thread")
        self.sites.append(self.ctx.site(ID, original, REWRITTEN, REASON, REASSOCIATED))
        return cst.Call(func=cst.Name(self.alias), args=[cst.Arg(updated)])


class AccelerateThreads(Transform):
    id = ID
    version = "2"  # 2: an optimizer already inside one_thread_for_small_nets is not wrapped again
    triggers = ("optim",)
    backends = ("cpu",)
    description = "opt-in (level reassociated, CPU): one intra-op thread where the trained networks are small and no thread count is set"

    EXAMPLES = EXAMPLES
    options_section = "accelerate"

    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        if ctx.option("accelerate", "level", "exact") != "reassociated":
            return None, []
        tree, imports = ctx.tree, ctx.imports
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _is_optimizer(imports.qualify(n.func) or "")]
        if not calls:
            return None, []
        sites: List[Site] = []
        rewriter = _Rewriter(ctx, sites, _file_problem(tree, imports))
        # each call is decided by itself: only the statements holding them visited and positioned
        out = visit_calls(ctx, calls, rewriter, scoped=False)
        return (out if rewriter.alias is not None else None), sites
