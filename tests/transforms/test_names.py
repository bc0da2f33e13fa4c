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
