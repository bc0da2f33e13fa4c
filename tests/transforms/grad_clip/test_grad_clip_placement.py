"""grad_clip's placement (insert.cst_line) reads the module's statements once per module, not
once per site: counted per site, a file of thousands of training steps was quadratic
(issue 19 item 13)."""
import ast

import libcst as cst

from scalebox_cst.transforms import partial
from scalebox_cst.transforms.grad_clip import insert


def test_each_site_is_found_and_the_module_is_counted_once(monkeypatch):
    src = "".join(f"def step_{i}(opt, loss):\n    loss.backward()\n    opt.step()\n\n\n" for i in range(200))
    module, tree = cst.parse_module(src), ast.parse(src)
    calls = []
    real = partial.elided_width
    monkeypatch.setattr(insert, "elided_width", lambda node: calls.append(1) or real(node))
    for i in range(0, 200, 4):  # the statement `opt.step()` of every fourth function
        loc = (("body", i), ("body", 1))
        line, index = insert.cst_line(module, loc, tree.body[i].body[1])
        assert index == 0 and module.code_for_node(line).strip() == "opt.step()"
        assert line is module.body[i].body.body[1]
    assert len(calls) == 200  # one per top-level statement, for all the sites together
