"""The device transforms are cheap: decided on ``ast``, libcst touched only at the edited statements.

A transform with nothing to change never makes the pipeline parse libcst. Edits are placed by a
search local to their statement (a compound statement: its header), never by PositionProvider
over the whole module; where that search cannot place a node (a ``match`` header) the
whole-module search does, and both give the same bytes and the same sites.
"""
from __future__ import annotations

from conftest import TESTS  # tests/: the corpus, fake_torch_npu and the repository root beside it
import ast
import os
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalebox_cst.config import Config
from scalebox_cst.transforms import FileContext
from scalebox_cst.transforms import device as D
from scalebox_cst.transforms import device_table as T
import harness

HERE = TESTS
ROOT = os.path.dirname(HERE)
EXAMPLES = [
    os.path.join(ROOT, "examples", name, "train.py")
    for name in ("cuda_migration_demo", "cuda_reinforce", "cartpole_ppo", "pendulum_ddpg")
]
ALL_OPTIONS = {"allow_precision_change": True, "fast_gelu": True, "npu_fused_optimizer": True, "allow_tf32": True}

#: device code in every position the statement-local search handles: decorators, parameter
#: defaults and annotations, class arguments, with items, elif tests, except clauses, suites,
#: f-strings, semicolons, lambdas, comprehensions, continuation lines
HEADERS = textwrap.dedent(
    '''\
    """Module docstring."""
    import argparse
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.cuda.amp import autocast, GradScaler

    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    args = parser.parse_args()
    # seeding
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False; x0 = 1

    @torch.cuda.amp.autocast()
    @register(torch.device("cuda"), ok=torch.cuda.is_available())
    def fwd(x, device="cuda", act=F.gelu, *rest, dtype=torch.float64, **kw) -> torch.cuda.Stream:
        return x.cuda().to(device)

    class Net(nn.Module, metaclass=Meta, dev=torch.device("cuda:0")):
        act = nn.GELU()

        def forward(self, x, scale=lambda d="cuda": torch.ones(1, device=d)):
            if x.is_cuda and torch.cuda.is_available(): return x.cuda()
            elif x.device.type == "cuda":
                return x.to("cuda")
            elif torch.cuda.device_count() > 1:
                pass
            else:
                if torch.cuda.is_available():
                    x = F.gelu(x)
            while torch.cuda.is_available(): x = x.double()
            with torch.cuda.device(0), torch.autocast("cuda") as ac:
                x = x.to(f"cuda:{rank}")
            try:
                torch.cuda.synchronize()
            except torch.cuda.OutOfMemoryError as err:
                torch.cuda.empty_cache()
            finally:
                torch.cuda.manual_seed(0)
            a, b = x.chunk(2, dim=-1)
            y = F.silu(a) * b + b * F.silu(a)
            return [t.cuda() for t in (x, y) if t.is_cuda]

    if torch.cuda.is_available(): torch.backends.cudnn.benchmark = True
    device = torch.device(args.device)
    scaler = GradScaler()
    with autocast(): y = model(torch.zeros(2, device=device))
    opt = torch.optim.Adam(
        model.parameters(),
        lr=1e-3,
    ); sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    t = torch.tensor([1.0], dtype=torch.float64, device=\\
        "cuda")
    '''
)


def rewrite(src, backend, options=(), transforms=("device.*",)):
    return harness.rewrite_result(src, list(transforms), backend, options={T.SECTION: dict(options)})


def forced_whole_module(monkeypatch):
    """Every expression edit placed by the whole-module search (PositionProvider)."""

    def miss(self, path):
        raise D._Miss

    monkeypatch.setattr(D._Locator, "_anchor", miss)


def no_whole_module(monkeypatch):
    """The whole-module search fails loudly: a rewrite that succeeds did not use it."""

    def boom(self):
        raise AssertionError("whole-module positions were computed")

    monkeypatch.setattr(D._Locator, "_whole_module", boom)
    monkeypatch.setattr(FileContext, "positions", property(lambda self: boom(self)))


def same(a, b):
    assert a.report.error is None and b.report.error is None, (a.report.error, b.report.error)
    assert a.output == b.output
    assert a.report.sites == b.report.sites


def sources():
    out = [("headers", HEADERS)]
    for path in EXAMPLES:
        with open(path, encoding="utf-8") as fh:
            out.append((os.path.basename(os.path.dirname(path)), fh.read()))
    return out


# ------------------------------------------------------------------ nothing to change: no libcst


@pytest.mark.parametrize("backend", ["cpu", "cuda", "npu"])
def test_a_transform_with_nothing_to_change_never_parses_libcst(backend):
    with open(os.path.join(ROOT, "examples", "cartpole_ppo", "train.py"), encoding="utf-8") as fh:
        src = fh.read().replace("optim.Adam(", "make_optimizer(")  # nothing any entry rewrites
    src += '\nprint("cuda", "float64")\nlabel = "cuda:0"\nx = model.double\n'
    tree = ast.parse(src)
    cfg = Config(transforms=["device.*"])
    for key, value in ALL_OPTIONS.items():
        if key != "allow_tf32":  # on cuda that one inserts a statement into any torch module
            cfg.set_option(T.SECTION, key, value)
    ran = 0
    for cls in D.DEVICE_TRANSFORMS:
        ctx = FileContext("t.py", None, cfg, backend, code=src, tree=tree)
        transform = cls()
        if not transform.applies(ctx):
            continue
        ran += 1
        new, sites = transform.rewrite(ctx)
        assert new is None, cls.id
        assert "module" not in ctx.__dict__, f"{cls.id} parsed libcst with nothing to change"
        assert all(s.action != "rewritten" for s in sites)
    if backend == "npu":
        assert ran >= 3  # placement, optimizer... looked and decided on the ast


def test_warnings_alone_do_not_parse_libcst():
    src = "import torch\nimport cupy as cp\ncap = torch.cuda.get_device_capability()\n"
    tree = ast.parse(src)
    ctx = FileContext("t.py", None, Config(transforms=["device.*"]), "npu", code=src, tree=tree)
    new, sites = D.DeviceUnsupported().rewrite(ctx)
    assert new is None and "module" not in ctx.__dict__
    assert sorted(s.kind for s in sites) == ["not-migratable:cupy", "not-migratable:torch.cuda"]


def test_module_facts_are_read_once_per_module_version(monkeypatch):
    made = []
    original = D._Facts

    def counting(tree, aliases):
        made.append(tree)
        return original(tree, aliases)

    monkeypatch.setattr(D, "_Facts", counting)
    src = "import torch\nprint('cuda', 'float64', 'nccl')\nx = model.cuda\n"  # several transforms look
    result = rewrite(src, "npu", ALL_OPTIONS)
    assert result.output.decode() == src
    assert len(made) == 1
    made.clear()
    with open(EXAMPLES[0], encoding="utf-8") as fh:
        result = rewrite(fh.read(), "npu")
    changed = len({s.transform for s in result.report.sites if s.action == "rewritten"})
    assert 1 <= len(made) <= changed + 1  # one per module version a transform read


# ------------------------------------------------------------------ placing the edits


@pytest.mark.parametrize("backend", ["cpu", "cuda", "npu"])
@pytest.mark.parametrize("name, src", sources(), ids=[n for n, _ in sources()])
def test_edits_are_placed_without_whole_module_positions(monkeypatch, name, src, backend):
    expected = rewrite(src, backend, ALL_OPTIONS)
    no_whole_module(monkeypatch)
    got = rewrite(src, backend, ALL_OPTIONS)
    same(expected, got)
    if backend == "npu" and name in ("headers", "cuda_migration_demo"):
        assert got.changed and sum(s.action == "rewritten" for s in got.report.sites) >= 10


@pytest.mark.parametrize("backend", ["cpu", "cuda", "npu"])
@pytest.mark.parametrize("name, src", sources(), ids=[n for n, _ in sources()])
def test_the_whole_module_search_gives_the_same_rewrite(monkeypatch, name, src, backend):
    for options in ({}, ALL_OPTIONS):
        fast = rewrite(src, backend, options)
        with monkeypatch.context() as m:
            forced_whole_module(m)
            slow = rewrite(src, backend, options)
        same(fast, slow)


def test_headers_rewrite_on_npu():
    out = rewrite(HEADERS, "npu").output.decode()
    assert '@register(torch.device("npu"), ok=torch.npu.is_available())' in out
    assert "@torch.autocast(\"npu\")\n@register" in out
    # device reaches .to(device): its default is a device string; act is a gelu reference
    assert 'def fwd(x, device="npu", act=_scalebox_npu.gelu, *rest, dtype=torch.float64, **kw) -> torch.npu.Stream:' in out
    assert 'class Net(nn.Module, metaclass=Meta, dev=torch.device("npu:0")):' in out
    assert "if x.is_npu and torch.npu.is_available(): return x.npu()" in out
    assert 'elif x.device.type == "npu":' in out and "elif torch.npu.device_count() > 1:" in out
    assert 'with torch.npu.device(0), torch.autocast("npu") as ac:' in out  # torch_npu's twin (issue 14)
    assert 'x = x.to(f"npu:{rank}")' in out
    assert "except torch.cuda.OutOfMemoryError as err:\n            torch.npu.empty_cache()" in out
    assert "y = _scalebox_npu.swiglu(x, a, b) + _scalebox_npu.swiglu(x, a, b)" in out
    assert "if torch.npu.is_available(): pass\n" in out
    assert "# seeding\nx0 = 1\n" in out
    assert 'parser.add_argument("--device", default="npu", choices=["cpu", "npu"])' in out
    assert '    lr=1e-3,\n    fused=_scalebox_npu.fused_ok("adam"),\n); sgd' in out
    assert 'device=\\\n    "npu")' in out
    harness.compiled(out, "t.py")


def test_columns_crlf_tabs_and_non_ascii():
    src = (
        'import torch\r\n'
        'é = "é"; x = torch.zeros(2, device="cuda")  # ü\r\n'
        'if x.is_cuda:\r\n'
        '\tif True:\r\n'
        '\t\ty = x.cuda(); z = "ü".join([str(torch.cuda.device_count())])\r\n'
        'w = torch.zeros(1,\r\n'
        '\t\t\tdevice=f"""cuda:\r\n{1}""")\r\n'
    )
    result = rewrite(src, "npu")
    out = result.output.decode()
    assert result.report.error is None
    assert 'é = "é"; x = torch.zeros(2, device="npu")  # ü\r\n' in out
    assert "if x.is_npu:\r\n\tif True:\r\n\t\ty = x.npu(); z = \"ü\".join([str(torch.npu.device_count())])\r\n" in out
    assert 'device=f"""npu:\r\n{1}""")\r\n' in out
    assert [(s.line, s.end_line) for s in result.report.sites if s.action == "rewritten"] == [
        (2, 2), (3, 3), (5, 5), (5, 5), (7, 8)
    ]


@pytest.mark.skipif(not hasattr(ast, "Match"), reason="match statements: Python >= 3.10")
def test_match_bodies_are_placed_locally_and_headers_by_the_whole_module(monkeypatch):
    src = textwrap.dedent(
        """\
        import torch
        match mode:
            case "gpu":
                x = torch.zeros(1, device="cuda")
            case _ if torch.cuda.is_available():
                y = x.cuda()
        """
    )
    result = rewrite(src, "npu")
    out = result.output.decode()
    assert 'x = torch.zeros(1, device="npu")' in out
    assert "case _ if torch.npu.is_available():" in out and "y = x.npu()" in out
    with monkeypatch.context() as m:
        forced_whole_module(m)
        same(result, rewrite(src, "npu"))


# ------------------------------------------------------------------ random modules

LINES = [
    'x = torch.zeros(2, device="cuda")',
    "y = x.cuda(); n = torch.cuda.device_count()",
    'torch.backends.cudnn.benchmark = True',
    "torch.backends.cudnn.deterministic = True; k = 1",
    'opt = torch.optim.Adam(model.parameters(), lr=1e-3)',
    "h = F.gelu(h) * 2",
    'a, b = h.chunk(2, dim=-1)',
    "z = F.silu(a) * b",
    'device = "cuda:0"',
    "w = torch.ones(1, device=device)",
    'if device == "cuda": pass',
    "dt = torch.float64",
    "print(f'{torch.cuda.is_available()}', 'cuda')",
    "g = torch.cuda.CUDAGraph()",
    "# a comment",
    "",
]
HEADS = [
    "if torch.cuda.is_available():",
    "for d in [torch.device('cuda')]:",
    "with torch.autocast('cuda'):",
    "def f(dev='cuda', act=F.gelu):",
    "class K(Base, dev=torch.device('cuda')):",
    "while x.is_cuda:",
    "try:",
]


@st.composite
def modules(draw):
    lines = ["import torch", "import torch.nn.functional as F"]
    for _ in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from(LINES)))
            continue
        head = draw(st.sampled_from(HEADS))
        body = [draw(st.sampled_from(LINES[:14])) for _ in range(draw(st.integers(1, 3)))]
        lines.append(head)
        lines.extend("    " + b for b in body)
        if head == "try:":
            lines += ["except torch.cuda.OutOfMemoryError:", "    torch.cuda.empty_cache()"]
    return "\n".join(lines) + "\n"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(src=modules(), backend=st.sampled_from(["cpu", "cuda", "npu"]), all_options=st.booleans())
def test_random_modules_local_and_whole_module_search_agree(monkeypatch, src, backend, all_options):
    options = ALL_OPTIONS if all_options else {}
    fast = rewrite(src, backend, options)
    with monkeypatch.context() as m:
        forced_whole_module(m)
        slow = rewrite(src, backend, options)
    same(fast, slow)
    harness.compiled(fast.output, "t.py")
