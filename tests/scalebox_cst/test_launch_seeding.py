"""`scalebox run --seeds N`: two runs of one seed start alike, with or without a --seed option.

The launcher seeded random, numpy and torch only; gymnasium seeds an env or space that is given
no seed from the OS (``seeding.np_random(None)``), so ``env.reset()`` without ``seed=`` (minimalRL's
sac.py, PPO-for-Beginners, nikhilbarhate99's PPO) gave other first states on every run of one
seed, and an original and its exact rewrite could not be paired by seed (runtime.seeding).
"""
import re
import textwrap

import pytest

from conftest import scalebox

# gymnasium.utils.seeding.np_random as gymnasium 1.x writes it (numpy only), on PYTHONPATH
FAKE_SEEDING = textwrap.dedent(
    """
    import numpy as np


    def np_random(seed=None):
        if seed is not None and not (isinstance(seed, int) and 0 <= seed):
            raise ValueError(f"Seed must be a python integer, actual type: {type(seed)}")
        seed_seq = np.random.SeedSequence(seed)
        return np.random.Generator(np.random.PCG64(seed_seq)), seed_seq.entropy
    """
)

DRAWS = textwrap.dedent(
    """
    import os
    from gymnasium.utils import seeding


    def draw(seed=None):
        return int(seeding.np_random(seed)[0].integers(1 << 30))


    first, second, explicit = draw(), draw(), draw(7)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a SubprocVecEnv worker made by fork
        os.write(write, str(draw()).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    print("DRAWS", first, second, explicit, int(os.read(read, 64)), draw())
    """
)

RESET = textwrap.dedent(
    """
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    obs, _ = env.reset()
    print("RESET", [round(float(x), 6) for x in obs], int(env.action_space.sample()))
    """
)


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n')
    scalebox("init", str(root))
    return root


def _line(root, tag, seed, env=None):
    out = scalebox("run", "--seeds", str(seed), "t.py", cwd=root, env=env).stdout
    (line,) = [ln for ln in out.splitlines() if ln.startswith(tag)]
    return line


def test_unseeded_gymnasium_generators_follow_the_run_seed(project, tmp_path):
    site = tmp_path / "site" / "gymnasium" / "utils"
    site.mkdir(parents=True)
    (site.parent / "__init__.py").write_text("")
    (site / "__init__.py").write_text("")
    (site / "seeding.py").write_text(FAKE_SEEDING)
    (project / "t.py").write_text(DRAWS)
    env = {"PYTHONPATH": str(tmp_path / "site")}
    runs = [_line(project, "DRAWS", s, env) for s in (0, 0, 1)]
    assert runs[0] == runs[1] != runs[2]  # reproducible per seed, another seed draws others
    first, second, explicit, child, after = (int(v) for v in runs[0].split()[1:])
    assert len({first, second, child, after}) == 4  # each env its own stream; the forked worker too
    import numpy as np

    assert explicit == int(np.random.Generator(np.random.PCG64(np.random.SeedSequence(7))).integers(1 << 30))


def test_env_reset_without_a_seed_is_reproducible_per_run_seed(project):
    pytest.importorskip("gymnasium")
    (project / "t.py").write_text(RESET)
    runs = [_line(project, "RESET", s) for s in (0, 0, 1)]
    assert runs[0] == runs[1] != runs[2]
    assert re.match(r"RESET \[.*\] [01]$", runs[0])


SEED_OPTION_TORCH_ONLY = textwrap.dedent(
    """
    import argparse
    import numpy as np
    from gymnasium.utils import seeding

    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=209)
    args = parser.parse_args()
    # seeds what it uses for the net (torch) and the training env; numpy's global shuffle and
    # the evaluation env's generator stay the OS's (XinJingHao/DRL-Pytorch's PPO-discrete)
    perm = np.arange(8)
    np.random.shuffle(perm)
    print("OPTION", args.seed, perm.tolist(), int(seeding.np_random()[0].integers(1 << 30)))
    """
)


def test_a_script_with_a_seed_option_is_seeded_where_it_does_not_seed_itself(project):
    """XinJingHao's PPO-discrete takes --seed, seeds torch and its training env, shuffles with
    numpy's global generator and resets its evaluation env unseeded: two original runs of one
    seed printed other scores, so an exact rewrite could not be paired with its original."""
    (project / "t.py").write_text(SEED_OPTION_TORCH_ONLY)
    runs = [_line(project, "OPTION", s) for s in (0, 0, 1)]
    assert runs[0] == runs[1] != runs[2]
    assert runs[0].startswith("OPTION 0 ")  # the seed still reaches the script as --seed 0
