"""Emission: the middle steps' lines and the run-time guard (``recurrence_ok``, ``carry_ok``) that
selects them (a Planner mixin; :mod:`.build` puts them into the rewritten statement).
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from .syntax import _code, _names_read, _norm
from . import conds, fold

#: the first row the outputs of the vectorized steps are stored from: 1, or 0 where the last step
#: is folded in (filled in once the emitted slices are known to allow it)
_LO = "__SBX_LO__"


class Emit:
    """The middle steps' lines and the guard."""

    def emit(self, helpers: str, op: str) -> Tuple[str, List[str], bool, List[str]]:
        """(guard expression, middle lines, exact, notes)."""
        self.T = self.fresh("T")
        T = self.T
        env: Dict[str, str] = {}
        needed = self.needed()
        mid: List[str] = []
        exact = True
        notes: List[str] = []
        done_vars: Set[str] = set()
        derived: Set[str] = set()  # arrays computed from a carried value (their items follow its type)

        def from_carried(text: str) -> bool:
            return any(re.search(rf"(?<![\w.]){re.escape(n)}\b", text) for n in derived)

        for it in self.middle:
            if it.kind == "reset":
                continue
            if it.kind == "assign" and it.var in self.rec_vars:
                rec = self.recurrence(it, env)
                exact = exact and rec.exact
                notes.append(rec.pattern)
                s = rec.var
                seq, last = self.fresh(f"{s}_seq"), self.fresh(f"{s}_last")
                b = rec.b
                if not re.fullmatch(r"[A-Za-z_]\w*", b):
                    bname = self.fresh(f"{s}_b")
                    mid.append(f"{bname} = {b}")
                    b = bname
                if s in self.memo:  # the value the previous step stored, read back as the loop does
                    mid.append(f"{s} = {_code(self.memo[s]).strip()}[{T} - 1]")
                init = f"{helpers}.as_row({s}, {b})"
                if rec.reset is not None:
                    cond = rec.reset.cond
                    neg = isinstance(cond, cst.UnaryOperation) and isinstance(cond.operator, cst.Not)
                    base, test, number = conds.split_cond(cond.expression if neg else cond)
                    ref = self.per_step(base)
                    assert ref is not None
                    mask = self.use_cond(ref[0], ref[1], test, number)
                    if neg:
                        mask = f"~{mask}"
                    self.consts[s] = None  # the value before the loop meets the same dtype rules
                    kind = "switch" if rec.reset.switch else "reset"  # if done: s = 0 else: s = f(s)
                    mid.append(f"{seq}, {last} = {helpers}.{kind}_linear_recurrence("
                               f"{rec.a}, {b}, {mask}, {rec.reset.const}, init={init}, return_last=True)")
                else:
                    mid.append(f"{seq}, {last} = {op}({rec.a}, {b}, init={init}, return_last=True)")
                if s not in self.memo:
                    mid.append(f"{s} = {helpers}.restore({last}, {s})")
                env[s] = seq
                self.step_names.add(seq)
                done_vars.add(s)
                derived.add(seq)
                value_vec = seq
            elif it.kind == "assign" and it.var in self.shift:
                value_vec = None
            elif it.kind == "assign" and it.var is not None:
                if it.var in needed or it.outs:
                    vname = self.fresh(f"{it.var}_v")
                    text = self.render(it.value, env)
                    mid.append(f"{vname} = {text}")
                    env[it.var] = vname
                    if self._has_step(text):
                        self.step_names.add(vname)
                    if from_carried(text):
                        derived.add(vname)
                    value_vec = vname
                else:
                    value_vec = None
            else:
                value_vec = None
            if it.kind == "assign":
                for o in it.outs:
                    vec = value_vec if value_vec is not None else self.render(it.value, env)
                    oc = _code(o).strip()
                    if self._has_step(vec):  # time-first: rows aligned to out's rows
                        vec = f"{helpers}.to_rank({vec}, {oc})"
                    mid.append(f"{oc}[{_LO}:{T} - 1] {it.accum or '='} {vec}")
            elif it.kind in ("append", "insert", "appendleft"):
                vec = self.render(it.value, env)
                if not from_carried(vec):  # an item made of per-step values alone: Python numbers in
                    self.weak_ok = False  # the loop when those are, array items once they are arrays
                like = vec if (isinstance(it.value, cst.Name) and it.value.value in done_vars) else None
                src = self.src_container()
                srcs = ""
                if len(self.vec_names) > 1:  # one of them may be a list of done flags next to arrays
                    srcs = f", srcs=({', '.join(_code(self.seq_nodes[k]).strip() for k in self.vec_names)},)"
                items = f"{helpers}.items_of({vec}, {src}" + (f", like={it.value.value}" if like else "") + srcs + ")"
                if it.wrap:
                    items = f"{helpers}.wrapped({items})"
                cont = _code(it.container).strip()
                if it.kind == "append":
                    mid.append(f"{cont}.extend({items}[::-1])")
                elif it.kind == "appendleft":  # a series of appendleft, last step's value leftmost
                    mid.append(f"{cont}.extendleft({items}[::-1])")
                else:
                    mid.append(f"{cont}[0:0] = {items}")
        # bindings of the per-step containers, first (several: rows aligned to one rank, see seqs_of)
        if len(self.vec_names) > 1:
            binds = [f"{', '.join(self.vec_names.values())} = {helpers}.seqs_of("
                     f"{', '.join(_code(self.seq_nodes[k]).strip() for k in self.vec_names)})"]
        else:
            binds = [f"{self.vec_names[k]} = {helpers}.seq_of({_code(self.seq_nodes[k]).strip()})" for k in self.vec_names]
        binds += [f"{self.cond_names[k]} = {helpers}.truth_of({_code(self.seq_nodes[k]).strip()}{self.cond_tests.get(k, '')})"
                  for k in self.cond_names]
        mid = binds + mid
        # the last step t = 0 folded in (build asks, see fold): every slice starts one row earlier
        wide = fold.widen(mid, list(self.vec_names.values()) + list(self.cond_names.values())) \
            if getattr(self, "fold_last", False) else None
        self.folded = wide is not None
        mid = [x.replace(_LO, "0" if self.folded else "1") for x in (wide if self.folded else mid)]  # type: ignore[union-attr]
        guard = self.guard(helpers)
        return guard, mid, exact, notes

    def src_container(self) -> str:
        """A per-step container the loop reads (tells the helpers lists of floats from arrays)."""
        key = next(iter(self.vec_names)) if self.vec_names else _norm(self.h.elements[0][1]) if self.h.elements else None
        if key is None:  # pragma: no cover - a recurrence always reads a per-step value
            return "None"
        node = self.seq_nodes.get(key)
        return _code(node).strip() if node is not None else key

    def needed(self) -> Set[str]:
        """Temporaries the middle steps must compute (read by an update, an output or another)."""
        need: Set[str] = set()
        for it in reversed(self.middle):
            if it.kind == "reset":
                continue
            if it.kind == "assign" and it.var is not None and it.var not in self.rec_vars \
                    and it.var not in need and not it.outs:
                continue
            need |= _names_read(it.value) & self.body_assigned
        return need

    def carry_check(self, helpers: str) -> Optional[str]:
        """The check of the carried values after the first step (see runtime carry_ok), None when
        every carried value lives in memory (checked by the guard as ``memo``)."""
        carried = [s for s in self.rec_vars if s not in self.memo]
        if not carried:
            return None
        seqs = ", ".join(_code(self.seq_nodes[k]).strip() for k in self.seqs)
        return f"{helpers}.carry_ok(({', '.join(carried)},), ({seqs},))"

    def guard(self, helpers: str) -> str:
        h = self.h
        T = self.T
        if h.named is not None:  # the list the loop walks, checked to be T - 1, ..., 0
            head = f"({T} := {helpers}.backward_steps({h.named.value})) >= 2"
            if _names_read(h.T) & _names_read(self.node.body):
                head += f" and {helpers}.steps({_code(h.T).strip()}) == {T}"
        elif h.kind == "index":
            head = f"({T} := {helpers}.steps({_code(h.T).strip()})) >= 2"
        else:
            conts = ", ".join(_code(c).strip() for _, c in h.elements)
            head = f"({T} := {helpers}.length({conts})) >= 2"
        for view in self.views:  # time indexed in the middle: time-major views, None if none (views.View)
            head += f" and ({view.name} := {view.call(helpers)}) is not None"
        args: List[str] = [T]

        def pairs(d: Dict[str, int]) -> str:
            inner = ", ".join(f"({_code(self.seq_nodes[k]).strip()}, {max(0, v - 1)})" for k, v in d.items())
            return f"({inner},)" if inner else "()"

        if self.seqs:
            args.append(f"seqs={pairs(self.seqs)}")
        if self.conds:
            args.append(f"conds={pairs(self.conds)}")
        consts = [c for c in self.consts if c not in self.scalars]
        if consts:
            args.append(f"consts=({', '.join(consts)},)")
        if self.scalars:
            args.append(f"scalars=({', '.join(self.scalars)},)")
        outs = []
        lists = []
        deques = []
        for it in self.middle:
            for o in it.outs:
                outs.append(_code(o).strip())
            if it.container is not None:
                (deques if it.kind == "appendleft" else lists).append(_code(it.container).strip())
        memo = [_code(x).strip() for x in self.memo.values()]
        outs = [o for o in outs if o not in memo]
        if outs:
            args.append(f"outs=({', '.join(dict.fromkeys(outs))},)")
        if memo:
            args.append(f"memo=({', '.join(memo)},)")
        if self.fwd_reads:
            args.append(f"reads=({', '.join(f'({k}, {v})' for k, v in self.fwd_reads.items())},)")
        if self.cells:
            args.append(f"cells=({', '.join(dict.fromkeys(_code(c).strip() for c in self.cells))},)")
        if len(self.vec_names) > 1:
            args.append("aligned=True")
        if lists:
            args.append(f"lists=({', '.join(dict.fromkeys(lists))},)")
        if deques:
            args.append(f"deques=({', '.join(dict.fromkeys(deques))},)")
        if h.sliced:
            args.append("sliced=True")
        if self.divides:
            args.append("divides=True")
        if self.cpu:
            args.append("cpu=True")
        if not self.weak_ok:
            args.append("weak=False")
        self.guard_head, self.guard_ok = head, f"{helpers}.recurrence_ok({', '.join(args)})"
        return f"{head} and {self.guard_ok}"
