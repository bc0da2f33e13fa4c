"""The recurrence transform's work grows linearly with the backward loops of one function (each
loop's checks of what its function does outside it once walked the whole function: a file with
thousands of GAE loops gave no result). Counted in tree nodes visited, not timed; speed is in
benchmarks/bench_scaling.py (shape ``loops``)."""
from conftest import TESTS  # tests/: the corpus, fake_torch_npu and the repository root beside it
import os

import harness
from scalebox_cst.transforms.analysis import cstwalk
from scalebox_cst.transforms.vectorize.recurrence import function_facts


def _bench_loop() -> str:
    """The ``loops`` shape's GAE loop, from the benchmark that times it (one text for both)."""
    return harness.load_path(os.path.join(os.path.dirname(TESTS), "benchmarks", "bench_scaling.py"), "bench_scaling").LOOP


LOOP = _bench_loop()


def one_function(loops: int) -> bytes:
    body = "".join(LOOP.format(i=i) for i in range(loops))
    return f"import torch\n\n\ndef analyse(rewards, values, masks, next_value, gamma, lam, T):\n{body}    return last\n".encode()


def test_nodes_visited_grow_linearly_with_the_loops_of_one_function(monkeypatch):
    visited = [0]
    real, real_push = cstwalk.children, cstwalk.push_children

    def counting(n):
        visited[0] += 1
        return real(n)

    def counting_push(n, out):  # what cstwalk.walk expands each node with
        visited[0] += 1
        real_push(n, out)

    monkeypatch.setattr(cstwalk, "children", counting)
    monkeypatch.setattr(cstwalk, "push_children", counting_push)
    monkeypatch.setattr(cstwalk, "_KEPT", frozenset())  # every walk walks (a kept walk hides its repeats)
    pipeline = harness.pipeline()
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
    pipeline = harness.pipeline()
    lines = []
    pipeline.progress = lines.append
    pipeline.rewrite("gen.py", one_function(6))
    inside = [line for line in lines if "vectorize.recurrence: " in line]
    assert [line.split("vectorize.recurrence: ")[1].split(" after")[0] for line in inside] == [
        f"{k}/6 backward loops" for k in range(6)]
    assert all(line.startswith("scalebox: gen.py: ") and "\n" not in line for line in lines)


class _CountingSet(set):
    """A set that counts membership tests (the probes of a name search)."""

    probes = 0

    def __contains__(self, item):
        _CountingSet.probes += 1
        return super().__contains__(item)


def test_fresh_names_cost_the_same_for_every_site():
    """Each site asks for the same bases (``x_v``, ``last_fused``...): the search for a free
    suffix goes on from the last one, so the k-th name costs what the first did (it tried
    ``x_2`` .. ``x_k`` again: sites x sites probes on a file with thousands of loops)."""
    from scalebox_cst.transforms.names import ImportMap

    imports = ImportMap("x = 1\nx_2 = 2\nx_4 = 4\n")
    imports.names = _CountingSet(imports.names)
    got = [imports.unique_name("x") for _ in range(400)]
    assert got[:3] == ["x_3", "x_5", "x_6"] and len(set(got)) == 400 and not {"x", "x_2", "x_4"} & set(got)
    assert _CountingSet.probes < 2 * 400 + 10, _CountingSet.probes
    imports.names.add("x_403")  # a name taken since is still skipped
    assert imports.unique_name("x") == "x_404" and imports.unique_name("y") == "y"


def test_parses_and_module_walks_per_site_are_constant(monkeypatch):
    """Per rewritten loop, a constant number of libcst parses of generated code and no walk of
    the whole module or function: the parses and the statements the one-per-module loop map
    visits grow by the same amount from 20 to 40 loops as from 10 to 20."""
    import libcst as cst

    from scalebox_cst.transforms.hot import callees
    from scalebox_cst.transforms.vectorize.recurrence import fold

    parses, places, tables = [0], [0], [0]
    real_parse, real_places, real_table = cst.parse_module, fold._loop_places, callees._scope_table

    def parse(*a, **k):
        parses[0] += 1
        return real_parse(*a, **k)

    def loop_places(module):
        places[0] += 1
        return real_places(module)

    def scope_table(scope):
        tables[0] += 1
        return real_table(scope)

    monkeypatch.setattr(cst, "parse_module", parse)
    monkeypatch.setattr(fold, "_loop_places", loop_places)
    monkeypatch.setattr(callees, "_scope_table", scope_table)
    pipeline = harness.pipeline()
    counts = {}
    for loops in (10, 20, 40):
        parses[0] = places[0] = tables[0] = 0
        result = pipeline.rewrite("gen.py", one_function(loops))
        assert sum(s.action == "rewritten" for s in result.report.sites) == loops
        counts[loops] = (parses[0], places[0], tables[0])
    (p10, m10, t10), (p20, m20, t20), (p40, m40, t40) = counts[10], counts[20], counts[40]
    assert p40 - p20 == 2 * (p20 - p10), counts  # the same parses for each loop
    assert m10 == m20 == m40 == 1, counts  # the loop map: once per module, not per loop
    assert t10 == t20 == t40, counts  # a function's assigned names: once per scope, not per name


def test_the_loop_map_skips_expressions_and_finds_every_loop():
    """:func:`fold._loop_places` walks statements only; it finds the loops a full walk finds,
    with the same innermost function and nesting (classes and nested functions included)."""
    import libcst as cst

    from scalebox_cst.transforms.vectorize.recurrence import fold

    module = cst.parse_module(
        "for a in b:\n    pass\n"
        "def f(x):\n"
        "    for t in x:\n"
        "        while t > 0:\n"
        "            t -= 1\n"
        "    try:\n        pass\n    except E:\n        for u in x: pass\n    finally:\n        for v in x: pass\n"
        "    with m:\n        if x:\n            pass\n        else:\n            for w in x: pass\n"
        "    match x:\n        case 1:\n            for y in x: pass\n"
        "    class C:\n        for z in x: pass\n"
        "    def g():\n        for q in x: pass\n"
        "    return [i for i in x]\n"
    )
    places = fold._loop_places(module)
    loops = [n for n in cstwalk.walk(module) if isinstance(n, (cst.For, cst.While))]
    assert len(loops) == 9 and set(places) == {id(n) for n in loops}
    func = module.body[1]
    g = [s for s in func.body.body if isinstance(s, cst.FunctionDef)][0]
    by_target = {cst.Module([]).code_for_node(n.target if isinstance(n, cst.For) else n.test): places[id(n)] for n in loops}
    assert by_target["a"] is None and by_target["z"] is None  # module level, class body
    assert by_target["t"] == (func, False)
    assert by_target["t > 0"] == (func, True)  # the while inside the for
    assert [by_target[k] for k in ("u", "v", "w", "y")] == [(func, False)] * 4
    assert by_target["q"] == (g, False)
