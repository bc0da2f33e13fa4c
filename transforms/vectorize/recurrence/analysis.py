"""The analysis stage: one candidate loop and its :class:`~.headers.Header` in, a frozen
:class:`Analysis` out (or Skip with the reason the loop is left alone).

Why a stage of its own: the body's items are rewritten here (a value read back from memory or a
list becomes a carried name, chained updates merge) and nowhere after, so what the plan and the
emitted code read is fixed once this returns. The builder below keeps its working state while it
runs; what leaves it is frozen (tuples, read-only mappings). Read-backs and recurrences through
memory are here; the grammar is :mod:`.grammar`, the dataflow between steps :mod:`.dataflow`,
read-backs from a list :mod:`.lists`.
"""
from __future__ import annotations

import dataclasses
import types
from typing import Dict, List, Mapping, Set, Tuple

import libcst as cst

from ...analysis.cstclone import parse_expression
from ...base import FileContext
from .syntax import (
    Skip,
    _bound_names,
    _code,
    _head,
    _names_read,
    _norm,
    _one_line,
    _paren,
    _pure_container,
    _stmts,
    _subst,
    _of_type,
    _walk,
    fresh,
)
from .headers import Header
from .body import AnyItem, BodyParser, FrozenItem, Item, _flatten, freeze
from .reads import Reads
from .grammar import Grammar
from .dataflow import Dataflow, carried_copies, dataflow
from .lists import ListCarry, _all_items, _exprs, list_readbacks
from . import conds


@dataclasses.dataclass(frozen=True)
class Analysis:
    """One loop as the plan reads it. ``node`` is the loop analysed (time-major views applied,
    :mod:`.views`), ``items`` its body's updates (both cases of a last-step split), ``middle``
    the middle steps' straight-line updates (merged, renamed). ``memo``: carried values kept in
    an output (name -> ``out``) with ``memo_src`` the statement each came from; ``dropped`` the
    items the middle steps do without, ``readbacks`` those re-run at t = 1 (``s = out[t, 0]``),
    ``cells`` the outputs whose rows must hold one element; ``forwarded``: reads of this step's
    own output (id of the read -> (container code, column indices))."""
    node: cst.For
    header: Header
    views: tuple
    reads: Reads
    items: Tuple[FrozenItem, ...]
    middle: Tuple[FrozenItem, ...]
    body_assigned: frozenset
    memo: Mapping[str, cst.BaseExpression]
    memo_src: Mapping[str, str]
    lists: ListCarry
    dropped: Tuple[FrozenItem, ...]
    readbacks: Tuple[FrozenItem, ...]
    cells: Tuple[cst.BaseExpression, ...]
    forwarded: Mapping[int, Tuple[str, Tuple[str, ...]]]
    flow: Dataflow

    @property
    def has_split(self) -> bool:
        """The body has a last-step special case (``if t == T - 1: ... else: ...``)."""
        return any(it.kind == "split" for it in self.items)


def analyse(ctx: FileContext, node: cst.For, header: Header, views=()) -> Analysis:
    """The stage's entry point: ``node`` (a backward loop ``header`` describes) analysed, or Skip.
    Fresh names it binds (``out_next``, ``s_0``, ``L_last``) are reserved in ``ctx``."""
    return _Analyser(ctx, node, header, tuple(views)).run()


class _Analyser:
    """The stage's builder: its working items and tables, frozen into :class:`Analysis` at the end."""

    def __init__(self, ctx: FileContext, node: cst.For, header: Header, views: tuple) -> None:
        self.ctx, self.node, self.h, self.views = ctx, node, header, views
        self.parser = BodyParser(header)
        self.elements = {name: cont for name, cont in header.elements}
        self.dropped: Dict[int, Item] = {}  # `tmp = out[t + 1]` items the middle steps do without
        self.readback_items: List[Item] = []  # `s = out[t, 0]`: re-run at t = 1 for the last step
        self.read_back_by: Dict[int, List[Item]] = {}  # id of the update -> its read-back items
        self.cells: List[cst.BaseExpression] = []
        self.forwarded: Dict[int, Tuple[str, Tuple[str, ...]]] = {}
        self.memo: Dict[str, cst.BaseExpression] = {}  # carried value kept in out[t+1]: its name -> out
        self.memo_src: Dict[str, str] = {}

    def fresh(self, base: str) -> str:
        return fresh(self.ctx.imports, base)

    def grammar(self) -> Grammar:
        """The grammar over the names the body binds so far (the analysis adds carried names)."""
        return Grammar(self.ctx, self.h, self.reads, frozenset(self.body_assigned))

    def run(self) -> Analysis:
        node, h = self.node, self.h
        if node.orelse is not None:
            raise Skip("the loop has an `else:` clause")
        if node.asynchronous is not None:
            raise Skip("`async for` loop")
        self.items = self.parser.block(_stmts(node.body))
        if h.unpacked:
            names = ", ".join(n for n, _ in h.elements)
            raise Skip(f"unpacks each element of `{_code(node.iter).strip()}` into `{names}` "
                       "(per-step tuples are not vectorized)")
        self.body_assigned: Set[str] = _bound_names(node.body)
        if h.index in self.body_assigned or any(n in self.body_assigned for n in self.elements):
            raise Skip("the loop assigns its own loop variable")
        if h.counter is not None and (h.counter in self.body_assigned or h.counter in _names_read(node.body)):
            raise Skip(f"reads the enumerate counter `{h.counter}`, which counts up while the sequences walk "
                       "backward (only a counter the body does not use is understood)")
        bound_by = _names_read(h.T) if h.T is not None else set()
        if h.named is not None:
            bound_by.add(h.named.value)
        for _, cont in h.elements:
            bound_by |= _names_read(cont)
        if bound_by & self.body_assigned:
            raise Skip("the loop bound / sequence is reassigned in the body")
        # containers written by the loop (out[t] = ..., lst.append / insert)
        written: Set[str] = set()
        for it in _flatten(self.items, True) + _flatten(self.items, False):
            for o in it.outs:
                written.add(_norm(o))
            if it.container is not None:
                written.add(_norm(it.container))
        for name, cont in h.elements:
            if _norm(cont) in written:
                raise Skip(f"writes `{_code(cont)}`, which it iterates over")
        self.reads = Reads(h, self.parser, types.MappingProxyType(self.elements), frozenset(written))
        self.accumulations()
        # adv.append(f(adv[-1])): the list's last element is the carried value
        lists = list_readbacks(self.items, self.body_assigned, self.memo_src, self.fresh)
        self.readbacks()
        self.memory_recurrences()
        # every expression in the body, both cases: allowed grammar only
        grammar = self.grammar()
        for it in _all_items(self.items):
            if id(it) in self.dropped:
                continue
            if it.kind == "reset":  # the per-step read under a comparison / .item() (see conds)
                for expr in _exprs(it):
                    base = conds.split_cond(expr)[0]
                    if not isinstance(base, (cst.Comparison, cst.Call, cst.BooleanOperation)):
                        grammar.check(base)  # else check_cond says what is understood
                grammar.check_cond(it.cond)  # type: ignore[arg-type]
                continue
            for expr in _exprs(it):
                grammar.check(expr)
        middle = self.merge_chained([it for it in _flatten(self.items, True) if id(it) not in self.dropped])
        middle = carried_copies(self.items, middle)  # gae = f(last); ...; last = gae
        self.forward_reads(middle)
        flow = dataflow(self.items, middle, self.grammar(), _all_items(self.items))
        # what leaves the stage is frozen: each working item once (shared items stay shared)
        done: Dict[int, FrozenItem] = {}

        def frozen(items) -> Tuple[FrozenItem, ...]:
            return tuple(freeze(it, done) for it in items)

        def table(d: Mapping[str, AnyItem]) -> Mapping[str, FrozenItem]:
            return types.MappingProxyType({k: freeze(v, done) for k, v in d.items()})

        return Analysis(
            node=node, header=h, views=self.views, reads=self.reads, items=frozen(self.items),
            middle=frozen(middle), body_assigned=frozenset(self.body_assigned),
            memo=types.MappingProxyType(self.memo), memo_src=types.MappingProxyType(self.memo_src),
            lists=lists, dropped=frozen(self.dropped.values()), readbacks=frozen(self.readback_items),
            cells=tuple(self.cells), forwarded=types.MappingProxyType(self.forwarded),
            flow=Dataflow(table(flow.assign_of), flow.rec_vars, table(flow.shift), table(flow.resets)))

    def accumulations(self) -> None:
        """``out[t] += v``: the step reads row t of ``out`` and writes it back, so the rows stay
        independent -- and ``out[1:T - 1] += V`` does the same per element -- only where nothing else
        in the body touches ``out``: written by that statement alone (one per step, in each branch
        of a last-step case), read nowhere else (not at [t + 1], not through another name's chain)."""
        acc = [it for it in _all_items(self.items) if it.accum]
        if not acc:
            return
        for X in {_norm(it.outs[0]) for it in acc}:
            mine = [it for it in acc if _norm(it.outs[0]) == X]
            spelled = _code(mine[0].node).strip()  # type: ignore[arg-type]
            for case in (True, False):
                writers = [it for it in _flatten(self.items, case) if any(_norm(o) == X for o in it.outs)]
                if len(writers) != 1 or not writers[0].accum:
                    raise Skip(f"`{spelled}` and another write of `{_code(mine[0].outs[0]).strip()}` in one step")
            uses = sum(1 for n in _walk(self.node.body) if isinstance(n, (cst.Name, cst.Attribute)) and _norm(n) == X)
            if uses != len(mine):
                raise Skip(f"`{spelled}` updates `{_code(mine[0].outs[0]).strip()}` in place and the loop also reads it "
                           "(understood: an output the loop reads only through its own `out[t] += v`)")

    def readbacks(self) -> None:
        """``out[t] = f(s)`` then, later in the step, ``s = out[t, 0]`` (or ``s = out[t]``), with
        ``s`` read by that update alone (Khrylx's ``prev_return = returns[i, 0]``): in the middle
        steps ``s`` is what the previous step stored, ``out[t + 1]``; with one element per row
        (``cells``, checked at run time) the row and its element give the same stored values, so
        the update becomes ``out[t] = f(out[t + 1])``, a recurrence through memory. The read-back
        statement leaves the middle steps and runs once at t = 1 for the last step."""
        top = [it for it in self.items if it.kind == "assign"]
        everything = _all_items(self.items)
        middle = _flatten(self.items, True)
        pos = {id(x): i for i, x in enumerate(middle)}
        t = self.h.index
        for r in top:
            v = r.value
            s = r.var
            if s is None or r.outs or not isinstance(v, cst.Subscript) or not _pure_container(v.value):
                continue
            if s == self.h.index or s in self.elements or s == _head(v.value):
                continue
            X = _norm(v.value)
            col = self.reads.index_column(v)
            if self.parser.ref_offset(v) == 0:
                cells = False
            elif col is not None and col[1] == 0 and all(i in ("0", "-1") for i in col[2]):
                cells = True
            else:
                continue
            writers = [o for o in everything if any(_norm(x) == X for x in o.outs)]
            if len(writers) != 1:
                continue
            w = writers[0]
            if w not in top or w.var is not None or len(w.outs) != 1 or pos[id(w)] > pos[id(r)]:
                continue
            if any(x is not r and x.var == s for x in everything):
                continue  # assigned elsewhere (also in the first step's branch): not always out[t + 1]
            if s not in _names_read(w.value) or any(  # type: ignore[arg-type]
                    x is not w and x is not r and any(s in _names_read(e) for e in _exprs(x)) for x in middle):
                continue
            nxt = parse_expression(f"{_code(v.value).strip()}[{t} + 1]")
            w.value = _subst(w.value, lambda e, s=s: isinstance(e, cst.Name) and e.value == s, nxt)  # type: ignore[arg-type]
            self.dropped[id(r)] = r
            self.readback_items.append(r)
            self.read_back_by.setdefault(id(w), []).append(r)
            if cells:
                self.cells.append(w.outs[0])

    def forward_reads(self, middle: List[Item]) -> None:
        """Reads of ``out[t]`` / ``out[t, i]`` after this step's write of ``out[t]`` (Khrylx's
        ``deltas[i]``) are reads of what the vectorized write stored: ``out[1:T - 1]``. Any other
        read of a written container at [t] in the middle steps is refused."""
        done: Set[str] = set()
        everything = _all_items(self.items)
        for it in middle:
            for e in _exprs(it):
                for n in _of_type(e, cst.Subscript):  # (cstwalk.typed)
                    if not _pure_container(n.value):
                        continue
                    X = _norm(n.value)
                    if X not in self.reads.written:
                        continue
                    col = self.reads.index_column(n)
                    if self.parser.ref_offset(n) == 0:
                        idx: Tuple[str, ...] = ()
                    elif col is not None and col[1] == 0:
                        idx = col[2]
                    else:
                        continue  # reported by check_subscript / handled as memory
                    writers = [o for o in everything if any(_norm(x) == X for x in o.outs)]
                    if X not in done or len(writers) != 1:
                        raise Skip(f"reads `{_code(n).strip()}`, which the loop writes")
                    code = _code(n.value).strip()
                    self.forwarded[id(n)] = (code, idx)
            for o in it.outs:
                done.add(_norm(o))

    def memory_recurrences(self) -> None:
        """``out[t] = f(out[t + 1])``: the value carried through ``out`` becomes a named carried
        value (``out[t + 1]`` is what the previous step stored). The read may also reach the
        update through a temporary assigned in the middle steps, ``tmp = out[t + 1]`` (CleanRL's
        ``next_return = returns[t + 1]`` in the else branch of the last-step split): when the
        update is the only reader of ``tmp`` there, ``tmp`` is the carried value too, and the
        middle steps do without its assignment (the first and last steps run it as written)."""
        top = [it for it in self.items if it.kind == "assign"]
        everything = [x for x in _all_items(self.items) if id(x) not in self.dropped]
        middle = [x for x in _flatten(self.items, True) if id(x) not in self.dropped]
        pos = {id(x): i for i, x in enumerate(middle)}
        for it in top:
            if it.var is not None or len(it.outs) != 1:
                continue
            X = _norm(it.outs[0])
            refs: List[Tuple[Item, int]] = []
            for other in everything:
                for e in _exprs(other):
                    refs.extend((other, k) for k in self._reads_of(e, X))
            aliases = [o for o, k in refs if o is not it and k == 1 and self._alias_of(o, X, it, middle)]
            # this step's stored value read after the write: forwarded (see forward_reads)
            later = [o for o, k in refs if k == 0 and id(o) in pos and pos[id(o)] > pos[id(it)]]
            if not any(o is it and k == 1 for o, k in refs) and not aliases:
                continue  # not carried through memory
            if any((o is not it or k != 1) and o not in aliases and o not in later for o, k in refs):
                continue  # reads the check below reports
            writers = [o for o in everything if any(_norm(x) == X for x in o.outs)]
            if writers != [it]:
                continue
            name = self.fresh(f"{X.split('.')[-1]}_next")
            # one span of code, the statements read back after it following ``; ``: the reason
            # quotes it in backticks, and a quote inside a quote read as two code spans
            self.memo_src[name] = "; ".join(
                _one_line(o.node) for o in [it, *aliases, *self.read_back_by.get(id(it), [])])  # type: ignore[arg-type]
            value = _subst(it.value, lambda e: self._is_ref(e, X, 1), cst.Name(name))  # type: ignore[arg-type]
            for o in aliases:
                tmp = o.var
                value = _subst(value, lambda e, tmp=tmp: isinstance(e, cst.Name) and e.value == tmp, cst.Name(name))
                self.dropped[id(o)] = o
            it.value = value
            it.var = name
            self.memo[name] = it.outs[0]
            self.body_assigned.add(name)

    def _alias_of(self, o: Item, X: str, it: Item, middle: List[Item]) -> bool:
        """``o`` is ``tmp = X[t + 1]`` in the middle steps, before the update ``it``, and ``it`` is
        the only middle-step reader of ``tmp`` (nothing else assigns it there)."""
        if o.kind != "assign" or o.var is None or o.outs or not self._is_ref(o.value, X, 1):  # type: ignore[arg-type]
            return False
        tmp = o.var
        if tmp == _head(o.value.value) or tmp == self.h.index or tmp in self.elements:  # type: ignore[union-attr]
            return False
        pos = {id(x): i for i, x in enumerate(middle)}
        if id(o) not in pos or id(it) not in pos or pos[id(o)] > pos[id(it)]:
            return False
        for x in middle:
            if x is o:
                continue
            if x.var == tmp:
                return False
            if x is not it and any(tmp in _names_read(e) for e in _exprs(x)):
                return False
        return True

    def _is_ref(self, e: cst.CSTNode, X: str, k: int) -> bool:
        return isinstance(e, cst.Subscript) and _pure_container(e.value) and _norm(e.value) == X \
            and self.parser.ref_offset(e) == k

    def _reads_of(self, e: cst.CSTNode, X: str) -> List[int]:
        """Offsets k of every read of ``X[...]`` under ``e`` (-1: not a per-step read)."""
        found: List[int] = []
        for n in _of_type(e, cst.Subscript):
            if _pure_container(n.value) and _norm(n.value) == X:
                k = self.parser.ref_offset(n)
                found.append(-1 if k is None else k)
        return found

    def merge_chained(self, middle: List[Item]) -> List[Item]:
        """``s = f(s); s = g(s)`` in one step is the update ``s = g(f(s))`` (affine if both are)."""
        out: List[Item] = []
        for it in middle:
            prev = next((p for p in reversed(out) if p.kind == "assign" and p.var == it.var), None) \
                if it.kind == "assign" and it.var is not None else None
            if prev is None:
                out.append(it)
                continue
            s = it.var
            between = out[out.index(prev) + 1:]
            if s not in _names_read(it.value) or prev.outs or any(  # type: ignore[arg-type]
                    s in _names_read(b.value if b.value is not None else b.cond) for b in between):  # type: ignore[arg-type]
                out = self.rename_version(out, prev, it)
                continue
            value = _subst(it.value, lambda e: isinstance(e, cst.Name) and e.value == s,  # type: ignore[arg-type]
                           _paren(prev.value))  # type: ignore[arg-type]
            # nothing in between reads s, so the merged update can sit where the last one was
            out.remove(prev)
            out.append(Item("assign", node=it.node, var=s, outs=it.outs, value=value))
        return out

    def rename_version(self, out: List[Item], prev: Item, it: Item) -> List[Item]:
        """``s = f(...); ...; s = g(...)`` in one step where the two do not merge (``g`` does not
        read ``s``, or a statement between reads the first value; a GAE's ``last_value =
        last_value * mask; delta = ... last_value ...; last_value = values[t]``): in the middle
        steps the first value gets a name of its own, read by the statements between and by
        ``g``; the last value keeps ``s``, which is what later steps and the code after the loop
        see. The peeled steps run as written (the items are copies: theirs are unchanged). Refused
        (Skip) where something between writes ``s`` otherwise (a reset) or a last-step conditional
        expression is involved."""
        s = it.var
        assert s is not None
        start = out.index(prev)
        between = out[start + 1:]
        if prev.first or it.first or prev.kind != "assign" or any(
                b.var == s or b.first or b.kind == "split" for b in between):
            raise Skip(f"`{s}` is assigned twice in one step")
        name = self.fresh(f"{s}_0")
        self.body_assigned.add(name)

        def rename(e):
            if e is None:
                return None
            return _subst(e, lambda n: isinstance(n, cst.Name) and n.value == s, cst.Name(name))

        renamed = [dataclasses.replace(prev, var=name)]
        for b in between:
            renamed.append(dataclasses.replace(b, value=rename(b.value), cond=rename(b.cond)))
        renamed.append(dataclasses.replace(it, value=rename(it.value)))
        return out[:start] + renamed
