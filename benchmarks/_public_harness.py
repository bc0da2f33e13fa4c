"""Runs one public training script the same way every time (the bench_public_scripts harness).

    python _public_harness.py SCRIPT [ARGS...]

Environment: ``SB_BENCH_GYM`` = ``gymnasium`` (``import gym`` gives gymnasium when gym is not
installed: minimalRL's scripts use gym>=0.26's API, which gymnasium keeps) or ``legacy`` (a
``gym`` whose ``reset()`` returns the observation and ``step()`` four values, with ``env.seed``:
spinningup's and sfujim/TD3's scripts); ``SB_BENCH_MAX_STEPS`` ends the run (``SystemExit(0)``)
at that many environment steps over all environments, for scripts with no step argument.
Seeds ``random``/numpy/torch and the first ``reset()`` of every environment made. Imported as ``sitecustomize`` (a folder holding it under that name on ``PYTHONPATH``) it does the
same before the script runs as the main program: the profiled run (``scalebox run``) needs the
script itself as its entry, or the analyzer sees the harness's ``runpy`` line as the user's code.
Kept out of the
rewritten folders' sources (it is copied in after the rewrite): it is no part of what is measured
beyond its own small, equal cost.
"""
import os
import random
import runpy
import sys
import types

import numpy as np
import torch

random.seed(0)
np.random.seed(0)
torch.manual_seed(0)
MAX_STEPS = int(os.environ.get("SB_BENCH_MAX_STEPS") or 0)
GYM = os.environ.get("SB_BENCH_GYM", "")
_steps = [0]


def _instrument(env):
    reset, step, first = env.reset, env.step, [True]

    def seeded_reset(*a, **k):
        if first[0] and "seed" not in k:
            k["seed"] = 0
        first[0] = False
        return reset(*a, **k)

    def counted_step(*a, **k):
        _steps[0] += 1
        if MAX_STEPS and _steps[0] > MAX_STEPS:
            sys.stdout.flush()
            raise SystemExit(0)
        return step(*a, **k)

    env.reset, env.step = seeded_reset, counted_step
    env.action_space.seed(0)
    return env


class _Legacy:
    """gym<0.26's interface over a gymnasium environment."""

    def __init__(self, env):
        self._env, self._seed = env, None

    def __getattr__(self, name):
        return getattr(self._env, name)

    def seed(self, seed=None):
        self._seed = seed
        return [seed]

    def reset(self, **kwargs):
        if self._seed is not None:
            kwargs.setdefault("seed", self._seed)
            self._seed = None
        return self._env.reset(**kwargs)[0]

    def step(self, action):
        obs, reward, terminated, truncated, info = self._env.step(action)
        return obs, reward, terminated or truncated, info


try:
    import gymnasium

    _make = gymnasium.make

    def make(*args, **kwargs):
        return _instrument(_make(*args, **kwargs))

    gymnasium.make = make
    if GYM in ("gymnasium", "legacy"):
        if GYM == "gymnasium":
            sys.modules["gym"] = gymnasium
        else:
            legacy = types.ModuleType("gym")
            legacy.__dict__.update({k: v for k, v in vars(gymnasium).items() if not k.startswith("__")})
            legacy.make = lambda *a, **k: _Legacy(make(*a, **k))
            sys.modules["gym"] = legacy
        for key in [k for k in sys.modules if k.startswith("gymnasium.")]:  # `from gym.spaces import Box`
            sys.modules.setdefault("gym." + key[len("gymnasium."):], sys.modules[key])
except ImportError:
    pass

if __name__ == "__main__":
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    folder = os.path.dirname(os.path.abspath(script))
    os.chdir(folder)
    sys.path.insert(0, folder)
    runpy.run_path(os.path.basename(script), run_name="__main__")
