"""Device strings and placement flags: a ``"cuda"`` literal reaching a device argument,
followed back through names, attributes, parameters and argparse options; device comparisons;
cuDNN flag assignments dropped."""
from __future__ import annotations

import ast
import re
from typing import List, Optional, Set, Tuple

import libcst as cst

from scalebox_cst.report import REWRITTEN

from ...analysis.calls import call_argument, keyword_arg, positional_args
from ...names import ast_dotted
from .. import table as T
from ..edits import _Target
from ..facts import _Scope, _callees
from ..source import _NEWLINE, _raw_literal, _span


#: what may follow "cuda" in a built device string: nothing, or ":" and an index (digits or one
#: placeholder that the run fills in)
_INDEX_REST = re.compile(r"(?::(?:\d+|%[dis]|\{\w*\})?)?\Z")
#: a template opening with the placeholder of the device type (the first argument fills it)
_OPENS_WITH = {"%s": re.compile(r"%s(?=:|\Z)"), "{}": re.compile(r"\{0?\}(?=:|\Z)")}


def _mod_arguments(right: ast.expr) -> List[ast.expr]:
    """The values of ``template % right`` in order (a tuple display), or the one value."""
    if isinstance(right, ast.Tuple):
        return [] if any(isinstance(e, ast.Starred) for e in right.elts) else list(right.elts)
    return [] if isinstance(right, (ast.Dict, ast.Starred)) else [right]


def _prefix_slice(side: ast.expr) -> Tuple[ast.expr, Optional[ast.Constant]]:
    """``(X, n)`` for ``X[:n]`` (``X[0:n]``) with ``n`` an integer literal, else ``(side, None)``."""
    if isinstance(side, ast.Subscript) and isinstance(side.slice, ast.Slice) and side.slice.step is None:
        lower, upper = side.slice.lower, side.slice.upper
        if (lower is None or isinstance(lower, ast.Constant) and lower.value == 0 and type(lower.value) is int) \
                and isinstance(upper, ast.Constant) and type(upper.value) is int:
            return side.value, upper
    return side, None


class Placement:
    """Mixin of the analyzer: device literals and the flows that carry them, cuDNN flags."""

    def _literal_arg(self, entry: T.Swap, node: ast.Call, qual: Optional[str]) -> None:
        func = node.func
        quals, methods, keywords = _callees(entry)
        if qual not in quals and not (isinstance(func, ast.Attribute) and func.attr in methods) and not (
            keywords and any(k.arg in keywords for k in node.keywords)
        ):
            return  # no device position of this call
        for callee, index, keyword in entry.positions:
            if callee == "*":
                if index is not None:
                    continue
            elif callee.startswith("."):
                if not (isinstance(func, ast.Attribute) and func.attr == callee[1:] and not self.receiver_is_module(func)):
                    continue
            elif qual != callee:
                continue
            value = call_argument(node, index, keyword)
            if value is not None:
                assert self.scope is not None
                self._flow_value(entry, value, self.scope, node.lineno, 0)

    def _flow_value(self, entry: T.Swap, value: ast.expr, scope: _Scope, use_line: int, depth: int, via: str = "",
                    built: bool = False) -> None:
        """Plan the literal(s) ``value`` is made of; ``built``: ``value`` is the template of a string
        built at run time (``%``, ``.format``, ``+``), whose rest must provably be a device index."""
        if depth > 8:
            return
        regex, repl = entry.literal
        t = type(value)
        if t is ast.Constant:
            text = self.src.raw(value)
            if text is None:
                return
            match = re.search(regex, text)
            if match and (not built or _INDEX_REST.match(text[match.end():])):
                self._plan_literal(entry, _Target(value), regex, repl, use_line, via, _span(value))
            elif built and entry.literal == T.CUDA_LITERAL and "cuda" in text and value not in self.done_literals:
                self.done_literals.add(value)  # one report, whichever device entry reaches it first
                self.skip(entry, value, f"device string built from {text!r}: not provably 'cuda' or "
                          "'cuda:<index>', so not migrated (write it as f\"cuda:{i}\" or \"cuda:%d\" % i)")
        elif t is ast.JoinedStr:
            head = self._fstring_head(value)
            if head is not None and re.search(regex, head[0]):
                self._plan_literal(entry, _Target(value, "fpart"), regex, repl, use_line, via, head[1])
            elif head is None and value.values and isinstance(value.values[0], ast.FormattedValue):
                first = value.values[0]  # f"{kind}:{i}": the device type is the first value
                if first.conversion == -1 and first.format_spec is None:
                    self._flow_value(entry, first.value, scope, use_line, depth + 1, via)
        elif t is ast.IfExp:
            self._flow_value(entry, value.body, scope, use_line, depth + 1, via)
            self._flow_value(entry, value.orelse, scope, use_line, depth + 1, via)
        elif t is ast.BinOp and isinstance(value.op, ast.Add):
            self._flow_value(entry, value.left, scope, use_line, depth + 1, via, built=True)
        elif t is ast.BinOp and isinstance(value.op, ast.Mod):  # "cuda:%d" % i, "%s:%d" % (kind, i)
            self._flow_template(entry, value.left, _mod_arguments(value.right), scope, use_line, depth, via, "%s")
        elif t is ast.Call and isinstance(value.func, ast.Attribute) and value.func.attr == "format":
            args = [a for a in value.args if not isinstance(a, ast.Starred)] if len(value.args) == len(positional_args(value)) else []
            self._flow_template(entry, value.func.value, args, scope, use_line, depth, via, "{}")
        elif t is ast.Name:
            self.flows.append((scope, value.id, entry, use_line))
        elif t is ast.Attribute:
            text = ast_dotted(value)
            if text is not None and self.imports.qualify(value) is None:
                self.attr_flows.append((text, entry, use_line))

    def _flow_template(self, entry: T.Swap, template: ast.expr, args: List[ast.expr], scope: _Scope, use_line: int,
                       depth: int, via: str, placeholder: str) -> None:
        """A string formatted at run time: its template, or, where the template opens with a
        placeholder (``"%s:%d" % (kind, i)``, ``"{}:{}".format(kind, i)``), the first argument."""
        text = self.src.raw(template) if isinstance(template, ast.Constant) else None
        if text is not None and args and _OPENS_WITH.get(placeholder, re.compile("$^")).match(text):
            if _INDEX_REST.match(_OPENS_WITH[placeholder].sub("", text, count=1)):
                self._flow_value(entry, args[0], scope, use_line, depth + 1, via)
            return
        self._flow_value(entry, template, scope, use_line, depth + 1, via, built=True)

    def _fstring_head(self, node: ast.JoinedStr) -> Optional[Tuple[str, Tuple[int, int]]]:
        """The first text part of a one-literal f-string as libcst spells it, and its lines."""
        try:
            parsed = cst.parse_expression("(" + self.src.segment(node) + ")")
        except Exception:  # noqa: BLE001 - not an expression on its own: not a candidate
            return None
        if not isinstance(parsed, cst.FormattedString) or not parsed.parts:
            return None
        part = parsed.parts[0]
        if not isinstance(part, cst.FormattedStringText):
            return None
        return part.value, (node.lineno, node.lineno + len(_NEWLINE.findall(part.value)))

    def _plan_literal(self, entry: T.Swap, target: _Target, regex: str, repl: str, use_line: int, via: str,
                      span: Tuple[int, int]) -> None:
        if target.node in self.done_literals:
            return
        self.done_literals.add(target.node)
        reason = entry.reason
        if via:
            reason = f"{reason} ({via}, used as a device argument on line {use_line})"

        def fn(updated: cst.CSTNode) -> cst.CSTNode:
            if isinstance(updated, cst.SimpleString):
                prefix, quote = updated.prefix, updated.quote
                body = re.sub(regex, repl, updated.raw_value, count=1)
                return updated.with_changes(value=f"{prefix}{quote}{body}{quote}")
            assert isinstance(updated, cst.FormattedStringText)
            return updated.with_changes(value=re.sub(regex, repl, updated.value, count=1))

        self.edit(entry, target, fn, reason, span=span)

    def _compare(self, node: ast.Compare) -> None:
        entries = self.by_kind("compare")
        if not entries:
            return
        items = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            left, right = items[i], items[i + 1]
            if isinstance(op, (ast.Is, ast.IsNot)):
                continue
            for entry, _ in entries:
                for side, lit in ((left, right), (right, left)):
                    lits = [lit]
                    if isinstance(op, (ast.In, ast.NotIn)) and isinstance(lit, (ast.Tuple, ast.List, ast.Set)) and side is left:
                        lits = [el.value if isinstance(el, ast.Starred) else el for el in lit.elts]
                    elif isinstance(op, (ast.In, ast.NotIn)) and side is right:
                        # a substring test of the device text (``"cuda" in args.device``, ``"cuda" in
                        # str(device)``, ``"cuda" in dev.split(":")``): true of the migrated text as
                        # of the original one
                        side = self._text_of(side, parts=True)
                    elif isinstance(op, (ast.Eq, ast.NotEq)):
                        side, bound = _prefix_slice(side)  # ``dev[:4] == "cuda"``: the bound follows
                        side = self._text_of(side)  # ``dev.split(":")[0] == "cuda"``
                        for one in lits:
                            self._plan_test(entry, side, one, node.lineno, bound)
                        continue
                    else:
                        continue
                    for one in lits:
                        self._plan_test(entry, side, one, node.lineno)

    def _text_of(self, expr: ast.expr, parts: bool = False) -> ast.expr:
        """The device value a text test reads: ``X`` of ``str(X)`` (the builtin, not rebound in the
        module) and of ``X.split(":")[0]`` / ``X.partition(":")[0]`` (its type, the text before the
        index: ``"cuda"`` of ``"cuda:0"``, ``"npu"`` of ``"npu:0"``), and with ``parts`` (the right
        of ``in``) of ``X.split(":")``; else ``expr``. A slice by length (``X[:4]``) is not one:
        ``"npu:0"[:4]`` is no device type."""
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "str" \
                and "str" not in self.facts.bound and len(expr.args) == 1 and not expr.keywords \
                and not isinstance(expr.args[0], ast.Starred):
            return self._text_of(expr.args[0])
        if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) and expr.slice.value == 0 \
                and type(expr.slice.value) is int and self._split(expr.value, ("split", "partition")):
            return self._text_of(expr.value.func.value)
        if parts and self._split(expr, ("split",)):
            return self._text_of(expr.func.value)
        return expr

    def _split(self, expr: ast.expr, methods) -> bool:
        """``X.split(":")`` (or another of ``methods``) with that one argument, X not a module."""
        return (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in methods
                and len(expr.args) == 1 and not expr.keywords and isinstance(expr.args[0], ast.Constant)
                and expr.args[0].value == ":" and not self.receiver_is_module(expr.func))

    def _plan_test(self, entry: T.Swap, side: ast.expr, one: ast.expr, line: int,
                   bound: Optional[ast.Constant] = None) -> None:
        """The literal ``one`` a device value ``side`` is tested against, when it names CUDA:
        migrated with the device (now for a device's ``.type``, after the walk for a name or an
        attribute that a device argument reads). ``bound``: the ``n`` of ``side[:n]``, which
        must be the literal's length (it becomes the migrated literal's)."""
        text = self.src.raw(one)
        if text is None or not re.search(entry.literal[0], text):
            return
        if bound is not None:
            if not (isinstance(one, ast.Constant) and isinstance(one.value, str) and len(one.value) == bound.value
                    and isinstance(side, (ast.Name, ast.Attribute))):
                return
            assert self.scope is not None
            self.compares.append((self.scope, side, one, entry, bound))
            return
        if isinstance(side, ast.Attribute) and side.attr == "type" and not self.receiver_is_module(side):
            self._plan_literal(entry, _Target(one), entry.literal[0], entry.literal[1], line, "", _span(one))
        elif isinstance(side, (ast.Name, ast.Attribute)):
            assert self.scope is not None
            self.compares.append((self.scope, side, one, entry, None))

    def _prefix_test(self, node: ast.Call) -> None:
        """``device.startswith("cuda")`` (or ``str(device)``'s, or a tuple of prefixes): the prefix
        is migrated with the device, as a comparison's literal is."""
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr == "startswith" and node.args
                and not node.keywords and not any(isinstance(a, ast.Starred) for a in node.args)):
            return
        entries = self.by_kind("compare")
        if not entries or self.receiver_is_module(func):
            return
        side = self._text_of(func.value)
        first = node.args[0]
        lits = list(first.elts) if isinstance(first, ast.Tuple) else [first]
        if any(isinstance(el, ast.Starred) for el in lits):
            return
        for entry, _ in entries:
            for one in lits:
                self._plan_test(entry, side, one, node.lineno)

    # ------------------------------------------------------------------ after the walk
    def _finish(self) -> None:
        """Follow device values held in names and attributes back to their literals, then the
        comparisons with a device name, then the dropped statements."""
        names_seen: Set[Tuple[int, str, str]] = set()
        attrs_seen: Set[Tuple[str, str]] = set()
        ni = ai = 0
        while ni < len(self.flows) or ai < len(self.attr_flows):
            while ni < len(self.flows):
                scope, name, entry, line = self.flows[ni]
                ni += 1
                target = scope.resolve(name)
                if (id(target), name, entry.id) in names_seen:
                    continue
                names_seen.add((id(target), name, entry.id))
                self.device_names.add((id(target), name, entry.literal[0]))
                for value, where in target.bindings.get(name, []):
                    self._flow_value(entry, value, target if where is None else where, line, 1, f"`{name}` holds it")
                self._argument_flow(entry, target, name, line)
            while ai < len(self.attr_flows):
                text, entry, line = self.attr_flows[ai]
                ai += 1
                if (text, entry.id) in attrs_seen:
                    continue
                attrs_seen.add((text, entry.id))
                self.device_attrs.add((text, entry.literal[0]))
                for value, where in self.attr_bindings.get(text, []):
                    self._flow_value(entry, value, where, line, 1, f"`{text}` holds it")
                self._argparse_flow(entry, text, line)
        for scope, side, lit, entry, bound in self.compares:
            regex = entry.literal[0]
            if isinstance(side, ast.Name):
                flowing = (id(scope.resolve(side.id)), side.id, regex) in self.device_names
            else:
                flowing = (ast_dotted(side) or "", regex) in self.device_attrs
            if flowing:
                self._plan_literal(entry, _Target(lit), regex, entry.literal[1], lit.lineno, "compared with a device", _span(lit))
                if bound is not None:  # ``dev[:4] == "cuda"`` -> ``dev[:3] == "npu"``
                    size = len(re.sub(regex, entry.literal[1], str(lit.value), count=1))
                    self.edits.append((_Target(bound), lambda u, size=size: u.with_changes(value=str(size))))
        for line, dropped in self.drop_candidates.items():
            if len(dropped) == len(line.stmts) and not line.suite:
                self.line_drops.append(line.stmts[0])
            elif len(dropped) == len(line.stmts):  # a one-line suite: keep it valid
                self.edits.append((_Target(dropped[0], "stmt"), lambda u: cst.Pass()))
                for n in dropped[1:]:
                    self.edits.append((_Target(n, "stmt"), lambda u: cst.RemoveFromParent()))
            else:
                for n in dropped:
                    self.edits.append((_Target(n, "stmt"), lambda u: cst.RemoveFromParent()))

    def _argument_flow(self, entry: T.Swap, scope: _Scope, name: str, line: int) -> None:
        """A parameter reaching a device argument: what this module's callers pass for it."""
        func = self.functions.get(id(scope))
        if func is None:
            return
        callee, home, positional = func
        for call, where in self.calls.get(callee, []):
            if where.resolve(callee) is not home:
                continue
            index = positional.index(name) if name in positional else None
            value = call_argument(call, index, name)
            if value is not None:
                self._flow_value(entry, value, where, line, 1, f"passed as `{name}` to {callee}()")

    def _argparse_flow(self, entry: T.Swap, text: str, line: int) -> None:
        """``args.device`` reaching a device argument: the option's default and choices."""
        if "." not in text or self.scope is None:
            return
        call = self.arguments.get(text.rsplit(".", 1)[-1])
        if call is None:
            return
        default = keyword_arg(call, "default")
        if default is not None:
            self._flow_value(entry, default.value, self.scope, line, 1, f"default of option `{text}`")
        choices = keyword_arg(call, "choices")
        if choices is not None and isinstance(choices.value, (ast.List, ast.Tuple, ast.Set)):
            regex, repl = entry.literal
            for el in choices.value.elts:
                el = el.value if isinstance(el, ast.Starred) else el
                value = self.src.raw(el)
                if value is not None and re.search(regex, value):
                    self._plan_literal(entry, _Target(el), regex, repl, line, f"a choice of option `{text}`", _span(el))

    # ------------------------------------------------------------------ cuDNN flags
    def _drop_assign(self, node: ast.Assign) -> None:
        """``torch.backends.cudnn.<flag> = value``: dropped where nothing reads the flag back and the
        value costs nothing to skip (the setting has no effect on NPU)."""
        for entry, mode in self.by_kind("drop-assign"):
            quals = [self.imports.qualify(t) for t in node.targets]
            if not all(q and q.startswith(entry.pattern) for q in quals):
                continue
            if not self._side_effect_free(node.value):
                self.warn(entry, node, f"{entry.id}: kept, the assigned value is not a plain name, attribute "
                          "or literal (dropping the line would skip its evaluation); the setting has no effect on NPU")
                continue
            read = next((n for q, n in self._flag_reads(entry.pattern) if q in quals), None)
            if read is not None:
                self.warn(entry, node, f"{entry.id}: kept, the module reads this flag (line "
                          f"{read.lineno}): dropping the assignment could change what "
                          "it sees; the setting has no effect on NPU")
                continue
            line = self.lines[-1] if self.lines else None
            if line is None:
                continue
            self.drop_candidates.setdefault(line, []).append(node)
            self.site(entry, _span(node), REWRITTEN, entry.reason, entry.exactness)

    def _flag_reads(self, prefix: str) -> List[Tuple[str, ast.Attribute]]:
        """Loads of attributes under ``prefix`` (``torch.backends.cudnn.benchmark`` read back by
        a print or an ``if``), by qualified name: a dropped assignment would change what they see."""
        found = self.__dict__.get("_reads")
        if found is None:
            found = self.__dict__["_reads"] = [
                (q, n)
                for n in ast.walk(self.ctx.tree)
                if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)
                for q in (self.imports.qualify(n),)
                if q and q.startswith(prefix)
            ]
        return found

    def _side_effect_free(self, value: ast.AST) -> bool:
        if isinstance(value, ast.Name):
            return True
        if isinstance(value, ast.Constant):
            v = value.value
            if v is True or v is False or v is None or type(v) in (int, float):
                return True
            if isinstance(v, (str, bytes)):  # one literal (a SimpleString), not a concatenation
                return _raw_literal(self.src.segment(value), allow_bytes=True) is not None
            return False
        if isinstance(value, ast.Attribute):
            return ast_dotted(value) is not None
        if isinstance(value, ast.UnaryOp):
            return self._side_effect_free(value.operand)
        return False
