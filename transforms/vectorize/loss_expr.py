"""One sample's loss expression, batched over every sample, with each value kept as what it is to
the loop: a tensor of the batch dtype, or a Python float (``value.item()``, ``float(x)`` and
arithmetic on them), which the loop computes in float64 and torch casts to the tensor's dtype
where it meets a tensor. Per-sample losses of one value each (``F.smooth_l1_loss(value,
torch.tensor([R]))``) become one call with ``reduction='none'``.

Why a kind per value: ``R - value.item()`` with ``R`` a float32 0-d tensor is a float32
subtraction in the loop; ``G - value.item()`` with ``G`` a Python float is a float64 one whose
result is cast to float32 only where it meets a tensor. Batched, the Python floats are float64
tensors that ``LossBatch.weak`` casts at that point, so every operation sees the operands it saw
in the loop. The run-time requirements found on the way (1-element and 0-d elements, invariants
that must be Python numbers, float32/float64 only, the CPU for ``torch.tensor``) are collected
for the guard (``runtime.vectorized.loss_zip``).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, FrozenSet, List, Optional, Set

import libcst as cst

from ..analysis.bodies import _code
from ..analysis.purity import ALLOWED_KEYWORDS, EXACT_FUNCS, EXACT_METHODS, INEXACT_FUNCS, INEXACT_METHODS, is_pure, pure_call
from ..analysis.elementwise import NOT_HOISTED, depends

#: placeholder for the guard's result in batched code (the name is allocated once the loop passes)
BATCH = "__sb_loss_batch__"
#: per-sample losses batched as one call with reduction='none' (exact for 1-element samples:
#: the mean or sum of one value is that value, and the backward's norm is 1 / 1)
LOSSES = frozenset({"torch.nn.functional.smooth_l1_loss", "torch.nn.functional.mse_loss", "torch.nn.functional.l1_loss"})
_OPS = {cst.Add: "+", cst.Subtract: "-", cst.Multiply: "*", cst.Divide: "/", cst.Power: "**"}


def marker(k: int) -> str:
    """Placeholder for the batched name of element ``k`` (names are allocated once the loop passes)."""
    return f"\x00{k}\x00"


class Refused(Exception):
    """Why an expression cannot be batched (the site's skip reason)."""


@dataclasses.dataclass(frozen=True)
class Value:
    """What one (sub)expression is per sample. ``kind``: "t" (a tensor of the batch dtype), "py"
    (a Python float), "inv" (a loop invariant of unknown type), "num" (a number literal).
    ``keys`` / ``invs``: the elements / invariants (indices) whose rank the value's rank is the
    highest of, with ``const`` a floor; ``ops``: operations computed per sample."""

    code: str
    kind: str
    keys: FrozenSet[int] = frozenset()
    invs: FrozenSet[int] = frozenset()
    const: int = 0
    ops: int = 0


class LossExpr:
    """Batch the expressions of one loop body, in order. ``element(node)`` maps a loop element to
    its key; ``names`` maps keys to their batched names; ``temps`` (filled by the caller) maps
    the body's temporaries to their :class:`Value`; ``forbidden`` names (accumulators, a range
    index) may not appear otherwise."""

    def __init__(self, imports, element: Callable[[cst.CSTNode], Optional[str]], forbidden: Set[str], builtin_ok) -> None:
        self.imports = imports
        self.element = element
        self.forbidden = set(forbidden)
        self.builtin_ok = builtin_ok
        self.keys: List[str] = []  # elements read, first-use order (the guard's batches)
        self.invariants: List[cst.BaseExpression] = []
        self.temps: Dict[str, Value] = {}
        self.exact = True
        self.units: Set[int] = set()
        self.zerod: Set[int] = set()
        self.numbers: Set[int] = set()
        self.unit_invs: Set[int] = set()  # invariants of a per-sample loss: numbers or 1-element tensors
        self.floats = False  # Python floats per sample: float32/float64 only
        self.default = False  # torch.tensor([f]) of a Python float
        self.cpu = False  # torch.tensor(...) makes CPU tensors
        self.losses = False  # per-sample loss calls
        self.rank = 0

    # ---------------------------------------------------------------- leaves
    def _key(self, key: str) -> int:
        if key not in self.keys:
            self.keys.append(key)
        return self.keys.index(key)

    def _depends(self, expr: cst.CSTNode) -> bool:
        return depends(expr, self.element, self.forbidden | set(self.temps))

    def _invariant(self, expr: cst.BaseExpression) -> Value:
        if not is_pure(expr, self.forbidden | set(self.temps)):
            if is_pure(expr, self.forbidden | set(self.temps), self.imports):
                raise Refused(NOT_HOISTED.format(_code(expr)))
            raise Refused(f"`{_code(expr)}` is neither a loop element nor a loop-invariant value")
        if isinstance(expr, (cst.Integer, cst.Float)):
            return Value(_code(expr), "num")
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.expression, (cst.Integer, cst.Float)):
            return Value(f"({_code(expr)})", "num")
        idx = next((i for i, e in enumerate(self.invariants) if e.deep_equals(expr)), None)
        if idx is None:
            self.invariants.append(expr)
            idx = len(self.invariants) - 1
        return Value(f"({_code(expr)})", "inv", invs=frozenset({idx}))

    # ---------------------------------------------------------------- expressions
    def value(self, expr: cst.BaseExpression) -> Value:
        """The batched form of ``expr``, or :class:`Refused`."""
        key = self.element(expr)
        if key is not None:
            k = self._key(key)
            return Value(marker(k), "t", keys=frozenset({k}))
        if isinstance(expr, cst.Name) and expr.value in self.temps:
            return self.temps[expr.value]
        if not self._depends(expr):
            return self._invariant(expr)
        if isinstance(expr, cst.BinaryOperation):
            return self._binary(expr)
        if isinstance(expr, cst.UnaryOperation):
            if not isinstance(expr.operator, (cst.Minus, cst.Plus)):
                raise Refused(f"operator {type(expr.operator).__name__} is not vectorized")
            v = self.value(expr.expression)
            sign = "-" if isinstance(expr.operator, cst.Minus) else "+"
            return dataclasses.replace(v, code=f"({sign}{v.code})", ops=v.ops + (sign == "-"))
        if isinstance(expr, cst.Call):
            return self._call(expr)
        if isinstance(expr, cst.Name):
            raise Refused(f"`{expr.value}` (a loop variable or accumulator) is used as a value")
        if isinstance(expr, cst.Subscript):
            raise Refused(f"reads `{_code(expr)}`: not the current element (possible loop-carried dependence)")
        raise Refused(f"`{_code(expr)}` is not an element-by-element operation")

    def _binary(self, expr: cst.BinaryOperation) -> Value:
        op = _OPS.get(type(expr.operator))
        if op is None:
            raise Refused(f"operator {type(expr.operator).__name__} is not vectorized")
        a, b = self.value(expr.left), self.value(expr.right)
        kinds = {a.kind, b.kind}
        if op == "**":
            self.exact = False
        if "t" in kinds:
            if "py" in kinds and op == "**":
                raise Refused(f"`{_code(expr)}` raises a tensor to a Python float per sample (or the reverse): "
                              "pow takes another kernel for a scalar than for a tensor")
            a, b = (self._weak(a), self._weak(b))
            kind = "t"
        else:  # a Python float per sample with another, a number or an invariant (a Python number)
            if op in ("/", "**"):
                raise Refused(f"`{_code(expr)}` divides or raises Python floats per sample (the loop raises "
                              "ZeroDivisionError or computes a complex power where tensors do not)")
            for v in (a, b):
                if v.kind == "inv":
                    self.numbers |= v.invs
            kind = "py"
        return Value(f"({a.code} {op} {b.code})", kind, a.keys | b.keys, (a.invs | b.invs) if kind == "t" else frozenset(),
                     max(a.const, b.const), a.ops + b.ops + 1)

    def _weak(self, v: Value) -> Value:
        if v.kind != "py":
            return v
        return dataclasses.replace(v, code=f"{BATCH}.weak({v.code})", kind="t")

    def _call(self, call: cst.Call) -> Value:
        if any(a.star for a in call.args):
            raise Refused("a call unpacks arguments")
        func = call.func
        qual = self.imports.qualify(func)
        args = [a for a in call.args if a.keyword is None]
        kws = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        # x.item() / float(x) of a loop element: a Python float per sample
        is_item = isinstance(func, cst.Attribute) and func.attr.value == "item" and qual is None and not call.args
        is_float = isinstance(func, cst.Name) and func.value == "float" and self.builtin_ok("float") and len(args) == 1 and not kws
        if is_item or is_float:
            operand = func.value if is_item else args[0].value
            key = self.element(operand)
            if key is None:  # of a value computed per sample: `(R - value).detach().item()`
                v = self.value(operand)
                if v.kind != "t":
                    raise Refused(f"`{_code(call)}`: .item() / float() of a value that is not a tensor per sample")
                # one element per sample: every element it reads has one, every invariant is a
                # number or a 1-element tensor (the guard checks both), so their broadcast has one
                self.units |= v.keys
                self.unit_invs |= v.invs
                self.floats = True
                return Value(f"{BATCH}.item({v.code})", "py", ops=v.ops + 1)
            k = self._key(key)
            self.units.add(k)
            self.floats = True
            return Value(f"{BATCH}.item({marker(k)})", "py", ops=1)
        if qual in LOSSES:
            return self._loss(call, qual, args, kws)
        if (isinstance(func, cst.Attribute) and func.attr.value in ("unsqueeze", "view", "reshape") and qual is None
                and len(args) == 1 and not kws and isinstance(args[0].value, cst.Integer)
                and args[0].value.evaluated_value in ((0, -1) if func.attr.value == "unsqueeze" else (1,))):
            return self._one(call, func.value)
        if qual == "torch.tensor":
            return self._new(call, args, kws)
        bad = next((k for k in kws if k not in ALLOWED_KEYWORDS), None)
        if bad is not None:
            raise Refused(f"keyword argument {bad}= is not vectorized")
        if qual in EXACT_FUNCS or qual in INEXACT_FUNCS:
            self.exact &= qual in EXACT_FUNCS
            head, operands = _code(func), [a.value for a in call.args]
        elif (
            qual is None
            and isinstance(func, cst.Attribute)
            and func.attr.value in (EXACT_METHODS | INEXACT_METHODS | {"detach"})
            and self._depends(func.value)
        ):
            self.exact &= func.attr.value not in INEXACT_METHODS
            head, operands = None, [func.value] + [a.value for a in call.args]
        else:
            name = _code(func) + (f" ({qual})" if qual and qual != _code(func) else "")
            if pure_call(call, self.imports):  # the one table of pure calls (analysis.purity)
                raise Refused(f"calls `{name}`, which is pure but not known to act element by element")
            raise Refused(f"calls `{name}`, which is not known to act element by element (or may have side effects)")
        vals = [self.value(o) for o in operands]
        if any(v.kind == "py" for v in vals):
            raise Refused(f"`{_code(call)}` is given a Python float per sample (the loop's call may not take one)")
        codes = [v.code for v in vals]
        labels = [""] * len(operands)
        if head is None:  # method: the object first, then its arguments
            obj, rest = codes[0], codes[1:]
            labels = [""] + [f"{a.keyword.value}=" if a.keyword is not None else "" for a in call.args]
            code = f"{obj}.{func.attr.value}({', '.join(l + c for l, c in zip(labels[1:], rest))})"
        else:
            labels = [f"{a.keyword.value}=" if a.keyword is not None else "" for a in call.args]
            code = f"{head}({', '.join(l + c for l, c in zip(labels, codes))})"
        detach = head is None and func.attr.value == "detach"
        return Value(code, "t", frozenset().union(*(v.keys for v in vals)), frozenset().union(*(v.invs for v in vals)),
                     max(v.const for v in vals), sum(v.ops for v in vals) + (0 if detach else 1))

    def _loss(self, call: cst.Call, qual: str, args, kws) -> Value:
        name = qual.rsplit(".", 1)[1]
        if len(args) != 2 or set(kws) - {"reduction", "beta"} or ("beta" in kws and name != "smooth_l1_loss"):
            raise Refused(f"`{_code(call)}`: only ({name}(input, target) with reduction= and beta= keywords) is batched")
        red = kws.get("reduction")
        if red is not None and not (isinstance(red, cst.SimpleString) and red.evaluated_value in ("mean", "sum")):
            raise Refused(f"`{_code(call)}`: a per-sample loss is batched with reduction 'mean' or 'sum' only")
        beta = kws.get("beta")
        if beta is not None and not (isinstance(beta, (cst.Float, cst.Integer)) and float(beta.evaluated_value) > 0):
            raise Refused(f"`{_code(call)}`: beta= must be a positive number literal")
        vals = [self.value(a.value) for a in args]
        for v in vals:
            if v.kind == "py":
                raise Refused(f"`{_code(call)}` is given a Python float per sample (F.{name} takes tensors)")
            # one value per sample, so that the mean (or sum) of the sample's loss is that value
            self.units |= v.keys
            self.unit_invs |= v.invs
        extra = f", beta={_code(beta)}" if beta is not None else ""
        self.losses = True
        code = f"{_code(call.func)}({vals[0].code}, {vals[1].code}, reduction='none'{extra})"
        return Value(code, "t", ops=vals[0].ops + vals[1].ops + 1)

    def _one(self, call: cst.Call, operand: cst.BaseExpression) -> Value:
        """``x.unsqueeze(0)`` / ``x.view(1)`` / ``x.reshape(1)`` of a 0-d loop element: shape [1]
        per sample, the same values and history (the aligned batch already is that)."""
        key = self.element(operand)
        if key is None:
            raise Refused(f"`{_code(call)}`: only a 0-d loop element is reshaped to one value per sample")
        k = self._key(key)
        self.zerod.add(k)
        self.rank = max(self.rank, 1)
        return Value(marker(k), "t", const=1)

    def _new(self, call: cst.Call, args, kws) -> Value:
        if kws or len(args) != 1 or not isinstance(args[0].value, cst.List) or len(args[0].value.elements) != 1 \
                or isinstance(args[0].value.elements[0], cst.StarredElement):
            raise Refused(f"`{_code(call)}`: only torch.tensor([x]) of one value per sample is batched")
        inner = args[0].value.elements[0].value
        v = self.value(inner)
        self.cpu = True
        self.rank = max(self.rank, 1)
        if v.kind == "py":
            self.default = True
            return Value(f"{BATCH}.weak({v.code})", "t", const=1, ops=v.ops)
        key = self.element(inner)
        if v.kind != "t" or key is None:
            raise Refused(f"`{_code(call)}`: only torch.tensor([x]) of a loop element or a Python float per sample is batched")
        self.zerod.add(self._key(key))
        return Value(f"{BATCH}.new({v.code})", "t", const=1, ops=v.ops)
