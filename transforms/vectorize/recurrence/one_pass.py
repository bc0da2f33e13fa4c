"""The one-pass tier of a rewritten recurrence: the loop body itself, as a program for
:func:`scalebox_cst.runtime.fused.fused_linear`, tried before the vectorized steps.

Why: the vectorized steps are a dozen torch ops plus the first step as written, 5-10 us of
dispatch each on a CPU, so a T=2048 GAE rewrite spent most of its 300-400 us in dispatch. The
program runs every step, the first one included, in one call of a small C kernel, bitwise the
loop; where the values are not what that kernel takes (another device, a tensor constant, no C
extension) it returns None and the vectorized steps run as before.

The program is the loop body in the grammar of :mod:`scalebox_cst.fused_program`: per-step
reads ``x[t + k]``, temporaries, outputs ``out[t]``, the carried update ``s = b + a * s``. The
body's last-step case (``if t == T - 1: nextvalues = next_value else: nextvalues = values[t + 1]``,
or its conditional-expression spelling) becomes a *tail*: ``values[T] = next_value`` -- the first
step reads ``next_value`` where the others read ``values[t + 1]`` -- when both branches are the same
statements but for such reads. Offered only where the temporaries the loop leaves behind are dead
(:mod:`.fold`); the carried value is handed back unless it is dead too (``del s``).
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from .body import _flatten
from .syntax import _code, _norm, _pure_container, _walk
from ...analysis.purity import is_pure
from . import fold, function_facts, program_shapes
from .analysis import Analysis
from .plan import Plan

_BIN = {cst.Add: "+", cst.Subtract: "-", cst.Multiply: "*", cst.Divide: "/"}
_UN = {cst.Minus: "-", cst.Plus: "+"}


class _No(Exception):
    """Outside what the program expresses: no one-pass tier for this site."""


class _Names:
    """Program-local names: the user's own where they are free, ``t`` / ``T`` kept for the step."""

    def __init__(self) -> None:
        self.of: Dict[str, str] = {}  # user code -> program name
        self.taken: Set[str] = {"t", "T"}

    def get(self, code: str) -> str:
        if code not in self.of:
            base = code.split(".")[-1] if re.fullmatch(r"[A-Za-z_][\w.]*", code) else "tail_value"
            name, i = base, 1
            while name in self.taken or not name.isidentifier():
                i += 1
                name = f"{base}_{i}"
            self.taken.add(name)
            self.of[code] = name
        return self.of[code]


def site(ctx, node: cst.For, a: Analysis, plan: Plan) -> Optional[Tuple[str, List[str], bool, bool]]:
    """(program, the argument expressions in parameter order, whether the carried value is needed
    after the program, whether the program runs the last step t = 0 too), or None where the site
    has no one-pass tier. Where the temporaries the loop leaves are live (module-level code, a
    temporary read after the loop), the program stops at t = 1 and the last step runs as written."""
    h = a.header
    if not plan.cpu:  # (a regrouped update, not `exact` for the vectorized steps, runs as written here)
        return None
    if h.kind != "index" or h.named is not None or h.counter is not None or h.sliced or h.elements:
        return None
    # (no elements, so no column of one: reads.element_column has nothing to read)
    if len(a.flow.rec_vars) != 1 or len(a.memo) > 1 or a.flow.resets or a.views or a.cells \
            or plan.tables.fwd_reads or a.flow.shift or a.readbacks or a.forwarded \
            or plan.tables.conds or a.dropped or a.lists.carried:
        return None
    # the body as written (not the planner's regrouped middle steps: the program is the loop itself,
    # and the runtime's grammar decides what it takes, `s = f(s); s = g(s)` included)
    mid = _flatten(a.items, True)
    first = _flatten(a.items, False)
    if any(it.accum for it in mid + first):  # out[t] += v: not in the program's grammar
        return None
    try:
        return _Builder(ctx, node, a, plan.folded).build(mid, first)
    except _No:
        return None


class _Builder:
    """The program of one site: ``a`` its analysis, ``folded`` whether the plan runs the last step."""

    def __init__(self, ctx, node: cst.For, a: Analysis, folded: bool) -> None:
        self.ctx, self.node, self.p, self.folded = ctx, node, a, folded
        self.S = a.flow.rec_vars[0]
        self.names = _Names()
        self.tails: Dict[str, str] = {}  # container code -> tail name (user code)
        self.memo_out: Optional[str] = None  # the output that carries the value, while its update renders

    def build(self, mid, first) -> Tuple[str, List[str], bool, bool]:
        p = self.p
        if any(it.kind != "assign" for it in mid) or len(mid) != len(first):
            raise _No()
        for n, (m, f) in enumerate(zip(mid, first)):
            self.opening = n == 0  # the step's first statement: nothing of the step ran before it
            if m is f and not m.first:
                continue
            if m.kind != f.kind or m.var != f.var or [_norm(o) for o in m.outs] != [_norm(o) for o in f.outs]:
                raise _No()
            fv = _first_value(p, f) if f.first else f.value
            if not self.match(m.value, fv):
                raise _No()
        self.assigned: Set[str] = set()
        lines = []
        for it in mid:
            memo = it.var is not None and it.var in p.memo  # out[t] = f(out[t + 1]), as written
            if memo:
                self.memo_out = _norm(p.memo[it.var])
                value = self.expr(it.node.value)
            else:
                value = self.expr(it.value)
            targets = [f"{self.container(o)}[t]" for o in it.outs]
            if it.var is not None and not memo:
                targets.append(self.names.get(it.var))
                if it.var != self.S:
                    self.assigned.add(it.var)
            if not targets:
                raise _No()
            lines.append(" = ".join(targets + [value]))
        tails = [f"{self.names.get(c)}[T] = {self.names.get(n)}" for c, n in self.tails.items()]
        folded = self.folded
        live = not p.memo and (not folded or not _dead_after(self.ctx.module, self.node, self.S))
        dead = [] if live or p.memo else [f"del {self.names.get(self.S)}"]
        text = "; ".join(tails + lines + dead)
        # the same tree with no more parentheses than it needs (it is shown in the diff), compiled
        normal = program_shapes.normal_program(text)
        if normal is None:
            raise _No()
        back = {v: k for k, v in self.names.of.items()}
        return normal[0], [back[n] for n in normal[1]], live, folded

    # ---- names and per-step reads
    def container(self, node: cst.BaseExpression) -> str:
        if not _pure_container(node):
            raise _No()
        return self.names.get(_code(node).strip())

    def step_read(self, e: cst.BaseExpression) -> Optional[Tuple[str, int]]:
        """(container code, k) for a per-step read ``x[t + k]`` of a named container."""
        ref = self.p.reads.per_step(e)
        if ref is None:
            return None
        cont, k = ref
        if not _pure_container(cont) or not isinstance(e, cst.Subscript) or k < 0:
            raise _No()
        return _code(cont).strip(), k

    def expr(self, e: cst.BaseExpression) -> str:
        p = self.p
        if isinstance(e, cst.Name):
            v = e.value
            if v == p.header.index:
                raise _No()
            if v == self.S:
                return self.names.get(v)
            if v in self.assigned:
                return self.names.get(v)
            if v in p.body_assigned or v in p.reads.elements:
                raise _No()
            return self.names.get(v)
        if isinstance(e, (cst.Integer, cst.Float)):
            return e.value
        if isinstance(e, cst.Subscript) and self.memo_out is not None and _pure_container(e.value) \
                and _norm(e.value) == self.memo_out:  # the carried value, read from the output
            if p.reads.parser.ref_offset(e) != 1:
                raise _No()
            return f"{self.names.get(_code(e.value).strip())}[t + 1]"
        if isinstance(e, cst.Subscript):
            ref = self.step_read(e)
            if ref is None:
                raise _No()
            name = self.names.get(ref[0])
            return f"{name}[t + {ref[1]}]" if ref[1] else f"{name}[t]"
        if isinstance(e, cst.Attribute) and _pure_container(e):
            if any(_norm(e) == w or w.startswith(_norm(e) + ".") for w in p.reads.written):
                raise _No()
            return self.names.get(_code(e).strip())
        if isinstance(e, cst.BinaryOperation) and type(e.operator) in _BIN:
            return f"({self.expr(e.left)} {_BIN[type(e.operator)]} {self.expr(e.right)})"
        if isinstance(e, cst.UnaryOperation) and type(e.operator) in _UN:
            return f"({_UN[type(e.operator)]}{self.expr(e.expression)})"
        raise _No()

    def invariant(self, e: cst.BaseExpression) -> bool:
        """Whether ``e`` has one value over the whole loop and evaluating it changes nothing: pure
        (:func:`is_pure`: the pure-call table, no methods that update a module in place) without the
        names the body assigns or the loop variables, and reading no container the loop writes."""
        p = self.p
        if not any(isinstance(n, cst.Name) for n in _walk(e)):
            return False  # a number (`else 0.0`): the loop's Python arithmetic, not a boundary row
        forbidden = set(p.body_assigned) | set(p.reads.elements) | {p.header.index or "", self.S}
        if not is_pure(e, forbidden, self.ctx.imports):
            return False
        return not any(isinstance(n, (cst.Name, cst.Attribute)) and _norm(n) in p.reads.written for n in _walk(e))

    # ---- the last-step case as tails
    def match(self, m: cst.BaseExpression, f: cst.BaseExpression) -> bool:
        """Whether the first step's ``f`` is the middle steps' ``m`` with reads ``x[t + 1]`` replaced
        by loop-invariant names (recorded as tails, one per container)."""
        if _norm(m) == _norm(f):
            return True
        p = self.p
        if isinstance(f, cst.Name) and isinstance(m, cst.Subscript):
            ref = self.step_read(m)
            if ref is None or ref[1] != 1 or f.value in p.body_assigned or f.value == p.header.index \
                    or f.value == self.S or f.value in p.reads.elements:
                return False
            prev = self.tails.setdefault(ref[0], f.value)
            return prev == f.value
        if isinstance(m, cst.Subscript) and self.opening and self.invariant(f):
            # SB3's `next_non_terminal = 1.0 - dones.astype(np.float32)`: a pure loop-invariant value,
            # evaluated with the call's arguments (where the loop would first evaluate it: the first
            # statement, so an exception it raises leaves what it would have left)
            ref = self.step_read(m)
            if ref is None or ref[1] != 1:
                return False
            code = _code(f).strip()
            prev = self.tails.setdefault(ref[0], code)
            return prev == code
        if isinstance(m, cst.BinaryOperation) and isinstance(f, cst.BinaryOperation) \
                and type(m.operator) is type(f.operator):
            return self.match(m.left, f.left) and self.match(m.right, f.right)
        if isinstance(m, cst.UnaryOperation) and isinstance(f, cst.UnaryOperation) \
                and type(m.operator) is type(f.operator):
            return self.match(m.expression, f.expression)
        return False


def _first_value(a: Analysis, it) -> cst.BaseExpression:
    """The first step's value of an item with last-step conditional expressions."""
    return a.reads.parser.resolve_last_step(it.shown, True)


def _dead_after(module: cst.Module, node: cst.For, name: str) -> bool:
    """Whether the value ``node`` leaves in ``name`` can never be read: in a function, outside any
    other loop, with no read of ``name`` outside ``node`` (plain ``name = ...`` assignments are
    not reads) and nothing that reads locals by name."""
    where = fold._enclosing(module, node)
    if where is None or where[1]:
        return False
    outside = function_facts.facts(where[0]).outside(node)  # one walk per function, not per loop
    return not outside.frame_readers() and not outside.reads(name)
