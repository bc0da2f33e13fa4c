"""The dataflow between steps of the middle steps t = T-2 .. 1: which names are carried
recurrences, which are per-step values shifted into the next step, which are reset at an episode
end; or Skip with the reason the loop is left alone. Functions of the analysis's items and its
grammar, returning a frozen :class:`Dataflow` the plan reads.
"""
from __future__ import annotations

import dataclasses
import types
from typing import Dict, List, Mapping, Set, Tuple

import libcst as cst

from .syntax import _code, _names_read, _norm, Skip
from .body import AnyItem, _flatten, Item
from .grammar import Grammar


@dataclasses.dataclass(frozen=True)
class Dataflow:
    """What each name the middle steps assign is: ``rec_vars`` the carried recurrences, in the
    order the step reads them; ``shift`` the per-step values the next step reads (name -> its
    assignment); ``resets`` the episode resets (name -> the reset item); ``assign_of`` every
    name's one assignment in a step."""
    assign_of: Mapping[str, AnyItem]
    rec_vars: Tuple[str, ...]
    shift: Mapping[str, AnyItem]
    resets: Mapping[str, AnyItem]


def carried_copies(items: List[Item], middle: List[Item]) -> List[Item]:
    """``gae = delta + c * last_gae``, ..., ``last_gae = gae`` (the carried value kept in a copy,
    as LLM fine-tuning code writes GAE): in the middle steps ``last_gae`` already equals ``gae``
    when a step starts, so the update is ``last_gae = delta + c * last_gae`` where ``gae`` was
    assigned, ``gae = last_gae`` right after it, and the copy at the end has nothing to do.
    Taken when the copy is the step's only assignment to ``last_gae``, at the top level, and
    between the update and the copy nothing assigns either name or reads ``last_gae``. The peeled
    steps run the statements as written (the first one is where ``gae`` gets its first value)."""
    out = list(middle)
    top = {id(it) for it in items}  # both run in every step, the peeled first one included
    for k, cp in enumerate(middle):
        if cp.kind != "assign" or cp.var is None or cp.outs or not isinstance(cp.value, cst.Name) \
                or cp.first or cp.guarded or id(cp) not in top:
            continue
        L, X = cp.var, cp.value.value
        if L == X or any(it.var == L for it in middle if it is not cp):
            continue
        src = next((j for j in range(k - 1, -1, -1) if middle[j].var == X), None)
        if src is None:
            continue
        up = middle[src]
        if up.kind != "assign" or up.value is None or L not in _names_read(up.value) or up.first \
                or up.guarded or id(up) not in top:
            continue
        between = middle[src + 1:k]
        if any(x.var in (L, X) or L in _names_read(x.value if x.value is not None else x.cond)  # type: ignore[arg-type]
               for x in between):
            continue
        i = out.index(up)
        out[i:i + 1] = [Item("assign", node=up.node, var=L, value=up.value, shown=up.value),
                        Item("assign", node=up.node, var=X, outs=up.outs, value=cst.Name(L))]
        out.remove(cp)
    return out


def dataflow(items: List[Item], middle: List[Item], grammar: Grammar, all_items: List[Item]) -> Dataflow:
    """The middle steps' names sorted into recurrences, shifted values and resets (see
    :class:`Dataflow`); Skip where a value flows between steps otherwise."""
    # the branches of last-step conditional expressions run in the peeled first step, after the
    # guard: they must not undo what it checked (the grammar's rules hold for them too)
    for it in all_items:
        for expr in it.first:
            grammar.check(expr)
    body_assigned = grammar.body_assigned
    # each write into a list / deque becomes one extend of the whole block: two writes into the
    # same container per step would come out grouped by write, not interleaved by step
    seen: Set[str] = set()
    for it in middle:
        if it.container is not None:
            key = _norm(it.container)
            if key in seen:
                raise Skip(f"writes into `{_code(it.container).strip()}` twice per step "
                           "(one extend per write would reorder its items)")
            seen.add(key)
    defined: Set[str] = set()
    assign_of: Dict[str, Item] = {}
    pre_reads: Dict[str, List[Item]] = {}
    resets: Dict[str, Item] = {}
    for it in middle:
        if it.kind == "reset":
            if it.var in resets:
                raise Skip(f"`{it.var}` is reset twice in one step")
            if it.var in defined:
                raise Skip(f"`{it.var}` is reset after it was assigned in the same step")
            resets[it.var] = it  # type: ignore[index]
            reads = _names_read(it.cond) & body_assigned  # type: ignore[arg-type]
        else:
            reads = _names_read(it.value) & body_assigned  # type: ignore[arg-type]
        for n in reads:
            if n not in defined:
                pre_reads.setdefault(n, []).append(it)
        if it.kind == "assign" and it.var is not None:
            if it.var in assign_of:
                raise Skip(f"`{it.var}` is assigned twice in one step")
            assign_of[it.var] = it
            defined.add(it.var)
    shift: Dict[str, Item] = {}
    rec_vars: List[str] = []
    for n, readers in pre_reads.items():
        own = assign_of.get(n)
        if own is None:
            raise Skip(f"`{n}` keeps its value from an earlier step (it is not assigned on every path)")
        if own in readers:
            others = [r for r in readers if r is not own]
            if others:
                raise Skip(f"the carried value `{n}` is read before its update, outside the update")
            rec_vars.append(n)
        else:
            if not _shiftable(own, grammar):
                raise Skip(f"`{n}` carries a value from the previous step that is not a plain per-step read")
            _same_in_first_step(items, n, own)
            shift[n] = own
    for n in resets:
        if n not in rec_vars:
            raise Skip(f"`{n}` is reset but it is not a carried recurrence")
    if not rec_vars:
        raise Skip("no value in the loop depends on its own previous value")
    if resets and any(it.kind == "split" for it in items):
        raise Skip("an episode reset together with the last-step special case")
    _switch_rules(middle, assign_of, resets, rec_vars)
    # post-update reads of a carried value: allowed; pre-update ones were refused above.
    # values read in the middle steps must be computed from per-step reads and invariants
    for it in middle:
        if it.kind == "reset":
            grammar.check_cond(it.cond)  # type: ignore[arg-type]
    return Dataflow(types.MappingProxyType(assign_of), tuple(rec_vars), types.MappingProxyType(shift),
                    types.MappingProxyType(resets))


def _switch_rules(middle: List[Item], assign_of: Dict[str, Item], resets: Dict[str, Item],
                  rec_vars: List[str]) -> None:
    """``if done: gae = 0; ret = 0 else: gae = delta + c * gae; ret = r + g * ret`` (either way
    round): an episode end stores the constants instead of updating, which the op does as the
    recurrence reset one step below with the constant stored at the reset step
    (runtime.vectorized.switch_linear_recurrence). That holds when each value reset there is
    updated in the other branch and nothing else is: a carried value updated only there would
    keep its value at a reset, a temporary computed only there would too (read later in the
    step or after the loop), and a write there would happen only on some steps. The
    reset step's constant itself would land in a list (a Python int where the op gives array
    elements): loops that write lists are left alone."""
    switched = {n for n, r in resets.items() if r.switch}
    if not switched:
        return
    if any(it.container is not None for it in middle):
        raise Skip("an episode reset as an if/else in a loop that writes a list (at an episode end the "
                   "list would get the constant itself)")
    for n in switched:
        own = assign_of.get(n)
        if own is None or not own.guarded:
            raise Skip(f"`{n}` is reset in an if/else but updated outside it")
    for it in middle:
        if not it.guarded:
            continue
        if it.kind != "assign" or it.var is None or it.outs:
            text = _code(it.node).strip()  # type: ignore[arg-type]
            raise Skip(f"`{text}` runs only on steps that do not end an episode "
                       "(only assignments to names are understood there)")
        if it.var in rec_vars and it.var not in switched:
            raise Skip(f"`{it.var}` is updated only on steps that do not end an episode, not reset on the others")
        if it.var not in rec_vars:  # at an episode end it keeps an older step's value, in the loop
            raise Skip(f"`{it.var}` is computed only on steps that do not end an episode (the others "
                       "keep an older value)")  # and after it: the vectorized steps do not compute that


def _same_in_first_step(items: List[Item], n: str, own: Item) -> None:
    """A value carried into the next step is computed for step t = T-2 from the other steps'
    formula at t + 1 = T-1; the peeled step T-1 must have assigned it that way too (not in a
    last-step branch of its own, ``prev = 0.0 if t == T - 1 else values[t]``). Where the step
    assigns it more than once (``last_value = last_value * mask; ...; last_value = values[t]``),
    the last assignment is the one carried."""
    first = [x for x in _flatten(items, False) if x.kind == "assign" and x.var == n]
    if first and not first[-1].first and not own.first and (
            first[-1] is own or _norm(first[-1].value) == _norm(own.value)):  # type: ignore[arg-type]
        return
    raise Skip(f"`{n}` carries into the next step a value the last-step case t = T-1 computes "
               "otherwise than the other steps")


def _shiftable(it: Item, grammar: Grammar) -> bool:
    if it.outs or it.value is None:
        return False
    if grammar.reads.reads_written(it.value):
        return False  # what this step stored, carried into the next one
    return not (_names_read(it.value) & grammar.body_assigned)
