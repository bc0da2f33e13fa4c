"""torch.cuda legacy tensor types, and the ``torch.cuda.is_available()`` guards around what stays.

``torch.cuda.FloatTensor(...)`` becomes a tensor of that dtype on the npu, each constructor form
as the constructor reads it: int sizes -> ``torch.empty`` (uninitialised, like the constructor),
a list or tuple display -> ``torch.tensor``, anything else (a name, a numpy array: size or data
is decided at run time) -> the CPU legacy constructor then ``.npu()``. ``x.type(torch.cuda.T)``
-> ``x.to(device="npu", dtype=...)``; an alias (``FloatTensor = torch.cuda.FloatTensor if cuda
else torch.FloatTensor``) that the module only ever calls -> a function doing the same.

A guard is not migrated alone: where the branch an ``is_available()`` or ``x.is_cuda`` test opens
(directly, or through a flag assigned from it) keeps CUDA-only code this engine cannot migrate --
a ``torch.cuda`` name with no NPU twin, a CUDA-only library (Triton, CuPy, PyCUDA, ``numba.cuda``)
or a function of the file reaching one (rl_games: ``use_triton = USE_TRITON and x.is_cuda``, then
``_triton_gae(...)`` launching a ``@triton.jit`` kernel) -- the test keeps asking CUDA, so on an
NPU host the script takes the branch the original takes without CUDA.
"""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Tuple

import libcst as cst

from .. import table as T
from ...names import ast_dotted
from ..edits import _Target, _append_args, _keep_parens, _new_arg

_OWNED = T.owned_qualnames()
_IS_AVAILABLE = "torch.cuda.is_available"
#: libraries whose code runs on CUDA devices only (qualified-name prefixes)
_CUDA_LIBS = ("triton", "cupy", "pycuda", "numba.cuda")


def _cuda_lib(qual: Optional[str]) -> bool:
    return bool(qual) and any(qual == lib or qual.startswith(lib + ".") for lib in _CUDA_LIBS)  # type: ignore[union-attr]


def _cuda_imports(tree: ast.AST) -> Dict[str, str]:
    """Local names any import in the file binds to a CUDA-only library (``try: import triton /
    except ImportError: triton = None`` included, which the module's import table leaves out as
    ambiguous): local name -> qualified name."""
    out: Dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _cuda_lib(a.name):
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level and _cuda_lib(node.module):
            for a in node.names:
                if a.name != "*":
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _parents(tree: ast.AST) -> Dict[ast.AST, ast.AST]:
    out: Dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            out[child] = node
    return out


def _plain_call(call: ast.Call) -> bool:
    return not call.keywords and not any(isinstance(a, ast.Starred) for a in call.args)


def _qualified(node: ast.expr, libs: Dict[str, str]) -> Optional[str]:
    """The CUDA-only library name a Name/Attribute chain reads, or None."""
    text = ast_dotted(node)
    if text is None:
        return None
    head, _, rest = text.partition(".")
    full = libs.get(head)
    return None if full is None else full + ("." + rest if rest else "")


class Legacy:
    """Mixin of the analyzer: legacy-tensor entries and the guards of what stays CUDA-only."""

    def _legacy_prepass(self) -> None:
        """Decide every legacy reference's form (or why it stays), then the guards to keep."""
        self.legacy: Dict[ast.AST, Tuple[T.Swap, str, Optional[str], ast.AST]] = {}
        self.kept_guards: Dict[ast.AST, str] = {}
        entries = {q: e for e, _ in self.by_kind("legacy-tensor") for q in e.qualnames}
        guards = any(e.pattern == _IS_AVAILABLE for e, m in self.by_kind("rename") if m == "apply") or \
            any(e.pattern == "is_cuda" for e, m in self.by_kind("attribute") if m == "apply")
        if not entries and not guards:
            return
        tree = self.ctx.tree
        parent = _parents(tree)
        loads: Dict[str, List[ast.Name]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                loads.setdefault(node.id, []).append(node)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
                qual = self.imports.qualify(node)
                if qual in entries:
                    self.legacy[node] = self._legacy_form(entries[qual], node, parent, loads)
        if guards:
            self._keep_guards(tree, parent)

    def _legacy_form(self, entry: T.Swap, node: ast.AST, parent, loads) -> Tuple[T.Swap, str, Optional[str], ast.AST]:
        if "precision-allowed" in entry.conditions and not self.ctx.option(T.SECTION, "allow_precision_change", False):
            return entry, "", ("the NPU has no float64 (set [device] allow_precision_change = true to make it "
                               "float32)"), node
        up = parent.get(node)
        if isinstance(up, ast.Call) and up.func is node:
            if up.keywords:
                return entry, "", "keyword arguments (device=...) of the legacy constructor: not mapped", node
            return entry, "call", None, up
        if isinstance(up, ast.Call) and node in up.args and isinstance(up.func, ast.Attribute) and up.func.attr == "type":
            if len(up.args) == 1 and all(k.arg == "non_blocking" for k in up.keywords) and not self.receiver_is_module(up.func):
                return entry, "type", None, up
            return entry, "", "a .type() call with other arguments: not mapped", node
        value, owner = node, up
        if isinstance(owner, ast.IfExp) and node is not owner.test:
            value, owner = owner, parent.get(owner)
        if isinstance(owner, ast.Assign) and owner.value is value and len(owner.targets) == 1 and isinstance(owner.targets[0], ast.Name):
            name = owner.targets[0].id
            for use in loads.get(name, ()):
                call = parent.get(use)
                if not (isinstance(call, ast.Call) and call.func is use and _plain_call(call)):
                    return entry, "", (f"the alias `{name}` is used other than called with plain arguments "
                                       f"(line {use.lineno}): a function cannot stand in for the type there"), node
            return entry, "alias", None, node
        return entry, "", "referenced outside a call (isinstance, a comparison, an argument...): no npu tensor type stands in", node

    def _keep_guards(self, tree: ast.AST, parent) -> None:
        """``is_available()`` calls whose branch keeps CUDA-only code: not migrated, and why."""
        flags: Dict[str, List[ast.AST]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                found = self._availability(node.value)
                if found:
                    flags.setdefault(node.targets[0].id, []).extend(found)
        for node in ast.walk(tree):
            if isinstance(node, (ast.If, ast.While)):
                body = [*node.body, *node.orelse]  # both: ``if not torch.cuda.is_available():`` guards the else
            elif isinstance(node, ast.IfExp):
                body = [node.body, node.orelse]
            else:
                continue
            tests = self._availability(node.test)
            for n in ast.walk(node.test):
                if isinstance(n, ast.Name) and n.id in flags:
                    tests += flags[n.id]
            if not tests:
                continue
            why = self._cuda_only(body, parent)
            if why is None:
                continue
            for test in tests:
                self.kept_guards.setdefault(test, (
                    f"kept: the branch it opens (line {node.lineno}) keeps {why}; migrating "
                    "the test alone would change which branch an NPU host takes from the one the original takes "
                    "without CUDA"))

    def _availability(self, expr: ast.AST) -> List[ast.AST]:
        """The CUDA tests in ``expr``: ``torch.cuda.is_available`` of its calls, ``x.is_cuda`` reads."""
        return [n.func if isinstance(n, ast.Call) else n for n in ast.walk(expr)
                if isinstance(n, ast.Call) and self.imports.qualify(n.func) == _IS_AVAILABLE
                or isinstance(n, ast.Attribute) and n.attr == "is_cuda" and isinstance(n.ctx, ast.Load)]

    def _cuda_libs(self) -> Dict[str, str]:
        known = getattr(self, "_cuda_lib_names", None)
        if known is None:
            known = self._cuda_lib_names = _cuda_imports(self.ctx.tree)
        return known

    def _cuda_functions(self) -> Dict[str, str]:
        """Functions of the file (at any depth, by name) that reach a CUDA-only library, directly
        or through another such function: name -> the library name reached and its line (a
        fixpoint over the names each function reads)."""
        known = getattr(self, "_cuda_fns", None)
        if known is not None:
            return known
        defs: Dict[str, List[ast.AST]] = {}
        for node in ast.walk(self.ctx.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs.setdefault(node.name, []).append(node)
        reads: Dict[str, Tuple[Optional[str], set]] = {}
        libs = self._cuda_libs()
        for name, nodes in defs.items():
            lib, names = None, set()
            for fn in nodes:
                for n in ast.walk(fn):
                    if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load):
                        qual = _qualified(n, libs)
                        if lib is None and qual is not None:
                            lib = f"`{qual}` (line {n.lineno})"
                        if isinstance(n, ast.Name) and n.id in defs and n.id != name:
                            names.add(n.id)
            reads[name] = (lib, names)
        known = {name: lib for name, (lib, _) in reads.items() if lib is not None}
        changed = True
        while changed:
            changed = False
            for name, (_, names) in reads.items():
                if name not in known:
                    via = next((n for n in sorted(names) if n in known), None)
                    if via is not None:
                        known[name] = known[via]
                        changed = True
        self._cuda_fns = known
        return known

    def _cuda_only(self, body, parent) -> Optional[str]:
        """What in ``body`` stays CUDA-only after the device transforms, or None."""
        for stmt in body:
            for n in ast.walk(stmt):
                if n in self.legacy and self.legacy[n][2] is not None:
                    return f"`{ast.unparse(n)}` (line {n.lineno}: {self.legacy[n][2]})"
                if not isinstance(n, (ast.Name, ast.Attribute)) or not isinstance(n.ctx, ast.Load):
                    continue
                up = parent.get(n)
                if isinstance(up, ast.Attribute) and up.value is n:
                    continue  # only whole dotted chains
                qual = self.imports.qualify(n)
                if qual and qual.startswith("torch.cuda.") and not any(qual == q or qual.startswith(q + ".") for q in _OWNED):
                    return f"`{qual}` (line {n.lineno}), which has no NPU twin"
                lib = _qualified(n, self._cuda_libs())
                if lib is not None:
                    return f"`{lib}` (line {n.lineno}), CUDA-only"
                if isinstance(n, ast.Name) and n.id in self._cuda_functions():
                    return f"`{n.id}` (line {n.lineno}), which reaches the CUDA-only {self._cuda_functions()[n.id]}"
        return None

    # ------------------------------------------------------------------ during the walk
    def _legacy_reference(self, entry: T.Swap, mode: str, node: ast.AST) -> None:
        plan = self.legacy.get(node)
        if plan is None:
            return
        _, form, why, owner = plan
        if why is not None:
            self.skip(entry, owner, why)
            return
        self.prepare(entry)
        dtype = self.ref_text(entry.replacement)
        cpu = self.ref_text(entry.value)
        npu = cst.SimpleString('"npu"')
        if form == "alias":
            text = f"(lambda *args: {cpu}(*args).npu())"
            self.edit(entry, _Target(node), lambda u: cst.parse_expression(text))
            return
        call = owner
        if form == "type":
            def fn(u: cst.CSTNode) -> cst.CSTNode:
                rest = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in u.args[1:]]
                new = [_new_arg("device", npu), _new_arg("dtype", cst.parse_expression(dtype)), *rest]
                return _append_args(u.with_changes(func=u.func.with_changes(attr=cst.Name("to")), args=()), new)
            self.edit(entry, _Target(call), fn)
            return
        pos = call.args
        sizes = all(isinstance(a, ast.Constant) and type(a.value) is int and a.value >= 0 for a in pos)
        display = len(pos) == 1 and isinstance(pos[0], (ast.List, ast.Tuple))
        if sizes or display:
            maker = self.ref_text("torch.empty" if sizes else "torch.tensor")

            def fn(u: cst.CSTNode) -> cst.CSTNode:
                head = u.with_changes(func=_keep_parens(u.func, cst.parse_expression(maker)))
                if not u.args:
                    head = head.with_changes(args=[cst.Arg(cst.Integer("0"))])
                return _append_args(head, [_new_arg("dtype", cst.parse_expression(dtype)), _new_arg("device", npu)])
        else:
            def fn(u: cst.CSTNode) -> cst.CSTNode:
                inner = u.with_changes(func=cst.parse_expression(cpu), lpar=(), rpar=())
                return cst.Call(func=cst.Attribute(value=inner, attr=cst.Name("npu")), lpar=u.lpar, rpar=u.rpar)
        self.edit(entry, _Target(call), fn)

