"""fastcode.code_for_node writes what libcst's Module.code_for_node writes, byte for byte: on
parsed code (the corpus, the examples, this repository's own modules, rewritten bench files) and
on nodes built without a parser, whose defaults (MaybeSentinel commas, semicolons, whitespace)
libcst fills in at codegen."""
from __future__ import annotations

import glob
import os

import libcst as cst
import pytest

from scalebox_cst import fastcode

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _files():
    found = []
    for pattern in ("tests/corpus/*.py", "examples/**/*.py", "scalebox_cst/*.py", "transforms/vectorize/**/*.py"):
        found.extend(sorted(glob.glob(os.path.join(ROOT, pattern), recursive=True)))
    return found


def _same_for_every_node(module: cst.Module) -> int:
    """Compare on every statement and every expression of ``module``; the number compared."""
    nodes = []

    class Collect(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, (cst.BaseStatement, cst.BaseSmallStatement, cst.BaseExpression, cst.IndentedBlock)):
                nodes.append(node)
            return True

    module.visit(Collect())
    for node in nodes:
        assert fastcode.code_for_node(module, node) == module.code_for_node(node), cst.Module([]).code_for_node(node)[:200]
    return len(nodes)


@pytest.mark.parametrize("path", _files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_parsed_code_is_written_as_libcst_writes_it(path):
    with open(path, encoding="utf-8") as f:
        module = cst.parse_module(f.read())
    assert "".join(fastcode.code_for_node(module, n) for n in (*module.header, *module.body, *module.footer)) == "".join(
        module.code_for_node(n) for n in (*module.header, *module.body, *module.footer)
    )
    _same_for_every_node(module)


def _built() -> cst.Module:
    """Statements made node by node, as transforms make them: every optional token left default."""
    name = cst.Name
    call = cst.Call(func=cst.Attribute(value=name("torch"), attr=name("stack")),
                    args=[cst.Arg(name("xs")), cst.Arg(cst.Integer("0"), keyword=name("dim"))])
    single = cst.Tuple([cst.Element(name("a"))])
    pair = cst.Tuple([cst.Element(name("a")), cst.Element(name("b"))], lpar=[], rpar=[])
    sub = cst.Subscript(value=name("x"), slice=[cst.SubscriptElement(cst.Index(name("i"))),
                                                cst.SubscriptElement(cst.Slice(lower=None, upper=cst.Integer("3"), step=cst.Integer("2")))])
    body = [
        cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(name("y"))], call),
                                 cst.AugAssign(name("y"), cst.AddAssign(), cst.Integer("1"))]),
        cst.SimpleStatementLine([cst.Expr(cst.List([cst.Element(single), cst.Element(pair)]))]),
        cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(name("z"))], sub)]),
        cst.If(test=cst.Comparison(name("a"), [cst.ComparisonTarget(cst.IsNot(), cst.Name("None"))]),
               body=cst.IndentedBlock([cst.SimpleStatementLine([cst.Pass()])]),
               orelse=cst.If(test=cst.UnaryOperation(cst.Not(), name("b")), body=cst.IndentedBlock([]),
                             orelse=cst.Else(cst.IndentedBlock([cst.SimpleStatementLine([cst.Return()])])))),
        cst.For(target=name("i"), iter=cst.Call(name("range"), [cst.Arg(name("n"))]),
                body=cst.IndentedBlock([cst.SimpleStatementLine([cst.Return(cst.BooleanOperation(name("a"), cst.And(), name("b")))])])),
        cst.While(test=cst.BinaryOperation(name("a"), cst.Multiply(), cst.Float("1.5")),
                  body=cst.IndentedBlock([cst.SimpleStatementLine([cst.Expr(cst.SimpleString("'s'"))])], indent="  ")),
        cst.SimpleStatementLine([]),
    ]
    fn = cst.FunctionDef(name("f"), cst.Parameters([cst.Param(name("xs"))]), cst.IndentedBlock(body))
    return cst.Module([fn])


def test_built_nodes_take_libcst_defaults():
    module = _built()
    text = fastcode.code_for_node(module, module.body[0])
    assert text == module.code_for_node(module.body[0])
    assert "(a,)" in text and "y = torch.stack(xs, dim = 0); y += 1" in text  # the defaults were written
    assert _same_for_every_node(module) > 20


def test_built_classes_take_libcst_defaults():
    """Class statements made node by node: bases and keywords with default parentheses and
    commas, none at all, a decorator (the classes of a file are written by fastcode too)."""
    name = cst.Name
    body = cst.IndentedBlock([cst.SimpleStatementLine([cst.Pass()])])
    classes = [
        cst.ClassDef(name("A"), body, bases=[cst.Arg(name("nn_Module")), cst.Arg(name("Mixin"))],
                     keywords=[cst.Arg(name("Meta"), keyword=name("metaclass"))]),
        cst.ClassDef(name("B"), body),
        cst.ClassDef(name("C"), body, decorators=[cst.Decorator(name("dataclass"))], bases=[cst.Arg(name("A"))]),
    ]
    module = cst.Module(classes)
    for node in classes:
        assert fastcode.code_for_node(module, node) == module.code_for_node(node)
    assert "class A(nn_Module, Mixin, metaclass = Meta):" in module.code


def test_other_node_types_are_left_to_libcst():
    module = cst.parse_module("class C:\n    x: int = 1\n    def g(self, *a, **k):\n        return {k: v for k, v in a if (w := k)}\n")
    assert fastcode.code_for_node(module, module.body[0]) == module.code


_ROW_STATEMENTS = '''\
if t == T - 1:  # the last step
    nv = next_value
else:
    nv = (values[t + 1]
          * masks[t])  # a bracket over two lines keeps its own whitespace
    s = """a string
over two lines"""
delta = rewards[t] + gamma * nv - values[t]
for k in range(3):

    # a comment line in the block
    x[k] = k
'''


@pytest.mark.parametrize("outer", [0, 1, 2])
def test_emitted_rows_are_written_as_each_statement_written_at_its_depth(outer):
    """An Emitted node writes each of its statements once and places it at every depth it stands
    at: the text is libcst's writing of the same rows (Emitted.write with libcst's codegen)."""
    from scalebox_cst.emitted import Emitted

    stmts = cst.parse_module(_ROW_STATEMENTS).body
    rows = [(0, "if ok:")] + [(1, s) for s in stmts] + [(0, "else:"), (1, "for t in range(T):")] + \
        [(2, s) for s in stmts] + [(0, "t = 0")] + [(3, stmts[0])]
    node = Emitted(rows=tuple(rows))
    module = cst.Module(body=[node])
    for _ in range(outer):  # inside blocks: the enclosing indentation comes first
        module = cst.Module(body=[cst.FunctionDef(name=cst.Name("f"), params=cst.Parameters(),
                                                  body=cst.IndentedBlock(body=list(module.body)))])
    want = module.code
    got = "".join(fastcode.code_for_node(module, n) for n in module.body)
    assert got == want
    assert got.count("nv = next_value") == 3
