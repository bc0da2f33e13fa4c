"""``make(x).to(device)`` of a fresh tensor → the legacy constructor's own steps, guarded at run time.

``torch.FloatTensor(state.reshape(1, -1)).to(device)`` (sfujim/TD3's ``select_action`` and its
replay ``sample``) and ``torch.Tensor(next_obs).to(device)`` (CleanRL, every step) build a tensor
with a legacy constructor, then move it. The call becomes ``tensor_on(make, x, device)``
(:mod:`scalebox_cst.runtime.hot_device`), which does what the legacy constructor does inside
(``torch.from_numpy(x)``, then ``.to(device, dtype)``) where that is provably the same tensor
(memory shared with the array where the original shares it) and otherwise calls
``make(x).to(device)`` as written (``exact``). The legacy constructors' argument parsing is what
it saves. Per call on CPU (``benchmarks/bench_hot_patterns.py``, one thread, medians): a float32
observation (CleanRL's CartPole, memory shared with the array) 4.5 -> 1.2-1.4 us (3.3-3.9x), a bool
``done`` array or a float64 observation 5.6 -> 2.2-2.3 us (2.4x), a 256x17 float64 replay batch
6.2 -> 2.8-3.0 us (2.1-2.2x). Before this runtime (``torch.tensor(x, dtype=, device=)``, and the call
as written for an array of the tensor's own dtype on the CPU) the float32 case cost 0.77x: the
guard on top of the original call. A list (``hot.tensor_from_arrays`` takes most before this
runs) takes the call as written: 0.82-0.84x, the guard's cost.
``torch.tensor(x).to(device)`` (CleanRL's rewards) is reported and left alone: the same steps
measured 1.1-1.4x on arrays, but a list given to it costs 0.44x through the guard; of a number
literal (``torch.tensor(0.).to(device)``, pranz24's SAC) it is no site at all, as the legacy
constructors' literal sizes are not. On whole runs
these calls are a small share (TD3: ~6 calls a step; see ``benchmarks/bench_public_scripts.py``).

Safety (statically; the value checks are in the runtime helper's docstring):

* the receiver of ``.to`` is the call itself (a fresh tensor nobody else holds), of
  ``torch.FloatTensor`` / ``torch.DoubleTensor`` / ``torch.Tensor`` with one positional argument
  and no keyword;
* ``.to`` has exactly one positional argument and no keyword (``non_blocking=``, ``copy=``,
  ``memory_format=`` are not sites), a name, a dotted name (``self.device``) or a string, none
  of which runs code when evaluated (beyond an attribute read), so evaluating it before the
  constructor instead of after changes nothing; a ``torch.*`` name (``torch.float16``: a dtype)
  is not a site; at run time anything but a ``torch.device`` or a ``str`` takes the original;
* for the legacy constructors the argument must not be a display, comprehension or constant
  (sizes, lists: another path; ``hot.tensor_from_arrays`` takes lists before this runs).
  A keyword on the constructor is not a site (``requires_grad=True`` would make the moved tensor a
  non-leaf where ``device=`` makes a leaf).

Look-alikes left alone: ``torch.from_numpy(x).to(device)`` (shares memory with the array on its
own device: a copy would change aliasing), ``.cuda()`` (the error on a CPU-only build differs),
``torch.LongTensor(x).to(device)`` (integer conversion of floats), ``t.to(device)`` of a tensor
that exists elsewhere.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import libcst as cst

from scalebox_cst.report import EXACT, REWRITTEN, SKIPPED, Site

from ..base import FileContext, Transform
from ..analysis.rewriting import plain_whitespace
from .bindings import PrunedTransformer, visit_calls
from .fresh_device_examples import EXAMPLES

ID = "hot.fresh_on_device"
RUNTIME = "scalebox_cst.runtime.hot_device.tensor_on"
_MAKERS = {"torch.tensor": "", "torch.FloatTensor": "float32", "torch.DoubleTensor": "float64",
           "torch.Tensor": "the default dtype"}


def _plain_device(expr: cst.BaseExpression) -> bool:
    """A name, dotted name or string: nothing evaluated but names and attribute reads."""
    if isinstance(expr, (cst.Name, cst.SimpleString)):
        return True
    return isinstance(expr, cst.Attribute) and _plain_device(expr.value) and not isinstance(expr.value, cst.SimpleString)


def _not_data(expr: cst.BaseExpression) -> bool:
    """A literal size, display or comprehension: not an array the legacy constructors read as data."""
    if isinstance(expr, cst.UnaryOperation):
        return _not_data(expr.expression)
    return isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString, cst.List, cst.Tuple, cst.ListComp,
                             cst.GeneratorExp, cst.Dict, cst.Set))


def _number(expr: cst.BaseExpression) -> bool:
    """A number literal, signed or not (``0.``, ``-1``): no array, no list."""
    if isinstance(expr, cst.UnaryOperation):
        return _number(expr.expression)
    return isinstance(expr, (cst.Integer, cst.Float, cst.Imaginary))


class _Rewriter(PrunedTransformer):
    def __init__(self, ctx: FileContext, sites: List[Site]) -> None:
        super().__init__()
        self.ctx = ctx
        self.sites = sites
        self.alias: Optional[str] = None

    def _skip(self, node: cst.CSTNode, reason: str) -> None:
        self.sites.append(self.ctx.site(ID, node, SKIPPED, reason))

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        func = original.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "to" and isinstance(func.value, cst.Call)):
            return updated
        inner = func.value
        maker = self.ctx.imports.qualify(inner.func)
        if maker not in _MAKERS:
            return updated
        if len(original.args) != 1 or original.args[0].keyword is not None or original.args[0].star:
            self._skip(original, f"{maker}(...).to(...) with keywords or more arguments: not only a move, left alone")
            return updated
        device = original.args[0].value
        qual = self.ctx.imports.qualify(device) if isinstance(device, (cst.Name, cst.Attribute)) else None
        if not _plain_device(device) or (qual or "").startswith("torch."):
            self._skip(original, f"{maker}(...).to(...): the target is not a plain device name, left alone")
            return updated
        positional = [a for a in inner.args if a.keyword is None]
        keywords = [a.keyword.value for a in inner.args if a.keyword is not None]
        if len(positional) != 1 or positional[0].star or any(a.star for a in inner.args):
            return updated
        allowed = {"dtype"} if maker == "torch.tensor" else set()
        if not set(keywords) <= allowed:
            self._skip(original, f"{maker}(..., {', '.join(keywords)}=...).to(device): "
                                 "made on the device it would differ (requires_grad: a leaf, not a moved copy)")
            return updated
        if maker == "torch.tensor":
            if _number(positional[0].value):
                return updated  # ``torch.tensor(0.).to(device)``: a number, never the array the helper serves
            self._skip(original, "torch.tensor(x).to(device): left alone, as a list given to it measured 0.44x "
                                 "through the guard (arrays 1.1-1.4x)")
            return updated
        if _not_data(positional[0].value):
            return updated
        if self.alias is None:
            self.alias = self.ctx.runtime_name(RUNTIME, "_sb_tensor_on")
        moved = updated.func
        if not (isinstance(moved, cst.Attribute) and isinstance(moved.value, cst.Call)):
            return updated  # same shape as ``original``: the transformer changes no inner ``maker(...)``
        inner_updated = moved.value
        data = inner_updated.args[0].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        if plain_whitespace(data.whitespace_after_arg):  # a newline before the inner ``)``: not mid-call
            data = data.with_changes(whitespace_after_arg=cst.SimpleWhitespace(""))
        move = updated.args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        rest = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in inner_updated.args[1:]]
        args = [cst.Arg(inner_updated.func, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), data,
                move.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if rest else cst.MaybeSentinel.DEFAULT)]
        for i, a in enumerate(rest):
            args.append(a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if i < len(rest) - 1
                                       else cst.MaybeSentinel.DEFAULT))
        self.sites.append(self.ctx.site(ID, original, REWRITTEN, (
            f"{maker}(x).to(device) as from_numpy(x).to(device, {_MAKERS[maker]}) for a writable float/bool/small-int "
            "ndarray (its own steps, without its argument parsing), else as written: the same tensor"), EXACT))
        return cst.Call(func=cst.Name(self.alias), args=args)


class HotFreshOnDevice(Transform):
    id = ID
    version = "3"  # 3: torch.tensor(<number literal>).to(device) is no site (was skipped as if given a list)
    triggers = (".to(",)
    description = "make(x).to(device) of a fresh tensor → from_numpy(x).to(device, dtype) (guarded, exact)"

    EXAMPLES = EXAMPLES

    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        import ast

        calls = [n for n in ast.walk(ctx.tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and n.func.attr == "to" and isinstance(n.func.value, ast.Call)
                 and ctx.imports.qualify(n.func.value.func) in _MAKERS]
        if not calls:
            return None, []
        sites: List[Site] = []
        # each call is decided by itself (no bindings read): only their statements parsed
        new = visit_calls(ctx, calls, _Rewriter(ctx, sites), scoped=False)
        return new, sites
