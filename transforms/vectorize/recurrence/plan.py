"""The plan stage: a frozen :class:`~.analysis.Analysis` in, a frozen :class:`Plan` out -- the
middle steps' lines and the run-time guard (``recurrence_ok``, ``carry_ok``) that selects them,
as text with placeholder names for the runtime (:mod:`.build` parses them into the rewritten
statement). Or Skip, where an update is not affine in its carried value.

Why a stage: the rendering accumulates what it used (per-step inputs, invariants, flags) while it
writes the lines, and the guard must check exactly those; building both here, in one pass over
the middle steps, and handing on only the frozen result keeps the guard and the lines in step.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ...base import FileContext
from .syntax import _code, _names_read, _norm, fresh, spells
from .analysis import Analysis
from .affine import recurrence
from .render import Renderer, Tables
from . import conds, fold, lists

#: the first row the outputs of the vectorized steps are stored from: 1, or 0 where the last step
#: is folded in (filled in once the emitted slices are known to allow it)
_LO = "__SBX_LO__"


@dataclasses.dataclass(frozen=True)
class Plan:
    """The vectorized branch of one loop. ``guard`` is the whole test (``guard_head``, the trip
    count and views, ``and`` ``guard_ok``, the ``recurrence_ok`` call, and any further clause),
    ``lines`` the middle steps (bindings first), ``carry`` the ``carry_ok`` check of the carried
    values after the first step (None where every carried value lives in memory), ``notes`` each
    recurrence's pattern for the reason; ``folded``: the last step runs vectorized too."""
    T: str
    guard: str
    guard_head: str
    guard_ok: str
    lines: Tuple[str, ...]
    exact: bool
    notes: Tuple[str, ...]
    folded: bool
    carry: Optional[str]
    cpu: bool
    tables: Tables


def plan(ctx: FileContext, a: Analysis, *, fold_last: bool, reassociate: bool, cpu: bool,
         helpers: str, op: str) -> Plan:
    """The stage's entry point (see module docstring); ``fold_last``: the last step may run
    vectorized (:mod:`.fold`), ``cpu``: the guard keeps tensors on CPU, where the op is bitwise
    exact. Fresh names (``T``, the arrays) are reserved in ``ctx`` in the order they are emitted."""
    T = fresh(ctx.imports, "T")
    r = Renderer(a.reads, lambda base: fresh(ctx.imports, base), T, body_assigned=a.body_assigned,
                 shift=a.flow.shift, forwarded=a.forwarded)
    mid, exact, notes, weak_ok = _middle(ctx, a, r, helpers, op, reassociate)
    # bindings of the per-step containers, first (several: rows aligned to one rank, see seqs_of)
    if len(r.vec_names) > 1:
        binds = [f"{', '.join(r.vec_names.values())} = {helpers}.seqs_of("
                 f"{', '.join(_code(r.seq_nodes[k]).strip() for k in r.vec_names)})"]
    else:
        binds = [f"{r.vec_names[k]} = {helpers}.seq_of({_code(r.seq_nodes[k]).strip()})" for k in r.vec_names]
    binds += [f"{r.cond_names[k]} = {helpers}.truth_of({_code(r.seq_nodes[k]).strip()}{r.cond_tests.get(k, '')})"
              for k in r.cond_names]
    mid = binds + mid
    # the last step t = 0 folded in (build asks, see fold): every slice starts one row earlier
    wide = fold.widen(mid, list(r.vec_names.values()) + list(r.cond_names.values())) if fold_last else None
    folded = wide is not None
    mid = [x.replace(_LO, "0" if folded else "1") for x in (wide if folded else mid)]  # type: ignore[union-attr]
    tables = r.tables()
    head, ok = _guard(a, tables, T, helpers, cpu, weak_ok)
    # the list read-backs' part: bind fresh carried values, keep written containers apart
    guard = f"{head} and {ok}" + lists.written_apart(
        helpers, _written_codes(a), lists.invariant_containers(tables.consts, tables.scalars))
    return Plan(T=T, guard=guard, guard_head=head, guard_ok=ok,
                lines=tuple(lists.bind_lines(a.lists, a.flow.rec_vars) + mid), exact=exact,
                notes=tuple(lists.noted(notes, a.lists)), folded=folded,
                carry=lists.carry_text(_carry_check(a, tables, helpers), a.lists), cpu=cpu, tables=tables)


def _middle(ctx: FileContext, a: Analysis, r: Renderer, helpers: str, op: str,
            reassociate: bool) -> Tuple[List[str], bool, List[str], bool]:
    """(middle lines, exact, notes, weak_ok): each item of the middle steps over all of them.
    ``weak_ok``: lists of Python numbers next to arrays may be vectorized (no list item is made of
    per-step values alone)."""
    T = r.T
    flow = a.flow
    env: Dict[str, str] = {}
    needed = _needed(a)
    mid: List[str] = []
    exact = True
    weak_ok = True
    notes: List[str] = []
    done_vars: Set[str] = set()
    derived: Set[str] = set()  # arrays computed from a carried value (their items follow its type)

    def from_carried(text: str) -> bool:
        return any(spells(text, n) for n in derived)

    for it in a.middle:
        if it.kind == "reset":
            continue
        if it.kind == "assign" and it.var in flow.rec_vars:
            rec = recurrence(r, a, it, env, reassociate)
            exact = exact and rec.exact
            notes.append(rec.pattern)
            s = rec.var
            seq, last = r.fresh(f"{s}_seq"), r.fresh(f"{s}_last")
            b = rec.b
            if not re.fullmatch(r"[A-Za-z_]\w*", b):
                bname = r.fresh(f"{s}_b")
                mid.append(f"{bname} = {b}")
                b = bname
            if s in a.memo:  # the value the previous step stored, read back as the loop does
                mid.append(f"{s} = {_code(a.memo[s]).strip()}[{T} - 1]")
            init = f"{helpers}.as_row({s}, {b})"
            if rec.reset is not None:
                cond = rec.reset.cond
                neg = isinstance(cond, cst.UnaryOperation) and isinstance(cond.operator, cst.Not)
                base, test, number = conds.split_cond(cond.expression if neg else cond)  # type: ignore[union-attr, arg-type]
                ref = a.reads.per_step(base)
                assert ref is not None
                mask = r.use_cond(ref[0], ref[1], test, number)
                if neg:
                    mask = f"~{mask}"
                r.consts[s] = None  # the value before the loop meets the same dtype rules
                kind = "switch" if rec.reset.switch else "reset"  # if done: s = 0 else: s = f(s)
                mid.append(f"{seq}, {last} = {helpers}.{kind}_linear_recurrence("
                           f"{rec.a}, {b}, {mask}, {rec.reset.const}, init={init}, return_last=True)")
            else:
                mid.append(f"{seq}, {last} = {op}({rec.a}, {b}, init={init}, return_last=True)")
            if s not in a.memo:
                mid.append(f"{s} = {helpers}.restore({last}, {s})")
            env[s] = seq
            r.step_names.add(seq)
            done_vars.add(s)
            derived.add(seq)
            value_vec: Optional[str] = seq
        elif it.kind == "assign" and it.var in flow.shift:
            value_vec = None
        elif it.kind == "assign" and it.var is not None:
            if it.var in needed or it.outs:
                vname = r.fresh(f"{it.var}_v")
                text = r.render(it.value, env)  # type: ignore[arg-type]
                mid.append(f"{vname} = {text}")
                env[it.var] = vname
                if r.has_step(text):
                    r.step_names.add(vname)
                if from_carried(text):
                    derived.add(vname)
                value_vec = vname
            else:
                value_vec = None
        else:
            value_vec = None
        if it.kind == "assign":
            for o in it.outs:
                vec = value_vec if value_vec is not None else r.render(it.value, env)  # type: ignore[arg-type]
                oc = _code(o).strip()
                if r.has_step(vec):  # time-first: rows aligned to out's rows
                    vec = f"{helpers}.to_rank({vec}, {oc})"
                mid.append(f"{oc}[{_LO}:{T} - 1] {it.accum or '='} {vec}")
        elif it.kind in ("append", "insert", "appendleft"):
            vec = r.render(it.value, env)  # type: ignore[arg-type]
            if not from_carried(vec):  # an item made of per-step values alone: Python numbers in
                weak_ok = False  # the loop when those are, array items once they are arrays
            like = vec if (isinstance(it.value, cst.Name) and it.value.value in done_vars) else None
            src = _src_container(a, r)
            srcs = ""
            if len(r.vec_names) > 1:  # one of them may be a list of done flags next to arrays
                srcs = f", srcs=({', '.join(_code(r.seq_nodes[k]).strip() for k in r.vec_names)},)"
            items = f"{helpers}.items_of({vec}, {src}" + (f", like={it.value.value}" if like else "") + srcs + ")"  # type: ignore[union-attr]
            if it.wrap:
                items = f"{helpers}.wrapped({items})"
            cont = _code(it.container).strip()  # type: ignore[arg-type]
            if it.kind == "append":
                mid.append(f"{cont}.extend({items}[::-1])")
            elif it.kind == "appendleft":  # a series of appendleft, last step's value leftmost
                mid.append(f"{cont}.extendleft({items}[::-1])")
            else:
                mid.append(f"{cont}[0:0] = {items}")
    return mid, exact, notes, weak_ok


def _src_container(a: Analysis, r: Renderer) -> str:
    """A per-step container the loop reads (tells the helpers lists of floats from arrays)."""
    h = a.header
    key = next(iter(r.vec_names)) if r.vec_names else _norm(h.elements[0][1]) if h.elements else None
    if key is None:  # pragma: no cover - a recurrence always reads a per-step value
        return "None"
    node = r.seq_nodes.get(key)
    return _code(node).strip() if node is not None else key


def _needed(a: Analysis) -> Set[str]:
    """Temporaries the middle steps must compute (read by an update, an output or another)."""
    need: Set[str] = set()
    for it in reversed(a.middle):
        if it.kind == "reset":
            continue
        if it.kind == "assign" and it.var is not None and it.var not in a.flow.rec_vars \
                and it.var not in need and not it.outs:
            continue
        need |= _names_read(it.value) & a.body_assigned  # type: ignore[arg-type]
    return need


def _carry_check(a: Analysis, tables: Tables, helpers: str) -> Optional[str]:
    """The check of the carried values after the first step (see runtime carry_ok), None when
    every carried value lives in memory (checked by the guard as ``memo``)."""
    carried = [s for s in a.flow.rec_vars if s not in a.memo]
    if not carried:
        return None
    seqs = ", ".join(_code(tables.seq_nodes[k]).strip() for k in tables.seqs)
    return f"{helpers}.carry_ok(({', '.join(carried)},), ({seqs},))"


def _written_codes(a: Analysis) -> List[str]:
    out: Dict[str, None] = {}
    for it in a.middle:
        for o in it.outs:
            out[_code(o).strip()] = None
        if it.container is not None:
            out[_code(it.container).strip()] = None
    for m in a.memo.values():
        out[_code(m).strip()] = None
    return list(out)


def _guard(a: Analysis, t: Tables, T: str, helpers: str, cpu: bool, weak_ok: bool) -> Tuple[str, str]:
    """(head, ok): the trip count and the views bound, and the ``recurrence_ok`` call."""
    h = a.header
    if h.named is not None:  # the list the loop walks, checked to be T - 1, ..., 0
        head = f"({T} := {helpers}.backward_steps({h.named.value})) >= 2"
        if _names_read(h.T) & _names_read(a.node.body):  # type: ignore[arg-type]
            head += f" and {helpers}.steps({_code(h.T).strip()}) == {T}"  # type: ignore[arg-type]
    elif h.kind == "index":
        head = f"({T} := {helpers}.steps({_code(h.T).strip()})) >= 2"  # type: ignore[arg-type]
    else:
        conts = ", ".join(_code(c).strip() for _, c in h.elements)
        head = f"({T} := {helpers}.length({conts})) >= 2"
    for view in a.views:  # time indexed in the middle: time-major views, None if none (views.View)
        head += f" and ({view.name} := {view.call(helpers)}) is not None"
    args: List[str] = [T]

    def pairs(d) -> str:
        inner = ", ".join(f"({_code(t.seq_nodes[k]).strip()}, {max(0, v - 1)})" for k, v in d.items())
        return f"({inner},)" if inner else "()"

    if t.seqs:
        args.append(f"seqs={pairs(t.seqs)}")
    if t.conds:
        args.append(f"conds={pairs(t.conds)}")
    consts = [c for c in t.consts if c not in t.scalars]
    if consts:
        args.append(f"consts=({', '.join(consts)},)")
    if t.scalars:
        args.append(f"scalars=({', '.join(t.scalars)},)")
    outs: List[str] = []
    lists_: List[str] = []
    deques: List[str] = []
    for it in a.middle:
        for o in it.outs:
            outs.append(_code(o).strip())
        if it.container is not None:
            (deques if it.kind == "appendleft" else lists_).append(_code(it.container).strip())
    memo = [_code(x).strip() for x in a.memo.values()]
    outs = [o for o in outs if o not in memo]
    if outs:
        args.append(f"outs=({', '.join(dict.fromkeys(outs))},)")
    if memo:
        args.append(f"memo=({', '.join(memo)},)")
    if t.fwd_reads:
        args.append(f"reads=({', '.join(f'({k}, {v})' for k, v in t.fwd_reads.items())},)")
    if a.cells:
        args.append(f"cells=({', '.join(dict.fromkeys(_code(c).strip() for c in a.cells))},)")
    if len(t.vec_names) > 1:
        args.append("aligned=True")
    if lists_:
        args.append(f"lists=({', '.join(dict.fromkeys(lists_))},)")
    if deques:
        args.append(f"deques=({', '.join(dict.fromkeys(deques))},)")
    if h.sliced:
        args.append("sliced=True")
    if any(it.kind in ("insert", "appendleft") for it in a.middle):
        args.append("front=True")  # lists of floats pay only here: the loop's insert(0) is quadratic
    if t.divides:
        args.append("divides=True")
    if cpu:
        args.append("cpu=True")
    if not weak_ok:
        args.append("weak=False")
    return head, f"{helpers}.recurrence_ok({', '.join(args)})"
