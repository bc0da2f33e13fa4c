"""Placement swaps (npu): .cuda(), device strings, torch.cuda twins, legacy tensor types, cuDNN flags,
nccl."""
from __future__ import annotations

from typing import Tuple

from scalebox_cst.report import CHANGES_SEMANTICS

from .swap import CUDA_LITERAL, DEVICE_POSITIONS, PLACEMENT, Swap, _NPU_LINE


def _twin(name: str, call: str = "()") -> Swap:
    """``torch.cuda.<name>`` -> ``torch.npu.<name>`` (torch_npu registers the twin namespace)."""
    return Swap(
        id=f"placement.twin.{name}",
        transform=PLACEMENT,
        kind="rename",
        pattern=f"torch.cuda.{name}",
        replacement=f"torch.npu.{name}",
        reason=f"torch.cuda.{name} -> torch.npu.{name} (the NPU twin torch_npu registers)",
        min_torch_npu="1.11.0",
        before=f"import torch\nr = torch.cuda.{name}{call}\n",
        after=f"{_NPU_LINE}import torch\nr = torch.npu.{name}{call}\n",
    )


TWINS = (
    ("is_available", "()"),
    ("device_count", "()"),
    ("set_device", "(0)"),
    ("current_device", "()"),
    ("synchronize", "()"),
    ("manual_seed", "(0)"),
    ("manual_seed_all", "(0)"),
    ("memory_allocated", "()"),
    ("max_memory_allocated", "()"),
    ("reset_peak_memory_stats", "()"),
    ("empty_cache", "()"),
    ("memory_reserved", "()"),
    ("max_memory_reserved", "()"),
    ("get_device_name", "(0)"),
    ("is_bf16_supported", "()"),
    ("get_rng_state", "()"),
    ("set_rng_state", "(state)"),
    ("Stream", "()"),
    ("Event", "(enable_timing=True)"),
    ("current_stream", "()"),
    ("stream", "(s)"),
    ("device", "(0)"),  # the context manager selecting a device: torch_npu has torch.npu.device
)

#: torch.cuda legacy tensor types: (type name, dtype on the npu, CPU legacy type)
LEGACY_TYPES = (
    ("FloatTensor", "torch.float32", "torch.FloatTensor"),
    ("HalfTensor", "torch.float16", "torch.HalfTensor"),
    ("BFloat16Tensor", "torch.bfloat16", "torch.BFloat16Tensor"),
    ("LongTensor", "torch.int64", "torch.LongTensor"),
    ("IntTensor", "torch.int32", "torch.IntTensor"),
    ("ShortTensor", "torch.int16", "torch.ShortTensor"),
    ("CharTensor", "torch.int8", "torch.CharTensor"),
    ("ByteTensor", "torch.uint8", "torch.ByteTensor"),
    ("BoolTensor", "torch.bool", "torch.BoolTensor"),
)

_LEGACY_REASON = (
    "torch.cuda.{name} -> a {dtype} tensor on the npu: sizes -> torch.empty, a list or tuple -> "
    "torch.tensor, any other argument -> {cpu}(...).npu() (the CPU constructor reads it the same way), "
    ".type(torch.cuda.{name}) -> .to(device, dtype), an alias only ever called -> a function doing the same"
)


def _legacy(name: str, dtype: str, cpu: str) -> Swap:
    return Swap(
        id=f"placement.legacy.{name}",
        transform=PLACEMENT,
        kind="legacy-tensor",
        pattern=f"torch.cuda.{name}",
        replacement=dtype,
        value=cpu,
        reason=_LEGACY_REASON.format(name=name, dtype=dtype, cpu=cpu),
        min_torch_npu="1.11.0",
        before=(
            "import torch\n"
            f"a = torch.cuda.{name}(3, 4)\n"
            f"b = torch.cuda.{name}([1, 0])\n"
            f"c = torch.cuda.{name}(state)\n"
            f"d = x.type(torch.cuda.{name})\n"
        ),
        after=(
            f"{_NPU_LINE}import torch\n"
            f'a = torch.empty(3, 4, dtype={dtype}, device="npu")\n'
            f'b = torch.tensor([1, 0], dtype={dtype}, device="npu")\n'
            f"c = {cpu}(state).npu()\n"
            f'd = x.to(device="npu", dtype={dtype})\n'
        ),
    )


PLACEMENT_SWAPS: Tuple[Swap, ...] = (
    Swap(
        id="placement.cuda-method",
        transform=PLACEMENT,
        kind="method",
        pattern="cuda",
        replacement="npu",
        conditions=("no-user-member",),
        reason=".cuda() -> .npu() (Tensor.npu / Module.npu from torch_npu)",
        min_torch_npu="1.11.0",
        before="import torch\nnet = torch.nn.Linear(2, 2).cuda()\nx = torch.zeros(2).cuda(non_blocking=True)\n",
        after=f"{_NPU_LINE}import torch\nnet = torch.nn.Linear(2, 2).npu()\nx = torch.zeros(2).npu(non_blocking=True)\n",
    ),
    Swap(
        id="placement.is-cuda",
        transform=PLACEMENT,
        kind="attribute",
        pattern="is_cuda",
        replacement="is_npu",
        conditions=("no-user-member",),
        reason="x.is_cuda -> x.is_npu",
        min_torch_npu="1.11.0",
        before="import torch\nif x.is_cuda:\n    pass\n",
        after=f"{_NPU_LINE}import torch\nif x.is_npu:\n    pass\n",
    ),
    Swap(
        id="placement.torch-device",
        transform=PLACEMENT,
        kind="literal-arg",
        pattern="torch.device",
        positions=DEVICE_POSITIONS,
        literal=CUDA_LITERAL,
        reason="device string in a device argument: 'cuda' -> 'npu'",
        min_torch_npu="1.11.0",
        before=(
            "import torch\n"
            'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n'
            'd1 = torch.device("cuda", 1)\n'
            "d2 = torch.device('cuda:0')\n"
            'd3 = torch.device(f"cuda:{rank}")\n'
        ),
        after=(
            f"{_NPU_LINE}import torch\n"
            'device = torch.device("npu" if torch.npu.is_available() else "cpu")\n'
            'd1 = torch.device("npu", 1)\n'
            "d2 = torch.device('npu:0')\n"
            'd3 = torch.device(f"npu:{rank}")\n'
        ),
    ),
    Swap(
        id="placement.device-kwarg",
        transform=PLACEMENT,
        kind="literal-arg",
        pattern="device=",
        positions=DEVICE_POSITIONS,
        literal=CUDA_LITERAL,
        reason="device string in a device argument: 'cuda' -> 'npu'",
        min_torch_npu="1.11.0",
        before='import torch\nx = torch.zeros(3, device="cuda")\ny = torch.randn(2, 2, device="cuda:1")\n',
        after=f'{_NPU_LINE}import torch\nx = torch.zeros(3, device="npu")\ny = torch.randn(2, 2, device="npu:1")\n',
    ),
    Swap(
        id="placement.to",
        transform=PLACEMENT,
        kind="literal-arg",
        pattern=".to",
        positions=DEVICE_POSITIONS,
        literal=CUDA_LITERAL,
        reason="device string in a device argument: 'cuda' -> 'npu'",
        min_torch_npu="1.11.0",
        before='import torch\nmodel.to("cuda")\nx = x.to(device="cuda:0", non_blocking=True)\n',
        after=f'{_NPU_LINE}import torch\nmodel.to("npu")\nx = x.to(device="npu:0", non_blocking=True)\n',
    ),
    Swap(
        id="placement.map-location",
        transform=PLACEMENT,
        kind="literal-arg",
        pattern="torch.load",
        positions=DEVICE_POSITIONS,
        literal=CUDA_LITERAL,
        reason="device string in a device argument: 'cuda' -> 'npu'",
        min_torch_npu="1.11.0",
        before='import torch\nstate = torch.load("ckpt.pt", map_location="cuda")\n',
        after=f'{_NPU_LINE}import torch\nstate = torch.load("ckpt.pt", map_location="npu")\n',
    ),
    Swap(
        id="placement.device-variable",
        transform=PLACEMENT,
        kind="literal-arg",
        pattern="<name flowing into a device argument>",
        positions=DEVICE_POSITIONS,
        literal=CUDA_LITERAL,
        reason="device string in a device argument: 'cuda' -> 'npu'",
        min_torch_npu="1.11.0",
        before=(
            "import torch\n"
            'device = "cuda"\n'
            "x = torch.ones(2, device=device)\n"
            'if device == "cuda":\n'
            "    pass\n"
        ),
        after=(
            f"{_NPU_LINE}import torch\n"
            'device = "npu"\n'
            "x = torch.ones(2, device=device)\n"
            'if device == "npu":\n'
            "    pass\n"
        ),
    ),
    Swap(
        id="placement.argparse-default",
        transform=PLACEMENT,
        kind="literal-arg",
        pattern="<argparse option flowing into a device argument>",
        positions=DEVICE_POSITIONS,
        literal=CUDA_LITERAL,
        reason="device string in a device argument: 'cuda' -> 'npu'",
        min_torch_npu="1.11.0",
        before=(
            "import argparse\nimport torch\n"
            "parser = argparse.ArgumentParser()\n"
            'parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"], help="cuda or cpu")\n'
            "args = parser.parse_args()\n"
            "device = torch.device(args.device)\n"
        ),
        after=(
            f"{_NPU_LINE}import argparse\nimport torch\n"
            "parser = argparse.ArgumentParser()\n"
            'parser.add_argument("--device", default="npu", choices=["cpu", "npu"], help="cuda or cpu")\n'
            "args = parser.parse_args()\n"
            "device = torch.device(args.device)\n"
        ),
    ),
    Swap(
        id="placement.device-type-compare",
        transform=PLACEMENT,
        kind="compare",
        pattern=".type",
        literal=CUDA_LITERAL,
        reason="device type comparison: 'cuda' -> 'npu'",
        min_torch_npu="1.11.0",
        before='import torch\nif x.device.type == "cuda":\n    pass\n',
        after=f'{_NPU_LINE}import torch\nif x.device.type == "npu":\n    pass\n',
    ),
    Swap(
        id="placement.cudnn-flags",
        transform=PLACEMENT,
        kind="drop-assign",
        pattern="torch.backends.cudnn.",
        reason="cuDNN flag dropped: cuDNN is not used on NPU, the setting has no effect there",
        before=(
            "import torch\n"
            "# determinism\n"
            "torch.backends.cudnn.deterministic = True\n"
            "torch.backends.cudnn.benchmark = False\n"
            "x = 1\n"
        ),
        after="import torch\n# determinism\nx = 1\n",
    ),
    Swap(
        id="placement.nccl",
        transform=PLACEMENT,
        kind="literal-arg",
        pattern="torch.distributed.init_process_group",
        positions=(
            ("torch.distributed.init_process_group", 0, "backend"),
            ("torch.distributed.new_group", None, "backend"),
        ),
        literal=(r"^nccl$", "hccl"),
        reason="collective backend 'nccl' -> 'hccl' (Ascend's collective library)",
        min_torch_npu="1.11.0",
        before='import torch.distributed as dist\ndist.init_process_group("nccl")\nprint("nccl")\n',
        after=f'{_NPU_LINE}import torch.distributed as dist\ndist.init_process_group("hccl")\nprint("nccl")\n',
    ),
    *(_twin(name, call) for name, call in TWINS),
    *(_legacy(name, dtype, cpu) for name, dtype, cpu in LEGACY_TYPES),
    Swap(
        id="placement.legacy.DoubleTensor",
        transform=PLACEMENT,
        kind="legacy-tensor",
        pattern="torch.cuda.DoubleTensor",
        replacement="torch.float32",
        value="torch.FloatTensor",
        exactness=CHANGES_SEMANTICS,
        conditions=("precision-allowed",),
        site_kind="not-migratable:float64",
        reason="torch.cuda.DoubleTensor -> a float32 tensor on the npu (requested: the NPU has no float64)",
        min_torch_npu="1.11.0",
        before="import torch\nx = torch.cuda.DoubleTensor([1.0])\n",
        after=f'{_NPU_LINE}import torch\nx = torch.tensor([1.0], dtype=torch.float32, device="npu")\n',
        example_options=(("allow_precision_change", True),),
    ),
)
