"""Per-sample loss loops: a reduction loop whose body first binds temporaries
(``advantage = R - value.item()``) and then accumulates (``policy_losses.append(-log_prob *
advantage)``, ``loss += td ** 2``), as policy-gradient and actor-critic losses are written
(pytorch/examples actor_critic.py, many REINFORCE / A2C scripts). vectorize.reduction hands such
loops (and those that read ``.item()``, call a per-sample loss, unpack ``(log_prob, value), R``
or sum values of different ranks) to :func:`rewrite_loss_loop`.

A temporary is batched when it is bound once per iteration before any read (else it carries a
value from the previous iteration: a recurrence), is no loop variable or accumulator, is not
read outside the loop (the rewrite does not bind it) nor declared global, and its expression is
pure and element-wise (:mod:`.loss_expr`). Each temporary is evaluated once on all samples, in
order; each accumulation then reads the batched temporaries. Accumulations and consumers are
those of vectorize.reduction, with the same exactness stance (sums reassociate; stacked values
are exact when every operation is).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import libcst as cst

from scalebox_cst.report import EXACT, REASSOCIATED, REWRITTEN

from ..analysis.bodies import _code, target_names
from ..analysis.loops import LoopHeader, not_a_name, parse_header
from ..analysis.purity import is_simple_ref
from ..analysis.reads import names_read, read_elsewhere
from ..analysis.scopes import declares_global
from .kept_lists import reduced_text
from .loss_expr import BATCH, LossExpr, Refused, Value, marker
from .reduction_forms import _Acc, _accumulation, _sanitize, consumer_statements

RUNTIME = "scalebox_cst.runtime.vectorized"
GUARD_NOTE = "guarded by loss_zip/loss_range (contract: the site's details)"


def empty_list_init(stmt: cst.BaseStatement, name: str) -> Optional[str]:
    """None when ``stmt`` makes ``name`` a new empty list of its own (``L = []``, ``a, b = [], []``,
    ``a = []; b = []``), else why not. ``a = b = []`` binds one list to both names: the loop
    appends to it under either, which the batched branch (leaving the list empty) would not
    reproduce."""
    generic = (f"`{name}` is not created empty (`{name} = []` or `{name}, ... = [], ...`) just before the loop "
               "in the same block")
    if not isinstance(stmt, cst.SimpleStatementLine):
        return generic
    mentions = [s for s in stmt.body if name in names_read(s)]
    if len(mentions) != 1 or not isinstance(mentions[0], cst.Assign):
        return generic
    s = mentions[0]

    def empty(v: cst.BaseExpression) -> bool:
        return isinstance(v, cst.List) and not v.elements

    if name in names_read(s.value):
        return generic
    if len(s.targets) > 1:
        others = sorted(n for t in s.targets for n in names_read(t.target) if n != name)
        if others and empty(s.value):
            return (f"`{name}` and `{others[0]}` are the same list (`{_code(s).strip()}`), not an empty "
                    "list of its own")
        return generic
    target = s.targets[0].target
    if isinstance(target, cst.Name):
        return None if empty(s.value) else generic
    if isinstance(target, (cst.Tuple, cst.List)) and isinstance(s.value, (cst.Tuple, cst.List)):
        els, vals = list(target.elements), list(s.value.elements)
        if len(els) == len(vals) and not any(isinstance(e, cst.StarredElement) for e in els + vals):
            pos = [i for i, e in enumerate(els) if name in names_read(e.value)]
            if len(pos) == 1 and isinstance(els[pos[0]].value, cst.Name) and empty(vals[pos[0]].value):
                return None
    return generic


def _target_names(target: cst.BaseExpression) -> List[str]:
    """Every name a ``for`` target binds (nested tuples too)."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for el in target.elements for n in _target_names(el.value)]
    return []


class _Header:
    """``for (a, b), c in zip(AB, C)``: per zipped sequence, its target names (a list for a tuple
    target); ``element`` recognises the names as loop elements."""

    def __init__(self, parts: List[Tuple[cst.BaseExpression, List[str], bool]]) -> None:
        self.parts = parts  # (sequence, names, unpacked)
        self.names = [n for _, ns, _ in parts for n in ns]
        self.mode = "zip"

    def element(self, node: cst.CSTNode) -> Optional[str]:
        return node.value if isinstance(node, cst.Name) and node.value in self.names else None


def parse_loss_header(loop: cst.For, builtin_ok, imports=None) -> "LoopHeader | _Header | str":
    """The loop's header as vectorize.reduction reads it, or a zip whose target unpacks a
    sequence's items one level deep (``(log_prob, value), R``), or why neither."""
    header = parse_header(loop, builtin_ok, imports)
    if not isinstance(header, str) or loop.asynchronous is not None or loop.orelse is not None:
        return header
    target, it = loop.target, loop.iter
    if not (isinstance(target, (cst.Tuple, cst.List)) and isinstance(it, cst.Call) and isinstance(it.func, cst.Name)
            and it.func.value == "zip" and builtin_ok("zip") and len(it.args) == len(target.elements)
            and not any(a.star or a.keyword is not None for a in it.args)):
        return header
    parts = []
    for el, arg in zip(target.elements, it.args):
        names = target_names(el.value) if not isinstance(el, cst.StarredElement) else None
        if names is None or (not isinstance(el.value, cst.Name) and any(
                not isinstance(e.value, cst.Name) for e in el.value.elements)):
            return header  # starred or nested more than one level
        if not is_simple_ref(arg.value):
            return not_a_name(arg.value, "a zipped iterable")
        parts.append((arg.value, names, not isinstance(el.value, cst.Name)))
    names = [n for _, ns, _ in parts for n in ns]
    if len(set(names)) != len(names):
        return "the loop target is not a name or a tuple of distinct names"
    return _Header(parts)


def _split(stmts, code, loop_names) -> "Tuple[List[Tuple[str, cst.BaseExpression]], List[_Acc]] | str":
    """The body as temporaries (in order) and accumulations, or why it is neither."""
    temps: List[Tuple[str, cst.BaseExpression]] = []
    accs: List[_Acc] = []
    bound: Dict[str, int] = {}
    for i, s in enumerate(stmts):
        acc = _accumulation(s)
        if acc is not None:
            accs.append(acc)
            continue
        if not (isinstance(s, cst.Assign) and len(s.targets) == 1 and isinstance(s.targets[0].target, cst.Name)):
            return f"the body also runs `{code(s).strip()}`, which is not an accumulation"
        name = s.targets[0].target.value
        if name in loop_names:
            return f"the body rebinds the loop variable `{name}`"
        if name in bound:  # before the carry: `x = x.view(...)` after `x = ...` reads this iteration's x
            return f"`{name}` is bound twice in the body"
        if name in names_read(s.value):
            return f"`{name}` carries a value from one iteration to the next (`{code(s).strip()}`): a recurrence, not a per-sample temporary"
        bound[name] = i
        temps.append((name, s.value))
    for i, s in enumerate(stmts):
        early = {n for n in names_read(s) if n in bound and bound[n] > i}
        if early:
            n = sorted(early)[0]
            return f"`{n}` is read before it is bound in the body: its value carries over from the previous iteration"
    if not accs:
        return "the body accumulates nothing"
    return temps, accs


def rewrite_loss_loop(rw, loop: cst.For, idx: int, block, out: list, stmts) -> bool:
    """Analyse and (when it passes) rewrite one loss loop; report its site either way."""
    ctx = rw.ctx
    code = ctx.module.code_for_node
    split = _split(stmts, code, set(_target_names(loop.target)))
    if isinstance(split, str):
        return rw._skip(loop, split)
    temps, accs = split
    targets = [a.name for a in accs]
    temp_names = [t for t, _ in temps]
    if len(set(targets)) != len(targets):
        return rw._skip(loop, "the body accumulates into the same name twice")
    if set(targets) & set(temp_names):
        return rw._skip(loop, f"`{sorted(set(targets) & set(temp_names))[0]}` is both a temporary and an accumulator")
    header = parse_loss_header(loop, rw.builtin_ok, ctx.imports)
    if isinstance(header, str):
        return rw._skip(loop, header)
    if set(header.names) & set(temp_names):
        return rw._skip(loop, f"the body rebinds the loop variable `{sorted(set(header.names) & set(temp_names))[0]}`")
    if set(targets) & set(header.names):
        return rw._skip(loop, "the body accumulates into a loop variable")
    if names_read(loop.iter) & (set(targets) | set(temp_names)):
        return rw._skip(loop, "the loop header reads an accumulator or a temporary")
    forbidden = set(targets) | (set(header.names) if header.mode == "range" else set())
    expr = LossExpr(ctx.imports, header.element, forbidden, rw.builtin_ok)
    tcodes: Dict[str, str] = {}
    try:
        for name, value in temps:
            v = expr.value(value)
            if v.kind in ("inv", "num"):
                raise Refused(f"the temporary `{name}` does not depend on the loop element")
            tcodes[name] = v.code
            expr.temps[name] = Value(f"\x00t:{name}\x00", v.kind, v.keys, v.invs, v.const, v.ops)
        values: List[Value] = []
        for acc in accs:
            v = expr.value(acc.expr)
            if v.kind in ("inv", "num"):
                raise Refused("the expression does not depend on the loop element")
            if v.kind == "py":
                raise Refused(f"`{code(acc.expr)}` is a Python float per sample (the loop adds Python floats)")
            values.append(v)
        if all(v.ops == 0 for v in values):
            raise Refused("nothing is computed per element (the result would alias the input)")
    except Refused as why:
        return rw._skip(loop, str(why))
    sources = [seq for seq, _, _ in header.parts] if isinstance(header, _Header) else list(header.sources.values())
    if any(names_read(src) & set(targets) for src in sources):
        return rw._skip(loop, "an iterated sequence is also accumulated into")
    scope = rw.scopes[-1]
    # read outside the loop: the batched branch then runs the last iteration's bindings as written
    live = sorted(read_elsewhere(scope, loop, header.names) | read_elsewhere(scope, loop, temp_names))
    if declares_global(scope, targets + header.names + temp_names):
        return rw._skip(loop, "an accumulator, temporary or loop variable is declared global/nonlocal")
    for acc in accs:
        if acc.kind == "append":
            why = rw._consumer(acc, loop, idx, block, scope)
            if why:
                return rw._skip(loop, why)
    for acc, v in zip(accs, values):  # a sum of the elements themselves is a new tensor; a stack would not be
        if v.ops == 0 and acc.kind == "append" and acc.consumer_kind in ("stack", "cat"):
            return rw._skip(loop, f"nothing is computed per element for `{acc.name}` (the result would alias the input)")
    return _emit(rw, loop, idx, header, expr, tcodes, accs, values, out, temps if live else None, live)


def _emit(rw, loop, idx, header, expr: LossExpr, temps: Dict[str, str], accs: List[_Acc], values: List[Value], out: list,
          epilogue, live: List[str]) -> bool:
    """The guarded statement. ``epilogue``: the temporaries (name, expression) to bind as the last
    iteration does, after binding the loop target to the last items (names in ``live`` are read
    outside the loop), or None."""
    ctx = rw.ctx
    code = ctx.module.code_for_node
    # the guard's batches: zip elements in target order, range elements in first-use order
    if isinstance(header, _Header):
        order = [n for n in header.names if n in expr.keys]
        unpack = []
        for seq, names, unpacked in header.parts:
            flags = [n in expr.keys for n in names]
            unpack.append("(" + ", ".join(map(str, flags)) + ("," if len(flags) == 1 else "") + ")" if unpacked else str(flags[0]))
        seqs = [code(seq) for seq, _, _ in header.parts]
    elif header.mode == "zip":
        order = [n for n in header.names if n in expr.keys]
        unpack = [str(n in expr.keys) for n in header.names]
        seqs = [code(header.sources[n]) for n in header.names]
    else:
        order = list(expr.keys)
        unpack, seqs = [], [code(header.sources[k]) for k in order]
    pos = {expr.keys.index(k): i for i, k in enumerate(order)}
    names = {k: ctx.imports.unique_name(f"_sb_{_sanitize(k)}") for k in order}
    tnames = {t: ctx.imports.unique_name(f"_sb_{_sanitize(t)}") for t in temps}
    batch = ctx.imports.unique_name("_sb_batch")

    def fill(text: str) -> str:
        for i, k in enumerate(expr.keys):
            text = text.replace(marker(i), names[k])
        for t, n in tnames.items():
            text = text.replace(f"\x00t:{t}\x00", n)
        return text.replace(BATCH, batch)

    def tup(items) -> str:
        items = list(items)
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"

    cats = [j for j, a in enumerate(accs) if a.kind == "append" and "cat" in a.consumer_kind]
    fits = [f"({tup(str(pos[k]) for k in sorted(v.keys, key=pos.get))}, {tup(str(i) for i in sorted(v.invs))}, {v.const})"
            for v in values]
    checks = [f"units={tup(str(pos[k]) for k in sorted(expr.units, key=pos.get))}" if expr.units else "",
              f"zerod={tup(str(pos[k]) for k in sorted(expr.zerod, key=pos.get))}" if expr.zerod else "",
              f"numbers={tup(str(i) for i in sorted(expr.numbers))}" if expr.numbers else "",
              f"unit_invs={tup(str(i) for i in sorted(expr.unit_invs))}" if expr.unit_invs else "",
              f"fits={tup(fits)}", f"cats={tup(str(j) for j in cats)}" if cats else "",
              f"rank={expr.rank}" if expr.rank else "", "cpu=True" if expr.cpu else "",
              "floats=True" if expr.floats else "", "default=True" if expr.default else ""]
    kw = ", ".join(c for c in checks if c)
    invariants = tup(code(i) for i in expr.invariants)
    acc_args = tup(a.name for a in accs if a.kind != "append")
    if header.mode == "range":
        helper = ctx.runtime_name(f"{RUNTIME}.loss_range", "_sb_loss_range")
        call = f"{helper}({code(header.range_call)}, {tup(seqs)}, {invariants}, {acc_args}, {kw})"
    else:
        helper = ctx.runtime_name(f"{RUNTIME}.loss_zip", "_sb_loss_zip")
        call = f"{helper}({tup(seqs)}, {tup(unpack)}, {invariants}, {acc_args}, {kw})"
    fast = [f"{', '.join(names[k] for k in order)}{',' if len(order) == 1 else ''} = {batch}.seqs"]
    fast += [f"{tnames[t]} = {fill(c)}" for t, c in temps.items()]
    slow: List[str] = []
    replacements = []
    exactness = EXACT if expr.exact else REASSOCIATED
    what: List[str] = []
    for j, (acc, v) in enumerate(zip(accs, values)):
        value = f"{batch}.fit({fill(v.code)}, {j})"
        if acc.kind == "append":
            var = ctx.imports.unique_name(f"_sb_{_sanitize(acc.name)}")
            fast.append(f"{var} = {value}")
            if acc.keep_list:  # also read by len() / another reduction: filled as the loop fills it
                fast.append(f"{acc.name}.extend({var}.unbind(0))")
            slow.append(f"{var} = None")
            reduced = reduced_text(var, acc.consumer_kind, acc.keep_list)
            replacements.append((acc.consumer_index, acc.consumer, f"({reduced} if {var} is not None else {code(acc.consumer)})"))
            if acc.consumer_kind in ("stack", "cat"):
                what.append(f"{acc.name} → batched {acc.consumer_kind}")
            else:
                exactness = REASSOCIATED
                what.append(f"{acc.name} → one {'mean' if 'mean' in acc.consumer_kind else 'sum'}")
        else:
            exactness = REASSOCIATED
            total = f"{value}.sum(0)"
            fast.append({"aug": f"{acc.name} {acc.op}= {total}", "assign_left": f"{acc.name} = {acc.name} {acc.op} {total}",
                         "assign_right": f"{acc.name} = {total} + {acc.name}"}[acc.kind])
            what.append(f"{acc.name} {acc.op}= one sum")
    if epilogue is not None:  # what the last iteration leaves bound: its items, its temporaries (pure), as written
        fast.append(f"{code(loop.target)} = {_last_items(loop, header, code)}")
        fast += [f"{t} = {code(v)}" for t, v in epilogue]
    assign = cst.parse_statement(f"{batch} = {call}\n")
    if_stmt = cst.If(
        test=cst.parse_expression(f"{batch} is not None"),
        body=cst.IndentedBlock(body=[cst.parse_statement(line + "\n") for line in fast]),
        orelse=cst.Else(body=cst.IndentedBlock(body=[cst.parse_statement(line + "\n") for line in slow]
                                               + [out[idx].with_changes(leading_lines=())])),
    )
    out[idx] = cst.FlattenSentinel([assign.with_changes(leading_lines=loop.leading_lines), if_stmt])
    for j, node, text in replacements:
        out[j] = out[j].deep_replace(rw._find_same(out[j], node), cst.parse_expression(text))
    notes = []
    if epilogue is not None:
        notes.append(f"{', '.join(f'`{t}`' for t in live)} (read outside the loop) bound as the last iteration binds "
                     "them: the last items, then the temporaries' statements as written")
    if temps:
        notes.append(f"temporaries {', '.join(f'`{t}`' for t in temps)} evaluated once for all samples")
    if expr.floats:
        notes.append(".item() / float() as the values' float64 copies (no gradient; the guard checks one value "
                     "per sample and float32/float64), cast to the tensor dtype where they meet a tensor, as torch "
                     "casts a Python float")
    if expr.losses:
        notes.append("per-sample losses as one call with reduction='none' (the guard checks one value per sample: "
                     "the mean or sum of one value is that value, bitwise, gradient too)")
    if expr.cpu:
        notes.append("torch.tensor([x]) as x's values without history (the guard checks the CPU, where torch.tensor puts them)")
    if exactness == EXACT and expr.invariants:
        notes.append("values bitwise; the gradient of a loop-invariant tensor that requires grad sums over the "
                     "samples in another order (to rounding)")
    detail = "; ".join(what + notes)
    tol = "" if exactness == EXACT else " (float sums agree to rounding (relative ≈ n·eps))"
    reason = f"one batched evaluation of the loop body: {detail}{tol}; {GUARD_NOTE}; else the loop runs as written"
    rw.sites.append(rw.make_site(loop, REWRITTEN, reason, exactness, also=consumer_statements(accs)))
    return True


def _last_items(loop: cst.For, header, code) -> str:
    """What the loop's last iteration binds its target to: ``range(...)[-1]``, ``xs[-1]``, or the
    last item of each zipped sequence (the guard saw to lists, tuples or tensors of one length >= 1)."""
    if header.mode == "range":
        return f"{code(header.range_call)}[-1]"
    it = loop.iter
    if isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value == "zip":
        items = [f"{code(a.value)}[-1]" for a in it.args]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return f"{code(it)}[-1]"
