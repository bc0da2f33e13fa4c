"""A rewrite leaves no reference cycles: what it made is freed when it is dropped, not at the next
garbage collection.

The pipeline turns the collector off while it rewrites (a collection walks every live tree node),
so a cycle that reaches a tree keeps that whole tree, and everything reachable from it, alive until
a collection runs. One such cycle (a loop's facts held the facts of its function, which held the
loop's) left a 50k-line file's libcst tree as garbage: about 3 s of collection when the process
ended. The usual culprit is a nested function that calls itself (its closure cell holds it), or an
object holding a callback that holds the object. The engine writes such walks as module
functions or methods, which this file checks in the source and in what rewrites leave behind.
"""
from __future__ import annotations

import ast
import gc
import glob
import os
import textwrap
from typing import Dict, List, Set

import pytest

import harness
from harness import pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE = ("scalebox_cst", "transforms", "runtime")


def _nested_functions(fn: ast.AST) -> Dict[str, ast.AST]:
    """The functions defined directly in ``fn``'s scope (not inside a deeper def, class or lambda)."""
    out: Dict[str, ast.AST] = {}
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[n.name] = n
        elif not isinstance(n, (ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(n))
    return out


def closure_cycles(source: str, path: str) -> List[str]:
    """``path:line: outer.inner`` for each nested function that reaches itself through the names
    of its sibling closures (itself included): its closure cell and it form a cycle."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        defs = _nested_functions(fn)
        calls = {name: {n.id for n in ast.walk(d) if isinstance(n, ast.Name) and n.id in defs} for name, d in defs.items()}
        for name, d in sorted(defs.items(), key=lambda item: item[1].lineno):
            seen: Set[str] = set()
            todo = list(calls[name])
            while todo:
                other = todo.pop()
                if other == name:
                    found.append(f"{path}:{d.lineno}: {fn.name}.{name}")
                    break
                if other not in seen:
                    seen.add(other)
                    todo.extend(calls[other])
    return found


def test_no_engine_closure_calls_itself():
    problems = []
    for folder in ENGINE:
        for path in sorted(glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True)):
            with open(path, encoding="utf-8") as f:
                problems += closure_cycles(f.read(), os.path.relpath(path, ROOT))
    assert problems == [], "write these walks as module functions or methods:\n" + "\n".join(problems)


def test_closure_check_finds_self_and_mutual_recursion():
    source = textwrap.dedent('''
        def outer(tree):
            def walk(n):
                for c in n:
                    walk(c)
            def even(n):
                return n == 0 or odd(n - 1)
            def odd(n):
                return n != 0 and even(n - 1)
            def leaf(n):
                return helper(n)
            return walk, even, leaf
        def helper(n):
            return helper(n - 1) if n else 0
    ''')
    assert closure_cycles(source, "m.py") == ["m.py:3: outer.walk", "m.py:6: outer.even", "m.py:8: outer.odd"]


def _inputs() -> Dict[str, bytes]:
    paths = sorted(glob.glob(os.path.join(ROOT, "tests", "corpus", "*.py")))
    paths += sorted(glob.glob(os.path.join(ROOT, "examples", "**", "*.py"), recursive=True))
    out = {os.path.relpath(p, ROOT): open(p, "rb").read() for p in paths}
    shapes = harness.load_path(os.path.join(ROOT, "benchmarks", "bench_scaling.py"), "bench_scaling")
    out["loops.py"] = shapes.make_source(400, "loops").encode()  # one function of 44 GAE loops
    out["block.py"] = shapes.make_source(200, "block").encode()  # sites of eight transforms, names reused
    return out


def _held_in_cycles() -> List[str]:
    """What a collection now finds unreachable that a rewrite made: libcst nodes, ``ast``
    statements, and objects, functions and classes of the engine (the standard library's
    ``ast.literal_eval``, which libcst's ``evaluated_value`` calls, leaves a small cycle of its own
    per call: its recursive ``_convert``, holding only the literal's own parse)."""
    import libcst as cst

    engine = ("scalebox_cst", "transforms", "runtime")
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = []
        for o in gc.garbage:
            kind = o if isinstance(o, type) else type(o)
            module = getattr(o, "__module__", None) if callable(o) else kind.__module__
            if isinstance(o, (cst.CSTNode, ast.stmt)) or (module or "").startswith(engine):
                found.append(getattr(o, "__qualname__", None) if isinstance(o, type) or callable(o) else kind.__qualname__)
        return found
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@pytest.mark.parametrize("backend", ["cpu", "npu"])
def test_a_rewrite_leaves_no_tree_in_a_reference_cycle(backend):
    rewriter = pipeline(backend=backend)
    inputs = _inputs()
    for name, data in inputs.items():  # once first: imports and first-use caches make garbage of their own
        rewriter.rewrite(name, data)
    gc.collect()
    # every file rewritten with the collector off (the pipeline leaves it as it found it), then one
    # collection finds what any of them left in a cycle: a full collection per file was most of
    # this test's 40 s; only when something is found is each file rewritten again to name it
    gc.disable()
    try:
        for name, data in inputs.items():
            result = rewriter.rewrite(name, data)
            assert result.report.error is None, result.report.error
            del result
        held = _held_in_cycles()
    finally:
        gc.enable()
    left = {}
    if held:
        for name, data in inputs.items():
            rewriter.rewrite(name, data)
            found = _held_in_cycles()
            if found:
                left[name] = sorted(set(found))[:8]
    assert left == {} and held == []
    assert len(inputs) > 20
