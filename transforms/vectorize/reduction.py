"""Replace loops that accumulate an element-wise expression with one batched reduction.

``loss += f(x[i])`` over ``range(n)``, or ``losses.append(f(x))`` followed by
``torch.stack(losses).sum()`` / ``.mean()`` / ``torch.cat(losses).sum()`` / ``sum(losses)``
(PyTorch's REINFORCE example, many policy-gradient scripts) run one tiny op per element per
operation; the rewrite evaluates ``f`` once on batched tensors and reduces. The summation order
changes, so sites are ``reassociated`` (float sums agree to rounding; gradients flow through the
same element-wise ops). ``torch.stack(losses)`` / ``torch.cat(losses)`` consumers get the batched
values themselves: ``exact`` when ``f`` uses only correctly rounded operations.

Guards (``scalebox_cst.runtime.loop_batch``): operands are tensors or lists of equally shaped
tensors of one floating dtype and device, the loop is not empty, accumulators are numbers or
tensors that share no memory with the operands. Otherwise the original loop runs, verbatim.
"""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

import libcst as cst

from scalebox_cst.report import EXACT, REASSOCIATED, REWRITTEN, SKIPPED, Site

from ..analysis.cstclone import parse_expression, parse_statement
from ..base import FileContext, Transform
from ..analysis.bodies import early_exit_reason, flat_body
from ..analysis.reads import names_read, read_elsewhere
from ..analysis.scopes import builtin_checker, declares_global
from ..analysis.loops import BATCH_GUARD_NOTE, LoopHeader, parse_header
from ..analysis.statements import ast_guarded, ast_is_flat, ast_statements, CstStatements
from ..analysis.elementwise import ElementwiseExpr
from ..analysis.rewriting import replace_nodes, ScopedRewriter
from .loss_loops import empty_list_init, rewrite_loss_loop
from .param_penalty import try_penalty
from .kept_lists import read_only_uses, reads_outside, reduced_text
from .reduction_examples import EXAMPLES
from .reduction_forms import (
    _Acc,
    consumer_statements,
    _accumulation,
    _ast_accumulation,
    _ast_reduced_lists,
    _ast_term,
    _ast_trivial,
    _carries,
    _cst_reduced_lists,
    _cst_trivial,
    _sanitize,
)

ID = "vectorize.reduction"
RUNTIME = "scalebox_cst.runtime.loop_batch"
TOLERANCE = "float sums agree to rounding (relative ≈ n·eps)"


class _Rewriter(ScopedRewriter):
    """Rewrites the accumulation loops of each block. Run as a transformer over the whole module
    (the fallback) or driven block by block by :meth:`VectorizeReduction.rewrite`, which sets
    ``scopes`` and ``guards`` and gives the loops' lines in ``spans``."""

    transform_id = ID

    def __init__(self, ctx: FileContext, sites: List[Site], spans: Optional[Dict[cst.CSTNode, Tuple[int, int]]] = None) -> None:
        super().__init__(ctx, sites, spans)
        self._reduced: Dict[int, Tuple[cst.CSTNode, Set[str]]] = {}  # per scope: lists a reduction reads

    # ---------------------------------------------------------------- scopes
    # ---------------------------------------------------------------- blocks
    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        body = self._block(original.body, updated.body)
        return updated if body is None else updated.with_changes(body=body)

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        body = self._block(original.body, updated.body)
        return updated if body is None else updated.with_changes(body=body)

    def _block(self, original: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]):
        out = self.block_edits(original, updated)
        if out is None:
            return None
        flat: List[cst.BaseStatement] = []
        for item in out:
            flat.extend(item.nodes if isinstance(item, cst.FlattenSentinel) else [item])
        return flat

    def block_edits(self, original: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]):
        """``updated`` with each rewritten loop swapped for a ``FlattenSentinel`` and each
        consumer statement for its new form (None: nothing rewritten)."""
        out: List[Union[cst.BaseStatement, cst.FlattenSentinel]] = list(updated)
        changed = False
        for idx, stmt in enumerate(original):
            if isinstance(stmt, cst.For):
                result = self._loop(stmt, idx, original, out)
                changed |= result
        return out if changed else None

    # ---------------------------------------------------------------- one loop
    def _skip(self, node: cst.For, reason: str) -> bool:
        self.sites.append(self.make_site(node, SKIPPED, reason))
        return False

    def _loop(self, loop: cst.For, idx: int, block: Sequence[cst.BaseStatement], out: list) -> bool:
        if any(self.guards):
            return False  # original code kept under another rewrite's guard
        stmts = flat_body(loop.body)
        if stmts is None:
            return False
        accs = [_accumulation(s) for s in stmts]
        if not any(accs):
            return False  # not a reduction loop: nothing to report
        if all(a is None or a.kind == "append" for a in accs) and any(
            a is None and _carries(s) for s, a in zip(stmts, accs)
        ):
            return False  # a recurrence collecting its values (vectorize.recurrence's loop): not a sum
        if not self._reduction_like(accs):
            return False  # collects values nothing reduces, counts, builds strings: not reported
        bad = next((s for s, a in zip(stmts, accs) if a is None), None)
        reason = early_exit_reason(loop.body)
        if reason:
            return self._skip(loop, reason)
        if bad is not None:  # temporaries (or something else): a per-sample loss loop, or why not
            return rewrite_loss_loop(self, loop, idx, block, out, stmts)
        accs_: List[_Acc] = [a for a in accs if a is not None]
        targets = [a.name for a in accs_]
        if len(set(targets)) != len(targets):
            return self._skip(loop, "the body accumulates into the same name twice")
        if len(stmts) == 1:  # acc += p.pow(2).sum() * c over m.parameters(): see param_penalty
            done = try_penalty(self, loop, idx, out, accs_[0])
            if done is not None:
                return done
        header = parse_header(loop, self.builtin_ok, self.ctx.imports)
        if isinstance(header, str):  # e.g. `for (log_prob, value), R in zip(...)`: the loss-loop path
            return rewrite_loss_loop(self, loop, idx, block, out, stmts)
        if set(targets) & set(header.names):
            return self._skip(loop, "the body accumulates into a loop variable")
        if names_read(loop.iter) & set(targets):
            return self._skip(loop, "the loop header reads an accumulator")
        forbidden = set(header.names) | set(targets)  # a range index may appear only as X[i]
        for acc in accs_:
            analysis = ElementwiseExpr(self.ctx.imports, header.element, forbidden)
            why = analysis.check(acc.expr)
            if why:  # .item(), a per-sample loss, .detach()...: the loss-loop path, or why not
                return rewrite_loss_loop(self, loop, idx, block, out, stmts)
            acc.analysis = analysis
        for src in header.sources.values():
            if names_read(src) & set(targets):
                return self._skip(loop, "an iterated sequence is also accumulated into")
        scope = self.scopes[-1]
        if read_elsewhere(scope, loop, header.names):  # the loss-loop path binds them as the last iteration does
            return rewrite_loss_loop(self, loop, idx, block, out, stmts)
        if declares_global(scope, targets + header.names):
            return self._skip(loop, "an accumulator or loop variable is declared global/nonlocal")
        for acc in accs_:
            if acc.kind == "append":
                why = self._consumer(acc, loop, idx, block, scope)
                if why:
                    return self._skip(loop, why)
        if len({(frozenset(a.analysis.keys), len(a.analysis.invariants)) for a in accs_}) > 1:
            # results of different ranks (one reads a [T] sequence, another a [T, 3] one): the
            # aligned batches would give the first [T, 1]; the loss-loop path fits each result
            return rewrite_loss_loop(self, loop, idx, block, out, stmts)
        return self._emit(loop, idx, header, accs_, out)

    def _reduction_like(self, accs: Sequence[Optional[_Acc]]) -> bool:
        """Whether the loop sums something (a term that is not a constant, string or display) or
        appends to a list that a stack/cat/sum/mean reduces somewhere in the scope. Other loops
        (a batch collected for ``torch.tensor(L)``, ``n += 1``, ``s += f"..."``) are no candidates."""
        lists: Set[str] = set()
        for acc in accs:
            if acc is None:
                continue
            if acc.kind == "append":
                lists.add(acc.name)
            elif not _cst_trivial(acc.expr):
                return True
        if not lists:
            return False
        scope = self.scopes[-1] if self.scopes else self.ctx.module
        key = id(scope)
        if key not in self._reduced:
            self._reduced[key] = (scope, _cst_reduced_lists(scope, self.ctx.imports, self.builtin_ok))
        return bool(lists & self._reduced[key][1])

    def _consumer(self, acc: _Acc, loop: cst.For, idx: int, block, scope) -> Optional[str]:
        name = acc.name
        init = next((j for j in range(idx - 1, -1, -1) if name in names_read(block[j])), None)
        why = empty_list_init(block[init], name) if init is not None else empty_list_init(cst.Pass(), name)
        if why:
            return why
        readers = read_only_uses(scope, name, self.ctx.imports, self.builtin_ok)
        found = None
        for after in (j for j in range(idx + 1, len(block)) if name in names_read(block[j])):
            stmt = block[after]
            if not isinstance(stmt, cst.SimpleStatementLine):
                return f"`{name}` is next used in a compound statement"
            found = self._find_consumer(stmt, name)
            if found is not None:
                break
            if reads_outside(stmt, name, readers):  # not only len(L), stack(L)...
                return (f"`{name}` is used after the loop other than by a stack/cat/sum/mean reduction "
                        f"(or len({name}), which the rewrite keeps)")
        if found is None:
            return f"`{name}` is not reduced after the loop in the same block"
        call, kind = found
        ignore: List[cst.CSTNode] = [call]
        if (
            len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Assign)
            and [t.target.value for t in stmt.body[0].targets if isinstance(t.target, cst.Name)] == [name]
            and len(stmt.body[0].targets) == 1
        ):
            ignore.extend(block[after + 1 :])  # `L = torch.stack(L).sum()`: later reads see the new value
        if read_elsewhere(scope, loop, [name], also=ignore):
            if read_elsewhere(scope, loop, [name], also=ignore + list(readers)):
                return (f"`{name}` is used elsewhere besides its one reduction (understood besides it: "
                        f"len({name}), torch.stack/cat({name}), sum({name}))")
            acc.keep_list = True  # the batched branch fills it too (see kept_lists)
        acc.consumer, acc.consumer_kind, acc.consumer_index, acc.consumer_stmt = call, kind, after, stmt
        return None

    def _find_consumer(self, stmt: cst.SimpleStatementLine, name: str) -> Optional[Tuple[cst.Call, str]]:
        finder = _Consumer(name, self.ctx.imports, self.builtin_ok)
        stmt.visit(finder)
        return finder.found[0] if finder.found else None  # others: read_only_uses (the list is then kept)

    # ---------------------------------------------------------------- emission
    def _emit(self, loop: cst.For, idx: int, header: LoopHeader, accs: List[_Acc], out: list) -> bool:
        ctx = self.ctx
        code = ctx.module.code_for_node
        keys: List[str] = []
        invariants: List[cst.BaseExpression] = []
        for acc in accs:
            assert acc.analysis is not None
            for k in acc.analysis.keys:
                if k not in keys:
                    keys.append(k)
            for inv in acc.analysis.invariants:
                if not any(inv.deep_equals(e) for e in invariants):
                    invariants.append(inv)
        names = {k: ctx.imports.unique_name(f"_sb_{_sanitize(k)}") for k in keys}
        batch = ctx.imports.unique_name("_sb_batch")
        seqs = [code(header.sources[k]) for k in keys]
        acc_args = [a.name for a in accs if a.kind != "append"]
        # torch.cat of 0-d elements raises: the guard then declines so that the loop raises too
        min_ndim = 1 if any(a.kind == "append" and "cat" in a.consumer_kind for a in accs) else 0
        # builtin sum() adds the values one by one, as an accumulator does (16-bit: declined)
        running = ", running=True" if any(a.kind == "append" and a.consumer_kind == "builtin_sum" for a in accs) else ""

        def tup(items: List[str]) -> str:
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")" if items else "()"

        if header.mode == "range":
            helper = ctx.runtime_name(f"{RUNTIME}.batch_range", "_sb_batch_range")
            call = f"{helper}({code(header.range_call)}, {tup(seqs)}, {tup([code(i) for i in invariants])}, {tup(acc_args)}, (), {min_ndim}{running})"
        else:
            helper = ctx.runtime_name(f"{RUNTIME}.batch_zip", "_sb_batch_zip")
            call = f"{helper}({tup(seqs)}, {tup([code(i) for i in invariants])}, {tup(acc_args)}, (), {min_ndim}{running})"
        fast: List[str] = [f"{', '.join(names[k] for k in keys)}{',' if len(keys) == 1 else ''} = {batch}"]
        slow: List[str] = []
        replacements: List[Tuple[int, cst.Call, str]] = []
        exactness = EXACT
        what: List[str] = []
        for acc in accs:
            assert acc.analysis is not None
            value = "(" + code(acc.analysis.batched(acc.expr, names)) + ")"
            if acc.kind == "append":
                v = ctx.imports.unique_name(f"_sb_{_sanitize(acc.name)}")
                fast.append(f"{v} = {value}")
                if acc.keep_list:
                    fast.append(f"{acc.name}.extend({v}.unbind(0))")
                slow.append(f"{v} = None")
                original = code(acc.consumer)
                reduced = reduced_text(v, acc.consumer_kind, acc.keep_list)
                replacements.append((acc.consumer_index, acc.consumer, f"({reduced} if {v} is not None else {original})"))
                if acc.consumer_kind in ("stack", "cat"):
                    if not acc.analysis.exact:
                        exactness = REASSOCIATED
                    what.append(f"{acc.name} → batched {acc.consumer_kind}")
                else:
                    exactness = REASSOCIATED
                    what.append(f"{acc.name} → one {'mean' if 'mean' in acc.consumer_kind else 'sum'}")
            else:
                exactness = REASSOCIATED
                total = f"{value}.sum(0)"
                if acc.kind == "aug":
                    fast.append(f"{acc.name} {acc.op}= {total}")
                elif acc.kind == "assign_left":
                    fast.append(f"{acc.name} = {acc.name} {acc.op} {total}")
                else:
                    fast.append(f"{acc.name} = {total} + {acc.name}")
                what.append(f"{acc.name} {acc.op}= one sum")
        # Build: batch = helper(...); if batch is not None: fast... else: slow...; original loop
        assign = parse_statement(f"{batch} = {call}\n")
        fast_block = [parse_statement(line + "\n") for line in fast]
        slow_block = [parse_statement(line + "\n") for line in slow] + [out[idx].with_changes(leading_lines=())]
        if_stmt = cst.If(
            test=parse_expression(f"{batch} is not None"),
            body=cst.IndentedBlock(body=fast_block),
            orelse=cst.Else(body=cst.IndentedBlock(body=slow_block)),
        )
        out[idx] = cst.FlattenSentinel([assign.with_changes(leading_lines=loop.leading_lines), if_stmt])
        for j, node, text in replacements:
            out[j] = out[j].deep_replace(self._find_same(out[j], node), parse_expression(text))
        detail = "; ".join(what)
        if exactness == EXACT:
            reason = f"one batched element-wise evaluation: {detail}; same ops per element; {BATCH_GUARD_NOTE}"
        else:
            reason = f"one batched element-wise evaluation: {detail} ({TOLERANCE}); {BATCH_GUARD_NOTE}"
        self.sites.append(self.make_site(loop, REWRITTEN, reason, exactness, also=consumer_statements(accs)))
        return True

    @staticmethod
    def _find_same(stmt: cst.CSTNode, target: cst.CSTNode) -> cst.CSTNode:
        """The node under ``stmt`` that is ``target`` or deep-equals it (first in pre-order)."""
        finder = _Same(target)
        stmt.visit(finder)
        return finder.found[0]


class _Consumer(cst.CSTVisitor):
    """:meth:`_Rewriter._find_consumer`'s visit: the reductions of the list ``name`` (module-level:
    a class made per call is a cycle that stays alive, with what it holds, until a garbage
    collection)."""

    def __init__(self, name: str, imports, builtin_ok) -> None:
        super().__init__()
        self.name, self.imports, self.builtin_ok = name, imports, builtin_ok
        self.found: List[Tuple[cst.Call, str]] = []

    def is_list(self, arg: cst.Arg) -> bool:
        return arg.keyword is None and not arg.star and isinstance(arg.value, cst.Name) and arg.value.value == self.name

    def stack_or_cat(self, node: cst.BaseExpression) -> Optional[str]:
        if not isinstance(node, cst.Call):
            return None
        qual = self.imports.qualify(node.func)
        if qual not in ("torch.stack", "torch.cat", "torch.concat", "torch.concatenate"):
            return None
        args = list(node.args)
        if not args or not self.is_list(args[0]):
            return None
        rest = args[1:]
        if len(rest) > 1:
            return None
        if rest:
            dim = rest[0]
            if dim.star or (dim.keyword is not None and dim.keyword.value != "dim"):
                return None
            if not (isinstance(dim.value, cst.Integer) and dim.value.value == "0"):
                return None
        return "stack" if qual == "torch.stack" else "cat"

    def visit_Call(self, node: cst.Call) -> Optional[bool]:
        # torch.stack(L).sum() / .mean()
        if (
            isinstance(node.func, cst.Attribute)
            and node.func.attr.value in ("sum", "mean")
            and not node.args
            and self.stack_or_cat(node.func.value)
        ):
            cat = self.stack_or_cat(node.func.value) == "cat"
            self.found.append((node, node.func.attr.value + ("_cat" if cat else "")))
            return False
        qual = self.imports.qualify(node.func)
        if qual in ("torch.sum", "torch.mean") and len(node.args) == 1 and node.args[0].keyword is None and self.stack_or_cat(node.args[0].value):
            cat = self.stack_or_cat(node.args[0].value) == "cat"
            self.found.append((node, qual.split(".")[1] + ("_cat" if cat else "")))
            return False
        if (
            isinstance(node.func, cst.Name)
            and node.func.value == "sum"
            and self.builtin_ok("sum")
            and len(node.args) == 1
            and self.is_list(node.args[0])
        ):
            self.found.append((node, "builtin_sum"))
            return False
        kind = self.stack_or_cat(node)
        if kind:
            self.found.append((node, kind))
            return False
        return True


class _Same(cst.CSTVisitor):
    """:meth:`_Rewriter._find_same`'s visit (module-level, as :class:`_Consumer`)."""

    def __init__(self, target: cst.CSTNode) -> None:
        super().__init__()
        self.target = target
        self.found: List[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.found:
            return False
        if node is self.target or node.deep_equals(self.target):
            self.found.append(node)
            return False
        return True


class VectorizeReduction(Transform):
    id = ID
    version = "9"  # 9: a name bound earlier in the body and rebound from itself (`p = new[i:j]; p = p.view(...)`) is "bound twice", not said to carry a value from one iteration to the next; 8: a kept list's stack/cat stand-in is a copy (an in-place write to it showed in the list); 7: lists also read by len() / a second reduction kept (kept_lists); 6: penalties summed over m.parameters() (param_penalty); 5: lists created by one tuple assignment / on one line (a, b = [], []); 4: pure calls in range bounds, star imports
    triggers = ("for ",)
    description = "element-wise accumulation loops → one batched reduction (guarded)"

    EXAMPLES = EXAMPLES

    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        # Candidates are found on the shared ast: a loop whose flat body accumulates, outside the
        # guards of earlier rewrites. None: libcst is never touched. Otherwise the libcst module is
        # parsed once and only the blocks that hold a candidate are analysed, in the order a full
        # transformer pass would take them (inner blocks first: names are allocated in that order).
        astmts, parents = ast_statements(ctx.tree.body)
        builtin_ok = builtin_checker(ctx.tree)
        reduced: Dict[int, Set[str]] = {}  # per scope (function or module): lists a reduction reads

        def reduction_like(loop: ast.stmt) -> bool:  # _Rewriter._reduction_like on the ast
            lists: Set[str] = set()
            for s in loop.body:
                if not _ast_accumulation(s):
                    continue
                term = _ast_term(s)
                if term is None:
                    lists.add(s.value.func.value.id)  # L.append(x)
                elif not _ast_trivial(term):
                    return True
            if not lists:
                return False
            scope = parents.get(loop)
            while scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scope = parents.get(scope)
            root = scope if scope is not None else ctx.tree
            if id(root) not in reduced:
                reduced[id(root)] = _ast_reduced_lists(root, ctx.imports, builtin_ok)
            return bool(lists & reduced[id(root)])

        candidates = [
            i
            for i, st in enumerate(astmts)
            if isinstance(st, (ast.For, ast.AsyncFor))
            and ast_is_flat(st.body)
            and any(_ast_accumulation(s) for s in st.body)
            and not ast_guarded(st, parents, ctx.imports)
            and reduction_like(st)
        ]
        if not candidates:
            return None, []
        module = ctx.module_for([astmts[i] for i in candidates])  # only their top-level statements parsed
        sites: List[Site] = []
        statements = CstStatements(module)
        if not statements.matches(astmts):  # the trees do not pair up (never seen): the full pass
            return ctx.whole_module().visit(_Rewriter(ctx, sites)), sites
        spans = {  # the loops', and the statements after them whose reductions a rewrite changes
            statements.stmts[i]: (st.lineno, st.end_lineno or st.lineno) for i, st in enumerate(astmts)
        }
        blocks = {statements.parent[statements.stmts[i]] for i in candidates}
        rewriter = _Rewriter(ctx, sites, spans)
        replacements: Dict[cst.CSTNode, Union[cst.CSTNode, cst.FlattenSentinel]] = {}
        for block in statements.blocks:
            if block not in blocks:
                continue
            rewriter.scopes = [statements.scope(block)]
            rewriter.guards = [statements.guarded(block, ctx.imports)]
            body = block.body
            out = rewriter.block_edits(body, body)
            if out is not None:
                replacements.update((old, new) for old, new in zip(body, out) if new is not old)
        if not replacements:
            return None, sites
        return replace_nodes(module, replacements, statements.parent), sites
