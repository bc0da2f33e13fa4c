"""Dotted references and method calls: renames, guarded helper references, reports of what
has no twin, attribute and method swaps (``.cuda()``, ``.is_cuda``, ``.double()``)."""
from __future__ import annotations

import ast

import libcst as cst

from .. import table as T
from ..edits import _Target

_OWNED = T.owned_qualnames()


class References:
    """Mixin of the analyzer: what a table entry says for a reference or a method call."""

    def _reference(self, node: ast.expr) -> bool:
        """Plan what the table says for a dotted reference; True when it was claimed whole."""
        if isinstance(node, ast.Name):
            full = self.aliases.get(node.id)
            qual = full
        else:
            qual = self.imports.qualify(node)
            for entry, mode in self.by_kind("attribute"):
                if node.attr == entry.pattern and not self.receiver_is_module(node) and qual is None:
                    if "no-user-member" in entry.conditions and entry.pattern in self.facts.members:
                        self.skip(entry, node, f"a class in this module defines its own `{entry.pattern}`")
                    elif node in self.kept_guards:  # a test of what stays CUDA-only (see .legacy)
                        self.skip(entry, node, self.kept_guards[node])
                    elif mode == "apply":
                        self.edit(entry, _Target(node), lambda u, e=entry: u.with_changes(attr=cst.Name(e.replacement)))
        if qual is None or node in self.handled_refs:
            return False
        for entry, mode in self.ref_entries:
            if entry.kind == "rename" and qual in entry.qualnames:
                if entry.within and not self.within_depth.get(entry.id):
                    continue
                self.handled_refs.add(node)
                if node in self.kept_guards:  # a guard around what stays CUDA-only (see .legacy)
                    self.skip(entry, node, self.kept_guards[node])
                    return True
                if entry.transform == T.PRECISION and id(node) in self.dtype_tests:
                    return True  # compared, not created: nothing to change or report
                if mode == "warn":
                    self.warn(entry, node, self._warn_reason(entry))
                else:
                    self.prepare(entry)
                    fn = self.renamed(node, qual, entry.replacement)
                    self.edit(entry, _Target(node), fn)
                return True
            if entry.kind == "legacy-tensor" and qual in entry.qualnames:
                self.handled_refs.add(node)
                self._legacy_reference(entry, mode, node)
                return True
            if entry.kind == "helper" and qual in entry.qualnames:
                self.handled_refs.add(node)
                if node in self.ref_ok:
                    self._plan_helper_ref(entry, node)
                else:
                    self.skip(entry, node, "referenced outside a call or argument (isinstance, comparison...): left as written")
                return True
            if entry.kind == "report-ref" and any(qual == p or qual.startswith(p + ".") for p in entry.qualnames):
                self.handled_refs.add(node)
                if qual in _OWNED:  # migratable: another device transform's business
                    return True
                self.warn(entry, node, f"{qual}: {entry.reason}")
                return True
        return False

    def _method(self, entry: T.Swap, mode: str, node: ast.Call) -> None:
        func = node.func
        if not isinstance(func, ast.Attribute) or func.attr != entry.pattern or self.receiver_is_module(func):
            return
        if "no-args" in entry.conditions and (node.args or node.keywords):
            return
        if "no-user-member" in entry.conditions and entry.pattern in self.facts.members:
            self.skip(entry, node, f"a class in this module defines its own `{entry.pattern}`; "
                      f"`.{entry.pattern}()` may not be the tensor method")
            return
        if mode == "warn":
            self.warn(entry, node, self._warn_reason(entry))
            return
        self.edit(entry, _Target(func), lambda u: u.with_changes(attr=cst.Name(entry.replacement)), site_node=node)

    def _warn_reason(self, entry: T.Swap) -> str:
        flag = entry.option.replace("_", "-") if entry.option else ""
        return (f"{entry.reason}; not changed (set [device] {entry.option} = true, or pass "
                f"--{flag}, to rewrite it)")
