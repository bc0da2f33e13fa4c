"""The carried value read back from the list being built (a step of the analysis, and the lines
it adds to the plan).

``adv = [deltas[-1]]`` then ``adv.append(deltas[t] + gamma * lam * adv[-1])`` each step, or
``returns.insert(0, r + gamma * returns[0] * mask)``: the loop keeps no carried name, it reads back
the element it wrote the step before, ``L[-1]`` after ``L.append(v)``, ``L[0]`` after
``L.insert(0, v)`` / ``L.appendleft(v)``. Within the loop that element is ``v`` itself (the same
object: nothing else writes ``L`` in the body, which touches it only through those reads and the
one write), so the read is the carried value and the loop is ``s = f(s); L.append(s)``. The first
step runs as written and reads whatever ``L`` held (a seed, or nothing: then it raises as the loop
does); from the second step on the read is the previous write. When the written value has a name
(``advantage = f(advantages[-1]); advantages.append(advantage)``) that name is the carried value;
otherwise the middle steps bind a fresh one from ``L[-1]`` / ``L[0]`` after the first step (the
guard's ``carry_ok`` checks that element). Reads of any other element (``adv[-2]``, ``adv[0]``
after ``append``: a fixed element, not a carried value), reads after the write, writes inside the
last-step special case, and one-element-list items are left alone with their reason. At run time
the list must be a ``list`` (``recurrence_ok``) that no container of a loop-invariant read is
(``written_apart``, emitted for every loop that writes and reads such elements: under a second
name the loop's writes would change what those reads give).
"""
from __future__ import annotations

import dataclasses
import re
import types
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

import libcst as cst

from ...analysis.cstclone import parse_expression
from .syntax import _code, _norm, _one_line, _pure_container, _subst, _of_type, _walk, Skip
from .body import AnyItem, Item, ItemT, _flatten


_WRITES = {"append": "-1", "insert": "0", "appendleft": "0"}


def _index_text(node: cst.Subscript) -> Optional[str]:
    if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
        return None
    return _norm(node.slice[0].slice.value)


def list_readback_candidate(node: cst.For) -> bool:
    """The loop writes into a list with ``append`` / ``insert`` / ``appendleft`` and indexes that
    list too (a value may flow from one step to the next through it)."""
    written: Set[str] = set()
    for st in _of_type(node.body, cst.Call):  # (the body's walk by node type: cstwalk.typed)
        func = st.func
        if isinstance(func, cst.Attribute) and func.attr.value in _WRITES and _pure_container(func.value):
            written.add(_norm(func.value))
    if not written:
        return False
    return any(_pure_container(n.value) and _norm(n.value) in written
               for n in _of_type(node.body, cst.Subscript))


@dataclasses.dataclass(frozen=True)
class ListCarry:
    """What the list read-backs left: ``carried`` the fresh carried names bound from the list
    (name -> (list code, the read, ``L[-1]``)), ``srcs`` the statement of each list-carried value
    (its text -> the list's code, for the site's reason)."""
    carried: Mapping[str, Tuple[str, str]]
    srcs: Mapping[str, str]


def _all_items(items: Sequence[ItemT]) -> List[ItemT]:
    """Every item but the splits, both cases of each (the splits' branches in place)."""
    out: List[ItemT] = []
    for it in items:
        if it.kind == "split":
            out.extend(_all_items(it.then))
            out.extend(_all_items(it.other))
        else:
            out.append(it)
    return out


def _exprs(it: AnyItem) -> List[cst.BaseExpression]:
    """The expressions an item evaluates (a reset's condition without its ``not``)."""
    exprs = [e for e in (it.value,) if e is not None]
    if it.cond is not None:
        c = it.cond
        if isinstance(c, cst.UnaryOperation) and isinstance(c.operator, cst.Not):
            c = c.expression
        exprs.append(c)
    return exprs


def list_readbacks(items: List[Item], body_assigned: Set[str], memo_src: Dict[str, str],
                   fresh: Callable[[str], str]) -> ListCarry:
    """Rewrites ``items`` (the analysis's working list) so each read-back ``L[-1]`` / ``L[0]`` is
    the carried name; adds the names it binds to ``body_assigned`` and their statements to
    ``memo_src``; Skip where the list is read otherwise (see module docstring)."""
    carried: Dict[str, Tuple[str, str]] = {}
    srcs: Dict[str, str] = {}
    everything = _all_items(items)
    for w in everything:
        if w.kind not in _WRITES or w.container is None:
            continue
        key = _norm(w.container)
        reads = [(o, n) for o in everything for e in _exprs(o) for n in _walk(e)
                 if isinstance(n, cst.Subscript) and _pure_container(n.value) and _norm(n.value) == key]
        if not reads:
            continue
        _carry_through(items, w, key, reads, everything, body_assigned, memo_src, fresh, carried, srcs)
    return ListCarry(types.MappingProxyType(carried), types.MappingProxyType(srcs))


def _carry_through(items: List[Item], w: Item, key: str, reads, everything: List[Item], body_assigned: Set[str],
                   memo_src: Dict[str, str], fresh: Callable[[str], str], carried: Dict[str, Tuple[str, str]],
                   srcs: Dict[str, str]) -> None:
    L = _code(w.container).strip()  # type: ignore[arg-type]
    want = _WRITES[w.kind]
    spelled = f"{L}[{want}]"
    write = _one_line(w.node)  # type: ignore[arg-type]
    for _, n in reads:
        got = _index_text(n)
        if got != want:
            doing = "appends to it" if want == "-1" else "inserts at its front"
            raise Skip(f"reads `{_code(n).strip()}` of the list `{L}` while it {doing}: only the element "
                       f"written last (`{spelled}`) is the previous step's value")
    if w not in items:
        raise Skip(f"`{write}` is inside the last-step special case and `{spelled}` reads it back")
    if w.wrap:
        raise Skip(f"`{write}` appends one-element lists and `{spelled}` reads one back")
    if any(o is not w and o.container is not None and _norm(o.container) == key for o in everything):
        raise Skip(f"writes into `{L}` twice per step and reads `{spelled}` back")
    middle = _flatten(items, True)
    pos = {id(x): i for i, x in enumerate(middle)}
    for o, n in reads:
        if id(o) not in pos:
            raise Skip(f"reads `{spelled}` in the last-step special case")
        if pos[id(o)] > pos[id(w)]:
            raise Skip(f"reads `{_code(n).strip()}` after `{write}` in the same step (this step's value, "
                       "not the previous one's)")
    is_read = lambda e: isinstance(e, cst.Subscript) and _pure_container(e.value) \
        and _norm(e.value) == key and _index_text(e) == want  # noqa: E731
    v = w.value.value if isinstance(w.value, cst.Name) else None
    own = [x for x in everything if x.kind == "assign" and x.var == v] if v is not None else []
    if v is not None and len(own) == 1 and own[0] in items and not own[0].outs \
            and pos[id(own[0])] < pos[id(w)] and all(pos[id(o)] <= pos[id(own[0])] for o, _ in reads):
        # advantage = f(advantages[-1]); advantages.append(advantage): `advantage` is carried
        name = v
        src = _one_line(own[0].node)  # type: ignore[arg-type]
    else:
        if v is not None and v in body_assigned:
            raise Skip(f"`{write}` writes `{v}`, which is not assigned once before it in the step, "
                       f"and `{spelled}` reads it back")
        other = next((o for o, _ in reads if o is not w), None)
        if other is not None:
            raise Skip(f"reads `{spelled}` in `{_one_line(other.node)}` and writes `{write}`: the value read "
                       f"back reaches the write through a temporary (understood: `{L}.{w.kind}(f({spelled}))`, "
                       f"`v = f({spelled})` then `{L}.{w.kind}(v)`)")
        name = fresh(f"{key.split('.')[-1]}_last")
        src = write
        asg = Item("assign", node=w.node, var=name, value=w.value)
        items.insert(items.index(w), asg)
        w.value = cst.Name(name)
        reads = [(asg if o is w else o, n) for o, n in reads]
        carried[name] = (L, spelled)
        body_assigned.add(name)
    for o, _ in {id(o): (o, n) for o, n in reads}.values():
        if o.value is not None:
            o.value = _subst(o.value, is_read, cst.Name(name))
        if o.cond is not None:
            o.cond = _subst(o.cond, is_read, cst.Name(name))
    memo_src[name] = src
    srcs[src] = L


# ---- the plan's part: bind fresh carried values, keep written containers apart from invariant reads
def bind_lines(carry: ListCarry, rec_vars: Iterable[str]) -> List[str]:
    """``adv_last = adv[-1]`` for each fresh carried name the vectorized steps start from."""
    rec = set(rec_vars)
    return [f"{name} = {spelled}" for name, (_, spelled) in carry.carried.items() if name in rec]


def noted(notes: List[str], carry: ListCarry) -> List[str]:
    """The site's patterns with each list-carried value said to be carried through its list."""
    for src, L in carry.srcs.items():
        notes = [n.replace(f"`{src}`, carried through memory,",
                           f"`{src}`, carried through the list `{L}`,") for n in notes]
    return notes


def written_apart(helpers: str, written: List[str], others: List[str]) -> str:
    """The guard's clause keeping the written containers apart from the invariant reads' ones."""
    if written and others:
        return f" and {helpers}.written_apart(({', '.join(written)},), ({', '.join(others)},))"
    return ""


def carry_text(text: Optional[str], carry: ListCarry) -> Optional[str]:
    """The carry check with each fresh carried name read from the list (the first step has just
    written the element; fresh names are nowhere else in the text)."""
    if text is None:
        return None
    for name, (_, spelled) in carry.carried.items():
        text = re.sub(rf"(?<![\w.]){re.escape(name)}\b", spelled, text)
    return text


def invariant_containers(consts: Iterable[str], scalars: Iterable[str]) -> List[str]:
    """The containers of the loop-invariant subscripts the guard reads once (``coef[0]``,
    ``other[1]``): one of them the list or array the loop writes under another name would
    change under the loop's reads, which the rewrite, reading it once, would not see."""
    out: Dict[str, None] = {}
    for text in list(consts) + list(scalars):
        try:
            e = parse_expression(text)
        except Exception:  # pragma: no cover - the codes are expressions the body holds
            continue
        if isinstance(e, cst.Subscript) and _pure_container(e.value):
            out[_code(e.value).strip()] = None
    return list(out)
