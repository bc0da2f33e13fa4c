"""Every documented example of every transform, checked the one way (Fixit's rule examples,
libcst's ``assertCodemod``): listed by ``scalebox_cst.transforms.examples.all_examples``.

A rewritten example's output is its golden file byte for byte and a rewritten site is reported;
a left-alone example comes back byte for byte with its reason among the skips; where the example
gives ``inputs``, original and rewrite are called on equal arguments and compared (bitwise where
every rewritten site says ``exact``), and for a loop-vectorizing transform the rewrite must run
fewer lines than the loop (else its guard declined and the comparison showed nothing). When a
transform's output changes on purpose, run ``.venv/bin/python tests/update_examples.py`` and read
the diff it prints; this test never writes.
Family tests keep what is special to a family (its exactness tier, spies on the fast path, inputs
too many to name, whole scripts).
"""
import difflib
import os

import pytest

from example_inputs import arguments, compare_calls, lines_run
import harness
from harness import load, rewrite_example
from scalebox_cst.report import EXACT, REWRITTEN, SKIPPED, WARNING
from scalebox_cst.transforms import REGISTRY
from scalebox_cst.transforms.examples import all_examples, check_names, orphans

CASES = all_examples()
#: transforms that replace a loop: on an example's inputs their rewrite runs fewer lines than the loop
VECTORIZING = "vectorize."
#: lines of a drifted output shown in the failure (the updater prints the whole diff)
DIFF_LINES = 30


def short_diff(expected: str, got: str, name: str) -> str:
    """The first :data:`DIFF_LINES` lines of the unified diff, and how to update."""
    lines = list(difflib.unified_diff(expected.splitlines(True), got.splitlines(True),
                                      f"{name} (expected)", f"{name} (now)", n=2))
    shown = "".join(lines[:DIFF_LINES]) + (f"... {len(lines) - DIFF_LINES} more lines\n" if len(lines) > DIFF_LINES else "")
    return f"output drifted from {name}:\n{shown}(intended? .venv/bin/python tests/update_examples.py and read the diff)"


def test_every_transform_has_examples_and_every_golden_file_is_named():
    assert check_names(CASES) == []
    assert orphans(CASES) == [], "golden files no example names: tests/update_examples.py --prune"
    assert {case.transform for case in CASES} == set(REGISTRY)
    assert any(c.example.rewritten for c in CASES) and any(not c.example.rewritten for c in CASES)


def test_a_drifted_output_fails_with_a_short_diff():
    expected = "".join(f"x{i} = {i}\n" for i in range(200))
    got = expected.replace("x100 = 100", "x100 = 101")
    message = short_diff(expected, got, "g.expected")
    assert "-x100 = 100" in message and "+x100 = 101" in message and "x10 = 10\n" not in message
    assert len(message.splitlines()) < DIFF_LINES + 3
    assert short_diff(expected, expected, "g.expected").count("\n") == 1  # nothing between the header and the hint


def test_the_differential_sees_a_last_bit_an_in_place_write_and_a_gradient():
    def scaled(x, out):
        out[0] = 1.0
        return x * 0.1 * 3.0

    def reassociated(x, out):
        out[0] = 1.0
        return x * (0.1 * 3.0)

    def writes_more(x, out):
        out[:] = 1.0
        return x * 0.1 * 3.0

    def other_gradient(x, out):
        out[0] = 1.0
        return (x * 0.1 * 3.0).detach() + x.detach() * 0 + 0 * x  # same values, gradient 0

    args = "torch.randn(64, dtype=torch.float64, requires_grad=True), torch.zeros(3)"
    compare_calls(scaled, scaled, args, 0, exact=True)
    compare_calls(scaled, reassociated, args, 0, exact=False)
    for other, exact in ((reassociated, True), (writes_more, False), (other_gradient, False)):
        with pytest.raises(AssertionError):
            compare_calls(scaled, other, args, 0, exact=exact)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_example(case):
    example, tid = case.example, case.transform.id
    out, sites = rewrite_example(case)
    rewritten = [s for s in sites if s.action == REWRITTEN and s.transform == tid]
    if not example.rewritten:
        if out != example.code:
            pytest.fail(short_diff(example.code, out, "the example's code"), pytrace=False)
        assert not rewritten, [s.describe() for s in rewritten]
        if example.reason:
            reasons = [s.reason for s in sites if s.action in (SKIPPED, WARNING)]
            assert any(example.reason in r for r in reasons), reasons
        return
    assert rewritten, [s.describe() for s in sites]
    assert case.golden and os.path.exists(case.golden), f"no {case.golden}: run tests/update_examples.py"
    expected = case.expected_output()
    if out.encode() != expected:
        pytest.fail(short_diff(expected.decode(), out, os.path.relpath(case.golden)), pytrace=False)
    if example.inputs is not None:
        exact = all(s.exactness == EXACT for s in rewritten)
        call = example.inputs.call
        original = load(example.code, call, filename=f"<{case.id}>", module="sbexample")
        new = load(out, call, filename=f"<{case.id} rewritten>", module="sbexample")
        for seed in example.inputs.seeds:
            compare_calls(original, new, example.inputs.args, seed, exact)
            if tid.startswith(VECTORIZING):
                ran, looped = lines_run(new, arguments(example.inputs.args, seed)), lines_run(original, arguments(example.inputs.args, seed))
                assert ran < looped, (f"seed {seed}: the rewrite ran {ran} lines, the loop {looped}: the guard declined "
                                      "these inputs (size them for the fast path) and the comparison showed nothing")



@pytest.mark.parametrize("case", [c for c in CASES if c.example.rewritten], ids=lambda c: c.id)
def test_a_rewritten_example_rewritten_again_is_unchanged(case):
    """The engine's own output is no candidate a second time (benchmarks/sweep_real_code.py's
    not-idempotent): accelerate.threads wrapped its optimizer again, one_thread(one_thread(...))."""
    expected = case.expected_output().decode()
    again = harness.rewrite(expected, case.transform.id, case.example.backend, dedent=False,
                            options=case.option_tables(), path=harness.EXAMPLE_PATH)
    out, sites = again
    assert [s.describe() for s in sites if s.action == REWRITTEN] == []
    if out != expected:
        pytest.fail(short_diff(expected, out, "the golden output rewritten again"), pytrace=False)


@pytest.fixture(scope="module")
def sweep():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return harness.load_path(os.path.join(root, "benchmarks", "sweep_real_code.py"), "sweep_real_code", register=True)


@pytest.mark.parametrize("case", [c for c in CASES if c.example.rewritten], ids=lambda c: c.id)
def test_every_changed_line_lies_in_a_rewritten_sites_span(case, sweep):
    """A site's span is what ``scalebox diff`` labels and ``scalebox profile`` credits
    (benchmarks/sweep_real_code.py's outside-span): accelerate.defer_sync reported the logging
    statement while it wrapped the whole loop in try/finally."""
    out, sites = rewrite_example(case)
    assert sweep.changed_outside(case.example.code, out, sites) == []


def _public_import_names(code: str) -> set:
    """Names a module's top-level imports bind that ``from m import *`` would hand out."""
    import ast

    names = set()
    for st in ast.parse(code).body:
        if isinstance(st, (ast.Import, ast.ImportFrom)):
            for a in st.names:
                name = a.asname or a.name.split(".")[0]
                if name != "*" and not name.startswith("_"):
                    names.add(name)
    return names


#: modules under their own names: the object an importer's own ``import torch`` binds (torch_npu,
#: imported for what its import does, registering the NPU device, as the migration tools write it)
OWN_NAMES = {"torch", "torch_npu"}


@pytest.mark.parametrize("case", [c for c in CASES if c.example.rewritten], ids=lambda c: c.id)
def test_a_rewrite_adds_no_name_a_star_import_hands_out(case):
    """``from agents import *`` in another file took ``linear_recurrence`` (and ``scalebox_npu``)
    from a rewritten ``agents.py`` without ``__all__``, over a name of the importer's own: the
    rewrite's imports bind private names (a leading underscore)."""
    added = _public_import_names(case.expected_output().decode()) - _public_import_names(case.example.code)
    assert added <= OWN_NAMES, added
