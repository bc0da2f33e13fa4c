"""``module.code_for_node(node)``, written by one function per node type instead of libcst's.

libcst generates a node's code through ``_codegen``: per node a ``before_codegen`` and
``after_codegen`` hook, and per expression two generator context managers (``_parenthesize``
and ``record_syntactic_position``), all of them doing nothing for a plain ``CodegenState``. On
the rewritten functions of a dense file the codegen is a fifth of the rewrite (a 5,000-line
function of backward loops becomes ~30,000 lines: 1.5 of 7 CPU s, issue 19 item 13). The
emitters below write the very tokens libcst's ``_codegen_impl`` of the same type writes, in the
same order, for the types most code is made of; any other node (and its subtree) is written by
libcst itself into the same state, so the result is ``code_for_node``'s byte for byte
(tests/scalebox_cst/test_fastcode.py compares them on the corpus and the examples).

The emitters are copied from libcst 1.9; under another libcst version every node is left to
libcst's own codegen (``_COPIED_FROM``), until the copies are checked against it.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List

import libcst as cst
from libcst import MaybeSentinel
from libcst._nodes import op as _op
from libcst._nodes.internal import CodegenState
from libcst._version import version_tuple as _libcst_version

from scalebox_cst import continuation
from scalebox_cst.emitted import Emitted

_Emit = Callable[[Any, CodegenState], None]
_EMIT: Dict[type, _Emit] = {}


def code_for_node(module: cst.Module, node: cst.CSTNode) -> str:
    """``module.code_for_node(node)``."""
    state = CodegenState(default_indent=module.default_indent, default_newline=module.default_newline)
    _gen(node, state)
    return "".join(state.tokens)


def _gen(node: Any, state: CodegenState) -> None:
    emit = _EMIT.get(type(node))
    if emit is None:
        node._codegen(state)
    else:
        emit(node, state)


# -- whitespace and tokens ----------------------------------------------------------------


def _value(node: Any, state: CodegenState) -> None:  # SimpleWhitespace, Comment
    state.tokens.append(node.value)


def _newline(node: Any, state: CodegenState) -> None:
    value = node.value
    state.tokens.append(state.default_newline if value is None else value)


def _trailing(node: Any, state: CodegenState) -> None:
    _gen(node.whitespace, state)
    if node.comment is not None:
        _gen(node.comment, state)
    _gen(node.newline, state)


def _empty_line(node: Any, state: CodegenState) -> None:
    if node.indent:
        state.tokens.extend(state.indent_tokens)
    _gen(node.whitespace, state)
    if node.comment is not None:
        _gen(node.comment, state)
    _gen(node.newline, state)


def _one_token_op(node: Any, state: CodegenState) -> None:
    _gen(node.whitespace_before, state)
    state.tokens.append(node._get_token())
    _gen(node.whitespace_after, state)


def _two_token_op(node: Any, state: CodegenState) -> None:
    _gen(node.whitespace_before, state)
    first, second = node._get_tokens()
    state.tokens.append(first)
    _gen(node.whitespace_between, state)
    state.tokens.append(second)
    _gen(node.whitespace_after, state)


def _unary_op(node: Any, state: CodegenState) -> None:  # Minus, Plus, BitInvert, Not
    state.tokens.append(node._get_token())
    _gen(node.whitespace_after, state)


def _open(token: str) -> _Emit:
    def emit(node: Any, state: CodegenState) -> None:  # LeftParen, LeftSquareBracket
        state.tokens.append(token)
        _gen(node.whitespace_after, state)

    return emit


def _close(token: str) -> _Emit:
    def emit(node: Any, state: CodegenState) -> None:  # RightParen, RightSquareBracket
        _gen(node.whitespace_before, state)
        state.tokens.append(token)

    return emit


# -- expressions (each inside its own parentheses: ``_parenthesize``) ---------------------


def _parenthesized(body: _Emit) -> _Emit:
    def emit(node: Any, state: CodegenState) -> None:
        lpar, rpar = node.lpar, node.rpar
        for p in lpar:
            _gen(p, state)
        body(node, state)
        for p in rpar:
            _gen(p, state)

    return emit


def _leaf(node: Any, state: CodegenState) -> None:  # Name, Integer, Float, SimpleString
    state.tokens.append(node.value)


def _attribute(node: Any, state: CodegenState) -> None:
    _gen(node.value, state)
    _gen(node.dot, state)
    _gen(node.attr, state)


def _binary(node: Any, state: CodegenState) -> None:  # BinaryOperation, BooleanOperation
    _gen(node.left, state)
    _gen(node.operator, state)
    _gen(node.right, state)


def _unary(node: Any, state: CodegenState) -> None:
    _gen(node.operator, state)
    _gen(node.expression, state)


def _comparison(node: Any, state: CodegenState) -> None:
    _gen(node.left, state)
    for comp in node.comparisons:
        _gen(comp, state)


def _comparison_target(node: Any, state: CodegenState) -> None:
    _gen(node.operator, state)
    _gen(node.comparator, state)


def _comma(comma: Any, default: bool, state: CodegenState, default_text: str = ", ") -> None:
    if comma is MaybeSentinel.DEFAULT:
        if default:
            state.tokens.append(default_text)
    elif isinstance(comma, cst.Comma):
        _gen(comma, state)


def _arg(node: Any, state: CodegenState, default_comma: bool) -> None:
    state.tokens.append(node.star)
    _gen(node.whitespace_after_star, state)
    keyword = node.keyword
    if keyword is not None:
        _gen(keyword, state)
    equal = node.equal
    if equal is MaybeSentinel.DEFAULT and keyword is not None:
        state.tokens.append(" = ")
    elif isinstance(equal, cst.AssignEqual):
        _gen(equal, state)
    _gen(node.value, state)
    _comma(node.comma, default_comma, state)
    _gen(node.whitespace_after_arg, state)


def _call(node: Any, state: CodegenState) -> None:
    _gen(node.func, state)
    _gen(node.whitespace_after_func, state)
    state.tokens.append("(")
    _gen(node.whitespace_before_args, state)
    args = node.args
    last = len(args) - 1
    for i, arg in enumerate(args):
        if type(arg) is cst.Arg:
            _arg(arg, state, i != last)
        else:
            arg._codegen(state, default_comma=(i != last))
    state.tokens.append(")")


def _subscript_element(node: Any, state: CodegenState, default_comma: bool) -> None:
    _gen(node.slice, state)
    _comma(node.comma, default_comma, state)


def _subscript(node: Any, state: CodegenState) -> None:
    _gen(node.value, state)
    _gen(node.whitespace_after_value, state)
    _gen(node.lbracket, state)
    elements = node.slice
    last = len(elements) - 1
    for i, element in enumerate(elements):
        if type(element) is cst.SubscriptElement:
            _subscript_element(element, state, i != last)
        else:
            element._codegen(state, default_comma=(i != last))
    _gen(node.rbracket, state)


def _index(node: Any, state: CodegenState) -> None:
    star = node.star
    if star is not None:
        state.tokens.append(star)
    ws = node.whitespace_after_star
    if ws is not None:
        _gen(ws, state)
    _gen(node.value, state)


def _slice(node: Any, state: CodegenState) -> None:
    if node.lower is not None:
        _gen(node.lower, state)
    _gen(node.first_colon, state)
    if node.upper is not None:
        _gen(node.upper, state)
    second_colon = node.second_colon
    if second_colon is MaybeSentinel.DEFAULT and node.step is not None:
        state.tokens.append(":")
    elif isinstance(second_colon, cst.Colon):
        _gen(second_colon, state)
    if node.step is not None:
        _gen(node.step, state)


def _elements(elements: Any, state: CodegenState, single_tuple: bool) -> None:
    """Tuple's and List's elements (``Element._codegen_comma``)."""
    if single_tuple and len(elements) == 1:
        element = elements[0]
        if type(element) is cst.Element:
            _gen(element.value, state)
            _comma(element.comma, True, state, ",")
        else:
            element._codegen(state, default_comma=True, default_comma_whitespace=False)
        return
    last = len(elements) - 1
    for i, element in enumerate(elements):
        if type(element) is cst.Element:
            _gen(element.value, state)
            _comma(element.comma, i < last, state)
        else:
            element._codegen(state, default_comma=(i < last), default_comma_whitespace=True)


def _tuple(node: Any, state: CodegenState) -> None:
    _elements(node.elements, state, True)


def _list(node: Any, state: CodegenState) -> None:
    _gen(node.lbracket, state)
    _elements(node.elements, state, False)
    _gen(node.rbracket, state)


# -- small statements (written as the last of their line: no default semicolon) -----------


def _semicolon(node: Any, state: CodegenState) -> None:
    semicolon = node.semicolon
    if not isinstance(semicolon, MaybeSentinel) and isinstance(semicolon, cst.Semicolon):
        _gen(semicolon, state)


def _assign_target(node: Any, state: CodegenState) -> None:
    _gen(node.target, state)
    _gen(node.whitespace_before_equal, state)
    state.tokens.append("=")
    _gen(node.whitespace_after_equal, state)


def _assign(node: Any, state: CodegenState) -> None:
    for target in node.targets:
        _gen(target, state)
    _gen(node.value, state)
    _semicolon(node, state)


def _aug_assign(node: Any, state: CodegenState) -> None:
    _gen(node.target, state)
    _gen(node.operator, state)
    _gen(node.value, state)
    _semicolon(node, state)


def _expr_statement(node: Any, state: CodegenState) -> None:
    _gen(node.value, state)
    _semicolon(node, state)


def _return(node: Any, state: CodegenState) -> None:
    state.tokens.append("return")
    ws, value = node.whitespace_after_return, node.value
    if isinstance(ws, MaybeSentinel):
        if value is not None:
            state.tokens.append(" ")
    else:
        _gen(ws, state)
    if value is not None:
        _gen(value, state)
    _semicolon(node, state)


def _pass(node: Any, state: CodegenState) -> None:
    state.tokens.append("pass")
    _semicolon(node, state)


# -- statements ----------------------------------------------------------------------------


def _simple_line(node: Any, state: CodegenState) -> None:
    for line in node.leading_lines:
        _gen(line, state)
    state.tokens.extend(state.indent_tokens)
    body = node.body
    if body:
        last = len(body) - 1
        for i, small in enumerate(body):
            if i != last:
                small._codegen(state, default_semicolon=True)
            else:
                _gen(small, state)
    else:
        state.tokens.append("pass")
    _gen(node.trailing_whitespace, state)


def _indented_block(node: Any, state: CodegenState) -> None:
    _gen(node.header, state)
    indent = node.indent
    state.indent_tokens.append(state.default_indent if indent is None else indent)
    if node.body:
        for statement in node.body:
            _gen(statement, state)
    else:
        state.tokens.extend(state.indent_tokens)
        state.tokens.append("pass")
        state.tokens.append(state.default_newline)
    for line in node.footer:
        _gen(line, state)
    state.indent_tokens.pop()


def _if(node: Any, state: CodegenState, keyword: str = "if") -> None:
    for line in node.leading_lines:
        _gen(line, state)
    state.tokens.extend(state.indent_tokens)
    state.tokens.append(keyword)
    _gen(node.whitespace_before_test, state)
    _gen(node.test, state)
    _gen(node.whitespace_after_test, state)
    state.tokens.append(":")
    _gen(node.body, state)
    orelse = node.orelse
    if orelse is not None:
        if type(orelse) is cst.If:
            _if(orelse, state, "elif")
        elif isinstance(orelse, cst.If):
            orelse._codegen(state, is_elif=True)
        else:
            _gen(orelse, state)


def _else(node: Any, state: CodegenState) -> None:
    for line in node.leading_lines:
        _gen(line, state)
    state.tokens.extend(state.indent_tokens)
    state.tokens.append("else")
    _gen(node.whitespace_before_colon, state)
    state.tokens.append(":")
    _gen(node.body, state)


def _for(node: Any, state: CodegenState) -> None:
    for line in node.leading_lines:
        _gen(line, state)
    state.tokens.extend(state.indent_tokens)
    if node.asynchronous is not None:
        _gen(node.asynchronous, state)
    state.tokens.append("for")
    _gen(node.whitespace_after_for, state)
    _gen(node.target, state)
    _gen(node.whitespace_before_in, state)
    state.tokens.append("in")
    _gen(node.whitespace_after_in, state)
    _gen(node.iter, state)
    _gen(node.whitespace_before_colon, state)
    state.tokens.append(":")
    _gen(node.body, state)
    if node.orelse is not None:
        _gen(node.orelse, state)


def _while(node: Any, state: CodegenState) -> None:
    for line in node.leading_lines:
        _gen(line, state)
    state.tokens.extend(state.indent_tokens)
    state.tokens.append("while")
    _gen(node.whitespace_after_while, state)
    _gen(node.test, state)
    _gen(node.whitespace_before_colon, state)
    state.tokens.append(":")
    _gen(node.body, state)
    if node.orelse is not None:
        _gen(node.orelse, state)


def _decorated(node: Any, state: CodegenState) -> None:
    """What a ``def`` or a ``class`` writes before its keyword: comments, decorators, indent."""
    for line in node.leading_lines:
        _gen(line, state)
    for decorator in node.decorators:
        _gen(decorator, state)
    for line in node.lines_after_decorators:
        _gen(line, state)
    state.tokens.extend(state.indent_tokens)


def _named(node: Any, keyword: str, after: Any, state: CodegenState) -> None:
    """``def name[T]`` / ``class name[T]``: the keyword, its name and type parameters."""
    state.tokens.append(keyword)
    _gen(after, state)
    _gen(node.name, state)
    _gen(node.whitespace_after_name, state)
    if node.type_parameters is not None:
        _gen(node.type_parameters, state)
    _gen(node.whitespace_after_type_parameters, state)


def _function_def(node: Any, state: CodegenState) -> None:
    _decorated(node, state)
    if node.asynchronous is not None:
        _gen(node.asynchronous, state)
    _named(node, "def", node.whitespace_after_def, state)
    state.tokens.append("(")
    _gen(node.whitespace_before_params, state)
    _gen(node.params, state)
    state.tokens.append(")")
    if node.returns is not None:
        node.returns._codegen(state, default_indicator="->")
    _gen(node.whitespace_before_colon, state)
    state.tokens.append(":")
    _gen(node.body, state)


def _class_def(node: Any, state: CodegenState) -> None:
    """A class (a method rewritten in a class that is most of the file: the sweep's DI-engine
    policies paid libcst's codegen of the whole class for each version)."""
    _decorated(node, state)
    _named(node, "class", node.whitespace_after_class, state)
    args = [*node.bases, *node.keywords]
    if isinstance(node.lpar, MaybeSentinel):
        if args:
            state.tokens.append("(")
    else:
        _gen(node.lpar, state)
    last = len(args) - 1
    for i, arg in enumerate(args):
        arg._codegen(state, default_comma=(i != last))
    if isinstance(node.rpar, MaybeSentinel):
        if args:
            state.tokens.append(")")
    else:
        _gen(node.rpar, state)
    _gen(node.whitespace_before_colon, state)
    state.tokens.append(":")
    _gen(node.body, state)


# -- registration --------------------------------------------------------------------------

#: the libcst version (major, minor) whose ``_codegen_impl`` methods the emitters copy
_COPIED_FROM = (1, 9)


def _concrete(base: type) -> List[type]:
    out: List[type] = []
    todo = [base]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if not getattr(cls, "__abstractmethods__", None):
            out.append(cls)
    return out


def _table() -> Dict[type, _Emit]:
    if tuple(_libcst_version[:2]) != _COPIED_FROM:
        return {}
    table: Dict[type, _Emit] = {
        cst.SimpleWhitespace: _value,
        continuation.Continuation: continuation.write,
        cst.Comment: _value,
        cst.Newline: _newline,
        cst.TrailingWhitespace: _trailing,
        cst.EmptyLine: _empty_line,
        cst.LeftParen: _open("("),
        cst.RightParen: _close(")"),
        cst.LeftSquareBracket: _open("["),
        cst.RightSquareBracket: _close("]"),
        cst.Attribute: _parenthesized(_attribute),
        cst.BinaryOperation: _parenthesized(_binary),
        cst.BooleanOperation: _parenthesized(_binary),
        cst.UnaryOperation: _parenthesized(_unary),
        cst.Comparison: _parenthesized(_comparison),
        cst.ComparisonTarget: _comparison_target,
        cst.Call: _parenthesized(_call),
        cst.Subscript: _parenthesized(_subscript),
        cst.Index: _index,
        cst.Slice: _slice,
        cst.Tuple: _parenthesized(_tuple),
        cst.List: _parenthesized(_list),
        cst.AssignTarget: _assign_target,
        cst.Assign: _assign,
        cst.AugAssign: _aug_assign,
        cst.Expr: _expr_statement,
        cst.Return: _return,
        cst.Pass: _pass,
        cst.SimpleStatementLine: _simple_line,
        cst.IndentedBlock: _indented_block,
        cst.If: _if,
        cst.Else: _else,
        cst.For: _for,
        cst.While: _while,
        cst.FunctionDef: _function_def,
        cst.ClassDef: _class_def,
    }
    leaf = _parenthesized(_leaf)
    leaves: List[type] = [cst.Name, cst.Integer, cst.Float, cst.SimpleString]
    for base, emit in ((None, leaf), (_op._BaseOneTokenOp, _one_token_op), (_op._BaseTwoTokenOp, _two_token_op), (_op.BaseUnaryOp, _unary_op)):
        for cls in leaves if base is None else _concrete(base):
            table[cls] = emit
    return table


_EMIT.update(_table())

#: where a statement generated once for an Emitted node takes its indentation (no token of
#: Python source holds a NUL: the pipeline refuses such files)
_BASE = continuation.MARK


def _emitted(node: Emitted, state: CodegenState) -> None:
    """``node.write(state, _gen)`` (ours: the same under every libcst version), each statement row
    generated once: a rewritten loop holds the user's statements at up to five depths (steps as
    written, the loops kept as the fallback), and writing each again was most of its codegen. A
    statement is written into a state whose indentation is one marker token, then placed at each
    depth with the marker replaced by that depth's indentation: the codegen puts indentation
    only through the indent tokens (``add_indent_tokens``), so the text is what writing it there
    gives (tests/scalebox_cst/test_fastcode.py). A backslash continuation line moves with its
    statement (``continuation``): under the marker it is the marker and its column relative to
    the statement, except for a line left of its statement, whose row is written per depth."""
    for line in node.leading_lines:
        _gen(line, state)
    unit, newline = state.default_indent, state.default_newline
    outer = "".join(state.indent_tokens)
    tokens = state.tokens
    written: Dict[int, List[str]] = {}
    for depth, row in node.rows:
        if isinstance(row, str):
            tokens.append(outer)
            tokens.append(unit * depth + row)
            tokens.append(newline)
            continue
        done = written.get(id(row))
        if done is None:
            alone = CodegenState(default_indent=unit, default_newline=newline)
            alone.indent_tokens.append(_BASE)
            _gen(row, alone)
            done = written[id(row)] = alone.tokens if continuation.UNPLACED not in alone.tokens else []
        base = outer + unit * depth
        if done:
            tokens.extend([base if t is _BASE else t for t in done])
        else:  # (a statement writes at least its indentation: none is a row written per depth)
            here = CodegenState(default_indent=unit, default_newline=newline)
            here.indent_tokens.append(base)
            _gen(row, here)
            tokens.extend(here.tokens)


_EMIT[Emitted] = _emitted
