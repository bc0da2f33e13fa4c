"""rewrite_caches: the analyses' module-level caches hold the trees of the file under rewrite
only while it is rewritten. After a rewrite, the libcst and ast nodes still alive do not grow
with the file (they held one version's trees: a watcher kept them until the next save, and
interpreter exit took seconds to tear them down)."""
from __future__ import annotations

import ast
import gc
import os
import sys

import libcst as cst
import pytest

import harness
from conftest import TESTS
from scalebox_cst.transforms import rewrite_caches

sys.path.insert(0, os.path.join(os.path.dirname(TESTS), "benchmarks"))
import bench_scaling  # noqa: E402


def _nodes_alive() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, (cst.CSTNode, ast.AST)))


@pytest.mark.parametrize("shape", ["mixed", "loops"])
def test_nodes_alive_after_a_rewrite_do_not_grow_with_the_file(shape):
    pipe = harness.pipeline()
    pipe.rewrite("warm.py", bench_scaling.make_source(300, shape).encode())  # shapes, types: cached
    base = _nodes_alive()
    small = pipe.rewrite("small.py", bench_scaling.make_source(300, shape).encode())
    after_small = _nodes_alive() - base
    big = pipe.rewrite("big.py", bench_scaling.make_source(3000, shape).encode())
    after_big = _nodes_alive() - base
    assert small.changed and big.changed and len(big.report.sites) > 5 * len(small.report.sites)
    # a version of the 3000-line file is tens of thousands of nodes; generated shapes parsed
    # once (analysis.cstclone) are a few hundred whatever the file
    assert after_big < 2000 and after_big < after_small + 1000, (after_small, after_big)


def test_held_and_mapping_are_reset_by_empty():
    slot = rewrite_caches.held(None, {})
    cache = rewrite_caches.mapping()
    slot[:] = ["module", {"k": 1}]
    cache[1] = "walk"
    rewrite_caches.empty()
    assert slot == [None, {}] and cache == {}
