"""vectorize.recurrence: backward first-order linear recurrences (GAE, discounted returns) as one op.

RL code computes advantages and returns with a Python loop that walks time backwards carrying one
value, ``s = b_t + a_t * s`` (CleanRL's GAE, SB3's ``compute_returns_and_advantage``, REINFORCE's
``R = r + gamma * R``); at T = 2048 that loop costs milliseconds per update, the runtime op
``linear_recurrence`` microseconds. The recurrence is recognised from the algebra of the loop body
(the carried value must appear affinely), never from variable names.

The rewrite peels the loop: the first step (t = T-1, where CleanRL special-cases the bootstrap
value) and the last step (t = 0) run exactly as written, so every variable the loop leaves behind
keeps its value; the steps in between compute a_t and b_t as array expressions with the same
operation grouping as the body (bitwise-identical elements) and hand them to the op. A run-time
guard (types, dtypes, lengths, devices, aliasing) picks the vectorized branch; the original loop
stays verbatim in the else branch. Quadratic double loops that compute the same sums (each
advantage summed over k >= t) are recognised in ``recurrence_quadratic``.
"""
from __future__ import annotations

import ast
import dataclasses
import re
from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from scalebox_cst.report import EXACT, REASSOCIATED, REWRITTEN, SKIPPED, Site

from .base import Example, FileContext, Transform
from .names import dotted

ID = "vectorize.recurrence"
OP_QUALNAME = "scalebox_cst.runtime.recurrence.linear_recurrence"
HELPERS_QUALNAME = "scalebox_cst.runtime.vectorized"

#: methods that are pure elementwise casts on the arrays the guard admits
_CAST_METHODS = frozenset({"astype", "float", "double"})
_BUILTINS = ("reversed", "range", "zip", "list", "tuple")
#: the operators ``Planner.check`` admits, as rendered
_OP_TEXT = {cst.Add: "+", cst.Subtract: "-", cst.Multiply: "*", cst.Divide: "/", cst.Minus: "-", cst.Plus: "+"}


class Skip(Exception):
    """A candidate loop that cannot be rewritten; the message is the reported reason."""


# --------------------------------------------------------------------------- small helpers


_EMPTY = cst.Module(body=[])


def _code(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


def _one_line(node: cst.CSTNode) -> str:
    return " ".join(_code(node).replace("\\\n", " ").split())


def _norm(node: cst.CSTNode) -> str:
    text = re.sub(r"\s+", "", _code(node))
    while text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        text = text[1:-1]
    return text


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if depth < 0:
            return False
    return depth == 0


def _is_call(node: cst.CSTNode, name: str, nargs: Optional[int] = None) -> bool:
    if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == name):
        return False
    if any(a.keyword is not None or a.star for a in node.args):
        return False
    return nargs is None or len(node.args) == nargs


def _is_int(node: cst.CSTNode, value: int) -> bool:
    return _norm(node) == str(value)


def _pure_container(node: cst.CSTNode) -> bool:
    return dotted(node) is not None  # a Name or an attribute chain (self.buffer.rewards)


def _head(node: cst.CSTNode) -> Optional[str]:
    text = dotted(node)
    return text.split(".")[0] if text else None


_FIELDS: Dict[type, Tuple[str, ...]] = {}


def _kids(n: cst.CSTNode):
    """Child nodes, read straight from the dataclass fields (``visit`` rebuilds every node it
    passes and costs ~50x more on the small expressions analysed here)."""
    names = _FIELDS.get(type(n))
    if names is None:
        names = _FIELDS[type(n)] = tuple(f.name for f in dataclasses.fields(n))
    for name in names:
        v = getattr(n, name)
        if isinstance(v, cst.CSTNode):
            yield v
        elif isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, cst.CSTNode):
                    yield x


def _walk(node: cst.CSTNode):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(_kids(n))


def _names_read(node: cst.CSTNode) -> Set[str]:
    """Names read anywhere under ``node`` (attribute names and keyword names excluded)."""
    found: Set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Name):
            found.add(n.value)
        elif isinstance(n, cst.Attribute):
            stack.append(n.value)
        elif isinstance(n, cst.Arg):
            stack.append(n.value)
        else:
            stack.extend(_kids(n))
    return found


def _bound_names(node: cst.CSTNode) -> Set[str]:
    """Names bound anywhere under ``node`` (assignments, loop targets, defs, imports, walrus)."""
    found: Set[str] = set()

    def targets(t: cst.CSTNode) -> None:
        if isinstance(t, cst.Name):
            found.add(t.value)
        elif isinstance(t, (cst.Tuple, cst.List)):
            for el in t.elements:
                targets(el.value)
        elif isinstance(t, cst.StarredElement):
            targets(t.value)

    for n in _walk(node):
        if isinstance(n, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor, cst.NamedExpr)):
            targets(n.target)
        elif isinstance(n, cst.AsName):
            targets(n.name)
        elif isinstance(n, (cst.FunctionDef, cst.ClassDef)):
            found.add(n.name.value)
        elif isinstance(n, cst.ImportAlias) and n.asname is None:
            found.add(_code(n.name).split(".")[0])
    return found


def _paren(e: cst.BaseExpression) -> cst.BaseExpression:
    return e.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _subst(node: cst.BaseExpression, match, repl: cst.BaseExpression) -> cst.BaseExpression:
    """``node`` with every sub-expression for which ``match(expr)`` holds replaced by ``repl``
    (attribute and keyword names are never touched)."""

    class T(cst.CSTTransformer):
        def on_leave(self, original, updated):
            if isinstance(original, cst.BaseExpression) and match(original):
                return repl
            return updated

        def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
            if match(original):
                return repl
            return updated.with_changes(attr=original.attr)

        def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
            return updated.with_changes(keyword=original.keyword)

    return node.visit(T())  # type: ignore[return-value]


def _stmts(block: cst.BaseSuite) -> Sequence[cst.BaseStatement]:
    return block.body if isinstance(block, cst.IndentedBlock) else [cst.SimpleStatementLine(body=block.body)]


# --------------------------------------------------------------------------- the loop header


@dataclasses.dataclass
class Header:
    kind: str  # "index": for t in reversed(range(T)); "elements": for r in reversed(x)
    index: Optional[str] = None
    T: Optional[cst.BaseExpression] = None
    elements: List[Tuple[str, cst.BaseExpression]] = dataclasses.field(default_factory=list)
    target: Optional[cst.BaseExpression] = None
    sliced: bool = False  # walks x[::-1]
    unpacked: bool = False  # for a, b in x[::-1]: analysed for a reason only, never rewritten
    named: Optional[cst.Name] = None  # for t in steps, steps a materialised backward range


def _reversed_slice(node: cst.CSTNode) -> Optional[cst.BaseExpression]:
    """``x`` for ``x[::-1]``."""
    if not isinstance(node, cst.Subscript) or len(node.slice) != 1:
        return None
    sl = node.slice[0].slice
    if not isinstance(sl, cst.Slice) or sl.lower is not None or sl.upper is not None or sl.step is None:
        return None
    if _norm(sl.step) != "-1" or not _pure_container(node.value):
        return None
    return node.value


def _backward_header(node: cst.For, shadowed: Set[str]) -> Optional[Header]:
    if any(b in shadowed for b in _BUILTINS):
        return None
    it, tgt = node.iter, node.target
    name_tgt = tgt.value if isinstance(tgt, cst.Name) else None
    tuple_tgt: Optional[List[str]] = None
    if isinstance(tgt, (cst.Tuple, cst.List)) and all(isinstance(e.value, cst.Name) for e in tgt.elements):
        tuple_tgt = [e.value.value for e in tgt.elements]  # type: ignore[union-attr]
    if _is_call(it, "reversed", 1):
        inner = it.args[0].value
        if _is_call(inner, "range") and name_tgt:
            args = [a.value for a in inner.args]
            if len(args) == 1:
                return Header("index", index=name_tgt, T=args[0], target=tgt)
            if len(args) == 2 and _is_int(args[0], 0):
                return Header("index", index=name_tgt, T=args[1], target=tgt)
            return None
        if (_is_call(inner, "list", 1) or _is_call(inner, "tuple", 1)) and tuple_tgt:
            z = inner.args[0].value
            if _is_call(z, "zip") and len(z.args) == len(tuple_tgt) and all(_pure_container(a.value) for a in z.args):
                return Header("elements", elements=list(zip(tuple_tgt, [a.value for a in z.args])), target=tgt)
            return None
        if _pure_container(inner) and name_tgt:
            return Header("elements", elements=[(name_tgt, inner)], target=tgt)
        return None
    if _is_call(it, "range", 3) and name_tgt:
        first, stop, step = (a.value for a in it.args)
        if _norm(stop) == "-1" and _norm(step) == "-1" and isinstance(first, cst.BinaryOperation) \
                and isinstance(first.operator, cst.Subtract) and isinstance(first.right, cst.Integer) \
                and not first.lpar:
            k = int(first.right.evaluated_value)
            if k == 1:
                return Header("index", index=name_tgt, T=first.left, target=tgt)
            if k >= 2:  # range(X - k, -1, -1): T = X - k + 1 steps (pymarl: the last step set before)
                return Header("index", index=name_tgt, T=cst.parse_expression(f"{_code(first.left).strip()} - {k - 1}"),
                              target=tgt)
        return None
    base = _reversed_slice(it)
    if base is not None and name_tgt:
        return Header("elements", elements=[(name_tgt, base)], target=tgt, sliced=True)
    if base is not None and tuple_tgt:
        return Header("elements", elements=[(n, base) for n in tuple_tgt], target=tgt, sliced=True, unpacked=True)
    if _is_call(it, "zip") and tuple_tgt and len(it.args) == len(tuple_tgt):
        conts: List[cst.BaseExpression] = []
        sliced = False
        for a in it.args:
            v = a.value
            if _is_call(v, "reversed", 1) and _pure_container(v.args[0].value):
                conts.append(v.args[0].value)
            elif _reversed_slice(v) is not None:
                conts.append(_reversed_slice(v))  # type: ignore[arg-type]
                sliced = True
            else:
                return None
        return Header("elements", elements=list(zip(tuple_tgt, conts)), target=tgt, sliced=sliced)
    return None


# --------------------------------------------------------------------------- body IR


@dataclasses.dataclass
class Item:
    kind: str  # "assign" | "append" | "insert" | "appendleft" | "reset" | "split"
    node: Optional[cst.CSTNode] = None
    var: Optional[str] = None
    outs: List[cst.BaseExpression] = dataclasses.field(default_factory=list)
    value: Optional[cst.BaseExpression] = None
    container: Optional[cst.BaseExpression] = None
    cond: Optional[cst.BaseExpression] = None
    const: Optional[str] = None
    then: List["Item"] = dataclasses.field(default_factory=list)
    other: List["Item"] = dataclasses.field(default_factory=list)
    m_is_then: bool = False
    wrap: bool = False  # lst.append([x]): the value is x, each item a one-element list


_FORBIDDEN_SMALL = {
    cst.Break: "`break` in the loop body",
    cst.Continue: "`continue` in the loop body",
    cst.Return: "`return` in the loop body",
    cst.Raise: "`raise` in the loop body",
    cst.Global: "`global` in the loop body",
    cst.Nonlocal: "`nonlocal` in the loop body",
    cst.Del: "`del` in the loop body",
    cst.Assert: "`assert` in the loop body",
    cst.Import: "an import in the loop body",
    cst.ImportFrom: "an import in the loop body",
    cst.AnnAssign: "an annotated assignment in the loop body",
}


class BodyParser:
    def __init__(self, header: Header) -> None:
        self.h = header

    # ---- the last-step test: t == T - 1 and its spellings
    def lsplit(self, test: cst.BaseExpression) -> Optional[bool]:
        """For a test on t == T-1: True if the other steps take the if-branch, False if they take
        the else-branch; None if ``test`` is not such a test."""
        h = self.h
        if h.kind != "index" or not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
            return None
        left, comp = _norm(test.left), test.comparisons[0]
        right, op = _norm(comp.comparator), comp.operator
        t, T = h.index, _norm(h.T)  # type: ignore[arg-type]
        last = {f"{T}-1"}
        flip = {cst.LessThan: cst.GreaterThan, cst.GreaterThan: cst.LessThan,
                cst.LessThanEqual: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.LessThanEqual}
        kind = type(op)
        if (left == t and right in last) or (left == f"{t}+1" and right == T):
            pass
        elif (right == t and left in last) or (right == f"{t}+1" and left == T):
            kind = flip.get(kind, kind)
        else:
            return None
        if kind is cst.Equal or kind is cst.GreaterThanEqual:
            return False
        if kind is cst.NotEqual or kind is cst.LessThan:
            return True
        return None

    def block(self, stmts: Sequence[cst.BaseStatement]) -> List[Item]:
        items: List[Item] = []
        for st in stmts:
            if isinstance(st, cst.SimpleStatementLine):
                for small in st.body:
                    item = self.small(small)
                    if item is not None:
                        items.append(item)
            elif isinstance(st, cst.If):
                items.append(self.if_(st))
            elif isinstance(st, (cst.For, cst.While)):
                raise Skip("nested loop in the loop body")
            elif isinstance(st, cst.With):
                raise Skip("`with` block in the loop body")
            elif isinstance(st, cst.Try):
                raise Skip("`try` block in the loop body")
            elif isinstance(st, (cst.FunctionDef, cst.ClassDef)):
                raise Skip("a definition in the loop body")
            else:
                raise Skip(f"unsupported statement in the loop body: `{_code(st).strip().splitlines()[0]}`")
        return items

    def if_(self, st: cst.If) -> Item:
        m_then = self.lsplit(st.test)
        if m_then is not None:
            if st.orelse is None or isinstance(st.orelse, cst.If):
                raise Skip("last-step test without a plain `else:` branch")
            return Item("split", node=st, then=self.block(_stmts(st.body)),
                        other=self.block(_stmts(st.orelse.body)), m_is_then=m_then)
        body = _stmts(st.body)
        if st.orelse is None and len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine) \
                and len(body[0].body) == 1 and isinstance(body[0].body[0], cst.Assign):
            asg = body[0].body[0]
            if len(asg.targets) == 1 and isinstance(asg.targets[0].target, cst.Name) and _is_number(asg.value):
                return Item("reset", node=st, var=asg.targets[0].target.value, cond=st.test, const=_code(asg.value))
        raise Skip(f"conditional `if {_code(st.test)}:` in the loop body (only the last-step case "
                   "and an episode reset `if done: s = 0` are understood)")

    def small(self, small: cst.BaseSmallStatement) -> Optional[Item]:
        for kind, reason in _FORBIDDEN_SMALL.items():
            if isinstance(small, kind):
                raise Skip(reason)
        if isinstance(small, cst.Pass):
            return None
        if isinstance(small, cst.AugAssign):
            raise Skip(f"augmented assignment `{_code(small).strip()}` (may update in place)")
        if isinstance(small, cst.Assign):
            var: Optional[str] = None
            outs: List[cst.BaseExpression] = []
            for t in small.targets:
                tg = t.target
                if isinstance(tg, cst.Name):
                    if var is not None:
                        raise Skip("chained assignment to several names")
                    var = tg.value
                elif isinstance(tg, cst.Subscript) and self.is_index_ref(tg) and _pure_container(tg.value):
                    outs.append(tg.value)
                else:
                    raise Skip(f"assigns to `{_code(tg).strip()}` (only names and out[t] are understood)")
            return Item("assign", node=small, var=var, outs=outs, value=small.value)
        if isinstance(small, cst.Expr):
            call = small.value
            if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) \
                    and _pure_container(call.func.value) and not any(a.keyword or a.star for a in call.args):
                meth = call.func.attr.value
                kind = None
                if meth == "append" and len(call.args) == 1:
                    kind, value = "append", call.args[0].value
                elif meth == "insert" and len(call.args) == 2 and _is_int(call.args[0].value, 0):
                    kind, value = "insert", call.args[1].value
                elif meth == "appendleft" and len(call.args) == 1:  # collections.deque (checked at run time)
                    kind, value = "appendleft", call.args[0].value
                if kind is not None:
                    wrap = isinstance(value, cst.List) and len(value.elements) == 1 \
                        and isinstance(value.elements[0], cst.Element)
                    if wrap:  # minimalRL: advantage_lst.append([advantage])
                        value = value.elements[0].value  # type: ignore[union-attr]
                    return Item(kind, node=small, container=call.func.value, value=value, wrap=wrap)
            if isinstance(call, cst.Call):
                raise Skip(f"calls `{_callee(call)}()` in the loop body (unknown side effects)")
            raise Skip(f"expression statement `{_code(call).strip()}` in the loop body")
        raise Skip(f"unsupported statement `{_code(small).strip()}` in the loop body")

    def is_index_ref(self, node: cst.Subscript) -> bool:
        """``x[t]`` exactly."""
        return self.ref_offset(node) == 0

    def ref_offset(self, node: cst.Subscript) -> Optional[int]:
        """k for ``x[t + k]`` (k >= 0), None otherwise."""
        if self.h.kind != "index" or len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
            return None
        idx = node.slice[0].slice.value
        t = self.h.index
        text = _norm(idx)
        if text == t:
            return 0
        m = re.fullmatch(rf"{re.escape(t)}\+(\d+)|(\d+)\+{re.escape(t)}", text)  # type: ignore[arg-type]
        if m:
            return int(m.group(1) or m.group(2))
        return None


def _int_indices(slices: Sequence[cst.SubscriptElement]) -> Optional[Tuple[str, ...]]:
    """The integer literal indices of ``x[i, j]`` as text (``-1`` too), or None."""
    idx: List[str] = []
    for el in slices:
        v = el.slice.value if isinstance(el.slice, cst.Index) and el.slice.star is None else None
        if isinstance(v, cst.UnaryOperation) and isinstance(v.operator, cst.Minus):
            ok = isinstance(v.expression, cst.Integer)
        else:
            ok = isinstance(v, cst.Integer)
        if not ok:
            return None
        idx.append(str(int(_norm(v), 0)))  # type: ignore[arg-type]
    return tuple(idx)


def _is_number(node: cst.BaseExpression) -> bool:
    if isinstance(node, (cst.Integer, cst.Float)):
        return True
    return isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) \
        and isinstance(node.expression, (cst.Integer, cst.Float))


def _callee(call: cst.Call) -> str:
    text = dotted(call.func)
    if text is None and isinstance(call.func, cst.Attribute):
        text = _code(call.func).strip()
    return text or _code(call.func).strip()


def _flatten(items: List[Item], m_case: bool) -> List[Item]:
    """The straight-line body for the middle steps (m_case) or the last step."""
    out: List[Item] = []
    for it in items:
        if it.kind == "split":
            branch = it.then if it.m_is_then == m_case else it.other
            out.extend(_flatten(branch, m_case))
        else:
            out.append(it)
    return out


# --------------------------------------------------------------------------- the plan


@dataclasses.dataclass
class Recurrence:
    var: str
    item: Item
    exact: bool
    a: str
    b: str
    reset: Optional[Item] = None
    pattern: str = ""


class Planner:
    """Analyses one candidate loop (raising Skip) and renders its vectorized branch."""

    def __init__(self, ctx: FileContext, node: cst.For, header: Header, reassociate: bool, cpu: bool = True) -> None:
        self.ctx = ctx
        self.cpu = cpu  # CPU backend: the guard keeps tensors on CPU, where the op is bitwise exact
        self.node = node
        self.h = header
        self.reassociate = reassociate
        self.parser = BodyParser(header)
        self.elements = {name: cont for name, cont in header.elements}
        self.seqs: Dict[str, int] = {}  # container code -> max offset read in the middle steps
        self.seq_nodes: Dict[str, cst.BaseExpression] = {}
        self.conds: Dict[str, int] = {}
        self.consts: Dict[str, None] = {}
        self.scalars: Dict[str, None] = {}
        self.vec_names: Dict[str, str] = {}  # container code -> its array name
        self.cond_names: Dict[str, str] = {}
        self.seq_labels: Dict[str, str] = {}  # container code -> the base of its array names
        self.columns: Dict[str, cst.BaseExpression] = {}  # x_t[i] -> the column node
        self.dropped: Set[int] = set()  # ids of `tmp = out[t + 1]` items the middle steps do without
        self.readback_items: List[Item] = []  # `s = out[t, 0]`: re-run at t = 1 for the last step
        self.read_back_by: Dict[int, List[Item]] = {}  # id of the update -> its read-back items
        self.cells: List[cst.BaseExpression] = []  # outs whose rows must hold one element
        self.forwarded: Dict[int, Tuple[str, Tuple[str, ...]]] = {}  # out[t] read after this step's write
        self.fwd_reads: Dict[str, int] = {}  # out code -> number of column indices of its reads
        self.views: List[Tuple[str, str]] = []  # (name, container): x_t = x.movedim(1, 0), bound by the guard
        self.divides = False
        self.weak_ok = True  # lists of Python numbers next to arrays may be vectorized (see emit)
        self.step_names: Set[str] = set()  # arrays over the middle steps (temporaries, results)
        self.T = ""

    # ---- names
    def fresh(self, base: str) -> str:
        base = re.sub(r"\W", "_", base) or "v"
        return self.ctx.imports.unique_name(base)

    # ---- analysis
    def analyse(self) -> None:
        node = self.node
        if node.orelse is not None:
            raise Skip("the loop has an `else:` clause")
        if node.asynchronous is not None:
            raise Skip("`async for` loop")
        self.items = self.parser.block(_stmts(node.body))
        if self.h.unpacked:
            names = ", ".join(n for n, _ in self.h.elements)
            raise Skip(f"unpacks each element of `{_code(self.node.iter).strip()}` into `{names}` "
                       "(per-step tuples are not vectorized)")
        self.body_assigned = _bound_names(node.body)
        h = self.h
        if h.index in self.body_assigned or any(n in self.body_assigned for n in self.elements):
            raise Skip("the loop assigns its own loop variable")
        bound_by = _names_read(h.T) if h.T is not None else set()
        if h.named is not None:
            bound_by.add(h.named.value)
        for _, cont in h.elements:
            bound_by |= _names_read(cont)
        if bound_by & self.body_assigned:
            raise Skip("the loop bound / sequence is reassigned in the body")
        # containers written by the loop (out[t] = ..., lst.append / insert)
        self.written: Set[str] = set()
        for it in _flatten(self.items, True) + _flatten(self.items, False):
            for o in it.outs:
                self.written.add(_norm(o))
            if it.container is not None:
                self.written.add(_norm(it.container))
        for name, cont in h.elements:
            if _norm(cont) in self.written:
                raise Skip(f"writes `{_code(cont)}`, which it iterates over")
        self.memo: Dict[str, cst.BaseExpression] = {}  # carried value kept in out[t+1]: its name -> out
        self.memo_src: Dict[str, str] = {}
        self.readbacks()
        self.memory_recurrences()
        # every expression in the body, both cases: allowed grammar only
        for it in self._all_items(self.items):
            if id(it) in self.dropped:
                continue
            for expr in self._exprs(it):
                self.check(expr)
        self.middle = self.merge_chained([it for it in _flatten(self.items, True) if id(it) not in self.dropped])
        self.forward_reads()
        self.has_split = any(it.kind == "split" for it in self.items)
        self.dataflow()

    def readbacks(self) -> None:
        """``out[t] = f(s)`` then, later in the step, ``s = out[t, 0]`` (or ``s = out[t]``), with
        ``s`` read by that update alone (Khrylx's ``prev_return = returns[i, 0]``): in the middle
        steps ``s`` is what the previous step stored, ``out[t + 1]``; with one element per row
        (``cells``, checked at run time) the row and its element give the same stored values, so
        the update becomes ``out[t] = f(out[t + 1])``, a recurrence through memory. The read-back
        statement leaves the middle steps and runs once at t = 1 for the last step."""
        top = [it for it in self.items if it.kind == "assign"]
        everything = self._all_items(self.items)
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
            col = self.index_column(v)
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
                    x is not w and x is not r and any(s in _names_read(e) for e in self._exprs(x)) for x in middle):
                continue
            nxt = cst.parse_expression(f"{_code(v.value).strip()}[{t} + 1]")
            w.value = _subst(w.value, lambda e, s=s: isinstance(e, cst.Name) and e.value == s, nxt)  # type: ignore[arg-type]
            self.dropped.add(id(r))
            self.readback_items.append(r)
            self.read_back_by.setdefault(id(w), []).append(r)
            if cells:
                self.cells.append(w.outs[0])

    def forward_reads(self) -> None:
        """Reads of ``out[t]`` / ``out[t, i]`` after this step's write of ``out[t]`` (Khrylx's
        ``deltas[i]``) are reads of what the vectorized write stored: ``out[1:T - 1]``. Any other
        read of a written container at [t] in the middle steps is refused."""
        done: Set[str] = set()
        for it in self.middle:
            for e in self._exprs(it):
                for n in _walk(e):
                    if not isinstance(n, cst.Subscript) or not _pure_container(n.value):
                        continue
                    X = _norm(n.value)
                    if X not in self.written:
                        continue
                    col = self.index_column(n)
                    if self.parser.ref_offset(n) == 0:
                        idx: Tuple[str, ...] = ()
                    elif col is not None and col[1] == 0:
                        idx = col[2]
                    else:
                        continue  # reported by check_subscript / handled as memory
                    writers = [o for o in self._all_items(self.items) if any(_norm(x) == X for x in o.outs)]
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
        everything = [x for x in self._all_items(self.items) if id(x) not in self.dropped]
        middle = [x for x in _flatten(self.items, True) if id(x) not in self.dropped]
        pos = {id(x): i for i, x in enumerate(middle)}
        for it in top:
            if it.var is not None or len(it.outs) != 1:
                continue
            X = _norm(it.outs[0])
            refs: List[Tuple[Item, int]] = []
            for other in everything:
                for e in self._exprs(other):
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
            self.memo_src[name] = _one_line(it.node) + "".join(  # type: ignore[arg-type]
                f" (`{_one_line(o.node)}`)" for o in aliases + self.read_back_by.get(id(it), []))  # type: ignore[arg-type]
            value = _subst(it.value, lambda e: self._is_ref(e, X, 1), cst.Name(name))  # type: ignore[arg-type]
            for o in aliases:
                tmp = o.var
                value = _subst(value, lambda e, tmp=tmp: isinstance(e, cst.Name) and e.value == tmp, cst.Name(name))
                self.dropped.add(id(o))
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
            if x is not it and any(tmp in _names_read(e) for e in self._exprs(x)):
                return False
        return True

    def _is_ref(self, e: cst.CSTNode, X: str, k: int) -> bool:
        return isinstance(e, cst.Subscript) and _pure_container(e.value) and _norm(e.value) == X \
            and self.parser.ref_offset(e) == k

    def _reads_of(self, e: cst.CSTNode, X: str) -> List[int]:
        """Offsets k of every read of ``X[...]`` under ``e`` (-1: not a per-step read)."""
        found: List[int] = []
        for n in _walk(e):
            if isinstance(n, cst.Subscript) and _pure_container(n.value) and _norm(n.value) == X:
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
                raise Skip(f"`{s}` is assigned twice in one step")
            value = _subst(it.value, lambda e: isinstance(e, cst.Name) and e.value == s,  # type: ignore[arg-type]
                           _paren(prev.value))  # type: ignore[arg-type]
            # nothing in between reads s, so the merged update can sit where the last one was
            out.remove(prev)
            out.append(Item("assign", node=it.node, var=s, outs=it.outs, value=value))
        return out

    def _all_items(self, items: List[Item]) -> List[Item]:
        out: List[Item] = []
        for it in items:
            if it.kind == "split":
                out.extend(self._all_items(it.then))
                out.extend(self._all_items(it.other))
            else:
                out.append(it)
        return out

    def _exprs(self, it: Item) -> List[cst.BaseExpression]:
        exprs = [e for e in (it.value,) if e is not None]
        if it.cond is not None:
            c = it.cond
            if isinstance(c, cst.UnaryOperation) and isinstance(c.operator, cst.Not):
                c = c.expression
            exprs.append(c)
        return exprs

    def check(self, e: cst.BaseExpression) -> None:
        """The expression grammar the vectorizer understands (raises Skip with the reason)."""
        if isinstance(e, (cst.Integer, cst.Float)):
            return
        if isinstance(e, cst.Name):
            if self.h.kind == "index" and e.value == self.h.index:
                raise Skip(f"uses the loop index `{e.value}` as a value")
            return
        if isinstance(e, cst.Attribute):
            if _pure_container(e) and _head(e) not in self.body_assigned:
                return
            raise Skip(f"reads attribute `{_code(e).strip()}` of a value computed in the loop")
        if isinstance(e, cst.Subscript):
            self.check_subscript(e)
            return
        if isinstance(e, cst.BinaryOperation):
            if not isinstance(e.operator, (cst.Add, cst.Subtract, cst.Multiply, cst.Divide)):
                raise Skip(f"operator `{_code(e.operator).strip()}` in `{_code(e).strip()}`")
            self.check(e.left)
            self.check(e.right)
            return
        if isinstance(e, cst.UnaryOperation):
            if isinstance(e.operator, (cst.Minus, cst.Plus)):
                self.check(e.expression)
                return
            raise Skip(f"operator `{_code(e.operator).strip()}` in `{_code(e).strip()}`")
        if isinstance(e, cst.IfExp):
            if self.parser.lsplit(e.test) is None:
                raise Skip(f"conditional expression `{_code(e).strip()}`")
            self.check(e.body)
            self.check(e.orelse)
            return
        if isinstance(e, cst.Call):
            f = e.func
            if isinstance(f, cst.Attribute) and f.attr.value in _CAST_METHODS and not any(a.star for a in e.args):
                if f.attr.value == "astype" and len(e.args) != 1:
                    raise Skip(f"call `{_code(e).strip()}`")
                if f.attr.value != "astype" and e.args:
                    raise Skip(f"call `{_code(e).strip()}`")
                for a in e.args:
                    if not (_pure_container(a.value) or isinstance(a.value, cst.SimpleString)):
                        raise Skip(f"call `{_code(e).strip()}`")
                self.check(f.value)
                return
            raise Skip(f"calls `{_callee(e)}()` in the loop body (unknown side effects)")
        if isinstance(e, (cst.Yield, cst.Await)):
            raise Skip("`yield` / `await` in the loop body")
        raise Skip(f"unsupported expression `{_code(e).strip()}`")

    def check_subscript(self, e: cst.Subscript) -> None:
        if self.element_column(e) is not None:  # x_t[0] of a row x_t: a per-step read of x[:, 0]
            return
        base = e.value
        if not _pure_container(base):
            raise Skip(f"indexes `{_code(e).strip()}`")
        if _head(base) in self.body_assigned or _head(base) in self.elements:
            raise Skip(f"indexes `{_code(e).strip()}`, a value computed in the loop")
        k = self.parser.ref_offset(e)
        col = self.index_column(e)
        if k is None and col is not None:
            k = col[1]
        if k is not None:
            if _norm(base) in self.written and k != 0:
                raise Skip(f"reads `{_code(e).strip()}`, which the loop writes (a recurrence through memory)")
            return  # k == 0 of a written container: forward_reads decides
        names: Set[str] = set().union(*(_names_read(s) for s in e.slice))
        if self.h.kind == "index" and self.h.index in names:
            raise Skip(f"indexes `{_code(e).strip()}` (only [t] and [t + k] with k >= 0 are vectorized)")
        if names & self.body_assigned:
            raise Skip(f"indexes `{_code(e).strip()}` with a value computed in the loop")
        if _norm(base) in self.written:
            raise Skip(f"reads `{_code(e).strip()}`, which the loop writes")
        # a loop-invariant read such as next_value[0]

    def dataflow(self) -> None:
        middle = self.middle
        # each write into a list / deque becomes one extend of the whole block: two writes into the
        # same container per step would come out grouped by write, not interleaved by step
        seen: Set[str] = set()
        for it in middle:
            if it.container is not None:
                key = _norm(it.container)
                if key in seen:
                    raise Skip(f"writes into `{_code(it.container).strip()}` twice per step "
                               "(one extend per write would reorder its items)")
                seen.add(key)
        defined: Set[str] = set()
        assign_of: Dict[str, Item] = {}
        pre_reads: Dict[str, List[Item]] = {}
        resets: Dict[str, Item] = {}
        for it in middle:
            if it.kind == "reset":
                if it.var in resets:
                    raise Skip(f"`{it.var}` is reset twice in one step")
                if it.var in defined:
                    raise Skip(f"`{it.var}` is reset after it was assigned in the same step")
                resets[it.var] = it  # type: ignore[index]
                reads = _names_read(it.cond) & self.body_assigned  # type: ignore[arg-type]
            else:
                reads = _names_read(it.value) & self.body_assigned  # type: ignore[arg-type]
            for n in reads:
                if n not in defined:
                    pre_reads.setdefault(n, []).append(it)
            if it.kind == "assign" and it.var is not None:
                if it.var in assign_of:
                    raise Skip(f"`{it.var}` is assigned twice in one step")
                assign_of[it.var] = it
                defined.add(it.var)
        self.assign_of = assign_of
        self.recs: List[Recurrence] = []
        self.shift: Dict[str, Item] = {}
        rec_vars: List[str] = []
        for n, readers in pre_reads.items():
            own = assign_of.get(n)
            if own is None:
                raise Skip(f"`{n}` keeps its value from an earlier step (it is not assigned on every path)")
            if own in readers:
                others = [r for r in readers if r is not own]
                if others:
                    raise Skip(f"the carried value `{n}` is read before its update, outside the update")
                rec_vars.append(n)
            else:
                if not self._shiftable(own):
                    raise Skip(f"`{n}` carries a value from the previous step that is not a plain per-step read")
                self.shift[n] = own
        for n in resets:
            if n not in rec_vars:
                raise Skip(f"`{n}` is reset but it is not a carried recurrence")
        if not rec_vars:
            raise Skip("no value in the loop depends on its own previous value")
        if resets and self.has_split:
            raise Skip("an episode reset together with the last-step special case")
        self.rec_vars = rec_vars
        self.resets = resets
        # post-update reads of a carried value: allowed; pre-update ones were refused above.
        # values read in the middle steps must be computed from per-step reads and invariants
        for it in middle:
            if it.kind == "reset":
                self.check_cond(it.cond)  # type: ignore[arg-type]

    def _reads_written(self, e: cst.BaseExpression) -> bool:
        """``e`` reads (a subscript of) a container the loop writes."""
        written = getattr(self, "written", ())
        return any(isinstance(n, cst.Subscript) and _pure_container(n.value) and _norm(n.value) in written
                   for n in _walk(e))

    def _shiftable(self, it: Item) -> bool:
        if it.outs or it.value is None:
            return False
        if self._reads_written(it.value):
            return False  # what this step stored, carried into the next one
        return not (_names_read(it.value) & self.body_assigned)

    def check_cond(self, cond: cst.BaseExpression) -> None:
        e = cond
        if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Not):
            e = e.expression
        if self.per_step(e) is None:
            raise Skip(f"episode reset on `{_code(cond).strip()}` (only a per-step value or `not` one)")

    def per_step(self, e: cst.BaseExpression) -> Optional[Tuple[cst.BaseExpression, int]]:
        """(container, k) when ``e`` reads x[t + k] (an element of an iterated sequence: k = 0)."""
        if isinstance(e, cst.Name) and e.value in self.elements:
            return self.elements[e.value], 0
        col = self.element_column(e)
        if col is not None:
            return col, 0
        if isinstance(e, cst.Subscript) and _pure_container(e.value):
            if _norm(e.value) in getattr(self, "written", ()):
                return None  # this step's own output (forwarded) or memory: not an input
            k = self.parser.ref_offset(e)
            if k is not None:
                return e.value, k
            icol = self.index_column(e)
            if icol is not None:
                return self._column_node(e.value, icol[2]), icol[1]
        return None

    def element_column(self, e: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        """For ``x_t[i]`` / ``x_t[i, j]`` (``x_t`` an element of an iterated array, integer
        literal indices), the per-step container ``column(x, (i, j))``, i.e. ``x[:, i, j]``: the
        runtime gives None for what it cannot index that way, which the guard declines."""
        if not (isinstance(e, cst.Subscript) and isinstance(e.value, cst.Name) and e.value.value in self.elements):
            return None
        key = _norm(e)
        if key in self.columns:
            return self.columns[key]
        idx = _int_indices(e.slice)
        if idx is None:
            return None
        node = self._column_node(self.elements[e.value.value], idx)
        self.columns[key] = node
        return node

    def index_column(self, e: cst.BaseExpression) -> Optional[Tuple[cst.BaseExpression, int, Tuple[str, ...]]]:
        """(x, k, (i, ...)) for ``x[t + k, i, ...]`` (integer literal indices after the first)."""
        if self.h.kind != "index" or not isinstance(e, cst.Subscript) or len(e.slice) < 2 \
                or not _pure_container(e.value):
            return None
        k = self.parser.ref_offset(e.with_changes(slice=[e.slice[0]]))
        idx = _int_indices(e.slice[1:])
        if k is None or idx is None:
            return None
        return e.value, k, idx

    def _column_node(self, cont: cst.BaseExpression, idx: Tuple[str, ...]) -> cst.BaseExpression:
        node = cst.parse_expression(f"__SBX__.column({_code(cont).strip()}, ({', '.join(idx)},))")
        self.seq_labels[_norm(node)] = f"{_norm(cont).split('.')[-1]}_" + "_".join(i.replace("-", "m") for i in idx)
        return node

    # ---- rendering of the middle steps t = T-2 .. 1
    def stop(self, k: int) -> str:
        T = self.T
        return f"{T} - 1" if k == 0 else (T if k == 1 else f"{T} + {k - 1}")

    def use_seq(self, cont: cst.BaseExpression, k: int) -> str:
        key = _norm(cont)
        if key not in self.vec_names:
            self.vec_names[key] = self.fresh(f"{self.seq_labels.get(key, key.split('.')[-1])}_v")
            self.seq_nodes[key] = cont
        self.seqs[key] = max(self.seqs.get(key, 0), k)
        return f"{self.vec_names[key]}[{1 + k}:{self.stop(k)}]"

    def use_cond(self, cont: cst.BaseExpression, k: int) -> str:
        key = _norm(cont)
        if key not in self.cond_names:
            self.cond_names[key] = self.fresh(f"{self.seq_labels.get(key, key.split('.')[-1])}_c")
            self.seq_nodes.setdefault(key, cont)
        self.conds[key] = max(self.conds.get(key, 0), k)
        return f"{self.cond_names[key]}[{1 + k}:{self.stop(k)}]"

    def render(self, e: cst.BaseExpression, env: Dict[str, str], shift: int = 0) -> str:
        """``e`` over the middle steps: per-step reads become slices, temporaries their arrays."""
        lp, rp = "(" * len(getattr(e, "lpar", ())), ")" * len(getattr(e, "rpar", ()))
        if id(e) in self.forwarded:  # this step's stored value, already written
            if shift:
                raise Skip(f"`{_code(e).strip()}` is carried into the next step")
            code, idx = self.forwarded[id(e)]
            self.fwd_reads[code] = len(idx)
            return lp + f"{code}[1:{self.T} - 1" + "".join(f", {i}" for i in idx) + "]" + rp
        ref = self.per_step(e)
        if ref is not None:
            return lp + self.use_seq(ref[0], ref[1] + shift) + rp
        if isinstance(e, cst.Name):
            if e.value in env:
                return lp + env[e.value] + rp
            if e.value in self.shift:
                return lp + "(" + self.render(self.shift[e.value].value, {}, shift + 1) + ")" + rp  # type: ignore[arg-type]
            if e.value in self.body_assigned:  # pragma: no cover - excluded by the dataflow
                raise Skip(f"`{e.value}` is used before it is computed")
            self.consts[e.value] = None
            return _code(e)
        if isinstance(e, (cst.Attribute, cst.Subscript)):
            if self.h.index is not None and self.h.index in _names_read(e):  # pragma: no cover - a safety net
                raise Skip(f"reads `{_code(e).strip()}`, which the loop writes")
            self.consts[_code(e).strip()] = None
            return _code(e)
        if isinstance(e, (cst.Integer, cst.Float)):
            return _code(e)
        if isinstance(e, cst.BinaryOperation):
            if isinstance(e.operator, cst.Divide):
                self.divides = True
            op = _OP_TEXT[type(e.operator)]  # source text may hold a line continuation or a comment
            return f"{lp}{self.render(e.left, env, shift)} {op} {self.render(e.right, env, shift)}{rp}"
        if isinstance(e, cst.UnaryOperation):
            op = _OP_TEXT[type(e.operator)]
            return f"{lp}{op}{self.render(e.expression, env, shift)}{rp}"
        if isinstance(e, cst.IfExp):
            m_then = self.parser.lsplit(e.test)
            branch = e.body if m_then else e.orelse
            return f"{lp}({self.render(branch, env, shift)}){rp}"
        if isinstance(e, cst.Call):
            f = e.func
            assert isinstance(f, cst.Attribute)
            args = ", ".join(_code(a.value).strip() for a in e.args)
            return f"{lp}{self.render(f.value, env, shift)}.{f.attr.value}({args}){rp}"
        raise Skip(f"unsupported expression `{_code(e).strip()}`")  # pragma: no cover

    def invariant(self, e: cst.BaseExpression, env: Dict[str, str]) -> bool:
        """No per-step read, temporary or carried value under ``e``."""
        if self.per_step(e) is not None or self._reads_written(e):
            return False
        if isinstance(e, cst.Name):
            return e.value not in env and e.value not in self.body_assigned
        if isinstance(e, cst.BinaryOperation):
            return self.invariant(e.left, env) and self.invariant(e.right, env)
        if isinstance(e, cst.UnaryOperation):
            return self.invariant(e.expression, env)
        if isinstance(e, cst.Call):
            return self.invariant(e.func.value, env)  # type: ignore[attr-defined]
        if isinstance(e, cst.IfExp):
            return False
        return True

    # ---- affine decomposition of the carried update
    def affine_exact(self, value: cst.BaseExpression, s: str, env: Dict[str, str]):
        """(a, b, a_node) when ``value`` is ``B + P * s`` (or an equivalent exact spelling)."""
        if not isinstance(value, cst.BinaryOperation) or not isinstance(value.operator, (cst.Add, cst.Subtract)):
            return None
        left_s, right_s = s in _names_read(value.left), s in _names_read(value.right)
        if left_s == right_s:
            return None
        m, other = (value.right, value.left) if right_s else (value.left, value.right)
        coef: Optional[cst.BaseExpression]
        if isinstance(m, cst.Name) and m.value == s:
            coef = None
        elif isinstance(m, cst.BinaryOperation) and isinstance(m.operator, cst.Multiply):
            if isinstance(m.right, cst.Name) and m.right.value == s and s not in _names_read(m.left):
                coef = m.left
            elif isinstance(m.left, cst.Name) and m.left.value == s and s not in _names_read(m.right):
                coef = m.right
            else:
                return None
        else:
            return None
        a = "1" if coef is None else self.render(coef, env)
        b = self.render(other, env)
        if isinstance(value.operator, cst.Subtract):
            if right_s:  # B - P*s == B + (-P)*s exactly
                a = "-1" if coef is None else f"-({a})"
            else:  # P*s - B == (-B) + P*s exactly
                b = f"-({b})"
        return a, b, coef

    def affine(self, e: cst.BaseExpression, s: str, env: Dict[str, str]) -> Tuple[Optional[str], Optional[str]]:
        """(A, B) with e == A*s + B algebraically (None: zero); Skip when s appears non-affinely."""
        if s not in _names_read(e):
            return None, self.render(e, env)
        par = lambda x: f"({x})"  # noqa: E731
        if isinstance(e, cst.Name) and e.value == s:
            return "1", None
        if isinstance(e, cst.BinaryOperation):
            op = e.operator
            if isinstance(op, (cst.Add, cst.Subtract)):
                a1, b1 = self.affine(e.left, s, env)
                a2, b2 = self.affine(e.right, s, env)
                sign = " + " if isinstance(op, cst.Add) else " - "

                def comb(x, y):
                    if x is None and y is None:
                        return None
                    if y is None:
                        return x
                    if x is None:
                        return y if sign == " + " else f"-{par(y)}"
                    return f"{par(x)}{sign}{par(y)}"

                return comb(a1, a2), comb(b1, b2)
            if isinstance(op, (cst.Multiply, cst.Divide)):
                ls, rs = s in _names_read(e.left), s in _names_read(e.right)
                if ls and rs:
                    raise Skip(f"the carried value `{s}` appears non-affinely in `{_code(e).strip()}`")
                if isinstance(op, cst.Divide):
                    if rs:
                        raise Skip(f"the carried value `{s}` appears non-affinely in `{_code(e).strip()}`")
                    self.divides = True
                    a1, b1 = self.affine(e.left, s, env)
                    r = self.render(e.right, env)
                    return (None if a1 is None else f"{par(a1)} / {par(r)}",
                            None if b1 is None else f"{par(b1)} / {par(r)}")
                if ls:
                    a1, b1 = self.affine(e.left, s, env)
                    r = self.render(e.right, env)
                    return (None if a1 is None else (r if a1 == "1" else f"{par(a1)} * {par(r)}"),
                            None if b1 is None else f"{par(b1)} * {par(r)}")
                a1, b1 = self.affine(e.right, s, env)
                lft = self.render(e.left, env)
                return (None if a1 is None else (lft if a1 == "1" else f"{par(lft)} * {par(a1)}"),
                        None if b1 is None else f"{par(lft)} * {par(b1)}")
        if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Minus):
            a1, b1 = self.affine(e.expression, s, env)
            return (None if a1 is None else f"-{par(a1)}", None if b1 is None else f"-{par(b1)}")
        if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Plus):
            return self.affine(e.expression, s, env)
        raise Skip(f"the carried value `{s}` appears non-affinely in `{_code(e).strip()}`")

    # ---- emission
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
                    ref = self.per_step(cond.expression if neg else cond)  # type: ignore[union-attr,arg-type]
                    assert ref is not None
                    mask = self.use_cond(ref[0], ref[1])
                    if neg:
                        mask = f"~{mask}"
                    self.consts[s] = None  # the value before the loop meets the same dtype rules
                    mid.append(f"{seq}, {last} = {helpers}.reset_linear_recurrence("
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
                    text = self.render(it.value, env)  # type: ignore[arg-type]
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
                    vec = value_vec if value_vec is not None else self.render(it.value, env)  # type: ignore[arg-type]
                    oc = _code(o).strip()
                    if self._has_step(vec):  # time-first: rows aligned to out's rows
                        vec = f"{helpers}.to_rank({vec}, {oc})"
                    mid.append(f"{oc}[1:{T} - 1] = {vec}")
            elif it.kind in ("append", "insert", "appendleft"):
                vec = self.render(it.value, env)  # type: ignore[arg-type]
                if not from_carried(vec):  # an item made of per-step values alone: Python numbers in
                    self.weak_ok = False  # the loop when those are, array items once they are arrays
                like = vec if (isinstance(it.value, cst.Name) and it.value.value in done_vars) else None
                src = self.src_container()
                srcs = ""
                if len(self.vec_names) > 1:  # one of them may be a list of done flags next to arrays
                    srcs = f", srcs=({', '.join(_code(self.seq_nodes[k]).strip() for k in self.vec_names)},)"
                items = f"{helpers}.items_of({vec}, {src}" + (f", like={it.value.value}" if like else "") + srcs + ")"  # type: ignore[union-attr]
                if it.wrap:
                    items = f"{helpers}.wrapped({items})"
                cont = _code(it.container).strip()  # type: ignore[arg-type]
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
        binds += [f"{self.cond_names[k]} = {helpers}.truth_of({_code(self.seq_nodes[k]).strip()})" for k in self.cond_names]
        mid = binds + mid
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
            need |= _names_read(it.value) & self.body_assigned  # type: ignore[arg-type]
        return need

    def recurrence(self, it: Item, env: Dict[str, str]) -> Recurrence:
        s = it.var
        assert s is not None and it.value is not None
        ex = self.affine_exact(it.value, s, env)
        if ex is not None:
            a, b, coef = ex
            exact = True
            pattern = f"`{self.memo_src[s]}`, carried through memory," if s in self.memo_src else \
                f"`{s} = {_one_line(it.value)}`"
        else:
            a_, b_ = self.affine(it.value, s, env)
            if a_ is None:  # pragma: no cover - s is read in its update
                raise Skip(f"`{s}` does not depend on itself")
            if b_ is None:
                raise Skip(f"`{s}` is a pure product (no per-step input to add)")
            if not self.reassociate:
                raise Skip(f"`{s} = {_code(it.value).strip()}` needs its coefficients regrouped "
                           "(reassociation is off: [vectorize.recurrence] reassociate = false)")
            a, b, coef = a_, b_, None
            exact = False
            pattern = f"`{self.memo_src[s]}`, carried through memory," if s in self.memo_src else \
                f"`{s} = {_one_line(it.value)}`"
            pattern += " (coefficients regrouped)"
        if not self._has_step(b):
            raise Skip(f"the update of `{s}` adds no per-step input")
        a_per_step = self._has_step(a)
        if not a_per_step:
            # the coefficient is loop-invariant: the guard wants Python numbers / 0-d arrays
            inv = coef if exact else it.value
            for name in (self._invariants_in(inv, s) if inv is not None else []):
                self.scalars[name] = None
        return Recurrence(s, it, exact, a, b, self.resets.get(s), pattern)

    def _has_step(self, text: str) -> bool:
        names = set(self.vec_names.values()) | set(self.cond_names.values())
        names |= self.step_names
        if any(re.search(rf"(?<![\w.]){re.escape(n)}\[1:{re.escape(self.T)} - 1\b", text) for n in self.fwd_reads):
            return True
        return any(re.search(rf"(?<![\w.]){re.escape(n)}\b", text) for n in names)

    def _invariants_in(self, e: cst.BaseExpression, s: str) -> List[str]:
        out: List[str] = []

        seen: Set[str] = set()

        def walk(x: cst.BaseExpression) -> None:
            if isinstance(x, cst.Name):
                if x.value in self.assign_of and x.value != s and x.value not in seen:
                    seen.add(x.value)
                    walk(self.assign_of[x.value].value)  # type: ignore[arg-type]
                elif x.value != s and x.value not in self.body_assigned and x.value not in self.elements:
                    out.append(x.value)
            elif isinstance(x, (cst.Attribute, cst.Subscript)) and self.per_step(x) is None \
                    and not self._reads_written(x):
                out.append(_code(x).strip())
            elif isinstance(x, cst.BinaryOperation):
                walk(x.left)
                walk(x.right)
            elif isinstance(x, cst.UnaryOperation):
                walk(x.expression)

        walk(e)
        return out

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
            if _names_read(h.T) & _names_read(self.node.body):  # type: ignore[arg-type]
                head += f" and {helpers}.steps({_code(h.T).strip()}) == {T}"  # type: ignore[arg-type]
        elif h.kind == "index":
            head = f"({T} := {helpers}.steps({_code(h.T).strip()})) >= 2"  # type: ignore[arg-type]
        else:
            conts = ", ".join(_code(c).strip() for _, c in h.elements)
            head = f"({T} := {helpers}.length({conts})) >= 2"
        for name, code in self.views:  # time along dimension 1: time-major views, None if none
            head += f" and ({name} := {helpers}.dim1({code})) is not None"
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
        return f"{head} and {helpers}.recurrence_ok({', '.join(args)})"


# --------------------------------------------------------------------------- time along dimension 1


def _is_full_slice(el: cst.SubscriptElement) -> bool:
    sl = el.slice
    return isinstance(sl, cst.Slice) and sl.lower is None and sl.upper is None and sl.step is None


def _time_views(ctx: FileContext, node: cst.For, header: Header) -> Optional[Tuple[cst.For, List[Tuple[str, str]]]]:
    """pymarl walks time along dimension 1: ``ret[:, t] = ... ret[:, t + 1] ...``. For the analysis
    the loop is read with ``x[:, i, ...]`` (``i`` reading ``t``) as ``x_t[i, ...]``, ``x_t`` the
    time-major view ``x.movedim(1, 0)`` the guard binds (runtime.vectorized.dim1: None for what
    has no dimension 1); the first, last and else-branch loops keep the original text. None when
    the loop indexes nothing that way; Skip when a container is also used otherwise (two names
    for one memory) or rebound in the loop."""
    if header.kind != "index":
        return None
    t = header.index
    found: Dict[str, cst.BaseExpression] = {}
    for n in _walk(node.body):
        if isinstance(n, cst.Subscript) and len(n.slice) >= 2 and _is_full_slice(n.slice[0]) \
                and _pure_container(n.value) and t in _names_read(n.slice[1].slice):
            found.setdefault(_norm(n.value), n.value)
    if not found:
        return None
    bound = _bound_names(node.body)
    names: Dict[str, str] = {}
    for key, cont in found.items():
        if _head(cont) in bound:
            raise Skip(f"`{_code(cont).strip()}` is indexed along dimension 1 and reassigned in the loop")
        names[key] = ctx.imports.unique_name(f"{key.split('.')[-1]}_t")

    class Sub(cst.CSTTransformer):
        def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript) -> cst.BaseExpression:
            if len(updated.slice) >= 2 and _is_full_slice(updated.slice[0]) and _pure_container(updated.value) \
                    and _norm(updated.value) in names and t in _names_read(updated.slice[1].slice):
                rest = list(updated.slice[1:])
                rest[-1] = rest[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                return cst.Subscript(value=cst.Name(names[_norm(updated.value)]), slice=rest,
                                     lpar=updated.lpar, rpar=updated.rpar)
            return updated

    new = node.with_changes(body=node.body.visit(Sub()))
    left = _names_read(new.body)
    chains = {dotted(n) for n in _walk(new.body) if isinstance(n, cst.Attribute)}
    for key, cont in found.items():
        if (key in left) if isinstance(cont, cst.Name) else (key in chains):
            raise Skip(f"`{_code(cont).strip()}` is indexed along dimension 1 and also otherwise")
    return new, [(names[k], _code(c).strip()) for k, c in found.items()]


# --------------------------------------------------------------------------- look-alikes to report


def _forward_memory(node: ast.AST) -> Optional[str]:
    """A forward loop that reads what it wrote the step before (out[i] = f(out[i-1]))."""
    it, tgt = node.iter, node.target  # type: ignore[attr-defined]
    if not (isinstance(tgt, ast.Name) and isinstance(it, ast.Call) and isinstance(it.func, ast.Name)
            and it.func.id == "range"):
        return None
    i = tgt.id
    written: Set[str] = set()
    reads: List[Tuple[str, str]] = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Subscript) and isinstance(sub.value, (ast.Name, ast.Attribute)):
            base = ast.unparse(sub.value)
            idx = sub.slice
            if isinstance(sub.ctx, ast.Store) and isinstance(idx, ast.Name) and idx.id == i:
                written.add(base)
            elif isinstance(sub.ctx, ast.Load) and isinstance(idx, ast.BinOp) and isinstance(idx.op, ast.Sub) \
                    and isinstance(idx.left, ast.Name) and idx.left.id == i and isinstance(idx.right, ast.Constant):
                reads.append((base, ast.unparse(sub)))
    for base, text in reads:
        if base in written:
            return (f"forward recurrence through memory: reads `{text}`, which the loop wrote the step "
                    "before (only backward carried-value recurrences are vectorized)")
    return None


def _loose_candidate(node: cst.For, header: Header) -> bool:
    """A backward loop is a candidate when some value flows from one step to the next: a name read
    before it is assigned in the body, or a container read at another index than it is written."""
    # recurrence through memory: out[t] written and out[t + 1] read
    written: Set[str] = set()
    read: Set[str] = set()
    stores: Set[int] = set()
    for n in _walk(node.body):
        if isinstance(n, cst.AssignTarget) and isinstance(n.target, cst.Subscript) \
                and _pure_container(n.target.value):
            written.add(_norm(n.target.value))
            stores.add(id(n.target))
        elif isinstance(n, cst.Subscript) and id(n) not in stores and _pure_container(n.value):
            read.add(_norm(n.value))
    if written & read:
        return True
    assigned = _bound_names(node.body) - ({header.index} if header.index else set()) \
        - {n for n, _ in header.elements}
    if not assigned:
        return False
    defined: Set[str] = set()

    def scan(stmts: Sequence[cst.BaseStatement], defined: Set[str]) -> Tuple[bool, Set[str]]:
        for st in stmts:
            if isinstance(st, cst.SimpleStatementLine):
                for small in st.body:
                    if isinstance(small, cst.Assign):
                        reads = _names_read(small.value)
                        for tg in small.targets:
                            if not isinstance(tg.target, cst.Name):
                                reads |= _names_read(tg.target)
                    else:
                        reads = _names_read(small)
                        if isinstance(small, cst.AugAssign):
                            reads |= _names_read(small.target)
                    if (reads & assigned) - defined:
                        return True, defined
                    if isinstance(small, cst.Assign):
                        for tg in small.targets:
                            if isinstance(tg.target, cst.Name):
                                defined = defined | {tg.target.value}
            elif isinstance(st, cst.If):
                if (_names_read(st.test) & assigned) - defined:
                    return True, defined
                hit1, d1 = scan(_stmts(st.body), set(defined))
                if hit1:
                    return True, defined
                if st.orelse is not None:
                    other = [st.orelse] if isinstance(st.orelse, cst.If) else _stmts(st.orelse.body)
                    hit2, d2 = scan(other, set(defined))
                    if hit2:
                        return True, defined
                    defined = d1 & d2
            else:
                if (_names_read(st) & assigned) - defined:
                    return True, defined
        return False, defined

    hit, _ = scan(_stmts(node.body), defined)
    return hit


# --------------------------------------------------------------------------- cheap pre-filter (stdlib ast)

_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def _statement_fors(stmts, lib, before: Optional[dict] = None):
    """For statements in source order, walking statement lists only (``lib`` is ``ast`` or
    ``cst``: both parsers nest statements the same way, so the i-th loops correspond).
    ``before``: filled with id(loop) -> (its statement list, its index there)."""
    for i, st in enumerate(stmts):
        if isinstance(st, lib.For) or (lib is ast and isinstance(st, ast.AsyncFor)):
            if before is not None:
                before[id(st)] = (stmts, i)
            yield st
        if lib is cst and not isinstance(st, cst.BaseCompoundStatement):
            continue
        for field in _BLOCKS:
            block = getattr(st, field, None)
            if block is None:
                continue
            if lib is cst:
                if isinstance(block, cst.If):  # elif
                    yield from _statement_fors([block], lib, before)
                    continue
                if isinstance(block, (cst.Else, cst.Finally)):
                    block = block.body
                if isinstance(block, cst.BaseSuite):
                    yield from _statement_fors(_stmts(block), lib, before)
                elif isinstance(block, (list, tuple)):  # handlers, cases
                    for h in block:
                        yield from _statement_fors(_stmts(h.body), lib, before)
            else:
                if field in ("handlers", "cases"):
                    for h in block:
                        yield from _statement_fors(h.body, lib, before)
                else:
                    yield from _statement_fors(block, lib, before)


def _named_range_ast(node: ast.AST, before: Optional[Tuple[list, int]]) -> bool:
    """``for t in steps`` where the nearest assignment to ``steps`` earlier in the same block
    materialises a backward range (``steps = list(range(T - 1, -1, -1))``; dreamerv2)."""
    it = node.iter  # type: ignore[attr-defined]
    if not isinstance(it, ast.Name) or before is None or not isinstance(node.target, ast.Name):  # type: ignore[attr-defined]
        return False
    stmts, i = before
    for st in reversed(stmts[:i]):
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) \
                and st.targets[0].id == it.id:
            v = st.value
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in ("list", "tuple") \
                    and len(v.args) == 1:
                v = v.args[0]
            return isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and (
                (v.func.id == "range" and len(v.args) == 3) or v.func.id == "reversed")
    return False


def _named_range_header(node: cst.For, before: Optional[Tuple[Sequence[cst.BaseStatement], int]],
                        shadowed: Set[str]) -> Optional[Header]:
    """The header of ``for t in steps`` with ``steps = list(range(T - 1, -1, -1))`` (or a tuple,
    the bare range, ``list(reversed(range(T)))``) the nearest assignment to ``steps`` before the
    loop in its block. The guard checks the value at run time (``backward_steps``): the
    assignment only makes the loop a candidate, and gives ``T`` for last-step tests."""
    it, tgt = node.iter, node.target
    if not isinstance(it, cst.Name) or not isinstance(tgt, cst.Name) or before is None \
            or any(b in shadowed for b in _BUILTINS):
        return None
    stmts, i = before
    for st in reversed(list(stmts[:i])):
        if not isinstance(st, cst.SimpleStatementLine):
            continue
        for small in st.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1 \
                    and isinstance(small.targets[0].target, cst.Name) and small.targets[0].target.value == it.value:
                v = small.value
                if _is_call(v, "list", 1) or _is_call(v, "tuple", 1):
                    v = v.args[0].value  # type: ignore[attr-defined]
                fake = node.with_changes(iter=v)
                h = _backward_header(fake, shadowed)
                if h is None or h.kind != "index":
                    return None
                return dataclasses.replace(h, named=it)
    return None


def _walks_backward(node: ast.AST) -> bool:
    """The loop header may walk backwards: reversed(...), zip(...), range(a, b, step), x[::k]."""
    it = node.iter  # type: ignore[attr-defined]
    if isinstance(it, ast.Subscript) and isinstance(it.slice, ast.Slice) and it.slice.step is not None:
        return True
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name):
        if it.func.id == "zip":
            return any(_walks_backward(ast.For(iter=a)) for a in it.args)
        return it.func.id == "reversed" or (it.func.id == "range" and len(it.args) == 3)
    return False


def _ast_bound(tree: ast.Module) -> Set[str]:
    """Names the module binds anywhere (to tell a shadowed ``reversed`` from the builtin)."""
    out: Set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in n.names)
    return out


def _replace_statements(node: cst.CSTNode, replace: Dict[cst.For, cst.CSTNode]) -> cst.CSTNode:
    """``node`` with the statements in ``replace`` swapped, rebuilding only the blocks on the way
    to them (a full libcst transformer pass costs far more on a large file)."""

    def stmts(seq):
        out, changed = [], False
        for st in seq:
            new = replace.get(st, st) if isinstance(st, cst.For) else st
            if new is st and isinstance(st, cst.BaseCompoundStatement):
                new = compound(st)
            changed = changed or new is not st
            out.append(new)
        return (out, True) if changed else (seq, False)

    def suite(block):
        if isinstance(block, cst.IndentedBlock):
            body, changed = stmts(block.body)
            return block.with_changes(body=body) if changed else block
        return block  # a one-line suite holds no loop

    def compound(st):
        changes = {}
        body = getattr(st, "body", None)
        if isinstance(body, cst.BaseSuite):
            new = suite(body)
            if new is not body:
                changes["body"] = new
        orelse = getattr(st, "orelse", None)
        if isinstance(orelse, cst.If):
            new = compound(orelse)
            if new is not orelse:
                changes["orelse"] = new
        elif isinstance(orelse, cst.Else):
            new = suite(orelse.body)
            if new is not orelse.body:
                changes["orelse"] = orelse.with_changes(body=new)
        final = getattr(st, "finalbody", None)
        if isinstance(final, cst.Finally):
            new = suite(final.body)
            if new is not final.body:
                changes["finalbody"] = final.with_changes(body=new)
        for field in ("handlers", "cases"):
            items = getattr(st, field, None)
            if items:
                new_items = [h.with_changes(body=suite(h.body)) if suite(h.body) is not h.body else h for h in items]
                if any(a is not b for a, b in zip(new_items, items)):
                    changes[field] = new_items
        return st.with_changes(**changes) if changes else st

    body, changed = stmts(node.body)  # type: ignore[attr-defined]
    return node.with_changes(body=body) if changed else node


def _kept_loops(module: cst.Module) -> Set[cst.For]:
    """Loops kept in the else branch of an earlier rewrite (left as they are)."""
    kept: Set[cst.For] = set()

    def walk(stmts) -> None:
        for st in stmts:
            if not isinstance(st, cst.BaseCompoundStatement):
                continue
            if isinstance(st, cst.If) and isinstance(st.orelse, cst.Else) and (
                    ".recurrence_ok(" in _code(st.test) or ".quadratic_ok(" in _code(st.test)
                    or ".carry_ok(" in _code(st.test)):
                kept.update(x for x in _stmts(st.orelse.body) if isinstance(x, cst.For))
            for field in _BLOCKS:
                block = getattr(st, field, None)
                if isinstance(block, cst.If):
                    walk([block])
                elif isinstance(block, (cst.Else, cst.Finally)):
                    walk(_stmts(block.body))
                elif isinstance(block, cst.BaseSuite):
                    walk(_stmts(block))
                elif isinstance(block, (list, tuple)):
                    for h in block:
                        walk(_stmts(h.body))

    walk(module.body)
    return kept


# --------------------------------------------------------------------------- the transform


class VectorizeRecurrence(Transform):
    id = ID
    version = "4"
    triggers = ("reversed(", "::-1", "-1, -1", "-1,-1", "range(")
    description = "Backward linear recurrences (GAE, discounted returns) -> one linear_recurrence call, guarded."

    EXAMPLES = [
        Example(
            code=(
                "import torch\n"
                "def gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda, num_steps):\n"
                "    advantages = torch.zeros_like(rewards)\n"
                "    lastgaelam = 0\n"
                "    for t in reversed(range(num_steps)):\n"
                "        if t == num_steps - 1:\n"
                "            nextnonterminal = 1.0 - next_done\n"
                "            nextvalues = next_value\n"
                "        else:\n"
                "            nextnonterminal = 1.0 - dones[t + 1]\n"
                "            nextvalues = values[t + 1]\n"
                "        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]\n"
                "        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam\n"
                "    return advantages\n"
            ),
            rewritten=True,
            note="CleanRL GAE: bitwise exact (the coefficient is the left-associated prefix of the product)",
        ),
        Example(
            code=(
                "def discounted(rewards, gamma):\n"
                "    R = 0\n"
                "    returns = []\n"
                "    for r in reversed(rewards):\n"
                "        R = r + gamma * R\n"
                "        returns.insert(0, R)\n"
                "    return returns\n"
            ),
            rewritten=True,
            note="REINFORCE returns over a list of floats",
        ),
        Example(
            code=(
                "from collections import deque\n"
                "def finish_episode(rewards, gamma):\n"
                "    R = 0\n"
                "    returns = deque()\n"
                "    for r in rewards[::-1]:\n"
                "        R = r + gamma * R\n"
                "        returns.appendleft(R)\n"
                "    return returns\n"
            ),
            rewritten=True,
            note="pytorch/examples reinforce.py: deque.appendleft (the guard checks it is a deque)",
        ),
        Example(
            code=(
                "def returns_of(rewards, dones, gamma):\n"
                "    out = []\n"
                "    discounted_reward = 0\n"
                "    for reward, done in zip(reversed(rewards), reversed(dones)):\n"
                "        if done:\n"
                "            discounted_reward = 0\n"
                "        discounted_reward = reward + (gamma * discounted_reward)\n"
                "        out.insert(0, discounted_reward)\n"
                "    return out\n"
            ),
            rewritten=True,
            note="PPO-PyTorch: episode resets become stretches of the op, exact",
        ),
        Example(
            code=(
                "def train(rewards, gamma, optimizer):\n"
                "    R = 0.0\n"
                "    for t in reversed(range(len(rewards))):\n"
                "        R = rewards[t] + gamma * R\n"
                "        optimizer.step()\n"
                "    return R\n"
            ),
            rewritten=False,
            reason="calls `optimizer.step()`",
        ),
        Example(
            code=(
                "def f(r, T):\n"
                "    s = 0.0\n"
                "    for t in reversed(range(T)):\n"
                "        s = s * s + r[t]\n"
                "    return s\n"
            ),
            rewritten=False,
            reason="appears non-affinely",
        ),
        Example(
            code=(
                "def returns_of(returns, rewards, masks, gamma):\n"
                "    for step in reversed(range(rewards.size(0))):\n"
                "        returns[step] = returns[step + 1] * gamma * masks[step + 1] + rewards[step]\n"
                "    return returns\n"
            ),
            rewritten=True,
            note="ikostrikov storage: carried through returns[step + 1]; the mask is regrouped into the "
                 "coefficient (reassociated)",
        ),
        Example(
            code=(
                "def f(out, r, T, gamma):\n"
                "    for t in reversed(range(T - 2)):\n"
                "        out[t] = r[t] + gamma * out[t + 2]\n"
                "    return out\n"
            ),
            rewritten=False,
            reason="recurrence through memory",
        ),
        Example(
            code=(
                "import numpy as np\n"
                "def advantages(self, reward_arr, values, dones_arr):\n"
                "    advantage = np.zeros(len(reward_arr), dtype=np.float32)\n"
                "    for t in range(len(reward_arr)-1):\n"
                "        discount = 1\n"
                "        a_t = 0\n"
                "        for k in range(t, len(reward_arr)-1):\n"
                "            a_t += discount*(reward_arr[k] + self.gamma*values[k+1]*(1-int(dones_arr[k])) - values[k])\n"
                "            discount *= self.gamma*self.gae_lambda\n"
                "        advantage[t] = a_t\n"
                "    return advantage\n"
            ),
            rewritten=True,
            note="Phil Tabor's quadratic GAE: one backward recurrence, reassociated; the discount still "
                 "runs across episode ends, as in the original",
        ),
        Example(
            code=(
                "def returns_of(rewards, gamma):\n"
                "    returns = []\n"
                "    for t in range(len(rewards)):\n"
                "        G = 0\n"
                "        for k in range(t, len(rewards)):\n"
                "            G += gamma ** (k - t) * rewards[k]\n"
                "        returns.append(G)\n"
                "    return returns\n"
            ),
            rewritten=True,
            note="quadratic discounted returns with a power discount, appended",
        ),
        Example(
            code=(
                "def truncated(rewards, dones, gamma, out):\n"
                "    for t in range(len(rewards)):\n"
                "        G = 0\n"
                "        for k in range(t, len(rewards)):\n"
                "            G += gamma ** (k - t) * rewards[k]\n"
                "            if dones[k]:\n"
                "                break\n"
                "        out[t] = G\n"
                "    return out\n"
            ),
            rewritten=False,
            reason="episode-truncated sum",
        ),
        Example(
            code=(
                "def f(rewards, gamma, out):\n"
                "    discount = 1\n"
                "    for t in range(len(rewards)):\n"
                "        G = 0\n"
                "        for k in range(t, len(rewards)):\n"
                "            G += discount * rewards[k]\n"
                "            discount *= gamma\n"
                "        out[t] = G\n"
                "    return out\n"
            ),
            rewritten=False,
            reason="is not reset for each `t`",
        ),
    ]

    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        # Cheap first: the stdlib ast (shared by all transforms) says which loops are worth a look
        # and gives their lines; libcst (parsed only now, and walked over statement lists only) is
        # needed just for the loops that are. None: unchanged.
        from . import recurrence_quadratic as quadratic  # it builds on this module's Planner

        ast_before: dict = {}
        ast_loops = list(_statement_fors(ctx.tree.body, ast, ast_before))
        sites: List[Site] = []
        backward: List[int] = []
        quad: Set[int] = set()
        for i, n in enumerate(ast_loops):
            span = (n.lineno, n.end_lineno or n.lineno)
            if quadratic.candidate(n):
                quad.add(i)
                backward.append(i)
                continue
            reason = None
            if not _walks_backward(n) and not _named_range_ast(n, ast_before.get(id(n))):
                reason = _forward_memory(n)
                if reason is None:
                    continue
            if reason is not None:
                sites.append(Site(ID, span[0], span[1], SKIPPED, reason))
            else:
                backward.append(i)
        if not backward:
            return None, sites
        module = ctx.module
        cst_before: dict = {}
        cst_loops = list(_statement_fors(module.body, cst, cst_before))
        if len(cst_loops) != len(ast_loops):  # pragma: no cover - the two parsers agree on statements
            return None, sites
        bound = _ast_bound(ctx.tree)
        shadowed = bound & set(_BUILTINS)
        ours = _kept_loops(module)
        reassociate = bool(ctx.option("vectorize.recurrence", "reassociate", True))
        replace: Dict[cst.For, cst.CSTNode] = {}
        for i in backward:
            node, span = cst_loops[i], (ast_loops[i].lineno, ast_loops[i].end_lineno or ast_loops[i].lineno)
            if node in ours:
                continue

            def site(action: str, reason: str, exactness: Optional[str] = None) -> Site:
                return Site(ID, span[0], span[1], action, reason, exactness)

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
                    sites.append(site(REWRITTEN, reason, REASSOCIATED))
                continue
            header = _backward_header(node, shadowed) or _named_range_header(node, cst_before.get(id(node)), shadowed)
            if header is None:
                continue
            if not _loose_candidate(node, header):
                continue
            try:
                viewed = _time_views(ctx, node, header)
            except Skip as exc:
                sites.append(site(SKIPPED, str(exc)))
                continue
            planner = Planner(ctx, viewed[0] if viewed else node, header, reassociate, cpu=ctx.backend == "cpu")
            planner.views = viewed[1] if viewed else []
            try:
                planner.analyse()
                new, exact, reason = self.build(ctx, node, planner)
            except Skip as exc:
                sites.append(site(SKIPPED, str(exc)))
                continue
            except Exception as exc:  # an analysis bug must not cost the user the other rewrites
                sites.append(site(SKIPPED, f"not analysed ({type(exc).__name__}: {exc})"))
                continue
            replace[node] = new
            sites.append(site(REWRITTEN, reason, EXACT if exact else REASSOCIATED))
        if not replace:
            return None, sites

        return _replace_statements(module, replace), sites  # type: ignore[arg-type]

    def build(self, ctx: FileContext, node: cst.For, planner: Planner) -> Tuple[cst.If, bool, str]:
        # names are reserved before the imports are requested, so a Skip leaves no import behind
        guard, mid, exact, notes = planner.emit("__SBX__", "__SBX_OP__")
        helpers = ctx.runtime_name(HELPERS_QUALNAME, "_sbx")
        op = ctx.runtime_name(OP_QUALNAME, "linear_recurrence")

        def sub(text: str) -> str:
            return text.replace("__SBX_OP__", op).replace("__SBX__", helpers)

        h = planner.h
        T = planner.T
        body = list(_stmts(node.body))

        def bind(index_expr: str) -> str:
            if h.kind == "index":
                return f"{h.index} = {index_expr}"
            names = ", ".join(n for n, _ in h.elements)
            vals = ", ".join(f"{_code(c).strip()}[{index_expr}]" for _, c in h.elements)
            return f"{names} = {vals}"

        last_lines = []
        if planner.shift or planner.readback_items:  # values carried into step 0 from step 1 (a middle
            last_lines.append(f"if {T} > 2:")  # step when T > 2), read back from what it stored
            last_lines.append("    " + bind("1"))
            for var, it in planner.shift.items():
                last_lines.append(f"    {var} = {_code(it.value).strip()}")  # type: ignore[arg-type]
            for it in planner.readback_items:
                last_lines.append(f"    {_one_line(it.node)}")  # type: ignore[arg-type]
        chunks = [
            [f"# step t = {T} - 1, as written", bind(f"{T} - 1")],
            [f"# steps t = {T} - 2 .. 1, vectorized"] + mid,
            ["# step t = 0, as written"] + last_lines + [bind("0")],
        ]
        # one parse for all the generated code: `if <guard>: pass`, then the chunks, `pass` between
        text = f"if {sub(guard)}:\n    pass\n" + "pass\n".join(
            "\n".join(sub(x) for x in chunk) + "\n" for chunk in chunks)
        parsed = list(cst.parse_module(text).body)
        head_if = parsed[0]
        parts: List[List[cst.BaseStatement]] = [[]]
        for st in parsed[1:]:
            if isinstance(st, cst.SimpleStatementLine) and len(st.body) == 1 and isinstance(st.body[0], cst.Pass):
                parts.append([])
                continue
            parts[-1].append(st)
        first, middle, last = parts
        rest: List[cst.BaseStatement] = middle + last + [s.deep_clone() for s in body]
        check = planner.carry_check("__SBX__")
        if check is not None:
            check = sub(check)
            # the carried values after the first step decide the arithmetic of the others: when
            # they are not what the vectorized steps compute with, the other steps run as written
            i = h.index if h.kind == "index" else planner.fresh("i")
            loop_text = f"for {i} in range({T} - 2, -1, -1):\n" + ("" if h.kind == "index" else f"    {bind(i)}\n") + "    pass\n"
            parsed_rest = cst.parse_module(f"if {check}:\n    pass\nelse:\n" + "".join(
                "    " + ln + "\n" for ln in loop_text.splitlines())).body[0]
            inner = parsed_rest.orelse.body.body[0]  # type: ignore[attr-defined]
            kept = [st for st in inner.body.body if not (isinstance(st, cst.SimpleStatementLine)
                                                         and isinstance(st.body[0], cst.Pass))]
            inner = inner.with_changes(body=inner.body.with_changes(body=kept + [s.deep_clone() for s in body]))
            rest = [parsed_rest.with_changes(
                body=cst.IndentedBlock(body=rest),
                orelse=cst.Else(body=cst.IndentedBlock(body=[inner])))]  # type: ignore[attr-defined]
        stmts: List[cst.BaseStatement] = first + [s.deep_clone() for s in body] + rest
        test = head_if.test  # type: ignore[attr-defined]
        loop = node.with_changes(leading_lines=())
        new = cst.If(
            test=test,
            body=cst.IndentedBlock(body=stmts),
            orelse=cst.Else(body=cst.IndentedBlock(body=[loop])),
            leading_lines=node.leading_lines,
        )
        kinds = ", ".join(n for n in notes)
        shape = "last step special-cased, " if planner.has_split else ""
        if planner.resets:
            shape += "episode resets as op stretches, "
        if exact and planner.cpu:
            # gradients: see runtime.vectorized.recurrence_ok (the guard cannot see uses outside the
            # loop, so the claim for them is conditional; values are exact whatever requires grad)
            exactness = ("bitwise exact on CPU; gradients through it bitwise too where no value they flow "
                         "through has more than two uses, in the loop and outside it, else reassociated "
                         "(autograd sums three or more contributions in another order)")
        elif exact:
            exact = False
            exactness = (f"reassociated on {ctx.backend}: the op runs a parallel scan there, equal to the "
                         "loop up to rounding (about 1e-6 relative in float32)")
        else:
            exactness = "reassociated: equal up to rounding (about 1e-6 relative in float32, 1e-15 in float64)"
        for name, code in planner.views:  # x_t[i] is x[:, i] in the user's text
            kinds = re.sub(rf"(?<![\w.]){re.escape(name)}\[", f"{code}[:, ", kinds)
        if planner.views:
            shape += "time along dimension 1, "
        needs = ("per-step inputs all tensors (or nn.Parameter), all numpy arrays, all lists of Python floats, "
                 "of tensors or of numpy rows, exact types, one float dtype, device and row shape; lists of "
                 "Python/numpy int or bool flags only with float64 maths")
        carried = "; the carried value after the first step of that kind and dtype (carry_ok), " \
            "else the other steps run as written" if planner.carry_check("_") else ""
        reason = (f"backward linear recurrence {kinds} ({shape}{exactness}): first and last step run as "
                  f"written, steps in between by linear_recurrence; guarded by recurrence_ok ({needs}{carried}), "
                  f"original loop kept in the else branch")
        return new, exact, reason
