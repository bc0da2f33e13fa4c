"""vectorize.recurrence, quadratic form: advantages / returns summed over k >= t in a double loop.

Widely copied PPO and REINFORCE code (Phil Tabor's among them) computes every advantage as its own
sum, ``a_t = sum_{k>=t} c^(k-t) E(k)`` with a running discount, at O(T^2) cost: seconds per update
at T = 2048. Where the algebra matches exactly (the term E independent of t, the discount reset
to 1 for each t and multiplied by a loop-invariant c, the sum reset to 0), the sums are the
backward recurrence ``s_k = E(k) + c * s_{k+1}``, one ``linear_recurrence`` call. The sums are
re-ordered (reassociated), nothing else changes: the code's behaviour is kept, bugs included (a
discount that does not stop at episode ends still does not). The outer steps t < T-1 are
vectorized, the last one runs exactly as written (so t, k, the sum, the discount and every
temporary end with the loop's values), behind a run-time guard with the original loop kept
verbatim in the else branch. Look-alikes whose algebra differs are reported with the reason.
"""
from __future__ import annotations

import ast
import dataclasses
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ...base import FileContext
from ...analysis.cstclone import clone, parse_statements
from .syntax import (
    Skip,
    _bound_names,
    _code,
    _code_line,
    _is_call,
    _is_int,
    _names_read,
    _norm,
    _one_line,
    _pure_container,
    _stmts,
    _walk,
    fresh,
)
from .headers import Header
from .body import _FORBIDDEN_SMALL, BodyParser
from .grammar import Grammar
from .reads import Reads
from .render import Renderer


#: builtins the pattern relies on (a module that rebinds one is left alone)
BUILTINS = ("range", "len", "int")
_ZERO = {"0", "0.0", "0."}
_ONE = {"1", "1.0", "1."}


# --------------------------------------------------------------------------- cheap pre-filter (ast)


def candidate(node: ast.AST) -> bool:
    """``for t in ...`` holding an inner ``for k in range(<uses t>, ...)`` that accumulates."""
    if not isinstance(node, ast.For) or not isinstance(node.target, ast.Name):
        return False
    t = node.target.id
    for sub in ast.walk(node):
        if sub is node or not isinstance(sub, ast.For):
            continue
        it = sub.iter
        if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range" and it.args):
            continue
        if not any(isinstance(n, ast.Name) and n.id == t for n in ast.walk(it.args[0])):
            continue
        for s in ast.walk(sub):
            if isinstance(s, ast.AugAssign):
                return True
            if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) \
                    and any(isinstance(n, ast.Name) and n.id == s.targets[0].id for n in ast.walk(s.value)):
                return True
    return False


# --------------------------------------------------------------------------- the shape of the loop


@dataclasses.dataclass
class Shape:
    t: str
    k: str
    B: cst.BaseExpression  # outer range(B)
    C: cst.BaseExpression  # inner range(t, C)
    acc: str
    disc: Optional[str]  # running discount name (None: a power c ** (k - t), or no discount)
    c: Optional[cst.BaseExpression]  # the invariant factor (None: 1, a plain sum)
    offset: int  # 1 when the discount is multiplied before it is used (terms c^(k-t+1) E)
    term: cst.BaseExpression  # E(k)
    temps: List[Tuple[str, cst.BaseExpression]]  # inner-loop temporaries, in order
    out: cst.BaseExpression  # the container the sums go to
    store: str  # "index": out[t] = acc; "append": out.append(acc)
    assigned: Set[str]  # every name the loop binds


def _smalls(stmts, where: str) -> List[cst.CSTNode]:
    """The statements of a block as one list (compound ones kept as they are)."""
    out: List[cst.CSTNode] = []
    for st in stmts:
        if isinstance(st, cst.SimpleStatementLine):
            for small in st.body:
                for kind, reason in _FORBIDDEN_SMALL.items():
                    if isinstance(small, kind):
                        raise Skip("quadratic loop: " + reason.replace("the loop body", where))
                if not isinstance(small, cst.Pass):
                    out.append(small)
        else:
            out.append(st)
    return out


def _truncation(st: cst.If) -> bool:
    """``if <cond>: break`` (an episode-truncated sum)."""
    body = _stmts(st.body)
    return st.orelse is None and len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine) \
        and len(body[0].body) == 1 and isinstance(body[0].body[0], cst.Break)


def _compound_reason(st: cst.CSTNode, where: str) -> str:
    if isinstance(st, cst.If):
        if where == "the inner loop" and _truncation(st):
            return (f"quadratic loop: `if {_one_line(st.test)}: break` ends each sum early (an "
                    "episode-truncated sum: no single recurrence over k; left as written)")
        return f"quadratic loop: conditional `if {_one_line(st.test)}:` in {where}"
    if isinstance(st, (cst.For, cst.While)):
        return f"quadratic loop: a further loop in {where}"
    name = type(st).__name__.lower()
    return f"quadratic loop: `{name}` block in {where}"


def _range_args(node: cst.CSTNode) -> Optional[List[cst.BaseExpression]]:
    if not _is_call(node, "range"):
        return None
    return [a.value for a in node.args]  # type: ignore[attr-defined]


def _factors(e: cst.BaseExpression) -> List[cst.BaseExpression]:
    """The factors of a product ``x * y * z`` (a single factor otherwise)."""
    if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, cst.Multiply):
        return _factors(e.left) + _factors(e.right)
    return [e]


def _product(fs: List[cst.BaseExpression]) -> cst.BaseExpression:
    out = fs[0]
    for f in fs[1:]:
        out = cst.BinaryOperation(left=out, operator=cst.Multiply(), right=f)
    return out


def _self_update(small: cst.CSTNode, op: type) -> Optional[Tuple[str, cst.BaseExpression]]:
    """(name, x) for ``name += x`` / ``name = name + x`` / ``name = x + name`` (op Add), or the same
    with ``*`` (op Multiply)."""
    aug = cst.AddAssign if op is cst.Add else cst.MultiplyAssign
    if isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name) and isinstance(small.operator, aug):
        return small.target.value, small.value
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
        name = small.targets[0].target.value
        v = small.value
        if isinstance(v, cst.BinaryOperation) and isinstance(v.operator, op) and not v.lpar:
            if isinstance(v.left, cst.Name) and v.left.value == name and name not in _names_read(v.right):
                return name, v.right
            if isinstance(v.right, cst.Name) and v.right.value == name and name not in _names_read(v.left):
                return name, v.left
    return None


def _reset(small: cst.CSTNode) -> Optional[Tuple[str, str]]:
    """(name, number) for ``name = <number>``."""
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
        v = small.value
        if isinstance(v, (cst.Integer, cst.Float)):
            return small.targets[0].target.value, _norm(v)
    return None


def analyse(node: cst.For, shadowed: Set[str]) -> Shape:
    """The shape of a quadratic sum loop; Skip (with the reason) for anything else."""
    if shadowed & set(BUILTINS):
        raise Skip(f"quadratic loop: the module rebinds `{sorted(shadowed & set(BUILTINS))[0]}`")
    if node.orelse is not None or node.asynchronous is not None:
        raise Skip("quadratic loop: the outer loop has an `else:` clause or is `async`")
    if not isinstance(node.target, cst.Name):
        raise Skip(f"quadratic loop: the outer loop binds `{_code(node.target).strip()}` (only a name is understood)")
    t = node.target.value
    args = _range_args(node.iter)
    if args is None or not (len(args) == 1 or (len(args) == 2 and _is_int(args[0], 0))):
        raise Skip(f"quadratic loop: the outer loop walks `{_one_line(node.iter)}` (only `range(T)` is understood)")
    B = args[-1]
    outer = _smalls(_stmts(node.body), "the outer loop")
    fors = [i for i, st in enumerate(outer) if isinstance(st, cst.For)]
    for st in outer:
        if isinstance(st, cst.BaseCompoundStatement) and not isinstance(st, cst.For):
            raise Skip(_compound_reason(st, "the outer loop"))
    if len(fors) != 1:
        raise Skip("quadratic loop: the outer loop holds several inner loops")
    inner: cst.For = outer[fors[0]]  # type: ignore[assignment]
    pre, post = outer[:fors[0]], outer[fors[0] + 1:]
    # ---- the inner header: for k in range(t, C)
    if inner.orelse is not None or inner.asynchronous is not None or not isinstance(inner.target, cst.Name):
        raise Skip("quadratic loop: the inner loop has an `else:` clause, is `async` or binds a tuple")
    k = inner.target.value
    iargs = _range_args(inner.iter)
    if iargs is None or len(iargs) != 2:
        raise Skip(f"quadratic loop: the inner loop walks `{_one_line(inner.iter)}` (only `range({t}, T)` is "
                   f"a sum over k >= {t})")
    if _norm(iargs[0]) != t:
        raise Skip(f"quadratic loop: the inner range starts at `{_one_line(iargs[0])}`, not at `{t}` (not a sum "
                   f"over k >= {t})")
    C = iargs[1]
    assigned = _bound_names(node.body) | {t}
    if _names_read(C) & assigned:
        which = sorted(_names_read(C) & assigned)[0]
        raise Skip(f"quadratic loop: the inner range's end `{_one_line(C)}` depends on `{which}` "
                   "(a horizon that moves with t is not one recurrence)")
    if _names_read(B) & assigned:
        raise Skip(f"quadratic loop: the outer range `{_one_line(B)}` is reassigned in the loop")
    for bound in (B, C):
        _check_bound(bound)
    # ---- the inner body: temporaries, one accumulation, at most one discount update
    body = _smalls(_stmts(inner.body), "the inner loop")
    for st in body:
        if isinstance(st, cst.BaseCompoundStatement):
            raise Skip(_compound_reason(st, "the inner loop"))
    acc_at: Optional[int] = None
    acc = ""
    inc: Optional[cst.BaseExpression] = None
    for i, st in enumerate(body):
        up = _self_update(st, cst.Add)
        if up is not None:
            if acc_at is not None:
                raise Skip(f"quadratic loop: two accumulations (`{acc}`, `{up[0]}`) in the inner loop")
            acc_at, (acc, inc) = i, up
    if acc_at is None or inc is None:
        raise Skip("quadratic loop: no `acc += ...` accumulation in the inner loop")
    # the increment: [discount factor] * E
    fs = _factors(inc)
    disc: Optional[str] = None
    c: Optional[cst.BaseExpression] = None
    power: Optional[cst.BaseExpression] = None
    disc_updates = {u[0] for u in (_self_update(st, cst.Multiply) for st in body) if u is not None}
    for f in fs:
        if isinstance(f, cst.Name) and f.value in disc_updates and f.value != acc:
            if disc is not None:
                raise Skip("quadratic loop: two running discounts in one term")
            disc = f.value
        elif isinstance(f, cst.BinaryOperation) and isinstance(f.operator, cst.Power) \
                and {k, t} <= _names_read(f.right):
            if _norm(f.right) != f"{k}-{t}":
                raise Skip(f"quadratic loop: the discount exponent is `{_one_line(f.right)}`, not `{k} - {t}`")
            if power is not None:
                raise Skip("quadratic loop: two discount powers in one term")
            power, c = f, f.left
    if disc is not None and power is not None:
        raise Skip("quadratic loop: both a running discount and a power in one term")
    rest = [f for f in fs if not (isinstance(f, cst.Name) and f.value == disc) and f is not power]
    if not rest:
        raise Skip("quadratic loop: the sum adds its discount alone")
    term = _product(rest) if len(rest) > 1 else rest[0]
    offset = 0
    disc_names = disc_updates - {acc}
    if disc is None and disc_names:
        raise Skip(f"quadratic loop: the running product `{sorted(disc_names)[0]}` is not a factor of "
                   f"what `{acc}` adds")
    # every other statement: the discount update or a temporary
    temps: List[Tuple[str, cst.BaseExpression]] = []
    seen_disc = False
    for i, st in enumerate(body):
        if i == acc_at:
            continue
        up = _self_update(st, cst.Multiply)
        if up is not None and up[0] == disc:
            if seen_disc:
                raise Skip(f"quadratic loop: `{disc}` is multiplied twice in one step")
            seen_disc = True
            c = up[1]
            offset = 1 if i < acc_at else 0
            continue
        if isinstance(st, cst.Assign) and len(st.targets) == 1 and isinstance(st.targets[0].target, cst.Name):
            name = st.targets[0].target.value
            if name in (acc, disc, k, t):
                raise Skip(f"quadratic loop: `{name}` is reassigned in the inner loop")
            if any(name == n for n, _ in temps):
                raise Skip(f"quadratic loop: `{name}` is assigned twice in the inner loop")
            temps.append((name, st.value))
            continue
        if isinstance(st, (cst.Assign, cst.AugAssign)):
            tg = st.targets[0].target if isinstance(st, cst.Assign) else st.target
            if isinstance(st, cst.Assign) and len(st.targets) > 1:
                raise Skip("quadratic loop: chained assignment in the inner loop")
            raise Skip(f"quadratic loop: the inner loop writes `{_one_line(tg)}` (only the sum, the discount "
                       "and temporaries are understood)")
        if isinstance(st, cst.Expr) and isinstance(st.value, cst.Call):
            raise Skip(f"quadratic loop: calls `{_one_line(st.value.func)}()` in the inner loop (unknown side effects)")
        raise Skip(f"quadratic loop: unsupported statement `{_one_line(st)}` in the inner loop")
    # ---- what the outer body does around the inner loop: resets before it, one store after it
    resets: Dict[str, str] = {}
    for st in pre:
        r = _reset(st)
        if r is None or r[0] not in (acc, disc):
            raise Skip(f"quadratic loop: `{_one_line(st)}` before the inner loop (only the resets "
                       f"`{acc} = 0`{f' and `{disc} = 1`' if disc else ''} are understood)")
        if r[0] in resets:
            raise Skip(f"quadratic loop: `{r[0]}` is reset twice")
        resets[r[0]] = r[1]
    if acc not in resets:
        raise Skip(f"quadratic loop: `{acc}` is not reset before the inner loop, so each sum carries "
                   "the previous ones (not one recurrence)")
    if resets[acc] not in _ZERO:
        raise Skip(f"quadratic loop: `{acc}` starts each sum at `{resets[acc]}`, not 0")
    if disc is not None:
        if disc not in resets:
            raise Skip(f"quadratic loop: the discount `{disc}` is not reset for each `{t}` (its powers "
                       "keep growing across sums: not one recurrence)")
        if resets[disc] not in _ONE:
            raise Skip(f"quadratic loop: the discount `{disc}` starts at `{resets[disc]}`, not 1")
    if len(post) != 1:
        raise Skip(f"quadratic loop: {'no' if not post else 'more than one'} statement after the inner loop "
                   f"(only storing `{acc}` is understood)")
    out, store = _store(post[0], t, acc)
    target = _norm(out)
    for bound in (B, C):
        if any(_pure_container(n) and _norm(n) == target for n in _walk(bound)):
            raise Skip(f"quadratic loop: the range bound `{_one_line(bound)}` reads `{_one_line(out)}`, which "
                       "the loop writes")
    # ---- dataflow of the inner body: temporaries computed before they are read, from k alone
    defined: Set[str] = set()
    temp_names = {n for n, _ in temps}
    for i, st in enumerate(body):
        if i == acc_at:
            reads = _names_read(inc)
        else:
            up = _self_update(st, cst.Multiply)
            if up is not None and up[0] == disc:
                reads = _names_read(up[1])
            else:
                reads = _names_read(st.value)  # type: ignore[attr-defined]
        carried = (reads & temp_names) - defined
        if carried:
            raise Skip(f"quadratic loop: `{sorted(carried)[0]}` is read before it is assigned in the inner "
                       "loop (a value carried from the previous k)")
        if isinstance(st, cst.Assign) and isinstance(st.targets[0].target, cst.Name):
            defined.add(st.targets[0].target.value)
    loop_state = {acc, t} | ({disc} if disc else set())
    for name, value in temps:
        bad = _names_read(value) & loop_state
        if bad:
            raise Skip(f"quadratic loop: the temporary `{name}` reads `{sorted(bad)[0]}` "
                       f"(the summed term must depend on `{k}` alone)")
    bad = _names_read(term) & loop_state
    if bad:
        which = sorted(bad)[0]
        what = "the outer index" if which == t else "the sum" if which == acc else "the discount"
        raise Skip(f"quadratic loop: the summed term `{_one_line(term)}` reads {what} `{which}` "
                   f"(only a term of `{k}` alone makes one recurrence)")
    if c is not None:
        bad = _names_read(c) & (assigned | {k})
        if bad:
            raise Skip(f"quadratic loop: the discount factor `{_one_line(c)}` changes with "
                       f"`{sorted(bad)[0]}` (only a loop-invariant factor makes one recurrence)")
    return Shape(t=t, k=k, B=B, C=C, acc=acc, disc=disc, c=c, offset=offset, term=term, temps=temps,
                 out=out, store=store, assigned=assigned)


def _check_bound(e: cst.BaseExpression) -> None:
    """A range bound evaluated once instead of once per step: side-effect-free reads only."""
    for n in _walk(e):
        if isinstance(n, cst.Call):
            f = n.func
            if _is_call(n, "len", 1) and _pure_container(n.args[0].value):
                continue
            if isinstance(f, cst.Attribute) and f.attr.value in ("size", "numel", "__len__") \
                    and _pure_container(f.value) and all(isinstance(a.value, cst.Integer) for a in n.args):
                continue
            raise Skip(f"quadratic loop: the range bound `{_one_line(e)}` calls `{_one_line(f)}()`")
        if isinstance(n, (cst.Lambda, cst.NamedExpr, cst.Await, cst.Yield)):
            raise Skip(f"quadratic loop: unsupported range bound `{_one_line(e)}`")


def _store(st: cst.CSTNode, t: str, acc: str) -> Tuple[cst.BaseExpression, str]:
    if isinstance(st, cst.Assign) and len(st.targets) == 1:
        tg = st.targets[0].target
        if isinstance(tg, cst.Subscript) and _pure_container(tg.value) and len(tg.slice) == 1 \
                and isinstance(tg.slice[0].slice, cst.Index) and _norm(tg.slice[0].slice.value) == t \
                and isinstance(st.value, cst.Name) and st.value.value == acc:
            return tg.value, "index"
    if isinstance(st, cst.Expr) and isinstance(st.value, cst.Call):
        call = st.value
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "append" and _pure_container(call.func.value) \
                and len(call.args) == 1 and not call.args[0].keyword and not call.args[0].star \
                and isinstance(call.args[0].value, cst.Name) and call.args[0].value.value == acc:
            return call.func.value, "append"
    raise Skip(f"quadratic loop: `{_one_line(st)}` after the inner loop (only `out[{t}] = {acc}` and "
               f"`out.append({acc})` are understood)")


# --------------------------------------------------------------------------- vectorizing E(k)


class SumGrammar(Grammar):
    """The recurrence grammar over the inner loop's body, widened by ``int(x[k])`` (a per-step
    mask) and without last-step conditional expressions."""

    def check(self, e: cst.BaseExpression) -> None:
        if _is_call(e, "int", 1):
            arg = e.args[0].value  # type: ignore[attr-defined]
            if not isinstance(arg, cst.Subscript) or self.reads.per_step(arg) is None:
                raise Skip(f"quadratic loop: `{_one_line(e)}` (int() only of a per-step read x[k])")
            self.check_subscript(arg)
            return
        if isinstance(e, cst.IfExp):
            raise Skip(f"quadratic loop: conditional expression `{_one_line(e)}`")
        super().check(e)


class SumRenderer(Renderer):
    """The recurrence's rendering (per-step reads as slices with the same operation grouping,
    invariants and their guard lists) over the whole inner range k = 0 .. T-1, with ``int(x[k])``
    as a mask array."""

    window = 0

    def __init__(self, reads: Reads, fresh, T: str, body_assigned: frozenset) -> None:
        super().__init__(reads, fresh, T, body_assigned=body_assigned)
        self.masks: Dict[str, int] = {}
        self.mask_names: Dict[str, str] = {}

    def label(self, cont: cst.BaseExpression) -> str:
        return _norm(cont).split(".")[-1]

    def stop(self, k: int) -> str:
        return self.T if k == 0 else f"{self.T} + {k}"

    def use_mask(self, cont: cst.BaseExpression, k: int) -> str:
        key = _norm(cont)
        if key not in self.mask_names:
            self.mask_names[key] = self.fresh(f"{key.split('.')[-1]}_m")
            self.seq_nodes.setdefault(key, cont)
        self.masks[key] = max(self.masks.get(key, 0), k)
        return f"{self.mask_names[key]}[{k}:{self.stop(k)}]"

    def render(self, e: cst.BaseExpression, env: Dict[str, str], shift: int = 0) -> str:
        ref = self.reads.per_step(e.args[0].value) if _is_call(e, "int", 1) else None  # type: ignore[attr-defined]
        if ref is not None:
            lp, rp = "(" * len(e.lpar), ")" * len(e.rpar)
            return lp + self.use_mask(ref[0], ref[1]) + rp
        return super().render(e, env, shift)


def _scalar_names(e: cst.BaseExpression) -> List[str]:
    """The invariants a coefficient reads (Python numbers or 0-d arrays, says the guard)."""
    out: List[str] = []
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, cst.Name):
            out.append(x.value)
        elif isinstance(x, (cst.Attribute, cst.Subscript)):
            out.append(_code(x).strip())
        elif isinstance(x, cst.BinaryOperation):
            stack += [x.right, x.left]
        elif isinstance(x, cst.UnaryOperation):
            stack.append(x.expression)
    return list(dict.fromkeys(out))


def plan(ctx: FileContext, shape: Shape, inner: cst.For, helpers: str, op: str) -> Tuple[str, List[str]]:
    """(guard, vectorized lines) for the outer steps t = 0 .. T-2."""
    header = Header("index", index=shape.k, T=shape.C, target=inner.target)
    reads = Reads(header, BodyParser(header), {}, frozenset({_norm(shape.out)}))
    assigned = frozenset(shape.assigned)
    g = SumGrammar(ctx, header, reads, assigned)
    for _, value in shape.temps:
        g.check(value)
    g.check(shape.term)
    p = SumRenderer(reads, lambda base: fresh(ctx.imports, base), "", assigned)
    if shape.c is not None:
        g.check(shape.c)
        if not p.invariant(shape.c, {}):
            raise Skip(f"quadratic loop: the discount factor `{_one_line(shape.c)}` is not loop-invariant")
    p.T = T = fresh(ctx.imports, "T")
    env: Dict[str, str] = {}
    lines: List[str] = []
    needed = _names_read(shape.term)
    for name, value in reversed(shape.temps):
        if name in needed:
            needed |= _names_read(value)
    for name, value in shape.temps:
        if name in needed:
            vname = p.fresh(f"{name}_v")
            lines.append(f"{vname} = {p.render(value, env)}")
            env[name] = vname
    b = p.render(shape.term, env)
    if not p.vec_names:
        raise Skip("quadratic loop: the summed term reads no per-step float input")
    if shape.c is None:
        a = "1"
    else:
        a = f"({p.render(shape.c, {})})"
        for name in _scalar_names(shape.c):
            p.scalars[name] = None
    if shape.offset:
        b = f"{a} * ({b})"
    acc = shape.acc
    bname, seq = p.fresh(f"{acc}_b"), p.fresh(f"{acc}_seq")
    lines.append(f"{bname} = {b}")
    lines.append(f"{seq} = {op}({a}, {bname})")
    out = _code(shape.out).strip()
    if shape.store == "index":
        lines.append(f"{out}[0:{T} - 1] = {helpers}.to_rank({seq}[0:{T} - 1], {out})")
    else:
        src = _code(p.seq_nodes[next(iter(p.vec_names))]).strip()
        lines.append(f"{out}.extend({helpers}.items_of({seq}[0:{T} - 1], {src}))")
    first = next(iter(p.vec_names.values()))
    binds = [f"{p.vec_names[key]} = {helpers}.seq_of({_code(p.seq_nodes[key]).strip()})" for key in p.vec_names]
    binds += [f"{p.mask_names[key]} = {helpers}.int_of({_code(p.seq_nodes[key]).strip()}, {first})"
              for key in p.mask_names]
    # the guard
    B, C = _code_line(shape.B), _code_line(shape.C)  # code: string literals as written
    head = f"({T} := {helpers}.steps({B})) >= 2"
    if _norm(shape.B) != _norm(shape.C):
        head += f" and {helpers}.steps({C}) == {T}"

    def pairs(d: Dict[str, int]) -> str:
        inner_ = ", ".join(f"({_code(p.seq_nodes[key]).strip()}, {v})" for key, v in d.items())
        return f"({inner_},)"

    args = [T, f"seqs={pairs(p.seqs)}"]
    if p.masks:
        args.append(f"masks={pairs(p.masks)}")
    consts = [x for x in p.consts if x not in p.scalars]
    if consts:
        args.append(f"consts=({', '.join(consts)},)")
    if p.scalars:
        args.append(f"scalars=({', '.join(p.scalars)},)")
    args.append(f"{'outs' if shape.store == 'index' else 'lists'}=({out},)")
    if p.divides:
        args.append("divides=True")
    guard = f"{head} and {helpers}.quadratic_ok({', '.join(args)})"
    return guard, binds + lines


TOLERANCE = ("reassociated: each sum is re-ordered, |difference| <= (4n+2)·u·Σ_j |c^j·E(t+j)| for n terms "
             "(u = 6e-8 in float32, 1.1e-16 in float64; typically about √n·u·Σ), plus one rounding where "
             "the output is narrower than the sum")


def rewrite_loop(ctx: FileContext, node: cst.For, shadowed: Set[str], reassociate: bool,
                 helpers_qualname: str, op_qualname: str) -> Tuple[cst.If, str]:
    """The guarded rewrite of one quadratic sum loop and its reason; Skip otherwise."""
    shape = analyse(node, shadowed)
    if not reassociate:
        raise Skip("quadratic loop: the sums over k >= t would be re-ordered (reassociation is off: "
                   "[vectorize.recurrence] reassociate = false)")
    inner = next(st for st in _stmts(node.body) if isinstance(st, cst.For))
    try:
        guard, lines = plan(ctx, shape, inner, "__SBX__", "__SBX_OP__")
    except Skip as exc:  # the recurrence grammar's own reasons
        text = str(exc).replace("in the loop body", "in the inner loop")
        raise Skip(text if text.startswith("quadratic loop") else "quadratic loop: " + text) from None
    helpers = ctx.runtime_name(helpers_qualname, "_sbx")
    op = ctx.runtime_name(op_qualname, "_linear_recurrence")

    def sub(text: str) -> str:
        return text.replace("__SBX_OP__", op).replace("__SBX__", helpers)

    T = guard[1:guard.index(" :=")]
    text = f"if {sub(guard)}:\n    pass\n"
    text += f"# {shape.t} = 0 .. {T} - 2: the sums over {shape.k} >= {shape.t} as one backward recurrence\n"
    text += "".join(sub(x) + "\n" for x in lines)
    text += f"# {shape.t} = {T} - 1, as written\n{shape.t} = {T} - 1\n"
    parsed = parse_statements(text)
    head_if = parsed[0]
    assert isinstance(head_if, cst.If)  # the text starts with `if ...:`
    stmts = parsed[1:] + [clone(s) for s in _stmts(node.body)]
    new = cst.If(
        test=head_if.test,
        body=cst.IndentedBlock(body=stmts),
        orelse=cst.Else(body=cst.IndentedBlock(body=[node.with_changes(leading_lines=())])),
        leading_lines=node.leading_lines,
    )
    if shape.disc is not None:
        form = f"running discount `{shape.disc}`" + (", multiplied before use" if shape.offset else "")
    elif shape.c is not None:
        form = f"`{_one_line(shape.c)} ** ({shape.k} - {shape.t})`"
    else:
        form = "undiscounted"
    c = f"c = `{_one_line(shape.c)}`" if shape.c is not None else "c = 1"
    power = f"c^({shape.k}-{shape.t}+1)" if shape.offset else f"c^({shape.k}-{shape.t})"
    # the whole error bound (TOLERANCE) goes to the site's details
    reason = (f"quadratic loop: `{shape.acc}` = sum over {shape.k} >= {shape.t} of {power}·E({shape.k}), {c} "
              f"({form}) as s = {'c·E' if shape.offset else 'E'} + c·s by linear_recurrence (reassociated, "
              "|difference| <= (4n+2)·u·Σ_j |c^j·E(t+j)|); last outer step as written; guarded by quadratic_ok")
    return new, reason
