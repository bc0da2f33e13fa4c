"""hot.distribution_args, hot.tensor_from_arrays and hot.fresh_on_device visit only the top-level
statements holding their candidate calls (bindings.visit_calls): the same output and sites as a
visit of the whole module, the other statements never parsed, and never a lost filler (which
would make the pipeline redo the transform on the whole module)."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import harness
from scalebox_cst.config import Config
from scalebox_cst.transforms import FileContext, partial
from scalebox_cst.transforms.analysis import positions

HEADER = "import torch\nfrom torch.distributions import Categorical, Normal\n\n\n"
IN_FUNCTIONS = {
    "dist": '''def act_{i}(logits, mu, log_std):
    std = torch.exp(log_std)
    d = Normal(mu, std)
    c = Categorical(logits=logits)
    return d.sample(), c.sample()
''',
    "rebound": '''def act2_{i}(mu, log_std):
    std = torch.exp(log_std)
    std = std * 0
    return Normal(mu, std)
''',
    "probs": '''def pol_{i}(net, x):
    probs = torch.softmax(net(x), dim=-1)
    return Categorical(probs)
''',
    "arrays": '''def batch_{i}(buf, idx):
    s_lst = [buf[j] for j in idx]
    return torch.tensor(s_lst, dtype=torch.float)
''',
    "fresh": '''def move_{i}(x, device):
    return torch.FloatTensor(x).to(device)
''',
    "method": '''class Agent_{i}:
    def act(self, mu):
        scale = torch.exp(self.log_std)
        return Normal(mu, scale)
''',
    "plain": '''def plain_{i}(x):
    y = x + 1
    return y * 2
''',
    # nested blocks, continuation lines, a multi-line string, one-line suites, ``a; b``, an elif
    # test, a decorator and comments at odd indentation around the calls (positions alone)
    "nested": '''@torch.no_grad()
def nested_{i}(xs, mu, log_std, device, flag):
    out = []
    for x in xs:
        if flag:
            doc = """a string
of two lines"""
            d = Normal(mu,
                       torch.exp(log_std))  # a continuation line
        elif Normal(mu, torch.exp(log_std)).sample().sum() > 0:
            pass
# a comment at column 0 inside the block
        else:
            with torch.no_grad(): out.append(torch.FloatTensor(x).to(device))
        y = 1; z = torch.FloatTensor(x).to(device)
        try:
            s_lst = [x for _ in range(2)]
            out.append(torch.tensor(s_lst, dtype=torch.float))
        except ValueError:
            out.append(Categorical(logits=torch.zeros(2)))
    return out
''',
}
# a name bound at module level decides a call in the module's scope: the whole module is needed
IN_MODULE_SCOPE = {
    "module": "STD_{i} = torch.exp(torch.zeros(2))\nPRIOR_{i} = Normal(torch.zeros(2), STD_{i})\n",
    "class_body": "SCALE_{i} = torch.exp(torch.zeros(2))\n\n\nclass Prior_{i}:\n    dist = Normal(0.0, SCALE_{i})\n",
    "module_arrays": "OBS_{i} = [torch.zeros(2) for _ in range(3)]\nBATCH_{i} = torch.tensor(OBS_{i})\n",
}
TRANSFORMS = ("hot.distribution_args", "hot.tensor_from_arrays", "hot.fresh_on_device")


def _source(kinds):
    blocks = {**IN_FUNCTIONS, **IN_MODULE_SCOPE}
    return HEADER + "\n\n".join(blocks[k].format(i=i) for i, k in enumerate(kinds))


def _rewrite(monkeypatch, transform, source, whole):
    """(output, sites, [(redone on the whole module, on a split module)] per run of the
    transform) with its module split as it chooses, or whole."""
    calls = []
    pipeline = harness.pipeline([transform])
    (t,) = pipeline.transforms
    original = t.rewrite

    def counted(ctx):
        out = original(ctx)
        calls.append((ctx.whole, ctx.partial is not None))  # (redone whole, split module used)
        return out

    with monkeypatch.context() as m:
        m.setattr(t, "rewrite", counted)
        if whole:
            m.setattr(FileContext, "module_for", lambda self, nodes: self.module)
        result = pipeline.rewrite("f.py", source.encode())
    assert result.report.error is None, result.report.error
    sites = [(s.transform, s.line, s.end_line, s.action, s.reason, s.exactness) for s in result.report.sites]
    return result.output, sites, calls


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(sorted({**IN_FUNCTIONS, **IN_MODULE_SCOPE})), min_size=1, max_size=7), st.sampled_from(TRANSFORMS))
def test_split_visit_equals_the_whole_module_visit(monkeypatch, kinds, transform):
    source = _source(kinds)
    split = _rewrite(monkeypatch, transform, source, whole=False)
    whole = _rewrite(monkeypatch, transform, source, whole=True)
    assert split[:2] == whole[:2]
    assert not any(redone for redone, _ in split[2])  # never redone on the whole module (a filler lost)


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_statements_without_candidates_are_not_parsed(monkeypatch, transform):
    """Fifty plain functions around one candidate of each kind: only a few statements parsed
    (the candidates', the imports, the first), and sites found where they were."""
    kinds = ["plain"] * 25 + ["dist", "probs", "arrays", "fresh", "method"] + ["plain"] * 25
    source = _source(kinds)
    before = partial.PARSED[0]
    output, sites, calls = _rewrite(monkeypatch, transform, source, whole=False)
    parsed = partial.PARSED[0] - before
    assert calls == [(False, True)] and sites and any(s[3] == "rewritten" for s in sites)
    assert parsed <= 8, parsed
    assert output != source.encode()


def test_a_call_in_the_module_scope_reads_module_bindings():
    """``Normal(0.0, SCALE)`` in a class body: SCALE is bound once, at module level, to an exp:
    rewritten, as with the whole module (a split module would not see that binding)."""
    source = _source(["plain"] * 5 + ["class_body"] + ["plain"] * 5)
    code, sites = harness.rewrite(source, "hot.distribution_args", dedent=False)
    assert [s.action for s in sites] == ["rewritten"]
    assert "dist = Normal(0.0, SCALE_5, validate_args=False)" in code


def _direct(transform, source, positions_alone):
    """The transform on a context that holds the whole module already (as after an earlier
    transform parsed it): (code, sites), the visited statements positioned alone or not."""
    import libcst as cst

    from scalebox_cst.transforms import all_transforms

    (t,) = [t for t in all_transforms() if t.id == transform]
    ctx = FileContext("f.py", cst.parse_module(source), Config(), "cpu", code=source)
    if not positions_alone:
        ctx.positions  # noqa: B018 - the whole module's, computed before the transform runs
    new, sites = t.rewrite(ctx)
    code = ctx.finish(new).code if new is not None else source
    return code, [(s.line, s.end_line, s.action, s.reason) for s in sites], "positions" in ctx.__dict__


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(sorted({**IN_FUNCTIONS, **IN_MODULE_SCOPE})), min_size=1, max_size=7), st.sampled_from(TRANSFORMS))
def test_in_a_whole_module_the_visited_statements_positioned_alone_give_the_same_sites(kinds, transform):
    source = _source(["plain"] * 4 + kinds + ["plain"] * 4)
    assert _direct(transform, source, True)[:2] == _direct(transform, source, False)[:2]


def test_in_a_whole_module_only_the_statements_holding_the_calls_are_positioned(monkeypatch):
    """Each innermost statement holding a call is positioned alone (transforms/analysis/positions.py),
    not the function around it, nor the whole module."""
    placed = []
    original = positions.alone

    def counted(module, units, lines):
        found = original(module, units, lines)
        placed.append(([a.lineno for _, a in units], found is not None))
        return found

    monkeypatch.setattr(positions, "alone", counted)
    monkeypatch.setattr(partial, "statement_positions", lambda *a: pytest.fail("the whole statement positioned"))
    source = _source(["plain"] * 10 + ["dist"] + ["plain"] * 10)
    code, sites, _ = _direct("hot.distribution_args", source, True)
    lines = source.splitlines()
    calls = [n for n, line in enumerate(lines, 1) if "Normal(mu" in line or "Categorical(logits" in line]
    assert placed == [(calls, True)]
    assert [s[2] for s in sites] == ["rewritten", "rewritten"] and "validate_args=False" in code


def test_statements_holding_no_call_are_not_entered(monkeypatch):
    """The visit skips the statements that hold none of the calls: they stay the very nodes they
    were (a visit re-creates every node it passes), and no call in them is decided."""
    import libcst as cst

    from scalebox_cst.transforms.hot import bindings

    entered = []
    original = bindings.PrunedTransformer.on_visit

    def on_visit(self, node):
        enters = original(self, node)
        if enters and isinstance(node, (cst.BaseCompoundStatement, cst.BaseSmallStatement)):
            entered.append(type(node).__name__)
        return enters

    monkeypatch.setattr(bindings.PrunedTransformer, "on_visit", on_visit)
    source = _source(["nested"])
    code, sites, _ = _direct("hot.fresh_on_device", source, True)
    assert sum(1 for s in sites if s[2] == "rewritten") == 2
    # the def, the for, the if and its elif (whose else holds the with), the with and its call, the line of
    # ``y = 1; z = ...``: never the try (no fresh tensor moved there), the other statements of the
    # branches, nor the other small statements of the function
    assert entered == ["FunctionDef", "For", "If", "If", "With", "Expr", "Assign", "Assign"], entered


def test_no_grad_walks_a_scope_for_its_locals_once(monkeypatch):
    """Found by a fault campaign: one function of n acting steps took 3 s at n = 250 and 65 s at
    1,500 (each forward statement walked the whole function for the names it binds)."""
    import ast

    from scalebox_cst.transforms.hot import no_grad

    steps = "".join(f"    a{i} = net(x).argmax().item()\n    env.step(a{i})\n" for i in range(40))
    src = "import torch.nn as nn\nnet = nn.Linear(4, 1)\ndef act(x, env):\n" + steps
    walked = []
    real = ast.walk

    def counting(node):
        if isinstance(node, ast.FunctionDef) and node.name == "act":
            walked.append(node)
        return real(node)

    monkeypatch.setattr(no_grad.ast, "walk", counting)
    out, sites = harness.rewrite(src, ["hot.no_grad"], dedent=False)
    assert sum(s.action == "rewritten" for s in sites) == 40
    assert len(walked) <= 2
