"""Time indexed in the middle (pymarl's ``ret[:, t]``, torchrl's ``reward[..., t, :]``, ``x[:, t, 0]``):
the loop read through time-major views of the arrays it indexes that way.

Where the time index sits in a subscript fixes the dimension it walks: after ``k`` leading full
slices it is dimension ``k``; after an ellipsis it counts from the end (``x[..., t, :]`` walks
dimension -2). ``x[<slices>, t, <rest>]`` is ``v[t, <rest>]`` for ``v = x.movedim(d, 0)``, the same
elements in the same order with the same shape (``movedim`` keeps the order of the other
dimensions), and writes through ``v`` land in ``x``. So the loop is analysed as if it indexed
``v`` at ``[t]`` (trailing full slices dropped, integer indices kept), and every per-step value
keeps the shape the loop's slice had: the broadcasting of the steps' values against each other
(time-major rows aligned by ``seqs_of``) is the loop's. The guard binds each view with
``dim1`` / ``dim_view`` (None, which it declines, for anything but a tensor or ndarray with the
dimensions the subscript needs, so the loop raises as written) and checks each view's length
along time against the loop's as for any per-step input.
"""
from __future__ import annotations

import dataclasses
import types
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import libcst as cst

from ...base import FileContext
from ...names import dotted
from .syntax import _bound_names, _code, _head, _names_read, _norm, _one_line, _pure_container, Skip, _of_type, _walk
from .headers import Header
from .unpack import split_unpacking


def _is_full_slice(el: cst.SubscriptElement) -> bool:
    sl = el.slice
    return isinstance(sl, cst.Slice) and sl.lower is None and sl.upper is None and sl.step is None


def _is_ellipsis(el: cst.SubscriptElement) -> bool:
    return isinstance(el.slice, cst.Index) and isinstance(el.slice.value, cst.Ellipsis) and el.slice.star is None


def _is_int(el: cst.SubscriptElement) -> bool:
    v = el.slice.value if isinstance(el.slice, cst.Index) and el.slice.star is None else None
    if isinstance(v, cst.UnaryOperation) and isinstance(v.operator, cst.Minus):
        v = v.expression
    return isinstance(v, cst.Integer)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where one subscript puts time: dimension ``dim`` (negative: from the end), the subscript
    needing ``ndim`` dimensions; ``ints``: the integer indices right after the time index (they
    index the dimensions after time: part of the view, ``dim_view(x, dim, ndim, ints)``)."""
    dim: int
    ndim: int
    time: int  # position of the time index among the subscript's elements
    ints: Tuple[int, ...]
    plain: bool  # ``x[:, t]``: what ``dim1`` has always handled


def _layout(node: cst.Subscript, t: str) -> Optional[Layout]:
    """The layout of ``x[<full slices or one ellipsis>, <index reading t>, <ints>, <full slices>]``
    (or a trailing ellipsis instead of the trailing full slices) when something precedes the
    time index or a full slice / ellipsis follows it; None for any other subscript."""
    els = list(node.slice)
    reading = [i for i, el in enumerate(els) if t in _names_read(el.slice)]
    if len(reading) != 1:
        return None
    k = reading[0]
    if not isinstance(els[k].slice, cst.Index) or els[k].slice.star is not None:
        return None
    lead, rest = els[:k], els[k + 1:]
    ell = [i for i, el in enumerate(lead) if _is_ellipsis(el)]
    if len(ell) > 1 or not all(_is_full_slice(el) or _is_ellipsis(el) for el in lead):
        return None
    ints: List[int] = []
    i = 0
    while i < len(rest) and _is_int(rest[i]):
        v = rest[i].slice.value
        ints.append(-int(v.expression.value, 0) if isinstance(v, cst.UnaryOperation) else int(v.value, 0))
        i += 1
    tail = rest[i:]
    trailing_ellipsis = bool(tail) and _is_ellipsis(tail[-1]) and not ell
    if trailing_ellipsis:
        tail = tail[:-1]
    if not all(_is_full_slice(el) for el in tail):
        return None
    if not lead and not tail and not trailing_ellipsis:
        return None  # x[t] / x[t, i]: time first, handled without a view
    after = len(ints) + len(tail)  # dimensions consumed after time
    if ell:
        dim = -(after + 1)
        ndim = len(lead) - 1 + 1 + after
    else:
        dim = len(lead)
        ndim = len(lead) + 1 + after
    # the loop's slice of an array with fewer dimensions than the view needs raises or (numpy:
    # an ellipsis over nothing) gives 0-d arrays where the rewrite gives scalars: 2 at least
    ndim = max(ndim, 2)
    plain = len(lead) == 1 and not ell and not tail and not trailing_ellipsis and not ints
    return Layout(dim, ndim, k, tuple(ints), plain)


@dataclasses.dataclass(frozen=True)
class View:
    """A time-major view the guard binds: ``name = dim_view(code, dim, ndim, ints)``."""
    name: str
    code: str
    dim: int
    ndim: int
    plain: bool  # every subscript was ``x[:, t]``: bound by ``dim1`` (the form's first output)
    ints: Tuple[int, ...] = ()
    texts: Mapping[str, str] = dataclasses.field(default_factory=dict)  # view text -> the user's text

    def __iter__(self):  # (name, code), as the views were first described
        return iter((self.name, self.code))

    def call(self, helpers: str) -> str:
        if self.plain:
            return f"{helpers}.dim1({self.code})"
        ints = f", ({', '.join(map(str, self.ints))},)" if self.ints else ""
        return f"{helpers}.dim_view({self.code}, {self.dim}, {self.ndim}{ints})"


def spelled(text: str, views: Sequence[View]) -> str:
    """``text`` (a pattern or a skip reason) with the views' subscripts in the user's spelling:
    the views' names are the engine's own, not in the user's code."""
    import re

    for v in views:
        if v.plain:  # x_t[i] is x[:, i] in the user's text
            text = re.sub(rf"(?<![\w.]){re.escape(v.name)}\[", f"{v.code}[:, ", text)
        else:
            for new, old in sorted(v.texts.items(), key=lambda kv: -len(kv[0])):
                text = text.replace(new, old)
        text = re.sub(rf"(?<![\w.]){re.escape(v.name)}(?![\w])", v.code, text)  # a bare view: the array
    return text


def describe(kinds: str, views: Sequence[View]) -> Tuple[str, str]:
    """The site's pattern text with the views' subscripts in the user's spelling, and the shape
    note (``time along dimension 1, ``)."""
    kinds = spelled(kinds, views)
    dims = sorted({v.dim for v in views}, key=lambda d: (d < 0, abs(d)))
    if not dims:
        return kinds, ""
    if dims == [1]:
        return kinds, "time along dimension 1, "
    return kinds, "time along dimension " + ", ".join(
        f"{d}" + (" (from the end)" if d < 0 else "") for d in dims) + ", "


def _time_views(ctx: FileContext, node: cst.For, header: Header) -> Optional[Tuple[cst.For, List[View]]]:
    """The loop with ``x[<slices>, t + k, <ints>, <slices>]`` read as ``x_t[t + k, <ints>]``,
    ``x_t`` the time-major view the guard binds (and tuple assignments split, :mod:`.unpack`); the
    first, last and else-branch loops keep the original text. None when the loop is read as
    written; Skip when a container is also used otherwise (two names for one memory), along two
    dimensions, or rebound in the loop."""
    original = node
    split = split_unpacking(node)  # a, b = x[:, t], y[:, t]: one assignment per name for the analysis
    if header.kind != "index":
        return (split, []) if split is not node else None
    node = split
    t = header.index
    found: Dict[str, cst.BaseExpression] = {}
    dims: Dict[str, int] = {}
    ndims: Dict[Tuple[str, Tuple[int, ...]], int] = {}
    plain: Dict[Tuple[str, Tuple[int, ...]], bool] = {}
    for n in _of_type(node.body, cst.Subscript):  # (the body's walk by node type: cstwalk.typed)
        if not _pure_container(n.value):
            continue
        lay = _layout(n, t)  # type: ignore[arg-type]
        if lay is None:
            continue
        key = _norm(n.value)
        found.setdefault(key, n.value)
        if dims.setdefault(key, lay.dim) != lay.dim:
            raise Skip(f"`{_code(n.value).strip()}` is indexed with time along two dimensions "
                       f"({dims[key]} and {lay.dim})")
        vk = (key, lay.ints)  # x[:, t, 0] and x[:, t, 1]: two views (the ints index the dims after time)
        ndims[vk] = max(ndims.get(vk, 2), lay.ndim)
        plain[vk] = plain.get(vk, True) and lay.plain
    if not found:
        return (node, []) if split is not original else None
    bound = _bound_names(node.body)
    views: Dict[Tuple[str, Tuple[int, ...]], View] = {}
    for key, cont in found.items():
        where = f"dimension {dims[key]}" + (" (counted from the end)" if dims[key] < 0 else "")
        if _head(cont) in bound:
            raise Skip(f"`{_code(cont).strip()}` is indexed along {where} and reassigned in the loop")
    for (key, ints), nd in ndims.items():
        # ``x[:, t]`` alone: bound by ``dim1``, the form's first output
        label = f"{key.split('.')[-1]}_t" + "".join(f"_{i}".replace("-", "m") for i in ints)
        views[(key, ints)] = View(ctx.imports.unique_name(label), _code(found[key]).strip(), dims[key], nd,
                                  plain[(key, ints)], ints)

    texts: Dict[str, Dict[str, str]] = {v.name: {} for v in views.values()}  # filled as the subscripts are rewritten

    new = node.with_changes(body=node.body.visit(_Sub(found, t, views, texts)))
    left = _names_read(new.body)
    chains = {dotted(n) for n in _walk(new.body) if isinstance(n, cst.Attribute)}
    for key, cont in found.items():
        if (key in left) if isinstance(cont, cst.Name) else (key in chains):
            where = f"dimension {dims[key]}" + (" (counted from the end)" if dims[key] < 0 else "")
            raise Skip(f"`{_code(cont).strip()}` is indexed along {where} and also otherwise")
    # handed on frozen: each view with its texts read-only
    return new, [dataclasses.replace(v, texts=types.MappingProxyType(texts[v.name])) for v in views.values()]


class _Sub(cst.CSTTransformer):
    """:func:`_time_views`' pass: each time-indexed subscript read through its view (at module
    level: see body._Resolve)."""

    def __init__(self, found, t, views, texts) -> None:
        super().__init__()
        self.found, self.t, self.views, self.texts = found, t, views, texts

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript) -> cst.BaseExpression:
        if not _pure_container(updated.value) or _norm(updated.value) not in self.found:
            return updated
        lay = _layout(updated, self.t)
        if lay is None:
            return updated
        view = self.views[(_norm(updated.value), lay.ints)]
        rest = [updated.slice[lay.time].with_changes(comma=cst.MaybeSentinel.DEFAULT)]
        new = cst.Subscript(value=cst.Name(view.name), slice=rest, lpar=updated.lpar, rpar=updated.rpar)
        self.texts[view.name][_one_line(new)] = _one_line(original)
        return new
