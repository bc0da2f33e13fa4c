"""The ``grad_clip`` transform: scan the module's scopes, decide each optimizer step in turn
(:mod:`.pairing`, :mod:`.window`, :mod:`.guard`), then insert every planned line in one libcst pass.

With nothing to insert, libcst is never needed (the file is not parsed with it); the scan reads
the pipeline's shared ``ast`` of this version, read only.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from scalebox_cst.report import REWRITTEN, SKIPPED, WARNING, Site

from ..base import FileContext, Transform
from .events import Event, ModuleScan
from .examples import EXAMPLES
from .guard import Aliases, guard_lines
from .insert import InsertBefore, cst_line
from .options import ID, Options
from .pairing import pair
from .steps import describe_step
from .window import clip_warnings, read_window


@dataclasses.dataclass
class _Pass:
    """One rewrite of one module: what it has found and planned so far."""

    ctx: FileContext
    opts: Options
    mod: ModuleScan
    aliases: Aliases
    sites: List[Site] = dataclasses.field(default_factory=list)
    #: libcst line -> small-statement index -> the statements to insert before it
    plans: Dict[cst.CSTNode, Dict[int, List[str]]] = dataclasses.field(default_factory=dict)
    #: ids of the compound libcst nodes on the way to a planned line
    path: Set[int] = dataclasses.field(default_factory=set)
    #: ids of the misplaced clips already warned about
    warned: Set[int] = dataclasses.field(default_factory=set)
    #: (step, the lines to insert before it), in the order decided
    planned: List[Tuple[Event, List[str]]] = dataclasses.field(default_factory=list)
    #: the other array library the module uses instead of torch (ImportMap.other_framework)
    other: Optional[str] = None


class GradClip(Transform):
    id = ID
    version = "5"  # 5: an item read by a string key is named by the key (critic["optimizer"]); 3: modules of another array library (jax, warp...) left alone; 4: steps through a property
    triggers = ("backward",)
    description = ("Guard each optimizer's step(): skip non-finite, clip spikes, change nothing else "
                   "(or clip to a fixed max_norm)")

    EXAMPLES = EXAMPLES

    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        opts = Options.read(ctx)
        run = _Pass(ctx, opts, ModuleScan(ctx.tree, ctx.imports, ctx.code), Aliases(ctx), other=ctx.imports.other_framework())
        for events in run.mod.scopes:
            for ev in events:
                if ev.kind == "step":
                    describe_step(ctx.code, run.mod, ev)
            for s, step in enumerate(events):
                self._decide(run, events, s, step)
        if not run.planned:
            return None, run.sites  # nothing to insert: libcst is not needed (no parse)
        # only the top-level statements holding a planned line are parsed (ctx.module_for)
        module = ctx.module_for([step.stmt for step, _ in run.planned])
        for step, texts in run.planned:
            line, index = cst_line(module, step.loc, step.stmt, run.path)
            run.plans.setdefault(line, {}).setdefault(index, []).extend(texts)
        return module.visit(InsertBefore(run.plans, run.path)), run.sites

    @staticmethod
    def _decide(run: _Pass, events: List[Event], s: int, step: Event) -> None:
        ctx = run.ctx

        def site(node, action, reason, exactness=None):
            run.sites.append(Site(ID, node.lineno, node.end_lineno or node.lineno, action, reason, exactness))

        found = pair(ctx.code, events, s, step)
        if found is None:
            return
        stmt = step.stmt if step.loc is not None else step.call
        if isinstance(found, str):
            site(stmt, SKIPPED, found)
            return
        read = _property_read(run.mod.properties, step.opt_text)
        if read is not None:
            site(stmt, SKIPPED, f"{step.opt_text}: {read} is a property of a class in this file, and a guard would run "
                                "its code once more each step; not clipped")
            return
        for node, warning in clip_warnings(ctx, found, step, run.opts, run.warned):
            site(node, WARNING, warning)
        window = read_window(ctx, run.mod, found, step, run.opts)
        if isinstance(window, str):
            site(stmt, SKIPPED, window)
            return
        if run.other is not None:  # skrl's Warp agents: warp_nn's Adam, stepped after tape.backward()
            site(stmt, SKIPPED, f"{step.opt_text}'s step: the module imports {run.other}, not torch (no torch optimizer to guard)")
            return
        texts, reason, exactness = guard_lines(ctx, run.opts, run.aliases, step, found, window)
        run.planned.append((step, texts))
        site(stmt, REWRITTEN, reason, exactness)


def _property_read(properties, text: Optional[str]) -> Optional[str]:
    """The first attribute of ``text`` (``self.agent.optimizer``, ``a.opts[0]``) that a class of
    the module defines as a property: the guard names the optimizer by that text, a second read."""
    if not properties or not text:
        return None
    return next((part for part in re.split(r"[^\w]+", text)[1:] if part in properties), None)
