"""Precision: float64 renames are table renames (see :mod:`.references`, which leaves dtype
tests alone); what is planned here is the TF32 statement inserted after the imports (CUDA, on
request)."""
from __future__ import annotations

import ast
from typing import List

from scalebox_cst.report import REWRITTEN

from ..source import _Line


class Precision:
    """Mixin of the analyzer: the module-level insert entry."""

    def _scan_insert(self, items: List[object]) -> None:
        """A statement inserted after the module's imports (TF32 on request), once."""
        for entry, mode in self.by_kind("insert"):
            last = None
            for i, item in enumerate(items):
                if type(item) is _Line and all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in item.stmts):
                    last = i
                elif i == 0 and type(item) is _Line and isinstance(item.stmts[0], ast.Expr):
                    continue
                else:
                    break
            torch_alias = next((k for k, v in self.aliases.items() if v == "torch"), None)
            if last is None or torch_alias is None:
                continue
            text = entry.replacement.format(torch=torch_alias)
            if text in self.ctx.code:  # only then can a statement be it (a rewrite of a rewrite)
                module_node = self.ctx.module
                if any(module_node.code_for_node(s).strip() == text for s in module_node.body):
                    continue
            self.module_inserts.append((last + 1, text))
            line = items[last]
            self.site(entry, (line.stmts[0].lineno, line.stmts[-1].end_lineno), REWRITTEN, entry.reason, entry.exactness)
