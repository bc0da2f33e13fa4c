"""The vectorize.recurrence transform: cheap ast pre-filter, then each backward loop recognised,
planned and emitted (single-loop recurrences) or handed to :mod:`.quadratic` (double loops).
Every loop that walks backward over a sequence gets a site (:mod:`.backward` says which do and
why one that is no candidate is left alone), ``while`` loops counting down included.
"""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple, Union

import libcst as cst

from scalebox_cst.textlines import physical_lines
from scalebox_cst.report import EXACT, REASSOCIATED, REWRITTEN, SKIPPED, Site

from ...base import FileContext, Transform
from ...analysis.bodies import trailing_lines
from ...analysis.scopes import builtin_checker
from .syntax import _BUILTINS, Skip
from .headers import _backward_header, _named_range_ast, _named_range_header, _walks_backward, hoist_zip
from .views import _time_views, spelled
from .candidates import _forward_memory, _loose_candidate
from . import backward as bw
from .loops import _GUARD_CALLS, _ast_bound_of, _kept_loops, _replace_statements, _statement_fors
from .analysis import Analysis, analyse
from .build import build, HELPERS_QUALNAME, OP_QUALNAME
from .unswitch import unswitch
from . import quadratic
from .examples import EXAMPLES


ID = "vectorize.recurrence"


class VectorizeRecurrence(Transform):
    id = ID
    version = "14"  # 14: the op is imported as _linear_recurrence (a star import of the module hands it out no more), and where two or more ways end with steps to run as written one loop runs them (`left`); 13: a value carried through memory and read back is quoted as one span (`x[i] = ...; y = x[i]`), not a quote in a quote; 12: an unswitched loop tests no_steps(T), which the run's site counts do not count; 11: backslash continuation lines of the body move with their statements; 10: out[t] += v outputs; 9: range(T)[::-1], sorted(range(T), reverse=True), zip of pure call chains
    #: a backward ``for`` header has one of these (``arange(`` has ``range(``); "while " lets a file
    #: whose only backward loop counts down in a ``while`` be reported (:meth:`rewrite` then scans
    #: only the ``while`` statements: about 0.05 s on 50k lines, the loop pre-filter about 0.3 s)
    FOR_TRIGGERS = ("reversed(", "::-", "-1, -1", "-1,-1", "range(", "flip")
    triggers = (*FOR_TRIGGERS, "while ")
    description = "Backward linear recurrences (GAE, discounted returns) -> one linear_recurrence call, guarded."

    EXAMPLES = EXAMPLES

    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        whiles = [Site(ID, w.lineno, w.end_lineno or w.lineno, SKIPPED, bw.while_reason(w))
                  for w in bw.backward_whiles(ctx.tree, ctx.code)]
        if not any(t in ctx.code for t in self.FOR_TRIGGERS):
            return None, whiles
        new, sites = self._rewrite_fors(ctx)
        return new, sorted(sites + whiles, key=lambda s: (s.line, s.end_line))

    def _rewrite_fors(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        # Cheap first: the stdlib ast (shared by all transforms) says which loops are worth a look
        # and gives their lines; libcst (parsed only now, and walked over statement lists only) is
        # needed just for the loops that are. None: unchanged.
        ast_before: dict = {}
        ast_loops = list(_statement_fors(ctx.tree.body, ast, ast_before))
        sites: List[Site] = []
        backward: List[int] = []
        quad: Set[int] = set()
        lines = physical_lines(ctx.code) if ast_loops else []

        def may_nest(n: Union[ast.For, ast.AsyncFor]) -> bool:
            """Text pre-filter for quadratic.candidate (a walk of each loop): an inner ``for`` over
            ``range`` is spelled in the loop's lines (non-ASCII ones may normalise to it)."""
            text = "".join(lines[n.lineno - 1 : n.end_lineno or n.lineno])
            return not text.isascii() or (text.count("for") >= 2 and "range" in text)

        for i, n in enumerate(ast_loops):
            span = (n.lineno, n.end_lineno or n.lineno)
            if may_nest(n) and quadratic.candidate(n):
                quad.add(i)
                backward.append(i)
                continue
            reason = None
            if not _walks_backward(n) and not _named_range_ast(n, ast_before.get(id(n))):
                if bw.walks_backward(n.iter) or bw.named_walks_backward(n, ast_before.get(id(n))):
                    backward.append(i)  # a backward walk no header parser knows: reported below
                    continue
                reason = _forward_memory(n)
                if reason is None:
                    continue
            if reason is not None:
                sites.append(Site(ID, span[0], span[1], SKIPPED, reason))
            else:
                backward.append(i)
        if not backward:
            return None, sites
        # libcst parses only the top-level statements holding a backward loop (ctx.module_for:
        # the whole module where a loop's scope is the module's)
        module = ctx.module_for([ast_loops[i] for i in backward])
        cst_before: dict = {}
        cst_loops = list(_statement_fors(module.body, cst, cst_before))
        held = [i for i, n in enumerate(ast_loops) if ctx.parsed(n)]
        if len(cst_loops) != len(held):  # pragma: no cover - the two parsers agree on statements
            return None, sites
        cst_of = dict(zip(held, cst_loops))
        # builtins the module rebinds, or a star import binds or may (scopes.BuiltinChecker)
        checker = builtin_checker(ctx.tree)
        wanted = (*_BUILTINS, *quadratic.BUILTINS)  # only these of the bound names are used below
        bound = _ast_bound_of(ctx.tree, wanted)
        bound |= {b for b in wanted if b not in bound and not checker(b)}
        shadowed = bound & set(_BUILTINS)
        # kept loops sit under a guard whose test names one of these (its code is part of the
        # module's): without one in the text, the walk (a codegen per ``if`` test) finds none
        ours = _kept_loops(module) if any(g in ctx.code for g in _GUARD_CALLS) else set()
        reassociate = bool(ctx.option("vectorize.recurrence", "reassociate", True))
        replace: Dict[cst.For, cst.CSTNode] = {}
        for done, i in enumerate(backward):
            ctx.step(done, len(backward), "backward loops")  # a progress line on long files
            node = cst_of[i]
            # the loop's lines, with the blank and comment lines libcst keeps at the end of its last
            # block (a rewrite writes them after the loop it keeps as the fallback: they move)
            span = (ast_loops[i].lineno, (ast_loops[i].end_lineno or ast_loops[i].lineno) + trailing_lines(node))
            if node in ours:
                continue

            def site(action: str, reason: str, exactness: Optional[str] = None, details=None) -> Site:
                return Site(ID, span[0], span[1], action, reason, exactness, details=details)

            if i in quad:
                try:
                    replace[node], reason = quadratic.rewrite_loop(
                        ctx, node, bound & set(quadratic.BUILTINS), reassociate,
                        HELPERS_QUALNAME, OP_QUALNAME)
                except Skip as exc:
                    sites.append(site(SKIPPED, str(exc)))
                except Exception as exc:  # an analysis bug must not cost the user the other rewrites
                    sites.append(site(SKIPPED, f"not analysed ({type(exc).__name__}: {exc})"))
                else:
                    sites.append(site(REWRITTEN, reason, REASSOCIATED, {"exactness": quadratic.TOLERANCE}))
                continue
            header = _backward_header(node, shadowed) or _named_range_header(node, cst_before.get(id(node)), shadowed)
            original, hoist = node, None
            if header is None:  # zip(x.cpu().numpy()[::-1], ...): the chain bound to a name first
                hoist = hoist_zip(node, shadowed, ctx.imports, ctx.imports.unique_name)
                header = _backward_header(hoist.node, shadowed) if hoist is not None else None
                node = hoist.node if header is not None else node  # type: ignore[union-attr]
            if header is None:
                n = ast_loops[i]
                if bw.walks_backward(n.iter) or bw.named_walks_backward(n, ast_before.get(id(n))):
                    used = {x.id for x in ast.walk(n.iter) if isinstance(x, ast.Name)}
                    rebound = sorted(shadowed & used) or sorted(shadowed - {"sorted"})  # the header's own first
                    reason = (checker.reason(rebound[0]) or f"{rebound[0]} is rebound in this module") if rebound \
                        else bw.header_reason(node)
                    sites.append(site(SKIPPED, reason))
                continue
            if not _loose_candidate(node, header):
                sites.append(site(SKIPPED, bw.no_carry_reason(node, ctx.imports)))
                continue
            try:  # a loop-invariant `if` in the body: one loop per branch, each planned (see unswitch)
                switched = unswitch(ctx, node, header, reassociate, self.build)
            except Skip as exc:
                sites.append(site(SKIPPED, str(exc)))
                continue
            except Exception as exc:  # an analysis bug must not cost the user the other rewrites
                sites.append(site(SKIPPED, f"not analysed ({type(exc).__name__}: {exc})"))
                continue
            if switched is not None:
                replace[original], exact, reason, branches = switched
                if hoist is not None:
                    replace[original], reason = hoist.wrap(replace[original]), f"{reason}; {hoist.note}"
                sites.append(site(REWRITTEN, reason, EXACT if exact else REASSOCIATED, {"branches": branches}))
                continue
            try:
                viewed = _time_views(ctx, node, header)
            except Skip as exc:
                sites.append(site(SKIPPED, str(exc)))
                continue
            views = viewed[1] if viewed else []
            try:  # the stages: header (above) -> analysis -> plan -> the rewritten statement
                analysis = analyse(ctx, viewed[0] if viewed else node, header, views)
                new, exact, reason = self.build(ctx, node, analysis, reassociate)
            except Skip as exc:
                sites.append(site(SKIPPED, spelled(str(exc), views)))
                continue
            except Exception as exc:  # an analysis bug must not cost the user the other rewrites
                sites.append(site(SKIPPED, f"not analysed ({type(exc).__name__}: {exc})"))
                continue
            replace[original] = new if hoist is None else hoist.wrap(new)
            if hoist is not None:
                reason = f"{reason}; {hoist.note}"
            sites.append(site(REWRITTEN, reason, EXACT if exact else REASSOCIATED))
        if not replace:
            return None, sites

        return _replace_statements(module, replace), sites

    def build(self, ctx: FileContext, node: cst.For, analysis: Analysis, reassociate: bool) -> Tuple[cst.BaseStatement, bool, str]:
        return build(ctx, node, analysis, reassociate)

