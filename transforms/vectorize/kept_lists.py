"""Lists a rewritten loop still fills: reads of the list besides its one batched reduction.

``losses.append(f(x))`` in a loop, then ``torch.stack(losses).sum()``, is rewritten with the
reduction taken over the batched values. When the list is also read elsewhere (its length logged,
a second reduction ``torch.stack(losses).mean()``), the rewrite still fills it, in the batched
branch, with the rows of the batched values (``losses.extend(v.unbind(0))``: the same values,
shapes and dtypes, views of one tensor instead of separate ones, gradients flowing through the
unbind). That is only the same program where the other reads cannot tell views from separate
tensors: :func:`read_only_uses` accepts ``len(L)``, ``torch.stack(L, ...)``,
``torch.cat(L, ...)`` and the builtin ``sum(L)``, which read the elements and write nothing
(an in-place op on an element would raise on an unbind view where the loop's did not).

Where the list is kept, the batched stand-in for ``torch.stack(L)`` / ``torch.cat(L)`` is a copy
(:func:`reduced_text`): ``torch.stack`` returns a tensor of its own, and the batched values are
what the kept list's rows view, so an in-place write to the stacked result (``s.mul_(2)``) would
otherwise show in the list and in every later reduction of it.
"""
from __future__ import annotations

from typing import Iterator, List, Set, cast

import libcst as cst

from ..analysis.cstwalk import instances

_READERS = ("torch.stack", "torch.cat", "torch.concat", "torch.concatenate")


def reduced_text(var: str, kind: str, keep_list: bool) -> str:
    """What stands for the reduction ``kind`` of a list whose batched values are ``var`` (``[n,
    ...]``). ``stack`` / ``cat`` give a new tensor in the original: with the list kept (its rows
    views of ``var``) the batched form is copied too, else ``var`` itself (nothing else reads it)."""
    own = ".clone()" if keep_list else ""  # clone() of a contiguous tensor is contiguous
    return {
        "sum": f"{var}.sum()",
        "mean": f"{var}.mean()",
        "sum_cat": f"{var}.sum()",
        "mean_cat": f"{var}.mean()",
        "builtin_sum": f"{var}.sum(0)",
        "stack": f"{var}.contiguous(){own}",
        "cat": f"{var}.contiguous().flatten(0, 1){own}",
    }[kind]


def read_only_uses(scope: cst.CSTNode, name: str, imports, builtin_ok) -> List[cst.Call]:
    """The calls under ``scope`` that read the list ``name`` only (see the module docstring), in
    no promised order: callers take them as a set."""
    found: List[cst.Call] = []

    def is_list(arg: cst.Arg) -> bool:
        return arg.keyword is None and not arg.star and isinstance(arg.value, cst.Name) and arg.value.value == name

    for node in cast(Iterator[cst.Call], instances(scope, (cst.Call,))):  # every call, in no promised order (read as a set)
        if not node.args or not is_list(node.args[0]):
            continue
        if isinstance(node.func, cst.Name) and node.func.value in ("len", "sum") and len(node.args) == 1 \
                and builtin_ok(node.func.value):
            found.append(node)
        elif imports.qualify(node.func) in _READERS and not any(a.star for a in node.args):
            found.append(node)
    return found


def reads_outside(node: cst.CSTNode, name: str, readers: List[cst.Call]) -> bool:
    """Whether ``node`` reads ``name`` anywhere but under one of ``readers``."""
    finder = _ReadOutside(name, {id(r) for r in readers})
    node.visit(finder)
    return finder.found


class _ReadOutside(cst.CSTVisitor):
    """:func:`reads_outside`' visit (module-level: a class made per call is a cycle that stays alive, with what it holds, until a garbage collection)."""

    def __init__(self, name: str, skip: Set[int]) -> None:
        super().__init__()
        self.name, self.skip = name, skip
        self.found = False

    def on_visit(self, n: cst.CSTNode) -> bool:
        if self.found or id(n) in self.skip:
            return False
        if isinstance(n, cst.Attribute):  # x.name is not a read of name
            n.value.visit(self)
            return False
        if isinstance(n, cst.Name) and n.value == self.name:
            self.found = True
        return True
