"""The program :func:`scalebox_cst.runtime.fused.fused_linear` runs: a backward loop's body as text,
compiled once into instructions for the C kernel (``_fused_c``). Pure Python, no torch: the engine
validates the programs it emits with the same parser the runtime compiles them with.

Grammar (``;``-separated Python statements, the body of ``for t in range(T - 1, -1, -1):``):

- tail statements first, ``X[T] = NAME``: at the step t = T-1 a read ``X[t + 1]`` reads NAME (the
  body's last-step case, CleanRL's ``if t == T - 1: nextvalues = next_value``);
- assignments ``TARGET = ... = expr`` of temporaries and of outputs ``OUT[t]``; exactly one of them,
  the carried update, assigns a name S that its value reads. ``S = B + A * S`` (or ``A * S + B``,
  ``B + S * A``, ``S * A + B``: one multiply, one add, A and B not reading S) runs as the exact
  recurrence kernel; any other update in the grammar runs as written one row at a time (row mode:
  its S-free parts per block, the rest per row; a Python-number start value is left to the loop,
  whose first step would be Python arithmetic). Statements before the update may not read S;
  statements after it (the post phase) read its new value (``returns[t] = gae + values[t]``);
- a recurrence through memory, ``OUT[t] = f(OUT[t + 1])`` (``OUT`` read nowhere else), carries the
  value in ``OUT``: its start value is OUT's row T, and no value is handed back;
- optionally ``del S`` at the end: the caller does not need S's final value;
- expressions: int / float literals, names, ``X[t]``, ``X[t + k]`` (0 <= k <= 64), ``+ - * /``,
  unary ``- +``, parentheses.

Parameters are the free names (the carried S included: its value before the loop) in order of
first appearance in the text; :func:`params_of` gives them. Constant-only subexpressions become a
Python prelude (the loop computes them in Python); the rest become vector instructions.
"""
from __future__ import annotations

import ast
import copy
import operator
from typing import Any, Dict, List, Optional, Set, Tuple, Union

__all__ = ["Program", "program", "params_of"]

#: instruction numbers (the OP_ constants of runtime/_fused_c.c)
LOAD, ADD, SUB, MUL, DIV, ADD_S, SUB_S, MUL_S, DIV_S, RSUB_S, RECIP, NEG, STORE, LOADS = range(14)
_VV = {ast.Add: ADD, ast.Sub: SUB, ast.Mult: MUL, ast.Div: DIV}
_VS = {ast.Add: ADD_S, ast.Sub: SUB_S, ast.Mult: MUL_S, ast.Div: DIV_S}
_PY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.USub: operator.neg, ast.UAdd: operator.pos}


class _Invalid(Exception):
    """The program is outside the grammar (fused_linear returns None)."""


class Program:
    """A compiled body: the roles of its parameters and the kernel's instructions."""

    def __init__(self) -> None:
        self.params: Tuple[str, ...] = ()
        self.carried = ""
        self.seqs: List[str] = []  # sequence params, kernel order
        self.max_k: Dict[str, int] = {}
        self.tails: Dict[str, str] = {}  # seq -> tail param
        self.consts: List[str] = []  # params read as numbers
        self.s_outs: List[str] = []  # outputs of the carried value
        self.t_outs: List[str] = []  # outputs of temporaries (STORE slots after the s_outs)
        self.literals: List[Union[int, float]] = []
        self.prelude: List[Tuple[int, Any, int, int]] = []  # (slot, fn, x, y): Python arithmetic
        self.code: List[Tuple[int, int, int, int]] = []
        self.a: Tuple[int, int] = (0, 0)
        self.b: Tuple[int, int] = (0, 0)
        self.code_t: Tuple[Tuple[int, int, int, int], ...] = ()
        self.npre = 0  # instructions before the recurrence (the rest: the post phase)
        self.row_mode = False  # the update runs as written, row by row (row_code, nrt temporaries)
        self.memo = ""  # the output that carries the value (OUT[t] = f(OUT[t + 1])), its row T the start
        self.row_code: Tuple[Tuple[int, int, int, int], ...] = ()
        self.nrt = 0
        self.feeds: frozenset = frozenset()  # the reads (seq, k) the carried value is computed from
        self.feed_seqs: frozenset = frozenset()  # their sequences
        self.sub_consts: Set[int] = set()  # constant params a tensor subtracts or is subtracted from
        self.need_last = True  # False: the program ends in ``del S`` (the value is dead after the loop)


def _is_t(node: ast.AST, k_ok: bool = True) -> Optional[int]:
    """k for the index ``t`` / ``t + k`` (k a non-negative int literal), else None."""
    if isinstance(node, ast.Name) and node.id == "t":
        return 0
    if (k_ok and isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.left, ast.Name)
            and node.left.id == "t" and isinstance(node.right, ast.Constant) and type(node.right.value) is int
            and 0 <= node.right.value <= 64):
        return node.right.value
    return None


def _lower(op: type, left: Tuple[str, Any], right: Tuple[str, Any], vv: Any, vs: Any) -> Tuple[str, Any]:
    """A binary operation with at least one vector side, as torch computes it: ``vv(opcode, x, y)``
    for two vectors, ``vs(opcode, x, slot)`` for a vector and a number. ``c + x`` and ``c * x``
    commute (one rounding either way), ``c - x`` is one reversed subtraction, ``c / x`` is torch's
    ``x.reciprocal() * c``. Values are ``(kind, value)``; kind "s" is a number."""
    if left[0] != "s" and right[0] != "s":
        return vv(_VV[op], left, right)
    if right[0] == "s":
        return vs(_VS[op], left, right[1])
    if op in (ast.Add, ast.Mult):
        return vs(_VS[op], right, left[1])
    if op is ast.Sub:
        return vs(RSUB_S, right, left[1])
    return vs(MUL_S, vs(RECIP, right, None), left[1])


class _Compiler:
    def __init__(self, tree: ast.Module) -> None:
        self.p = Program()
        self.tree = tree
        self.ssa = 0
        self.env: Dict[str, Tuple[str, int]] = {}  # temporary -> ("v", ssa) | ("s", slot)
        self.seq_index: Dict[str, int] = {}
        self.const_index: Dict[str, int] = {}
        self.uses: Dict[int, int] = {}  # ssa -> last instruction reading it
        self.ins: List[List[int]] = []  # [op, dst_ssa, x, y] (x / y: ssa, seq, k or slot)
        self.deps: Dict[int, Set[Tuple[int, int]]] = {}  # ssa -> the reads (seq, k) it is computed from
        self.s_value: Optional[Tuple[str, int]] = None  # the carried value's rows in the post phase

    # ---- values: ("v", ssa) vectors, ("s", slot) scalars (slots: consts, literals, prelude)
    def new(self) -> int:
        self.ssa += 1
        return self.ssa

    def emit(self, op: int, x: int, y: int, vx: bool, vy: bool) -> Tuple[str, int]:
        d = self.new()
        n = len(self.ins)
        deps: Set[Tuple[int, int]] = set()
        for used, v in ((vx, x), (vy, y)):
            if used:
                self.uses[v] = n
                deps |= self.deps[v]
        self.deps[d] = deps
        self.ins.append([op, d, x, y])
        return ("v", d)

    def scalar(self, fn: Any, x: int, y: int) -> Tuple[str, int]:
        slot = ("prelude", len(self.p.prelude))
        self.p.prelude.append((len(self.p.prelude), fn, x, y))
        return ("s", slot)  # type: ignore[return-value]

    def expr(self, e: ast.AST, carried: str) -> Tuple[str, Any]:
        p = self.p
        if isinstance(e, ast.Constant) and type(e.value) in (int, float):
            p.literals.append(e.value)
            return ("s", ("lit", len(p.literals) - 1))
        if isinstance(e, ast.Name):
            if e.id == carried and getattr(self, "after", False):  # its new value, block by block
                if self.s_value is None:
                    d = self.new()
                    self.ins.append([LOADS, d, 0, 0])
                    self.deps[d] = set()
                    self.s_value = ("v", d)
                return self.s_value
            if e.id in ("t", "T") or e.id == carried:
                raise _Invalid(e.id)
            if e.id in self.env:
                return self.env[e.id]
            if e.id in self.assigned:  # a temporary read before this step assigns it
                raise _Invalid(e.id)
            if e.id in self.seq_index or e.id in p.tails.values() or e.id in self.outs:
                raise _Invalid(e.id)
            if e.id not in self.const_index:
                self.const_index[e.id] = len(p.consts)
                p.consts.append(e.id)
            return ("s", ("const", self.const_index[e.id]))
        if isinstance(e, ast.Subscript) and isinstance(e.value, ast.Name):
            k = _is_t(e.slice)
            x = e.value.id
            if k is None or x in self.env or x in self.assigned or x in self.const_index or x in self.outs \
                    or x in ("t", "T") or x == carried:
                raise _Invalid(x)
            if x not in self.seq_index:
                self.seq_index[x] = len(p.seqs)
                p.seqs.append(x)
            p.max_k[x] = max(p.max_k.get(x, 0), k)
            d = self.new()
            self.ins.append([LOAD, d, self.seq_index[x], k])
            self.deps[d] = {(self.seq_index[x], k)}
            return ("v", d)
        if isinstance(e, ast.UnaryOp) and type(e.op) in (ast.USub, ast.UAdd):
            kind, v = self.expr(e.operand, carried)
            if kind == "s":
                return self.scalar(_PY[type(e.op)], v, None)
            return self.emit(NEG, v, 0, True, False) if isinstance(e.op, ast.USub) else (kind, v)
        if isinstance(e, ast.BinOp) and type(e.op) in _VV:
            left, right = self.expr(e.left, carried), self.expr(e.right, carried)
            if left[0] == "s" and right[0] == "s":
                return self.scalar(_PY[type(e.op)], left[1], right[1])
            return _lower(type(e.op), left, right,
                          lambda o, x, y: self.emit(o, x[1], y[1], True, True),
                          lambda o, x, c: self.emit(o, x[1], 0 if c is None else c, True, False))
        raise _Invalid(type(e).__name__)

    # ---- statements
    def compile(self) -> Program:
        p = self.p
        body = self.tree.body
        if body and isinstance(body[-1], ast.Delete):  # ``del S``: the caller needs no final value
            d = body[-1]
            if len(d.targets) != 1 or not isinstance(d.targets[0], ast.Name):
                raise _Invalid("del")
            self.dead = d.targets[0].id
            body = body[:-1]
            p.need_last = False
        if not body or not all(isinstance(s, ast.Assign) for s in body):
            raise _Invalid("statements")
        i = 0
        while i < len(body) and self._tail(body[i]):
            i += 1
        stmts = body[i:]
        self._memo(stmts)
        stmts = self._merge_updates(stmts)
        # the carried update: the one statement that assigns a name its value reads
        updates = [j for j, s in enumerate(stmts) if any(
            isinstance(x, ast.Name) and any(isinstance(n, ast.Name) and n.id == x.id for n in ast.walk(s.value))
            for x in s.targets)]
        if len(updates) != 1:
            raise _Invalid("no update, or several")
        upd = updates[0]
        update = stmts[upd]
        names = [x.id for x in update.targets if isinstance(x, ast.Name)]
        if len(names) != 1:
            raise _Invalid("update targets")
        S = names[0]
        p.carried = S
        if hasattr(self, "dead") and (self.dead != S or p.memo):
            raise _Invalid("del")
        self.outs: Dict[str, bool] = {}
        self.assigned = set()
        for s in stmts:
            for x in s.targets:
                if isinstance(x, ast.Name):
                    if x.id in ("t", "T"):
                        raise _Invalid("assigns the step or the length")
                    if x.id != S:
                        self.assigned.add(x.id)
                elif isinstance(x, ast.Subscript) and isinstance(x.value, ast.Name) and _is_t(x.slice, False) == 0:
                    if x.value.id in self.outs:
                        raise _Invalid("an output written twice")
                    self.outs[x.value.id] = True
                else:
                    raise _Invalid("target")
        if S in self.assigned or set(self.outs) & (self.assigned | {S, "t", "T"}) or set(p.tails) & set(self.outs):
            raise _Invalid("names")
        self.after = False  # the post phase: statements after the update read its new value
        for s in stmts[:upd]:
            self._statement(s, S)
        try:
            self._update(update.value, S)
        except _Invalid:
            self._row_update(update.value, S)
        self.npre = len(self.ins)
        p.s_outs = [x.value.id for x in update.targets if isinstance(x, ast.Subscript)]
        self.after = True
        for s in stmts[upd + 1:]:
            if isinstance(s.value, ast.Name) and s.value.id == S and all(isinstance(x, ast.Subscript) for x in s.targets):
                p.s_outs.extend(x.value.id for x in s.targets)
            else:  # `returns[t] = gae + values[t]`: computed on each block once its carried values are known
                self._statement(s, S)
        for x, k in p.max_k.items():
            if x in p.tails and k > 1:
                raise _Invalid("a tailed sequence read at t + 2")
        self._finish()
        return p

    @staticmethod
    def _merge_updates(stmts: List[ast.Assign]) -> List[ast.Assign]:
        """``s = f(s); s = g(s)`` (consecutive, the first assigning only ``s``) is ``s = g(f(s))``:
        the same operations in the same order (ikostrikov's ``gae = gae * bad_masks[step + 1]``)."""
        out: List[ast.Assign] = []
        for st in stmts:
            prev = out[-1] if out else None
            names = [x.id for x in st.targets if isinstance(x, ast.Name)]
            if prev is not None and len(prev.targets) == 1 and isinstance(prev.targets[0], ast.Name) \
                    and prev.targets[0].id in names and len(names) == 1:
                S = names[0]
                reads = [n for n in ast.walk(st.value) if isinstance(n, ast.Name) and n.id == S]
                if reads and any(isinstance(n, ast.Name) and n.id == S for n in ast.walk(prev.value)):
                    out[-1] = ast.Assign(targets=st.targets, value=_NameToValue(S, prev.value).visit(st.value), lineno=st.lineno,
                                         col_offset=st.col_offset)
                    continue
            out.append(st)
        return out

    def _memo(self, stmts: List[ast.Assign]) -> None:
        """``OUT[t] = f(OUT[t + 1])``: the carried value lives in the output (ikostrikov's
        ``returns[step] = returns[step + 1] * gamma * masks[step + 1] + rewards[step]``); it becomes
        ``OUT[t] = S = f(S)`` with S a name of the program's own, its start value OUT's row T."""
        S = "__memo__"
        if any(isinstance(n, ast.Name) and n.id == S for st in stmts for n in ast.walk(st)):
            raise _Invalid("the program's own name")
        for st in stmts:
            outs = [x.value.id for x in st.targets if isinstance(x, ast.Subscript) and isinstance(x.value, ast.Name)
                    and _is_t(x.slice, False) == 0]
            for out in outs:
                reads = [n for n in ast.walk(st.value) if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)
                         and n.value.id == out]
                if not reads:
                    continue
                if any(_is_t(n.slice) != 1 for n in reads) or len(st.targets) != 1 or self.p.memo:
                    raise _Invalid("a read of an output")
                st.value = _RowToName(out, S).visit(st.value)
                st.targets = [st.targets[0], ast.Name(id=S, ctx=ast.Store())]
                self.p.memo = out
                self.p.need_last = False

    def _statement(self, s: ast.Assign, S: str) -> None:
        kind, v = self.expr(s.value, S)
        for x in s.targets:
            if isinstance(x, ast.Name):
                self.env[x.id] = (kind, v)
            else:
                if kind != "v":
                    raise _Invalid("a number stored")
                self.p.t_outs.append(x.value.id)
                self.uses[v] = len(self.ins)
                self.ins.append([STORE, -len(self.p.t_outs), v, 0])

    def _tail(self, s: ast.Assign) -> bool:
        if len(s.targets) != 1:
            return False
        x = s.targets[0]
        if not (isinstance(x, ast.Subscript) and isinstance(x.value, ast.Name) and isinstance(x.slice, ast.Name)
                and x.slice.id == "T"):
            return False
        if not isinstance(s.value, ast.Name) or s.value.id in ("t", "T") or x.value.id in self.p.tails \
                or s.value.id in self.p.tails.values():
            raise _Invalid("tail")
        self.p.tails[x.value.id] = s.value.id
        return True

    def _update(self, v: ast.AST, S: str) -> None:
        """``S = B + A * S`` (and its commuted spellings): A and B compiled, S read nowhere else."""
        if not (isinstance(v, ast.BinOp) and isinstance(v.op, ast.Add)):
            raise _Invalid("update")
        for b, m in ((v.left, v.right), (v.right, v.left)):
            if isinstance(m, ast.BinOp) and isinstance(m.op, ast.Mult):
                if isinstance(m.right, ast.Name) and m.right.id == S:
                    a = m.left
                elif isinstance(m.left, ast.Name) and m.left.id == S:
                    a = m.right
                else:
                    continue
                if any(isinstance(n, ast.Name) and n.id == S for n in ast.walk(a)) or \
                        any(isinstance(n, ast.Name) and n.id == S for n in ast.walk(b)):
                    continue
                self.ab = (self.expr(b, S), self.expr(a, S))
                if self.ab[0][0] == "s" and self.ab[1][0] == "s":
                    raise _Invalid("no per-step value")  # the loop would stay in Python numbers
                return
        raise _Invalid("update")

    def _row_update(self, v: ast.AST, S: str) -> None:
        """Any other update of S in the grammar, run as written one row at a time: the parts that do
        not read S go to the block phase, the rest become row instructions (operands: block
        registers by SSA, -1 the carried value, -(k + 1) row temporary k, constant slots)."""
        self.rows: List[List[Any]] = []
        self.row_ssa: Set[int] = set()
        out = self._row(v, S)
        if out[0] != "r" or not self.rows:
            raise _Invalid("update")
        self.p.row_mode = True

    def _row(self, e: ast.AST, S: str) -> Tuple[str, Any]:
        """One operand of :meth:`_row_update`'s row program."""
        if not any(isinstance(n, ast.Name) and n.id == S for n in ast.walk(e)):  # does not read S
            kind, val = self.expr(e, S)
            if kind == "v":
                self.row_ssa.add(val)
            return kind, val
        if isinstance(e, ast.Name):
            return ("r", 0)
        if isinstance(e, ast.UnaryOp) and type(e.op) in (ast.USub, ast.UAdd):
            kind, val = self._row(e.operand, S)
            return self._row_emit(NEG, (kind, val), None) if isinstance(e.op, ast.USub) else (kind, val)
        if isinstance(e, ast.BinOp) and type(e.op) in _VV:  # (one side reads S: not two numbers)
            return _lower(type(e.op), self._row(e.left, S), self._row(e.right, S), self._row_emit, self._row_emit)
        raise _Invalid(type(e).__name__)

    def _row_emit(self, op: int, x: Any, y: Any) -> Tuple[str, int]:
        d = len(self.rows) + 1  # row temporaries 1, 2, ... (0: the carried value)
        self.rows.append([op, d, x, y])
        return ("r", d)

    def _finish(self) -> None:
        """Registers for the SSA values (reused after their last read), scalar slots numbered."""
        p = self.p
        end = len(self.ins) + 1
        if p.row_mode:  # no coefficients: the block values the row program reads stay live
            self.ab = (("v", -1), ("v", -1))
            for v in self.row_ssa:
                self.uses[v] = end
        (bk, bv), (ak, av) = self.ab
        for k, v in ((ak, av), (bk, bv)):
            if k == "v":
                self.uses[v] = end
        nconst, nlit = len(p.consts), len(p.literals)

        def slot(s: Tuple[str, int]) -> int:
            kind, i = s
            return i if kind == "const" else nconst + i if kind == "lit" else nconst + nlit + i

        p.prelude = [(nconst + nlit + i, fn, slot(x), slot(y) if y is not None else -1)
                     for i, fn, x, y in p.prelude]
        phys: Dict[int, int] = {}
        free: List[int] = []
        top = 0
        for n, (op, d, x, y) in enumerate(self.ins):
            reads = [] if op in (LOAD, LOADS) else [x] + ([y] if op in (ADD, SUB, MUL, DIV) else [])
            regs = [phys[r] for r in reads]
            if op in (ADD_S, SUB_S, MUL_S, DIV_S, RSUB_S):
                y = slot(y)
                if op in (SUB_S, RSUB_S) and y < nconst:  # torch refuses `tensor - True`
                    p.sub_consts.add(y)
            dying = [phys[r] for r in set(reads) if self.uses.get(r, -1) == n]
            if op == STORE:
                p.code.append((STORE, len(p.s_outs) - d - 1, regs[0], 0))  # d = -(t_outs index + 1)
                free.extend(dying)
                continue
            if free:  # never one of this instruction's sources (the kernel's loops are restrict)
                phys[d] = free.pop()
            else:
                phys[d] = top
                top += 1
            free.extend(dying)
            if self.uses.get(d, -1) < 0 and d not in (av, bv):
                free.append(phys[d])  # never read
            if op in (LOAD, LOADS):
                p.code.append((op, phys[d], x, y))
            else:
                p.code.append((op, phys[d], regs[0], regs[1] if len(regs) > 1 else y))
        if top > 64:
            raise _Invalid("too many registers")
        if p.row_mode:
            p.feeds = frozenset().union(*(self.deps[v] for v in self.row_ssa))
            p.a = p.b = (1, 0)  # unused: the row program is the update

            def operand(o: Any) -> int:
                kind, val = o
                return phys[val] if kind == "v" else -(val + 1)

            code = []
            for op, d, x, y in self.rows:
                yy = slot(y) if op in (ADD_S, SUB_S, MUL_S, DIV_S, RSUB_S) else operand(y) if y is not None else 0
                if op in (SUB_S, RSUB_S) and yy < nconst:
                    p.sub_consts.add(yy)
                code.append((op, -(d + 1), operand(x), yy))
            p.row_code = tuple(code)
            p.nrt = len(self.rows)
            if top == 0:
                raise _Invalid("no per-step value")
        else:
            p.feeds = frozenset().union(*(self.deps[v] for k, v in ((ak, av), (bk, bv)) if k == "v"))
            p.a = (1, phys[av]) if ak == "v" else (0, slot(av))
            p.b = (1, phys[bv]) if bk == "v" else (0, slot(bv))
        p.feed_seqs = frozenset(i for i, _ in p.feeds)
        p.code_t = tuple(p.code)
        p.npre = self.npre  # (one instruction per SSA instruction, STOREs included)


def _parse(program: str) -> Optional[Program]:
    try:
        tree = ast.parse(program, mode="exec")
        p = _Compiler(tree).compile()
    except Exception:  # outside the grammar (or a case the compiler does not take): no program
        return None
    names = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Name) and hasattr(n, "lineno")),
                   key=lambda n: (n.lineno, n.col_offset))  # (the compiler's own names have no position)
    temps = {x.id for s in tree.body if isinstance(s, ast.Assign)
             for x in s.targets if isinstance(x, ast.Name)} - {p.carried}
    hidden = {"t", "T"} | ({p.carried} if p.memo else set())  # a memo's carried value is the program's own
    p.params = tuple(dict.fromkeys(n.id for n in names if n.id not in temps and n.id not in hidden))
    index = {
        **{x: ("seq", i) for i, x in enumerate(p.seqs)},
        **{x: ("tail", p.seqs.index(s)) for s, x in p.tails.items() if s in p.seqs},
        **{x: ("const", i) for i, x in enumerate(p.consts)},
        **{x: ("out", i) for i, x in enumerate(p.s_outs + p.t_outs)},
    }
    if not p.memo:
        index[p.carried] = ("init", 0)
    if any(s not in p.seqs for s in p.tails) or len(index) != len(p.params) or set(index) != set(p.params):
        return None  # a tail of a sequence never read, or a name with two roles
    pos = {n: i for i, n in enumerate(p.params)}
    p.nparams = len(p.params)
    p.seq_pos = [pos[x] for x in p.seqs]
    p.tail_pos = [pos[p.tails[x]] if x in p.tails else -1 for x in p.seqs]
    p.seq_k = [p.max_k[x] for x in p.seqs]
    p.seq_info = list(zip(p.seq_pos, p.tail_pos, p.seq_k))
    p.out_pos = [pos[x] for x in p.s_outs + p.t_outs]
    p.const_pos = [pos[x] for x in p.consts]
    p.init_pos = pos[p.carried] if not p.memo else -1
    p.ns = len(p.s_outs)
    p.recip = any(c[0] == RECIP for c in p.code_t + p.row_code)  # `c / x`: torch's reciprocal times c
    return p


#: program text -> Program, or None when outside the grammar (the texts are constants of the
#: rewritten code: a handful per process)
_PROGRAMS: Dict[str, Optional[Program]] = {}


def program(text: str) -> Optional[Program]:
    """The compiled program (cached), or None when ``text`` is outside the grammar."""
    try:
        return _PROGRAMS[text]
    except KeyError:
        if len(_PROGRAMS) > 4096:
            _PROGRAMS.clear()
        p = _PROGRAMS[text] = _parse(text) if type(text) is str else None
        return p


def params_of(text: str) -> Tuple[str, ...]:
    """The program's parameters in the order ``fused_linear`` takes their values (free names by
    first appearance); () when the program is outside the grammar."""
    p = program(text)
    return p.params if p is not None else ()


class _NameToValue(ast.NodeTransformer):
    """Each ``name`` replaced by a copy of ``value`` (classes at module level: one made per call is
    a cycle that stays alive, with what it holds, until a garbage collection)."""

    def __init__(self, name: str, value: ast.AST) -> None:
        self.name, self.value = name, value

    def visit_Name(self, n: ast.Name) -> ast.AST:
        return copy.deepcopy(self.value) if n.id == self.name else n


class _RowToName(ast.NodeTransformer):
    """Each ``out[...]`` replaced by a read of ``name``."""

    def __init__(self, out: str, name: str) -> None:
        self.out, self.name = out, name

    def visit_Subscript(self, n: ast.Subscript) -> ast.AST:
        if isinstance(n.value, ast.Name) and n.value.id == self.out:
            return ast.Name(id=self.name, ctx=ast.Load())
        return self.generic_visit(n)
