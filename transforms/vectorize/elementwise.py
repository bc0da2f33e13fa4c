"""Replace element-by-element index loops and comprehensions with slice expressions.

``for i in range(n): out[i] = f(a[i], b[i], c)`` and ``torch.stack([f(x) for x in xs])`` run one
tiny op per element per operation; the rewrite evaluates ``f`` once on batched tensors:
``out[0:n] = f(a[0:n], b[0:n], c)``. Each element goes through the same operations in the same
order, so the values are bitwise the same (``exact``) when ``f`` uses only correctly rounded
operations (+ - * /, sqrt, abs, clamp, min/max...); transcendental functions (exp, tanh...)
may round differently in vectorized kernels (``reassociated``).

Static checks: no loop-carried dependence (``f`` does not read any output, reads only the current
element of each sequence), no early exit, nothing but element-wise assignments in the body, the
index is not read after the loop. Run-time guards (``scalebox_cst.runtime.loop_batch``): tensors
of one floating dtype and device, in-range indices, outputs that share no memory with inputs;
otherwise the original loop (or comprehension) runs, verbatim.
"""
from __future__ import annotations

import ast
import re
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

import libcst as cst

from scalebox_cst.report import EXACT, REASSOCIATED, REWRITTEN, SKIPPED, Site

from ..analysis.cstclone import parse_expression, parse_statement
from ..base import FileContext, Transform
from .scatter import with_index_add_loops
from ..analysis.bodies import early_exit_reason, flat_body
from ..analysis.reads import read_elsewhere
from ..analysis.purity import is_simple_ref
from ..analysis.scopes import declares_global
from ..analysis.loops import BATCH_GUARD_NOTE, is_runtime_guard, LoopHeader, parse_header, parse_iteration
from ..analysis.statements import ast_guarded, ast_is_flat, ast_statements, CstStatements
from ..analysis.elementwise import ElementwiseExpr
from ..analysis.shape import structure_key
from ..analysis.rewriting import replace_nodes, ScopedRewriter
from .elementwise_examples import EXAMPLES

ID = "vectorize.elementwise"
RUNTIME = "scalebox_cst.runtime.loop_batch"
INEXACT_NOTE = "vectorized transcendental kernels may differ from per-element ones by a few ulp"
JOINERS = frozenset({"torch.stack", "torch.cat", "torch.concat", "torch.concatenate"})
#: the last word of a joiner's qualified name: the call spells it (``th.cat``) or the import that
#: binds the call's alias does (``from torch import cat as join``)
_JOINER_WORDS = frozenset({"stack", "cat", "concat", "concatenate"})
_GAP = r"(?:\s|\\\n|#[^\n]*)"  # what may separate tokens inside brackets
#: after the called name: ``(``, maybe more ``(``, then the ``[`` of the first argument
_OPENS_LIST = re.compile(_GAP + r"*\((?:" + _GAP + r"|\()*\[")
_AS_ALIAS = re.compile(_GAP + r"+as" + _GAP + r"+(\w+)")
_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


def _sanitize(key: str) -> str:
    return re.sub(r"\W+", "_", key).strip("_") or "x"


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _ast_loop_candidate(loop: ast.stmt) -> bool:
    """Whether :meth:`_Rewriter.leave_For` may report ``loop``: a flat ``range`` loop that assigns
    ``X[i]`` for a name ``i`` its target binds (a superset: libcst then decides)."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)) or not loop.body or not ast_is_flat(loop.body):
        return False
    it = loop.iter
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"):
        return False
    bound = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    for stmt in loop.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Subscript):
            index = stmt.targets[0].slice
            if isinstance(index, ast.Tuple) and len(index.elts) == 1:  # x[i,]: one libcst element
                index = index.elts[0]
            if isinstance(index, ast.Starred):
                index = index.value
            if isinstance(index, ast.Name) and index.id in bound:
                return True
    return False


def _words(code: str, words) -> List[Tuple[str, int]]:
    """Each whole identifier of ``code`` that contains one of ``words``, with where it ends."""
    found: Dict[int, str] = {}
    for w in words:
        pos = code.find(w)
        while pos != -1:
            start, end = pos, pos + len(w)
            while start and (code[start - 1].isalnum() or code[start - 1] == "_"):
                start -= 1
            while end < len(code) and (code[end].isalnum() or code[end] == "_"):
                end += 1
            found[end] = code[start:end]
            pos = code.find(w, pos + 1)
    return [(word, end) for end, word in found.items()]


def _joiner_lines(code: str) -> Set[int]:
    """Lines where a joiner (or an imported alias of one) is called with ``[`` first: every
    candidate call spans one of them. Plain text, so also a few that are not calls."""
    if "stack" not in code and "cat" not in code:  # concat, concatenate contain "cat"
        return set()
    names = set(_JOINER_WORDS)
    hits = [(word, end) for word, end in _words(code, ("stack", "cat")) if word in _JOINER_WORDS]
    for _, end in hits:
        alias = _AS_ALIAS.match(code, end)
        if alias:
            names.add(alias.group(1))
    aliases = names - _JOINER_WORDS
    if aliases:
        hits = [(word, end) for word, end in _words(code, ("stack", "cat", *aliases)) if word in names]
    return {code.count("\n", 0, end) + 1 for _, end in hits if _OPENS_LIST.match(code, end)}


def _ast_joiner_calls(stmts: Sequence[ast.stmt], lines: Set[int], ctx: FileContext) -> Dict[int, List[ast.Call]]:
    """``torch.stack/cat([... for ...])`` calls, by the index of the statement whose own
    expressions (not those of nested statements) hold them, in source order. Only statements
    that span one of ``lines`` are searched."""
    found: Dict[int, List[ast.Call]] = {}
    if not lines:
        return found
    for i, st in enumerate(stmts):
        first = min([st.lineno] + [d.lineno for d in getattr(st, "decorator_list", ())])
        last = st.end_lineno or st.lineno
        if not any(first <= line <= last for line in lines):
            continue
        todo = [c for c in ast.iter_child_nodes(st) if not isinstance(c, ast.stmt)]
        while todo:
            n = todo.pop()
            if (
                isinstance(n, ast.Call)
                and n.args
                and isinstance(n.args[0], ast.ListComp)
                and ctx.imports.qualify(n.func) in JOINERS
            ):
                found.setdefault(i, []).append(n)
            todo.extend(c for c in ast.iter_child_nodes(n) if not isinstance(c, ast.stmt))
    for calls in found.values():
        calls.sort(key=lambda c: (c.lineno, c.col_offset))
    return found


def _is_joiner_call(node: cst.Call, imports) -> bool:
    """libcst side of :func:`_ast_joiner_calls`: the calls :meth:`_Rewriter.leave_Call` reports."""
    args = node.args
    return (
        bool(args)
        and args[0].keyword is None
        and not args[0].star
        and isinstance(args[0].value, cst.ListComp)
        and imports.qualify(node.func) in JOINERS
    )


class _CallFinder(cst.CSTVisitor):
    """The joiner calls in one statement's own expressions, each with the nodes that hold it."""

    def __init__(self, root: cst.CSTNode, imports) -> None:
        super().__init__()
        self.root = root
        self.imports = imports
        self.stack: List[cst.CSTNode] = []
        self.found: List[Tuple[cst.Call, List[cst.CSTNode]]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if node is not self.root and isinstance(node, (cst.BaseSuite, cst.If)):
            return False  # nested statements (an elif too) are statements of their own
        if isinstance(node, cst.Call) and _is_joiner_call(node, self.imports):
            self.found.append((node, list(self.stack)))
        self.stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if self.stack and self.stack[-1] is original_node:
            self.stack.pop()


def _index_assign(stmt: cst.BaseSmallStatement, index: str) -> Optional[Tuple[cst.BaseExpression, cst.BaseExpression]]:
    """``OUT[i] = E`` → (OUT, E)."""
    if not (isinstance(stmt, cst.Assign) and len(stmt.targets) == 1):
        return None
    target = stmt.targets[0].target
    if (
        isinstance(target, cst.Subscript)
        and len(target.slice) == 1
        and isinstance(target.slice[0].slice, cst.Index)
        and isinstance(target.slice[0].slice.value, cst.Name)
        and target.slice[0].slice.value.value == index
    ):
        return target.value, stmt.value
    return None


class _Rewriter(ScopedRewriter):
    """Rewrites loops (``leave_For``) and joined comprehensions (``leave_Call``). Run as a
    transformer over the whole module (the fallback) or driven node by node by
    :meth:`VectorizeElementwise.rewrite`, which sets ``scopes``, ``guards`` and
    ``_comprehensions`` and gives the nodes' lines in ``spans``."""

    transform_id = ID

    def __init__(self, ctx: FileContext, sites: List[Site], spans: Optional[Dict[cst.CSTNode, Tuple[int, int]]] = None) -> None:
        super().__init__(ctx, sites, spans)
        self._comprehensions = 0  # enclosing comprehensions: no := there

    def visit_ListComp(self, node) -> None:
        self._comprehensions += 1

    def leave_ListComp(self, original, updated):
        self._comprehensions -= 1
        return updated

    def visit_SetComp(self, node) -> None:
        self._comprehensions += 1

    def leave_SetComp(self, original, updated):
        self._comprehensions -= 1
        return updated

    def visit_DictComp(self, node) -> None:
        self._comprehensions += 1

    def leave_DictComp(self, original, updated):
        self._comprehensions -= 1
        return updated

    def visit_GeneratorExp(self, node) -> None:
        self._comprehensions += 1

    def leave_GeneratorExp(self, original, updated):
        self._comprehensions -= 1
        return updated

    def _site(self, node: cst.CSTNode, action: str, reason: str, exactness: Optional[str] = None) -> None:
        self.sites.append(self.make_site(node, action, reason, exactness))

    def _invariant_args(self, analyses: Sequence[ElementwiseExpr]) -> List[str]:
        out: List[cst.BaseExpression] = []
        for a in analyses:
            for inv in a.invariants:
                if not any(inv.deep_equals(e) for e in out):
                    out.append(inv)
        return [_code(e) for e in out]

    @staticmethod
    def _tuple(items: List[str]) -> str:
        if not items:
            return "()"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"

    # ---------------------------------------------------------------- for i in range(n): out[i] = E
    def visit_IfExp(self, node: cst.IfExp) -> None:
        self.guards.append(is_runtime_guard(node.test, self.ctx.imports))

    def leave_IfExp(self, original: cst.IfExp, updated: cst.IfExp) -> cst.IfExp:
        self.guards.pop()
        return updated

    def leave_For(self, original: cst.For, updated: cst.For) -> Union[cst.For, cst.FlattenSentinel]:
        if any(self.guards):
            return updated  # original code kept under another rewrite's guard
        stmts = flat_body(original.body)
        if stmts is None or not stmts:
            return updated
        header = parse_header(original, self.builtin_ok, self.ctx.imports)
        index = header.names[0] if isinstance(header, LoopHeader) and header.mode == "range" else None
        pairs = [_index_assign(s, index) if index else None for s in stmts]
        if not any(pairs):
            if isinstance(original.iter, cst.Call) and isinstance(original.iter.func, cst.Name) and original.iter.func.value == "range":
                # a range loop writing out[i]: report why it is not one
                target = original.target
                if isinstance(target, cst.Name) and any(_index_assign(s, target.value) for s in stmts):
                    self._site(original, SKIPPED, header if isinstance(header, str) else "not an element-wise loop")
            return updated
        assert isinstance(header, LoopHeader)
        why = early_exit_reason(original.body)
        if why:
            self._site(original, SKIPPED, why)
            return updated
        bad = next((s for s, p in zip(stmts, pairs) if p is None), None)
        if bad is not None:
            self._site(original, SKIPPED, f"the body also runs `{_code(bad).strip()}`, which is not an element-wise assignment")
            return updated
        outs = [p[0] for p in pairs if p is not None]
        if not all(is_simple_ref(o) for o in outs):
            self._site(original, SKIPPED, "an output is not a plain name/attribute")
            return updated
        # outputs, elements and invariants compared as code, layout aside (``s . a`` is ``s.a``)
        out_keys = [structure_key(o) for o in outs]
        if len(set(out_keys)) != len(out_keys):
            self._site(original, SKIPPED, "the body writes the same output twice")
            return updated
        analyses: List[ElementwiseExpr] = []
        for _, expr in pairs:  # type: ignore[misc]
            analysis = ElementwiseExpr(self.ctx.imports, header.element, set(header.names))
            reason = analysis.check(expr)
            if reason is None and {structure_key(header.sources[k]) for k in analysis.keys} & set(out_keys):
                reason = "the body reads an output it writes (possible loop-carried dependence)"
            if reason is None and any(structure_key(inv) in out_keys for inv in analysis.invariants):
                reason = "the body reads an output it writes (possible loop-carried dependence)"
            if reason:
                self._site(original, SKIPPED, reason)
                return updated
            analyses.append(analysis)
        live = read_elsewhere(self.scopes[-1], original, header.names)
        if live:
            self._site(original, SKIPPED, f"the loop index {', '.join(sorted(live))} may be read outside the loop")
            return updated
        if declares_global(self.scopes[-1], header.names):
            self._site(original, SKIPPED, "the loop index is declared global/nonlocal (code elsewhere may read it)")
            return updated
        return self._emit_loop(original, updated, header, outs, pairs, analyses)

    def _emit_loop(self, original, updated, header: LoopHeader, outs, pairs, analyses) -> cst.FlattenSentinel:
        ctx = self.ctx
        keys: List[str] = []
        for a in analyses:
            keys.extend(k for k in a.keys if k not in keys)
        names = {k: ctx.imports.unique_name(f"_sb_{_sanitize(k)}") for k in keys}
        batch = ctx.imports.unique_name("_sb_batch")
        rows = ctx.imports.unique_name("_sb_rows")
        helper = ctx.runtime_name(f"{RUNTIME}.batch_range", "_sb_batch_range")
        seqs = [_code(header.sources[k]) for k in keys]
        call = (
            f"{helper}({_code(header.range_call)}, {self._tuple(seqs)}, {self._tuple(self._invariant_args(analyses))}, "
            f"(), {self._tuple([_code(o) for o in outs])}, 0, True)"
        )
        unpack = ", ".join([names[k] for k in keys] + [rows])
        fast = [f"{unpack} = {batch}"]
        for out, (_, expr), analysis in zip(outs, pairs, analyses):
            fast.append(f"{_code(out)}[{rows}] = {_code(analysis.batched(expr, names))}")
        exact = all(a.exact for a in analyses)
        if_stmt = cst.If(
            test=parse_expression(f"{batch} is not None"),
            body=cst.IndentedBlock(body=[parse_statement(line + "\n") for line in fast]),
            orelse=cst.Else(body=cst.IndentedBlock(body=[updated.with_changes(leading_lines=())])),
        )
        assign = parse_statement(f"{batch} = {call}\n").with_changes(leading_lines=updated.leading_lines)
        what = ", ".join(f"{_code(o)}[...]" for o in outs)
        if exact:
            self._site(original, REWRITTEN, f"one slice assignment per output ({what}); same ops per element; {BATCH_GUARD_NOTE}", EXACT)
        else:
            self._site(original, REWRITTEN, f"one slice assignment per output ({what}); {INEXACT_NOTE}; {BATCH_GUARD_NOTE}", REASSOCIATED)
        return cst.FlattenSentinel([assign, if_stmt])

    # ---------------------------------------------------------------- torch.stack([E for x in xs])
    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if any(self.guards):
            return updated
        qual = self.ctx.imports.qualify(original.func)
        if qual not in ("torch.stack", "torch.cat", "torch.concat", "torch.concatenate"):
            return updated
        args = list(original.args)
        if not args or args[0].keyword is not None or args[0].star or not isinstance(args[0].value, cst.ListComp):
            return updated
        comp = args[0].value
        kind = "stack" if qual == "torch.stack" else "cat"
        rest = args[1:]
        # what the elements are is checked first: a comprehension of model or method calls
        # (SB3's torch.stack([d.entropy() for d in dists], dim=1)) is no candidate whatever the
        # dimension, and its reason should say so
        fo = comp.for_in
        if fo.inner_for_in is not None or fo.ifs or fo.asynchronous is not None:
            self._site(original, SKIPPED, "the comprehension has several for clauses or a filter")
            return updated
        header = parse_iteration(fo.target, fo.iter, self.builtin_ok, self.ctx.imports)
        if isinstance(header, str):
            self._site(original, SKIPPED, header)
            return updated
        analysis = ElementwiseExpr(self.ctx.imports, header.element, set(header.names))
        if analysis.item_of_element(comp.elt):  # torch.cat([traj[k] for traj in trajs]): a gather
            self._site(original, SKIPPED, f"each element contributes `{_code(comp.elt)}`, an item of it, with nothing "
                                          f"computed: torch.{kind} of the comprehension already is one call (nothing to batch)")
            return updated
        reason = analysis.check(comp.elt)
        if reason:
            self._site(original, SKIPPED, reason)
            return updated
        if len(rest) > 1 or (
            rest
            and (
                rest[0].star
                or (rest[0].keyword is not None and rest[0].keyword.value != "dim")
                or not (isinstance(rest[0].value, cst.Integer) and rest[0].value.value == "0")
            )
        ):
            self._site(original, SKIPPED, f"torch.{kind} over a dimension other than 0")
            return updated
        if self._comprehensions:
            self._site(original, SKIPPED, "inside another comprehension (no room for the guard's :=)")
            return updated
        return self._emit_comp(original, updated, header, analysis, comp, kind)

    def _emit_comp(self, original, updated, header: LoopHeader, analysis: ElementwiseExpr, comp, kind) -> cst.BaseExpression:
        ctx = self.ctx
        batch = ctx.imports.unique_name("_sb_batch")
        names = {k: f"{batch}[{i}]" for i, k in enumerate(analysis.keys)}
        seqs = [_code(header.sources[k]) for k in analysis.keys]
        invs = self._tuple(self._invariant_args([analysis]))
        min_ndim = 1 if kind == "cat" else 0
        if header.mode == "range":
            helper = ctx.runtime_name(f"{RUNTIME}.batch_range", "_sb_batch_range")
            call = f"{helper}({_code(header.range_call)}, {self._tuple(seqs)}, {invs}, (), (), {min_ndim})"
        else:
            helper = ctx.runtime_name(f"{RUNTIME}.batch_zip", "_sb_batch_zip")
            call = f"{helper}({self._tuple(seqs)}, {invs}, (), (), {min_ndim})"
        value = _code(analysis.batched(comp.elt, names))
        shape = ".contiguous()" if kind == "stack" else ".contiguous().flatten(0, 1)"
        text = f"(({value}){shape} if ({batch} := {call}) is not None else {_code(updated)})"
        if analysis.exact:
            self._site(original, REWRITTEN, f"torch.{kind} of an element-wise comprehension → one batched expression; same ops per element; {BATCH_GUARD_NOTE}", EXACT)
        else:
            self._site(original, REWRITTEN, f"torch.{kind} of an element-wise comprehension → one batched expression; {INEXACT_NOTE}; {BATCH_GUARD_NOTE}", REASSOCIATED)
        return parse_expression(text)


class VectorizeElementwise(Transform):
    id = ID
    version = "4"  # 4: per-row scatter_add_ / scatter_ / index_copy_ loops reported; 3: pure calls in range bounds (analysis.purity), star imports resolved
    triggers = ("for ",)
    description = "element-wise index loops and stacked comprehensions → slice expressions (guarded)"

    EXAMPLES = EXAMPLES

    @with_index_add_loops
    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        # Candidates are found on the shared ast: flat range loops that assign X[i], and joined
        # list comprehensions (searched for only in statements on a line where the text calls a
        # joiner with a list). None: libcst is never touched. Otherwise the libcst module is
        # parsed once and only the candidates are analysed, in the order a full transformer pass
        # would leave them (names are allocated in that order); only the nodes on the way to an
        # edit are rebuilt.
        astmts, parents = ast_statements(ctx.tree.body)
        loops = [
            i for i, st in enumerate(astmts) if _ast_loop_candidate(st) and not ast_guarded(st, parents, ctx.imports)
        ]
        calls = _ast_joiner_calls(astmts, _joiner_lines(ctx.code), ctx)
        if not loops and not calls:
            return None, []
        module = ctx.module_for([astmts[i] for i in (*loops, *calls)])  # only their top-level statements parsed
        sites: List[Site] = []
        statements = CstStatements(module)
        work = self._pair(ctx, astmts, statements, loops, calls)
        if work is None:  # the trees do not pair up (never seen): the full pass
            return ctx.whole_module().visit(_Rewriter(ctx, sites)), sites
        spans = {node: (a.lineno, a.end_lineno or a.lineno) for _, a, node, _ in work}
        rewriter = _Rewriter(ctx, sites, spans)
        replacements: Dict[cst.CSTNode, Union[cst.CSTNode, cst.FlattenSentinel]] = {}
        parent = dict(statements.parent)
        for _, _, node, holders in work:
            if isinstance(node, cst.For):
                rewriter.guards = [statements.guarded(node, ctx.imports)]
                rewriter.scopes = [statements.scope(node)]
                rewriter._comprehensions = 0
                new = rewriter.leave_For(node, node)
            else:
                root = holders[0]
                rewriter.guards = [
                    statements.guarded(root, ctx.imports)
                    or any(
                        isinstance(h, (cst.If, cst.IfExp)) and is_runtime_guard(h.test, ctx.imports) for h in holders
                    )
                ]
                rewriter._comprehensions = sum(isinstance(h, _COMPREHENSIONS) for h in holders)
                new = rewriter.leave_Call(node, node)
                for up, down in zip(holders, holders[1:] + [node]):
                    parent[down] = up
            if new is not node:
                replacements[node] = new
        if not replacements:
            return None, sites
        return replace_nodes(module, replacements, parent), sites

    @staticmethod
    def _pair(ctx: FileContext, astmts, statements: CstStatements, loops: List[int], calls: Dict[int, List[ast.Call]]):
        """The candidates as (order key, ast node, libcst node, holders), in the order a transformer
        leaves them (by where they end, inner first); None if the trees do not pair up."""
        if not statements.matches(astmts):
            return None
        work = []
        for i in loops:
            a = astmts[i]
            work.append((a, statements.stmts[i], []))
        for i, ast_calls in calls.items():
            finder = _CallFinder(statements.stmts[i], ctx.imports)
            statements.stmts[i].visit(finder)
            if len(finder.found) != len(ast_calls):
                return None
            for a, (node, holders) in zip(ast_calls, finder.found):
                work.append((a, node, holders))
        keyed = [
            ((a.end_lineno, a.end_col_offset, -a.lineno, -a.col_offset), a, node, holders) for a, node, holders in work
        ]
        keyed.sort(key=lambda item: item[0])
        return keyed
