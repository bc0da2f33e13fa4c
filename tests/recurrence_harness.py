"""The differential harness of ``vectorize.recurrence``, shared by its test files.

A recurrence snippet is module-level code (its inputs are the globals it reads). :func:`run_both`
runs the original and the rewrite on copies of the same inputs and also checks which branch the
run-time guard took: a test that means to exercise the vectorized steps must not pass because the
guard quietly fell back to the loop. The files set ``MIN_STEPS`` low in ``setup_module`` so that
short random sequences reach the vectorized branch.
"""
from __future__ import annotations

from typing import Optional

from scalebox_cst.report import EXACT, REWRITTEN, SKIPPED
from scalebox_cst.runtime import vectorized as vectorized_mod

import harness
from differential import clone, same_namespaces

ID = "vectorize.recurrence"

#: Stable-Baselines3's RolloutBuffer GAE over numpy arrays (the recurrence and the one-pass tests run it)
SB3 = """\
import numpy as np


class RolloutBuffer:
    def __init__(self, rewards, values, episode_starts, gamma=0.99, gae_lambda=0.95):
        self.buffer_size = len(rewards)
        self.rewards, self.values, self.episode_starts = rewards, values, episode_starts
        self.advantages = np.zeros_like(rewards)
        self.gamma, self.gae_lambda = gamma, gae_lambda

    def compute_returns_and_advantage(self, last_values, dones):
        last_gae_lam = 0
        for step in reversed(range(self.buffer_size)):
            if step == self.buffer_size - 1:
                next_non_terminal = 1.0 - dones.astype(np.float32)
                next_values = last_values
            else:
                next_non_terminal = 1.0 - self.episode_starts[step + 1]
                next_values = self.values[step + 1]
            delta = self.rewards[step] + self.gamma * next_values * next_non_terminal - self.values[step]
            last_gae_lam = delta + self.gamma * self.gae_lambda * next_non_terminal * last_gae_lam
            self.advantages[step] = last_gae_lam
        self.returns = self.advantages + self.values


buf = RolloutBuffer(rewards, values, episode_starts)
buf.compute_returns_and_advantage(last_values, dones)
advantages, returns_ = buf.advantages, buf.returns
"""


def rewrite(src: str, **options):
    """``(output, sites)`` of ``src`` (as written, not dedented) with ``options`` for the transform."""
    return harness.rewrite(src, ID, dedent=False, options={ID: options})


def rewritten(src: str, exactness: Optional[str] = EXACT, **options) -> str:
    """The rewrite of ``src``; every site rewritten with ``exactness`` (None: any)."""
    out, sites = rewrite(src, **options)
    done = [s for s in sites if s.action == REWRITTEN]
    assert done, [s.describe() for s in sites]
    assert exactness is None or all(s.exactness == exactness for s in done), [s.describe() for s in done]
    return out


_CACHE: dict = {}


def compiled(src: str, exactness: Optional[str] = EXACT):
    """(original code object, rewritten code object), rewriting each snippet once."""
    key = (src, exactness)
    if key not in _CACHE:
        _CACHE[key] = (harness.compiled(src, "orig"), harness.compiled(rewritten(src, exactness), "new"))
    return _CACHE[key]


def run_both(src: str, env: dict, exactness: Optional[str] = EXACT, vectorized: bool = True):
    """Exec original and rewrite at module level on copies of ``env``; both namespaces.
    ``vectorized``: the guard must have chosen the vectorized branch (else: the loop). Where the
    one-pass tier ran, the vectorized steps it stands in front of must leave the same values."""
    orig, new = compiled(src, exactness)
    with harness.spy(vectorized_mod, "recurrence_ok") as answers, harness.spy(vectorized_mod, "fused_linear") as fused:
        ns1, ns2 = harness.run_pair(orig, new, env, clone=clone)
    one_pass = any(x is not None for x in fused)
    assert (True in answers or one_pass) == vectorized, (answers, fused)
    if one_pass:
        real_fused = vectorized_mod.fused_linear
        vectorized_mod.fused_linear = lambda *args, **kwargs: None
        try:
            ns3 = harness.load(new, namespace=clone(env))
        finally:
            vectorized_mod.fused_linear = real_fused
        same_namespaces({k: ns2[k] for k in ns1 if k in ns2}, ns3)
    return ns1, ns2


def sites_of(src: str):
    """``(output, rewritten sites, skipped sites)``."""
    out, sites = rewrite(src)
    return out, [s for s in sites if s.action == REWRITTEN], [s for s in sites if s.action == SKIPPED]


def left_alone(src: str, reason: str) -> None:
    """``src`` comes back byte for byte, no site rewritten, a skipped one saying ``reason``."""
    out, done, skipped = sites_of(src)
    assert out == src, out  # byte for byte
    assert not done, [s.describe() for s in done]
    assert any(reason in s.reason for s in skipped), [s.describe() for s in skipped]
