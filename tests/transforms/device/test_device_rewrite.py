"""Device transforms on the patterns found in real RL code, and the look-alikes they must leave alone.

Matching is by meaning: qualified names through the imports, argument positions, device values
followed back through variables, attributes and argparse options. Strings outside device
positions, user functions named like torch's, and names that merely share a spelling stay as they
are, byte for byte.
"""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

from scalebox_cst.report import CHANGES_SEMANTICS, EXACT, REWRITTEN, SKIPPED, WARNING
import harness

NPU = "from scalebox_cst.runtime.npu import torch_npu\n"
HELPERS = "from scalebox_cst.runtime import npu as _scalebox_npu\n"


def rw(src, backend="npu", transforms=("device.*",), **options):
    return harness.rewrite(src, list(transforms), backend, options={"device": options})


def unchanged(src, **kw):
    out, sites = rw(src, **kw)
    assert out == textwrap.dedent(src)
    return sites


# ------------------------------------------------------------------ leave alone


def test_cuda_in_strings_outside_device_positions_stays():
    src = """\
    import torch
    print("cuda")
    log = f"running on cuda:{0}"
    msg = "cuda" if torch.backends.mps.is_available() else "cpu"
    print("training on %s" % "cuda")
    """
    assert unchanged(src) == []


def test_user_function_named_cuda_stays():
    src = """\
    def cuda():
        return "cuda"

    x = cuda()
    """
    assert unchanged(src) == []


def test_a_device_variable_used_only_for_logging_stays():
    src = """\
    import torch
    device = "cuda"
    print(f"device: {device}")
    x = torch.zeros(3)
    """
    unchanged(src)


def test_same_name_in_another_function_is_another_variable():
    out, _ = rw(
        """\
        import torch

        def make():
            device = "cuda"
            return torch.zeros(2, device=device)

        def describe():
            device = "cuda"
            return "model runs on " + device
        """
    )
    assert out.count('device = "npu"') == 1
    assert 'device = "cuda"\n    return "model runs on "' in out


def test_global_device_read_inside_a_function_is_followed():
    out, _ = rw(
        """\
        import torch
        DEVICE = "cuda:0"

        def make():
            return torch.zeros(2, device=DEVICE)
        """
    )
    assert 'DEVICE = "npu:0"' in out


def test_user_class_with_a_cuda_method_is_skipped():
    src = """\
    import torch

    class ReplayBuffer:
        def cuda(self):
            return self

    buf = ReplayBuffer().cuda()
    """
    sites = unchanged(src, transforms=("device.placement",))
    assert [s.action for s in sites] == [SKIPPED]
    assert "defines its own `cuda`" in sites[0].reason


def test_torch_device_cpu_and_to_cpu_stay():
    unchanged('import torch\nx = torch.zeros(2, device="cpu").to("cpu")\nd = torch.device("cpu")\n')


def test_nccl_only_in_init_process_group():
    out, sites = rw(
        """\
        import torch.distributed as dist
        backend = "nccl"
        dist.init_process_group(backend=backend)
        print("using nccl")
        other = "nccl"
        """
    )
    assert 'backend = "hccl"' in out and 'print("using nccl")' in out and 'other = "nccl"' in out


def test_isinstance_of_gelu_class_is_left_and_reported():
    out, sites = rw("import torch.nn as nn\nflag = isinstance(m, nn.GELU)\n", transforms=("device.fused_op",))
    assert out == "import torch.nn as nn\nflag = isinstance(m, nn.GELU)\n"
    assert sites[0].action == SKIPPED


@pytest.mark.parametrize(
    "src, why",
    [
        ("import torch.nn.functional as F\ny = F.gelu(h, approximate='tanh')\n", "nothing to fix"),
        ("import torch.nn as nn\nact = nn.GELU(approximate='tanh')\n", "nothing to fix"),
        ("import torch.nn.functional as F\ny = F.rms_norm(h, (8,))\n", "needs one"),
        ("import torch.nn.functional as F\ny = F.rms_norm(h, (8,), None, 1e-6)\n", "needs one"),
        ("import torch.nn as nn\nn1 = nn.RMSNorm(8, elementwise_affine=False)\n", "needs a weight"),
    ],
)
def test_fused_op_skips(src, why):
    sites = unchanged(src, transforms=("device.fused_op",))
    assert any(s.action == SKIPPED and why in s.reason for s in sites)


@pytest.mark.parametrize(
    "body",
    [
        "a, b = x.chunk(2, dim=0)\ny = F.silu(a) * b\n",  # not the last dimension
        "a, b = x.chunk(3, dim=-1)[:2]\ny = F.silu(a) * b\n",  # not a 2-way chunk
        "a, b = x.chunk(2, dim=-1)\nx = x * 2\ny = F.silu(a) * b\n",  # x rebound in between
        "a, b = x.chunk(2, dim=-1)\nfor i in range(2):\n    y = F.silu(a) * b\n    a = y\n",  # a rebound in the loop
        "a, b = x.chunk(2, dim=-1)\ny = F.silu(b) * a\n",  # the other gate
        "a, b = x.chunk(2, dim=-1)\ny = F.silu(a, inplace=True) * b\n",
        "a, b = x.chunk(2, dim=-1)\ny = F.silu(a) + b\n",
    ],
)
def test_swiglu_look_alikes_stay(body):
    unchanged("import torch.nn.functional as F\n" + body, transforms=("device.fused_op",))


@pytest.mark.parametrize(
    "body",
    [
        "a, b = torch.chunk(x, 2, dim=-1)\ny = b * F.silu(a)\n",
        "a, b = x.chunk(2, -1)\nz = 1\ny = F.silu(a) * b\nx = y\n",
        "a, b = x.chunk(2, dim=-1)\nx = F.silu(a) * b\n",  # rebinding x by the product itself
    ],
)
def test_swiglu_forms_rewritten(body):
    out, sites = rw("import torch\nimport torch.nn.functional as F\n" + body, transforms=("device.fused_op",))
    assert "_scalebox_npu.swiglu(x, a, b)" in out
    assert [s.action for s in sites] == [REWRITTEN]


def test_optimizer_choices_of_the_user_are_kept():
    for src in (
        "import torch\nopt = torch.optim.Adam(p, lr=1e-3, foreach=False)\n",
        "import torch\nopt = torch.optim.AdamW(p, fused=False)\n",
        "import torch\nopt = torch.optim.SGD(p, **kw)\n",
        "import torch\nopt = torch.optim.Adam(p, differentiable=True)\n",
    ):
        sites = unchanged(src, backend="cuda", transforms=("device.optimizer",))
        assert [s.action for s in sites] == [SKIPPED]


def test_cudnn_flag_with_a_computed_value_is_kept_and_warned():
    src = "import torch\ntorch.backends.cudnn.benchmark = should_benchmark()\n"
    sites = unchanged(src, transforms=("device.placement",))
    assert [s.action for s in sites] == [WARNING]
    # a comparison is not a call: the warning says what it is not (sweep finding: the text said "a call")
    sites = unchanged("import torch\nfor i in range(3):\n    torch.backends.cudnn.benchmark = i > 1\n",
                      transforms=("device.placement",))
    assert [s.action for s in sites] == [WARNING] and "not a plain name, attribute or literal" in sites[0].reason


def test_cudnn_flag_read_back_is_kept_and_warned():
    """Dropping the assignment is exact only if nothing reads the flag: a module that prints or
    tests it (by any spelling of the name) keeps it, with a warning naming the read."""
    src = (
        "import torch\n"
        "from torch.backends import cudnn\n"
        "torch.backends.cudnn.benchmark = True\n"
        "torch.backends.cudnn.deterministic = True\n"
        "def log():\n"
        "    print('benchmark', cudnn.benchmark)\n"
    )
    out, sites = rw(src, transforms=("device.placement",))
    assert out == src.replace("torch.backends.cudnn.deterministic = True\n", "")
    kinds = [(s.line, s.action) for s in sites]
    assert kinds == [(3, WARNING), (4, REWRITTEN)]
    assert "reads this flag (line 6)" in sites[0].reason


def test_foreach_is_not_added_where_the_learning_rate_may_be_a_tensor():
    """Found by a differential review of LeanRL and torchrl: ``Adam(..., lr=torch.tensor(lr))``
    with ``foreach=True`` raises ValueError at construction (the original builds). The rewrite
    keeps such calls, and the optimizers it does rewrite build and step."""
    src = textwrap.dedent("""\
        import argparse
        import torch
        m = torch.nn.Linear(2, 1)
        a = torch.optim.Adam(m.parameters(), lr=torch.tensor(0.01), eps=1e-5)
        lr = torch.tensor(0.1)
        b = torch.optim.AdamW(m.parameters(), lr)
        c = torch.optim.Adam(m.parameters(), lr=float(0.001))
        d = torch.optim.Adam(m.parameters(), lr=1e-3, capturable=False)
        args = argparse.Namespace(lr=0.01)
        e = torch.optim.Adam(m.parameters(), lr=args.lr)
        """)
    out, sites = rw(src, backend="cpu", transforms=("device.*",))
    kinds = [(s.line, s.action) for s in sites]
    # ``args`` bound to a call does not make ``args.lr`` one (CleanRL's parse_args())
    assert kinds == [(4, SKIPPED), (6, SKIPPED), (7, REWRITTEN), (8, REWRITTEN), (10, REWRITTEN)], [(s.line, s.action, s.reason) for s in sites]
    assert "torch refuses a tensor lr" in sites[0].reason and "line 5" in sites[1].reason
    namespace = harness.load(out, filename="t.py")  # every optimizer builds
    m = namespace["m"]
    m(torch.ones(2)).sum().backward()
    for name in "abcde":
        namespace[name].step()


def test_foreach_is_not_added_where_a_parameter_groups_lr_may_be_a_tensor():
    """Found on unseen code: a tensor lr in a parameter group (a dict display, ``dict(lr=...)``,
    ``add_param_group``) made the first ``step()`` raise with ``foreach=True``. Number lrs in
    groups, and ``X.parameters()`` where no group is ever added, keep the rewrite."""
    src = textwrap.dedent("""\
        import torch
        m = torch.nn.Linear(2, 1)
        a = torch.optim.Adam([{"params": m.parameters(), "lr": torch.tensor(1e-3)}], lr=1e-3)
        b = torch.optim.Adam(m.parameters(), lr=1e-3)
        groups = [dict(params=m.parameters(), lr=torch.tensor(0.1))]
        c = torch.optim.AdamW(groups)
        """)
    out, sites = rw(src, backend="cpu", transforms=("device.optimizer",))
    assert [(s.line, s.action) for s in sites] == [(3, SKIPPED), (4, REWRITTEN), (6, SKIPPED)], sites
    assert "parameter group's lr (line 3)" in sites[0].reason and "(line 5)" in sites[2].reason
    later = textwrap.dedent("""\
        import torch
        m, n = torch.nn.Linear(2, 1), torch.nn.Linear(1, 1)
        a = torch.optim.Adam(m.parameters(), lr=1e-3)
        a.add_param_group({"params": n.parameters(), "lr": torch.tensor(0.1)})
        b = torch.optim.Adam([{"params": n.parameters(), "lr": 0.01}], lr=1e-3)
        """)
    out2, sites2 = rw(later, backend="cpu", transforms=("device.optimizer",))
    assert [(s.line, s.action) for s in sites2] == [(3, SKIPPED), (5, SKIPPED)], sites2
    for code, names in ((out, "abc"), (out2, "ab")):
        namespace = harness.load(code, filename="t.py")  # every optimizer builds and steps
        for layer in ("m", "n"):
            if layer in namespace:
                namespace[layer](torch.ones(namespace[layer].in_features)).sum().backward()
        for name in names:
            namespace[name].step()


def test_an_argument_appended_before_a_closing_parenthesis_on_its_own_line():
    """Found on salina: ``0.5, \\n    foreach=True)`` (a comma and a space before the newline that
    stood before ``)``); the new argument follows the last one, ``)`` keeps its line, and a comment
    there stays on the argument's line."""
    src = "import torch\ntorch.nn.utils.clip_grad_norm_(\n    m.parameters(), 0.5\n)\n"
    out, _ = rw(src, backend="cuda", transforms=("device.*",))
    assert "    m.parameters(), 0.5, foreach=True\n)\n" in out and " \n" not in out
    src = "import torch\ntorch.nn.utils.clip_grad_norm_(\n    m.parameters(), 0.5  # max norm\n)\n"
    out, _ = rw(src, backend="cuda", transforms=("device.*",))
    assert "    m.parameters(), 0.5, foreach=True  # max norm\n)\n" in out
    harness.compiled(out, "t.py")


def test_a_dropped_last_statement_of_a_block_keeps_the_lines_above_it():
    """Found on SLM-Lab (perf.py): the cuDNN flag last in a ``try`` body took the blank line above
    it along (a line outside the site changed). Only the flag's own line goes."""
    src = (
        "import torch\n"
        "def f():\n"
        "    try:\n"
        "        x = 1\n"
        "\n"
        "        # tune it\n"
        "        torch.backends.cudnn.benchmark = True\n"
        "    except Exception:\n"
        "        pass\n"
        "    if x:\n"
        "        x += 1\n"
        "\n"
        "    torch.backends.cudnn.deterministic = True\n"
    )
    out, sites = rw(src, transforms=("device.placement",))
    assert [(s.line, s.action) for s in sites] == [(7, REWRITTEN), (13, REWRITTEN)]
    assert out == src.replace("        torch.backends.cudnn.benchmark = True\n", "").replace(
        "    torch.backends.cudnn.deterministic = True\n", "")
    harness.compiled(out, "t.py")


# ------------------------------------------------------------------ by meaning


def test_aliased_torch_and_from_imports():
    out, _ = rw(
        """\
        import torch as th
        from torch import cuda
        from torch.cuda import manual_seed_all as seed_all
        ok = th.cuda.is_available() and cuda.device_count() > 0
        seed_all(1)
        """
    )
    assert "ok = th.npu.is_available() and th.npu.device_count() > 0" in out
    assert "th.npu.manual_seed_all(1)" in out
    assert out.startswith(NPU)


def test_from_import_without_a_torch_module_name_adds_import_torch():
    out, _ = rw("from torch.cuda import is_available\nok = is_available()\n")
    assert out == f"{NPU}import torch\nfrom torch.cuda import is_available\nok = torch.npu.is_available()\n"


def test_torch_name_taken_by_something_else():
    out, _ = rw("from torch.cuda import is_available\ntorch = 3\nok = is_available()\n")
    assert "import torch as torch_2\n" in out and "ok = torch_2.npu.is_available()" in out


def test_cleanrl_style_device_line():
    out, sites = rw(
        """\
        import torch
        device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
        """
    )
    assert 'torch.device("npu" if torch.npu.is_available() and args.cuda else "cpu")' in out
    assert all(s.exactness == EXACT for s in sites if s.action == REWRITTEN)


def test_sb3_style_device_parameter_and_attribute():
    out, _ = rw(
        """\
        import torch

        class Agent:
            def __init__(self, net, device="cuda"):
                self.device = device
                self.net = net.to(self.device)

            def act(self, obs):
                x = torch.as_tensor(obs, device=self.device)
                if self.device == "cuda":
                    torch.cuda.synchronize()
                return self.net(x)

            def describe(self, device="cuda"):
                return f"agent for {device}"
        """
    )
    assert 'def __init__(self, net, device="npu"):' in out
    assert 'if self.device == "npu":' in out
    assert "torch.npu.synchronize()" in out
    assert 'def describe(self, device="cuda"):' in out


def test_ddp_style_fstring_and_format_and_concat():
    out, _ = rw(
        """\
        import torch
        a = torch.device(f"cuda:{local_rank}")
        b = torch.zeros(1, device="cuda:{}".format(rank))
        c = x.to("cuda:" + str(rank))
        """
    )
    assert 'f"npu:{local_rank}"' in out and '"npu:{}".format(rank)' in out and '"npu:" + str(rank)' in out


def test_map_location_lambda_uses_the_method_rewrite():
    out, _ = rw('import torch\nsd = torch.load(p, map_location=lambda s, loc: s.cuda())\n')
    assert "s.npu()" in out


def test_device_type_comparison_variants():
    out, _ = rw(
        """\
        import torch
        a = x.device.type == 'cuda'
        b = device.type != "cuda"
        c = x.device.type in ("cuda", "mps")
        """
    )
    assert "x.device.type == 'npu'" in out and 'device.type != "npu"' in out and '("npu", "mps")' in out


def test_cudnn_flags_in_blocks_and_one_line_suites():
    out, sites = rw(
        """\
        import torch
        from torch.backends import cudnn

        def setup(seed):
            cudnn.deterministic = True

        if fast: cudnn.benchmark = True
        x = 1; torch.backends.cudnn.enabled = True; y = 2
        """,
        transforms=("device.placement",),
    )
    assert "def setup(seed):\n    pass\n" in out
    assert "if fast: pass\n" in out
    assert "x = 1; y = 2\n" in out
    assert sum(s.action == REWRITTEN for s in sites) == 3
    harness.compiled(out, "t.py")


def test_autocast_forms():
    out, _ = rw(
        """\
        import torch
        from torch.cuda.amp import autocast, GradScaler
        scaler = GradScaler()
        with autocast():
            y = f(x)
        with torch.cuda.amp.autocast(True, torch.bfloat16):
            y = f(x)
        @torch.cuda.amp.autocast()
        def fwd(x):
            return x
        """,
        transforms=("device.autocast",),
    )
    assert "scaler = torch.npu.amp.GradScaler()" in out
    assert 'with torch.autocast("npu"):' in out
    assert 'with torch.autocast("npu", enabled=True, dtype=torch.bfloat16):' in out
    assert '@torch.autocast("npu")' in out


def test_not_migratable_sites_carry_their_kind_in_the_json_report():
    src = """\
    import torch
    import cupy as cp
    import triton
    from torch.utils.cpp_extension import load

    ext = load("k", ["k.cu"])
    g = torch.cuda.CUDAGraph()
    torch.cuda.nvtx.range_push("step")
    cap = torch.cuda.get_device_capability()

    @triton.jit
    def kernel(x_ptr):
        pass
    """
    out, sites = rw(src)
    assert out == textwrap.dedent(src)
    kinds = sorted(s.kind for s in sites)
    assert kinds == sorted(
        [
            "not-migratable:cupy",
            "not-migratable:cuda-extension",
            "not-migratable:cuda-graphs",
            "not-migratable:nvtx",
            "not-migratable:torch.cuda",
            "not-migratable:triton",
        ]
    )
    assert all(s.action == WARNING for s in sites)
    assert all(json.loads(json.dumps(s.to_json()))["kind"] == s.kind for s in sites)


def test_migrated_torch_cuda_calls_are_not_reported_as_not_migratable():
    out, sites = rw("import torch\nok = torch.cuda.is_available()\n", transforms=("device.unsupported",))
    assert sites == []


def test_precision_report_and_opt_in_rewrite():
    src = """\
    import numpy as np
    import torch
    x = torch.tensor(data, dtype=torch.float64)
    y = x.double()
    z = torch.from_numpy(arr.astype(np.float64))
    w = np.float64(3.0)
    """
    out, sites = rw(src, transforms=("device.precision",))
    assert out == textwrap.dedent(src)
    assert [s.line for s in sites] == [3, 4, 5]
    assert all(s.action == WARNING and s.kind == "not-migratable:float64" for s in sites)
    out, sites = rw(src, transforms=("device.precision",), allow_precision_change=True)
    assert "dtype=torch.float32" in out and "y = x.float()" in out and "astype(np.float32)" in out
    assert "w = np.float64(3.0)" in out  # not flowing into torch
    assert all(s.exactness == CHANGES_SEMANTICS for s in sites)


def test_precision_leaves_cuda_and_cpu_backends_alone():
    for backend in ("cpu", "cuda"):
        unchanged("import torch\nx = torch.zeros(2, dtype=torch.float64)\n", backend=backend)


def test_tf32_only_on_request():
    src = '"""doc"""\nimport torch\nimport numpy as np\nx = 1\n'
    unchanged(src, backend="cuda")
    out, sites = rw(src, backend="cuda", allow_tf32=True)
    assert out == '"""doc"""\nimport torch\nimport numpy as np\ntorch.set_float32_matmul_precision("high")\nx = 1\n'
    assert sites[0].exactness == CHANGES_SEMANTICS and sites[0].line == 3


def test_backend_cuda_optimizers_and_clipping():
    out, sites = rw(
        """\
        import torch
        from torch.nn.utils import clip_grad_norm_
        q_optimizer = torch.optim.Adam(
            list(qf1.parameters()) + list(qf2.parameters()),
            lr=args.q_lr,
        )
        actor_optimizer = torch.optim.SGD(actor.parameters(), lr=0.1)
        clip_grad_norm_(actor.parameters(), 0.5)
        """,
        backend="cuda",
    )
    assert "q_optimizer = _sbx_fused_optimizer(\n    torch.optim.Adam, list(qf1.parameters())" in out
    assert "    lr=args.q_lr,\n)" in out
    assert "torch.optim.SGD(actor.parameters(), lr=0.1)\n" in out  # never fused: test_device_fused_sgd.py
    assert "clip_grad_norm_(actor.parameters(), 0.5, foreach=True)" in out
    assert "torch_npu" not in out


def test_backend_cpu_only_exact_foreach():
    out, sites = rw(
        "import torch\na = torch.optim.Adam(p)\nb = torch.optim.SGD(p, lr=0.1)\ntorch.nn.utils.clip_grad_norm_(p, 1.0)\n",
        backend="cpu",
    )
    assert out == "import torch\na = torch.optim.Adam(p, foreach=True)\nb = torch.optim.SGD(p, lr=0.1)\ntorch.nn.utils.clip_grad_norm_(p, 1.0)\n"
    assert [s.exactness for s in sites] == [EXACT]


def test_cpu_backend_leaves_cuda_code_alone():
    unchanged('import torch\nx = torch.zeros(2, device="cuda").cuda()\nok = torch.cuda.is_available()\n', backend="cpu")


def test_grad_clip_helper_gets_foreach():
    src = (
        "from scalebox_cst.runtime.clip import clip_grad_norm as _scalebox_clip_grad_norm\n"
        "_scalebox_clip_grad_norm(optimizer, max_norm=0.5)\n"
    )
    out, _ = rw(src, backend="npu", transforms=("device.optimizer",))
    assert "_scalebox_clip_grad_norm(optimizer, max_norm=0.5, foreach=True)" in out


def test_npu_fused_optimizer_conditions():
    base = "import torch\nopt = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
    out, _ = rw(base + "opt.zero_grad()\n", transforms=("device.optimizer",), npu_fused_optimizer=True)
    assert "opt = torch_npu.optim.NpuFusedAdam(model.parameters(), lr=1e-3)" in out
    for extra, why in (
        ("opt.zero_grad(set_to_none=True)\n", "set_to_none"),
        ("model.zero_grad()\n", "sets gradients to None"),
        ("model.to(torch.bfloat16)\n", "bfloat16"),
    ):
        out, sites = rw(base + extra, transforms=("device.optimizer",), npu_fused_optimizer=True)
        assert "NpuFused" not in out
        assert 'fused=_scalebox_npu.fused_ok("adam")' in out  # the plain fused path still applies
        assert any(s.action == SKIPPED and why in s.reason for s in sites)
    out, sites = rw("import torch\nopt = torch.optim.Adam(p, lr=1e-3, maximize=True)\n", transforms=("device.optimizer",), npu_fused_optimizer=True)
    assert "NpuFused" not in out


def test_site_lines_point_at_the_original_code():
    src = """\
    '''doc'''
    import torch

    x = torch.zeros(2).cuda()
    y = torch.cuda.device_count()
    """
    out, sites = rw(src)
    assert sorted((s.line, s.action) for s in sites) == [(4, REWRITTEN), (5, REWRITTEN)]


def test_everything_outside_the_sites_is_kept_byte_for_byte():
    src = (
        "# -*- coding: utf-8 -*-\n"
        "import torch  # the framework\n"
        "\n\n"
        "x   =   torch.zeros( 2 ).cuda( )   # odd spacing\n"
        "if True :\n"
        "\tpass\n"
    )
    out, _ = rw(src)
    first, rest = src.split("\n", 1)
    assert out == first + "\n" + NPU + rest.replace(".cuda( )", ".npu( )")


def test_device_passed_to_the_modules_own_functions_and_classes():
    out, _ = rw(
        """\
        import torch

        def make_buffer(size, device):
            return torch.zeros(size, device=device)

        class Agent:
            def __init__(self, obs_dim, device):
                self.w = torch.zeros(obs_dim, device=device)

        buf = make_buffer(10, "cuda")
        agent = Agent(4, device="cuda:0")
        label = make_label(10, "cuda")
        """
    )
    assert 'make_buffer(10, "npu")' in out and 'Agent(4, device="npu:0")' in out
    assert 'make_label(10, "cuda")' in out  # not a function of this module


def test_gelu_references_in_registries_and_defaults():
    out, _ = rw(
        """\
        import torch.nn as nn
        import torch.nn.functional as F
        ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU}

        def mlp(act=F.gelu):
            return act
        """,
        transforms=("device.fused_op",),
    )
    assert '{"gelu": _scalebox_npu.GELU, "relu": nn.ReLU}' in out and "def mlp(act=_scalebox_npu.gelu):" in out


def test_set_default_device():
    out, _ = rw('import torch\ntorch.set_default_device("cuda")\n')
    assert 'torch.set_default_device("npu")' in out


def test_cpu_foreach_rewrite_runs_bitwise_like_the_original():
    """Differential: exec the original and the cpu-backend rewrite of a training snippet."""
    src = textwrap.dedent(
        """\
        import torch
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, amsgrad=True)
        for _ in range(20):
            loss = model(torch.randn(8, 5)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        """
    )
    out, sites = rw(src, backend="cpu")
    assert "foreach=True" in out and sites[0].exactness == EXACT
    a, b = harness.run_pair(src, out, {})
    for p, q in zip(a["model"].parameters(), b["model"].parameters()):
        assert torch.equal(p, q)


def test_float64_in_dtype_tests_is_neither_renamed_nor_reported():
    """Found by the whole-file sweep (PFRL soft_copy_param: ``dtype in [torch.float32,
    torch.float64, torch.float16]``): a dtype compared against makes no float64 data, yet it was
    reported, and with allow_precision_change renamed, which turns the test around
    (``assert x.dtype != torch.double`` became ``!= torch.float32``). Creations still are."""
    src = """\
        import torch
        def f(x, sd):
            if x.dtype == torch.float64:
                x = x.float()
            assert x.dtype != torch.double
            ok = sd.dtype in [torch.float32, torch.float64, torch.float16]
            y = torch.zeros(3, dtype=torch.float64)
            return x, y, ok, torch.float64 is x.dtype
        """
    for allow in (False, True):
        out, sites = rw(src, transforms=("device.precision",), allow_precision_change=allow)
        expected = textwrap.dedent(src)
        if allow:
            expected = expected.replace("torch.zeros(3, dtype=torch.float64)", "torch.zeros(3, dtype=torch.float32)")
        assert out == expected
        assert [(s.line, s.action) for s in sites] == [(7, REWRITTEN if allow else WARNING)]
    ns = harness.load(out, filename="t")
    x, y, ok, same = ns["f"](torch.ones(2), torch.ones(1, dtype=torch.float16))
    assert ok and not same and y.dtype == torch.float32


@pytest.mark.parametrize("installed, fused", [((2, 3), False), ((2, 4), True), ((2, 13), True)])
def test_cuda_fused_optimizer_needs_torch_2_4(monkeypatch, installed, fused):
    """torch 2.1-2.3 raise in Adam(fused=True) while the parameters are still on the CPU (the TD3
    author's code builds optimizers before .cuda()); on those, fused= is not added, and why is said."""
    from scalebox_cst.transforms import device

    monkeypatch.setattr(device, "installed_torch", lambda: installed)
    src = "import torch\nopt = torch.optim.Adam(actor.parameters(), lr=3e-4)\nactor.cuda()\n"
    out, sites = rw(src, backend="cuda")
    assert ("_sbx_fused_optimizer(torch.optim.Adam, actor.parameters()" in out) is fused
    if not fused:
        assert out == src
        (site,) = [s for s in sites if "fused" in s.reason]
        assert site.action == SKIPPED and "needs torch >= 2.4" in site.reason and "2.3" in site.reason
