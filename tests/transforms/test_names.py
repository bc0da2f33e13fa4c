"""Qualified names through imports: the same callee under any import spelling."""
import libcst as cst
import pytest

from scalebox_cst.transforms.names import ImportMap, add_imports


def qual(src: str, expr: str):
    return ImportMap(cst.parse_module(src)).qualify(cst.parse_expression(expr))


@pytest.mark.parametrize(
    "src, expr",
    [
        ("import torch\n", "torch.nn.utils.clip_grad_norm_"),
        ("import torch as th\n", "th.nn.utils.clip_grad_norm_"),
        ("from torch.nn.utils import clip_grad_norm_\n", "clip_grad_norm_"),
        ("from torch.nn.utils import clip_grad_norm_ as cg\n", "cg"),
        ("from torch import nn\n", "nn.utils.clip_grad_norm_"),
        ("import torch.nn as nn\n", "nn.utils.clip_grad_norm_"),
        ("import torch.nn.utils\n", "torch.nn.utils.clip_grad_norm_"),
        ("def f():\n    import torch as T\n", "T.nn.utils.clip_grad_norm_"),
    ],
)
def test_spellings_resolve_to_one_name(src, expr):
    assert qual(src, expr) == "torch.nn.utils.clip_grad_norm_"


def test_unknown_and_rebound_names_are_not_trusted():
    assert qual("import torch\n", "clip_grad_norm_") is None
    assert qual("import torch\ntorch = None\n", "torch.cuda") is None
    assert qual("from . import torch\n", "torch.cuda") is None


def test_add_imports_after_docstring_and_future_once():
    src = '"""Doc."""\nfrom __future__ import annotations\n# lead comment\nimport os\n'
    mod = add_imports(cst.parse_module(src), ["import sys", "import sys"])
    assert mod.code == '"""Doc."""\nfrom __future__ import annotations\nimport sys\n# lead comment\nimport os\n'
    again = add_imports(mod, ["import sys"])
    assert again.code == mod.code


def test_unique_name_avoids_user_names():
    imports = ImportMap(cst.parse_module("_helper = 1\n_helper_2 = 2\n"))
    assert imports.unique_name("_helper") == "_helper_3"


def _reference_scan(tree):
    """_scan_imports written with ast.walk (breadth first): imports by depth and order, names."""
    import ast as _ast
    from scalebox_cst.transforms.analysis.scopes import star_names
    imports, assigned, names = [], set(), set()
    level, depth = [tree], 0
    while level:
        below = []
        for node in level:
            below.extend(_ast.iter_child_nodes(node))
            if isinstance(node, _ast.Name):
                names.add(node.id)
                if isinstance(node.ctx, (_ast.Store, _ast.Del)):
                    assigned.add(node.id)
            elif isinstance(node, _ast.Import):
                for a in node.names:
                    local = a.asname or a.name.split(".")[0]
                    imports.append((depth, len(imports), local, a.name if a.asname else local))
            elif isinstance(node, _ast.ImportFrom):
                if node.level or not node.module:
                    if any(a.name == "*" for a in node.names):
                        imports.append((depth, len(imports), "*", "*"))
                    continue
                for a in node.names:
                    if a.name != "*":
                        imports.append((depth, len(imports), a.asname or a.name, node.module + "." + a.name))
                    elif star_names(node.module) is None:
                        imports.append((depth, len(imports), "*", "*"))
                    else:
                        for n in sorted(star_names(node.module)):
                            imports.append((depth, len(imports), n, "*" + node.module + "." + n))
            elif isinstance(node, (_ast.FunctionDef, _ast.AsyncFunctionDef, _ast.ClassDef)):
                assigned.add(node.name)
                names.add(node.name)
                if not isinstance(node, _ast.ClassDef):
                    a = node.args
                    for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg):
                        if arg is not None:
                            assigned.add(arg.arg)
                            names.add(arg.arg)
            elif isinstance(node, _ast.arg):
                names.add(node.arg)
            elif isinstance(node, (_ast.For, _ast.AsyncFor, _ast.comprehension)):
                todo = [node.target]  # names, tuples, lists and starred of them (not x.a, x[i])
                while todo:
                    t = todo.pop()
                    if isinstance(t, _ast.Name):
                        assigned.add(t.id)
                    elif isinstance(t, (_ast.Tuple, _ast.List)):
                        todo.extend(t.elts)
                    elif isinstance(t, _ast.Starred):
                        todo.append(t.value)
        level, depth = below, depth + 1
    return imports, frozenset(assigned), frozenset(names)


def test_scan_imports_is_the_breadth_first_walk():
    """The scan dispatches on node type (cached per type) and skips the context under each Name:
    the same imports, in the same depth and order, and the same names as a plain walk."""
    import ast as _ast
    import glob as _glob
    import os as _os
    from scalebox_cst.transforms.names import _scan_imports
    root = _os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))
    extra = "import a.b as c, d.e\nfrom m import *\nfrom math import *\nfrom . import z\ndef f(p, *q, r=1, **s):\n    import os\n    for (i, [j, *k]) in x:\n        del y\n    for o.a in x:\n        pass\n    [w for w in v]\n"
    sources = [extra] + [open(p, encoding="utf-8").read() for p in sorted(_glob.glob(_os.path.join(root, "tests", "corpus", "*.py")))]
    for text in sources:
        tree = _ast.parse(text)
        for node in [tree, *tree.body]:
            assert _scan_imports(node) == _reference_scan(node)
