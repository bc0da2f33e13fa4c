"""No libcst transformer class is defined inside a function in the engine.

libcst's ``CSTNode.visit`` asks ``isinstance(visitor, CSTVisitor)``; for a transformer class it
has not seen, ``ABCMeta`` walks every CSTVisitor subclass alive. A class made per call stays
alive while the pipeline has the collector off, so per-call transformer classes made a file of
thousands of sites quadratic (issue 19 item 13: 50k-line ``mixed`` in benchmarks/bench_scaling).
"""
import ast
import glob
import os

from conftest import TESTS

ROOT = os.path.dirname(TESTS)
TRANSFORMER_BASES = {"CSTTransformer", "MatcherDecoratableTransformer"}


def _nested_transformers(path):
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ClassDef):
                bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
                if bases & TRANSFORMER_BASES:
                    found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name}")
    return found


def test_no_transformer_class_is_made_per_call():
    paths = [p for d in ("scalebox_cst", "transforms", "runtime")
             for p in glob.glob(os.path.join(ROOT, d, "**", "*.py"), recursive=True)
             if not p.endswith("_examples.py")]
    assert len(paths) > 100
    found = [f for p in paths for f in _nested_transformers(p)]
    assert not found, found


def test_the_check_sees_a_nested_transformer(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import libcst as cst\ndef f():\n    class T(cst.CSTTransformer):\n        pass\n")
    assert _nested_transformers(str(path)) == [f"{os.path.relpath(str(path), ROOT)}:3 T"]
