"""Rainy clamp_actions_: a TorchScript-compiled per-column in-place clamp (`t[:, i].clamp_(...)`).
Look-alike of an element-wise loop; it is compiled by torch.jit.script, so any rewrite would change
what TorchScript compiles: it must be left alone.

Source: kngwyu/Rainy, rainy/utils/misc.py (clamp_actions_, normalize_). Commit: not recorded by
the index. License: not recorded.
Adapted: none (verbatim).
"""
import torch
from torch import Tensor


@torch.jit.script
def clamp_actions_(t: Tensor, min_t: Tensor, max_t: Tensor) -> Tensor:
    for i in range(t.size(1)):
        t[:, i].clamp_(min_t[i].item(), max_t[i].item())
    return t


@torch.jit.script
def normalize_(t: Tensor, eps: float) -> None:
    mean = t.mean()
    std = t.std()
    t.sub_(mean).div_(std + eps)


EXPECT = {}
LEAVE_ALONE = True


def run(ns, T, seed):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(T, 3, generator=g) * 3
    ns["clamp_actions_"](t, torch.tensor([-1.0, -2.0, 0.0]), torch.tensor([1.0, 2.0, 0.5]))
    u = torch.randn(T + 1, generator=g)
    ns["normalize_"](u, 1e-8)
    return t, u
