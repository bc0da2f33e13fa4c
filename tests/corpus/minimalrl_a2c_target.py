"""minimalRL A2C compute_target: G = r + gamma * G * mask walked with zip(r_lst[::-1],
mask_lst[::-1]) over per-step numpy vectors, appended, then reversed with [::-1].

Source: seungeunrho/minimalRL, a2c.py @ 7597b9af94ee64536dfd261446d795854f34171b
(compute_target; gamma is a module-level hyperparameter). License: MIT.
Adapted: none (the function and the hyperparameter are verbatim).
"""
import numpy as np
import torch

gamma = 0.98


def compute_target(v_final, r_lst, mask_lst):
    G = v_final.reshape(-1)
    td_target = list()

    for r, mask in zip(r_lst[::-1], mask_lst[::-1]):
        G = r + gamma * G * mask
        td_target.append(G)

    return torch.tensor(td_target[::-1]).float()


EXPECT = {
    "for r, mask in zip(r_lst[::-1], mask_lst[::-1]):": ("vectorize.recurrence", "REWRITTEN", "reassociated"),
}


def run(ns, T, seed):
    rng = np.random.default_rng(seed)
    n = 3
    v_final = rng.standard_normal((n, 1)).astype(np.float32)
    r_lst = [rng.standard_normal(n) / 100.0 for _ in range(T)]
    mask_lst = [1 - (rng.random(n) < 0.1) for _ in range(T)]
    return ns["compute_target"](v_final, r_lst, mask_lst)
