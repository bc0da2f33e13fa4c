"""``accelerate.fast_categorical`` (opt in: ``[accelerate] level = "reassociated"``, ``scalebox
rewrite --fast``; CPU): ``Categorical(...)`` built as ``scalebox_cst.runtime.fast_categorical.
Categorical``, a subclass whose ``sample``/``log_prob``/``entropy`` skip torch's shape detours.

Why: policies that act through ``torch.distributions.Categorical`` pay about 110-170 us per
step for ``sample`` + ``log_prob`` + ``entropy`` on CPU, mostly Python and no-op reshapes and
broadcasts (the analyzer puts distributions at 18-43% of the public scripts). The subclass runs
the same kernels on the same tensors: 1.35-1.45x per chain (runtime/fast_categorical.py), bitwise
the same values, gradients and random stream.

What is rewritten: a call whose callee resolves to ``torch.distributions.Categorical`` (or
``torch.distributions.categorical.Categorical``) gets the subclass as its callee; so does the
class given to ``hot.distribution_args``'s ``categorical_probs(Categorical, p, dim)``. The
arguments (and ``validate_args``, given or added earlier) are kept: construction is torch's.

Left alone: every call of a file that tests a distribution's exact type (``type(x) is / ==
...``, ``type(x).__name__``), subclasses ``Categorical`` or registers a KL for it (the type is
then part of the program's logic). Exactness: values are bitwise equal (the sites say
``exact``); only ``type(d) is Categorical`` tells the two apart, so the transform rides with the
opt-in tier rather than the default one. CPU only: measured there; on CUDA the launches, not the
Python, dominate, and ``accelerate.compile`` traces the methods instead.
"""
from __future__ import annotations

import ast
from typing import List, Optional, Tuple

import libcst as cst

from scalebox_cst.report import EXACT, REWRITTEN, SKIPPED, Site

from ..base import FileContext, Transform
from .fast_categorical_examples import EXAMPLES

ID = "accelerate.fast_categorical"
RUNTIME = "scalebox_cst.runtime.fast_categorical.Categorical"
_QUALS = ("torch.distributions.Categorical", "torch.distributions.categorical.Categorical")
_PROBS_HELPER = "scalebox_cst.runtime.hot_distributions.categorical_probs"
REASON = ("Categorical built as the runtime subclass: sample/log_prob/entropy skip torch's no-op reshapes and "
          "broadcasts (1.35-1.45x per chain on CPU); same values, gradients and random stream; only type(d) differs")


def _file_problem(tree: ast.Module, imports) -> Optional[Tuple[int, str]]:
    """Why the file's distribution types must stay torch's (a reason and its line), or None."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type" \
                and imports.qualify(node.func) in (None, "type"):
            return node.lineno, "the file tests exact types (type(...)): a subclass would answer differently"
        if isinstance(node, ast.ClassDef) and any(imports.qualify(b) in _QUALS for b in node.bases):
            return node.lineno, f"the file subclasses Categorical ({node.name})"
        if isinstance(node, ast.Call) and (imports.qualify(node.func) or "").endswith("register_kl"):
            return node.lineno, "the file registers a KL divergence (dispatch by type)"
    return None


class _Rewriter(cst.CSTTransformer):
    def __init__(self, ctx: FileContext, sites: List[Site], blocked: Optional[str]) -> None:
        self.ctx, self.sites, self.blocked = ctx, sites, blocked
        self.alias: Optional[str] = None

    def _name(self) -> cst.Name:
        if self.alias is None:
            self.alias = self.ctx.runtime_name(RUNTIME, "_sbx_Categorical")
        return cst.Name(self.alias)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        qual = self.ctx.imports.qualify(original.func) or ""
        if qual in _QUALS:
            if self.blocked:
                self.sites.append(self.ctx.site(ID, original, SKIPPED, f"Categorical(...): {self.blocked}; kept"))
                return updated
            self.sites.append(self.ctx.site(ID, original, REWRITTEN, REASON, EXACT))
            return updated.with_changes(func=self._name())
        if qual == _PROBS_HELPER and original.args and original.args[0].keyword is None \
                and self.ctx.imports.qualify(original.args[0].value) in _QUALS:
            if self.blocked:
                self.sites.append(self.ctx.site(ID, original, SKIPPED, f"Categorical(probs): {self.blocked}; kept"))
                return updated
            self.sites.append(self.ctx.site(ID, original, REWRITTEN, REASON, EXACT))
            first = updated.args[0].with_changes(value=self._name())
            return updated.with_changes(args=[first, *updated.args[1:]])
        return updated


class AccelerateFastCategorical(Transform):
    id = ID
    version = "1"
    triggers = ("Categorical",)
    backends = ("cpu",)
    description = "opt-in (level reassociated, CPU): Categorical built as a subclass with shortcut sample/log_prob/entropy (bitwise)"

    EXAMPLES = EXAMPLES
    options_section = "accelerate"

    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        if ctx.option("accelerate", "level", "exact") != "reassociated":
            return None, []
        tree, imports = ctx.tree, ctx.imports
        if not any(isinstance(n, ast.Call) and (imports.qualify(n.func) in _QUALS or any(
                imports.qualify(a) in _QUALS for a in n.args[:1])) for n in ast.walk(tree)):
            return None, []
        problem = _file_problem(tree, imports)
        sites: List[Site] = []
        rewriter = _Rewriter(ctx, sites, problem[1] if problem else None)
        out = ctx.module.visit(rewriter)
        return (out if rewriter.alias is not None else None), sites
