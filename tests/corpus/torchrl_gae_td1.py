"""TorchRL value functionals: generalized_advantage_estimate and td1_return_estimate, backward
recurrences with time in the middle (x[..., t, :], [*B, T, F] tensors), a chained assignment
`prev_advantage = advantage[..., t, :] = ...`, and a nested TD(1) loop over k.

Source: pytorch/rl, torchrl/objectives/value/functional.py @
001413c691089ee2d63d8fed2a95f0b6cc6508d2. License: MIT.
Adapted: the @_transpose_time decorator (a no-op for time_dim=-2) is dropped; the functions are
verbatim (docstrings shortened).
"""
from typing import Tuple

import torch


def generalized_advantage_estimate(
    gamma: float,
    lmbda: float,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    time_dim: int = -2,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimate of a trajectory."""
    if not (next_state_value.shape == state_value.shape == reward.shape == done.shape):
        raise RuntimeError(
            "All input tensors (value, reward and done states) must share a unique shape."
        )
    dtype = next_state_value.dtype
    device = state_value.device
    lastdim = next_state_value.shape[-1]

    not_done = 1 - done.to(dtype)
    *batch_size, time_steps = not_done.shape[:-1]
    advantage = torch.empty(
        *batch_size, time_steps, lastdim, device=device, dtype=dtype
    )
    prev_advantage = 0
    for t in reversed(range(time_steps)):
        delta = (
            reward[..., t, :]
            + (gamma * next_state_value[..., t, :] * not_done[..., t, :])
            - state_value[..., t, :]
        )
        prev_advantage = advantage[..., t, :] = delta + (
            gamma * lmbda * prev_advantage * not_done[..., t, :]
        )

    value_target = advantage + state_value

    return advantage, value_target


def td1_return_estimate(
    gamma: float,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    rolling_gamma: bool = None,
    time_dim: int = -2,
) -> torch.Tensor:
    r"""TD(1) return estimate."""
    if not (next_state_value.shape == reward.shape == done.shape):
        raise RuntimeError(
            "All input tensors (value, reward and done states) must share a unique shape."
        )
    not_done = 1 - done.to(next_state_value.dtype)

    returns = torch.empty_like(next_state_value)

    T = returns.shape[-2]

    single_gamma = False
    if not (isinstance(gamma, torch.Tensor) and gamma.shape == not_done.shape):
        single_gamma = True
        gamma = torch.full_like(next_state_value, gamma)

    if rolling_gamma is None:
        rolling_gamma = True
    elif not rolling_gamma and single_gamma:
        raise RuntimeError(
            "rolling_gamma=False is expected only with time-sensitive gamma values"
        )

    if rolling_gamma:
        gamma = gamma * not_done
        g = next_state_value[..., -1, :]
        for i in reversed(range(T)):
            g = returns[..., i, :] = reward[..., i, :] + gamma[..., i, :] * g
    else:
        for k in range(T):
            g = next_state_value[..., -1, :]
            _gamma = gamma[..., k, :]
            nd = not_done
            _gamma = _gamma.unsqueeze(-2) * nd
            for i in reversed(range(k, T)):
                g = reward[..., i, :] + _gamma[..., i, :] * g
            returns[..., k, :] = g
    return returns


# shorter than the default 700: the inner td(lambda) loops make the original quadratic in T
LENGTHS = (1, 2, 3, 17, 160)
EXPECT = {
    "for t in reversed(range(time_steps)):": ("vectorize.recurrence", "REWRITTEN", "reassociated"),
    "for i in reversed(range(T)):": ("vectorize.recurrence", "REWRITTEN", "exact"),
    # the inner TD(1) loop over a range that starts at k
    "for i in reversed(range(k, T)):": ("vectorize.recurrence", "SKIPPED", None),
}


def run(ns, T, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for dtype in (torch.float32, torch.float64):
        for B in ((4,), (2, 3), ()):
            shape = (*B, T, 1)
            sv = torch.randn(shape, generator=g, dtype=dtype)
            nsv = torch.randn(shape, generator=g, dtype=dtype)
            r = torch.randn(shape, generator=g, dtype=dtype)
            d = torch.rand(shape, generator=g) < 0.1
            out.append(ns["generalized_advantage_estimate"](0.99, 0.95, sv, nsv, r, d))
            out.append(ns["td1_return_estimate"](0.99, nsv, r, d))
            gam = torch.rand(shape, generator=g, dtype=dtype)
            out.append(ns["td1_return_estimate"](gam, nsv, r, d, rolling_gamma=False))
        # several features: F = 2
        shape = (3, T, 2)
        sv, nsv, r = (torch.randn(shape, generator=g, dtype=dtype) for _ in range(3))
        d = torch.rand(shape, generator=g) < 0.1
        out.append(ns["generalized_advantage_estimate"](0.9, 0.8, sv, nsv, r, d))
    return out
