"""The engine on real public RL code: each file in tests/corpus holds loops copied verbatim from a
public repository, the outcome expected at each site, and a ``run(ns, T, seed)`` that drives the
code on realistic inputs.

For every corpus file: the rewrite (all transforms, CPU backend) compiles; each expected site is
rewritten or skipped as recorded, with the recorded exactness; no other site is reported; and the
original and the rewritten module, exec'd side by side, give the same outputs (``torch.equal``
when every rewritten site claims ``exact``, ``assert_close`` otherwise) for short inputs (T = 1,
2, 3) and for inputs long enough that the vectorized branch must run, which is checked by tracing
the runtime guards. Expectations that a recorded finding says should change are
``xfail(strict=True)``: they turn red when the finding is fixed.

Corpus file layout (read by tests/corpus_harness.py): source text first; the line ``EXPECT = {...}`` starts the harness region
(EXPECT, FINDINGS, LENGTHS, LEAVE_ALONE, run), where no site may be reported. EXPECT maps an
anchor (a stripped source line, ``@k`` for its k-th occurrence) to (transform, action,
exactness). The default grad_clip guard (``exact-until-intervention``) runs as inserted: these
inputs are healthy, so it must change nothing, bit for bit where every other site is ``exact``.
"""
import pytest

from scalebox_cst.report import REWRITTEN, SKIPPED
from scalebox_cst.runtime import vectorized as runtime_vectorized
from corpus_harness import ACCEPTORS, ACTIONS, NAMES, RuntimeTrace, compare_guarded, corpus, seeded
import harness

# the real code warns about its own inputs (std() of one element, tensors from lists of arrays)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def expectations():
    out = []
    for name in NAMES:
        for anchor in corpus(name).expect:
            finding = corpus(name).findings.get(anchor)  # the key "runtime" is no anchor
            marks = [pytest.mark.xfail(strict=True, reason=finding)] if finding else []
            out.append(pytest.param(name, anchor, marks=marks, id=f"{name}:{anchor[:50]}"))
    return out


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", NAMES)
def test_rewrite_compiles(name):
    c = corpus(name)
    assert c.error is None, c.error
    harness.compiled(c.output, name)


@pytest.mark.parametrize("name,anchor", expectations())
def test_expected_site(name, anchor):
    c = corpus(name)
    transform, action, exactness = c.expect[anchor]
    line = c.anchor_line(anchor)
    found = [s for s in c.sites if s.transform == transform and s.line == line]
    assert found, f"no {transform} site at line {line} ({anchor!r}); sites: {[(s.transform, s.line) for s in c.sites]}"
    site = found[0]
    assert (site.action, site.exactness) == (ACTIONS[action], exactness), (
        f"{transform} at line {line}: {site.action} ({site.exactness}): {site.reason}"
    )


@pytest.mark.parametrize("name", NAMES)
def test_no_other_sites(name):
    c = corpus(name)
    accounted = {(t, c.anchor_line(a)) for a, (t, _, _) in c.expect.items()}
    # EXPECT annotates the loop families and the guard; the hot.* rewrites (no_grad around acting
    # forwards, distributions, tensors from lists) are whole-script sites with their own examples
    # and differential tests (tests/transforms/hot/test_hot_*.py), and the differential tests here run them too
    loop_sites = [s for s in c.sites if not s.transform.startswith("hot.")]
    harness = [s for s in loop_sites if s.line >= c.harness_line]
    assert not harness, f"the test harness itself was rewritten or reported: {harness}"
    extra = [s for s in loop_sites if s.action in (REWRITTEN, SKIPPED) and (s.transform, s.line) not in accounted]
    assert not extra, "sites not in EXPECT:\n" + "\n".join(f"  {s.transform} {s.line} {s.action}: {s.reason}" for s in extra)


def differential_params():
    out = []
    for name in NAMES:
        for T in corpus(name).lengths:
            out.append(pytest.param(name, T, id=f"{name}-T{T}"))
    return out


@pytest.mark.parametrize("name,T", differential_params())
def test_differential(name, T):
    c = corpus(name)
    if c.leave_alone:
        assert c.output == c.text, "a file with nothing to rewrite came back changed"
        return
    assert c.output != c.text or not c.rewritten()
    orig_ns = c.exec(c.text, "original")
    run = orig_ns["run"]
    want = seeded(run, orig_ns, T, 0)
    compare_guarded(want, lambda: seeded(run, c.exec(c.output, "rewritten"), T, 0), c.exact())


def vectorized_params():
    out = []
    for name in NAMES:
        c = corpus(name)
        if c.leave_alone:
            continue
        finding = c.findings.get("runtime")
        marks = [pytest.mark.xfail(strict=True, reason=finding)] if finding else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@pytest.mark.parametrize("name", vectorized_params())
def test_vectorized_branch_runs(name, monkeypatch):
    """At the longest length every rewritten family takes its fast branch at least once (a guard
    that always declines would pass the differential test while doing nothing)."""
    c = corpus(name)
    families = sorted({s.transform for s in c.rewritten()} & set(ACCEPTORS))
    if not families:
        pytest.skip("nothing rewritten that has a run-time guard")
    T = max(c.lengths)
    orig_ns = c.exec(c.text, "original")
    run = orig_ns["run"]
    want = seeded(run, orig_ns, T, 1)
    new_ns = c.exec(c.output, "rewritten")
    # recurrences over lists of Python floats that are not inserted at the front are declined by
    # policy (the loop is faster, see runtime.vectorized.MIN_STEPS); here the branch must still work
    # (and need 1024 steps where they are), so for them the minimum lengths are lifted
    monkeypatch.setitem(runtime_vectorized.MIN_STEPS, "float_appended", 2)
    monkeypatch.setitem(runtime_vectorized.MIN_STEPS, "float", 2)
    with RuntimeTrace() as trace:
        intervened = compare_guarded(want, lambda: seeded(run, new_ns, T, 1), c.exact())
    assert not intervened, f"the guard intervened at T={T}: {intervened}"
    missing = [f for f in families if not trace.accepted(f)]
    assert not missing, f"the vectorized branch never ran at T={T} for {missing}"
