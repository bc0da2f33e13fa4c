"""Tensors from lists of numpy arrays → one ``np.array`` copy, guarded at run time.

``torch.tensor(s_lst, dtype=torch.float)`` over a list of observation arrays (minimalRL's replay
buffers, many DQN scripts' ``[buffer[i] for i in idx]``) copies element by element; torch warns
that this is extremely slow. The call becomes ``tensor_from_arrays(torch.tensor, s_lst,
dtype=torch.float)`` (:mod:`scalebox_cst.runtime.hot_tensors`), which builds the tensor from one
``np.array`` copy only when every element is an ndarray of one shape and dtype, the cast is one
the two paths do alike and the list is long enough for that to pay, and otherwise calls the
original constructor with the original arguments: same dtype, same values, bitwise, and ragged
lists still raise (``exact``). Measured on whole minimalRL runs (CPU, one thread, CPU time of the
process, medians of 3-5 interleaved runs, outputs and final parameters identical): DQN 1.00-1.03x,
SAC 1.05x, DDPG 0.91-1.05x over three sets, i.e. within the noise of a shared machine: with
3-4-number observations ``sample()`` is a small share of these runs (the call itself is ~2x; the
gain grows with the observation: 6x for a batch of 64 x 17, 25x for 256 x 84).

Candidates are calls of ``torch.tensor`` / ``torch.FloatTensor`` / ``torch.DoubleTensor`` with one
positional argument that is a list display holding something other than constants, a list
comprehension, ``list(...)``, or a name the scope binds to one of these, to ``[]`` (appended to
later, unless everything appended is a list/tuple display or a constant, as minimalRL's
``a_lst.append([a])``) or by unpacking ``zip(...)`` / ``map(...)`` (not ``map(np.stack, zip(*batch))``
and the like, whose items are arrays already: the guard fell back on every call). Any other argument
(``torch.tensor(obs)``, ``torch.tensor(0.99)``, ``torch.tensor([1.0, 2.0])``, ``torch.tensor([])``,
a comprehension of numbers ``[int(i) for i in s]``) is not a site: it is not a list of arrays or
not known to be one, and the guard would only add its (small) cost.
A one-element display ``torch.tensor([obs], ...)`` (a batch dimension for one observation, every
step) is reported and left alone: for small observations the list path is as fast and the
check measured ~10% of that call.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import libcst as cst

from scalebox_cst.report import EXACT, REWRITTEN, SKIPPED, Site

from ..base import FileContext, Transform
from .bindings import ScopedRewriter, appended, visit_calls
from .arrays_examples import EXAMPLES

ID = "hot.tensor_from_arrays"
RUNTIME = "scalebox_cst.runtime.hot_tensors.tensor_from_arrays"

_CONSTRUCTORS = {"torch.tensor": "torch.tensor", "torch.FloatTensor": "torch.FloatTensor",
                 "torch.DoubleTensor": "torch.DoubleTensor"}
#: look-alikes reported with the reason they are left alone
_OTHERS = {
    "torch.Tensor": "torch.Tensor(...) follows the default tensor type (it may be changed at run time): left alone",
    "torch.LongTensor": "integer legacy constructors convert floats unlike a cast of the stacked array: left alone",
    "torch.IntTensor": "integer legacy constructors convert floats unlike a cast of the stacked array: left alone",
}


def _constant(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString, cst.Name)) and not (
        isinstance(expr, cst.Name) and expr.value not in ("True", "False", "None")
    ):
        return True
    if isinstance(expr, cst.UnaryOperation):
        return _constant(expr.expression)
    if isinstance(expr, (cst.List, cst.Tuple)):
        return all(_constant(e.value) for e in expr.elements)
    return False


#: builtins whose result is a number (never an ndarray): a comprehension of them holds no array
_NUMBER_CALLS = frozenset({"int", "float", "bool", "complex", "len", "round", "abs"})


def _numbers(expr: cst.BaseExpression) -> bool:
    """Whether ``expr`` is a constant or a call of a builtin that returns a number (not rewriting
    is always safe, so a rebound ``int`` needs no check)."""
    if _constant(expr):
        return True
    return isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value in _NUMBER_CALLS


#: functions whose result is one array or tensor: ``map(f, ...)`` of them yields no lists
_ARRAY_MAKERS = frozenset({
    "numpy.stack", "numpy.array", "numpy.asarray", "numpy.vstack", "numpy.hstack", "numpy.concatenate",
    "numpy.float32", "numpy.float64", "torch.stack", "torch.cat", "torch.tensor", "torch.as_tensor",
    "torch.from_numpy", "torch.FloatTensor",
})


def _listy(expr: Optional[cst.BaseExpression], imports=None) -> Optional[str]:
    """What kind of list ``expr`` builds, if it builds one that may hold arrays."""
    if isinstance(expr, cst.ListComp):
        return "a list comprehension"
    if isinstance(expr, (cst.List, cst.Tuple)):
        if not expr.elements:
            return "a list appended to"
        if any(isinstance(e, cst.StarredElement) for e in expr.elements):
            return None
        return None if _constant(expr) else "a list display"
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name):
        if expr.func.value == "list" and expr.args:
            return "list(...)"
        if expr.func.value == "map" and expr.args and imports is not None \
                and imports.qualify(expr.args[0].value) in _ARRAY_MAKERS:
            return None  # map(np.stack, zip(*batch)): each item one array, never a list
        if expr.func.value in ("zip", "map"):
            return f"unpacked {expr.func.value}(...)"
    return None


class _Rewriter(ScopedRewriter):
    def __init__(self, ctx: FileContext, sites: List[Site]) -> None:
        super().__init__()
        self.ctx = ctx
        self.sites = sites
        self._appends: Dict[cst.CSTNode, Dict] = {}
        self.alias: Optional[str] = None

    def _appended(self, name: str) -> List[cst.BaseExpression]:
        scope = self.scopes[-1]
        if scope not in self._appends:
            self._appends[scope] = appended(scope)
        return self._appends[scope].get(name, [])

    def kind(self, arg: cst.BaseExpression) -> Optional[str]:
        if isinstance(arg, cst.Name):
            for value in self._found().get(arg.value, []):
                how = _listy(value, self.ctx.imports)
                if how == "a list appended to":
                    pushed = self._appended(arg.value)
                    # only displays and constants appended (minimalRL's `a_lst.append([a])`): no
                    # arrays in it, the guard would only add its cost
                    if pushed and all(isinstance(v, (cst.List, cst.Tuple)) or _constant(v) for v in pushed):
                        continue
                    if not pushed:  # filled otherwise (ericyangyu's `batch_rtgs.insert(0, r)`)
                        how = "a list begun empty (`[]`)"
                if how is not None:
                    return f"`{arg.value}` is {how}"
            return None
        if isinstance(arg, (cst.List, cst.Tuple)) and not arg.elements:
            return None  # torch.tensor([]): nothing to stack, ever
        if isinstance(arg, cst.ListComp) and _numbers(arg.elt):
            return None  # [int(i) for i in s]: numbers, never arrays
        how = _listy(arg)
        return None if how is not None and how.startswith("unpacked") else how

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name = self.ctx.imports.qualify(original.func)
        if name not in _CONSTRUCTORS and name not in _OTHERS:
            return updated
        positional = [a for a in original.args if a.keyword is None]
        if not positional or positional[0].star:
            return updated
        how = self.kind(positional[0].value)
        if how is None:
            return updated
        if name in _OTHERS:
            self.sites.append(self.ctx.site(ID, original, SKIPPED, f"{name}(...): {_OTHERS[name]}"))
            return updated
        data = positional[0].value
        if isinstance(data, (cst.List, cst.Tuple)) and len(data.elements) == 1:
            self.sites.append(self.ctx.site(ID, original, SKIPPED, (
                f"{name}([x]): one element (a batch dimension added to one observation): for small "
                "observations the list path is as fast and the run-time check would cost ~10% of the call")))
            return updated
        if any(a.star for a in original.args) or len(positional) != 1:
            self.sites.append(self.ctx.site(ID, original, SKIPPED, f"{name}(...): unpacked or extra positional arguments"))
            return updated
        if self.alias is None:
            self.alias = self.ctx.runtime_name(RUNTIME, "_sb_tensor_from_arrays")
        func_arg = cst.Arg(updated.func, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        reason = (f"{name}(...) of {how}: one np.array copy when the elements are ndarrays of one shape and "
                  "dtype (same dtype and values), else the original call (ragged lists still raise); torch's "
                  "'extremely slow' warning only where it falls back")
        self.sites.append(self.ctx.site(ID, original, REWRITTEN, reason, EXACT))
        return updated.with_changes(func=cst.Name(self.alias), args=[func_arg, *updated.args])


class HotTensorFromArrays(Transform):
    id = ID
    version = "3"  # 3: a list begun as [] and never appended to (filled by insert, +=, an index) is said to be so, not "a list appended to"; 2: names unpacked from map(np.stack, ...) and other array makers are no sites
    triggers = ("Tensor(", "tensor(")
    description = "torch.tensor / FloatTensor of a list of numpy arrays → one np.array copy (guarded, exact)"

    EXAMPLES = EXAMPLES

    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        import ast

        wanted = set(_CONSTRUCTORS) | set(_OTHERS)
        calls = [n for n in ast.walk(ctx.tree) if isinstance(n, ast.Call) and n.args
                 and ctx.imports.qualify(n.func) in wanted and not isinstance(n.args[0], ast.Constant)]
        if not calls:
            return None, []
        sites: List[Site] = []
        new = visit_calls(ctx, calls, _Rewriter(ctx, sites))
        return new, sites
