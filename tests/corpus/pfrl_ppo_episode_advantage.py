"""PFRL PPO _add_advantage_and_value_target_to_episode: GAE over `reversed(episode)`, a list of
transition dicts, written back into each dict.

Source: pfnet/pfrl, pfrl/agents/ppo.py (_add_advantage_and_value_target_to_episode). Commit: not
recorded by the index. License: MIT.
Adapted: none (function verbatim).
"""
import numpy as np


def _add_advantage_and_value_target_to_episode(episode, gamma, lambd):
    """Add advantage and value target values to an episode."""
    adv = 0.0
    for transition in reversed(episode):
        td_err = (
            transition["reward"]
            + (gamma * transition["nonterminal"] * transition["next_v_pred"])
            - transition["v_pred"]
        )
        adv = td_err + gamma * lambd * adv
        transition["adv"] = adv
        transition["v_teacher"] = adv + transition["v_pred"]


EXPECT = {
    "for transition in reversed(episode):": ("vectorize.recurrence", "SKIPPED", None),
}
LEAVE_ALONE = True


def run(ns, T, seed):
    rng = np.random.default_rng(seed)
    episode = [
        {"reward": float(rng.standard_normal()), "nonterminal": float(rng.random() > 0.05),
         "next_v_pred": np.float32(rng.standard_normal()), "v_pred": np.float32(rng.standard_normal())}
        for _ in range(T)
    ]
    ns["_add_advantage_and_value_target_to_episode"](episode, 0.99, 0.95)
    return episode
