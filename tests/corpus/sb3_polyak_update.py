"""Stable-Baselines3 polyak_update: zip over parameter *iterables* (callers pass generators),
`mul_` then `th.add(..., alpha=tau, out=...)`. Left alone: the iterables may be one-shot
generators and th.add(out=) is not a recognised update form.

Source: DLR-RM/stable-baselines3, stable_baselines3/common/utils.py @
004307a22c0d0dc04112730602fdd4bf90100509 (polyak_update). License: MIT.
Adapted: docstring shortened; the body is verbatim.
"""
from typing import Iterable

import torch as th


def polyak_update(params: Iterable[th.nn.Parameter], target_params: Iterable[th.nn.Parameter], tau: float) -> None:
    """
    Perform a Polyak average update on ``target_params`` using ``params``.
    """
    with th.no_grad():
        for param, target_param in zip(params, target_params):
            target_param.data.mul_(1 - tau)
            th.add(target_param.data, param.data, alpha=tau, out=target_param.data)


EXPECT = {  # left alone, and said so: an update loop over iterables that may be one-shot generators
    "for param, target_param in zip(params, target_params):": ("vectorize.target_update", "SKIPPED", None),
}
LENGTHS = (1, 3)


def run(ns, T, seed):
    th.manual_seed(seed)
    a = th.nn.Linear(8, 4)
    b = th.nn.Linear(8, 4)
    for _ in range(T):
        ns["polyak_update"](a.parameters(), b.parameters(), 0.01)
    return [p.detach().clone() for p in b.parameters()]
