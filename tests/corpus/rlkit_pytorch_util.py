"""rlkit pytorch_util: soft_update_from_to (`target_param.data * (1.0 - tau) + param.data * tau`,
target first in zip, coefficients on the right) and copy_model_params_from_to (hard copy).

Source: rail-berkeley/rlkit, rlkit/torch/pytorch_util.py @
050e86f27958a361554936f3a40780907fd15d6f. License: MIT.
Adapted: none (functions verbatim).
"""
import torch
import numpy as np


def soft_update_from_to(source, target, tau):
    for target_param, param in zip(target.parameters(), source.parameters()):
        target_param.data.copy_(
            target_param.data * (1.0 - tau) + param.data * tau
        )


def copy_model_params_from_to(source, target):
    for target_param, param in zip(target.parameters(), source.parameters()):
        target_param.data.copy_(param.data)


EXPECT = {
    "for target_param, param in zip(target.parameters(), source.parameters()):@1": ("vectorize.target_update", "REWRITTEN", "exact"),
    "for target_param, param in zip(target.parameters(), source.parameters()):@2": ("vectorize.target_update", "REWRITTEN", "exact"),
}
LENGTHS = (1, 3)


def run(ns, T, seed):
    torch.manual_seed(seed)
    src = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    soft = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    hard = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    for _ in range(T):
        ns["soft_update_from_to"](src, soft, 0.01)
    ns["copy_model_params_from_to"](src, hard)
    return [p.detach().clone() for p in soft.parameters()], [p.detach().clone() for p in hard.parameters()]
