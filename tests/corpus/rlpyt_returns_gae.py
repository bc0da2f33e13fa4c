"""rlpyt algos/utils: discount_return and generalized_advantage_estimation (recurrences through
the output tensor, [T] or [T, B]) and discount_return_n_step (an n-step loop that looks like an
accumulation but reads what it accumulates: it must stay as written).

Source: astooke/rlpyt, rlpyt/algos/utils.py @ 046bca7ab3e3ca71a00100d4948f28ff1c5d6a59.
License: MIT.
Adapted: none (functions verbatim).
"""

import torch


def discount_return(reward, done, bootstrap_value, discount, return_dest=None):
    """Time-major inputs, optional other dimensions: [T], [T,B], etc."""
    return_ = return_dest if return_dest is not None else torch.zeros(
        reward.shape, dtype=reward.dtype)
    not_done = 1 - done
    return_[-1] = reward[-1] + discount * bootstrap_value * not_done[-1]
    for t in reversed(range(len(reward) - 1)):
        return_[t] = reward[t] + return_[t + 1] * discount * not_done[t]
    return return_


def generalized_advantage_estimation(reward, value, done, bootstrap_value,
        discount, gae_lambda, advantage_dest=None, return_dest=None):
    """Time-major inputs, optional other dimensions: [T], [T,B], etc."""
    advantage = advantage_dest if advantage_dest is not None else torch.zeros(
        reward.shape, dtype=reward.dtype)
    return_ = return_dest if return_dest is not None else torch.zeros(
        reward.shape, dtype=reward.dtype)
    nd = 1 - done
    advantage[-1] = reward[-1] + discount * bootstrap_value * nd[-1] - value[-1]
    for t in reversed(range(len(reward) - 1)):
        delta = reward[t] + discount * value[t + 1] * nd[t] - value[t]
        advantage[t] = delta + discount * gae_lambda * nd[t] * advantage[t + 1]
    return_[:] = advantage + value
    return advantage, return_


def discount_return_n_step(reward, done, n_step, discount, return_dest=None,
        done_n_dest=None):
    """Time-major inputs, optional other dimension: [T], [T,B], etc."""
    rl = reward.shape[0] - (n_step - 1)
    return_ = return_dest if return_dest is not None else torch.zeros(
        (rl,) + reward.shape[1:], dtype=reward.dtype)
    done_n = done_n_dest if done_n_dest is not None else torch.zeros(
        (rl,) + reward.shape[1:], dtype=done.dtype)
    return_[:] = reward[:rl]  # 1-step return is current reward.
    done_n[:] = done[:rl]  # True at time t if done any time by t + n - 1
    if n_step > 1:
        for n in range(1, n_step):
            return_ += (discount ** n) * reward[n:n + rl] * (1 - done_n)
            done_n += done[n:n + rl]
    return return_, done_n


EXPECT = {
    "for t in reversed(range(len(reward) - 1)):@1": ("vectorize.recurrence", "REWRITTEN", "reassociated"),
    "for t in reversed(range(len(reward) - 1)):@2": ("vectorize.recurrence", "REWRITTEN", "exact"),
    "for n in range(1, n_step):": ("vectorize.reduction", "SKIPPED", None),
}


def run(ns, T, seed):
    g = torch.Generator().manual_seed(seed)
    B = 4
    reward = torch.randn(T, B, generator=g)
    value = torch.randn(T, B, generator=g)
    done = (torch.rand(T, B, generator=g) < 0.1).float()
    boot = torch.randn(B, generator=g)
    out = [
        ns["discount_return"](reward, done, boot, 0.99),
        ns["generalized_advantage_estimation"](reward, value, done, boot, 0.99, 0.97),
        ns["discount_return"](reward[:, 0], done[:, 0], boot[0], 0.99),
    ]
    if T >= 3:
        out.append(ns["discount_return_n_step"](reward, done, 3, 0.99))
    return out
