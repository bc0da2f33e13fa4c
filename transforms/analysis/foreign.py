"""Functions whose bodies are not run as written, by Python, in their module's namespace.

Every rewrite emits Python (walrus guards, calls of ``scalebox_cst.runtime`` helpers imported at
the top of the module). A body that a compiler reads from source (``@torch.jit.script``,
``@triton.jit``, ``@numba.njit``) or that a notebook runs with names of its own
(a marimo cell, ``@app.cell``: the notebook's definitions only, not the module's imports) would
fail there: TorchScript refuses a walrus, a marimo cell raises NameError on the helper. The
pipeline (``scalebox_cst.pipeline``) withdraws a transform's edits of a file when one of its
rewritten sites lies in such a body, and says so on each site.
"""
from __future__ import annotations

import ast
import dataclasses
from typing import List, Optional, Sequence

from scalebox_cst.report import REWRITTEN, SKIPPED, Site

from ..names import ImportMap
from .statements import first_line

#: decorators (qualified) whose function body is compiled from its source text, and by whom
COMPILED = {
    "torch.jit.script": "TorchScript",
    "torch.jit.script_method": "TorchScript",
    "torch.jit.export": "TorchScript",
    "triton.jit": "Triton",
    "numba.jit": "Numba",
    "numba.njit": "Numba",
    "numba.cuda.jit": "Numba",
    "numba.vectorize": "Numba",
    "numba.guvectorize": "Numba",
    "numba.stencil": "Numba",
    "numba.cfunc": "Numba",
}
#: what a text must hold for any of these to be present (a cheap test before the walk of the
#: tree); ``vectorize`` as a word: every recurrence rewrite imports ``runtime.vectorized``, and
#: a walk of the whole tree per editing transform was ~1 s of a dense 50k-line file
TRIGGERS = ("jit", "marimo", "numba", "stencil", "cfunc")


def _triggered(code: str) -> bool:
    # substring tests (one alternation regex scanned a 2 MB text at every position: 0.4 s a file)
    if any(t in code for t in TRIGGERS):
        return True
    at = code.find("vectorize")
    while at != -1:  # the word (numba's), not runtime.vectorized
        end = at + len("vectorize")
        if not _word(code, end) and not _word(code, at - 1):
            return True
        at = code.find("vectorize", end)
    return False


def _word(code: str, i: int) -> bool:
    return 0 <= i < len(code) and (code[i].isalnum() or code[i] == "_")
#: ``app.<attr>`` of a ``marimo.App``: cells, functions and classes the notebook runs itself
MARIMO_CELLS = frozenset({"cell", "function", "class_definition"})


@dataclasses.dataclass(frozen=True)
class Foreign:
    first: int  # first line, decorators included
    last: int
    why: str  # one clause: "`@torch.jit.script` def `f` (line 3): TorchScript compiles its body"


def foreign_bodies(tree: ast.Module, imports) -> List[Foreign]:
    """The functions (and marimo classes) of ``tree`` whose bodies are not Python's to run."""
    apps = {
        t.id
        for st in tree.body if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call)
        and imports.qualify(st.value.func) == "marimo.App"
        for t in st.targets if isinstance(t, ast.Name)
    }
    found: List[Foreign] = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for deco in node.decorator_list:
            why = _runner(deco.func if isinstance(deco, ast.Call) else deco, imports, apps)
            if why is not None:
                kind = "class" if isinstance(node, ast.ClassDef) else "def"
                where = f"`@{ast.unparse(deco.func if isinstance(deco, ast.Call) else deco)}` {kind} `{node.name}` (line {node.lineno})"
                found.append(Foreign(first_line(node), node.end_lineno or node.lineno, f"{where}: {why}"))
                break
    return found


def _runner(target: ast.expr, imports, apps) -> Optional[str]:
    qual = imports.qualify(target)
    if qual in COMPILED:
        return f"{COMPILED[qual]} compiles its body from source, where the rewrite's Python is not understood"
    if (isinstance(target, ast.Attribute) and target.attr in MARIMO_CELLS
            and isinstance(target.value, ast.Name) and target.value.id in apps):
        return "marimo runs its body as a cell, with the notebook's names only, not the helpers the rewrite imports"
    return None


def inside(line: int, end_line: int, bodies: Sequence[Foreign]) -> Optional[Foreign]:
    """The foreign body a span ``line..end_line`` overlaps, if any."""
    return next((f for f in bodies if f.first <= end_line and line <= f.last), None)


def withdrawn(found: Sequence[Site], tree: ast.Module, code: str) -> Optional[List[Site]]:
    """``found`` (one transform's sites in one file) all left alone, each saying why, when one of
    its rewritten sites lies in a foreign body; None when none does (the edits stand)."""
    rewritten = [s for s in found if s.action == REWRITTEN]
    if not rewritten or not _triggered(code):
        return None
    bodies = foreign_bodies(tree, ImportMap(tree))
    hits = [(s, inside(s.line, s.end_line, bodies)) for s in rewritten]
    first = next(((s, body) for s, body in hits if body is not None), None)
    if first is None:
        return None
    why = {id(s): f"left alone: inside {body.why}" if body is not None else
           f"left alone with this transform's site at line {first[0].line}, inside {first[1].why}"
           for s, body in hits}
    return [dataclasses.replace(s, action=SKIPPED, reason=why[id(s)], exactness=None, details=None)
            if id(s) in why else s for s in found]
