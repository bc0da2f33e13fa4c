"""Reports of what has no NPU counterpart: imports (CuPy, PyCUDA, transfer_to_npu) and
decorators (Triton kernels). References (``torch.cuda.nvtx`` ...) are in :mod:`.references`."""
from __future__ import annotations

import ast
from typing import Sequence





class Unsupported:
    """Mixin of the analyzer: report-import and report-decorator entries."""

    def _decorator(self, expr: ast.expr) -> None:
        entries = self.by_kind("report-decorator")
        if entries:
            target = expr.func if isinstance(expr, ast.Call) else expr
            qual = self.imports.qualify(target)
            for entry, _ in entries:
                if qual in entry.qualnames:
                    self.handled_refs.add(target)
                    self.warn(entry, expr, f"{qual}: {entry.reason}")
        self._expr(expr)

    def _report_import(self, node: ast.AST, full_names: Sequence[str]) -> None:
        for entry, _ in self.by_kind("report-import"):
            hit = [f for f in full_names if f == entry.pattern or f.startswith(entry.pattern + ".")]
            if hit:
                self.warn(entry, node, f"{hit[0]}: {entry.reason}")
