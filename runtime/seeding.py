"""The launcher's seeding of a run of ``scalebox run --seeds N``, before the script runs.

A script that takes ``--seed`` gets ``--seed N`` too and is seeded all the same: such scripts
often seed torch alone and still shuffle with numpy's global generator or reset an evaluation
env without a seed (XinJingHao's DRL-Pytorch), so two runs of one seed differed; what the script
seeds itself it seeds again after this.

``random``, numpy's global generator and torch are seeded with N before the script runs. That
alone did not make such a run reproducible: gymnasium (and gym) give every env and space that
is not handed a seed its own generator from ``seeding.np_random(None)``, i.e. from the OS's
entropy, so ``env.reset()`` without ``seed=`` (minimalRL, PPO-for-Beginners and most tutorial
scripts) started each run, original or rewrite, from other states: two runs of one seed
differed, and an ``exact`` rewrite could not be told from a changed one by its returns.

So, once ``gymnasium.utils.seeding`` / ``gym.utils.seeding`` is imported, its ``np_random``
called with ``seed=None`` draws the k-th seed of a stream keyed by N instead
(``SeedSequence(N, spawn_key=(..., k))``, an int below 2**32) and hands it to the library's own
``np_random``: what it returns keeps its types, and a seed the script passes goes through
untouched. A forked child (SubprocVecEnv, multiprocessing with fork) continues on a stream of
its own, keyed by the order of the forks, so worker envs stay independent of one another as
they were. Spawned children are not seeded by the launcher (as for numpy and torch).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import random
from typing import Any, Tuple

#: the modules whose ``np_random`` draws an unseeded env's or space's generator
SEEDING_MODULES = ("gymnasium.utils.seeding", "gym.utils.seeding")
#: spawn-key tags: a draw in this process, a forked child of it
_DRAW, _FORK = 0, 1


class _Stream:
    """The seeds handed out for ``np_random(None)`` in this process, in order."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.path: Tuple[int, ...] = ()
        self.drawn = 0
        self.forks = 0

    def next_seed(self) -> int:
        import numpy as np

        key = self.path + (_DRAW, self.drawn)
        self.drawn += 1
        return int(np.random.SeedSequence(self.seed, spawn_key=key).generate_state(1)[0])

    def before_fork(self) -> None:
        self.forks += 1

    def in_child(self) -> None:
        self.path = self.path + (_FORK, self.forks)
        self.drawn = self.forks = 0


def _patch(module: Any, stream: _Stream) -> None:
    real = getattr(module, "np_random", None)
    if real is None or getattr(real, "_scalebox_seeded", False):
        return

    def np_random(seed: Any = None, *args: Any, **kwargs: Any) -> Any:
        return real(stream.next_seed() if seed is None else seed, *args, **kwargs)

    np_random._scalebox_seeded = True  # type: ignore[attr-defined]
    np_random.__wrapped__ = real  # type: ignore[attr-defined]
    np_random.__doc__ = real.__doc__
    module.np_random = np_random


def seed_all(seed: int) -> None:
    """Seed random, numpy, torch now, and gymnasium's / gym's unseeded generators once imported."""
    random.seed(seed)
    for name in ("numpy", "torch"):
        if importlib.util.find_spec(name) is None:
            continue
        module = importlib.import_module(name)
        if name == "numpy":
            module.random.seed(seed)
        else:
            module.manual_seed(seed)
    if importlib.util.find_spec("numpy") is None:
        return
    from scalebox_cst.runtime.telemetry.imports import when_imported

    stream = _Stream(seed)
    if hasattr(os, "register_at_fork"):  # POSIX
        os.register_at_fork(before=stream.before_fork, after_in_child=stream.in_child)

    def patch(module: Any) -> None:
        _patch(module, stream)

    for name in SEEDING_MODULES:
        when_imported(name, patch)
