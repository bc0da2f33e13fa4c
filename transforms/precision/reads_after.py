"""Whether a name the autocast chain binds can be read after the chain, anywhere in its scope.

Under ``torch.autocast`` the chain's names hold bf16/fp16 tensors where the original held fp32;
code that reads one of them later sees another dtype (``return z.dtype``, ``z.numpy()``, a
``torch.cat`` with an fp32 tensor that was exact before). The chain's own block is not the only
place: after the loop, an enclosing loop's later statements, the loop's next round, module code
after a module-level loop, a closure or a generator consumed later, ``locals()``/``eval`` may all
read them.
:func:`read_after_chain` looks through the whole scope with :mod:`..analysis.reads`' visitor
(rebinding loops, comprehensions and nested functions that bind the name themselves do not read
it; a read before the chain outside every loop around it never sees it) and, on top of it, lets
a read go where every path from the chain to it passes a plain assignment to the name (the
evaluation after training that starts with ``out = model(x)``). The loss may be read as
``loss.backward()``, ``loss.item()`` and ``loss.detach()`` (what a training step does with it).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from .. import rewrite_caches
from ..analysis.bodies import target_names
from ..analysis.cstwalk import walk
from ..analysis.reads import _DYNAMIC, _enclosing_loops, _may_read, _Reads, _skeleton_path

#: what may be done with the loss after its forward (a half-precision loss is fine for these)
LOSS_USES = ("backward", "item", "detach")


#: context managers that never swallow an exception: their body ran to its end when the
#: statement after the ``with`` runs
_TRANSPARENT = ("no_grad", "inference_mode", "enable_grad")


def _transparent(stmt: cst.CSTNode) -> bool:
    if not isinstance(stmt, cst.With) or not isinstance(stmt.body, cst.IndentedBlock):
        return False
    for item in stmt.items:
        call = item.item
        func = call.func if isinstance(call, cst.Call) else None
        name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None
        if name not in _TRANSPARENT or item.asname is not None:
            return False
    return True


def _rebinds(stmt: cst.CSTNode) -> Set[str]:
    """Names a statement binds with a plain assignment (``x = ...``, ``x: T = ...``) when it
    completes: after it no path sees their earlier values (``x += ...`` keeps the old dtype). A
    statement line, or a ``with torch.no_grad():`` whose body's lines do (the evaluation after
    training)."""
    names: Set[str] = set()
    if _transparent(stmt):
        for inner in stmt.body.body:  # type: ignore[attr-defined]  # an IndentedBlock (_transparent)
            names |= _rebinds(inner)
    if isinstance(stmt, cst.SimpleStatementLine):
        for small in stmt.body:
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    names.update(target_names(target.target) or ())
            elif isinstance(small, cst.AnnAssign) and small.value is not None and isinstance(small.target, cst.Name):
                names.add(small.target.value)
    return names


class _ReadsAfterChain(_Reads):
    """:class:`_Reads` with the chain (several statements) as the excluded node, the loss's allowed
    uses skipped, and reads covered where a plain assignment rebinds the name on every path."""

    def __init__(self, names: Set[str], chain: Sequence[cst.CSTNode], loss: str, holding: Set[int]) -> None:
        super().__init__(names, chain[-1], chain)
        self.chain = {id(s) for s in chain}
        self.loss = loss
        self.holding = holding  # ids of the statements that are or hold the chain
        self.first: Optional[Tuple[str, cst.CSTNode, str]] = None  # name, the node, how it reads
        self._killed: List[Set[str]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if id(node) in self.chain:
            self._after = True  # past the chain: what runs from here may see its names
            return False
        return super().on_visit(node)

    def _is_covered(self, name: str) -> bool:
        if super()._is_covered(name):
            return True
        return not self._nested and any(name in killed for killed in self._killed)

    def _note(self, node: cst.CSTNode, how: str) -> None:
        if self.first is None and self.found:
            self.first = (sorted(self.found)[0], node, how)

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> bool:
        self.statements(node.body)
        return False

    def statements(self, body: Sequence[cst.BaseStatement]) -> None:
        """Each statement with the names the ones before it rebind on every path from the chain
        (none across a statement that is or holds the chain: paths inside it skip them)."""
        killed: Set[str] = set()
        for stmt in body:
            if id(stmt) in self.holding:
                killed = set()
                stmt.visit(self)
                continue
            self._killed.append(killed)
            stmt.visit(self)
            self._killed.pop()
            killed = killed | _rebinds(stmt)

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> bool:
        self._nested += 1  # its elements run when it is consumed, maybe after the chain
        super().visit_GeneratorExp(node)
        self._nested -= 1
        return False

    def visit_Attribute(self, node: cst.Attribute) -> None:
        super().visit_Attribute(node)
        if node.attr.value in LOSS_USES and isinstance(node.value, cst.Name) and node.value.value == self.loss:
            self._skip.add(id(node.value))

    def visit_Name(self, node: cst.Name) -> None:
        super().visit_Name(node)
        self._note(node, "read")

    def visit_Call(self, node: cst.Call) -> None:
        super().visit_Call(node)
        if isinstance(node.func, cst.Name):
            self._note(node, f"may be read by {node.func.value}()")

    def visit_Del(self, node: cst.Del) -> None:
        super().visit_Del(node)
        self._note(node, "deleted")


class _Declared(cst.CSTVisitor):
    """``global``/``nonlocal`` names of a scope's own body (not of functions defined in it)."""

    def __init__(self) -> None:
        self.names: List[Tuple[str, cst.CSTNode]] = []

    def visit_Global(self, node: cst.Global) -> None:
        self.names.extend((n.name.value, node) for n in node.names)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self.names.extend((n.name.value, node) for n in node.names)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


#: id(scope body) -> (the body, its own global/nonlocal names with their statements)
_DECLARED: Dict[int, Tuple[cst.CSTNode, List[Tuple[str, cst.CSTNode]]]] = rewrite_caches.mapping()


def read_after_chain(scope: cst.CSTNode, chain: Sequence[cst.CSTNode], names: Set[str],
                     loss: str) -> Optional[Tuple[str, cst.CSTNode, str]]:
    """(name, the node, how) for the first of ``names`` (bound by the ``chain`` statements, in
    ``scope``: a function, a class or the module) that code other than the chain may read after
    it; None where nothing can."""
    body = scope.body if isinstance(scope, (cst.FunctionDef, cst.ClassDef)) else scope
    if not isinstance(scope, cst.Module):
        known = _DECLARED.get(id(body))
        if known is None or known[0] is not body:  # once per scope, not per chain
            declared = _Declared()
            body.visit(declared)
            known = _DECLARED[id(body)] = (body, declared.names)
        hit = next(((name, node) for name, node in known[1] if name in names), None)
        if hit is not None:  # the chain binds a name of another scope: anything may read it
            return hit[0], hit[1], "declared global/nonlocal"
    uses = {id(n) for n in walk(body) if isinstance(n, cst.Attribute) and n.attr.value in LOSS_USES
            and isinstance(n.value, cst.Name) and n.value.value == loss}
    if not _may_read(body, names | set(_DYNAMIC), {id(s) for s in chain} | uses):
        return None  # nothing but the chain and the loss's own ``.backward()`` spells them (field walks)
    path = _skeleton_path(body, chain[0])
    holding = {id(n) for n in path or ()} | {id(s) for s in chain}
    visitor = _ReadsAfterChain(names, chain, loss, holding)
    visitor.ancestors = _enclosing_loops(body, chain[0])
    if isinstance(body, cst.IndentedBlock):
        visitor.statements(body.body)
    elif isinstance(body, cst.Module):
        visitor.statements(body.body)
    else:
        body.visit(visitor)
    return visitor.first
