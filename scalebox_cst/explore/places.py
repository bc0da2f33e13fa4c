"""Tunable places: where a hyper-parameter lives in the code, found and rewritten with libcst.

In code-as-environment a hyper-parameter is a place in the code, not a flag of a tuner. Four
kinds are found, each holding a literal (a number, a string, a bool; ``-1e-3`` included):

- ``constant``: a module-level ``NAME = literal`` (or ``NAME: float = literal``);
- ``argparse``: ``add_argument("--gamma", ..., default=literal)`` (name: its dest, ``gamma``);
- ``field``: a field of a dataclass / tyro / attrs config (``learning_rate: float = 2.5e-4`` in
  CleanRL's ``Args``; ``field(default=literal)`` too), named ``learning_rate`` or ``Args.learning_rate``;
- ``kwarg``: a numeric keyword argument of a call (``Adam(..., lr=3e-4)``), named ``Adam.lr``;
- ``key``: a string key of a dict display bound by an assignment, anywhere (``config = {"lr":
  3e-4}`` in ``main()``; nested dicts too), named ``config.lr`` (``Agent.config.lr`` for
  ``self.config = {...}``);
- ``attribute``: ``self.NAME = literal`` in a class's ``__init__`` (``self.gamma = 0.99``), named
  ``Agent.gamma``.

The last two are named only by their qualified names: a short ``gamma`` that named the
``--gamma`` flag must not become ambiguous because an agent also sets ``self.gamma``.

A place is addressed by its name, its qualified name (``Args.learning_rate``, ``--gamma``) or
``path:line:name``; :func:`set_values` replaces exactly the literal of each place (same line, so
every other site's line numbers stay valid) and nothing else.
"""
from __future__ import annotations

import ast
import dataclasses
import math
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

KINDS = ("constant", "argparse", "field", "kwarg", "key", "attribute")
_DATACLASS_DECORATORS = {"dataclass", "define", "frozen", "mutable", "s", "attrs", "dataclasses.dataclass"}
_SKIP_KWARGS = {"default", "dest", "type", "help", "action", "nargs", "metavar", "required", "choices", "const"}


class PlaceError(ValueError):
    """A place that cannot be found or set; the message is one line."""


@dataclasses.dataclass(frozen=True)
class Place:
    """One tunable literal: where it is and what it holds now."""

    name: str  # what a study's params name it by: LR, gamma, learning_rate, Adam.lr
    qualified: str  # the unambiguous form: LR, --gamma, Args.learning_rate, Adam.lr
    kind: str
    path: str  # project-relative, "/"-separated
    line: int
    column: int  # of the literal's first character (0-based)
    value: Any
    text: str  # the literal as written (3e-4)
    end_column: int = -1  # where the literal ends on its line (exclusive; parentheses around it excluded)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def ref(self) -> str:
        return f"{self.path}:{self.line}:{self.name}"

    def to_json(self) -> Dict[str, Any]:
        return {"name": self.name, "qualified": self.qualified, "kind": self.kind, "path": self.path,
                "line": self.line, "column": self.column, "value": self.value, "text": self.text}


def literal_value(node: cst.BaseExpression) -> Tuple[bool, Any]:
    """(True, value) for a number, string, bool or None literal (a sign allowed on a number)."""
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return True, node.value == "True"
    if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString)):
        try:
            return True, ast.literal_eval(node.value)
        except (ValueError, SyntaxError):
            return False, None
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
        ok, value = literal_value(node.expression)
        if ok and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, -value if isinstance(node.operator, cst.Minus) else value
    return False, None


def _dotted(node: cst.BaseExpression) -> Optional[str]:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    if isinstance(node, cst.Call):
        return _dotted(node.func)
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Finder(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, path: str, code: cst.Module) -> None:
        self.path = path
        self.code = code
        self.places: List[Place] = []
        self.depth = 0  # function/class nesting: module constants are at depth 0
        self.classes: List[Tuple[str, bool]] = []  # (name, is a dataclass-like config)
        self.functions: List[Tuple[str, int]] = []  # (name, depth of its def): the innermost last

    def _add(self, name: str, qualified: str, kind: str, node: cst.BaseExpression, value: Any) -> None:
        span = self.get_metadata(PositionProvider, node)
        if span.end.line != span.start.line:  # a literal over several lines: a value would move the lines below
            return
        self.places.append(Place(name, qualified, kind, self.path, span.start.line, span.start.column, value,
                                 self.code.code_for_node(node), span.end.column))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append((node.name.value, self.depth))
        self.depth += 1

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.pop()
        self.depth -= 1

    def _in_init(self) -> bool:
        """In the body of a class's own ``__init__`` (not a function nested in it)."""
        return bool(self.functions and self.classes) and self.functions[-1][0] == "__init__" \
            and self.functions[-1][1] == self.depth - 1 and self.depth >= 2

    def _bound_name(self, target: cst.BaseAssignTargetExpression) -> Optional[str]:
        """``config`` for ``config = ...``, ``Agent.config`` for ``self.config = ...`` in a method
        of ``Agent``; None for other targets."""
        if isinstance(target, cst.Name):
            return target.value
        if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self" \
                and self.classes and self.functions:
            return f"{self.classes[-1][0]}.{target.attr.value}"
        return None

    def _dict_keys(self, prefix: str, node: cst.Dict, depth: int = 0) -> None:
        for element in node.elements:
            if not isinstance(element, cst.DictElement) or not isinstance(element.key, cst.SimpleString):
                continue
            try:
                key = ast.literal_eval(element.key.value)
            except (ValueError, SyntaxError):
                continue
            if not isinstance(key, str) or not key.isidentifier():
                continue
            if isinstance(element.value, cst.Dict) and depth < 8:
                self._dict_keys(f"{prefix}.{key}", element.value, depth + 1)
                continue
            ok, value = literal_value(element.value)
            if ok and value is not None:
                self._add(f"{prefix}.{key}", f"{prefix}.{key}", "key", element.value, value)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        names = {_dotted(d.decorator) for d in node.decorators}
        config = any(n and (n in _DATACLASS_DECORATORS or n.rpartition(".")[2] in ("dataclass", "define", "frozen"))
                     for n in names)
        self.classes.append((node.name.value, config and self.depth == 0))
        self.depth += 1

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.pop()
        self.depth -= 1

    def _in_config_body(self) -> bool:
        return bool(self.classes) and self.classes[-1][1] and self.depth == 1

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) != 1:
            return
        target = node.targets[0].target
        if isinstance(node.value, cst.Dict):
            bound = self._bound_name(target)
            if bound is not None:
                self._dict_keys(bound, node.value)
            return
        ok, value = literal_value(node.value)
        if not ok or value is None:
            return
        if self.depth == 0 and isinstance(target, cst.Name):
            self._add(target.value, target.value, "constant", node.value, value)
        elif self._in_init() and isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) \
                and target.value.value == "self":
            qualified = f"{self.classes[-1][0]}.{target.attr.value}"
            self._add(qualified, qualified, "attribute", node.value, value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is None or not isinstance(node.target, cst.Name):
            return
        name = node.target.value
        value_node = node.value
        if isinstance(value_node, cst.Dict):
            self._dict_keys(name, value_node)
            return
        if self._in_config_body() and isinstance(value_node, cst.Call) and _dotted(value_node.func) in ("field", "dataclasses.field", "attrs.field", "attr.ib"):
            default = next((a.value for a in value_node.args if a.keyword and a.keyword.value == "default"), None)
            if default is None:
                return
            value_node = default
        ok, value = literal_value(value_node)
        if not ok or value is None:
            return
        if self.depth == 0:
            self._add(name, name, "constant", value_node, value)
        elif self._in_config_body():
            self._add(name, f"{self.classes[-1][0]}.{name}", "field", value_node, value)

    def visit_Call(self, node: cst.Call) -> None:
        callee = _dotted(node.func) or ""
        last = callee.rpartition(".")[2]
        if last == "add_argument":
            flags = [a.value for a in node.args if a.keyword is None and isinstance(a.value, cst.SimpleString)]
            options = [ast.literal_eval(f.value) for f in flags]
            keywords = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
            if "default" not in keywords:
                return
            ok, value = literal_value(keywords["default"])
            if not ok or value is None or not options:
                return
            dest_node = keywords.get("dest")
            if isinstance(dest_node, cst.SimpleString):
                dest = ast.literal_eval(dest_node.value)
            else:
                longs = [o for o in options if isinstance(o, str) and o.startswith("--")]
                dest = (longs[0] if longs else str(options[0])).lstrip("-").replace("-", "_")
            flag = next((o for o in options if isinstance(o, str) and o.startswith("--")), str(options[0]))
            self._add(dest, flag, "argparse", keywords["default"], value)
            return
        if not last:
            return
        for arg in node.args:
            if arg.keyword is None or arg.keyword.value in _SKIP_KWARGS:
                continue
            ok, value = literal_value(arg.value)
            if ok and _is_number(value):
                self._add(f"{last}.{arg.keyword.value}", f"{last}.{arg.keyword.value}", "kwarg", arg.value, value)


def find_places(path: str, source: bytes) -> List[Place]:
    """The tunable places of one file, in source order (a file that does not parse: PlaceError)."""
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise PlaceError(f"{path}:{exc.raw_line}: does not parse ({exc.message})") from None
    finder = _Finder(path, module)
    MetadataWrapper(module, unsafe_skip_copy=True).visit(finder)
    return sorted(finder.places, key=lambda p: (p.line, p.column))


def lookup(key: str, places: Sequence[Place]) -> List[Place]:
    """The places ``key`` names: ``path:line:name`` or qualified name or name, the first form that matches."""
    for attr in ("ref", "qualified", "name"):
        found = [p for p in places if getattr(p, attr) == key]
        if found:
            return found
    return []


def resolve(key: str, places: Sequence[Place]) -> Place:
    """The one place ``key`` names; PlaceError listing the candidates when none or several do."""
    found = lookup(key, places)
    if len(found) == 1:
        return found[0]
    if found:
        raise PlaceError(f"{key!r} is ambiguous: {', '.join(f'{p.ref} ({p.kind})' for p in found)}; name one as path:line:name")
    names = sorted({p.qualified for p in places})
    raise PlaceError(f"unknown parameter {key!r}; tunable places: {', '.join(names) if names else '(none)'}")


def render(value: Any) -> str:
    """The literal text for a value (a float keeps a decimal point or exponent: 0.001, 1e-05)."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, float):
        if not math.isfinite(value):  # repr gives nan / inf: names, not literals (a NameError in the trial)
            raise PlaceError(f"cannot write {value!r} as a literal (not a finite number)")
        text = repr(value)
        return text if any(c in text for c in ".eE") else text + ".0"
    if isinstance(value, (int, str)):
        return repr(value)
    raise PlaceError(f"cannot write {value!r} as a literal")


def set_values(source: bytes, edits: Sequence[Tuple[Place, Any]]) -> bytes:
    """``source`` with each place's literal replaced by its new value, at the span the parse gave
    it (same line: every other site's line number stays valid). PlaceError when a place is not
    where it was found (the file changed since): the text at its span must still read as its value."""
    text = source.decode("utf-8")
    parts = re.split(r"(\r\n|\r|\n)", text)  # Python's line ends only (not \x0c or \u2028 inside strings)
    lines = [parts[i] + (parts[i + 1] if i + 1 < len(parts) else "") for i in range(0, len(parts), 2)]
    missing = []
    by_line: Dict[int, List[Tuple[Place, Any]]] = {}
    for place, value in edits:
        by_line.setdefault(place.line, []).append((place, value))
    for line, items in by_line.items():
        row = lines[line - 1] if 0 < line <= len(lines) else ""
        for place, value in sorted(items, key=lambda item: -item[0].column):  # right to left: columns stay valid
            old = row[place.column:place.end_column]
            ok = False
            try:
                ok = place.end_column > place.column and _same(ast.literal_eval(old), place.value)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                ok = False
            if not ok:
                missing.append(place.ref)
                continue
            row = row[:place.column] + render(value) + row[place.end_column:]
        if 0 < line <= len(lines):
            lines[line - 1] = row
    if missing:
        raise PlaceError(f"places no longer in the code: {', '.join(missing)}")
    return "".join(lines).encode("utf-8")


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and (a == b or (isinstance(a, float) and a != a and b != b))
