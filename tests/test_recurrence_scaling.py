"""The recurrence transform's work grows linearly with the backward loops of one function (each
loop's checks of what its function does outside it once walked the whole function: a file with
thousands of GAE loops gave no result). Counted in tree nodes visited, not timed; speed is in
benchmarks/bench_scaling.py (shape ``loops``)."""
import importlib.util
import os

from scalebox_cst.config import Config
from scalebox_cst.pipeline import Pipeline
from scalebox_cst.transforms.analysis import cstwalk
from scalebox_cst.transforms.vectorize.recurrence import function_facts


def _bench_loop() -> str:
    """The ``loops`` shape's GAE loop, from the benchmark that times it (one text for both)."""
    spec = importlib.util.spec_from_file_location(
        "bench_scaling", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "bench_scaling.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LOOP


LOOP = _bench_loop()


def one_function(loops: int) -> bytes:
    body = "".join(LOOP.format(i=i) for i in range(loops))
    return f"import torch\n\n\ndef analyse(rewards, values, masks, next_value, gamma, lam, T):\n{body}    return last\n".encode()


def test_nodes_visited_grow_linearly_with_the_loops_of_one_function(monkeypatch):
    visited = [0]
    real = cstwalk.children

    def counting(n):
        visited[0] += 1
        return real(n)

    monkeypatch.setattr(cstwalk, "children", counting)
    pipeline = Pipeline(Config(), "cpu")
    counts = {}
    for loops in (10, 20, 40):
        visited[0] = 0
        result = pipeline.rewrite("gen.py", one_function(loops))
        assert sum(s.action == "rewritten" for s in result.report.sites) == loops
        counts[loops] = visited[0]
    # linear: doubling the loops doubles the work (it was x2.7, then x3.0: quadratic)
    assert counts[20] / counts[10] < 2.2 and counts[40] / counts[20] < 2.2, counts


def test_facts_of_a_function_answer_as_a_walk_outside_the_loop_would():
    import libcst as cst

    module = cst.parse_module(
        "def f(x):\n"
        "    out = [0.0] * 5\n"
        "    g = lambda: out\n"
        "    for t in reversed(range(5)):\n"
        "        out[t] = last = x[t]\n"
        "        tmp = 1\n"
        "    tmp = 2\n"
        "    for t in reversed(range(5)):\n"
        "        y = locals()\n"
        "    return last\n"
    )
    func = module.body[0]
    first, second = [s for s in func.body.body if isinstance(s, cst.For)]
    facts = function_facts.facts(func)
    assert function_facts.facts(func) is facts  # gathered once per function
    outside = facts.outside(first)
    assert outside.names("last") == 1 and outside.names("t") == 1 and outside.names("tmp") == 1
    assert outside.reads("tmp") == 0 and outside.reads("out") == 1  # `tmp = 2` is no read; g reads out
    assert outside.frame_readers() == 1  # locals() in the second loop
    assert facts.outside(second).frame_readers() == 0
    assert outside.unknown_bindings("out") == 0 and cst.Module([]).code_for_node(outside.first_binding("out")).strip() == "out = [0.0] * 5"
    assert outside.unknown_bindings("t") == 1  # the second loop's target
    assert any("out" in text for _, text in facts.scopes)  # the lambda names it


def test_a_long_rewrite_says_how_far_it_is_from_inside_the_transform(monkeypatch):
    from scalebox_cst import pipeline as pipeline_module

    monkeypatch.setattr(pipeline_module, "PROGRESS_AFTER", 0.0)
    monkeypatch.setattr(pipeline_module, "PROGRESS_EVERY", 0.0)  # every step (normally: every 5 s)
    pipeline = Pipeline(Config(), "cpu")
    lines = []
    pipeline.progress = lines.append
    pipeline.rewrite("gen.py", one_function(6))
    inside = [line for line in lines if "vectorize.recurrence: " in line]
    assert [line.split("vectorize.recurrence: ")[1].split(" after")[0] for line in inside] == [
        f"{k}/6 backward loops" for k in range(6)]
    assert all(line.startswith("scalebox: gen.py: ") and "\n" not in line for line in lines)
